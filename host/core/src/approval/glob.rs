//! The globs of plans and allowlist entries: `*` any text, `?` one character, `[...]` a class, a
//! backslash escapes; an allowlist entry's words, split at white space not escaped.

use super::*;

/// Matches `text` against a glob: `*` any text (spaces and slashes included), `?` one character,
/// `\x` the character `x`. Iterative, linear in practice, no backtracking blow-up.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let pattern: Vec<char> = pattern.chars().collect();
    let text: Vec<char> = text.chars().collect();
    let (mut p, mut t) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        match pattern.get(p) {
            Some('*') => {
                star = Some((p, t));
                p += 1;
                continue;
            }
            Some('?') => {
                p += 1;
                t += 1;
                continue;
            }
            Some('\\') if p + 1 < pattern.len() && pattern[p + 1] == text[t] => {
                p += 2;
                t += 1;
                continue;
            }
            Some(&c) if c != '\\' && c == text[t] => {
                p += 1;
                t += 1;
                continue;
            }
            _ => {}
        }
        match star {
            Some((star_p, star_t)) => {
                p = star_p + 1;
                t = star_t + 1;
                star = Some((star_p, star_t + 1));
            }
            None => return false,
        }
    }
    pattern[p..].iter().all(|c| *c == '*')
}

/// `text` as a glob that matches exactly it, and stays one word of an allowlist entry (its
/// white space escaped too).
pub fn glob_escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '\\') || c.is_whitespace() {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

/// `pattern` (a one-argument glob) with its white space escaped, so it stays one word of an
/// allowlist entry; what is escaped already stays as it is.
pub(super) fn escape_white_space(pattern: &str) -> String {
    let mut escaped = String::with_capacity(pattern.len());
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            escaped.push(c);
            if let Some(next) = chars.next() {
                escaped.push(next);
            }
            continue;
        }
        if c.is_whitespace() {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

/// The words of an allowlist entry's argument pattern, split at white space not escaped: a word
/// that is `*` alone stands for any number of arguments (none included), every other word for
/// one argument that matches it as a glob.
pub(super) fn entry_words(pattern: &str) -> Vec<ArgMatch> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        if c.is_whitespace() {
            words.extend(word.take());
            continue;
        }
        let current = word.get_or_insert_with(String::new);
        current.push(c);
        if c == '\\'
            && let Some(next) = chars.next()
        {
            current.push(next);
        }
    }
    words.extend(word);
    words
        .into_iter()
        .map(|word| {
            if word == "*" {
                ArgMatch::Any
            } else {
                ArgMatch::Glob(word)
            }
        })
        .collect()
}

/// One argument against one word of an allowlist entry: the glob must match, and an argument
/// that climbs out of a directory (a `..` between slashes or after `=`) matches only a word
/// that writes `..` itself, so `build/*` never covers `build/../src`.
pub(super) fn entry_word_matches(word: &str, argument: &str) -> bool {
    glob_match(word, argument)
        && (word.contains("..") || !argument.split(['/', '=']).any(|part| part == ".."))
}
