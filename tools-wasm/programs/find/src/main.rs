//! `find` for clawcage's exec: walks the given directories (default `.`) and prints every path
//! for which the expression is true. Tests: `-name`, `-iname`, `-path`/`-wholename`, `-ipath`,
//! `-type f|d|l`, `-mtime`, `-mmin`, `-newer`, `-size`, `-empty`, `-true`, `-false`; operators
//! `!`/`-not`, `-a`/`-and` (also implied), `-o`/`-or`, `( )`; options `-maxdepth`, `-mindepth`;
//! actions `-print`, `-print0`, `-delete`, `-prune`, `-quit`. `-exec` and other ways of starting
//! processes do not exist here: pipe the paths into the next program instead.

use std::io::{self, BufWriter, Write};
use std::time::{Duration, SystemTime};

use clawcage_program_support::walk::{Entry, WalkOptions, Walker};
use clawcage_program_support::{enter_working_directory, report_io};
use globset::{GlobBuilder, GlobMatcher};

/// A comparison with a number: `+N` more than, `-N` less than, `N` exactly.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Compare {
    More(u64),
    Less(u64),
    Exactly(u64),
}

impl Compare {
    fn parse(text: &str) -> Option<Compare> {
        if let Some(rest) = text.strip_prefix('+') {
            rest.parse().ok().map(Compare::More)
        } else if let Some(rest) = text.strip_prefix('-') {
            rest.parse().ok().map(Compare::Less)
        } else {
            text.parse().ok().map(Compare::Exactly)
        }
    }

    fn holds(self, value: u64) -> bool {
        match self {
            Compare::More(n) => value > n,
            Compare::Less(n) => value < n,
            Compare::Exactly(n) => value == n,
        }
    }
}

/// A `-name` pattern. The common shapes, `*.rs` and `Makefile`, are compared as text: the same
/// answers as the glob, without building a candidate path for every entry.
#[derive(Debug)]
enum NamePattern {
    /// `*` and then text without wildcards: the names that end with the text.
    Suffix(String),
    /// Text without wildcards: that name.
    Exact(String),
    /// Any other pattern.
    Glob(GlobMatcher),
}

impl NamePattern {
    /// `pattern` as a suffix or a name, when it has no other wildcard than a leading `*` (and no
    /// character that starts a class, an alternation or an escape).
    fn plain(pattern: &str) -> Option<NamePattern> {
        let literal = |text: &str| {
            !text
                .chars()
                .any(|c| matches!(c, '*' | '?' | '[' | ']' | '{' | '}' | '\\'))
        };
        match pattern.strip_prefix('*') {
            Some(suffix) if literal(suffix) => Some(NamePattern::Suffix(suffix.to_string())),
            None if literal(pattern) => Some(NamePattern::Exact(pattern.to_string())),
            _ => None,
        }
    }

    fn is_match(&self, name: &str) -> bool {
        match self {
            NamePattern::Suffix(suffix) => name.ends_with(suffix.as_str()),
            NamePattern::Exact(exact) => name == exact,
            NamePattern::Glob(glob) => glob.is_match(name),
        }
    }
}

#[derive(Debug)]
enum Expr {
    Name(NamePattern),
    Path(GlobMatcher),
    Type(char),
    /// Age in units of `unit` seconds, rounded down (`-mtime`: days, `-mmin`: minutes).
    Age {
        compare: Compare,
        unit: u64,
    },
    Newer(SystemTime),
    /// Size in units of `unit` bytes, rounded up.
    Size {
        compare: Compare,
        unit: u64,
    },
    Empty,
    Constant(bool),
    Print,
    Print0,
    Delete,
    Prune,
    Quit,
    Not(Box<Expr>),
    And(Box<Expr>, Box<Expr>),
    Or(Box<Expr>, Box<Expr>),
}

impl Expr {
    fn has_action(&self) -> bool {
        match self {
            Expr::Print | Expr::Print0 | Expr::Delete | Expr::Quit => true,
            Expr::Not(inner) => inner.has_action(),
            Expr::And(a, b) | Expr::Or(a, b) => a.has_action() || b.has_action(),
            _ => false,
        }
    }
}

struct Parser {
    args: Vec<String>,
    position: usize,
    max_depth: Option<usize>,
    min_depth: usize,
    now: SystemTime,
}

impl Parser {
    fn next(&mut self) -> Option<String> {
        let arg = self.args.get(self.position).cloned();
        self.position += 1;
        arg
    }

    fn peek(&self) -> Option<&str> {
        self.args.get(self.position).map(String::as_str)
    }

