//! `sed` for clawcage's exec: a stream editor. Scripts may use `s/RE/REPLACEMENT/FLAGS` (flags
//! `g`, `p`, `i`/`I`, a number), `p`, `d`, `q`, `Q`, `=`, `y/SRC/DST/`, `a`, `i`, `c`, `n`,
//! `{ ... }`, `#` comments, with addresses (`N`, `$`, `/RE/`, `A,B`, `A,+N`, `!`). Options: `-n`,
//! `-i[SUFFIX]` (rewrite files in place), `-e SCRIPT`, `-f FILE`, `-E`/`-r`, `-s`. Basic regular
//! expressions (the default) are translated to the `regex` crate's syntax. It is one file
//! (over 700 lines) because it is one small program: the options, the script compiler and the
//! editor that runs the compiled commands share one set of command types.

use std::io::{self, BufWriter, Read, Write};

use clawcage_program_support::{bre_to_regex, enter_working_directory, ere_to_regex, report_io};
use regex::{Regex, RegexBuilder};

const USAGE: &str =
    "usage: sed [-n] [-i[SUFFIX]] [-E] [-s] [-e SCRIPT]... [-f FILE] [SCRIPT] [FILE...]";

#[derive(Debug, Clone)]
enum Address {
    Line(usize),
    Last,
    Pattern(Regex),
}

#[derive(Debug, Clone)]
enum Range {
    None,
    One(Address),
    Two(Address, Address),
    /// `A,+N`: A and the N lines after it.
    Relative(Address, usize),
}

#[derive(Debug, Clone)]
enum Action {
    Substitute {
        regex: Regex,
        replacement: Vec<Piece>,
        global: bool,
        occurrence: usize,
        print: bool,
    },
    Print,
    Delete,
    Quit {
        print: bool,
    },
    LineNumber,
    Transliterate(Vec<(char, char)>),
    Append(String),
    Insert(String),
    Change(String),
    Next,
    /// `{`: when the address does not match, jump past the matching `}`.
    Block {
        end: usize,
    },
    EndBlock,
}

/// A part of a replacement: literal text, the whole match (`&`) or a group (`\N`).
#[derive(Debug, Clone, PartialEq)]
enum Piece {
    Text(String),
    Group(usize),
}

#[derive(Debug, Clone)]
struct Command {
    range: Range,
    negate: bool,
    action: Action,
}

struct Options {
    quiet: bool,
    in_place: Option<String>,
    extended: bool,
    separate: bool,
    scripts: Vec<String>,
    files: Vec<String>,
}

fn main() {
    enter_working_directory();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let options = match parse_args(args) {
        Ok(options) => options,
        Err(message) => {
            eprintln!("sed: {message}\n{USAGE}");
            clawcage_program_support::exit(1);
        }
    };
    let script = options.scripts.join("\n");
    let program = match compile(&script, options.extended) {
        Ok(program) => program,
        Err(message) => {
            eprintln!("sed: -e expression: {message}");
            clawcage_program_support::exit(1);
        }
    };
    clawcage_program_support::exit(run(&options, &program));
}

