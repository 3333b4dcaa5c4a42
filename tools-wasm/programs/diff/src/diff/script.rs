//! The edit script of two files and its two printed forms: lines matched under the options'
//! notion of equal (case and white space may be ignored) by similar's Myers within
//! [`super::MATCH_BUDGET`], then written as GNU's unified or normal hunks, a last line without a
//! newline marked as GNU marks it.

use std::borrow::Cow;
use std::collections::HashMap;
use std::io::{self, Write};
use std::time::Instant;

use similar::{Algorithm, DiffOp, DiffTag};

use super::{MATCH_BUDGET, Options};
use crate::lines::lacks_newline;

/// The edit script turning `old` into `new`, line by line, under the options' notion of equal
/// lines (case and white space may be ignored).
pub(super) fn diff_lines(old: &[&[u8]], new: &[&[u8]], options: &Options) -> Vec<DiffOp> {
    let mut ids: HashMap<Cow<'_, [u8]>, u32> = HashMap::new();
    let mut intern = |line: &[u8]| -> u32 {
        let key = comparison_key(line, options);
        let next = u32::try_from(ids.len()).unwrap_or(u32::MAX);
        *ids.entry(key.into_owned().into()).or_insert(next)
    };
    let old_ids: Vec<u32> = old.iter().map(|line| intern(line)).collect();
    let new_ids: Vec<u32> = new.iter().map(|line| intern(line)).collect();
    let deadline = Instant::now() + MATCH_BUDGET;
    similar::capture_diff_slices_deadline(Algorithm::Myers, &old_ids, &new_ids, Some(deadline))
}

/// What two lines must share to count as equal: the line itself, or a folded form of it.
/// `-b` treats every run of white space as one space and ignores it at the end of the line;
/// `-w` ignores white space altogether; `-i` folds ASCII case.
fn comparison_key<'l>(line: &'l [u8], options: &Options) -> Cow<'l, [u8]> {
    if !options.ignores_something() {
        return Cow::Borrowed(line);
    }
    if !options.ignore_space_change && !options.ignore_all_space {
        return Cow::Owned(line.to_ascii_lowercase());
    }
    let mut key = Vec::with_capacity(line.len());
    let mut pending_space = false;
    for &byte in line {
        if byte.is_ascii_whitespace() || byte == 0x0b {
            pending_space = !options.ignore_all_space;
            continue;
        }
        if pending_space {
            key.push(b' ');
            pending_space = false;
        }
        key.push(if options.ignore_case {
            byte.to_ascii_lowercase()
        } else {
            byte
        });
    }
    Cow::Owned(key)
}

/// Print `ops` as unified hunks with `context` lines around each change.
pub(super) fn write_unified(
    out: &mut impl Write,
    old: &[&[u8]],
    new: &[&[u8]],
    ops: Vec<DiffOp>,
    context: usize,
) -> io::Result<()> {
    for group in similar::group_diff_ops(ops, context) {
        let (Some(first), Some(last)) = (group.first(), group.last()) else {
            continue;
        };
        writeln!(
            out,
            "@@ -{} +{} @@",
            unified_range(first.old_range().start, last.old_range().end),
            unified_range(first.new_range().start, last.new_range().end)
        )?;
        for op in &group {
            match op.tag() {
                DiffTag::Equal => write_lines(out, b" ", &old[op.old_range()])?,
                DiffTag::Delete => write_lines(out, b"-", &old[op.old_range()])?,
                DiffTag::Insert => write_lines(out, b"+", &new[op.new_range()])?,
                DiffTag::Replace => {
                    write_lines(out, b"-", &old[op.old_range()])?;
                    write_lines(out, b"+", &new[op.new_range()])?;
                }
            }
        }
    }
    Ok(())
}

/// A unified hunk range: `start,count`, just `start` for one line, and for no lines the line
/// before (`3,0`).
fn unified_range(start: usize, end: usize) -> String {
    match end - start {
        1 => format!("{}", start + 1),
        0 => format!("{start},0"),
        count => format!("{},{count}", start + 1),
    }
}

/// Print `ops` in the normal format: `2,3c2`, `5a6`, `7d6`, then `<` and `>` lines.
pub(super) fn write_normal(
    out: &mut impl Write,
    old: &[&[u8]],
    new: &[&[u8]],
    ops: &[DiffOp],
) -> io::Result<()> {
    for op in ops {
        let (old_range, new_range) = (op.old_range(), op.new_range());
        let old_lines = normal_range(old_range.start, old_range.end);
        let new_lines = normal_range(new_range.start, new_range.end);
        match op.tag() {
            DiffTag::Equal => {}
            DiffTag::Delete => {
                writeln!(out, "{old_lines}d{}", new_range.start)?;
                write_lines(out, b"< ", &old[old_range])?;
            }
            DiffTag::Insert => {
                writeln!(out, "{}a{new_lines}", old_range.start)?;
                write_lines(out, b"> ", &new[new_range])?;
            }
            DiffTag::Replace => {
                writeln!(out, "{old_lines}c{new_lines}")?;
                write_lines(out, b"< ", &old[old_range])?;
                writeln!(out, "---")?;
                write_lines(out, b"> ", &new[new_range])?;
            }
        }
    }
    Ok(())
}

/// A normal-format range of 0-based `start..end`: `first,last` or `first` (1-based).
fn normal_range(start: usize, end: usize) -> String {
    if end - start <= 1 {
        format!("{}", start + 1)
    } else {
        format!("{},{end}", start + 1)
    }
}

/// Print each line after `prefix`; a last line without a newline gets GNU's marker line.
fn write_lines(out: &mut impl Write, prefix: &[u8], lines: &[&[u8]]) -> io::Result<()> {
    for line in lines {
        out.write_all(prefix)?;
        out.write_all(line)?;
        if lacks_newline(line) {
            out.write_all(b"\n\\ No newline at end of file\n")?;
        }
    }
    Ok(())
}
