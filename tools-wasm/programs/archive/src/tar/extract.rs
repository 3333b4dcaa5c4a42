//! `tar -x` and `tar -t`: reads an archive (gzip detected from its first bytes) member by
//! member, as a stream. Listing prints names; extraction checks each member before it writes:
//! its name (`member_paths`), then every directory on its way, which must be a real directory
//! and never a symbolic link (so an archive with `link -> ..` and then `link/x` cannot write
//! through the link, whether the link came from the archive or was there before). Files are
//! created fresh: an existing file or link of the same name is removed first, never opened, so
//! a write cannot follow a link either. Devices and pipes are not created.

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use flate2::bufread::MultiGzDecoder;
use tar::{Archive, Entry, EntryType};

use super::listing::{Kind, Line, Lister};
use super::member_paths::{
    Refusal, check_symlink_target, hard_link_components, member_components, strip_components,
};
use super::options::{Operation, TarOptions};
use super::{FAILED_MEMBERS, NOT_RECOVERABLE, pattern};
use crate::errors::describe;

/// Why one member was not extracted.
enum MemberError {
    /// The member is unsafe to extract.
    Refused(Refusal),
    /// Something in the way, e.g. a file where a directory is needed.
    Blocked(String),
    /// A file-system operation failed: the operation's name in GNU's words, and the error.
    Io(&'static str, io::Error),
    /// Reading the archive failed: nothing after this member can be read.
    Archive(io::Error),
}

/// Extracts or lists; the exit status.
pub fn run(options: &TarOptions) -> i32 {
    let input: Box<dyn Read> = if options.archive == "-" {
        Box::new(io::stdin().lock())
    } else {
        match File::open(&options.archive) {
            Ok(file) => Box::new(file),
            Err(error) => {
                eprintln!(
                    "tar: {}: Cannot open: {}\n{NOT_RECOVERABLE}",
                    options.archive,
                    describe(&error)
                );
                return 2;
            }
        }
    };
    let mut buffered = BufReader::with_capacity(64 * 1024, input);
    let gzipped = match buffered.fill_buf() {
        Ok(start) => start.starts_with(&[0x1f, 0x8b]),
        Err(error) => {
            eprintln!(
                "tar: {}: Cannot read: {}\n{NOT_RECOVERABLE}",
                options.archive,
                describe(&error)
            );
            return 2;
        }
    };
    let source: Box<dyn Read> = if gzipped {
        Box::new(MultiGzDecoder::new(buffered))
    } else {
        Box::new(buffered)
    };
    let root = PathBuf::from(options.directory.as_deref().unwrap_or("."));
    if options.operation == Operation::Extract && !options.to_stdout {
        match fs::metadata(&root) {
            Ok(metadata) if metadata.is_dir() => {}
            Ok(_) => {
                eprintln!(
                    "tar: {}: Cannot open: Not a directory\n{NOT_RECOVERABLE}",
                    root.display()
                );
                return 2;
            }
            Err(error) => {
                eprintln!(
                    "tar: {}: Cannot open: {}\n{NOT_RECOVERABLE}",
                    root.display(),
                    describe(&error)
                );
                return 2;
            }
        }
    }
    let mut reader = Reader {
        options,
        root,
        known_directories: HashSet::new(),
        refused_links: Vec::new(),
        selected: vec![false; options.operands.len()],
        lister: Lister::default(),
        stdout: BufWriter::with_capacity(64 * 1024, io::stdout().lock()),
        failed: false,
        members_read: 0,
    };
    let mut archive = Archive::new(source);
    let outcome = reader.read_all(&mut archive);
    let _ = reader.stdout.flush();
    if let Err(error) = outcome {
        let detail = printable(&describe(&error));
        match reader.members_read {
            0 => eprintln!(
                "tar: {}: This does not look like a tar archive ({detail})",
                options.archive
            ),
            1 => eprintln!(
                "tar: {}: the archive is damaged after its first member: {detail}",
                options.archive
            ),
            count => eprintln!(
                "tar: {}: the archive is damaged after {count} members: {detail}",
                options.archive
            ),
        }
        eprintln!("{NOT_RECOVERABLE}");
        return 2;
    }
    // The gzip trailer (and its checksum) comes after the end of the tar data: read it, so a
    // damaged or cut compressed archive is reported.
    if gzipped && let Err(error) = io::copy(&mut archive.into_inner(), &mut io::sink()) {
        eprintln!(
            "tar: {}: the compressed archive is damaged at its end: {}\n{NOT_RECOVERABLE}",
            options.archive,
            describe(&error)
        );
        return 2;
    }
    for (operand, found) in options.operands.iter().zip(&reader.selected) {
        if !found {
            eprintln!("tar: {}: Not found in archive", operand.name);
            reader.failed = true;
        }
    }
    if reader.failed {
        eprintln!("{FAILED_MEMBERS}");
        return 2;
    }
    0
}

struct Reader<'a> {
    options: &'a TarOptions,
    /// The extraction directory.
    root: PathBuf,
    /// Directories below `root` (as relative paths) already checked to be real directories.
    known_directories: HashSet<PathBuf>,
    /// Links this run refused (as components below `root`): nothing below them is extracted.
    refused_links: Vec<Vec<String>>,
    /// Which operands matched some member.
    selected: Vec<bool>,
    lister: Lister,
    stdout: BufWriter<io::StdoutLock<'static>>,
    /// Some member failed.
    failed: bool,
    /// Members read so far, for error messages.
    members_read: u64,
}

