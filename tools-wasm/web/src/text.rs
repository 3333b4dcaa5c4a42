//! Plain-text helpers: decoding a body by its declared charset, and cutting
//! long text with a marker that states the total.

/// Decode `bytes` as text. UTF-8 (the default) is decoded lossily; ISO-8859-1
/// and windows-1252 map each byte to the code point of the same number (exact
/// for ISO-8859-1, close for windows-1252).
pub fn decode(bytes: &[u8], charset: Option<&str>) -> String {
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    match charset.map(|c| c.trim().trim_matches('"').to_ascii_lowercase()) {
        Some(c)
            if matches!(
                c.as_str(),
                "iso-8859-1" | "latin1" | "latin-1" | "windows-1252" | "us-ascii" | "ascii"
            ) =>
        {
            bytes.iter().map(|&b| char::from(b)).collect()
        }
        _ => String::from_utf8_lossy(bytes).into_owned(),
    }
}

/// Keep at most `max_chars` characters of `text`; a longer text is cut (at a
/// line or word break near the limit when there is one) and ends with a
/// marker stating how much was shown of how much.
pub fn cut(text: &str, max_chars: usize) -> String {
    let total = text.chars().count();
    if total <= max_chars {
        return text.to_string();
    }
    let end = text
        .char_indices()
        .nth(max_chars)
        .map_or(text.len(), |(index, _)| index);
    let head = &text[..end];
    // Prefer a break within the last tenth of the kept text.
    let floor = head.len() - head.len() / 10;
    let head = match head.rfind('\n').filter(|&i| i >= floor) {
        Some(i) => &head[..i],
        None => match head.rfind(' ').filter(|&i| i >= floor) {
            Some(i) => &head[..i],
            None => head,
        },
    };
    let shown = head.chars().count();
    format!(
        "{}\n\n[... cut: showing {shown} of {total} characters; call web_fetch again with a larger max_chars to read more ...]",
        head.trim_end()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_text_is_unchanged() {
        assert_eq!(cut("hello", 100), "hello");
    }

    #[test]
    fn long_text_is_cut_with_the_total() {
        let text = "word ".repeat(1000);
        let cut_text = cut(&text, 200);
        assert!(cut_text.contains("of 5000 characters"), "{cut_text}");
        assert!(cut_text.starts_with("word word"));
        assert!(cut_text.chars().count() < 400);
    }

    #[test]
    fn cutting_respects_multibyte_characters() {
        let text = "é".repeat(500);
        let cut_text = cut(&text, 100);
        assert!(cut_text.starts_with(&"é".repeat(100)), "{cut_text}");
        assert!(cut_text.contains("showing 100 of 500"), "{cut_text}");
    }

    #[test]
    fn charsets() {
        assert_eq!(decode(b"caf\xe9", Some("ISO-8859-1")), "café");
        assert_eq!(decode("café".as_bytes(), None), "café");
        assert_eq!(decode(b"\xEF\xBB\xBFhi", Some("utf-8")), "hi");
        assert_eq!(decode(b"a\xffb", None), "a\u{fffd}b");
    }
}
