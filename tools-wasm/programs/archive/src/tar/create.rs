//! `tar -c`: writes the operands (directories recursively, in name order) into a GNU-format
//! archive, gzipped with `-z` (or `-a` and a `.gz`/`.tgz` name). Names are stored as given,
//! less a leading `/` or anything up to a `..` (with GNU tar's notice), so the archive never
//! asks to be extracted outside its directory. Symbolic links are stored as links. The archive
//! file itself is skipped when it lies inside a directory being archived.

use std::collections::HashSet;
use std::fs::{self, File};
use std::io::{self, BufWriter, Read, Write};
use std::path::{Component, Path, PathBuf};
use std::time::UNIX_EPOCH;

use flate2::Compression;
use flate2::write::GzEncoder;
use tar::{Builder, EntryType, Header};

use super::listing::{Kind, Line, Lister};
use super::options::TarOptions;
use super::{FAILED_MEMBERS, NOT_RECOVERABLE, pattern};
use crate::errors::describe;

/// The archive's destination, gzipped or not.
enum ArchiveWriter {
    Plain(BufWriter<Box<dyn Write>>),
    Gzip(GzEncoder<BufWriter<Box<dyn Write>>>),
}

impl Write for ArchiveWriter {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        match self {
            ArchiveWriter::Plain(writer) => writer.write(bytes),
            ArchiveWriter::Gzip(writer) => writer.write(bytes),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            ArchiveWriter::Plain(writer) => writer.flush(),
            ArchiveWriter::Gzip(writer) => writer.flush(),
        }
    }
}

impl ArchiveWriter {
    /// Writes what is buffered and the gzip trailer.
    fn finish(self) -> io::Result<()> {
        match self {
            ArchiveWriter::Plain(mut writer) => writer.flush(),
            ArchiveWriter::Gzip(encoder) => encoder.finish()?.flush(),
        }
    }
}