fn parse_args(args: Vec<String>) -> Result<Options, String> {
    let mut options = Options {
        quiet: false,
        in_place: None,
        extended: false,
        separate: false,
        scripts: Vec::new(),
        files: Vec::new(),
    };
    let mut operands = Vec::new();
    let mut iter = args.into_iter();
    let mut only_operands = false;
    while let Some(arg) = iter.next() {
        if only_operands || arg == "-" || !arg.starts_with('-') {
            operands.push(arg);
            continue;
        }
        match arg.as_str() {
            "--" => only_operands = true,
            "-n" | "--quiet" | "--silent" => options.quiet = true,
            "-E" | "-r" | "--regexp-extended" => options.extended = true,
            "-s" | "--separate" => options.separate = true,
            "-e" => options
                .scripts
                .push(iter.next().ok_or("option -e needs a script")?),
            "-f" => {
                let path = iter.next().ok_or("option -f needs a file")?;
                let text = std::fs::read_to_string(&path)
                    .map_err(|error| format!("cannot read {path}: {error}"))?;
                options.scripts.push(text);
            }
            "-i" | "--in-place" => options.in_place = Some(String::new()),
            other if other.starts_with("--in-place=") => {
                options.in_place = Some(other["--in-place=".len()..].to_string());
            }
            other if other.starts_with("--expression=") => {
                options
                    .scripts
                    .push(other["--expression=".len()..].to_string());
            }
            other if other.starts_with("-i") && !other.starts_with("-in") => {
                options.in_place = Some(other[2..].to_string());
            }
            other => {
                // Combined short flags such as -ne or -ni.
                let flags: Vec<char> = other[1..].chars().collect();
                let mut index = 0;
                while index < flags.len() {
                    match flags[index] {
                        'n' => options.quiet = true,
                        'E' | 'r' => options.extended = true,
                        's' => options.separate = true,
                        'i' => {
                            options.in_place = Some(flags[index + 1..].iter().collect());
                            index = flags.len();
                            continue;
                        }
                        'e' => {
                            let rest: String = flags[index + 1..].iter().collect();
                            let script = if rest.is_empty() {
                                iter.next().ok_or("option -e needs a script")?
                            } else {
                                rest
                            };
                            options.scripts.push(script);
                            index = flags.len();
                            continue;
                        }
                        flag => return Err(format!("unknown option -- '{flag}'")),
                    }
                    index += 1;
                }
            }
        }
    }
    if options.scripts.is_empty() {
        if operands.is_empty() {
            return Err("no script given".to_string());
        }
        options.scripts.push(operands.remove(0));
    }
    options.files = operands;
    if options.in_place.is_some() && options.files.is_empty() {
        return Err("-i needs at least one file".to_string());
    }
    Ok(options)
}

struct ScriptReader<'a> {
    chars: Vec<char>,
    position: usize,
    extended: bool,
    last_regex: Option<Regex>,
    _text: &'a str,
}

impl ScriptReader<'_> {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.position).copied()
    }

    fn next(&mut self) -> Option<char> {
        let c = self.peek();
        self.position += 1;
        c
    }

    fn skip_blanks(&mut self) {
        while matches!(self.peek(), Some(' ' | '\t')) {
            self.position += 1;
        }
    }

    /// Text up to an unescaped `delimiter`, with `\delimiter` unescaped and `\n` a newline.
    fn delimited(&mut self, delimiter: char, what: &str) -> Result<String, String> {
        let mut text = String::new();
        loop {
            match self.next() {
                None => return Err(format!("unterminated {what}")),
                Some(c) if c == delimiter => return Ok(text),
                Some('\\') => match self.next() {
                    Some(c) if c == delimiter => text.push(c),
                    Some('n') if what != "replacement" => text.push('\n'),
                    Some(c) => {
                        text.push('\\');
                        text.push(c);
                    }
                    None => return Err(format!("unterminated {what}")),
                },
                Some(c) => text.push(c),
            }
        }
    }

    fn regex(&mut self, pattern: &str, case_insensitive: bool) -> Result<Regex, String> {
        if pattern.is_empty() {
            return self
                .last_regex
                .clone()
                .ok_or_else(|| "no previous regular expression".to_string());
        }
        let translated = if self.extended {
            ere_to_regex(pattern)
        } else {
            bre_to_regex(pattern)
        };
        let regex = RegexBuilder::new(&translated)
            .case_insensitive(case_insensitive)
            .size_limit(64 << 20)
            .build()
            .map_err(|error| format!("invalid regular expression '{pattern}': {error}"))?;
        self.last_regex = Some(regex.clone());
        Ok(regex)
    }

    fn address(&mut self) -> Result<Option<Address>, String> {
        match self.peek() {
            Some(c) if c.is_ascii_digit() => {
                let mut number = 0usize;
                while let Some(digit) = self.peek().and_then(|c| c.to_digit(10)) {
                    number = number.saturating_mul(10).saturating_add(digit as usize);
                    self.position += 1;
                }
                Ok(Some(Address::Line(number)))
            }
            Some('$') => {
                self.position += 1;
                Ok(Some(Address::Last))
            }
            Some('/') | Some('\\') => {
                let delimiter = if self.next() == Some('\\') {
                    self.next().ok_or("unterminated address regex")?
                } else {
                    '/'
                };
                let pattern = self.delimited(delimiter, "address regex")?;
                let case_insensitive = if self.peek() == Some('I') {
                    self.position += 1;
                    true
                } else {
                    false
                };
                Ok(Some(Address::Pattern(
                    self.regex(&pattern, case_insensitive)?,
                )))
            }
            _ => Ok(None),
        }
    }

    /// The text argument of `a`, `i` or `c`: `a\` then the next line, or `a text`.
    fn text_argument(&mut self) -> String {
        self.skip_blanks();
        if self.peek() == Some('\\') {
            self.position += 1;
            if self.peek() == Some('\n') {
                self.position += 1;
            }
        }
        self.skip_blanks();
        let mut text = String::new();
        while let Some(c) = self.next() {
            match c {
                '\n' => break,
                '\\' => match self.next() {
                    Some('n') => text.push('\n'),
                    Some('t') => text.push('\t'),
                    Some(other) => text.push(other),
                    None => {}
                },
                other => text.push(other),
            }
        }
        text
    }
}

