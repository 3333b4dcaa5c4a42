//! Scrubbing known secret values out of what reaches a tool or the model. A [`Redactor`] is built
//! from (label, value) pairs — the API keys and tokens the host holds — and replaces every
//! occurrence of a value with `[redacted: LABEL]`, in text and in bytes, in the forms a server
//! that reflects a request produces: the raw value; the value with any of its bytes
//! percent-encoded (upper or lower case hex, `+` for a space) or JSON-escaped (`\"`, `\\`, `\/`,
//! `\n`…, `\u00XX`); and its standard and URL-safe base64 at each of the three byte alignments
//! (so a value inside a longer base64 text, such as a `Basic` credential, is found too). A
//! [`StreamRedactor`] does the same over a body that arrives in chunks, holding back just enough
//! bytes that a value split across chunks is still found; its output is the same for every
//! chunking.
//!
//! Values shorter than [`MIN_SECRET_BYTES`] are not scrubbed: a substring that short occurs by
//! chance in ordinary text (a 3-byte value would blank out every word containing it), and a
//! credential that short protects nothing anyway. They are listed by [`Redactor::skipped`] so the
//! caller can warn the operator. A value that a server itself cuts, reorders or re-encodes in
//! another way is not recognised; what the host cuts (a body stopped at its size cap) is handled
//! by [`StreamRedactor::finish_cut`].

use std::fmt;
use std::sync::Arc;

use crate::{ToolError, ToolOutput};

/// Values shorter than this many bytes are not scrubbed (see the module documentation).
pub const MIN_SECRET_BYTES: usize = 8;

/// At a cut end, a trailing partial match covering at least this many bytes of a value is
/// replaced too: a prefix that long could help guess the rest, a shorter one cannot.
const MIN_PARTIAL_BYTES: usize = 4;

/// The longest form one byte of a value can take in the text (`\u00XX`).
const LONGEST_BYTE_FORM: usize = 6;

const HEX_UPPER: &[u8; 16] = b"0123456789ABCDEF";

/// Replaces known secret values in text and bytes. Cheap to clone; printing it shows the labels
/// only, never a value.
#[derive(Clone, Default)]
pub struct Redactor {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    /// One entry per distinct value kept.
    secrets: Vec<SecretEntry>,
    /// Every form each value is searched in.
    patterns: Vec<Pattern>,
    /// Labels of values too short to scrub.
    skipped: Vec<String>,
    /// Which bytes can start a match.
    starts: Vec<bool>,
    /// The longest text any pattern can match.
    longest: usize,
}

struct SecretEntry {
    label: String,
    replacement: Vec<u8>,
    lowercase: Vec<u8>,
}

struct Pattern {
    secret: usize,
    form: Form,
}

enum Form {
    /// The value's bytes, each raw, percent-encoded or JSON-escaped.
    Encoded(Vec<u8>),
    /// A fixed byte string (one base64 form of the value).
    Literal(Vec<u8>),
}

impl Form {
    fn longest(&self) -> usize {
        match self {
            Form::Encoded(value) => value
                .iter()
                .map(|&byte| if byte < 0x80 { LONGEST_BYTE_FORM } else { 3 })
                .sum(),
            Form::Literal(literal) => literal.len(),
        }
    }

    fn first_bytes(&self) -> Vec<u8> {
        match self {
            Form::Encoded(value) => {
                let mut bytes = vec![b'%', b'\\'];
                if let Some(&first) = value.first() {
                    bytes.push(first);
                    if first == b' ' {
                        bytes.push(b'+');
                    }
                }
                bytes
            }
            Form::Literal(literal) => literal.first().copied().into_iter().collect(),
        }
    }
}

impl fmt::Debug for Redactor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Redactor")
            .field("labels", &self.labels())
            .field("skipped", &self.inner.skipped)
            .finish()
    }
}

/// How the end of the text is to be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// More may follow: only matches that cannot grow are decided.
    Open,
    /// The text is complete.
    Natural,
    /// The text was cut (by a size cap): a value cut short at the end is replaced as well.
    Cut,
}

/// What matching at one position found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// No match.
    None,
    /// A whole value, ending at this offset.
    Full(usize),
    /// The text ended after this many bytes of the value matched.
    Partial(usize),
}

