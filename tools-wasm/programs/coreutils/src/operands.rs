//! What `mv` and `cp -r` share: their options (`-f -n -v -T -t DIR`, and `-r` for `cp`), how
//! their operands become pairs of source and target (`SOURCE TARGET`, `SOURCE... DIRECTORY`,
//! `-t DIRECTORY SOURCE...`) with GNU's messages for the wrong ones, paths compared by name,
//! and errors in GNU's words.

use std::ffi::OsString;
use std::io;
use std::path::{Component, Path, PathBuf};

/// What the command line asks.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Request {
    pub(crate) no_clobber: bool,
    pub(crate) verbose: bool,
    pub(crate) no_target_directory: bool,
    pub(crate) recursive: bool,
    pub(crate) target_directory: Option<PathBuf>,
    pub(crate) operands: Vec<PathBuf>,
}

/// The request `args` make, or `None` for an option outside the shared set (`-r`/`-R`/
/// `--recursive` count only when `recursive_allowed`).
pub(crate) fn parse(args: &[OsString], recursive_allowed: bool) -> Option<Request> {
    let mut request = Request::default();
    let mut options_done = false;
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        let text = arg.to_str()?;
        if options_done || !text.starts_with('-') || text == "-" {
            request.operands.push(PathBuf::from(arg));
            continue;
        }
        match text {
            "--" => options_done = true,
            "--recursive" if recursive_allowed => request.recursive = true,
            "--force" => request.no_clobber = false,
            "--no-clobber" => request.no_clobber = true,
            "--verbose" => request.verbose = true,
            "--no-target-directory" => request.no_target_directory = true,
            "--target-directory" => request.target_directory = Some(PathBuf::from(iter.next()?)),
            long if long.starts_with("--target-directory=") => {
                request.target_directory =
                    Some(PathBuf::from(&long["--target-directory=".len()..]));
            }
            long if long.starts_with("--") => return None,
            short => {
                let flags: Vec<char> = short[1..].chars().collect();
                for (index, flag) in flags.iter().enumerate() {
                    match flag {
                        'r' | 'R' if recursive_allowed => request.recursive = true,
                        'f' => request.no_clobber = false,
                        'n' => request.no_clobber = true,
                        'v' => request.verbose = true,
                        'T' => request.no_target_directory = true,
                        't' => {
                            let rest: String = flags[index + 1..].iter().collect();
                            request.target_directory = Some(if rest.is_empty() {
                                PathBuf::from(iter.next()?)
                            } else {
                                PathBuf::from(rest)
                            });
                            break;
                        }
                        _ => return None,
                    }
                }
            }
        }
    }
    Some(request)
}

/// What the operands come to.
pub(crate) enum Plan<'a> {
    /// One source to exactly this target.
    One(&'a Path, &'a Path),
    /// Each source into this existing directory, under its own name.
    Into(&'a [PathBuf], PathBuf),
    /// The operands are wrong; the message says how (without the program's name).
    Wrong(String),
}

/// How `request`'s operands pair up, as GNU's `mv` and `cp` pair them.
pub(crate) fn plan(request: &Request) -> Plan<'_> {
    let wrong = Plan::Wrong;
    let (sources, directory) = match (&request.target_directory, request.operands.as_slice()) {
        (Some(_), _) if request.no_target_directory => {
            return wrong(
                "cannot combine --target-directory (-t) and --no-target-directory (-T)".into(),
            );
        }
        (Some(directory), []) => {
            return wrong(format!(
                "missing file operand after '{}'",
                directory.display()
            ));
        }
        (Some(directory), sources) => (sources, directory.clone()),
        (None, []) => return wrong("missing file operand".into()),
        (None, [only]) => {
            return wrong(format!(
                "missing destination file operand after '{}'",
                only.display()
            ));
        }
        (None, [source, target]) if request.no_target_directory || !target.is_dir() => {
            return Plan::One(source, target);
        }
        (None, _) if request.no_target_directory => {
            return wrong(format!("extra operand '{}'", request.operands[2].display()));
        }
        (None, [sources @ .., target]) => (sources, target.clone()),
    };
    if !directory.is_dir() {
        return wrong(format!(
            "target '{}' is not a directory",
            directory.display()
        ));
    }
    Plan::Into(sources, directory)
}