fn parse_replacement(text: &str) -> Vec<Piece> {
    let mut pieces = Vec::new();
    let mut literal = String::new();
    let mut chars = text.chars();
    let flush = |literal: &mut String, pieces: &mut Vec<Piece>| {
        if !literal.is_empty() {
            pieces.push(Piece::Text(std::mem::take(literal)));
        }
    };
    while let Some(c) = chars.next() {
        match c {
            '&' => {
                flush(&mut literal, &mut pieces);
                pieces.push(Piece::Group(0));
            }
            '\\' => match chars.next() {
                Some(digit @ '0'..='9') => {
                    flush(&mut literal, &mut pieces);
                    pieces.push(Piece::Group(digit as usize - '0' as usize));
                }
                Some('n') => literal.push('\n'),
                Some('t') => literal.push('\t'),
                Some('&') => literal.push('&'),
                Some(other) => literal.push(other),
                None => literal.push('\\'),
            },
            other => literal.push(other),
        }
    }
    flush(&mut literal, &mut pieces);
    pieces
}

fn compile(script: &str, extended: bool) -> Result<Vec<Command>, String> {
    let mut reader = ScriptReader {
        chars: script.chars().collect(),
        position: 0,
        extended,
        last_regex: None,
        _text: script,
    };
    let mut program: Vec<Command> = Vec::new();
    let mut open_blocks: Vec<usize> = Vec::new();
    loop {
        while matches!(reader.peek(), Some(' ' | '\t' | '\n' | ';')) {
            reader.position += 1;
        }
        let Some(_) = reader.peek() else { break };
        if reader.peek() == Some('#') {
            while !matches!(reader.next(), Some('\n') | None) {}
            continue;
        }
        let first = reader.address()?;
        let range = match first {
            None => Range::None,
            Some(first) => {
                if reader.peek() == Some(',') {
                    reader.position += 1;
                    if reader.peek() == Some('+') {
                        reader.position += 1;
                        let mut count = 0usize;
                        while let Some(digit) = reader.peek().and_then(|c| c.to_digit(10)) {
                            count = count.saturating_mul(10).saturating_add(digit as usize);
                            reader.position += 1;
                        }
                        Range::Relative(first, count)
                    } else {
                        let second = reader.address()?.ok_or("expected an address after `,'")?;
                        Range::Two(first, second)
                    }
                } else {
                    Range::One(first)
                }
            }
        };
        reader.skip_blanks();
        let mut negate = false;
        while reader.peek() == Some('!') {
            negate = true;
            reader.position += 1;
            reader.skip_blanks();
        }
        let Some(letter) = reader.next() else {
            return Err("missing command".to_string());
        };
        let action = match letter {
            's' => {
                let delimiter = reader.next().ok_or("unterminated `s' command")?;
                let pattern = reader.delimited(delimiter, "`s' command")?;
                let replacement = reader.delimited(delimiter, "replacement")?;
                let (mut global, mut print, mut occurrence, mut case_insensitive) =
                    (false, false, 1usize, false);
                while let Some(flag) = reader.peek() {
                    match flag {
                        'g' => global = true,
                        'p' => print = true,
                        'i' | 'I' => case_insensitive = true,
                        digit if digit.is_ascii_digit() => {
                            occurrence = digit as usize - '0' as usize;
                            reader.position += 1;
                            while let Some(more) = reader.peek().and_then(|c| c.to_digit(10)) {
                                occurrence = occurrence * 10 + more as usize;
                                reader.position += 1;
                            }
                            continue;
                        }
                        _ => break,
                    }
                    reader.position += 1;
                }
                Action::Substitute {
                    regex: reader.regex(&pattern, case_insensitive)?,
                    replacement: parse_replacement(&replacement),
                    global,
                    occurrence: occurrence.max(1),
                    print,
                }
            }
            'y' => {
                let delimiter = reader.next().ok_or("unterminated `y' command")?;
                let from: Vec<char> = reader
                    .delimited(delimiter, "`y' command")?
                    .chars()
                    .collect();
                let to: Vec<char> = reader
                    .delimited(delimiter, "`y' command")?
                    .chars()
                    .collect();
                if from.len() != to.len() {
                    return Err("strings for `y' command are different lengths".to_string());
                }
                Action::Transliterate(from.into_iter().zip(to).collect())
            }
            'p' => Action::Print,
            'd' => Action::Delete,
            'q' => Action::Quit { print: true },
            'Q' => Action::Quit { print: false },
            '=' => Action::LineNumber,
            'n' => Action::Next,
            'a' => Action::Append(reader.text_argument()),
            'i' => Action::Insert(reader.text_argument()),
            'c' => Action::Change(reader.text_argument()),
            '{' => {
                open_blocks.push(program.len());
                Action::Block { end: 0 }
            }
            '}' => {
                let start = open_blocks.pop().ok_or("unexpected `}'")?;
                let end = program.len();
                if let Action::Block { end: target } = &mut program[start].action {
                    *target = end;
                }
                Action::EndBlock
            }
            other => {
                return Err(format!(
                    "unknown command: `{other}' (supported: s y p d q Q = n a i c {{ }})"
                ));
            }
        };
        let opens_block = matches!(action, Action::Block { .. });
        program.push(Command {
            range,
            negate,
            action,
        });
        if opens_block {
            continue;
        }
        reader.skip_blanks();
        match reader.peek() {
            None | Some(';' | '\n' | '}' | '#') => {}
            Some(other) => return Err(format!("extra characters after command: `{other}'")),
        }
    }
    if !open_blocks.is_empty() {
        return Err("unmatched `{'".to_string());
    }
    Ok(program)
}

