//! `grep` for clawcage's exec: prints the lines of files (or standard input) that match a
//! regular expression. Supports the options models use most: `-r`/`-R`, `-n`, `-i`, `-l`, `-L`,
//! `-v`, `-c`, `-E`, `-F`, `-G`, `-w`, `-x`, `-o`, `-q`, `-s`, `-h`, `-H`, `-m N`, `-e PATTERN`,
//! `-A/-B/-C N`, `--include=GLOB`, `--exclude=GLOB`, `--exclude-dir=GLOB`. Basic regular
//! expressions (the default) are translated to the `regex` crate's syntax. Exit status: 0 when a
//! line was selected, 1 when none was, 2 on error (WASI reports every failure as 1). It is one file
//! (over 700 lines) because it is one small program: the options, the pattern built from them and
//! the `Searcher` that walks the files and prints what matches share one `Options`.

use std::io::{self, BufWriter, Read, Write};
use std::path::Path;

use clawcage_program_support::walk::{WalkOptions, Walker};
use clawcage_program_support::{bre_to_regex, enter_working_directory, ere_to_regex};
use globset::{Glob, GlobSet, GlobSetBuilder};
use regex::bytes::{Regex, RegexBuilder};

const USAGE: &str = "usage: grep [-rnilLvcEFGwxoqshH] [-m N] [-A N] [-B N] [-C N] [-e PATTERN]... \
[--include=GLOB] [--exclude=GLOB] [--exclude-dir=GLOB] PATTERN [FILE...]";

#[derive(Default)]
struct Options {
    patterns: Vec<String>,
    syntax: Syntax,
    recursive: bool,
    line_numbers: bool,
    ignore_case: bool,
    files_with_matches: bool,
    files_without_match: bool,
    invert: bool,
    count: bool,
    word: bool,
    whole_line: bool,
    only_matching: bool,
    quiet: bool,
    no_messages: bool,
    with_filename: Option<bool>,
    max_count: Option<u64>,
    after: usize,
    before: usize,
    include: Vec<String>,
    exclude: Vec<String>,
    exclude_dir: Vec<String>,
    operands: Vec<String>,
}

#[derive(Default, Clone, Copy, PartialEq)]
enum Syntax {
    #[default]
    Basic,
    Extended,
    Fixed,
}

fn main() {
    enter_working_directory();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let options = match parse(args) {
        Ok(options) => options,
        Err(message) => {
            eprintln!("grep: {message}\n{USAGE}");
            clawcage_program_support::exit(2);
        }
    };
    clawcage_program_support::exit(run(options));
}

