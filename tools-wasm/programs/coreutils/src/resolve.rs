//! `realpath` and `readlink -f` as the sandbox can run them. uutils resolves a path from `/`,
//! `lstat`ing every ancestor of the workspace (`/`, `/tmp`, ...), which the sandbox does not
//! show, so both failed for every path. These resolve the same way (symbolic links followed,
//! `.` and `..` taken as the kernel takes them), except that an ancestor of the working
//! directory the sandbox does not show is taken as the plain directory it must be. The common
//! forms are covered — `realpath [-e|-m] [-s] [-q] [-z] FILE...` and `readlink -f|-e|-m [-n]
//! [-q] [-z] FILE...`; anything else (`--relative-to`, `readlink` without `-f`, ...) goes to
//! uutils as before.

use std::ffi::OsString;
use std::io;
use std::path::{Component, Path, PathBuf};

/// Which components must exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Missing {
    /// All but the last (`realpath`'s default, `readlink -f`).
    AllButLast,
    /// All (`-e`).
    None,
    /// Any (`-m`).
    Any,
}

/// What the command line asks.
#[derive(Debug, PartialEq)]
struct Request {
    missing: Missing,
    /// `-s`: `..` and links taken by name, nothing looked up.
    lexical: bool,
    quiet: bool,
    /// `-z`: end each output with NUL instead of a newline.
    zero: bool,
    /// `readlink -n`: no newline after the last output.
    no_newline: bool,
    files: Vec<PathBuf>,
}

/// Runs `realpath` (`readlink: false`) or `readlink` with `args` (`args[0]` is the name) when
/// this implementation covers its options; `None` hands the call to uutils.
pub fn run(readlink: bool, args: &[OsString]) -> Option<i32> {
    let request = parse(readlink, args.get(1..).unwrap_or_default())?;
    let mut stdout = io::stdout().lock();
    let mut stderr = io::stderr().lock();
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
    let name = if readlink { "readlink" } else { "realpath" };
    Some(execute(name, &request, &cwd, &mut stdout, &mut stderr))
}

fn parse(readlink: bool, args: &[OsString]) -> Option<Request> {
    let mut request = Request {
        missing: Missing::AllButLast,
        lexical: false,
        quiet: false,
        zero: false,
        no_newline: false,
        files: Vec::new(),
    };
    let mut canonical = !readlink;
    let mut options_done = false;
    for arg in args {
        let text = arg.to_str()?;
        if options_done || !text.starts_with('-') || text == "-" {
            request.files.push(PathBuf::from(arg));
            continue;
        }
        let long = |name: &str| -> Option<char> {
            Some(match (readlink, name) {
                (_, "canonicalize-existing") => 'e',
                (_, "canonicalize-missing") => 'm',
                (true, "canonicalize") => 'f',
                (false, "strip" | "no-symlinks") => 's',
                (_, "quiet") => 'q',
                (true, "silent") => 's',
                (_, "zero") => 'z',
                (true, "no-newline") => 'n',
                _ => return None,
            })
        };
        let flags: Vec<char> = match text.strip_prefix("--") {
            Some("") => {
                options_done = true;
                continue;
            }
            Some(name) => vec![long(name)?],
            None => text[1..].chars().collect(),
        };
        for flag in flags {
            match (readlink, flag) {
                (_, 'e') => {
                    request.missing = Missing::None;
                    canonical = true;
                }
                (_, 'm') => {
                    request.missing = Missing::Any;
                    canonical = true;
                }
                (true, 'f') => {
                    request.missing = Missing::AllButLast;
                    canonical = true;
                }
                (false, 's') => request.lexical = true,
                (_, 'q') | (true, 's') => request.quiet = true,
                (_, 'z') => request.zero = true,
                (true, 'n') => request.no_newline = true,
                (false, 'E') => request.missing = Missing::AllButLast,
                _ => return None,
            }
        }
    }
    // `readlink` without -f/-e/-m prints a link's text: uutils does that well.
    canonical.then_some(request)
}

fn execute(
    name: &str,
    request: &Request,
    cwd: &Path,
    stdout: &mut impl io::Write,
    stderr: &mut impl io::Write,
) -> i32 {
    if request.files.is_empty() {
        let _ = writeln!(stderr, "{name}: missing operand");
        return 1;
    }
    let mut status = 0;
    let count = request.files.len();
    for (index, file) in request.files.iter().enumerate() {
        match resolve(file, cwd, request) {
            Ok(path) => {
                let last = index + 1 == count;
                let end = if request.zero {
                    "\0"
                } else if request.no_newline && last {
                    ""
                } else {
                    "\n"
                };
                let _ = write!(stdout, "{}{end}", path.display());
            }
            Err(error) => {
                status = 1;
                if !request.quiet {
                    let _ = writeln!(
                        stderr,
                        "{name}: {}: {}",
                        file.display(),
                        crate::operands::describe(&error)
                    );
                }
            }
        }
    }
    status
}

/// Links followed in a row before giving up, as the kernel does.
const MAX_LINKS: usize = 40;