    fn value(&mut self, flag: &str) -> Result<String, String> {
        self.next()
            .ok_or_else(|| format!("missing argument to `{flag}'"))
    }

    fn or(&mut self) -> Result<Expr, String> {
        let mut left = self.and()?;
        while matches!(self.peek(), Some("-o" | "-or")) {
            self.position += 1;
            let right = self.and()?;
            left = Expr::Or(Box::new(left), Box::new(right));
        }
        Ok(left)
    }

    fn and(&mut self) -> Result<Expr, String> {
        let mut left = self.not()?;
        loop {
            match self.peek() {
                None | Some("-o" | "-or" | ")") => return Ok(left),
                Some("-a" | "-and") => self.position += 1,
                _ => {}
            }
            let right = self.not()?;
            left = Expr::And(Box::new(left), Box::new(right));
        }
    }

    fn not(&mut self) -> Result<Expr, String> {
        if matches!(self.peek(), Some("!" | "-not")) {
            self.position += 1;
            return Ok(Expr::Not(Box::new(self.not()?)));
        }
        self.primary()
    }

    fn primary(&mut self) -> Result<Expr, String> {
        let Some(token) = self.next() else {
            return Err("expected an expression".to_string());
        };
        let glob = |pattern: &str, case_insensitive: bool| {
            GlobBuilder::new(pattern)
                .literal_separator(false)
                .backslash_escape(true)
                .case_insensitive(case_insensitive)
                .build()
                .map(|glob| glob.compile_matcher())
                .map_err(|error| format!("invalid pattern '{pattern}': {error}"))
        };
        Ok(match token.as_str() {
            "(" => {
                let inner = self.or()?;
                if self.next().as_deref() != Some(")") {
                    return Err("missing `)'".to_string());
                }
                inner
            }
            "-name" => {
                let pattern = self.value("-name")?;
                Expr::Name(match NamePattern::plain(&pattern) {
                    Some(plain) => plain,
                    None => NamePattern::Glob(glob(&pattern, false)?),
                })
            }
            "-iname" => Expr::Name(NamePattern::Glob(glob(&self.value("-iname")?, true)?)),
            "-path" | "-wholename" => Expr::Path(glob(&self.value(&token)?, false)?),
            "-ipath" | "-iwholename" => Expr::Path(glob(&self.value(&token)?, true)?),
            "-type" => {
                let kind = self.value("-type")?;
                match kind.as_str() {
                    "f" | "d" | "l" => Expr::Type(kind.chars().next().unwrap_or('f')),
                    other => {
                        return Err(format!(
                            "unknown argument to -type: {other} (use f, d or l)"
                        ));
                    }
                }
            }
            "-mtime" | "-mmin" => {
                let text = self.value(&token)?;
                let compare = Compare::parse(&text)
                    .ok_or_else(|| format!("invalid argument `{text}' to `{token}'"))?;
                let unit = if token == "-mtime" { 86_400 } else { 60 };
                Expr::Age { compare, unit }
            }
            "-newer" => {
                let reference = self.value("-newer")?;
                let modified = std::fs::metadata(&reference)
                    .and_then(|metadata| metadata.modified())
                    .map_err(|error| format!("{reference}: {error}"))?;
                Expr::Newer(modified)
            }
            "-size" => {
                let text = self.value("-size")?;
                let (number, unit) = match text.chars().last() {
                    Some('c') => (&text[..text.len() - 1], 1),
                    Some('w') => (&text[..text.len() - 1], 2),
                    Some('b') => (&text[..text.len() - 1], 512),
                    Some('k') => (&text[..text.len() - 1], 1024),
                    Some('M') => (&text[..text.len() - 1], 1 << 20),
                    Some('G') => (&text[..text.len() - 1], 1 << 30),
                    _ => (text.as_str(), 512),
                };
                let compare = Compare::parse(number)
                    .ok_or_else(|| format!("invalid argument `{text}' to `-size'"))?;
                Expr::Size { compare, unit }
            }
            "-empty" => Expr::Empty,
            "-true" => Expr::Constant(true),
            "-false" => Expr::Constant(false),
            "-print" => Expr::Print,
            "-print0" => Expr::Print0,
            "-delete" => Expr::Delete,
            "-prune" => Expr::Prune,
            "-quit" => Expr::Quit,
            "-maxdepth" | "-mindepth" => {
                let text = self.value(&token)?;
                let depth: usize = text
                    .parse()
                    .map_err(|_| format!("invalid argument `{text}' to `{token}'"))?;
                if token == "-maxdepth" {
                    self.max_depth = Some(depth);
                } else {
                    self.min_depth = depth;
                }
                Expr::Constant(true)
            }
            "-exec" | "-execdir" | "-ok" | "-okdir" => {
                return Err(format!(
                    "{token} is not available: a program cannot start other programs here. \
                     Pipe the paths into a loop instead, e.g. \
                     find . -name '*.tmp' | while read -r f; do rm \"$f\"; done (or use -delete)"
                ));
            }
            other => return Err(format!("unknown predicate `{other}'")),
        })
    }
}