fn parse(args: Vec<String>) -> Result<Options, String> {
    let mut options = Options::default();
    let mut explicit_pattern = false;
    let mut iter = args.into_iter();
    let mut only_operands = false;
    fn number(value: Option<String>, flag: &str) -> Result<usize, String> {
        let value = value.ok_or_else(|| format!("option {flag} needs a number"))?;
        value
            .parse()
            .map_err(|_| format!("invalid number for {flag}: '{value}'"))
    }
    while let Some(arg) = iter.next() {
        if only_operands || arg == "-" || !arg.starts_with('-') {
            options.operands.push(arg);
            continue;
        }
        if arg == "--" {
            only_operands = true;
            continue;
        }
        if let Some(long) = arg.strip_prefix("--") {
            let (name, value) = match long.split_once('=') {
                Some((name, value)) => (name, Some(value.to_string())),
                None => (long, None),
            };
            let mut value_or_next = || value.clone().or_else(|| iter.next());
            match name {
                "recursive" | "dereference-recursive" => options.recursive = true,
                "line-number" => options.line_numbers = true,
                "ignore-case" => options.ignore_case = true,
                "files-with-matches" => options.files_with_matches = true,
                "files-without-match" => options.files_without_match = true,
                "invert-match" => options.invert = true,
                "count" => options.count = true,
                "extended-regexp" => options.syntax = Syntax::Extended,
                "fixed-strings" => options.syntax = Syntax::Fixed,
                "basic-regexp" => options.syntax = Syntax::Basic,
                "word-regexp" => options.word = true,
                "line-regexp" => options.whole_line = true,
                "only-matching" => options.only_matching = true,
                "quiet" | "silent" => options.quiet = true,
                "no-messages" => options.no_messages = true,
                "with-filename" => options.with_filename = Some(true),
                "no-filename" => options.with_filename = Some(false),
                "color" | "colour" | "binary-files" => {}
                "include" => options
                    .include
                    .push(value_or_next().ok_or("--include needs a glob")?),
                "exclude" => options
                    .exclude
                    .push(value_or_next().ok_or("--exclude needs a glob")?),
                "exclude-dir" => options
                    .exclude_dir
                    .push(value_or_next().ok_or("--exclude-dir needs a glob")?),
                "regexp" => {
                    options
                        .patterns
                        .push(value_or_next().ok_or("--regexp needs a pattern")?);
                    explicit_pattern = true;
                }
                "max-count" => {
                    options.max_count = Some(number(value_or_next(), "--max-count")? as u64)
                }
                "after-context" => options.after = number(value_or_next(), "--after-context")?,
                "before-context" => options.before = number(value_or_next(), "--before-context")?,
                "context" => {
                    let n = number(value_or_next(), "--context")?;
                    options.after = n;
                    options.before = n;
                }
                _ => return Err(format!("unknown option '--{name}'")),
            }
            continue;
        }
        let flags: Vec<char> = arg[1..].chars().collect();
        let mut index = 0;
        while index < flags.len() {
            let flag = flags[index];
            index += 1;
            // Options that take a value use the rest of this argument or the next one.
            let mut take_value = |index: &mut usize| -> Option<String> {
                let rest: String = flags[*index..].iter().collect();
                *index = flags.len();
                if rest.is_empty() {
                    iter.next()
                } else {
                    Some(rest)
                }
            };
            match flag {
                'r' | 'R' => options.recursive = true,
                'n' => options.line_numbers = true,
                'i' | 'y' => options.ignore_case = true,
                'l' => options.files_with_matches = true,
                'L' => options.files_without_match = true,
                'v' => options.invert = true,
                'c' => options.count = true,
                'E' => options.syntax = Syntax::Extended,
                'F' => options.syntax = Syntax::Fixed,
                'G' => options.syntax = Syntax::Basic,
                'P' => options.syntax = Syntax::Extended,
                'w' => options.word = true,
                'x' => options.whole_line = true,
                'o' => options.only_matching = true,
                'q' => options.quiet = true,
                's' => options.no_messages = true,
                'h' => options.with_filename = Some(false),
                'H' => options.with_filename = Some(true),
                'I' | 'a' | 'U' => {}
                'e' => {
                    options
                        .patterns
                        .push(take_value(&mut index).ok_or("option -e needs a pattern")?);
                    explicit_pattern = true;
                }
                'm' => options.max_count = Some(number(take_value(&mut index), "-m")? as u64),
                'A' => options.after = number(take_value(&mut index), "-A")?,
                'B' => options.before = number(take_value(&mut index), "-B")?,
                'C' => {
                    let n = number(take_value(&mut index), "-C")?;
                    options.after = n;
                    options.before = n;
                }
                digit if digit.is_ascii_digit() => {
                    let rest: String = flags[index - 1..].iter().collect();
                    index = flags.len();
                    let n = rest
                        .parse()
                        .map_err(|_| format!("invalid context length '-{rest}'"))?;
                    options.after = n;
                    options.before = n;
                }
                other => return Err(format!("unknown option '-{other}'")),
            }
        }
    }
    if !explicit_pattern {
        if options.operands.is_empty() {
            return Err("no pattern given".to_string());
        }
        options.patterns.push(options.operands.remove(0));
    }
    Ok(options)
}

/// The patterns in the `regex` crate's syntax: each -e, and each line of a pattern, is one
/// alternative.
fn alternatives(options: &Options) -> Vec<String> {
    options
        .patterns
        .iter()
        .flat_map(|pattern| pattern.split('\n'))
        .map(|pattern| match options.syntax {
            Syntax::Basic => bre_to_regex(pattern),
            Syntax::Extended => ere_to_regex(pattern),
            Syntax::Fixed => regex::escape(pattern),
        })
        .collect()
}

