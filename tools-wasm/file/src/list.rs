//! `list_dir`: a directory's entries, sorted by name.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::fs::{self, DirEntry};
use std::io;

use clawcage_tool_sdk::ToolError;
use clawcage_tool_sdk::workspace::Access;

use crate::Ctx;

/// Most entries one call lists.
pub(crate) const MAX_ENTRIES: usize = 1000;

/// An entry, ordered by name only.
struct Named {
    name: String,
    entry: DirEntry,
}

impl PartialEq for Named {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

impl Eq for Named {}

impl PartialOrd for Named {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Named {
    fn cmp(&self, other: &Self) -> Ordering {
        self.name.cmp(&other.name)
    }
}

/// `[folder]`, `[file]`, `[link]` (a symlink whose target cannot be reached
/// inside the sandbox) or `[other]`.
fn marker(entry: &DirEntry) -> &'static str {
    let Ok(kind) = entry.file_type() else {
        return "[other]";
    };
    if kind.is_dir() {
        "[folder]"
    } else if kind.is_file() {
        "[file]"
    } else if kind.is_symlink() {
        // Following it goes through the sandbox, which refuses targets
        // outside the workspace.
        match fs::metadata(entry.path()) {
            Ok(target) if target.is_dir() => "[folder]",
            Ok(target) if target.is_file() => "[file]",
            Ok(_) => "[other]",
            Err(_) => "[link]",
        }
    } else {
        "[other]"
    }
}

/// Run `list_dir`.
pub(crate) fn list_dir(ctx: &Ctx, path: &str) -> Result<String, ToolError> {
    let abs = ctx.resolve(path)?;
    let read_err = |e: io::Error| match e.kind() {
        io::ErrorKind::NotADirectory => ToolError::Failed(format!(
            "{path} is a file, not a directory; use read_file to read it"
        )),
        _ => ctx.io_error(&e, path, Access::Read),
    };
    if let Ok(meta) = fs::metadata(&abs)
        && !meta.is_dir()
        && !meta.is_file()
    {
        return Err(ToolError::Failed(format!(
            "{path} is a FIFO (named pipe), socket or device, not a directory; list_dir lists directories"
        )));
    }
    let dir = fs::read_dir(&abs).map_err(read_err)?;
    // Keep the MAX_ENTRIES smallest names in a max-heap: bounded memory
    // however large the directory.
    let mut kept: BinaryHeap<Named> = BinaryHeap::with_capacity(MAX_ENTRIES.min(64));
    let mut total: u64 = 0;
    for entry in dir {
        let entry = entry.map_err(read_err)?;
        total += 1;
        let name = entry.file_name().to_string_lossy().into_owned();
        if kept.len() < MAX_ENTRIES {
            kept.push(Named { name, entry });
        } else if kept.peek().is_some_and(|largest| name < largest.name) {
            kept.pop();
            kept.push(Named { name, entry });
        }
    }
    if total == 0 {
        return Ok(format!("the directory {path} is empty"));
    }
    let entries = kept.into_sorted_vec();
    let mut out = String::with_capacity(entries.len() * 24);
    for Named { name, entry } in &entries {
        out.push_str(marker(entry));
        out.push(' ');
        out.push_str(name);
        out.push('\n');
    }
    if total > entries.len() as u64 {
        out.push_str(&format!(
            "[listing cut: showed the first {} of {total} entries, sorted by name]",
            entries.len()
        ));
    } else {
        out.pop();
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::Scratch;
    use clawcage_tool_sdk::workspace::Mode;

    #[test]
    fn lists_sorted_and_marked() {
        let ws = Scratch::new(Mode::ReadOnly);
        ws.write("b.txt", b"b");
        ws.write("a/inner.txt", b"i");
        ws.write("c.md", b"c");
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink("b.txt", ws.path("link-to-file")).unwrap();
            std::os::unix::fs::symlink("a", ws.path("link-to-dir")).unwrap();
            std::os::unix::fs::symlink("nowhere", ws.path("dangling")).unwrap();
        }
        let out = list_dir(&ws.ctx, ".").unwrap();
        #[cfg(unix)]
        assert_eq!(
            out,
            "[folder] a\n[file] b.txt\n[file] c.md\n[link] dangling\n[folder] link-to-dir\n[file] link-to-file"
        );
        assert_eq!(list_dir(&ws.ctx, "a").unwrap(), "[file] inner.txt");
    }

    #[test]
    fn empty_file_and_outside() {
        let ws = Scratch::new(Mode::ReadOnly);
        std::fs::create_dir_all(ws.path("empty")).unwrap();
        assert_eq!(
            list_dir(&ws.ctx, "empty").unwrap(),
            "the directory empty is empty"
        );
        ws.write("f.txt", b"x");
        assert_eq!(
            list_dir(&ws.ctx, "f.txt"),
            Err(ToolError::Failed(
                "f.txt is a file, not a directory; use read_file to read it".to_string()
            ))
        );
        assert_eq!(
            list_dir(&ws.ctx, "nope"),
            Err(ToolError::Failed(
                "no such file or directory: nope".to_string()
            ))
        );
        assert!(matches!(list_dir(&ws.ctx, ".."), Err(ToolError::Denied(_))));
    }

    #[test]
    fn caps_large_directories() {
        let ws = Scratch::new(Mode::ReadOnly);
        for i in (0..1005).rev() {
            ws.write(&format!("big/f{i:04}"), b"");
        }
        let out = list_dir(&ws.ctx, "big").unwrap();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), MAX_ENTRIES + 1);
        assert_eq!(lines[0], "[file] f0000");
        assert_eq!(lines[MAX_ENTRIES - 1], "[file] f0999");
        assert_eq!(
            lines[MAX_ENTRIES],
            "[listing cut: showed the first 1000 of 1005 entries, sorted by name]"
        );
    }
}
