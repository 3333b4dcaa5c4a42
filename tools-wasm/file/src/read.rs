//! `read_file`: the text of a range of lines, streamed so a file of any size
//! reads in bounded memory.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Cursor, Read};
use std::path::Path;

use clawcage_tool_sdk::ToolError;
use clawcage_tool_sdk::workspace::Access;

use crate::text::{count_byte, human_size, plural};
use crate::{Ctx, refuse_special, special_file};

/// Lines returned when the call gives no `limit`.
pub(crate) const DEFAULT_LIMIT: u64 = 2000;

/// Most characters of file text one call returns (the note comes on top).
pub(crate) const MAX_CHARS: usize = 50_000;

/// How much of the file's start is checked for NUL bytes.
const SNIFF_BYTES: usize = 8 * 1024;

/// Files up to this size are read with one read into memory; larger ones
/// are streamed through a buffer.
const WHOLE_FILE_BYTES: u64 = 256 * 1024;

/// Read buffer size when streaming.
const BUFFER_BYTES: usize = 64 * 1024;

/// Run `read_file`.
pub(crate) fn read_file(
    ctx: &Ctx,
    path: &str,
    offset: u64,
    limit: u64,
) -> Result<String, ToolError> {
    if offset == 0 {
        return Err(ToolError::InvalidArgs(
            "offset counts lines from 1; use offset=1 for the first line".to_string(),
        ));
    }
    if limit == 0 {
        return Err(ToolError::InvalidArgs(
            "limit must be at least 1".to_string(),
        ));
    }
    let abs = ctx.resolve(path)?;
    let is_dir = || {
        ToolError::Failed(format!(
            "{path} is a directory; use list_dir to see its entries"
        ))
    };
    // No look before opening: the open itself does not wait (see `open_without_waiting`), and
    // what it opened is judged by the `stat` the read needs anyway.
    let io_failure = |e: io::Error| match e.kind() {
        io::ErrorKind::IsADirectory => is_dir(),
        io::ErrorKind::Unsupported => special_file(path, "read_file reads regular files only"),
        _ => ctx.io_error(&e, path, Access::Read),
    };
    let mut file = open_without_waiting(&abs).map_err(io_failure)?;
    let meta = file.metadata().map_err(io_failure)?;
    if meta.is_dir() {
        return Err(is_dir());
    }
    refuse_special(&meta, path, "read_file reads regular files only")?;
    let total_bytes = meta.len();
    let binary = |head: &[u8]| {
        head.contains(&0).then(|| {
            ToolError::Failed(format!(
                "{path} is a binary file ({}); read_file reads text only",
                plural(total_bytes, "byte", "bytes")
            ))
        })
    };
    let excerpt = if total_bytes <= WHOLE_FILE_BYTES {
        // The common case: one read of exactly the size `stat` gave (no extra read to see the
        // end; a file growing meanwhile is read as it was).
        let mut data = Vec::with_capacity(total_bytes as usize);
        (&mut file)
            .take(total_bytes)
            .read_to_end(&mut data)
            .map_err(io_failure)?;
        if let Some(err) = binary(&data[..data.len().min(SNIFF_BYTES)]) {
            return Err(err);
        }
        let size = data.len();
        scan(Cursor::new(data), offset, limit, MAX_CHARS, size)
    } else {
        let mut head = Vec::with_capacity(SNIFF_BYTES);
        (&mut file)
            .take(SNIFF_BYTES as u64)
            .read_to_end(&mut head)
            .map_err(io_failure)?;
        if let Some(err) = binary(&head) {
            return Err(err);
        }
        let reader = BufReader::with_capacity(BUFFER_BYTES, Cursor::new(head).chain(file));
        scan(reader, offset, limit, MAX_CHARS, BUFFER_BYTES)
    }
    .map_err(io_failure)?;
    render(excerpt, path, total_bytes, offset, MAX_CHARS)
}

/// Opens `abs` for reading without waiting for a writer if it is a FIFO. Inside clawcage the
/// host opens every file so, and refuses a FIFO, socket or device at the open (`Unsupported`);
/// a native build (the unit tests) asks for `O_NONBLOCK` itself.
fn open_without_waiting(abs: &Path) -> io::Result<File> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        /// `O_NONBLOCK` on Linux.
        const O_NONBLOCK: i32 = 0o4000;
        options.custom_flags(O_NONBLOCK);
    }
    options.open(abs)
}