/// Creates the archive; the exit status.
pub fn run(options: &TarOptions) -> i32 {
    let destination: Box<dyn Write> = if options.archive == "-" {
        Box::new(io::stdout().lock())
    } else {
        match File::create(&options.archive) {
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
    let buffered = BufWriter::with_capacity(64 * 1024, destination);
    let suffix_says_gzip = [".gz", ".tgz", ".taz"]
        .iter()
        .any(|suffix| options.archive.ends_with(suffix));
    let writer = if options.gzip || (options.auto_compress && suffix_says_gzip) {
        ArchiveWriter::Gzip(GzEncoder::new(buffered, Compression::default()))
    } else {
        ArchiveWriter::Plain(buffered)
    };
    let archive_location = (options.archive != "-").then(|| absolute(Path::new(&options.archive)));
    let mut creator = Creator {
        builder: Builder::new(writer),
        options,
        archive_location,
        lister: Lister::default(),
        failed: false,
        notices: HashSet::new(),
    };
    let outcome = creator.add_operands().and_then(|()| {
        let writer = creator.builder.into_inner()?;
        writer.finish()
    });
    if let Err(error) = outcome {
        eprintln!(
            "tar: {}: Cannot write: {}\n{NOT_RECOVERABLE}",
            options.archive,
            describe(&error)
        );
        return 2;
    }
    if creator.failed {
        eprintln!("{FAILED_MEMBERS}");
        return 2;
    }
    0
}

struct Creator<'a> {
    builder: Builder<ArchiveWriter>,
    options: &'a TarOptions,
    /// Where the archive file is (lexically, from the working directory), to skip it.
    archive_location: Option<PathBuf>,
    lister: Lister,
    /// A member could not be added.
    failed: bool,
    /// Notices about removed name prefixes already printed.
    notices: HashSet<String>,
}

impl Creator<'_> {
    /// Adds every operand. An error is a failure to write the archive (fatal); problems with
    /// single files are reported and remembered in `failed`.
    fn add_operands(&mut self) -> io::Result<()> {
        for operand in &self.options.operands {
            let path = match &operand.directory {
                Some(directory) => Path::new(directory).join(&operand.name),
                None => PathBuf::from(&operand.name),
            };
            let (name, removed) = member_name(&operand.name);
            if let Some(removed) = removed
                && self.notices.insert(removed.clone())
            {
                eprintln!("tar: Removing leading `{removed}' from member names");
            }
            if name.is_empty() {
                continue;
            }
            self.add(&path, &name)?;
        }
        Ok(())
    }

    /// Adds `path` as member `name`, and a directory's contents after it.
    fn add(&mut self, path: &Path, name: &str) -> io::Result<()> {
        if self
            .options
            .excludes
            .iter()
            .any(|exclude| pattern::excludes(exclude, name))
        {
            return Ok(());
        }
        let metadata = match fs::symlink_metadata(path) {
            Ok(metadata) => metadata,
            Err(error) => {
                eprintln!("tar: {name}: Cannot stat: {}", describe(&error));
                self.failed = true;
                return Ok(());
            }
        };
        if metadata.is_file() && self.archive_location.as_deref() == Some(&absolute(path)) {
            eprintln!("tar: {name}: file is the archive; not dumped");
            return Ok(());
        }
        let mtime = metadata
            .modified()
            .ok()
            .and_then(|time| time.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |since| since.as_secs());
        let file_type = metadata.file_type();
        if file_type.is_symlink() {
            let target = match fs::read_link(path) {
                Ok(target) => target.to_string_lossy().into_owned(),
                Err(error) => {
                    eprintln!("tar: {name}: Cannot readlink: {}", describe(&error));
                    self.failed = true;
                    return Ok(());
                }
            };
            let header = header(EntryType::Symlink, 0o777, 0, mtime);
            self.report(Kind::Symlink, 0o777, 0, mtime, name, Some(&target));
            append(&mut self.builder, header, name, Some(&target), io::empty())
        } else if file_type.is_dir() {
            let name = if name.ends_with('/') {
                name.to_string()
            } else {
                format!("{name}/")
            };
            let mode = permissions(&metadata, 0o755);
            self.report(Kind::Directory, mode, 0, mtime, &name, None);
            append(
                &mut self.builder,
                header(EntryType::Directory, mode, 0, mtime),
                &name,
                None,
                io::empty(),
            )?;
            let mut children: Vec<String> = match fs::read_dir(path) {
                Ok(entries) => entries
                    .filter_map(Result::ok)
                    .map(|entry| entry.file_name().to_string_lossy().into_owned())
                    .collect(),
                Err(error) => {
                    eprintln!("tar: {name}: Cannot open: {}", describe(&error));
                    self.failed = true;
                    return Ok(());
                }
            };
            children.sort();
            for child in children {
                self.add(&path.join(&child), &format!("{name}{child}"))?;
            }
            Ok(())
        } else if file_type.is_file() {
            let file = match File::open(path) {
                Ok(file) => file,
                Err(error) => {
                    eprintln!("tar: {name}: Cannot open: {}", describe(&error));
                    self.failed = true;
                    return Ok(());
                }
            };
            let size = metadata.len();
            let mode = permissions(&metadata, 0o644);
            self.report(Kind::File, mode, size, mtime, name, None);
            // Exactly `size` bytes: a file that shrank meanwhile is padded with zeros, one that
            // grew is cut, so the archive stays well formed.
            let contents = file.take(size).chain(io::repeat(0)).take(size);
            append(
                &mut self.builder,
                header(EntryType::Regular, mode, size, mtime),
                name,
                None,
                contents,
            )
        } else {
            eprintln!("tar: {name}: not a file, directory or symbolic link; not dumped");
            self.failed = true;
            Ok(())
        }
    }

    /// The `-v` line for a member: on standard error when the archive goes to standard output.
    fn report(
        &mut self,
        kind: Kind,
        mode: u32,
        size: u64,
        mtime: u64,
        name: &str,
        link: Option<&str>,
    ) {
        let text = match self.options.verbosity {
            0 => return,
            1 => name.to_string(),
            _ => self.lister.format(&Line {
                kind,
                mode,
                owner: "0".into(),
                group: "0".into(),
                size,
                mtime,
                name,
                link_target: link,
            }),
        };
        if self.options.archive == "-" {
            eprintln!("{text}");
        } else {
            println!("{text}");
        }
    }
}

/// The permission bits to store: the file's own on Unix; under WASI, which has none, the
/// usual default, read-only when the file is.
fn permissions(metadata: &fs::Metadata, default: u32) -> u32 {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = default;
        metadata.permissions().mode() & 0o7777
    }
    #[cfg(not(unix))]
    {
        if metadata.permissions().readonly() {
            default & !0o222
        } else {
            default
        }
    }
}

/// A GNU header of `kind` with the given bits, size and time; names are set by `append`.
fn header(kind: EntryType, mode: u32, size: u64, mtime: u64) -> Header {
    let mut header = Header::new_gnu();
    header.set_entry_type(kind);
    header.set_mode(mode);
    header.set_size(size);
    header.set_mtime(mtime);
    header.set_uid(0);
    header.set_gid(0);
    header
}

/// The longest name a header holds itself; longer ones go in a GNU long-name record first.
const NAME_FIELD: usize = 100;