/// The input lines of one stream, with lookahead to know which line is the last.
struct Input {
    lines: Vec<String>,
    next: usize,
    line_number: usize,
    /// Whether the text ended with a newline (kept on output, like GNU sed).
    trailing_newline: bool,
}

impl Input {
    fn new(text: &str, line_number: usize) -> Input {
        let trailing_newline = text.ends_with('\n') || text.is_empty();
        let mut lines: Vec<String> = text.split('\n').map(str::to_string).collect();
        if trailing_newline {
            lines.pop();
        }
        Input {
            lines,
            next: 0,
            line_number,
            trailing_newline,
        }
    }

    fn read(&mut self) -> Option<String> {
        let line = self.lines.get(self.next).cloned()?;
        self.next += 1;
        self.line_number += 1;
        Some(line)
    }

    fn is_last(&self, last_stream: bool) -> bool {
        last_stream && self.next >= self.lines.len()
    }
}

/// Per-command state of two-address ranges: whether the range is active, and where it ends.
#[derive(Clone, Copy, Default)]
struct RangeState {
    active: bool,
    end_line: usize,
}

struct Editor<'a> {
    program: &'a [Command],
    quiet: bool,
    ranges: Vec<RangeState>,
    quit: bool,
}

fn matches_address(address: &Address, line: &str, number: usize, last: bool) -> bool {
    match address {
        Address::Line(n) => number == *n,
        Address::Last => last,
        Address::Pattern(regex) => regex.is_match(line),
    }
}

