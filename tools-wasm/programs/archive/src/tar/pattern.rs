//! Shell patterns for `tar --exclude`, matched the way GNU tar matches exclusions by default:
//! `*` and `?` may match `/`, `[...]` is a class, and the pattern may match any run of whole
//! components of a name (`node_modules` excludes `a/node_modules/b`).

/// Whether `pattern` excludes `name`.
pub fn excludes(pattern: &str, name: &str) -> bool {
    let name = name.trim_end_matches('/');
    let starts = std::iter::once(0).chain(name.match_indices('/').map(|(at, _)| at + 1));
    let starts: Vec<usize> = starts.collect();
    let ends: Vec<usize> = name
        .match_indices('/')
        .map(|(at, _)| at)
        .chain(std::iter::once(name.len()))
        .collect();
    starts.iter().any(|&start| {
        ends.iter()
            .filter(|&&end| end >= start)
            .any(|&end| glob(pattern.as_bytes(), &name.as_bytes()[start..end]))
    })
}

/// Whether the whole of `text` matches `pattern`.
fn glob(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    // Where to resume after the last `*`: the pattern position after it and the text position.
    let mut resume: Option<(usize, usize)> = None;
    while t < text.len() {
        let step = match pattern.get(p) {
            Some(b'*') => {
                resume = Some((p + 1, t));
                p += 1;
                continue;
            }
            Some(b'?') => Some(p + 1),
            Some(b'[') => class_match(pattern, p, text[t]),
            Some(b'\\') if p + 1 < pattern.len() => (pattern[p + 1] == text[t]).then_some(p + 2),
            Some(&literal) => (literal == text[t]).then_some(p + 1),
            None => None,
        };
        match step {
            Some(next) => {
                p = next;
                t += 1;
            }
            None => match resume {
                Some((after_star, star_text)) => {
                    p = after_star;
                    t = star_text + 1;
                    resume = Some((after_star, star_text + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|&byte| byte == b'*')
}

/// Matches `byte` against the class starting at `pattern[open]` (`[`); the pattern position
/// after the class when it matches. A class without its `]` matches a literal `[`.
fn class_match(pattern: &[u8], open: usize, byte: u8) -> Option<usize> {
    let mut index = open + 1;
    let negated = matches!(pattern.get(index), Some(b'!' | b'^'));
    if negated {
        index += 1;
    }
    let mut matched = false;
    let mut first = true;
    loop {
        let current = *pattern.get(index)?;
        if current == b']' && !first {
            break;
        }
        first = false;
        if pattern.get(index + 1) == Some(&b'-')
            && pattern.get(index + 2).is_some_and(|&end| end != b']')
        {
            let end = pattern[index + 2];
            matched |= (current..=end).contains(&byte);
            index += 3;
        } else {
            matched |= current == byte;
            index += 1;
        }
    }
    (matched != negated).then_some(index + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_whole_component_runs() {
        assert!(excludes("node_modules", "a/node_modules/b.js"));
        assert!(excludes("node_modules", "node_modules/"));
        assert!(!excludes("node_modules", "a/node_modules_old/b"));
        assert!(excludes("*.log", "dir/x.log"));
        assert!(!excludes("*.log", "dir/x.logs"));
        assert!(excludes("a/b", "x/a/b/c"));
        assert!(excludes("?.txt", "d/a.txt"));
        assert!(!excludes("?.txt", "d/ab.txt"));
        assert!(excludes("[ab].c", "b.c"));
        assert!(!excludes("[!ab].c", "b.c"));
        assert!(excludes("*", "anything/at/all"));
    }
}
