//! Writing values as jq does: pretty (indented, `"key": value`) or compact, keys sorted on
//! request, and numbers in jq's form: a float with an integral value prints as an integer
//! (`2`, not `2.0`), NaN as `null` and the infinities as the largest finite double.

use std::io::{self, Write};

use jaq_json::{Num, Val};

/// How the output looks.
pub struct Printer {
    /// The indentation unit; `None` is compact output.
    pub indent: Option<String>,
    pub sort_keys: bool,
    /// `-r`: strings without quotes.
    pub raw: bool,
    /// `-j`: no newline after each output.
    pub join: bool,
}

impl Printer {
    /// Write one output value and its newline.
    pub fn print(&self, out: &mut dyn Write, value: &Val) -> io::Result<()> {
        match value {
            Val::TStr(text) | Val::BStr(text) if self.raw => out.write_all(text)?,
            _ => self.write(out, value, 0)?,
        }
        if !self.join {
            out.write_all(b"\n")?;
        }
        Ok(())
    }

    fn newline(&self, out: &mut dyn Write, level: usize) -> io::Result<()> {
        if let Some(indent) = &self.indent {
            out.write_all(b"\n")?;
            for _ in 0..level {
                out.write_all(indent.as_bytes())?;
            }
        }
        Ok(())
    }

    fn write(&self, out: &mut dyn Write, value: &Val, level: usize) -> io::Result<()> {
        match value {
            Val::Null => out.write_all(b"null"),
            Val::Bool(true) => out.write_all(b"true"),
            Val::Bool(false) => out.write_all(b"false"),
            Val::Num(number) => write_number(out, number),
            Val::TStr(text) | Val::BStr(text) => write_string(out, text),
            Val::Arr(items) => {
                if items.is_empty() {
                    return out.write_all(b"[]");
                }
                out.write_all(b"[")?;
                for (index, item) in items.iter().enumerate() {
                    if index > 0 {
                        out.write_all(b",")?;
                    }
                    self.newline(out, level + 1)?;
                    self.write(out, item, level + 1)?;
                }
                self.newline(out, level)?;
                out.write_all(b"]")
            }
            Val::Obj(map) => {
                if map.is_empty() {
                    return out.write_all(b"{}");
                }
                let mut entries: Vec<(&Val, &Val)> = map.iter().collect();
                if self.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(b.0));
                }
                out.write_all(b"{")?;
                for (index, (key, item)) in entries.into_iter().enumerate() {
                    if index > 0 {
                        out.write_all(b",")?;
                    }
                    self.newline(out, level + 1)?;
                    match key {
                        Val::TStr(text) | Val::BStr(text) => write_string(out, text)?,
                        // Keys are strings in JSON; jaq allows others, written as JSON strings.
                        other => write_string(out, other.to_string().as_bytes())?,
                    }
                    out.write_all(if self.indent.is_some() { b": " } else { b":" })?;
                    self.write(out, item, level + 1)?;
                }
                self.newline(out, level)?;
                out.write_all(b"}")
            }
        }
    }
}

/// A number as jq writes it.
fn write_number(out: &mut dyn Write, number: &Num) -> io::Result<()> {
    match number {
        Num::Float(x) if x.is_nan() => out.write_all(b"null"),
        Num::Float(x) if x.is_infinite() => {
            let sign = if *x > 0.0 { "" } else { "-" };
            write!(out, "{sign}1.7976931348623157e+308")
        }
        Num::Float(x) if x.fract() == 0.0 && x.abs() < 1e17 => write!(out, "{}", *x as i64),
        other => write!(out, "{other}"),
    }
}

/// A JSON string with jq's escapes; invalid UTF-8 is written as the replacement character.
fn write_string(out: &mut dyn Write, bytes: &[u8]) -> io::Result<()> {
    let text = String::from_utf8_lossy(bytes);
    out.write_all(b"\"")?;
    let mut start = 0;
    for (index, c) in text.char_indices() {
        let escape: Option<&str> = match c {
            '"' => Some("\\\""),
            '\\' => Some("\\\\"),
            '\n' => Some("\\n"),
            '\t' => Some("\\t"),
            '\r' => Some("\\r"),
            '\u{8}' => Some("\\b"),
            '\u{c}' => Some("\\f"),
            _ => None,
        };
        let control = c < ' ' || c == '\u{7f}';
        if escape.is_some() || control {
            out.write_all(&text.as_bytes()[start..index])?;
            match escape {
                Some(escape) => out.write_all(escape.as_bytes())?,
                None => write!(out, "\\u{:04x}", c as u32)?,
            }
            start = index + c.len_utf8();
        }
    }
    out.write_all(&text.as_bytes()[start..])?;
    out.write_all(b"\"")
}