impl Editor<'_> {
    fn selects(&mut self, index: usize, line: &str, number: usize, last: bool) -> bool {
        let command = &self.program[index];
        let hit = match &command.range {
            Range::None => true,
            Range::One(address) => matches_address(address, line, number, last),
            Range::Two(start, _) | Range::Relative(start, _) if !self.ranges[index].active => {
                if !matches_address(start, line, number, last) {
                    false
                } else {
                    let state = &mut self.ranges[index];
                    match &command.range {
                        Range::Relative(_, count) => {
                            state.end_line = number + count;
                            state.active = *count > 0;
                        }
                        Range::Two(_, Address::Line(end)) => state.active = *end > number,
                        Range::Two(_, _) => state.active = !last,
                        _ => {}
                    }
                    true
                }
            }
            Range::Relative(_, _) => {
                let state = &mut self.ranges[index];
                if number >= state.end_line {
                    state.active = false;
                }
                true
            }
            Range::Two(_, end) => {
                let ended = match end {
                    Address::Line(n) => number >= *n,
                    other => matches_address(other, line, number, last),
                };
                if ended || last {
                    self.ranges[index].active = false;
                }
                true
            }
        };
        hit != command.negate
    }

    /// Runs the script over `input`, writing to `out`.
    fn run(&mut self, input: &mut Input, last_stream: bool, out: &mut dyn Write) -> io::Result<()> {
        while !self.quit {
            let Some(mut line) = input.read() else { break };
            let mut appended: Vec<String> = Vec::new();
            let mut print_line = !self.quiet;
            let mut index = 0;
            let mut deleted = false;
            while index < self.program.len() {
                let last = input.is_last(last_stream);
                if !self.selects(index, &line, input.line_number, last) {
                    if let Action::Block { end } = self.program[index].action {
                        index = end + 1;
                        continue;
                    }
                    index += 1;
                    continue;
                }
                match &self.program[index].action {
                    Action::Substitute {
                        regex,
                        replacement,
                        global,
                        occurrence,
                        print,
                    } => {
                        if let Some(replaced) =
                            substitute(regex, replacement, &line, *global, *occurrence)
                        {
                            line = replaced;
                            if *print {
                                writeln!(out, "{line}")?;
                            }
                        }
                    }
                    Action::Print => writeln!(out, "{line}")?,
                    Action::Delete => {
                        deleted = true;
                        break;
                    }
                    Action::Quit { print } => {
                        self.quit = true;
                        print_line &= *print;
                        break;
                    }
                    Action::LineNumber => writeln!(out, "{}", input.line_number)?,
                    Action::Transliterate(pairs) => {
                        line = line
                            .chars()
                            .map(|c| {
                                pairs
                                    .iter()
                                    .find(|(from, _)| *from == c)
                                    .map_or(c, |(_, to)| *to)
                            })
                            .collect();
                    }
                    Action::Append(text) => appended.push(text.clone()),
                    Action::Insert(text) => writeln!(out, "{text}")?,
                    Action::Change(text) => {
                        writeln!(out, "{text}")?;
                        deleted = true;
                        break;
                    }
                    Action::Next => {
                        if print_line {
                            writeln!(out, "{line}")?;
                        }
                        for text in appended.drain(..) {
                            writeln!(out, "{text}")?;
                        }
                        match input.read() {
                            Some(next) => line = next,
                            None => {
                                self.quit = true;
                                print_line = false;
                                break;
                            }
                        }
                    }
                    Action::Block { .. } | Action::EndBlock => {}
                }
                index += 1;
            }
            if print_line && !deleted {
                let last = input.is_last(last_stream);
                if last && !input.trailing_newline && appended.is_empty() {
                    write!(out, "{line}")?;
                } else {
                    writeln!(out, "{line}")?;
                }
            }
            for text in appended {
                writeln!(out, "{text}")?;
            }
        }
        Ok(())
    }
}

