//! `edit_file`: replace one exact, unique piece of text.

use std::fs;

use clawcage_tool_sdk::ToolError;
use clawcage_tool_sdk::workspace::Access;

use crate::text::{count_byte, find_all, human_size, plural};
use crate::write::{follow_links, replace_contents};
use crate::{Ctx, refuse_special};

/// Largest file `edit_file` loads (the guest's memory is capped).
pub(crate) const MAX_EDIT_BYTES: u64 = 16 * 1024 * 1024;

/// How many match positions a "several matches" warning names.
const SHOWN_MATCHES: usize = 10;

/// Run `edit_file`.
pub(crate) fn edit_file(
    ctx: &Ctx,
    path: &str,
    old_text: &str,
    new_text: &str,
) -> Result<String, ToolError> {
    ctx.ensure_writable(path)?;
    if old_text.is_empty() {
        return Err(ToolError::InvalidArgs(
            "old_text must not be empty; to create a file or replace all of it use write_file"
                .to_string(),
        ));
    }
    let abs = ctx.resolve(path)?;
    let meta = fs::metadata(&abs).map_err(|e| ctx.io_error(&e, path, Access::Read))?;
    if meta.is_dir() {
        return Err(ToolError::Failed(format!(
            "{path} is a directory; edit_file edits files"
        )));
    }
    refuse_special(&meta, path, "edit_file edits regular files only")?;
    if meta.len() > MAX_EDIT_BYTES {
        return Err(ToolError::Failed(format!(
            "{path} is {}; edit_file edits files up to {}",
            human_size(meta.len()),
            human_size(MAX_EDIT_BYTES)
        )));
    }
    let data = fs::read(&abs).map_err(|e| ctx.io_error(&e, path, Access::Read))?;
    let (count, positions) = find_all(&data, old_text.as_bytes(), SHOWN_MATCHES);
    match (count, positions.first()) {
        (0, _) | (_, None) => Err(ToolError::Failed(no_match(&data, path, old_text))),
        (1, Some(&at)) => {
            if old_text == new_text {
                return Ok(format!(
                    "no change: old_text and new_text are identical, so {path} was left as it is"
                ));
            }
            let parts: [&[u8]; 3] = [
                &data[..at],
                new_text.as_bytes(),
                &data[at + old_text.len()..],
            ];
            let target = follow_links(ctx, abs.clone(), path)?;
            replace_contents(ctx, &target, &parts)
                .map_err(|e| ctx.io_error(&e, path, Access::Write))?;
            let size = data.len() - old_text.len() + new_text.len();
            let line = count_byte(&data[..at], b'\n') + 1;
            Ok(format!(
                "edited {path}: replaced {} at line {line} with {}; the file now has {}",
                plural(line_count(old_text), "line", "lines"),
                plural(line_count(new_text), "line", "lines"),
                plural(size as u64, "byte", "bytes")
            ))
        }
        // Nothing changed, so the call failed (a script must not believe the edit happened);
        // the model still reads where the matches are.
        (n, _) => Err(ToolError::Failed(several(&data, path, n, &positions))),
    }
}

/// Lines a piece of text spans (a trailing newline ends the last line).
fn line_count(text: &str) -> u64 {
    if text.is_empty() {
        return 0;
    }
    let newlines = count_byte(text.as_bytes(), b'\n');
    if text.ends_with('\n') {
        newlines
    } else {
        newlines + 1
    }
}

/// The failure text when `old_text` occurs nowhere.
fn no_match(data: &[u8], path: &str, old_text: &str) -> String {
    let mut msg = format!(
        "old_text was not found in {path}; read the file and copy the text exactly, whitespace included"
    );
    let crlf = data.windows(2).any(|w| w == b"\r\n");
    if crlf && old_text.contains('\n') && !old_text.contains('\r') {
        msg.push_str(" (note: this file uses Windows line endings, \\r\\n)");
    }
    msg
}