/// What evaluating the expression for the entries of a walk writes and remembers.
struct Evaluator<'a> {
    out: &'a mut BufWriter<io::StdoutLock<'static>>,
    now: SystemTime,
    failed: bool,
    quit: bool,
}

impl Evaluator<'_> {
    /// Evaluates `expr` for one entry, the one `walker` yielded last; `prune` is set when
    /// `-prune` was true.
    fn eval(
        &mut self,
        expr: &Expr,
        entry: &Entry,
        walker: &mut Walker,
        shown: &str,
        prune: &mut bool,
    ) -> io::Result<bool> {
        Ok(match expr {
            // A starting point's name is its last component as written (the whole of `.`).
            Expr::Name(pattern) => pattern.is_match(&entry.file_name().to_string_lossy()),
            Expr::Path(glob) => glob.is_match(shown),
            Expr::Type(kind) => match kind {
                'd' => entry.is_dir(),
                'l' => entry.is_symlink(),
                _ => entry.is_file(),
            },
            Expr::Age { compare, unit } => {
                match walker
                    .metadata(entry)
                    .ok()
                    .map(|metadata| metadata.modified)
                {
                    Some(modified) => {
                        let age = self
                            .now
                            .duration_since(modified)
                            .unwrap_or(Duration::ZERO)
                            .as_secs();
                        compare.holds(age / unit)
                    }
                    None => false,
                }
            }
            Expr::Newer(reference) => walker
                .metadata(entry)
                .is_ok_and(|metadata| metadata.modified > *reference),
            Expr::Size { compare, unit } => match walker.metadata(entry) {
                Ok(metadata) => compare.holds(metadata.len.div_ceil(*unit)),
                Err(_) => false,
            },
            Expr::Empty => {
                if entry.is_dir() {
                    walker.is_empty_dir(entry).unwrap_or(false)
                } else {
                    walker
                        .metadata(entry)
                        .is_ok_and(|metadata| metadata.len == 0)
                }
            }
            Expr::Constant(value) => *value,
            Expr::Print => {
                self.out.write_all(shown.as_bytes())?;
                self.out.write_all(b"\n")?;
                true
            }
            Expr::Print0 => {
                self.out.write_all(shown.as_bytes())?;
                self.out.write_all(b"\0")?;
                true
            }
            Expr::Delete => {
                let result = if entry.is_dir() {
                    std::fs::remove_dir(entry.path())
                } else {
                    std::fs::remove_file(entry.path())
                };
                match result {
                    Ok(()) => true,
                    Err(error) => {
                        eprintln!("find: cannot delete '{shown}': {error}");
                        self.failed = true;
                        false
                    }
                }
            }
            Expr::Prune => {
                *prune = true;
                true
            }
            Expr::Quit => {
                self.quit = true;
                true
            }
            Expr::Not(inner) => !self.eval(inner, entry, walker, shown, prune)?,
            Expr::And(a, b) => {
                self.eval(a, entry, walker, shown, prune)?
                    && self.eval(b, entry, walker, shown, prune)?
            }
            Expr::Or(a, b) => {
                self.eval(a, entry, walker, shown, prune)?
                    || self.eval(b, entry, walker, shown, prune)?
            }
        })
    }
}

fn main() {
    enter_working_directory();
    let args: Vec<String> = std::env::args().skip(1).collect();
    clawcage_program_support::exit(run(args));
}

