//! `write_file`, and the atomic replace that `edit_file` shares.

use std::collections::hash_map::RandomState;
use std::ffi::OsString;
use std::fs::{self, OpenOptions};
use std::hash::BuildHasher;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use clawcage_tool_sdk::ToolError;
use clawcage_tool_sdk::workspace::{self, Access, Mode};

use crate::text::plural;
use crate::{Ctx, refuse_special};

/// Marker in the names of temporary files, so a leftover one (from an
/// instance stopped in the middle of a write) is recognisable.
pub(crate) const TEMP_MARKER: &str = ".clawcage-tmp-";

/// Longest part of the target's name kept in a temporary file's name, so the
/// temporary name stays within file-name length limits.
const MAX_NAME_IN_TEMP: usize = 100;

/// A fresh temporary path next to `target`: `.NAME.clawcage-tmp-<random>`.
fn temp_path(target: &Path) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    // A per-instance random key (std seeds it from wasi:random) plus a
    // counter: unique even across instances writing the same directory.
    let nonce = RandomState::new().hash_one(COUNTER.fetch_add(1, Ordering::Relaxed));
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let short: String = name.chars().take(MAX_NAME_IN_TEMP).collect();
    let mut file_name = OsString::from(".");
    file_name.push(short);
    file_name.push(format!("{TEMP_MARKER}{nonce:016x}"));
    target.with_file_name(file_name)
}

/// Replace `target` with the concatenation of `parts`, atomically: write a
/// temporary file in the same directory, flush it, then rename it over the
/// target. On any failure the temporary file is removed, so either the old
/// file or the complete new one remains, never a half-written file.
///
/// The parent directory must exist. The new file gets default permissions
/// (WASI cannot copy a mode).
pub(crate) fn atomic_write(target: &Path, parts: &[&[u8]]) -> io::Result<()> {
    let mut attempts = 0;
    let (tmp, mut file) = loop {
        let tmp = temp_path(target);
        match OpenOptions::new().write(true).create_new(true).open(&tmp) {
            Ok(file) => break (tmp, file),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && attempts < 8 => attempts += 1,
            Err(e) => return Err(e),
        }
    };
    let written = (|| {
        for part in parts {
            file.write_all(part)?;
        }
        file.flush()?;
        drop(file);
        fs::rename(&tmp, target)
    })();
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written
}

/// Writes `parts` as the whole content of `target`: atomically (a temporary file renamed over
/// it), except where each write is asked of the operator (`ro-ask`): there the file is written
/// in place, so the operator is asked once, about the file itself, not about a temporary name
/// and a rename.
pub(crate) fn replace_contents(ctx: &Ctx, target: &Path, parts: &[&[u8]]) -> io::Result<()> {
    if ctx.mode != Mode::AskToWrite {
        return atomic_write(target, parts);
    }
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(target)?;
    for part in parts {
        file.write_all(part)?;
    }
    file.flush()
}

/// Most symbolic links followed in a row before giving up.
const MAX_LINK_HOPS: u32 = 40;

/// Where a write to `abs` must go: if `abs` is a symbolic link (to a file
/// inside the workspace), its target, so the atomic replace updates the file
/// and keeps the link instead of replacing the link with a copy. A link whose
/// target lies outside the workspace is refused.
pub(crate) fn follow_links(ctx: &Ctx, mut abs: PathBuf, path: &str) -> Result<PathBuf, ToolError> {
    for _ in 0..MAX_LINK_HOPS {
        match fs::symlink_metadata(&abs) {
            Ok(meta) if meta.file_type().is_symlink() => {}
            _ => return Ok(abs),
        }
        let target = fs::read_link(&abs).map_err(|e| ctx.io_error(&e, path, Access::Write))?;
        let base = abs.parent().unwrap_or(&ctx.root);
        let next = workspace::normalize(&base.join(target));
        if !next.starts_with(&ctx.root) {
            return Err(ToolError::Denied(format!(
                "{path} is a symlink pointing outside the workspace ({}); refused",
                next.display()
            )));
        }
        abs = next;
    }
    Err(ToolError::Failed(format!(
        "{path}: too many levels of symbolic links"
    )))
}

/// Run `write_file`.
pub(crate) fn write_file(ctx: &Ctx, path: &str, content: &str) -> Result<String, ToolError> {
    ctx.ensure_writable(path)?;
    let abs = follow_links(ctx, ctx.resolve(path)?, path)?;
    if abs == ctx.root {
        return Err(ToolError::InvalidArgs(format!(
            "{path} is the workspace itself; give the path of a file inside it"
        )));
    }
    let previous = match fs::metadata(&abs) {
        Ok(meta) if meta.is_dir() => {
            return Err(ToolError::Failed(format!(
                "{path} is a directory; write_file writes files (give a file path inside it)"
            )));
        }
        Ok(meta) => {
            // Replacing it would silently take a FIFO or device away from whatever uses it.
            refuse_special(&meta, path, "write_file writes regular files only")?;
            Some(meta.len())
        }
        Err(_) => None,
    };
    if let Some(parent) = abs.parent() {
        fs::create_dir_all(parent).map_err(|e| parent_error(ctx, &e, parent, path))?;
    }
    replace_contents(ctx, &abs, &[content.as_bytes()])
        .map_err(|e| ctx.io_error(&e, path, Access::Write))?;
    let bytes = content.len() as u64;
    let what = match previous {
        None => "new file".to_string(),
        Some(old) => format!("replaced the previous {}", plural(old, "byte", "bytes")),
    };
    Ok(format!(
        "wrote {} to {path} ({what})",
        plural(bytes, "byte", "bytes")
    ))
}