/// One step of matching one value byte at one offset.
enum Step {
    No,
    Matched(usize),
    Short,
}

/// Scratch state sets for the matcher, reused across positions.
#[derive(Default)]
struct Scratch {
    states: Vec<usize>,
    next: Vec<usize>,
}

impl Redactor {
    /// A redactor for `secrets`, (label, value) pairs; the label names the value in the
    /// replacement, e.g. `[redacted: BRAVE_API_KEY]`, so it must not itself be secret. Values
    /// shorter than [`MIN_SECRET_BYTES`] are not scrubbed and are listed by
    /// [`skipped`](Self::skipped); a value given twice is scrubbed under its first label.
    pub fn new<I, L, V>(secrets: I) -> Redactor
    where
        I: IntoIterator<Item = (L, V)>,
        L: Into<String>,
        V: AsRef<[u8]>,
    {
        Redactor::build(secrets, Vec::new())
    }

    fn build<I, L, V>(secrets: I, skipped: Vec<String>) -> Redactor
    where
        I: IntoIterator<Item = (L, V)>,
        L: Into<String>,
        V: AsRef<[u8]>,
    {
        let mut inner = Inner {
            starts: vec![false; 256],
            ..Inner::default()
        };
        for label in skipped {
            if !inner.skipped.contains(&label) {
                inner.skipped.push(label);
            }
        }
        let mut values: Vec<Vec<u8>> = Vec::new();
        for (label, value) in secrets {
            let label = label.into();
            let value = value.as_ref();
            if value.len() < MIN_SECRET_BYTES {
                if !inner.skipped.contains(&label) {
                    inner.skipped.push(label);
                }
                continue;
            }
            if values.iter().any(|known| known == value) {
                continue;
            }
            values.push(value.to_vec());
            let secret = inner.secrets.len();
            inner.secrets.push(SecretEntry {
                replacement: format!("[redacted: {label}]").into_bytes(),
                lowercase: value.to_ascii_lowercase(),
                label,
            });
            inner.patterns.push(Pattern {
                secret,
                form: Form::Encoded(value.to_vec()),
            });
            for literal in base64_forms(value) {
                inner.patterns.push(Pattern {
                    secret,
                    form: Form::Literal(literal),
                });
            }
        }
        for pattern in &inner.patterns {
            inner.longest = inner.longest.max(pattern.form.longest());
            for byte in pattern.form.first_bytes() {
                inner.starts[usize::from(byte)] = true;
            }
        }
        Redactor {
            inner: Arc::new(inner),
        }
    }

    /// A redactor for the values of both `self` and `other` (labels as each gave them; a value
    /// both hold keeps `self`'s label), e.g. the provider keys joined with the redactor of a
    /// network policy's secrets. The skipped labels of both are kept.
    pub fn merged(&self, other: &Redactor) -> Redactor {
        let values = |redactor: &Redactor| -> Vec<(String, Vec<u8>)> {
            redactor
                .inner
                .patterns
                .iter()
                .filter_map(|pattern| match &pattern.form {
                    Form::Encoded(value) => Some((
                        redactor.inner.secrets[pattern.secret].label.clone(),
                        value.clone(),
                    )),
                    Form::Literal(_) => None,
                })
                .collect()
        };
        let skipped = self
            .inner
            .skipped
            .iter()
            .chain(&other.inner.skipped)
            .cloned()
            .collect();
        Redactor::build(values(self).into_iter().chain(values(other)), skipped)
    }

    /// Whether nothing is scrubbed.
    pub fn is_empty(&self) -> bool {
        self.inner.patterns.is_empty()
    }

    /// The labels of the values scrubbed.
    pub fn labels(&self) -> Vec<&str> {
        self.inner
            .secrets
            .iter()
            .map(|secret| secret.label.as_str())
            .collect()
    }

    /// The labels of values left unscrubbed because they are shorter than
    /// [`MIN_SECRET_BYTES`]: the caller should warn the operator that these values can be shown.
    pub fn skipped(&self) -> &[String] {
        &self.inner.skipped
    }

    /// The longest stretch of text one match can cover; a [`StreamRedactor`] holds back one byte
    /// less than this.
    pub fn longest_match(&self) -> usize {
        self.inner.longest
    }