impl Reader<'_> {
    /// Lists or extracts every member; an error is one reading the archive (fatal).
    fn read_all<R: Read>(&mut self, archive: &mut Archive<R>) -> io::Result<()> {
        for entry in archive.entries()? {
            let mut entry = entry?;
            self.members_read += 1;
            let name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
            let entry_type = entry.header().entry_type();
            if matches!(
                entry_type,
                EntryType::XGlobalHeader
                    | EntryType::XHeader
                    | EntryType::GNULongName
                    | EntryType::GNULongLink
            ) {
                continue;
            }
            if !self.is_selected(&name)
                || self
                    .options
                    .excludes
                    .iter()
                    .any(|exclude| pattern::excludes(exclude, &name))
            {
                continue;
            }
            if self.options.operation == Operation::List {
                self.list(&entry, &name)?;
                continue;
            }
            let outcome = self.extract(&mut entry, &name);
            if outcome.is_err() {
                // Keep the `-v` lines and the messages in order where both are read together.
                let _ = self.stdout.flush();
            }
            match outcome {
                Ok(()) => {}
                Err(MemberError::Archive(error)) => return Err(error),
                Err(MemberError::Refused(refusal)) => {
                    eprintln!("tar: {name}: refusing to extract: {refusal}");
                    self.failed = true;
                }
                Err(MemberError::Blocked(why)) => {
                    eprintln!("tar: {name}: Cannot extract: {why}");
                    self.failed = true;
                }
                Err(MemberError::Io(action, error)) => {
                    eprintln!("tar: {name}: Cannot {action}: {}", describe(&error));
                    self.failed = true;
                }
            }
        }
        Ok(())
    }

    /// Whether the member is wanted: no operands, or one naming it or a directory above it.
    fn is_selected(&mut self, name: &str) -> bool {
        if self.options.operands.is_empty() {
            return true;
        }
        let name = normalized(name);
        let mut wanted = false;
        for (operand, found) in self.options.operands.iter().zip(self.selected.iter_mut()) {
            let operand = normalized(&operand.name);
            let matches = name == operand
                || operand.is_empty()
                || name
                    .strip_prefix(operand)
                    .is_some_and(|rest| rest.starts_with('/'));
            if matches {
                *found = true;
                wanted = true;
            }
        }
        wanted
    }

    /// Prints the member's `-t` line.
    fn list<R: Read>(&mut self, entry: &Entry<'_, R>, name: &str) -> io::Result<()> {
        let header = entry.header();
        let text = if self.options.verbosity == 0 {
            name.to_string()
        } else {
            let link = entry
                .link_name_bytes()
                .map(|bytes| String::from_utf8_lossy(&bytes).into_owned());
            let owner = match header.username() {
                Ok(Some(owner)) if !owner.is_empty() => owner.to_string(),
                _ => header.uid().unwrap_or(0).to_string(),
            };
            let group = match header.groupname() {
                Ok(Some(group)) if !group.is_empty() => group.to_string(),
                _ => header.gid().unwrap_or(0).to_string(),
            };
            self.lister.format(&Line {
                kind: kind_of(header.entry_type()),
                mode: header.mode().unwrap_or(0),
                owner,
                group,
                size: entry.size(),
                mtime: header.mtime().unwrap_or(0),
                name,
                link_target: link.as_deref(),
            })
        };
        writeln!(self.stdout, "{text}")
    }

    /// Extracts one member after its checks.
    fn extract<R: Read>(
        &mut self,
        entry: &mut Entry<'_, R>,
        name: &str,
    ) -> Result<(), MemberError> {
        let kind = kind_of(entry.header().entry_type());
        let components = match member_components(name) {
            Ok(components) => components,
            // `./` itself: the extraction directory, which exists.
            Err(Refusal::EmptyName) if kind == Kind::Directory => return Ok(()),
            Err(refusal) => return Err(MemberError::Refused(refusal)),
        };
        let Some(components) = strip_components(&components, self.options.strip_components) else {
            return Ok(());
        };
        if let Some(link) = self.refused_link_above(&components) {
            return Err(MemberError::Refused(Refusal::BelowRefusedLink(link)));
        }
        if self.options.to_stdout {
            if kind == Kind::File {
                self.verbose(name);
                return copy_contents(entry, &mut self.stdout, "write");
            }
            return Ok(());
        }
        let link_target = entry
            .link_name_bytes()
            .map(|bytes| String::from_utf8_lossy(&bytes).into_owned());
        match kind {
            Kind::Directory => {
                self.directory(&components)?;
            }
            Kind::File => self.file(entry, &components)?,
            Kind::Symlink => {
                let target = link_target.unwrap_or_default();
                if let Err(refusal) = check_symlink_target(&components, &target) {
                    self.refuse_link(&components);
                    return Err(MemberError::Refused(refusal));
                }
                let path = self.replaceable(&components)?;
                make_symlink(Path::new(&target), &path)
                    .map_err(|error| MemberError::Io("create symlink", error))?;
            }
            Kind::HardLink => {
                if let Err(error) = self.hard_link(&components, &link_target.unwrap_or_default()) {
                    if matches!(error, MemberError::Refused(_)) {
                        self.refuse_link(&components);
                    }
                    return Err(error);
                }
            }
            Kind::CharDevice | Kind::BlockDevice | Kind::Fifo => {
                let what = match kind {
                    Kind::CharDevice => "character device",
                    Kind::BlockDevice => "block device",
                    _ => "named pipe",
                };
                let _ = self.stdout.flush();
                eprintln!(
                    "tar: {name}: {what} not extracted (devices and pipes cannot be created here)"
                );
                return Ok(());
            }
            Kind::Other => {
                let flag = entry.header().entry_type().as_byte() as char;
                let _ = self.stdout.flush();
                eprintln!("tar: {name}: unknown member type '{flag}'; not extracted");
                return Ok(());
            }
        }
        self.verbose(name);
        Ok(())
    }

    /// The `-v` line of an extracted member (on standard error when contents go to standard
    /// output).
    fn verbose(&mut self, name: &str) {
        if self.options.verbosity == 0 {
            return;
        }
        if self.options.to_stdout {
            eprintln!("{name}");
        } else {
            let _ = writeln!(self.stdout, "{name}");
        }
    }

    /// Remembers a refused link, so members below it are refused too.
    fn refuse_link(&mut self, components: &[&str]) {
        self.refused_links
            .push(components.iter().map(|part| part.to_string()).collect());
    }

    /// The refused link `components` lies below, if any.
    fn refused_link_above(&self, components: &[&str]) -> Option<String> {
        self.refused_links
            .iter()
            .find(|link| {
                link.len() < components.len() && link.iter().zip(components).all(|(a, b)| a == b)
            })
            .map(|link| link.join("/"))
    }

    /// Makes sure each of `components` below the root is a real directory, creating missing
    /// ones; a symbolic link on the way is refused, never followed. The path of the last one.
    fn directory(&mut self, components: &[&str]) -> Result<PathBuf, MemberError> {
        let mut path = self.root.clone();
        let mut relative = PathBuf::new();
        for (depth, component) in components.iter().enumerate() {
            path.push(component);
            relative.push(component);
            if self.known_directories.contains(&relative) {
                continue;
            }
            match fs::symlink_metadata(&path) {
                Ok(metadata) if metadata.file_type().is_symlink() => {
                    return Err(MemberError::Refused(Refusal::ThroughSymlink(
                        components[..=depth].join("/"),
                    )));
                }
                Ok(metadata) if metadata.is_dir() => {}
                Ok(_) => {
                    return Err(MemberError::Blocked(format!(
                        "'{}' exists and is not a directory",
                        components[..=depth].join("/")
                    )));
                }
                Err(error) if error.kind() == io::ErrorKind::NotFound => {
                    fs::create_dir(&path).map_err(|error| MemberError::Io("mkdir", error))?;
                }
                Err(error) => return Err(MemberError::Io("stat", error)),
            }
            self.known_directories.insert(relative.clone());
        }
        Ok(path)
    }

    /// The path for a new non-directory member, its directories made and checked; whatever
    /// file or link is there already is removed (never opened or followed). A directory in
    /// the way, or any existing file with `-k`, blocks the member.
    fn replaceable(&mut self, components: &[&str]) -> Result<PathBuf, MemberError> {
        let (last, parents) = components
            .split_last()
            .ok_or(MemberError::Refused(Refusal::EmptyName))?;
        let path = self.directory(parents)?.join(last);
        match fs::symlink_metadata(&path) {
            Ok(metadata) if metadata.is_dir() => Err(MemberError::Blocked(
                "a directory of that name exists".to_string(),
            )),
            Ok(_) if self.options.keep_old_files => {
                Err(MemberError::Blocked("File exists".to_string()))
            }
            Ok(_) => {
                fs::remove_file(&path).map_err(|error| MemberError::Io("unlink", error))?;
                Ok(path)
            }
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(path),
            Err(error) => Err(MemberError::Io("stat", error)),
        }
    }

    /// Writes a regular file's contents to a newly created file.
    fn file<R: Read>(
        &mut self,
        entry: &mut Entry<'_, R>,
        components: &[&str],
    ) -> Result<(), MemberError> {
        let path = self.replaceable(components)?;
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|error| MemberError::Io("open", error))?;
        let mut writer = BufWriter::with_capacity(64 * 1024, file);
        copy_contents(entry, &mut writer, "write")?;
        let file = writer
            .into_inner()
            .map_err(|error| MemberError::Io("write", error.into_error()))?;
        if !self.options.touch
            && let Ok(mtime) = entry.header().mtime()
        {
            // Best effort, as GNU tar warns but goes on; not every file system keeps times.
            let _ = file.set_modified(UNIX_EPOCH + Duration::from_secs(mtime));
        }
        Ok(())
    }

    /// Makes a hard link to an earlier member, which must be a regular file reached through
    /// real directories only.
    fn hard_link(&mut self, components: &[&str], target: &str) -> Result<(), MemberError> {
        let target_components = hard_link_components(target).map_err(MemberError::Refused)?;
        let Some(target_components) =
            strip_components(&target_components, self.options.strip_components)
        else {
            return Err(MemberError::Blocked(format!(
                "hard link target '{target}' is removed by --strip-components"
            )));
        };
        if let Some(link) = self.refused_link_above(&target_components) {
            return Err(MemberError::Refused(Refusal::BelowRefusedLink(link)));
        }
        let (target_last, target_parents) = target_components
            .split_last()
            .ok_or(MemberError::Refused(Refusal::EmptyName))?;
        let target_path = self.directory(target_parents)?.join(target_last);
        match fs::symlink_metadata(&target_path) {
            Ok(metadata) if metadata.is_file() => {}
            Ok(_) => {
                return Err(MemberError::Blocked(format!(
                    "hard link target '{target}' is not a regular file"
                )));
            }
            Err(error) => return Err(MemberError::Io("hard link", error)),
        }
        if components == target_components.as_slice() {
            return Ok(());
        }
        let path = self.replaceable(components)?;
        match fs::hard_link(&target_path, &path) {
            Ok(()) => Ok(()),
            // Where the file system has no hard links, a copy keeps the contents.
            Err(_) => fs::copy(&target_path, &path)
                .map(|_| ())
                .map_err(|error| MemberError::Io("hard link", error)),
        }
    }
}