/// `path` resolved against `cwd` as `request` says.
fn resolve(path: &Path, cwd: &Path, request: &Request) -> io::Result<PathBuf> {
    if path.as_os_str().is_empty() {
        return Err(io::Error::from(io::ErrorKind::NotFound));
    }
    let absolute = if path.is_absolute() {
        path.to_path_buf()
    } else {
        cwd.join(path)
    };
    if request.lexical {
        return Ok(crate::operands::lexical(&absolute));
    }
    // The components still to walk, first one last.
    let mut pending: Vec<OsString> = names(&absolute).into_iter().rev().collect();
    let mut resolved = PathBuf::from("/");
    let mut links = 0;
    while let Some(name) = pending.pop() {
        if name == ".." {
            resolved.pop();
            continue;
        }
        let candidate = resolved.join(&name);
        let is_last = pending.is_empty();
        match std::fs::symlink_metadata(&candidate) {
            Ok(metadata) if metadata.file_type().is_symlink() => {
                links += 1;
                if links > MAX_LINKS {
                    return Err(io::Error::other("Too many levels of symbolic links"));
                }
                let target = std::fs::read_link(&candidate)?;
                if target.is_absolute() {
                    resolved = PathBuf::from("/");
                }
                pending.extend(names(&target).into_iter().rev());
            }
            Ok(metadata) => {
                if !is_last && !metadata.is_dir() {
                    return Err(io::Error::from(io::ErrorKind::NotADirectory));
                }
                resolved = candidate;
            }
            // An ancestor of the working directory that the sandbox does not show: a directory.
            Err(_) if cwd.starts_with(&candidate) => resolved = candidate,
            Err(error) => match request.missing {
                Missing::Any => resolved = candidate,
                Missing::AllButLast if is_last => resolved = candidate,
                _ => return Err(error),
            },
        }
    }
    Ok(resolved)
}

/// The names of `path`, `..` kept, `.` and the root dropped.
fn names(path: &Path) -> Vec<OsString> {
    path.components()
        .filter_map(|component| match component {
            Component::Normal(name) => Some(name.to_os_string()),
            Component::ParentDir => Some(OsString::from("..")),
            Component::CurDir | Component::RootDir | Component::Prefix(_) => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn args(words: &[&str]) -> Vec<OsString> {
        words.iter().map(OsString::from).collect()
    }

    /// A fresh directory (canonical) with `a.txt`, `sub/`, `link -> sub` and `loop -> loop`.
    fn scratch(test: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("clawcage-resolve-{test}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("sub")).unwrap();
        fs::write(dir.join("a.txt"), "a").unwrap();
        std::os::unix::fs::symlink("sub", dir.join("link")).unwrap();
        std::os::unix::fs::symlink("loop", dir.join("loop")).unwrap();
        dir.canonicalize().unwrap()
    }

    fn run_in(dir: &Path, readlink: bool, words: &[&str]) -> (i32, String, String) {
        let request = parse(readlink, &args(words)).expect("a form this covers");
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let name = if readlink { "readlink" } else { "realpath" };
        let status = execute(name, &request, dir, &mut out, &mut err);
        let text = |bytes: Vec<u8>| String::from_utf8(bytes).unwrap();
        (status, text(out), text(err))
    }

    #[test]
    fn other_forms_go_to_uutils() {
        assert!(parse(false, &args(&["--relative-to=x", "a"])).is_none());
        assert!(parse(true, &args(&["link"])).is_none());
        assert!(parse(true, &args(&["-v", "-f", "link"])).is_none());
        assert!(parse(true, &args(&["-f", "link"])).is_some());
    }

    #[test]
    fn resolves_links_dots_and_missing_last_components() {
        let dir = scratch("links");
        let shown = dir.display();
        assert_eq!(
            run_in(&dir, false, &["link/../a.txt", "link/new", "./sub/"]),
            (
                0,
                format!("{shown}/a.txt\n{shown}/sub/new\n{shown}/sub\n"),
                String::new()
            )
        );
        assert_eq!(
            run_in(&dir, true, &["-f", "link"]),
            (0, format!("{shown}/sub\n"), String::new())
        );
        // -s takes the names as they are.
        assert_eq!(
            run_in(&dir, false, &["-s", "link/../a.txt"]).1,
            format!("{shown}/a.txt\n")
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn what_does_not_exist_fails_as_asked() {
        let dir = scratch("missing");
        let (status, _, err) = run_in(&dir, false, &["-e", "nothing"]);
        assert_eq!(
            (status, err.as_str()),
            (1, "realpath: nothing: No such file or directory\n")
        );
        let (status, _, _) = run_in(&dir, false, &["missing/deeper"]);
        assert_eq!(status, 1);
        let (status, out, _) = run_in(&dir, false, &["-m", "missing/deeper"]);
        assert_eq!(
            (status, out),
            (0, format!("{}/missing/deeper\n", dir.display()))
        );
        let (status, _, err) = run_in(&dir, true, &["-f", "loop"]);
        assert_eq!(status, 1);
        assert!(err.contains("Too many levels of symbolic links"), "{err}");
        let (status, _, err) = run_in(&dir, true, &["-fq", "a.txt/x"]);
        assert_eq!((status, err.as_str()), (1, ""));
        fs::remove_dir_all(&dir).unwrap();
    }
}
