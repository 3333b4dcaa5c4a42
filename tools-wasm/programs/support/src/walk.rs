//! The directory walk of `grep -r` and `find`: the entries below a starting path, depth first,
//! each directory's entries sorted by name (bytes), symbolic links found in the walk never
//! followed (only a starting path that is a link to a directory is entered, as walkdir does).
//!
//! Inside WASI (see `walk/wasi.rs`) the walk speaks `wasi:filesystem` itself instead of going
//! through the standard library: a starting path is resolved against the preopens exactly as
//! wasi-libc resolves it (the current directory joined on, the longest preopen name that is a
//! prefix), directories are listed through the `read-directory` stream with the type each entry
//! comes with (wasi-libc's `readdir` asks the host for a metadata hash of every entry as well, to
//! fill `d_ino`), and each file or directory is opened by its name relative to the directory
//! descriptor already held, without following a link, and read with `read` at an offset, a file
//! that fits in the first read in one call. Outside WASI (`walk/native.rs`, for the unit tests)
//! the same walk runs on paths through `std::fs`.
//!
//! What a caller sees is the walkdir walk these programs used before (paths joined on the
//! starting path as written, the same order, the same errors in the same words), except that a
//! directory is read only when the walk enters it: one at the depth limit or skipped with
//! [`Walker::skip_current_dir`] is never read, and a directory that cannot be read is itself
//! still yielded, followed by the error, as GNU find does. A name that is not UTF-8 cannot cross
//! WASI: the host reports it as an error of its directory, and the other entries are still
//! walked. At most [`MAX_OPEN_DIRECTORIES`] directory descriptors are held at once; a deeper
//! directory whose descriptor was given up is opened again by its path when the walk returns
//! to it and needs it.

use std::collections::VecDeque;
use std::ffi::{OsStr, OsString};
use std::io;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

#[cfg_attr(
    not(all(target_arch = "wasm32", target_os = "wasi")),
    allow(
        dead_code,
        reason = "used by the WASI file system only; tested on any target"
    )
)]
mod resolve;

#[cfg(all(target_arch = "wasm32", target_os = "wasi"))]
#[path = "walk/wasi.rs"]
mod sys;

#[cfg(not(all(target_arch = "wasm32", target_os = "wasi")))]
#[path = "walk/native.rs"]
mod sys;

/// Most directory descriptors a walk holds open at once, whatever the depth of the tree.
pub const MAX_OPEN_DIRECTORIES: usize = 32;

/// What an entry is, as its directory listing says (a symbolic link is never followed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A regular file.
    File,
    /// A directory.
    Directory,
    /// A symbolic link.
    Symlink,
    /// Anything else: a FIFO, socket or device, or a type the host does not know.
    Other,
}

/// What `find` asks of an entry besides its kind: the entry itself, a link not followed.
#[derive(Debug, Clone, Copy)]
pub struct Metadata {
    /// The kind of the entry itself.
    pub kind: Kind,
    /// Its size in bytes.
    pub len: u64,
    /// Its modification time (the epoch when the host has none).
    pub modified: SystemTime,
}

/// One entry of the walk.
#[derive(Debug)]
pub struct Entry {
    path: PathBuf,
    kind: Kind,
    depth: usize,
    /// Which yield of the walk this entry was: operations on it use the directory descriptors
    /// only while it is the latest one.
    serial: u64,
}

impl Entry {
    /// The starting path joined with the names below it.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The last component of the path (the whole path for a starting path without one).
    pub fn file_name(&self) -> &OsStr {
        self.path
            .file_name()
            .unwrap_or_else(|| self.path.as_os_str())
    }

    /// What the entry is; a starting path that is a symbolic link is one, even when the walk
    /// enters the directory it points to.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// Whether the entry is a directory (not a link to one).
    pub fn is_dir(&self) -> bool {
        self.kind == Kind::Directory
    }

    /// Whether the entry is a regular file (not a link to one).
    pub fn is_file(&self) -> bool {
        self.kind == Kind::File
    }

    /// Whether the entry is a symbolic link.
    pub fn is_symlink(&self) -> bool {
        self.kind == Kind::Symlink
    }

    /// 0 for the starting path, 1 for the entries of a starting directory, and so on.
    pub fn depth(&self) -> usize {
        self.depth
    }
}