/// Whether every line that matches on its own also has a match that starts in it when the
/// whole file is searched (`^`, `$` and `\b` behave the same at a newline as at the ends of a
/// line). Not so with the absolute anchors `\A` and `\z` or inline flags such as `(?-m)`, so
/// those patterns are matched line by line.
fn matches_start_in_their_line(options: &Options) -> bool {
    alternatives(options).iter().all(|alternative| {
        !(alternative.contains("(?") || alternative.contains(r"\A") || alternative.contains(r"\z"))
    })
}

fn build_regex(options: &Options) -> Result<Regex, String> {
    let alternatives = alternatives(options);
    let mut joined = alternatives
        .iter()
        .map(|alternative| format!("(?:{alternative})"))
        .collect::<Vec<_>>()
        .join("|");
    if options.whole_line {
        joined = format!("^(?:{joined})$");
    } else if options.word {
        joined = format!(r"\b(?:{joined})\b");
    }
    RegexBuilder::new(&joined)
        .case_insensitive(options.ignore_case)
        .multi_line(true)
        .unicode(true)
        .size_limit(64 << 20)
        .build()
        .map_err(|error| format!("invalid regular expression: {error}"))
}

fn glob_set(globs: &[String]) -> Result<Option<GlobSet>, String> {
    if globs.is_empty() {
        return Ok(None);
    }
    let mut builder = GlobSetBuilder::new();
    for glob in globs {
        builder.add(Glob::new(glob).map_err(|error| format!("invalid glob '{glob}': {error}"))?);
    }
    builder
        .build()
        .map(Some)
        .map_err(|error| format!("invalid globs: {error}"))
}

/// The options one search reads, copied so that the searcher can write while reading them.
#[derive(Clone, Copy)]
struct SearchFlags {
    invert: bool,
    files_with_matches: bool,
    files_without_match: bool,
    count: bool,
    quiet: bool,
    only_matching: bool,
    max_count: Option<u64>,
    before: usize,
    after: usize,
}

impl SearchFlags {
    fn of(options: &Options) -> SearchFlags {
        SearchFlags {
            invert: options.invert,
            files_with_matches: options.files_with_matches,
            files_without_match: options.files_without_match,
            count: options.count,
            quiet: options.quiet,
            only_matching: options.only_matching,
            max_count: options.max_count,
            before: options.before,
            after: options.after,
        }
    }
}

/// One run's search: the options, the compiled patterns, where the output goes, what happened.
struct Searcher<W: Write> {
    options: Options,
    regex: Regex,
    include: Option<GlobSet>,
    exclude: Option<GlobSet>,
    exclude_dir: Option<GlobSet>,
    show_names: bool,
    out: BufWriter<W>,
    matched_any: bool,
    had_error: bool,
    /// The buffer every file is read into, kept between files.
    buffer: Vec<u8>,
    /// Whether lines are found by searching the whole file (see [`Searcher::search_by_matches`]).
    by_matches: bool,
}

