//! The start-up step shared by the WASI command programs bundled with clawcage's `exec` tool.
//!
//! wasi-libc starts every program with its current directory at `/`; it does not read `PWD`, and
//! Rust's standard library ignores the host's initial-cwd. The exec shell passes its working
//! directory in `PWD`, so each bundled program calls [`enter_working_directory`] first. wasi-libc's
//! chdir emulation then resolves relative paths (and `..`) from there, inside the preopened
//! workspace; a path leading out is still refused by the host.
//!
//! Also here: exact exit codes, the translation of POSIX regular expressions, and [`walk`], the
//! directory walk of `grep -r` and `find`, which speaks `wasi:filesystem` itself.

pub mod walk;

/// Make `$PWD` the current directory. Does nothing when `PWD` is unset or empty; when it cannot
/// be entered the program says so on stderr and exits with status 1 (running from `/` instead
/// would resolve every relative path wrongly).
pub fn enter_working_directory() {
    let Some(pwd) = std::env::var_os("PWD").filter(|pwd| !pwd.is_empty()) else {
        return;
    };
    if let Err(error) = std::env::set_current_dir(&pwd) {
        let program = std::env::args().next().unwrap_or_default();
        eprintln!(
            "{program}: cannot enter the working directory {}: {error}",
            std::path::Path::new(&pwd).display()
        );
        std::process::exit(1);
    }
}

/// End the program with exit status `code`, exactly: `wasi:cli/exit.exit-with-code` carries any
/// status from 0 to 255 to the shell, where Rust's `std::process::exit` on WASI preview 2 can only
/// say success or failure (every non-zero code became 1). Standard output and error are flushed
/// first. A code outside 0..=255 is reported as 255 (the shell sees only one byte).
pub fn exit(code: i32) -> ! {
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    let status = u8::try_from(code).unwrap_or(u8::MAX);
    #[cfg(all(target_arch = "wasm32", target_os = "wasi"))]
    if status != 0 {
        wasip2::cli::exit::exit_with_code(status);
    }
    std::process::exit(i32::from(status))
}

/// Translate a POSIX basic regular expression (BRE, the default of `grep` and `sed`) into the
/// syntax of the `regex` crate. In a BRE, `\(`, `\)`, `\{`, `\}`, `\|`, `\+` and `\?` are the
/// operators and the bare characters are literals; GNU's `\<` and `\>` become word boundaries.
/// `*` at the start of the expression or of a group is a literal.
pub fn bre_to_regex(pattern: &str) -> String {
    let mut out = String::with_capacity(pattern.len() + 8);
    let mut chars = pattern.chars().peekable();
    // Whether the next character starts an expression or group (where `*` is literal).
    let mut at_start = true;
    let mut in_bracket = false;
    while let Some(c) = chars.next() {
        if in_bracket {
            out.push(c);
            if c == ']' {
                in_bracket = false;
            } else if c == '[' && matches!(chars.peek(), Some(':' | '.' | '=')) {
                // A class such as [:digit:] inside brackets: copy up to its closing `:]`.
                let kind = chars.next().unwrap_or(':');
                out.push(kind);
                while let Some(inner) = chars.next() {
                    out.push(inner);
                    if inner == kind && chars.peek() == Some(&']') {
                        out.push(']');
                        chars.next();
                        break;
                    }
                }
            }
            continue;
        }
        let was_start = at_start;
        at_start = false;
        match c {
            '\\' => match chars.next() {
                Some('(') => {
                    out.push('(');
                    at_start = true;
                }
                Some(')') => out.push(')'),
                Some('{') => out.push('{'),
                Some('}') => out.push('}'),
                Some('|') => {
                    out.push('|');
                    at_start = true;
                }
                Some('+') => out.push('+'),
                Some('?') => out.push('?'),
                Some('<') => out.push_str(r"\b"),
                Some('>') => out.push_str(r"\b"),
                Some(other) => {
                    out.push('\\');
                    out.push(other);
                }
                None => out.push_str(r"\\"),
            },
            '(' | ')' | '{' | '}' | '|' | '+' | '?' => {
                out.push('\\');
                out.push(c);
            }
            '*' if was_start => out.push_str(r"\*"),
            '[' => {
                out.push('[');
                in_bracket = true;
                // `]` right after `[` or `[^` is a literal member.
                if chars.peek() == Some(&'^') {
                    out.push('^');
                    chars.next();
                }
                if chars.peek() == Some(&']') {
                    out.push_str(r"\]");
                    chars.next();
                }
            }
            '^' if was_start => {
                out.push('^');
                at_start = true;
            }
            _ => out.push(c),
        }
    }
    out
}

/// Translate a POSIX extended regular expression (ERE, `grep -E`, `sed -E`) into the syntax of
/// the `regex` crate: the operators are the same; GNU's `\<` and `\>` become word boundaries and
/// a `]` right after `[` or `[^` is a literal member.
pub fn ere_to_regex(pattern: &str) -> String {
    let mut out = String::with_capacity(pattern.len() + 8);
    let mut chars = pattern.chars().peekable();
    let mut in_bracket = false;
    while let Some(c) = chars.next() {
        if in_bracket {
            out.push(c);
            if c == ']' {
                in_bracket = false;
            }
            continue;
        }
        match c {
            '\\' => match chars.next() {
                Some('<' | '>') => out.push_str(r"\b"),
                Some(other) => {
                    out.push('\\');
                    out.push(other);
                }
                None => out.push_str(r"\\"),
            },
            '[' => {
                out.push('[');
                in_bracket = true;
                if chars.peek() == Some(&'^') {
                    out.push('^');
                    chars.next();
                }
                if chars.peek() == Some(&']') {
                    out.push_str(r"\]");
                    chars.next();
                }
            }
            _ => out.push(c),
        }
    }
    out
}

/// Write `result`'s error as `program: message` on stderr when it is not a closed pipe (a reader
/// such as `head` that stopped early is normal), and return the exit status to use.
pub fn report_io(program: &str, result: std::io::Result<()>) -> i32 {
    match result {
        Ok(()) => 0,
        Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => 0,
        Err(error) => {
            eprintln!("{program}: {error}");
            2
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_regular_expressions_translate() {
        assert_eq!(bre_to_regex(r"foo\|bar"), "foo|bar");
        assert_eq!(bre_to_regex(r"\(ab\)*c"), "(ab)*c");
        assert_eq!(bre_to_regex("a+b?(c)|{d}"), r"a\+b\?\(c\)\|\{d\}");
        assert_eq!(bre_to_regex(r"a\{2,3\}"), "a{2,3}");
        assert_eq!(bre_to_regex("*star"), r"\*star");
        assert_eq!(bre_to_regex("^*x"), r"^\*x");
        assert_eq!(bre_to_regex(r"\<word\>"), r"\bword\b");
        assert_eq!(bre_to_regex("[]a]"), r"[\]a]");
        assert_eq!(bre_to_regex("[^]a]"), r"[^\]a]");
        assert_eq!(bre_to_regex("[[:digit:]]+"), r"[[:digit:]]\+");
        assert_eq!(bre_to_regex("a.b$"), "a.b$");
        assert_eq!(bre_to_regex(r"1\.5"), r"1\.5");
    }

    #[test]
    fn extended_regular_expressions_translate() {
        assert_eq!(ere_to_regex("(a|b)+"), "(a|b)+");
        assert_eq!(ere_to_regex(r"\<w\>"), r"\bw\b");
        assert_eq!(ere_to_regex("[]x]"), r"[\]x]");
    }
}