fn run(args: Vec<String>) -> i32 {
    // Starting points come first, up to the first argument that starts an expression.
    let split = args
        .iter()
        .position(|arg| arg.starts_with('-') && arg.len() > 1 || arg == "!" || arg == "(")
        .unwrap_or(args.len());
    let mut roots: Vec<String> = args[..split].to_vec();
    if roots.is_empty() {
        roots.push(".".to_string());
    }
    let mut parser = Parser {
        args: args[split..].to_vec(),
        position: 0,
        max_depth: None,
        min_depth: 0,
        now: SystemTime::now(),
    };
    let parsed = if parser.args.is_empty() {
        Ok(Expr::Constant(true))
    } else {
        parser.or().and_then(|expr| match parser.peek() {
            None => Ok(expr),
            Some(extra) => Err(format!("unexpected `{extra}'")),
        })
    };
    let expr = match parsed {
        Ok(expr) if expr.has_action() => expr,
        Ok(expr) => Expr::And(Box::new(expr), Box::new(Expr::Print)),
        Err(message) => {
            eprintln!("find: {message}");
            return 1;
        }
    };
    let deletes = contains_delete(&expr);
    let mut out = BufWriter::with_capacity(64 << 10, io::stdout().lock());
    let mut evaluator = Evaluator {
        out: &mut out,
        now: parser.now,
        failed: false,
        quit: false,
    };
    let result = (|| -> io::Result<()> {
        for root in &roots {
            let options = WalkOptions {
                min_depth: parser.min_depth,
                max_depth: parser.max_depth.unwrap_or(usize::MAX),
                // -delete removes a directory's contents before the directory itself.
                contents_first: deletes,
            };
            let mut walker = Walker::new(root, options);
            while let Some(entry) = walker.next() {
                let entry = match entry {
                    Ok(entry) => entry,
                    Err(error) => {
                        let error_text = error.io_error();
                        let reason = match error_text.kind() {
                            io::ErrorKind::NotFound => "No such file or directory".to_string(),
                            _ => error_text.to_string(),
                        };
                        eprintln!("find: '{}': {reason}", error.path().display());
                        evaluator.failed = true;
                        continue;
                    }
                };
                let shown = entry.path().to_string_lossy();
                let mut prune = false;
                evaluator.eval(&expr, &entry, &mut walker, &shown, &mut prune)?;
                if evaluator.quit {
                    return Ok(());
                }
                if prune && entry.is_dir() && !deletes {
                    walker.skip_current_dir();
                }
            }
        }
        Ok(())
    })();
    let failed = evaluator.failed;
    let flushed = result.and_then(|()| out.flush());
    let status = report_io("find", flushed);
    if status != 0 || failed { 1 } else { 0 }
}

fn contains_delete(expr: &Expr) -> bool {
    match expr {
        Expr::Delete => true,
        Expr::Not(inner) => contains_delete(inner),
        Expr::And(a, b) | Expr::Or(a, b) => contains_delete(a) || contains_delete(b),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Expr, String> {
        let mut parser = Parser {
            args: args.iter().map(|arg| arg.to_string()).collect(),
            position: 0,
            max_depth: None,
            min_depth: 0,
            now: SystemTime::now(),
        };
        parser.or()
    }

    #[test]
    fn plain_name_patterns_answer_as_the_glob_does() {
        let names = [
            "main.rs", ".rs", "rs", "a.rs.bak", "Makefile", "makefile", ".hidden", "x", "a b.rs",
            "café.rs", "*.rs", "",
        ];
        for pattern in [
            "*.rs", "*", "Makefile", ".hidden", "*rs", "*.RS", "a b.rs", "*é.rs", "", "x",
        ] {
            let plain = NamePattern::plain(pattern).unwrap();
            let glob = GlobBuilder::new(pattern)
                .literal_separator(false)
                .backslash_escape(true)
                .build()
                .unwrap()
                .compile_matcher();
            for name in names {
                assert_eq!(
                    plain.is_match(name),
                    glob.is_match(name),
                    "{pattern} on {name}"
                );
            }
        }
        for pattern in ["*.[ch]", "a?c", "*.{rs,toml}", "\\*x", "**.rs", "x*", "a]"] {
            assert!(NamePattern::plain(pattern).is_none(), "{pattern}");
        }
    }

    #[test]
    fn comparisons_parse() {
        assert_eq!(Compare::parse("+3"), Some(Compare::More(3)));
        assert_eq!(Compare::parse("-1"), Some(Compare::Less(1)));
        assert_eq!(Compare::parse("0"), Some(Compare::Exactly(0)));
        assert_eq!(Compare::parse("x"), None);
        assert!(Compare::More(3).holds(4) && !Compare::More(3).holds(3));
    }

    #[test]
    fn expressions_parse_with_precedence() {
        let expr = parse(&["-name", "*.rs", "-o", "-type", "d", "-a", "!", "-empty"]).unwrap();
        assert!(matches!(expr, Expr::Or(_, _)));
        assert!(parse(&["(", "-name", "a"]).is_err());
        assert!(parse(&["-type", "x"]).is_err());
        assert!(
            parse(&["-exec", "rm", "{}", ";"])
                .unwrap_err()
                .contains("not available")
        );
        assert!(parse(&["-bogus"]).is_err());
        assert!(!parse(&["-name", "a"]).unwrap().has_action());
        assert!(parse(&["-name", "a", "-print"]).unwrap().has_action());
    }
}