fn run(options: Options) -> i32 {
    let regex = match build_regex(&options) {
        Ok(regex) => regex,
        Err(message) => {
            eprintln!("grep: {message}");
            return 2;
        }
    };
    let (include, exclude, exclude_dir) = match (
        glob_set(&options.include),
        glob_set(&options.exclude),
        glob_set(&options.exclude_dir),
    ) {
        (Ok(a), Ok(b), Ok(c)) => (a, b, c),
        (Err(message), _, _) | (_, Err(message), _) | (_, _, Err(message)) => {
            eprintln!("grep: {message}");
            return 2;
        }
    };
    let mut operands = options.operands.clone();
    let implicit_dot = operands.is_empty() && options.recursive;
    if operands.is_empty() {
        operands.push(if options.recursive {
            ".".into()
        } else {
            "-".into()
        });
    }
    let show_names = options
        .with_filename
        .unwrap_or(options.recursive || operands.len() > 1);
    let by_matches = !options.invert
        && !options.only_matching
        && options.before == 0
        && options.after == 0
        && matches_start_in_their_line(&options);
    let mut searcher = Searcher {
        by_matches,
        options,
        regex,
        include,
        exclude,
        exclude_dir,
        show_names,
        out: BufWriter::with_capacity(64 << 10, io::stdout().lock()),
        matched_any: false,
        had_error: false,
        buffer: Vec::new(),
    };
    let result = (|| -> io::Result<()> {
        for operand in &operands {
            if searcher.options.quiet && searcher.matched_any {
                break;
            }
            searcher.operand(operand, implicit_dot)?;
        }
        searcher.out.flush()
    })();
    if let Err(error) = result {
        if error.kind() == io::ErrorKind::BrokenPipe {
            return if searcher.matched_any { 0 } else { 1 };
        }
        eprintln!("grep: {error}");
        return 2;
    }
    if searcher.had_error && !(searcher.options.quiet && searcher.matched_any) {
        2
    } else if searcher.matched_any {
        0
    } else {
        1
    }
}

impl<W: Write> Searcher<W> {
    fn warn(&mut self, message: String) {
        self.had_error = true;
        if !self.options.no_messages {
            eprintln!("grep: {message}");
        }
    }

    fn operand(&mut self, operand: &str, implicit_dot: bool) -> io::Result<()> {
        if operand == "-" {
            let mut data = Vec::new();
            if let Err(error) = io::stdin().lock().read_to_end(&mut data) {
                self.warn(format!("(standard input): {error}"));
                return Ok(());
            }
            return self.search("(standard input)", &data);
        }
        let path = Path::new(operand);
        let metadata = match std::fs::metadata(path) {
            Ok(metadata) => metadata,
            Err(error) => {
                self.warn(format!("{operand}: {}", describe(&error)));
                return Ok(());
            }
        };
        if !metadata.is_dir() {
            return self.file(path, operand);
        }
        if !self.options.recursive {
            self.warn(format!("{operand}: Is a directory"));
            return Ok(());
        }
        let mut walker = Walker::new(operand, WalkOptions::default());
        while let Some(entry) = walker.next() {
            let entry = match entry {
                Ok(entry) => entry,
                Err(error) => {
                    self.warn(format!(
                        "{}: {}",
                        error.path().display(),
                        describe(error.io_error())
                    ));
                    continue;
                }
            };
            let name = entry.file_name().to_string_lossy();
            if entry.is_dir() {
                if entry.depth() > 0
                    && self
                        .exclude_dir
                        .as_ref()
                        .is_some_and(|set| set.is_match(name.as_ref()))
                {
                    walker.skip_current_dir();
                }
                continue;
            }
            if !entry.is_file() {
                continue;
            }
            if let Some(include) = &self.include
                && !include.is_match(name.as_ref())
            {
                continue;
            }
            if self
                .exclude
                .as_ref()
                .is_some_and(|set| set.is_match(name.as_ref()))
            {
                continue;
            }
            let path = if implicit_dot {
                entry.path().strip_prefix(".").unwrap_or(entry.path())
            } else {
                entry.path()
            };
            let shown = path.to_string_lossy();
            match walker.read_file(&entry) {
                Ok(data) => self.search(&shown, &data)?,
                Err(error) => self.warn(format!("{shown}: {}", describe(&error))),
            }
            if self.options.quiet && self.matched_any {
                break;
            }
        }
        Ok(())
    }

    /// Reads the file named on the command line at `path` into the kept buffer and searches it.
    fn file(&mut self, path: &Path, shown: &str) -> io::Result<()> {
        let mut data = std::mem::take(&mut self.buffer);
        data.clear();
        let read = std::fs::File::open(path).and_then(|file| read_whole(file, &mut data));
        let searched = match read {
            Ok(_) => self.search(shown, &data),
            Err(error) => {
                self.warn(format!("{shown}: {}", describe(&error)));
                Ok(())
            }
        };
        self.buffer = data;
        searched
    }