/// Appends a member with `name` (and a link's `link` target) written byte for byte, using
/// GNU long-name records for long ones, then `data`.
fn append<W: Write>(
    builder: &mut Builder<W>,
    mut header: Header,
    name: &str,
    link: Option<&str>,
    data: impl Read,
) -> io::Result<()> {
    if name.len() > NAME_FIELD {
        append_long_record(builder, EntryType::GNULongName, name)?;
    }
    if let Some(link) = link
        && link.len() > NAME_FIELD
    {
        append_long_record(builder, EntryType::GNULongLink, link)?;
    }
    let gnu = header
        .as_gnu_mut()
        .ok_or_else(|| io::Error::other("internal: a GNU header was expected"))?;
    copy_truncated(&mut gnu.name, name);
    if let Some(link) = link {
        copy_truncated(&mut gnu.linkname, link);
    }
    header.set_cksum();
    builder.append(&header, data)
}

/// A GNU `././@LongLink` record carrying `text` (NUL-terminated) for the header after it.
fn append_long_record<W: Write>(
    builder: &mut Builder<W>,
    kind: EntryType,
    text: &str,
) -> io::Result<()> {
    let mut header = header(kind, 0o644, text.len() as u64 + 1, 0);
    if let Some(gnu) = header.as_gnu_mut() {
        copy_truncated(&mut gnu.name, "././@LongLink");
    }
    header.set_cksum();
    builder.append(&header, text.as_bytes().chain(&[0u8][..]))
}

/// Copies as much of `text` as fits into the field; the rest stays NUL.
fn copy_truncated(field: &mut [u8], text: &str) {
    let length = text.len().min(field.len());
    field[..length].copy_from_slice(&text.as_bytes()[..length]);
    field[length..].fill(0);
}

/// The member name for an operand, and the prefix removed from it: a leading `/`, or
/// everything up to and including the last `..` component (GNU tar's rule).
fn member_name(operand: &str) -> (String, Option<String>) {
    let without_root = operand.trim_start_matches('/');
    let mut removed = operand[..operand.len() - without_root.len()].to_string();
    let mut name = without_root;
    let parts: Vec<&str> = without_root.split('/').collect();
    if let Some(last_parent) = parts.iter().rposition(|part| *part == "..") {
        let prefix_length: usize = parts[..=last_parent]
            .iter()
            .map(|part| part.len() + 1)
            .sum();
        let prefix_length = prefix_length.min(without_root.len());
        removed.push_str(&without_root[..prefix_length]);
        name = &without_root[prefix_length..];
    }
    let name = if name.is_empty() && !removed.is_empty() {
        ".".to_string()
    } else {
        name.to_string()
    };
    (name, (!removed.is_empty()).then_some(removed))
}

/// `path` from the working directory with `.` and `..` resolved by name.
fn absolute(path: &Path) -> PathBuf {
    let joined = match std::env::current_dir() {
        Ok(directory) => directory.join(path),
        Err(_) => path.to_path_buf(),
    };
    let mut normal = PathBuf::new();
    for component in joined.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                normal.pop();
            }
            other => normal.push(other),
        }
    }
    normal
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leading_slashes_and_parent_prefixes_are_removed() {
        assert_eq!(member_name("dir"), ("dir".into(), None));
        assert_eq!(member_name("./dir/"), ("./dir/".into(), None));
        assert_eq!(
            member_name("/etc/hosts"),
            ("etc/hosts".into(), Some("/".into()))
        );
        assert_eq!(member_name("../x/y"), ("x/y".into(), Some("../".into())));
        assert_eq!(
            member_name("a/../../b"),
            ("b".into(), Some("a/../../".into()))
        );
        assert_eq!(member_name("/"), (".".into(), Some("/".into())));
        assert_eq!(member_name(".."), (".".into(), Some("..".into())));
    }

    #[test]
    fn long_names_round_trip_through_the_tar_crate() {
        let long = format!("{}/file.txt", "d".repeat(150));
        let target = format!("{}/target", "t".repeat(120));
        let mut builder = Builder::new(Vec::new());
        append(
            &mut builder,
            header(EntryType::Regular, 0o644, 5, 0),
            &long,
            None,
            &b"hello"[..],
        )
        .unwrap();
        append(
            &mut builder,
            header(EntryType::Symlink, 0o777, 0, 0),
            "./link",
            Some(&target),
            io::empty(),
        )
        .unwrap();
        let bytes = builder.into_inner().unwrap();
        let mut archive = tar::Archive::new(&bytes[..]);
        let mut entries = archive.entries().unwrap();
        let mut first = entries.next().unwrap().unwrap();
        assert_eq!(first.path_bytes().as_ref(), long.as_bytes());
        let mut text = String::new();
        first.read_to_string(&mut text).unwrap();
        assert_eq!(text, "hello");
        drop(first);
        let second = entries.next().unwrap().unwrap();
        assert_eq!(second.path_bytes().as_ref(), b"./link");
        assert_eq!(
            second.link_name_bytes().unwrap().as_ref(),
            target.as_bytes()
        );
    }
}