fn substitute(
    regex: &Regex,
    replacement: &[Piece],
    line: &str,
    global: bool,
    occurrence: usize,
) -> Option<String> {
    let mut result = String::with_capacity(line.len());
    let mut last_end = 0;
    let mut replaced = false;
    for (count, captures) in regex.captures_iter(line).enumerate() {
        let Some(whole) = captures.get(0) else {
            continue;
        };
        if count + 1 < occurrence {
            continue;
        }
        result.push_str(&line[last_end..whole.start()]);
        for piece in replacement {
            match piece {
                Piece::Text(text) => result.push_str(text),
                Piece::Group(group) => {
                    if let Some(found) = captures.get(*group) {
                        result.push_str(found.as_str());
                    }
                }
            }
        }
        last_end = whole.end();
        replaced = true;
        if !global {
            break;
        }
    }
    if !replaced {
        return None;
    }
    result.push_str(&line[last_end..]);
    Some(result)
}

fn run(options: &Options, program: &[Command]) -> i32 {
    let mut editor = Editor {
        program,
        quiet: options.quiet,
        ranges: vec![RangeState::default(); program.len()],
        quit: false,
    };
    if let Some(suffix) = &options.in_place {
        let mut status = 0;
        for file in &options.files {
            editor.ranges = vec![RangeState::default(); program.len()];
            editor.quit = false;
            if let Err(message) = edit_in_place(&mut editor, file, suffix) {
                eprintln!("sed: {message}");
                status = 1;
            }
        }
        return status;
    }
    let stdout = io::stdout();
    let mut out = BufWriter::with_capacity(64 << 10, stdout.lock());
    let files: Vec<String> = if options.files.is_empty() {
        vec!["-".to_string()]
    } else {
        options.files.clone()
    };
    let mut status = 0;
    // Without -s, all files form one stream: line numbers go on and `$` is the very last line.
    let mut line_number = 0;
    let texts: Vec<Option<String>> = files
        .iter()
        .map(|file| match read_text(file) {
            Ok(text) => Some(text),
            Err(message) => {
                eprintln!("sed: {message}");
                status = 1;
                None
            }
        })
        .collect();
    let readable: Vec<&String> = texts.iter().flatten().collect();
    let result = (|| -> io::Result<()> {
        for (position, text) in readable.iter().enumerate() {
            let last_stream = options.separate || position + 1 == readable.len();
            if options.separate {
                line_number = 0;
                editor.ranges = vec![RangeState::default(); program.len()];
            }
            let mut input = Input::new(text, line_number);
            editor.run(&mut input, last_stream, &mut out)?;
            line_number = input.line_number;
            if editor.quit {
                break;
            }
        }
        out.flush()
    })();
    let io_status = report_io("sed", result);
    if io_status != 0 { 1 } else { status }
}