/// Explain why the parent directories of `path` could not be created.
/// `create_dir_all` reports "already exists" both for a file in the way and
/// for a symlink it may not follow; looking at the parent tells them apart.
fn parent_error(ctx: &Ctx, err: &io::Error, parent: &Path, path: &str) -> ToolError {
    if err.kind() != io::ErrorKind::AlreadyExists {
        return ctx.io_error(err, path, Access::Write);
    }
    match fs::metadata(parent) {
        Err(e) => ctx.io_error(&e, path, Access::Write),
        Ok(meta) if !meta.is_dir() => ToolError::Failed(format!(
            "cannot write {path}: a part of the path is a file where a directory is needed"
        )),
        Ok(_) => ctx.io_error(err, path, Access::Write),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::Scratch;
    use clawcage_tool_sdk::workspace::Mode;

    fn leftovers(dir: &Path) -> Vec<String> {
        fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(TEMP_MARKER))
            .collect()
    }

    #[test]
    fn temp_names() {
        let a = temp_path(Path::new("/ws/notes/a.txt"));
        let b = temp_path(Path::new("/ws/notes/a.txt"));
        assert_ne!(a, b);
        assert_eq!(a.parent(), Some(Path::new("/ws/notes")));
        let name = a.file_name().unwrap().to_string_lossy().into_owned();
        assert!(name.starts_with(".a.txt.clawcage-tmp-"), "{name}");
        let long = temp_path(&Path::new("/ws").join("n".repeat(250)));
        assert!(long.file_name().unwrap().len() < 140);
    }

    #[test]
    fn writes_and_replaces() {
        let ws = Scratch::new(Mode::ReadWrite);
        assert_eq!(
            write_file(&ws.ctx, "notes/deep/a.txt", "hello\n"),
            Ok("wrote 6 bytes to notes/deep/a.txt (new file)".to_string())
        );
        assert_eq!(ws.read("notes/deep/a.txt"), b"hello\n");
        assert_eq!(
            write_file(&ws.ctx, "notes/deep/a.txt", "x"),
            Ok("wrote 1 byte to notes/deep/a.txt (replaced the previous 6 bytes)".to_string())
        );
        assert_eq!(ws.read("notes/deep/a.txt"), b"x");
        assert!(leftovers(&ws.path("notes/deep")).is_empty());
    }

    #[test]
    fn where_writes_are_asked_the_file_is_written_in_place() {
        let ws = Scratch::new(Mode::AskToWrite);
        ws.write("a.txt", b"old content");
        assert_eq!(
            write_file(&ws.ctx, "a.txt", "new"),
            Ok("wrote 3 bytes to a.txt (replaced the previous 11 bytes)".to_string())
        );
        assert_eq!(ws.read("a.txt"), b"new");
        assert!(leftovers(&ws.path(".")).is_empty());
    }

    #[test]
    fn refusals() {
        let ws = Scratch::new(Mode::ReadWrite);
        assert!(matches!(
            write_file(&ws.ctx, "../escape.txt", "x"),
            Err(ToolError::Denied(m)) if m.contains("outside the workspace")
        ));
        fs::create_dir_all(ws.path("dir")).unwrap();
        assert!(matches!(
            write_file(&ws.ctx, "dir", "x"),
            Err(ToolError::Failed(m)) if m.contains("is a directory")
        ));
        assert!(matches!(
            write_file(&ws.ctx, ".", "x"),
            Err(ToolError::InvalidArgs(_))
        ));
        ws.write("file", b"f");
        assert_eq!(
            write_file(&ws.ctx, "file/child.txt", "x"),
            Err(ToolError::Failed(
                "cannot write file/child.txt: a part of the path is a file where a directory is needed"
                    .to_string()
            ))
        );
        let ro = Scratch::new(Mode::ReadOnly);
        assert_eq!(
            write_file(&ro.ctx, "a.txt", "x"),
            Err(ToolError::Denied(
                "the workspace is read-only for this tool: cannot write a.txt".to_string()
            ))
        );
        assert!(!ro.path("a.txt").exists());
    }

    #[cfg(unix)]
    #[test]
    fn writes_through_symlinks_inside_only() {
        let ws = Scratch::new(Mode::ReadWrite);
        ws.write("real/target.txt", b"old");
        std::os::unix::fs::symlink("real/target.txt", ws.path("link.txt")).unwrap();
        std::os::unix::fs::symlink("link.txt", ws.path("link2.txt")).unwrap();
        assert!(write_file(&ws.ctx, "link2.txt", "new").is_ok());
        assert_eq!(ws.read("real/target.txt"), b"new");
        assert!(
            fs::symlink_metadata(ws.path("link.txt"))
                .unwrap()
                .file_type()
                .is_symlink()
        );
        std::os::unix::fs::symlink("/etc/hostname", ws.path("out.txt")).unwrap();
        assert!(matches!(
            write_file(&ws.ctx, "out.txt", "x"),
            Err(ToolError::Denied(m)) if m.contains("symlink pointing outside")
        ));
        std::os::unix::fs::symlink("loop-b", ws.path("loop-a")).unwrap();
        std::os::unix::fs::symlink("loop-a", ws.path("loop-b")).unwrap();
        assert!(matches!(
            write_file(&ws.ctx, "loop-a", "x"),
            Err(ToolError::Failed(m)) if m.contains("too many levels")
        ));
    }

    #[test]
    fn failed_write_leaves_no_temp_file() {
        let ws = Scratch::new(Mode::ReadWrite);
        // Renaming a file over a non-empty directory fails after the
        // temporary file was written: it must be cleaned up.
        ws.write("target/inner.txt", b"keep");
        let err = atomic_write(&ws.path("target"), &[b"new"]);
        assert!(err.is_err());
        assert!(leftovers(&ws.ctx.root).is_empty());
        assert_eq!(ws.read("target/inner.txt"), b"keep");
    }
}