/// Copies a member's contents to `output`: a read error is the archive's (fatal), a write
/// error the member's.
fn copy_contents<R: Read>(
    entry: &mut Entry<'_, R>,
    output: &mut impl Write,
    action: &'static str,
) -> Result<(), MemberError> {
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let count = match entry.read(&mut buffer) {
            Ok(0) => return Ok(()),
            Ok(count) => count,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(MemberError::Archive(error)),
        };
        output
            .write_all(&buffer[..count])
            .map_err(|error| MemberError::Io(action, error))?;
    }
}

/// An error's text fit for a terminal: control characters and the bytes of a damaged header
/// (which the tar crate quotes) are replaced, and the text is kept short.
fn printable(text: &str) -> String {
    let cleaned: String = text
        .chars()
        .map(|c| {
            if c.is_control() || c == '\u{fffd}' {
                '?'
            } else {
                c
            }
        })
        .take(120)
        .collect();
    cleaned.trim_end().to_string()
}

/// A member name compared for selection: no leading `./`, no trailing `/`.
fn normalized(name: &str) -> &str {
    let mut name = name;
    while let Some(rest) = name.strip_prefix("./") {
        name = rest.trim_start_matches('/');
    }
    if name == "." {
        return "";
    }
    name.trim_end_matches('/')
}

