//! `cp -r` as the sandbox can run it. uutils' `cp` compares a copied directory with its target by
//! canonicalizing both from the root, `lstat`ing every ancestor of the workspace (`/`, `/tmp`,
//! ...), which the sandbox does not show, so every recursive copy failed. This `cp` handles the
//! recursive forms itself — `cp -r [-fnvT] SOURCE TARGET`, `cp -r [-fnv] SOURCE... DIRECTORY`,
//! `cp -r [-fnv] -t DIRECTORY SOURCE...` (`-R`, `--recursive` alike) — copying files' bytes,
//! re-creating directories and symbolic links (a link is copied as a link, as GNU's `cp -r`
//! does), with GNU's messages. Anything else (a copy without `-r`, `-a`, `-p`, `-L`, `-u`, ...)
//! goes to uutils' `cp`, which handles plain files fine. Paths are compared by name, as the
//! sandbox resolves them; every file operation is the host's, inside the workspace.

use std::ffi::OsString;
use std::io;
use std::path::Path;

use crate::operands::{Plan, Request, describe, lexical, parse, plan};

/// Runs `cp` with `args` (`args[0]` is the name) when it asks for a recursive copy with options
/// this implementation covers; `None` hands the call to uutils' `cp`.
pub fn run(args: &[OsString]) -> Option<i32> {
    let request =
        parse(args.get(1..).unwrap_or_default(), true).filter(|request| request.recursive)?;
    let mut stderr = io::stderr().lock();
    let mut stdout = io::stdout().lock();
    Some(execute(&request, &mut stdout, &mut stderr))
}

/// Carries out `request`; the exit status (0, or 1 when anything failed).
fn execute(request: &Request, stdout: &mut impl io::Write, stderr: &mut impl io::Write) -> i32 {
    let mut copier = Copier {
        request,
        stdout,
        stderr,
        status: 0,
    };
    match plan(request) {
        Plan::Wrong(message) => copier.fail(message),
        Plan::One(source, target) => copier.copy_top(source, target),
        Plan::Into(sources, directory) => {
            for source in sources {
                match lexical(source).file_name() {
                    Some(name) => copier.copy_top(source, &directory.join(name)),
                    None => copier.fail(format!(
                        "cannot copy a directory, '{}', into itself, '{}'",
                        source.display(),
                        directory.display()
                    )),
                }
            }
        }
    }
    copier.status
}

/// One run's output and status.
struct Copier<'a, O, E> {
    request: &'a Request,
    stdout: &'a mut O,
    stderr: &'a mut E,
    status: i32,
}

impl<O: io::Write, E: io::Write> Copier<'_, O, E> {
    fn fail(&mut self, message: String) {
        let _ = writeln!(self.stderr, "cp: {message}");
        self.status = 1;
    }

    /// Copies an operand `source` to exactly `target`, after the checks GNU makes on operands.
    fn copy_top(&mut self, source: &Path, target: &Path) {
        let Ok(kind) = std::fs::symlink_metadata(source) else {
            self.fail(format!(
                "cannot stat '{}': No such file or directory",
                source.display()
            ));
            return;
        };
        let (from, to) = (lexical(source), lexical(target));
        if from == to {
            self.fail(format!(
                "'{}' and '{}' are the same file",
                source.display(),
                target.display()
            ));
            return;
        }
        if kind.is_dir() && to.starts_with(&from) {
            self.fail(format!(
                "cannot copy a directory, '{}', into itself, '{}'",
                source.display(),
                target.display()
            ));
            return;
        }
        self.copy(source, target, &kind);
    }

    /// Copies `source` (whose `lstat` is `kind`) to `target`, a directory's entries too.
    fn copy(&mut self, source: &Path, target: &Path, kind: &std::fs::Metadata) {
        let existing = std::fs::symlink_metadata(target).ok();
        let (shown_source, shown_target) = (source.display(), target.display());
        if kind.is_dir() {
            match &existing {
                Some(existing) if !existing.is_dir() => {
                    self.fail(format!(
                        "cannot overwrite non-directory '{shown_target}' with directory '{shown_source}'"
                    ));
                    return;
                }
                Some(_) => {}
                None => {
                    if let Err(error) = std::fs::create_dir(target) {
                        self.fail(format!(
                            "cannot create directory '{shown_target}': {}",
                            describe(&error)
                        ));
                        return;
                    }
                    self.said(source, target);
                }
            }
            let mut entries = match std::fs::read_dir(source) {
                Ok(entries) => entries.filter_map(Result::ok).collect::<Vec<_>>(),
                Err(error) => {
                    self.fail(format!(
                        "cannot access '{shown_source}': {}",
                        describe(&error)
                    ));
                    return;
                }
            };
            entries.sort_by_key(std::fs::DirEntry::file_name);
            for entry in entries {
                let from = entry.path();
                match std::fs::symlink_metadata(&from) {
                    Ok(kind) => self.copy(&from, &target.join(entry.file_name()), &kind),
                    Err(error) => self.fail(format!(
                        "cannot stat '{}': {}",
                        from.display(),
                        describe(&error)
                    )),
                }
            }
            return;
        }
        if let Some(existing) = &existing {
            if self.request.no_clobber {
                return;
            }
            if existing.is_dir() {
                self.fail(format!(
                    "cannot overwrite directory '{shown_target}' with non-directory"
                ));
                return;
            }
        }
        let copied = if kind.file_type().is_symlink() {
            std::fs::read_link(source).and_then(|link| {
                if existing.is_some() {
                    std::fs::remove_file(target)?;
                }
                symlink(&link, target)
            })
        } else {
            std::fs::copy(source, target).map(drop)
        };
        match copied {
            Ok(()) => self.said(source, target),
            Err(error) => self.fail(format!(
                "cannot copy '{shown_source}' to '{shown_target}': {}",
                describe(&error)
            )),
        }
    }

    fn said(&mut self, source: &Path, target: &Path) {
        if self.request.verbose {
            let _ = writeln!(
                self.stdout,
                "'{}' -> '{}'",
                source.display(),
                target.display()
            );
        }
    }
}