/// The failure when `old_text` occurs `count` times: nothing is changed.
fn several(data: &[u8], path: &str, count: u64, positions: &[usize]) -> String {
    let mut lines = Vec::with_capacity(positions.len());
    let mut line = 1;
    let mut scanned = 0;
    for &at in positions {
        line += count_byte(&data[scanned..at], b'\n');
        scanned = at;
        lines.push(line.to_string());
    }
    let more = if count > positions.len() as u64 {
        ", ..."
    } else {
        ""
    };
    format!(
        "old_text occurs {count} times in {path} (at lines {}{more}), so nothing was changed. \
         Call edit_file again with more surrounding lines in old_text, so that it occurs exactly once.",
        lines.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::Scratch;
    use clawcage_tool_sdk::workspace::Mode;

    #[test]
    fn replaces_a_unique_match() {
        let ws = Scratch::new(Mode::ReadWrite);
        ws.write("a.rs", b"fn a() {}\nfn b() {}\nfn c() {}\n");
        assert_eq!(
            edit_file(&ws.ctx, "a.rs", "fn b() {}\n", "fn b() {\n    1\n}\n"),
            Ok(
                "edited a.rs: replaced 1 line at line 2 with 3 lines; the file now has 37 bytes"
                    .to_string()
            )
        );
        assert_eq!(
            ws.read("a.rs"),
            b"fn a() {}\nfn b() {\n    1\n}\nfn c() {}\n"
        );
        // Deleting.
        assert!(edit_file(&ws.ctx, "a.rs", "fn a() {}\n", "").is_ok());
        assert_eq!(ws.read("a.rs"), b"fn b() {\n    1\n}\nfn c() {}\n");
    }

    #[test]
    fn several_matches_change_nothing() {
        let ws = Scratch::new(Mode::ReadWrite);
        ws.write("a.txt", b"x = 1\ny = 2\nx = 1\n\nx = 1\n");
        assert_eq!(
            edit_file(&ws.ctx, "a.txt", "x = 1", "x = 3"),
            Err(ToolError::Failed("old_text occurs 3 times in a.txt (at lines 1, 3, 5), so nothing was changed. \
                Call edit_file again with more surrounding lines in old_text, so that it occurs exactly once."
                .to_string()))
        );
        assert_eq!(ws.read("a.txt"), b"x = 1\ny = 2\nx = 1\n\nx = 1\n");
        assert_eq!(
            several(b"aaaaaaaaaaaaaa", "f", 13, &[0, 1]),
            "old_text occurs 13 times in f (at lines 1, 1, ...), so nothing was changed. \
             Call edit_file again with more surrounding lines in old_text, so that it occurs exactly once."
        );
    }

    #[test]
    fn no_match_fails() {
        let ws = Scratch::new(Mode::ReadWrite);
        ws.write("a.txt", b"alpha\r\nbeta\r\n");
        assert_eq!(
            edit_file(&ws.ctx, "a.txt", "gamma", "x"),
            Err(ToolError::Failed(
                "old_text was not found in a.txt; read the file and copy the text exactly, whitespace included"
                    .to_string()
            ))
        );
        assert!(matches!(
            edit_file(&ws.ctx, "a.txt", "alpha\nbeta", "x"),
            Err(ToolError::Failed(m)) if m.contains("Windows line endings")
        ));
    }

    #[test]
    fn refusals() {
        let ws = Scratch::new(Mode::ReadWrite);
        assert!(matches!(
            edit_file(&ws.ctx, "a.txt", "", "x"),
            Err(ToolError::InvalidArgs(_))
        ));
        assert_eq!(
            edit_file(&ws.ctx, "missing.txt", "a", "b"),
            Err(ToolError::Failed(
                "no such file or directory: missing.txt".to_string()
            ))
        );
        assert!(matches!(
            edit_file(&ws.ctx, "/etc/hosts", "a", "b"),
            Err(ToolError::Denied(_))
        ));
        let ro = Scratch::new(Mode::ReadOnly);
        ro.write("a.txt", b"a");
        assert!(matches!(
            edit_file(&ro.ctx, "a.txt", "a", "b"),
            Err(ToolError::Denied(m)) if m.contains("read-only")
        ));
        assert_eq!(ro.read("a.txt"), b"a");
    }

    #[test]
    fn counts_lines() {
        assert_eq!(line_count(""), 0);
        assert_eq!(line_count("a"), 1);
        assert_eq!(line_count("a\n"), 1);
        assert_eq!(line_count("a\nb"), 2);
    }
}
