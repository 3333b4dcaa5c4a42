//! `mv` as the sandbox can run it. uutils' `mv` first makes sure that source and target are not
//! the same file by canonicalizing both from the root, `lstat`ing every ancestor of the workspace
//! (`/`, `/tmp`, ...), which the sandbox does not show, so every rename failed with "No such file
//! or directory". This `mv` handles the common forms itself — `mv [-fnvT] SOURCE TARGET`,
//! `mv [-fnv] SOURCE... DIRECTORY`, `mv [-fnv] -t DIRECTORY SOURCE...` — with one rename each and
//! GNU's messages; anything else (`-i`, `-b`, `-u`, `--backup`, ...) goes to uutils' `mv` as
//! before. Paths are compared lexically (`..` resolved by name), which is what the sandbox itself
//! resolves, and the rename is made by the host inside the workspace, so nothing here can reach
//! further than the program could before.

use std::ffi::OsString;
use std::io;
use std::path::Path;

use crate::operands::{Plan, Request, describe, lexical, parse, plan};

/// Runs `mv` with `args` (`args[0]` is the name) when this implementation covers the options;
/// `None` hands the call to uutils' `mv`.
pub fn run(args: &[OsString]) -> Option<i32> {
    let request = parse(args.get(1..).unwrap_or_default(), false)?;
    let mut stderr = io::stderr().lock();
    let mut stdout = io::stdout().lock();
    Some(execute(&request, &mut stdout, &mut stderr))
}

/// Carries out `request`; the exit status (0, or 1 when any move failed).
fn execute(request: &Request, stdout: &mut impl io::Write, stderr: &mut impl io::Write) -> i32 {
    let mut fail = |message: String| {
        let _ = writeln!(stderr, "mv: {message}");
        1
    };
    match plan(request) {
        Plan::Wrong(message) => fail(message),
        Plan::One(source, target) => move_one(request, source, target, stdout, &mut fail),
        Plan::Into(sources, directory) => {
            let mut status = 0;
            for source in sources {
                let Some(name) = lexical(source).file_name().map(ToOwned::to_owned) else {
                    status = fail(format!(
                        "cannot move '{}' to a subdirectory of itself, '{}'",
                        source.display(),
                        directory.display()
                    ));
                    continue;
                };
                if move_one(request, source, &directory.join(name), stdout, &mut fail) != 0 {
                    status = 1;
                }
            }
            status
        }
    }
}

/// Moves `source` to exactly `target`; 0, or 1 after `fail` reported why not.
fn move_one(
    request: &Request,
    source: &Path,
    target: &Path,
    stdout: &mut impl io::Write,
    fail: &mut impl FnMut(String) -> i32,
) -> i32 {
    let (shown_source, shown_target) = (source.display(), target.display());
    let Ok(source_kind) = std::fs::symlink_metadata(source) else {
        return fail(format!(
            "cannot stat '{shown_source}': No such file or directory"
        ));
    };
    let (from, to) = (lexical(source), lexical(target));
    if from == to {
        return fail(format!(
            "'{shown_source}' and '{shown_target}' are the same file"
        ));
    }
    if source_kind.is_dir() && to.starts_with(&from) {
        return fail(format!(
            "cannot move '{shown_source}' to a subdirectory of itself, '{shown_target}'"
        ));
    }
    if let Ok(existing) = std::fs::symlink_metadata(target) {
        if request.no_clobber {
            return 0;
        }
        if existing.is_dir() && !source_kind.is_dir() {
            return fail(format!(
                "cannot overwrite directory '{shown_target}' with non-directory"
            ));
        }
        if !existing.is_dir() && source_kind.is_dir() {
            return fail(format!(
                "cannot overwrite non-directory '{shown_target}' with directory '{shown_source}'"
            ));
        }
    }
    if let Err(error) = std::fs::rename(source, target) {
        return fail(format!(
            "cannot move '{shown_source}' to '{shown_target}': {}",
            describe(&error)
        ));
    }
    if request.verbose {
        let _ = writeln!(stdout, "renamed '{shown_source}' -> '{shown_target}'");
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operands::testing;
    use std::fs;
    use std::path::PathBuf;

    /// A fresh directory with `a.txt` ("a") and `dir/`.
    fn scratch(test: &str) -> PathBuf {
        let dir = testing::scratch("mv", test);
        fs::create_dir_all(dir.join("dir")).unwrap();
        fs::write(dir.join("a.txt"), "a").unwrap();
        dir
    }

    /// Runs `mv` with `words` (paths relative to `dir`), returning status, stdout and stderr.
    fn mv(dir: &Path, words: &[&str]) -> (i32, String, String) {
        testing::run(dir, words, |args| parse(args, false), execute)
    }

    #[test]
    fn renames_moves_into_a_directory_and_says_so() {
        let dir = scratch("renames");
        assert_eq!(
            mv(&dir, &["-v", "a.txt", "b.txt"]),
            (0, "renamed 'a.txt' -> 'b.txt'\n".into(), String::new())
        );
        assert_eq!(mv(&dir, &["b.txt", "dir"]).0, 0);
        assert_eq!(fs::read_to_string(dir.join("dir/b.txt")).unwrap(), "a");
        fs::write(dir.join("c.txt"), "c").unwrap();
        fs::write(dir.join("d.txt"), "d").unwrap();
        assert_eq!(mv(&dir, &["c.txt", "d.txt", "dir"]).0, 0);
        assert!(dir.join("dir/c.txt").exists() && dir.join("dir/d.txt").exists());
        assert_eq!(mv(&dir, &["dir", "moved"]).0, 0);
        assert!(dir.join("moved/c.txt").exists());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn refusals_use_gnu_words_and_change_nothing() {
        let dir = scratch("refusals");
        let (status, _, err) = mv(&dir, &["missing", "b"]);
        assert_eq!(
            (status, err.as_str()),
            (1, "mv: cannot stat 'missing': No such file or directory\n")
        );
        let (status, _, err) = mv(&dir, &["a.txt", "a.txt"]);
        assert_eq!(
            (status, err.as_str()),
            (1, "mv: 'a.txt' and 'a.txt' are the same file\n")
        );
        let (status, _, err) = mv(&dir, &["dir", "dir/inner"]);
        assert_eq!(status, 1);
        assert!(err.contains("to a subdirectory of itself"), "{err}");
        let (status, _, err) = mv(&dir, &["-T", "a.txt", "dir"]);
        assert_eq!(
            (status, err.as_str()),
            (
                1,
                "mv: cannot overwrite directory 'dir' with non-directory\n"
            )
        );
        fs::write(dir.join("b.txt"), "b").unwrap();
        let (status, _, err) = mv(&dir, &["a.txt", "b.txt", "c.txt"]);
        assert_eq!(
            (status, err.as_str()),
            (1, "mv: target 'c.txt' is not a directory\n")
        );
        // -n keeps what is there.
        assert_eq!(mv(&dir, &["-n", "a.txt", "b.txt"]).0, 0);
        assert_eq!(fs::read_to_string(dir.join("a.txt")).unwrap(), "a");
        assert_eq!(fs::read_to_string(dir.join("b.txt")).unwrap(), "b");
        fs::remove_dir_all(&dir).unwrap();
    }
}