/// Creates the symbolic link `path` pointing to `target`: wasi-libc's `symlink(2)` (a
/// `symlink-at` on the workspace), which std offers only unstably.
#[cfg(target_os = "wasi")]
#[allow(unsafe_code)]
fn symlink(target: &Path, path: &Path) -> io::Result<()> {
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
fn symlink(target: &Path, path: &Path) -> io::Result<()> {
    std::os::unix::fs::symlink(target, path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operands::testing::{self, args};
    use std::fs;
    use std::path::PathBuf;

    /// A fresh directory with `src/{a.txt, sub/b.txt, link -> a.txt}` and `dir/`.
    fn scratch(test: &str) -> PathBuf {
        let dir = testing::scratch("cp", test);
        fs::create_dir_all(dir.join("src/sub")).unwrap();
        fs::create_dir_all(dir.join("dir")).unwrap();
        fs::write(dir.join("src/a.txt"), "a").unwrap();
        fs::write(dir.join("src/sub/b.txt"), "b").unwrap();
        symlink(Path::new("a.txt"), &dir.join("src/link")).unwrap();
        dir
    }

    fn cp(dir: &Path, words: &[&str]) -> (i32, String, String) {
        testing::run(
            dir,
            words,
            |args| parse(args, true).filter(|request| request.recursive),
            execute,
        )
    }

    #[test]
    fn only_recursive_copies_with_known_options_are_taken() {
        let taken =
            |words: &[&str]| parse(&args(words), true).is_some_and(|request| request.recursive);
        assert!(!taken(&["a", "b"]));
        assert!(!taken(&["-a", "a", "b"]));
        assert!(!taken(&["-rp", "a", "b"]));
        assert!(!taken(&["-rL", "a", "b"]));
        assert!(taken(&["-Rv", "-t", "d", "a"]));
    }

    #[test]
    fn copies_a_tree_with_its_links_into_a_new_or_an_existing_directory() {
        let dir = scratch("tree");
        assert_eq!(cp(&dir, &["-r", "src", "copy"]).0, 0);
        assert_eq!(fs::read_to_string(dir.join("copy/sub/b.txt")).unwrap(), "b");
        assert_eq!(
            fs::read_link(dir.join("copy/link")).unwrap(),
            PathBuf::from("a.txt")
        );
        let (status, out, _) = cp(&dir, &["-rv", "src", "dir"]);
        assert_eq!(status, 0);
        assert!(out.starts_with("'src' -> 'dir/src'\n"), "{out}");
        assert_eq!(fs::read_to_string(dir.join("dir/src/a.txt")).unwrap(), "a");
        // Again over what is there: files replaced, the tree merged.
        fs::write(dir.join("src/a.txt"), "new").unwrap();
        assert_eq!(cp(&dir, &["-r", "src", "dir"]).0, 0);
        assert_eq!(
            fs::read_to_string(dir.join("dir/src/a.txt")).unwrap(),
            "new"
        );
        // -n keeps what is there.
        fs::write(dir.join("src/a.txt"), "newer").unwrap();
        assert_eq!(cp(&dir, &["-rn", "src", "dir"]).0, 0);
        assert_eq!(
            fs::read_to_string(dir.join("dir/src/a.txt")).unwrap(),
            "new"
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn refusals_use_gnu_words() {
        let dir = scratch("refusals");
        let (status, _, err) = cp(&dir, &["-r", "missing", "x"]);
        assert_eq!(
            (status, err.as_str()),
            (1, "cp: cannot stat 'missing': No such file or directory\n")
        );
        let (status, _, err) = cp(&dir, &["-r", "src", "src/sub/inner"]);
        assert_eq!(status, 1);
        assert!(err.contains("into itself"), "{err}");
        fs::write(dir.join("file"), "f").unwrap();
        let (status, _, err) = cp(&dir, &["-rT", "src", "file"]);
        assert_eq!(status, 1);
        assert!(
            err.contains("cannot overwrite non-directory 'file' with directory 'src'"),
            "{err}"
        );
        assert!(!dir.join("src/sub/inner").exists());
        fs::remove_dir_all(&dir).unwrap();
    }
}
