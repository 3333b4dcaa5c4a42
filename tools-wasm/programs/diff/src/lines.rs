//! Splitting text into lines the way diff and patch see them: each line keeps its `\n`, and a
//! last line without one is a line too (so "no newline at end of file" is a difference).

/// The lines of `text`, each with its terminating `\n` (the last one may lack it).
pub fn split_lines(text: &[u8]) -> Vec<&[u8]> {
    let mut lines = Vec::with_capacity(memchr::memchr_iter(b'\n', text).count() + 1);
    let mut start = 0;
    for end in memchr::memchr_iter(b'\n', text) {
        lines.push(&text[start..=end]);
        start = end + 1;
    }
    if start < text.len() {
        lines.push(&text[start..]);
    }
    lines
}

/// Whether `line` lacks its terminating newline (only a file's last line can).
pub fn lacks_newline(line: &[u8]) -> bool {
    line.last() != Some(&b'\n')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_keep_their_newlines() {
        assert_eq!(split_lines(b"a\nb\n"), vec![&b"a\n"[..], b"b\n"]);
        assert_eq!(split_lines(b"a\nb"), vec![&b"a\n"[..], b"b"]);
        assert_eq!(split_lines(b""), Vec::<&[u8]>::new());
        assert_eq!(split_lines(b"\n\n"), vec![&b"\n"[..], b"\n"]);
        assert!(lacks_newline(b"b"));
        assert!(!lacks_newline(b"b\n"));
    }
}
