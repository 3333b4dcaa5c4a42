//! jq's input: the files named (or standard input) read whole, then parsed lazily as one
//! stream of JSON values (or of lines with `-R`), each source checked for nesting deeper than
//! [`MAX_DEPTH`](crate::MAX_DEPTH) before it is parsed, and parse errors placed by line and
//! column.

use std::cell::RefCell;
use std::io::Read;

use jaq_json::Val;

use crate::{Failure, MAX_DEPTH, line_and_column};

/// One input: its name as messages show it, its bytes, and whether it is standard input.
pub struct Source {
    name: String,
    bytes: Vec<u8>,
    stdin: bool,
}

/// The whole content of `path`, or a message naming it.
pub fn read_file(path: &str) -> Result<Vec<u8>, String> {
    if path == "-" || path == "/dev/stdin" {
        let mut bytes = Vec::new();
        std::io::stdin()
            .lock()
            .read_to_end(&mut bytes)
            .map_err(|error| format!("cannot read standard input: {error}"))?;
        return Ok(bytes);
    }
    std::fs::read(path).map_err(|error| {
        let text = error.to_string();
        let text = text.split(" (os error").next().unwrap_or(&text).to_string();
        format!("could not open {path}: {text}")
    })
}

/// Read every input: the files named, or standard input when there are none.
pub fn load(files: &[String]) -> Result<Vec<Source>, Failure> {
    if files.is_empty() {
        let bytes = read_file("-").map_err(Failure::Input)?;
        return Ok(vec![Source {
            name: "<stdin>".to_string(),
            bytes,
            stdin: true,
        }]);
    }
    files
        .iter()
        .map(|file| {
            Ok(Source {
                name: file.clone(),
                bytes: read_file(file).map_err(Failure::Input)?,
                stdin: file == "-",
            })
        })
        .collect()
}

/// Refuse JSON text nested deeper than [`MAX_DEPTH`] (arrays and objects, outside strings):
/// parsing, printing and dropping such a value would exhaust the stack.
pub fn check_depth(bytes: &[u8], name: &str) -> Result<(), String> {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for (offset, byte) in bytes.iter().enumerate() {
        if in_string {
            match (escaped, byte) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > MAX_DEPTH {
                    let text = String::from_utf8_lossy(&bytes[..offset]);
                    let (line, column) = line_and_column(&text, text.len());
                    return Err(format!(
                        "{name}: the JSON text is nested deeper than {MAX_DEPTH} levels \
                         (at line {line}, column {column}); jq refuses such input"
                    ));
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}

/// A parse error of `bytes` (from `name`) with its line and column.
pub fn describe_parse_error(bytes: &[u8], name: &str, error: &jaq_json::read::Error) -> String {
    // jaq_json's error reads "byte offset N: what was wrong".
    let text = error.to_string();
    let parsed = text
        .strip_prefix("byte offset ")
        .and_then(|rest| rest.split_once(": "))
        .and_then(|(offset, what)| Some((offset.parse::<usize>().ok()?, what.to_string())));
    match parsed {
        Some((offset, what)) => {
            let before = String::from_utf8_lossy(&bytes[..offset.min(bytes.len())]);
            let (line, column) = line_and_column(&before, before.len());
            format!("invalid JSON in {name} at line {line}, column {column}: {what}")
        }
        None => format!("invalid JSON in {name}: {text}"),
    }
}

type Values<'a> = Box<dyn Iterator<Item = Result<Val, String>> + 'a>;

/// The values of all sources in turn, keeping `filename` on the source being read.
pub struct Stream<'a> {
    sources: &'a [Source],
    next: usize,
    current: Option<Values<'a>>,
    raw: bool,
    filename: &'a RefCell<Val>,
}

impl<'a> Stream<'a> {
    pub fn new(sources: &'a [Source], raw: bool, filename: &'a RefCell<Val>) -> Self {
        Stream {
            sources,
            next: 0,
            current: None,
            raw,
            filename,
        }
    }

    /// The values of one source: its lines with `-R`, else its JSON values.
    fn values_of(source: &'a Source, raw: bool) -> Values<'a> {
        if raw {
            let text = &source.bytes;
            let lines = text
                .split_inclusive(|byte| *byte == b'\n')
                .map(|line| line.strip_suffix(b"\n").unwrap_or(line))
                .map(|line| Ok(Val::utf8_str(line.to_vec())));
            return Box::new(lines);
        }
        if let Err(message) = check_depth(&source.bytes, &source.name) {
            return Box::new(core::iter::once(Err(message)));
        }
        let bytes = &source.bytes;
        Box::new(jaq_json::read::parse_many(bytes).map(move |value| {
            value.map_err(|error| describe_parse_error(bytes, &source.name, &error))
        }))
    }
}

impl Iterator for Stream<'_> {
    type Item = Result<Val, String>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(value) = self.current.as_mut().and_then(|values| values.next()) {
                return Some(value);
            }
            let source = self.sources.get(self.next)?;
            self.next += 1;
            *self.filename.borrow_mut() = if source.stdin {
                Val::Null
            } else {
                Val::utf8_str(source.name.clone())
            };
            self.current = Some(Self::values_of(source, self.raw));
        }
    }
}

/// `-s`: every value in one array, or with `-R` the whole text as one string.
pub fn slurp(stream: Stream<'_>, raw: bool) -> Result<Val, String> {
    if raw {
        let mut text = Vec::new();
        for source in stream.sources {
            text.extend_from_slice(&source.bytes);
        }
        return Ok(Val::utf8_str(text));
    }
    stream
        .collect::<Result<Vec<Val>, String>>()
        .map(|values| values.into_iter().collect())
}
