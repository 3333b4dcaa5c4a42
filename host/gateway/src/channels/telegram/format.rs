//! A reply as Telegram takes it: HTML with `&`, `<` and `>` escaped, split at 4,096 UTF-16
//! units, preferably at a blank line, a line end or a space.

/// Escapes text for `parse_mode: "HTML"`: `&`, `<` and `>` become entities, nothing else is
/// interpreted.
pub fn escape_html(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            _ => out.push(c),
        }
    }
    out
}

pub(super) fn units(text: &str) -> usize {
    text.encode_utf16().count()
}

/// Splits `text` into pieces of at most `max` UTF-16 units whose concatenation is `text`,
/// cutting after a blank line, else a line end, else a space, when one lies in the second half
/// of a piece.
pub fn split_message(text: &str, max: usize) -> Vec<String> {
    let mut pieces = Vec::new();
    let mut rest = text;
    while units(rest) > max {
        // The longest prefix within `max` units, on a char boundary.
        let mut end = 0;
        let mut count = 0;
        for (index, c) in rest.char_indices() {
            if count + c.len_utf16() > max {
                break;
            }
            count += c.len_utf16();
            end = index + c.len_utf8();
        }
        let window = &rest[..end];
        let half = window.len() / 2;
        let cut = [
            window.rfind("\n\n").map(|at| at + 2),
            window.rfind('\n').map(|at| at + 1),
            window.rfind(' ').map(|at| at + 1),
        ]
        .into_iter()
        .flatten()
        .find(|&at| at > half)
        .unwrap_or(end.max(rest.chars().next().map_or(1, char::len_utf8)));
        pieces.push(rest[..cut].to_string());
        rest = &rest[cut..];
    }
    if !rest.is_empty() || pieces.is_empty() {
        pieces.push(rest.to_string());
    }
    pieces
}
