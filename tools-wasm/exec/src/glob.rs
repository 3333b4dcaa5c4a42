//! Pattern matching for the shell: `*`, `?` and `[...]` as in file-name globbing and `case`,
//! and expanding a glob against the directories the sandbox can see. A pattern that matches
//! nothing stays as written (POSIX behaviour); `*` does not match a leading `.`.

use std::path::Path;

/// One pattern character: either literal (quoted or escaped) or special.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PatternChar {
    /// The character.
    pub c: char,
    /// Whether it was quoted, so it matches only itself.
    pub literal: bool,
}

/// Whether `chars` holds an unquoted `*`, `?` or `[`.
pub fn has_wildcards(chars: &[PatternChar]) -> bool {
    chars
        .iter()
        .any(|pc| !pc.literal && matches!(pc.c, '*' | '?' | '['))
}

/// Whether `text` matches `pattern` as a whole.
pub fn matches(pattern: &[PatternChar], text: &str) -> bool {
    let text: Vec<char> = text.chars().collect();
    match_from(pattern, &text)
}

fn match_from(pattern: &[PatternChar], text: &[char]) -> bool {
    let Some((first, rest)) = pattern.split_first() else {
        return text.is_empty();
    };
    if !first.literal {
        match first.c {
            '*' => {
                return (0..=text.len()).any(|skip| match_from(rest, &text[skip..]));
            }
            '?' => return !text.is_empty() && match_from(rest, &text[1..]),
            '[' => {
                if let Some((matched, consumed)) = bracket(rest, text.first().copied()) {
                    return matched && match_from(&rest[consumed..], &text[1..]);
                }
            }
            _ => {}
        }
    }
    text.first() == Some(&first.c) && match_from(rest, &text[1..])
}

/// Matches a bracket expression (after its `[`) against `c`; returns whether it matched and
/// how many pattern characters it used, or `None` when there is no closing `]`.
fn bracket(pattern: &[PatternChar], c: Option<char>) -> Option<(bool, usize)> {
    let mut index = 0;
    let negate = matches!(pattern.first(), Some(pc) if !pc.literal && (pc.c == '!' || pc.c == '^'));
    if negate {
        index += 1;
    }
    let mut matched = false;
    let mut first = true;
    while index < pattern.len() {
        let pc = pattern[index];
        if pc.c == ']' && !pc.literal && !first {
            let Some(c) = c else {
                return Some((false, index + 1));
            };
            let _ = c;
            return Some((matched != negate, index + 1));
        }
        first = false;
        if index + 2 < pattern.len() && pattern[index + 1].c == '-' && pattern[index + 2].c != ']' {
            let (low, high) = (pc.c, pattern[index + 2].c);
            if c.is_some_and(|c| low <= c && c <= high) {
                matched = true;
            }
            index += 3;
            continue;
        }
        if c == Some(pc.c) {
            matched = true;
        }
        index += 1;
    }
    None
}

/// Paths matching `pattern` (relative to `cwd` unless absolute), sorted; empty when none.
pub fn expand(pattern: &[PatternChar], cwd: &str) -> Vec<String> {
    let absolute = pattern.first().is_some_and(|pc| pc.c == '/');
    let components: Vec<&[PatternChar]> = pattern
        .split(|pc| pc.c == '/')
        .filter(|component| !component.is_empty())
        .collect();
    let mut results: Vec<String> = vec![if absolute {
        "/".to_string()
    } else {
        String::new()
    }];
    for (position, component) in components.iter().enumerate() {
        let last = position + 1 == components.len();
        let mut next = Vec::new();
        for prefix in &results {
            if !has_wildcards(component) {
                let name: String = component.iter().map(|pc| pc.c).collect();
                let candidate = join(prefix, &name);
                if (last || is_dir(&resolve(cwd, &candidate)))
                    && (!last || Path::new(&resolve(cwd, &candidate)).exists())
                {
                    next.push(candidate);
                }
                continue;
            }
            let directory = resolve(cwd, if prefix.is_empty() { "." } else { prefix });
            let Ok(entries) = std::fs::read_dir(&directory) else {
                continue;
            };
            let hidden_ok = component.first().is_some_and(|pc| pc.c == '.');
            let mut names: Vec<String> = entries
                .flatten()
                .map(|entry| entry.file_name().to_string_lossy().into_owned())
                .filter(|name| hidden_ok || !name.starts_with('.'))
                .filter(|name| matches(component, name))
                .collect();
            names.sort();
            for name in names {
                let candidate = join(prefix, &name);
                if last || is_dir(&resolve(cwd, &candidate)) {
                    next.push(candidate);
                }
            }
        }
        results = next;
        if results.is_empty() {
            break;
        }
    }
    if pattern.last().is_some_and(|pc| pc.c == '/') {
        results.iter_mut().for_each(|result| result.push('/'));
    }
    results
}

fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_string()
    } else if prefix.ends_with('/') {
        format!("{prefix}{name}")
    } else {
        format!("{prefix}/{name}")
    }
}

fn resolve(cwd: &str, path: &str) -> String {
    if path.starts_with('/') {
        path.to_string()
    } else {
        join(cwd, path)
    }
}

fn is_dir(path: &str) -> bool {
    std::fs::metadata(path).is_ok_and(|metadata| metadata.is_dir())
}

/// `text` as unquoted pattern characters.
pub fn unquoted(text: &str) -> Vec<PatternChar> {
    text.chars()
        .map(|c| PatternChar { c, literal: false })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcards_match() {
        assert!(matches(&unquoted("*.rs"), "main.rs"));
        assert!(!matches(&unquoted("*.rs"), "main.rsx"));
        assert!(matches(&unquoted("a?c"), "abc"));
        assert!(matches(&unquoted("[a-c]x"), "bx"));
        assert!(!matches(&unquoted("[!a-c]x"), "bx"));
        assert!(matches(&unquoted("*"), ""));
        let quoted = vec![PatternChar {
            c: '*',
            literal: true,
        }];
        assert!(matches(&quoted, "*") && !matches(&quoted, "x"));
        assert!(!has_wildcards(&quoted));
    }

    #[test]
    fn expansion_lists_matching_files() {
        let dir = std::env::temp_dir().join(format!("clawcage-glob-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("src")).unwrap();
        for name in ["src/a.rs", "src/b.rs", "src/c.txt", "src/.hidden.rs"] {
            std::fs::write(dir.join(name), "").unwrap();
        }
        let cwd = dir.to_string_lossy().into_owned();
        assert_eq!(
            expand(&unquoted("src/*.rs"), &cwd),
            ["src/a.rs", "src/b.rs"]
        );
        assert_eq!(expand(&unquoted("*/c.*"), &cwd), ["src/c.txt"]);
        assert!(expand(&unquoted("*.none"), &cwd).is_empty());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