    fn search(&mut self, name: &str, data: &[u8]) -> io::Result<()> {
        let options = SearchFlags::of(&self.options);
        if self.by_matches {
            return self.search_by_matches(name, data, options);
        }
        // Fast path: nothing to print when the file has no match at all.
        if !options.invert && !options.files_without_match && !self.regex.is_match(data) {
            if options.count {
                return self.count_line(name, 0);
            }
            return Ok(());
        }
        let binary = data[..data.len().min(8192)].contains(&0);
        let list_only = options.files_with_matches || options.files_without_match;
        let mut selected: u64 = 0;
        let mut last_printed: Option<usize> = None;
        let mut pending_after = 0usize;
        let lines: Vec<&[u8]> = split_lines(data);
        for (index, line) in lines.iter().enumerate() {
            if options.max_count.is_some_and(|max| selected >= max) {
                break;
            }
            let is_match = self.regex.is_match(line) != options.invert;
            if !is_match {
                if pending_after > 0 && !options.count && !list_only && !options.quiet && !binary {
                    self.print_line(name, index, line, b'-')?;
                    last_printed = Some(index);
                    pending_after -= 1;
                }
                continue;
            }
            selected += 1;
            self.matched_any = true;
            if options.quiet || list_only || options.count {
                if options.quiet || options.files_with_matches {
                    break;
                }
                continue;
            }
            if binary {
                writeln!(self.out, "Binary file {name} matches")?;
                break;
            }
            if options.before > 0 || options.after > 0 {
                let start = index.saturating_sub(options.before);
                let from = match last_printed {
                    Some(last) if last + 1 >= start => last + 1,
                    Some(_) => {
                        writeln!(self.out, "--")?;
                        start
                    }
                    None => start,
                };
                for (context, text) in lines.iter().enumerate().take(index).skip(from) {
                    self.print_line(name, context, text, b'-')?;
                }
            }
            if options.only_matching && !options.invert {
                let regex = self.regex.clone();
                for found in regex.find_iter(line) {
                    if !found.as_bytes().is_empty() {
                        self.print_line(name, index, found.as_bytes(), b':')?;
                    }
                }
            } else {
                self.print_line(name, index, line, b':')?;
            }
            last_printed = Some(index);
            pending_after = options.after;
        }
        self.finish_file(options, name, selected)
    }

    /// [`Searcher::search`] without context lines or inverted matching: instead of matching
    /// every line on its own, the whole file is searched, and only a line in which a match
    /// starts is matched on its own (a match can reach over a newline, as `\s` does, where the
    /// line alone does not match). The same lines are selected, as `matches_start_in_their_line`
    /// ensures, with a search or two per selected line instead of one per line.
    fn search_by_matches(
        &mut self,
        name: &str,
        data: &[u8],
        options: SearchFlags,
    ) -> io::Result<()> {
        let list_only = options.files_with_matches || options.files_without_match;
        let mut binary: Option<bool> = None;
        let mut selected: u64 = 0;
        // Lines before `counted_to` (a line start) number `newlines_before`.
        let (mut counted_to, mut newlines_before) = (0usize, 0usize);
        let mut start = 0;
        while start <= data.len() {
            if options.max_count.is_some_and(|max| selected >= max) {
                break;
            }
            let Some(found) = self.regex.find_at(data, start) else {
                break;
            };
            let line_start = data[start..found.start()]
                .iter()
                .rposition(|byte| *byte == b'\n')
                .map_or(start, |newline| start + newline + 1);
            if line_start == data.len() {
                // After the final newline: no line is there.
                break;
            }
            let line_end = data[found.start()..]
                .iter()
                .position(|byte| *byte == b'\n')
                .map_or(data.len(), |newline| found.start() + newline);
            start = line_end + 1;
            let line = &data[line_start..line_end];
            if !self.regex.is_match(line) {
                continue;
            }
            newlines_before += data[counted_to..line_start]
                .iter()
                .filter(|byte| **byte == b'\n')
                .count();
            counted_to = line_start;
            selected += 1;
            self.matched_any = true;
            if options.quiet || list_only || options.count {
                if options.quiet || options.files_with_matches {
                    break;
                }
                continue;
            }
            if *binary.get_or_insert_with(|| data[..data.len().min(8192)].contains(&0)) {
                writeln!(self.out, "Binary file {name} matches")?;
                break;
            }
            self.print_line(name, newlines_before, line, b':')?;
        }
        self.finish_file(options, name, selected)
    }