/// What [`scan`] found.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Excerpt {
    /// The text of the shown lines, terminators included, invalid UTF-8
    /// replaced.
    pub text: String,
    /// The last line shown (wholly or partly); `None` when nothing was.
    pub last_shown: Option<u64>,
    /// The last shown line was longer than the character cap and only its
    /// start is shown.
    pub partial_line: bool,
    /// Collecting stopped because the next line would pass the character cap.
    pub char_capped: bool,
    /// The number of lines in the whole file (a last line without a
    /// terminator counts).
    pub total_lines: u64,
}

/// Characters in the lossy UTF-8 decoding of `bytes`.
fn lossy_chars(bytes: &[u8]) -> usize {
    String::from_utf8_lossy(bytes).chars().count()
}

/// Collects the selected lines while [`scan`] streams the file.
///
/// Lines are appended to `out` as raw bytes and decoded once at the end.
/// Characters are counted only when the byte count comes near the cap: a
/// line of `n` bytes decodes to at most `n` characters, and since lines end
/// at an ASCII `\n`, the decoding of the whole is the decodings of the lines
/// put together.
struct Collector {
    offset: u64,
    last_wanted: u64,
    max_chars: usize,
    /// Most bytes of one line kept: enough for `max_chars` characters.
    byte_budget: usize,
    collecting: bool,
    /// The selected bytes so far; the current line starts at `line_start`.
    out: Vec<u8>,
    line_start: usize,
    line_overflow: bool,
    /// Characters in `out[..line_start]`: an upper bound (its byte count)
    /// until `exact` is set, the exact count after.
    chars: usize,
    exact: bool,
    /// The start of an overlong first line, when that is all that is shown.
    partial_text: Option<String>,
    last_shown: Option<u64>,
    char_capped: bool,
}

impl Collector {
    fn wants(&self, line_no: u64) -> bool {
        self.collecting && line_no >= self.offset
    }

    fn push(&mut self, bytes: &[u8]) {
        let used = self.out.len() - self.line_start;
        let room = self.byte_budget.saturating_sub(used);
        if bytes.len() > room {
            self.out.extend_from_slice(&bytes[..room]);
            self.line_overflow = true;
        } else {
            self.out.extend_from_slice(bytes);
        }
    }

    /// Line `line_no`, whose bytes are `out[line_start..]`, is complete.
    fn finish(&mut self, line_no: u64) {
        let line_bytes = self.out.len() - self.line_start;
        let fits = if !self.line_overflow && self.chars + line_bytes <= self.max_chars {
            self.chars += line_bytes;
            true
        } else {
            if !self.exact {
                self.chars = lossy_chars(&self.out[..self.line_start]);
                self.exact = true;
            }
            let line_chars = if self.line_overflow {
                usize::MAX
            } else {
                lossy_chars(&self.out[self.line_start..])
            };
            if line_chars <= self.max_chars.saturating_sub(self.chars) {
                self.chars += line_chars;
                true
            } else {
                false
            }
        };
        if fits {
            self.last_shown = Some(line_no);
            if line_no >= self.last_wanted {
                self.collecting = false;
            }
        } else {
            if self.line_start == 0 {
                // Not even the first line fits: show its start.
                let text = String::from_utf8_lossy(&self.out);
                self.partial_text = Some(text.chars().take(self.max_chars).collect());
                self.last_shown = Some(line_no);
            } else {
                self.char_capped = true;
            }
            self.out.truncate(self.line_start);
            self.collecting = false;
        }
        self.line_start = self.out.len();
        self.line_overflow = false;
    }

    fn into_excerpt(self, total_lines: u64) -> Excerpt {
        let partial_line = self.partial_text.is_some();
        let text = match self.partial_text {
            Some(text) => text,
            None => match String::from_utf8(self.out) {
                Ok(text) => text,
                Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
            },
        };
        Excerpt {
            text,
            last_shown: self.last_shown,
            partial_line,
            char_capped: self.char_capped,
            total_lines,
        }
    }
}