/// A path the walk could not look at, and why.
#[derive(Debug)]
pub struct WalkError {
    path: PathBuf,
    error: io::Error,
}

impl WalkError {
    /// The path: the starting path, or the directory that could not be read.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The error, with the code and words the standard library gives it.
    pub fn io_error(&self) -> &io::Error {
        &self.error
    }
}

/// How far a walk goes and in which order it yields directories.
#[derive(Debug, Clone, Copy)]
pub struct WalkOptions {
    /// Entries shallower than this are walked through but not yielded.
    pub min_depth: usize,
    /// Entries deeper than this are neither yielded nor read.
    pub max_depth: usize,
    /// Yield a directory after its entries instead of before (for `find -delete`).
    pub contents_first: bool,
}

impl Default for WalkOptions {
    fn default() -> WalkOptions {
        WalkOptions {
            min_depth: 0,
            max_depth: usize::MAX,
            contents_first: false,
        }
    }
}

/// The walk below one starting path; see the module documentation.
pub struct Walker {
    options: WalkOptions,
    /// The starting path, until the first call of `next`.
    start: Option<PathBuf>,
    /// How the starting path is reached, once resolved.
    root: Option<sys::Root>,
    /// The directories being walked, the starting one first.
    frames: Vec<Frame>,
    /// Frames below this index have given up their descriptors.
    oldest_open: usize,
    /// A directory just yielded, entered on the next call unless skipped.
    pending: Option<Pending>,
    /// Errors to yield before anything else.
    errors: VecDeque<WalkError>,
    /// The serial of the entry yielded last.
    serial: u64,
    /// Where the entry yielded last is: the starting path, or a name in the top frame.
    current: Current,
}

/// A directory being walked.
struct Frame {
    /// Its descriptor, `None` once given up (see [`MAX_OPEN_DIRECTORIES`]).
    directory: Option<sys::Dir>,
    /// Its name in its parent (empty for the starting directory).
    name: OsString,
    /// Its path as yielded.
    path: PathBuf,
    /// Its depth.
    depth: usize,
    /// Its entries not yet yielded, sorted.
    entries: std::vec::IntoIter<(OsString, Kind)>,
    /// With `contents_first`: its own entry, yielded once its entries are done.
    deferred: Option<Entry>,
}

/// A directory yielded and not yet entered.
struct Pending {
    /// Its name in the top frame, or `None` for the starting directory.
    name: Option<OsString>,
    path: PathBuf,
    depth: usize,
}

/// Where the entry yielded last is.
enum Current {
    None,
    Root,
    /// A name in the frame at this index.
    Child(usize, OsString),
}

impl Walker {
    /// A walk of `start` (a path as the user wrote it, resolved as the standard library would).
    pub fn new(start: &str, options: WalkOptions) -> Walker {
        Walker {
            options,
            start: Some(PathBuf::from(start)),
            root: None,
            frames: Vec::new(),
            oldest_open: 0,
            pending: None,
            errors: VecDeque::new(),
            serial: 0,
            current: Current::None,
        }
    }