    /// `text` with every value replaced.
    pub fn redact(&self, text: &str) -> String {
        if self.is_empty() {
            return text.to_string();
        }
        match String::from_utf8(self.redact_bytes(text.as_bytes())) {
            Ok(redacted) => redacted,
            Err(error) => String::from_utf8_lossy(error.as_bytes()).into_owned(),
        }
    }

    /// `bytes` with every value replaced.
    pub fn redact_bytes(&self, bytes: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(bytes.len());
        self.scan(bytes, End::Natural, &mut out);
        out
    }

    /// Whether `bytes` contain a value in any of its forms.
    pub fn contains(&self, bytes: &[u8]) -> bool {
        if self.is_empty() {
            return false;
        }
        let mut scratch = Scratch::default();
        (0..bytes.len()).any(|at| {
            self.inner.starts[usize::from(bytes[at])]
                && matches!(
                    self.best_at(bytes, at, End::Natural, &mut scratch),
                    Some((Outcome::Full(_), _))
                )
        })
    }

    /// The label of a value that occurs in `text` ignoring ASCII case, for text a protocol
    /// lower-cases (a header name), where the value cannot be replaced and the text should be
    /// dropped instead.
    pub fn mentioned_ignoring_case(&self, text: &[u8]) -> Option<&str> {
        let lower = text.to_ascii_lowercase();
        self.inner
            .secrets
            .iter()
            .find(|secret| {
                lower
                    .windows(secret.lowercase.len())
                    .any(|window| window == secret.lowercase.as_slice())
            })
            .map(|secret| secret.label.as_str())
    }

    /// A tool's result with every value replaced, in the output text or the error's message
    /// (the error keeps its kind).
    pub fn redact_result(
        &self,
        result: Result<ToolOutput, ToolError>,
    ) -> Result<ToolOutput, ToolError> {
        if self.is_empty() {
            return result;
        }
        match result {
            Ok(output) => Ok(ToolOutput::text(self.redact(&output.text))),
            Err(ToolError::InvalidArgs(message)) => {
                Err(ToolError::InvalidArgs(self.redact(&message)))
            }
            Err(ToolError::Denied(message)) => Err(ToolError::Denied(self.redact(&message))),
            Err(ToolError::Failed(message)) => Err(ToolError::Failed(self.redact(&message))),
        }
    }

    /// A redactor for one body arriving in chunks.
    pub fn stream(&self) -> StreamRedactor {
        StreamRedactor {
            redactor: self.clone(),
            held: Vec::new(),
        }
    }

    /// Copy `input` into `out` with matches replaced; returns how many input bytes were
    /// consumed, which is all of them unless `end` is [`End::Open`].
    fn scan(&self, input: &[u8], end: End, out: &mut Vec<u8>) -> usize {
        let inner = &*self.inner;
        if inner.patterns.is_empty() {
            out.extend_from_slice(input);
            return input.len();
        }
        // In an open text a match starting at `at` is decided once `longest` bytes from `at`
        // are present: no form is longer.
        let limit = match end {
            End::Open => input.len().saturating_sub(inner.longest.saturating_sub(1)),
            End::Natural | End::Cut => input.len(),
        };
        let mut scratch = Scratch::default();
        let mut copied = 0;
        let mut at = 0;
        while at < limit {
            if !inner.starts[usize::from(input[at])] {
                at += 1;
                continue;
            }
            match self.best_at(input, at, end, &mut scratch) {
                Some((Outcome::Full(stop), secret)) => {
                    out.extend_from_slice(&input[copied..at]);
                    out.extend_from_slice(&inner.secrets[secret].replacement);
                    at = stop;
                    copied = stop;
                }
                Some((Outcome::Partial(_), secret)) => {
                    out.extend_from_slice(&input[copied..at]);
                    out.extend_from_slice(&inner.secrets[secret].replacement);
                    at = input.len();
                    copied = input.len();
                }
                _ => at += 1,
            }
        }
        // Past the limit, an open text is released up to the first position where a value may
        // still begin (some form matches up to the end of the text): ordinary text is held back
        // a few bytes, not the longest form's length.
        if end == End::Open {
            while at < input.len()
                && (!inner.starts[usize::from(input[at])] || !self.may_begin_at(input, at))
            {
                at += 1;
            }
        }
        out.extend_from_slice(&input[copied..at]);
        at
    }