fn read_text(file: &str) -> Result<String, String> {
    let mut bytes = Vec::new();
    let result = if file == "-" {
        io::stdin().lock().read_to_end(&mut bytes).map(|_| ())
    } else {
        std::fs::File::open(file).and_then(|mut handle| handle.read_to_end(&mut bytes).map(|_| ()))
    };
    result.map_err(|error| match error.kind() {
        io::ErrorKind::NotFound => format!("can't read {file}: No such file or directory"),
        _ => format!("can't read {file}: {error}"),
    })?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// Rewrites `file` through the script: the result goes to a temporary file beside it, which
/// then replaces it, so a failure never leaves the file half-written.
fn edit_in_place(editor: &mut Editor<'_>, file: &str, suffix: &str) -> Result<(), String> {
    let text = read_text(file)?;
    let mut edited: Vec<u8> = Vec::with_capacity(text.len());
    let mut input = Input::new(&text, 0);
    editor
        .run(&mut input, true, &mut edited)
        .map_err(|error| format!("{file}: {error}"))?;
    if !suffix.is_empty() {
        let backup = if suffix.contains('*') {
            suffix.replace('*', file)
        } else {
            format!("{file}{suffix}")
        };
        std::fs::write(&backup, text.as_bytes())
            .map_err(|error| format!("cannot write the backup {backup}: {error}"))?;
    }
    let path = std::path::Path::new(file);
    let name = path
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_else(|| "file".to_string());
    let temporary = path.with_file_name(format!(".{name}.sed-tmp"));
    std::fs::write(&temporary, &edited)
        .map_err(|error| format!("cannot write {}: {error}", temporary.display()))?;
    std::fs::rename(&temporary, path).map_err(|error| {
        let _ = std::fs::remove_file(&temporary);
        format!("cannot replace {file}: {error}")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sed(script: &str, input: &str, quiet: bool) -> String {
        let program = compile(script, false).unwrap();
        let mut editor = Editor {
            program: &program,
            quiet,
            ranges: vec![RangeState::default(); program.len()],
            quit: false,
        };
        let mut out = Vec::new();
        editor
            .run(&mut Input::new(input, 0), true, &mut out)
            .unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn substitutes() {
        assert_eq!(sed("s/a/b/g", "banana\n", false), "bbnbnb\n");
        assert_eq!(sed("s/a/b/", "banana\n", false), "bbnana\n");
        assert_eq!(sed("s/a/b/2", "banana\n", false), "banbna\n");
        assert_eq!(
            sed(r"s/\(an\)\+/[&|\1]/", "banana\n", false),
            "b[anan|an]a\n"
        );
        assert_eq!(sed("s|/|_|g", "a/b/c\n", false), "a_b_c\n");
        assert_eq!(sed("s/A/x/gI", "aA\n", false), "xx\n");
        assert_eq!(sed("s/x/y/;s/y/z/", "x\n", false), "z\n");
        assert_eq!(sed("s/a/b/", "no newline a", false), "no newline b");
    }

    #[test]
    fn addresses_and_commands() {
        let text = "one\ntwo\nthree\nfour\n";
        assert_eq!(sed("2,3p", text, true), "two\nthree\n");
        assert_eq!(sed("$d", text, false), "one\ntwo\nthree\n");
        assert_eq!(sed("/t/d", text, false), "one\nfour\n");
        assert_eq!(sed("/two/,/three/!d", text, false), "two\nthree\n");
        assert_eq!(sed("2q", text, false), "one\ntwo\n");
        assert_eq!(sed("1,+1d", text, false), "three\nfour\n");
        assert_eq!(
            sed("2i\\\ninserted", text, false),
            "one\ninserted\ntwo\nthree\nfour\n"
        );
        assert_eq!(sed("1a added", "x\n", false), "x\nadded\n");
        assert_eq!(sed("=", "x\n", true), "1\n");
        assert_eq!(sed("y/abc/xyz/", "aabbcc\n", false), "xxyyzz\n");
        assert_eq!(sed("/o/{s/o/0/g;p}", "foo\nbar\n", true), "f00\n");
        assert_eq!(sed("n;d", text, false), "one\nthree\n");
    }

    #[test]
    fn bad_scripts_are_refused() {
        assert!(compile("k", false).is_err());
        assert!(compile("s/a/b", false).is_err());
        assert!(compile("{p", false).is_err());
        assert!(compile("y/ab/c/", false).is_err());
    }

    #[test]
    fn arguments_parse() {
        let options = parse_args(vec!["-i".into(), "s/a/b/g".into(), "f.txt".into()]).unwrap();
        assert_eq!(options.in_place.as_deref(), Some(""));
        assert_eq!(options.files, ["f.txt"]);
        let options = parse_args(vec!["-ne".into(), "p".into()]).unwrap();
        assert!(options.quiet);
        assert_eq!(options.scripts, ["p"]);
        assert!(parse_args(vec!["-i".into(), "p".into()]).is_err());
    }
}