/// Stream `reader` once: collect lines `offset..offset+limit` (1-based) up to
/// `max_chars` characters, and count all lines. Memory stays bounded by the
/// reader's buffer plus the collected text, whatever the file's size or its
/// lines' lengths. `size_hint` (the bytes expected) sizes the text buffer once.
pub(crate) fn scan<R: BufRead>(
    mut reader: R,
    offset: u64,
    limit: u64,
    max_chars: usize,
    size_hint: usize,
) -> io::Result<Excerpt> {
    let byte_budget = max_chars.saturating_mul(4).saturating_add(4);
    let mut c = Collector {
        offset,
        last_wanted: offset.saturating_add(limit.saturating_sub(1)),
        max_chars,
        byte_budget,
        collecting: true,
        out: Vec::with_capacity(size_hint.min(byte_budget)),
        line_start: 0,
        line_overflow: false,
        chars: 0,
        exact: false,
        partial_text: None,
        last_shown: None,
        char_capped: false,
    };
    // The line being read, 1-based, and whether it has bytes yet.
    let mut line_no: u64 = 1;
    let mut pending = false;
    loop {
        let chunk = match reader.fill_buf() {
            Ok([]) => break,
            Ok(chunk) => chunk,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        let len = chunk.len();
        let mut rest = chunk;
        while c.collecting && !rest.is_empty() {
            match memchr::memchr(b'\n', rest) {
                Some(i) => {
                    if c.wants(line_no) {
                        c.push(&rest[..=i]);
                        c.finish(line_no);
                    }
                    line_no += 1;
                    pending = false;
                    rest = &rest[i + 1..];
                }
                None => {
                    if c.wants(line_no) {
                        c.push(rest);
                    }
                    pending = true;
                    rest = &[];
                }
            }
        }
        if !rest.is_empty() {
            // Done collecting: only count the remaining lines.
            line_no += count_byte(rest, b'\n');
            pending = rest.last() != Some(&b'\n');
        }
        reader.consume(len);
    }
    if pending && c.wants(line_no) {
        c.finish(line_no);
    }
    let total_lines = if pending { line_no } else { line_no - 1 };
    Ok(c.into_excerpt(total_lines))
}

/// The tool's answer for what [`scan`] found: the text, plus a note on its
/// own line whenever the output does not reach the end of the file.
pub(crate) fn render(
    excerpt: Excerpt,
    path: &str,
    total_bytes: u64,
    offset: u64,
    max_chars: usize,
) -> Result<String, ToolError> {
    let total = excerpt.total_lines;
    let size = human_size(total_bytes);
    if total == 0 {
        return Ok(format!("[{path} is empty ({size})]"));
    }
    let Some(last) = excerpt.last_shown else {
        return Err(ToolError::Failed(format!(
            "offset {offset} is past the end of {path}, which has {} ({size}); use an offset from 1 to {total}",
            plural(total, "line", "lines")
        )));
    };
    let mut text = excerpt.text;
    let note = if excerpt.partial_line {
        let next = if last < total {
            format!(
                "; call read_file with offset={} to continue after it",
                last + 1
            )
        } else {
            String::new()
        };
        Some(format!(
            "[output cut: line {last} is longer than {max_chars} characters, so only its first {max_chars} characters are shown; the file has {} (total {size}){next}]",
            plural(total, "line", "lines")
        ))
    } else if last < total {
        let why = if excerpt.char_capped {
            format!("output cut at {max_chars} characters")
        } else {
            "output cut".to_string()
        };
        Some(format!(
            "[{why}: showed lines {offset}-{last} of {total} (total {size}); call read_file with offset={} to continue]",
            last + 1
        ))
    } else {
        None
    };
    if let Some(note) = note {
        if !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(&note);
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::Scratch;
    use clawcage_tool_sdk::workspace::Mode;

    fn scan_str(s: &str, offset: u64, limit: u64, max_chars: usize) -> Excerpt {
        // A tiny buffer so lines straddle chunk boundaries.
        let reader = BufReader::with_capacity(3, s.as_bytes());
        scan(reader, offset, limit, max_chars, 0).unwrap()
    }

    #[test]
    fn counts_lines() {
        assert_eq!(scan_str("", 1, 10, 100).total_lines, 0);
        assert_eq!(scan_str("a", 1, 10, 100).total_lines, 1);
        assert_eq!(scan_str("a\n", 1, 10, 100).total_lines, 1);
        assert_eq!(scan_str("a\nb", 1, 10, 100).total_lines, 2);
        assert_eq!(scan_str("\n\n\n", 1, 10, 100).total_lines, 3);
        // Counting continues after collecting stopped.
        assert_eq!(scan_str("a\nb\nc\nd\ne", 1, 2, 100).total_lines, 5);
        assert_eq!(scan_str("a\nb\nc\nd\ne\n", 1, 2, 100).total_lines, 5);
    }

    #[test]
    fn selects_lines() {
        let e = scan_str("one\ntwo\nthree\nfour\n", 2, 2, 100);
        assert_eq!(e.text, "two\nthree\n");
        assert_eq!(e.last_shown, Some(3));
        assert!(!e.char_capped && !e.partial_line);
        let e = scan_str("one\ntwo\nthree", 3, 5, 100);
        assert_eq!(e.text, "three");
        assert_eq!(e.last_shown, Some(3));
        let e = scan_str("one\ntwo\n", 5, 5, 100);
        assert_eq!(e.last_shown, None);
        assert_eq!(e.total_lines, 2);
        let e = scan_str("crlf\r\nline\r\n", 1, 10, 100);
        assert_eq!(e.text, "crlf\r\nline\r\n");
    }

    #[test]
    fn char_cap_stops_at_line_boundary() {
        let e = scan_str("aaaa\nbbbb\ncccc\n", 1, 100, 12);
        assert_eq!(e.text, "aaaa\nbbbb\n");
        assert_eq!(e.last_shown, Some(2));
        assert!(e.char_capped);
        assert_eq!(e.total_lines, 3);
    }

    #[test]
    fn char_cap_counts_characters_not_bytes() {
        let e = scan_str("ééé\nààà\n", 1, 100, 8);
        assert_eq!(e.text, "ééé\nààà\n");
        assert!(!e.char_capped);
    }

    #[test]
    fn char_cap_with_multibyte_and_invalid_bytes() {
        // 3 + 3 bytes pass the fast path; then "éé\n" (5 bytes, 3 chars)
        // needs exact counting: 6 + 3 = 9 chars fits a cap of 9.
        let e = scan_str("ab\ncd\néé\nx\n", 1, 100, 9);
        assert_eq!(e.text, "ab\ncd\néé\n");
        assert!(e.char_capped);
        assert_eq!(e.last_shown, Some(3));
        // Invalid bytes count as one replacement character each.
        let reader = BufReader::with_capacity(2, &b"\xff\xfe\n\xfd\n"[..]);
        let e = scan(reader, 1, 100, 5, 0).unwrap();
        assert_eq!(e.text, "\u{fffd}\u{fffd}\n\u{fffd}\n");
        assert!(!e.char_capped);
        let reader = BufReader::with_capacity(2, &b"\xff\xfe\n\xfd\n"[..]);
        let e = scan(reader, 1, 100, 4, 0).unwrap();
        assert_eq!(e.text, "\u{fffd}\u{fffd}\n");
        assert!(e.char_capped);
    }

    #[test]
    fn overlong_first_line_is_cut() {
        let long = "x".repeat(1000);
        let e = scan_str(&format!("{long}\nnext\n"), 1, 100, 10);
        assert_eq!(e.text, "x".repeat(10));
        assert!(e.partial_line);
        assert_eq!(e.last_shown, Some(1));
        assert_eq!(e.total_lines, 2);
    }

    #[test]
    fn invalid_utf8_is_lossy() {
        let reader = BufReader::new(&b"ok \xff\xfe end\n"[..]);
        let e = scan(reader, 1, 10, 100, 0).unwrap();
        assert_eq!(e.text, "ok \u{fffd}\u{fffd} end\n");
    }

    #[test]
    fn notes() {
        let e = scan_str("a\nb\nc\nd\n", 1, 2, 100);
        assert_eq!(
            render(e, "f.txt", 8, 1, 100).unwrap(),
            "a\nb\n[output cut: showed lines 1-2 of 4 (total 8 bytes); call read_file with offset=3 to continue]"
        );
        let e = scan_str("a\nb\nc", 2, 1, 100);
        assert_eq!(
            render(e, "f.txt", 5, 2, 100).unwrap(),
            "b\n[output cut: showed lines 2-2 of 3 (total 5 bytes); call read_file with offset=3 to continue]"
        );
        let e = scan_str("a\nb\nc", 1, 10, 100);
        assert_eq!(render(e, "f.txt", 5, 1, 100).unwrap(), "a\nb\nc");
        let e = scan_str("aaaa\nbbbb\ncccc\n", 1, 100, 12);
        assert_eq!(
            render(e, "f.txt", 15, 1, 12).unwrap(),
            "aaaa\nbbbb\n[output cut at 12 characters: showed lines 1-2 of 3 (total 15 bytes); call read_file with offset=3 to continue]"
        );
        let e = scan_str("xxxxxxxx\ny\n", 1, 100, 4);
        assert_eq!(
            render(e, "f.txt", 11, 1, 4).unwrap(),
            "xxxx\n[output cut: line 1 is longer than 4 characters, so only its first 4 characters are shown; the file has 2 lines (total 11 bytes); call read_file with offset=2 to continue after it]"
        );
        let e = scan_str("", 1, 100, 4);
        assert_eq!(
            render(e, "f.txt", 0, 1, 4).unwrap(),
            "[f.txt is empty (0 bytes)]"
        );
        let e = scan_str("a\nb\n", 3, 100, 4);
        assert_eq!(
            render(e, "f.txt", 4, 3, 4),
            Err(ToolError::Failed(
                "offset 3 is past the end of f.txt, which has 2 lines (4 bytes); use an offset from 1 to 2"
                    .to_string()
            ))
        );
    }

    #[test]
    fn reads_real_files() {
        let ws = Scratch::new(Mode::ReadOnly);
        let big: String = (1..=3000).map(|i| format!("line {i}\n")).collect();
        ws.write("big.txt", big.as_bytes());
        let out = read_file(&ws.ctx, "big.txt", 1, DEFAULT_LIMIT).unwrap();
        assert!(out.starts_with("line 1\nline 2\n"));
        assert!(out.ends_with(
            "line 2000\n[output cut: showed lines 1-2000 of 3000 (total 28.9 KB); call read_file with offset=2001 to continue]"
        ));
        let out = read_file(&ws.ctx, "big.txt", 2999, 10).unwrap();
        assert_eq!(out, "line 2999\nline 3000\n");

        ws.write("small.txt", b"hello\n");
        let abs = ws.path("small.txt");
        assert_eq!(
            read_file(&ws.ctx, abs.to_str().unwrap(), 1, 10).unwrap(),
            "hello\n"
        );

        ws.write("bin.dat", b"\x7fELF\x00\x01");
        assert_eq!(
            read_file(&ws.ctx, "bin.dat", 1, 10),
            Err(ToolError::Failed(
                "bin.dat is a binary file (6 bytes); read_file reads text only".to_string()
            ))
        );
        std::fs::create_dir_all(ws.path("sub")).unwrap();
        assert!(matches!(
            read_file(&ws.ctx, "sub", 1, 10),
            Err(ToolError::Failed(m)) if m.contains("use list_dir")
        ));
        assert_eq!(
            read_file(&ws.ctx, "missing.txt", 1, 10),
            Err(ToolError::Failed(
                "no such file or directory: missing.txt".to_string()
            ))
        );
        assert!(matches!(
            read_file(&ws.ctx, "/etc/passwd", 1, 10),
            Err(ToolError::Denied(m)) if m.contains("outside the workspace")
        ));
        assert!(matches!(
            read_file(&ws.ctx, "big.txt", 0, 10),
            Err(ToolError::InvalidArgs(_))
        ));
    }

    #[test]
    fn one_huge_line_stays_bounded() {
        // 2 MB in one line: the output is the cap, not the line.
        let ws = Scratch::new(Mode::ReadOnly);
        let mut data = vec![b'z'; 2_000_000];
        data.extend_from_slice(b"\nshort\n");
        ws.write("huge.txt", &data);
        let out = read_file(&ws.ctx, "huge.txt", 1, 10).unwrap();
        assert!(out.starts_with(&"z".repeat(MAX_CHARS)));
        assert!(out.contains("line 1 is longer than 50000 characters"));
        assert!(out.contains("offset=2"));
        assert_eq!(read_file(&ws.ctx, "huge.txt", 2, 10).unwrap(), "short\n");
    }
}