/// The listing kind of a tar entry type.
fn kind_of(entry_type: EntryType) -> Kind {
    match entry_type {
        EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse => Kind::File,
        EntryType::Directory => Kind::Directory,
        EntryType::Symlink => Kind::Symlink,
        EntryType::Link => Kind::HardLink,
        EntryType::Char => Kind::CharDevice,
        EntryType::Block => Kind::BlockDevice,
        EntryType::Fifo => Kind::Fifo,
        _ => Kind::Other,
    }
}

/// Creates the symbolic link `path` pointing to `target`: wasi-libc's `symlink(2)` (a
/// `symlink-at` in the workspace), which std offers only unstably.
#[cfg(target_os = "wasi")]
#[allow(unsafe_code)]
fn make_symlink(target: &Path, path: &Path) -> io::Result<()> {
    use std::ffi::{CString, c_char, c_int};
    unsafe extern "C" {
        fn symlink(target: *const c_char, path: *const c_char) -> c_int;
    }
    let c_string = |path: &Path| {
        CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
    };
    let (target, path) = (c_string(target)?, c_string(path)?);
    // SAFETY: both pointers are valid NUL-terminated strings for the duration of the call.
    match unsafe { symlink(target.as_ptr(), path.as_ptr()) } {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

/// The same natively, for the unit tests.
#[cfg(unix)]
fn make_symlink(target: &Path, path: &Path) -> io::Result<()> {
    std::os::unix::fs::symlink(target, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selection_names_are_normalized() {
        assert_eq!(normalized("./a/b/"), "a/b");
        assert_eq!(normalized("a"), "a");
        assert_eq!(normalized("./"), "");
        assert_eq!(normalized("."), "");
    }

    #[test]
    fn error_details_are_printable() {
        assert_eq!(printable("bad \u{1b}[31m\u{fffd}x\n"), "bad ?[31m?x?");
        assert_eq!(printable(&"y".repeat(500)).len(), 120);
    }
}