    /// What a file ends with once its `selected` lines are known: nothing when quiet, its
    /// count, or its name for `-l` / `-L`.
    fn finish_file(&mut self, options: SearchFlags, name: &str, selected: u64) -> io::Result<()> {
        if options.quiet {
            return Ok(());
        }
        if options.count {
            return self.count_line(name, selected);
        }
        if (options.files_with_matches && selected > 0)
            || (options.files_without_match && selected == 0)
        {
            writeln!(self.out, "{name}")?;
        }
        Ok(())
    }

    fn count_line(&mut self, name: &str, count: u64) -> io::Result<()> {
        if self.show_names {
            writeln!(self.out, "{name}:{count}")
        } else {
            writeln!(self.out, "{count}")
        }
    }

    fn print_line(
        &mut self,
        name: &str,
        index: usize,
        line: &[u8],
        separator: u8,
    ) -> io::Result<()> {
        if self.show_names {
            self.out.write_all(name.as_bytes())?;
            self.out.write_all(&[separator])?;
        }
        if self.options.line_numbers {
            write!(self.out, "{}", index + 1)?;
            self.out.write_all(&[separator])?;
        }
        self.out.write_all(line)?;
        self.out.write_all(b"\n")
    }
}

/// Appends what `file` holds to `data`, reading to its end without asking its size first
/// (`std::fs::read` does: inside WASI that is two more host calls and two `stat`s per file). The
/// reads start at [`FIRST_READ_BYTES`] and double up to [`LARGEST_READ_BYTES`], because the
/// host prepares a zeroed buffer of the size each read asks for.
fn read_whole(mut file: std::fs::File, data: &mut Vec<u8>) -> io::Result<()> {
    let mut limit = FIRST_READ_BYTES;
    loop {
        data.reserve(limit);
        let got = (&mut file).take(limit as u64).read_to_end(data)?;
        if got < limit {
            return Ok(());
        }
        limit = (limit * 2).min(LARGEST_READ_BYTES);
    }
}

/// The first read of a file: a typical source file is read whole with it (and one more read
/// that finds the end).
const FIRST_READ_BYTES: usize = 8 << 10;

/// The largest read asked for at once.
const LARGEST_READ_BYTES: usize = 64 << 10;

/// The lines of `data` without their newlines; a final newline does not start another line.
fn split_lines(data: &[u8]) -> Vec<&[u8]> {
    let mut lines: Vec<&[u8]> = data.split(|byte| *byte == b'\n').collect();
    if data.ends_with(b"\n") || data.is_empty() {
        lines.pop();
    }
    lines
}