    /// Whether a value may begin at `at` in an open text: some form matches there, or matches
    /// up to the end of the text. No match at all is final whatever follows.
    fn may_begin_at(&self, input: &[u8], at: usize) -> bool {
        let mut scratch = Scratch::default();
        self.inner.patterns.iter().any(|pattern| {
            let outcome = match &pattern.form {
                Form::Encoded(value) => match_encoded(value, input, at, &mut scratch),
                Form::Literal(literal) => match_literal(literal, input, at),
            };
            outcome != Outcome::None
        })
    }

    /// The longest whole match at `at` over every pattern, or at a cut end a long enough
    /// partial one.
    fn best_at(
        &self,
        input: &[u8],
        at: usize,
        end: End,
        scratch: &mut Scratch,
    ) -> Option<(Outcome, usize)> {
        let mut best: Option<(usize, usize)> = None;
        let mut partial: Option<usize> = None;
        for pattern in &self.inner.patterns {
            let outcome = match &pattern.form {
                Form::Encoded(value) => match_encoded(value, input, at, scratch),
                Form::Literal(literal) => match_literal(literal, input, at),
            };
            match outcome {
                Outcome::Full(stop) if best.is_none_or(|(longest, _)| stop > longest) => {
                    best = Some((stop, pattern.secret));
                }
                Outcome::Partial(progress)
                    if end == End::Cut && progress >= MIN_PARTIAL_BYTES && partial.is_none() =>
                {
                    partial = Some(pattern.secret);
                }
                _ => {}
            }
        }
        match (best, partial) {
            (Some((stop, secret)), _) => Some((Outcome::Full(stop), secret)),
            (None, Some(secret)) => Some((Outcome::Partial(0), secret)),
            (None, None) => None,
        }
    }
}

/// A [`Redactor`] over a body that arrives in chunks. Each [`push`](Self::push) returns what
/// can be released; up to [`Redactor::longest_match`] − 1 bytes are held back until the next
/// chunk shows whether they begin a value. [`finish`](Self::finish) releases the rest at the
/// body's end. The concatenated output equals [`Redactor::redact_bytes`] of the whole body,
/// however it was split.
#[derive(Debug, Clone)]
pub struct StreamRedactor {
    redactor: Redactor,
    held: Vec<u8>,
}

impl StreamRedactor {
    /// Take the next chunk; returns the bytes that can be released now.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<u8> {
        if self.redactor.is_empty() {
            return chunk.to_vec();
        }
        self.held.extend_from_slice(chunk);
        let mut out = Vec::with_capacity(self.held.len());
        let consumed = self.redactor.scan(&self.held, End::Open, &mut out);
        self.held.drain(..consumed);
        out
    }

    /// The body ended: release what is held.
    pub fn finish(&mut self) -> Vec<u8> {
        self.release(End::Natural)
    }

    /// The body was cut short (a size cap, a broken connection): release what is held, with a
    /// value cut off at the end (at least 4 of its bytes) replaced as a whole.
    pub fn finish_cut(&mut self) -> Vec<u8> {
        self.release(End::Cut)
    }

    /// Bytes held back, waiting for the next chunk.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    fn release(&mut self, end: End) -> Vec<u8> {
        let held = std::mem::take(&mut self.held);
        let mut out = Vec::with_capacity(held.len());
        self.redactor.scan(&held, end, &mut out);
        out
    }
}

/// Match one value at `start`, each byte in any of its forms. The matcher follows every way
/// the text can be read (a `%` may be the value's own byte or begin `%XX`), as a set of offsets.
fn match_encoded(value: &[u8], input: &[u8], start: usize, scratch: &mut Scratch) -> Outcome {
    let Scratch { states, next } = scratch;
    states.clear();
    states.push(start);
    let mut partial: Option<usize> = None;
    for (matched, &byte) in value.iter().enumerate() {
        next.clear();
        for &offset in states.iter() {
            match_byte(byte, input, offset, |step| match step {
                Step::Matched(length) => next.push(offset + length),
                Step::Short => partial = Some(partial.map_or(matched, |p| p.max(matched))),
                Step::No => {}
            });
        }
        if next.is_empty() {
            return partial.map_or(Outcome::None, Outcome::Partial);
        }
        next.sort_unstable();
        next.dedup();
        std::mem::swap(states, next);
    }
    states
        .iter()
        .max()
        .map_or(Outcome::None, |&stop| Outcome::Full(stop))
}