    /// The next entry, or the next path that could not be read.
    #[allow(
        clippy::should_implement_trait,
        reason = "the walk is driven by hand, as walkdir's is, so that skip_current_dir can be called between entries"
    )]
    pub fn next(&mut self) -> Option<Result<Entry, WalkError>> {
        loop {
            if let Some(error) = self.errors.pop_front() {
                return Some(Err(error));
            }
            if let Some(start) = self.start.take() {
                if let Some(yielded) = self.begin(start) {
                    return Some(yielded);
                }
                continue;
            }
            if let Some(pending) = self.pending.take() {
                self.enter(pending, None);
                continue;
            }
            let top = self.frames.len().checked_sub(1)?;
            let frame = &mut self.frames[top];
            let Some((name, kind)) = frame.entries.next() else {
                let frame = self.frames.pop()?;
                self.oldest_open = self.oldest_open.min(self.frames.len());
                match frame.deferred {
                    Some(entry) if !self.skippable(entry.depth) => {
                        self.current = match self.frames.len().checked_sub(1) {
                            Some(parent) => Current::Child(parent, frame.name),
                            None => Current::Root,
                        };
                        return Some(Ok(self.stamp(entry)));
                    }
                    _ => continue,
                }
            };
            let depth = frame.depth + 1;
            // `frame.path.join(&name)` in one allocation.
            let mut path = PathBuf::with_capacity(frame.path.as_os_str().len() + 1 + name.len());
            path.push(&frame.path);
            path.push(&name);
            let entry = Entry {
                path,
                kind,
                depth,
                serial: 0,
            };
            if kind == Kind::Directory && depth < self.options.max_depth {
                if self.options.contents_first {
                    self.enter(
                        Pending {
                            name: Some(name),
                            path: entry.path.clone(),
                            depth,
                        },
                        Some(entry),
                    );
                    continue;
                }
                self.pending = Some(Pending {
                    name: Some(name.clone()),
                    path: entry.path.clone(),
                    depth,
                });
            }
            if self.skippable(depth) {
                continue;
            }
            self.current = Current::Child(top, name);
            return Some(Ok(self.stamp(entry)));
        }
    }

    /// Do not enter the directory yielded last (nothing happens when it was not a directory).
    pub fn skip_current_dir(&mut self) {
        self.pending = None;
    }

    /// Reads the regular file `entry` (the entry yielded last) to its end, without following a
    /// link.
    pub fn read_file(&mut self, entry: &Entry) -> io::Result<Vec<u8>> {
        match self.parent_of(entry) {
            Some(parent) => {
                let (directory, name) = parent?;
                directory.read_file(name)
            }
            None => std::fs::read(entry.path()),
        }
    }

    /// The metadata of `entry` itself, a link not followed.
    pub fn metadata(&mut self, entry: &Entry) -> io::Result<Metadata> {
        if let Some(parent) = self.parent_of(entry) {
            let (directory, name) = parent?;
            return directory.stat(name);
        }
        match (&self.root, self.is_root(entry)) {
            (Some(root), true) => root.stat(false),
            _ => sys::metadata_of_path(entry.path()),
        }
    }

    /// Whether the directory `entry` has no entries.
    pub fn is_empty_dir(&mut self, entry: &Entry) -> io::Result<bool> {
        let directory = match self.parent_of(entry) {
            Some(parent) => {
                let (directory, name) = parent?;
                directory.open_dir(name)?
            }
            None => match (&self.root, self.is_root(entry)) {
                (Some(root), true) => root.open_dir()?,
                _ => return sys::is_empty_dir_at_path(entry.path()),
            },
        };
        directory.is_empty()
    }

    /// Resolves the starting path and yields it (or why it cannot be walked).
    fn begin(&mut self, start: PathBuf) -> Option<Result<Entry, WalkError>> {
        let failed = |error: io::Error| {
            Some(Err(WalkError {
                path: start.clone(),
                error,
            }))
        };
        let root = match sys::Root::resolve(&start) {
            Ok(root) => root,
            Err(error) => return failed(error),
        };
        let kind = match root.stat(false) {
            Ok(metadata) => metadata.kind,
            Err(error) => return failed(error),
        };
        // A starting path that is a link is entered when it leads to a directory; the entry
        // still says it is a link.
        let enters = match kind {
            Kind::Directory => true,
            Kind::Symlink => match root.stat(true) {
                Ok(target) => target.kind == Kind::Directory,
                Err(error) => return failed(error),
            },
            _ => false,
        };
        self.root = Some(root);
        let entry = Entry {
            path: start.clone(),
            kind,
            depth: 0,
            serial: 0,
        };
        if enters && self.options.max_depth > 0 {
            let pending = Pending {
                name: None,
                path: start,
                depth: 0,
            };
            if self.options.contents_first {
                self.enter(pending, Some(entry));
                return None;
            }
            self.pending = Some(pending);
        }
        if self.skippable(0) {
            return None;
        }
        self.current = Current::Root;
        Some(Ok(self.stamp(entry)))
    }

    /// Opens and lists the directory `pending` and makes it the top frame; `deferred` is its own
    /// entry when it is yielded after its contents. A directory that cannot be read becomes an
    /// error (and with `contents_first` is then not yielded at all, as walkdir did).
    fn enter(&mut self, pending: Pending, deferred: Option<Entry>) {
        let opened = match &pending.name {
            None => match &self.root {
                Some(root) => root.open_dir(),
                None => Err(io::Error::from(io::ErrorKind::NotFound)),
            },
            Some(name) => match self.frames.len().checked_sub(1) {
                Some(top) => self.directory(top).and_then(|parent| parent.open_dir(name)),
                None => Err(io::Error::from(io::ErrorKind::NotFound)),
            },
        };
        let listed = opened.and_then(|directory| {
            let listing = directory.list()?;
            Ok((directory, listing))
        });
        let (directory, listing) = match listed {
            Ok(listed) => listed,
            Err(error) => {
                self.errors.push_back(WalkError {
                    path: pending.path,
                    error,
                });
                return;
            }
        };
        for error in listing.errors {
            self.errors.push_back(WalkError {
                path: pending.path.clone(),
                error,
            });
        }
        let mut entries = listing.entries;
        entries.sort_by(|(a, _), (b, _)| a.cmp(b));
        if self.frames.len() - self.oldest_open >= MAX_OPEN_DIRECTORIES {
            self.frames[self.oldest_open].directory = None;
            self.oldest_open += 1;
        }
        self.frames.push(Frame {
            directory: Some(directory),
            name: pending.name.unwrap_or_default(),
            path: pending.path,
            depth: pending.depth,
            entries: entries.into_iter(),
            deferred,
        });
    }

    /// The descriptor of the frame at `index`, opened again by its path when it was given up.
    fn directory(&mut self, index: usize) -> io::Result<&sys::Dir> {
        if self.frames[index].directory.is_none() {
            let reopened = self.reopen(index)?;
            self.frames[index].directory = Some(reopened);
            self.oldest_open = self.oldest_open.min(index);
        }
        match &self.frames[index].directory {
            Some(directory) => Ok(directory),
            None => Err(io::Error::from(io::ErrorKind::NotFound)),
        }
    }

    /// Opens the directory of frame `index` again: from the nearest frame above it that still
    /// holds its descriptor, else from the starting path, through the names in between.
    fn reopen(&self, index: usize) -> io::Result<sys::Dir> {
        let base = self.frames[..index]
            .iter()
            .rposition(|frame| frame.directory.is_some());
        let names: Vec<&OsStr> = self.frames[base.map_or(1, |base| base + 1)..=index]
            .iter()
            .map(|frame| frame.name.as_os_str())
            .collect();
        let mut reopened = match base {
            Some(_) => None,
            None => match &self.root {
                Some(root) => Some(root.open_dir()?),
                None => return Err(io::Error::from(io::ErrorKind::NotFound)),
            },
        };
        for chunk in path_chunks(&names) {
            let next = {
                let from = match (&reopened, base) {
                    (Some(directory), _) => directory,
                    (None, Some(base)) => match &self.frames[base].directory {
                        Some(directory) => directory,
                        None => return Err(io::Error::from(io::ErrorKind::NotFound)),
                    },
                    (None, None) => return Err(io::Error::from(io::ErrorKind::NotFound)),
                };
                from.open_dir(&chunk)?
            };
            reopened = Some(next);
        }
        reopened.ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
    }

    /// Whether `entry` is the entry yielded last, so that [`Walker::current`] says where it is.
    fn is_current(&self, entry: &Entry) -> bool {
        entry.serial == self.serial && self.serial != 0
    }

    /// Whether `entry` is the starting path, yielded last.
    fn is_root(&self, entry: &Entry) -> bool {
        self.is_current(entry) && matches!(self.current, Current::Root)
    }

    /// The open directory holding `entry` and its name there, when `entry` is the entry yielded
    /// last and lies below the starting path.
    fn parent_of(&mut self, entry: &Entry) -> Option<io::Result<(&sys::Dir, &OsStr)>> {
        if !self.is_current(entry) {
            return None;
        }
        let Current::Child(frame, _) = &self.current else {
            return None;
        };
        let frame = *frame;
        if let Err(error) = self.directory(frame) {
            return Some(Err(error));
        }
        match (&self.frames[frame].directory, &self.current) {
            (Some(directory), Current::Child(_, name)) => Some(Ok((directory, name.as_os_str()))),
            _ => Some(Err(io::Error::from(io::ErrorKind::NotFound))),
        }
    }

    fn skippable(&self, depth: usize) -> bool {
        depth < self.options.min_depth || depth > self.options.max_depth
    }

    fn stamp(&mut self, mut entry: Entry) -> Entry {
        self.serial += 1;
        entry.serial = self.serial;
        entry
    }
}