/// `path` made absolute against the working directory, with `.` and `..` resolved by name.
pub(crate) fn lexical(path: &Path) -> PathBuf {
    let absolute = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()
            .unwrap_or_else(|_| PathBuf::from("/"))
            .join(path)
    };
    let mut out = PathBuf::from("/");
    for component in absolute.components() {
        match component {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(name) => out.push(name),
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
        }
    }
    out
}

/// An I/O error in GNU's words.
pub(crate) fn describe(error: &io::Error) -> String {
    match error.kind() {
        io::ErrorKind::NotFound => "No such file or directory".to_string(),
        io::ErrorKind::PermissionDenied => "Permission denied".to_string(),
        io::ErrorKind::DirectoryNotEmpty => "Directory not empty".to_string(),
        io::ErrorKind::ReadOnlyFilesystem => "Read-only file system".to_string(),
        _ => {
            // std's words carry "(os error N)", whose number is not the host's: drop it.
            let text = error.to_string();
            match text.rfind(" (os error") {
                Some(cut) => text[..cut].to_string(),
                None => text,
            }
        }
    }
}

/// What the unit tests of `cp` and `mv` share: arguments from words, a fresh scratch
/// directory, and one run of a program on paths inside it.
#[cfg(test)]
pub(crate) mod testing {
    use super::Request;
    use std::ffi::OsString;
    use std::path::{Path, PathBuf};

    pub(crate) fn args(words: &[&str]) -> Vec<OsString> {
        words.iter().map(OsString::from).collect()
    }

    /// An empty directory of its own for `program`'s `test`.
    pub(crate) fn scratch(program: &str, test: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("clawcage-{program}-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Runs `execute` on what `parse` makes of `words` (paths relative to `dir`, options as
    /// they are); returns the status, stdout and stderr with `dir/` taken out.
    pub(crate) fn run(
        dir: &Path,
        words: &[&str],
        parse: impl FnOnce(&[OsString]) -> Option<Request>,
        execute: impl FnOnce(&Request, &mut Vec<u8>, &mut Vec<u8>) -> i32,
    ) -> (i32, String, String) {
        let absolute: Vec<OsString> = words
            .iter()
            .map(|word| {
                if word.starts_with('-') {
                    OsString::from(word)
                } else {
                    dir.join(word).into_os_string()
                }
            })
            .collect();
        let request = parse(&absolute).expect("a form this program covers");
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let status = execute(&request, &mut out, &mut err);
        let text = |bytes: Vec<u8>| {
            String::from_utf8(bytes)
                .unwrap()
                .replace(&format!("{}/", dir.display()), "")
        };
        (status, text(out), text(err))
    }
}

#[cfg(test)]
mod tests {
    use super::testing::args;
    use super::*;

    #[test]
    fn options_outside_the_shared_set_are_left_to_uutils() {
        assert!(parse(&args(&["-i", "a", "b"]), false).is_none());
        assert!(parse(&args(&["--backup=numbered", "a", "b"]), false).is_none());
        assert!(parse(&args(&["-r", "a", "b"]), false).is_none());
        let request = parse(&args(&["-Rfv", "-t", "d", "--", "-x", "y"]), true).unwrap();
        assert!(request.recursive && request.verbose && !request.no_clobber);
        assert_eq!(request.target_directory, Some(PathBuf::from("d")));
        assert_eq!(request.operands, [PathBuf::from("-x"), PathBuf::from("y")]);
        assert_eq!(
            parse(&args(&["-tdir", "a"]), false)
                .unwrap()
                .target_directory,
            Some(PathBuf::from("dir"))
        );
    }

    #[test]
    fn paths_compare_by_name() {
        assert_eq!(lexical(Path::new("/w/a/../b/./c")), PathBuf::from("/w/b/c"));
        assert_eq!(lexical(Path::new("/../x")), PathBuf::from("/x"));
    }
}