/// Every form `byte` can take at `offset`.
fn match_byte(byte: u8, input: &[u8], offset: usize, mut found: impl FnMut(Step)) {
    let Some(&first) = input.get(offset) else {
        found(Step::Short);
        return;
    };
    if first == byte || (byte == b' ' && first == b'+') {
        found(Step::Matched(1));
    }
    let hex = [
        HEX_UPPER[usize::from(byte >> 4)],
        HEX_UPPER[usize::from(byte & 15)],
    ];
    if first == b'%' {
        found(expect(input, offset, &[b'%', hex[0], hex[1]], 1));
    }
    if first == b'\\' {
        let short = match byte {
            b'"' => Some(b'"'),
            b'\\' => Some(b'\\'),
            b'/' => Some(b'/'),
            0x08 => Some(b'b'),
            0x0c => Some(b'f'),
            b'\n' => Some(b'n'),
            b'\r' => Some(b'r'),
            b'\t' => Some(b't'),
            _ => None,
        };
        if let Some(escape) = short {
            found(expect(input, offset, &[b'\\', escape], 2));
        }
        if byte < 0x80 {
            found(expect(
                input,
                offset,
                &[b'\\', b'u', b'0', b'0', hex[0], hex[1]],
                4,
            ));
        }
    }
}

/// Whether `input` at `offset` reads `want`, comparing ASCII case-insensitively from index
/// `fold_from` on (hex digits).
fn expect(input: &[u8], offset: usize, want: &[u8], fold_from: usize) -> Step {
    for (index, &expected) in want.iter().enumerate() {
        let Some(&actual) = input.get(offset + index) else {
            return Step::Short;
        };
        let same = if index >= fold_from {
            actual.eq_ignore_ascii_case(&expected)
        } else {
            actual == expected
        };
        if !same {
            return Step::No;
        }
    }
    Step::Matched(want.len())
}

fn match_literal(literal: &[u8], input: &[u8], start: usize) -> Outcome {
    let available = &input[start.min(input.len())..];
    if available.len() >= literal.len() {
        if available.starts_with(literal) {
            Outcome::Full(start + literal.len())
        } else {
            Outcome::None
        }
    } else if literal.starts_with(available) {
        Outcome::Partial(available.len())
    } else {
        Outcome::None
    }
}

/// The base64 forms of `value`: its padded standard encoding, and for each of the three byte
/// alignments the characters determined by the value alone (what appears when the value sits
/// inside a longer encoded text); each also in the URL-safe alphabet.
fn base64_forms(value: &[u8]) -> Vec<Vec<u8>> {
    let mut forms = vec![base64(value, true)];
    for shift in 0..3 {
        let mut shifted = vec![0; shift];
        shifted.extend_from_slice(value);
        let encoded = base64(&shifted, false);
        let first = (4 * shift).div_ceil(3);
        let stop = (4 * (shift + value.len())) / 3;
        if let Some(core) = encoded.get(first..stop) {
            forms.push(core.to_vec());
        }
    }
    let url_safe: Vec<Vec<u8>> = forms
        .iter()
        .map(|form| {
            form.iter()
                .map(|&byte| match byte {
                    b'+' => b'-',
                    b'/' => b'_',
                    other => other,
                })
                .collect()
        })
        .collect();
    forms.extend(url_safe);
    forms.sort();
    forms.dedup();
    forms
}

fn base64(bytes: &[u8], pad: bool) -> Vec<u8> {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::with_capacity(bytes.len().div_ceil(3) * 4);
    for group in bytes.chunks(3) {
        let b = [
            group[0],
            group.get(1).copied().unwrap_or(0),
            group.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        let chars = group.len() + 1;
        for index in 0..4 {
            if index < chars {
                out.push(ALPHABET[((n >> (18 - 6 * index)) & 63) as usize]);
            } else if pad {
                out.push(b'=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;