/// Longest relative path opened in one step when a directory is opened again by its path: well
/// below the 4,096 bytes of `PATH_MAX`.
const LONGEST_REOPEN_PATH: usize = 2048;

/// `names` joined with `/` into paths of at most [`LONGEST_REOPEN_PATH`] bytes each (a longer
/// single name is a path of its own).
fn path_chunks(names: &[&OsStr]) -> Vec<OsString> {
    let mut chunks: Vec<OsString> = Vec::new();
    for name in names {
        match chunks.last_mut() {
            Some(chunk) if chunk.len() + 1 + name.len() <= LONGEST_REOPEN_PATH => {
                chunk.push("/");
                chunk.push(name);
            }
            _ => chunks.push(name.to_os_string()),
        }
    }
    chunks
}

/// What listing a directory found: its entries (without `.` and `..`) and the errors of entries
/// that could not be listed.
struct Listing {
    entries: Vec<(OsString, Kind)>,
    errors: Vec<io::Error>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    /// A directory under the system's temporary directory, removed when dropped.
    struct TempDir(PathBuf);

    impl TempDir {
        fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn tempdir() -> TempDir {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let path = std::env::temp_dir().join(format!(
            "clawcage-walk-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }

    fn walk(start: &Path, options: WalkOptions) -> Vec<String> {
        let mut walker = Walker::new(&start.display().to_string(), options);
        let mut seen = Vec::new();
        while let Some(entry) = walker.next() {
            match entry {
                Ok(entry) => {
                    let shown = entry
                        .path()
                        .strip_prefix(start)
                        .unwrap()
                        .display()
                        .to_string();
                    seen.push(format!("{}{shown}", entry.depth()));
                }
                Err(error) => seen.push(format!("error {}", error.io_error().kind())),
            }
        }
        seen
    }

    fn tree() -> TempDir {
        let dir = tempdir();
        for path in ["b/y", "b/x/deep", "a", "c/z"] {
            fs::create_dir_all(dir.path().join(path)).unwrap();
        }
        for file in ["b/2.txt", "b/1.txt", "a/only.txt", "top.txt", "b/x/deep/f"] {
            fs::write(dir.path().join(file), file).unwrap();
        }
        dir
    }

    #[test]
    fn entries_come_depth_first_sorted_by_name() {
        let dir = tree();
        assert_eq!(
            walk(dir.path(), WalkOptions::default()),
            [
                "0",
                "1a",
                "2a/only.txt",
                "1b",
                "2b/1.txt",
                "2b/2.txt",
                "2b/x",
                "3b/x/deep",
                "4b/x/deep/f",
                "2b/y",
                "1c",
                "2c/z",
                "1top.txt"
            ]
        );
    }

    #[test]
    fn depth_limits_and_contents_first() {
        let dir = tree();
        let options = WalkOptions {
            min_depth: 1,
            max_depth: 1,
            contents_first: false,
        };
        assert_eq!(walk(dir.path(), options), ["1a", "1b", "1c", "1top.txt"]);
        let options = WalkOptions {
            contents_first: true,
            ..WalkOptions::default()
        };
        let seen = walk(&dir.path().join("b"), options);
        assert_eq!(
            seen,
            ["11.txt", "12.txt", "3x/deep/f", "2x/deep", "1x", "1y", "0"]
        );
    }

    #[test]
    fn a_skipped_directory_is_not_entered() {
        let dir = tree();
        let mut walker = Walker::new(&dir.path().display().to_string(), WalkOptions::default());
        let mut names = Vec::new();
        while let Some(entry) = walker.next() {
            let entry = entry.unwrap();
            if entry.is_dir() && entry.file_name() == "b" {
                walker.skip_current_dir();
            }
            names.push(entry.file_name().to_string_lossy().into_owned());
        }
        assert!(names.contains(&"b".to_string()));
        assert!(!names.contains(&"1.txt".to_string()), "{names:?}");
        assert!(names.contains(&"z".to_string()));
    }

    #[test]
    fn files_are_read_and_stat_from_their_directory() {
        let dir = tree();
        let mut walker = Walker::new(&dir.path().display().to_string(), WalkOptions::default());
        let mut read = Vec::new();
        while let Some(entry) = walker.next() {
            let entry = entry.unwrap();
            if entry.is_file() {
                let data = walker.read_file(&entry).unwrap();
                assert_eq!(walker.metadata(&entry).unwrap().len, data.len() as u64);
                read.push(String::from_utf8(data).unwrap());
            } else if entry.depth() > 0 && entry.is_dir() {
                let empty = walker.is_empty_dir(&entry).unwrap();
                assert_eq!(empty, entry.file_name() == "y" || entry.file_name() == "z");
            }
        }
        assert_eq!(
            read,
            ["a/only.txt", "b/1.txt", "b/2.txt", "b/x/deep/f", "top.txt"]
        );
    }

    #[test]
    fn a_missing_start_is_an_error_naming_it() {
        let dir = tree();
        let missing = dir.path().join("nope");
        let mut walker = Walker::new(&missing.display().to_string(), WalkOptions::default());
        let error = walker.next().unwrap().unwrap_err();
        assert_eq!(error.path(), missing);
        assert_eq!(error.io_error().kind(), io::ErrorKind::NotFound);
        assert!(walker.next().is_none());
    }

    #[cfg(unix)]
    #[test]
    fn links_are_entered_only_as_the_start() {
        let dir = tree();
        std::os::unix::fs::symlink("b", dir.path().join("link")).unwrap();
        std::os::unix::fs::symlink("link2", dir.path().join("link2")).unwrap();
        let seen = walk(dir.path(), WalkOptions::default());
        assert!(seen.contains(&"1link".to_string()));
        assert!(
            !seen.iter().any(|path| path.starts_with("2link")),
            "{seen:?}"
        );
        let mut walker = Walker::new(
            &dir.path().join("link").display().to_string(),
            WalkOptions::default(),
        );
        let first = walker.next().unwrap().unwrap();
        assert!(first.is_symlink());
        assert!(
            walker
                .next()
                .unwrap()
                .unwrap()
                .path()
                .ends_with("link/1.txt")
        );
        let mut walker = Walker::new(
            &dir.path().join("link2").display().to_string(),
            WalkOptions::default(),
        );
        assert!(walker.next().unwrap().is_err());
        assert!(walker.next().is_none());
    }

    #[test]
    fn long_paths_are_opened_in_chunks() {
        let long = "n".repeat(200);
        let names: Vec<&OsStr> = (0..25).map(|_| OsStr::new(long.as_str())).collect();
        let chunks = path_chunks(&names);
        assert!(chunks.len() > 1);
        assert!(
            chunks
                .iter()
                .all(|chunk| chunk.len() <= LONGEST_REOPEN_PATH)
        );
        let joined: Vec<String> = chunks
            .iter()
            .map(|chunk| chunk.to_string_lossy().into_owned())
            .collect();
        assert_eq!(joined.join("/"), vec![long.as_str(); 25].join("/"));
        assert!(path_chunks(&[]).is_empty());
    }

    #[test]
    fn a_deep_tree_holds_few_descriptors_and_reopens_what_it_gave_up() {
        let dir = tempdir();
        let mut path = dir.path().to_path_buf();
        let depth = MAX_OPEN_DIRECTORIES * 3;
        for level in 0..depth {
            path.push("d");
            fs::create_dir(&path).unwrap();
            fs::write(path.join("f"), format!("{level}")).unwrap();
            // A sibling after the subdirectory, read once the walk comes back up.
            fs::write(path.join("g"), format!("g{level}")).unwrap();
        }
        let mut walker = Walker::new(&dir.path().display().to_string(), WalkOptions::default());
        let mut read = 0;
        let mut most_open = 0;
        while let Some(entry) = walker.next() {
            let entry = entry.unwrap();
            most_open = most_open.max(
                walker
                    .frames
                    .iter()
                    .filter(|frame| frame.directory.is_some())
                    .count(),
            );
            if entry.is_file() {
                let data = walker.read_file(&entry).unwrap();
                assert!(!data.is_empty());
                read += 1;
            }
        }
        assert_eq!(read, depth * 2);
        assert!(most_open <= MAX_OPEN_DIRECTORIES + 1, "{most_open}");
    }
}