/// An I/O error as GNU tools word it.
fn describe(error: &io::Error) -> String {
    match error.kind() {
        io::ErrorKind::NotFound => "No such file or directory".to_string(),
        io::ErrorKind::PermissionDenied => "Permission denied".to_string(),
        _ => error.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(args: &[&str]) -> Options {
        parse(args.iter().map(|arg| arg.to_string()).collect()).unwrap()
    }

    #[test]
    fn flags_combine_and_take_values() {
        let parsed = options(&["-rni", "-e", "a", "-eb", "-C2", "--include=*.rs", "src"]);
        assert!(parsed.recursive && parsed.line_numbers && parsed.ignore_case);
        assert_eq!(parsed.patterns, ["a", "b"]);
        assert_eq!((parsed.before, parsed.after), (2, 2));
        assert_eq!(parsed.include, ["*.rs"]);
        assert_eq!(parsed.operands, ["src"]);
        let parsed = options(&["TODO", "-c", "f.txt"]);
        assert_eq!(parsed.patterns, ["TODO"]);
        assert!(parsed.count);
        assert!(parse(vec![]).is_err());
        assert!(parse(vec!["-Z".into(), "x".into()]).is_err());
    }

    #[test]
    fn the_pattern_follows_the_syntax() {
        let regex = build_regex(&options(&[r"foo\|bar"])).unwrap();
        assert!(regex.is_match(b"a bar"));
        let regex = build_regex(&options(&["-E", "fo+|x"])).unwrap();
        assert!(regex.is_match(b"foo"));
        let regex = build_regex(&options(&["-F", "a.b"])).unwrap();
        assert!(!regex.is_match(b"axb"));
        let regex = build_regex(&options(&["-w", "cat"])).unwrap();
        assert!(regex.is_match(b"a cat.") && !regex.is_match(b"concat"));
        let regex = build_regex(&options(&["-x", "-i", "abc"])).unwrap();
        assert!(regex.is_match(b"ABC") && !regex.is_match(b"abcd"));
    }

    /// What searching `data` as the file `f` prints, with lines found by whole-file matches or
    /// one line at a time.
    fn searched(args: &[&str], data: &[u8], by_matches: bool) -> String {
        let options = options(args);
        let regex = build_regex(&options).unwrap();
        let mut searcher = Searcher {
            show_names: options.with_filename.unwrap_or(false),
            options,
            regex,
            include: None,
            exclude: None,
            exclude_dir: None,
            out: BufWriter::new(Vec::new()),
            matched_any: false,
            had_error: false,
            buffer: Vec::new(),
            by_matches,
        };
        searcher.search("f", data).unwrap();
        let matched = searcher.matched_any;
        let out = searcher.out.into_inner().unwrap();
        format!("{}matched={matched}", String::from_utf8(out).unwrap())
    }

    #[test]
    fn whole_file_matches_select_the_lines_that_line_matches_select() {
        let texts: &[&[u8]] = &[
            b"",
            b"\n",
            b"\n\n",
            b"a TODO\nb\nTODO c\n",
            b"a\nb\nc",
            b"TODO\n\nTODO",
            b"x y\nx\ny\n",
            b"ab\ncd\nabcd\n",
            b"word\nswordfish\nword word\n",
            b"bin TODO\0ary\nTODO\n",
            b"a\tb\n\n  \nend",
        ];
        let cases: &[&[&str]] = &[
            &["TODO"],
            &["-n", "TODO"],
            &["-c", "TODO"],
            &["-l", "TODO"],
            &["-L", "TODO"],
            &["-q", "TODO"],
            &["-n", "-m", "1", "TODO"],
            &["-n", "-m", "0", "TODO"],
            &["-n", "^"],
            &["-n", "$"],
            &["-n", "^$"],
            &["-n", "-E", "x*"],
            &["-n", "-E", "x\\sy"],
            &["-n", "-E", "[^z]+"],
            &["-n", "-E", "b$|^c"],
            &["-n", "-w", "word"],
            &["-n", "-x", "x"],
            &["-n", "-i", "todo"],
            &["-n", "-F", "a.b"],
            &["-n", "-E", "\\W"],
            &["-n", "-H", "-e", "b", "-e", "cd"],
        ];
        for text in texts {
            for args in cases {
                assert_eq!(
                    searched(args, text, true),
                    searched(args, text, false),
                    "{args:?} on {:?}",
                    String::from_utf8_lossy(text)
                );
            }
        }
    }

    #[test]
    fn anchors_of_the_whole_text_and_inline_flags_are_matched_line_by_line() {
        for pattern in [r"\Ax", r"x\z", "(?-m)^x", "(?s)a.b"] {
            assert!(!matches_start_in_their_line(&options(&["-E", pattern])));
        }
        assert!(matches_start_in_their_line(&options(&["-E", "^x$|\\by"])));
        assert!(matches_start_in_their_line(&options(&["-F", "(?"])));
    }

    #[test]
    fn lines_split_without_a_phantom_last_line() {
        assert_eq!(split_lines(b"a\nb\n"), vec![&b"a"[..], b"b"]);
        assert_eq!(split_lines(b"a\nb"), vec![&b"a"[..], b"b"]);
        assert!(split_lines(b"").is_empty());
    }
}
