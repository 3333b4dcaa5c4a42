//! `xargs`, a builtin of the shell (a WASI program cannot start another program, so it cannot be
//! one): reads items from its input and runs a command with them as arguments, as GNU xargs
//! does. This module holds what needs no shell: the options, the splitting of the input into
//! items (blanks and newlines with quotes and backslashes, `-0`, `-d`, one line per item for
//! `-I`), and the grouping of items into command lines (`-n`, `-L`, the size limit). The shell
//! runs each command line one after another (`-P` is accepted and runs them one at a time),
//! and the plan names the command xargs runs, with the arguments it will read marked as known
//! only at run time.

/// The longest command line xargs builds, in bytes: every word and one terminating byte each,
/// as GNU counts (`-s` lowers it; GNU's default is the same 128 KiB).
pub const MAX_COMMAND_BYTES: usize = 128 << 10;

/// What the plan shows for the arguments xargs reads from its input.
pub const INPUT_ARGUMENTS: &str = "[arguments read from standard input]";

/// The text of `xargs --help`.
pub const HELP: &str = "\
Usage: xargs [OPTION]... [COMMAND [INITIAL-ARGS]...]
Run COMMAND (default: echo) with INITIAL-ARGS and more arguments read from standard input.
Items are separated by blanks and newlines; quotes and backslashes protect them.

  -0, --null                 items are separated by NUL (for find -print0); no quotes
  -a, --arg-file=FILE        read the items from FILE instead of standard input
  -d, --delimiter=CHAR       items are separated by CHAR (a character or \\n, \\t, \\0, \\x41, \\101)
  -E END, -e[END], --eof[=END]  stop at an input line that is END (not with -0 or -d)
  -I R, -i[R], --replace[=R] one run per input line, R in INITIAL-ARGS replaced by the line
                               (-i: R is {})
  -L N, -l[N], --max-lines=N at most N non-blank input lines per command line
  -n N, --max-args=N         at most N arguments per command line
  -P N, --max-procs=N        accepted; commands always run one at a time here
  -r, --no-run-if-empty      do not run COMMAND when the input has no items
                               (without -r it runs once, as GNU xargs does)
  -s N, --max-chars=N        command lines of at most N bytes (at most 131072)
  -t, --verbose              print each command line on standard error before running it
  -x, --exit                 stop when a command line would exceed the size
      --help, --version

COMMAND is a program or a shell builtin; it gets no standard input. Redirections written on
the command line belong to xargs itself (its input and the output of all runs), never to the
runs: an item such as `> f` is an argument like any other.
Exit status: 0 all runs succeeded; 123 a run exited with 1-125; 124 a run exited with 255
(xargs stops); 125 a run was stopped by the sandbox; 126 the command could not run (refused);
127 the command was not found; 1 an error of xargs itself (options, input, size).
";

/// What the input is split at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// Blanks and newlines, with quotes and backslashes (the default).
    Blanks,
    /// Newlines only, leading blanks dropped, with quotes and backslashes (`-I`).
    Lines,
    /// This byte, taken literally (`-0`, `-d`).
    Byte(u8),
}

/// The options of one `xargs` command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// The command and its initial arguments; empty means `echo`.
    pub command: Vec<String>,
    /// The delimiter of `-0`/`-d`.
    pub delimiter: Option<u8>,
    /// `-n`.
    pub max_args: Option<usize>,
    /// `-L`.
    pub max_lines: Option<usize>,
    /// `-I`.
    pub replace: Option<String>,
    /// `-r`.
    pub no_run_if_empty: bool,
    /// `-t`.
    pub verbose: bool,
    /// `-s`, or [`MAX_COMMAND_BYTES`].
    pub max_chars: usize,
    /// `-x` (also set by `-L` and `-I`, as in GNU xargs).
    pub exit_if_too_long: bool,
    /// `-E`.
    pub eof: Option<String>,
    /// `-a`.
    pub arg_file: Option<String>,
    /// Warnings to print before running (an option value that was lowered).
    pub warnings: Vec<String>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            command: Vec::new(),
            delimiter: None,
            max_args: None,
            max_lines: None,
            replace: None,
            no_run_if_empty: false,
            verbose: false,
            max_chars: MAX_COMMAND_BYTES,
            exit_if_too_long: false,
            eof: None,
            arg_file: None,
            warnings: Vec::new(),
        }
    }
}

impl Options {
    /// The command and initial arguments each command line starts with.
    pub fn command(&self) -> Vec<String> {
        if self.command.is_empty() {
            vec!["echo".to_string()]
        } else {
            self.command.clone()
        }
    }

    /// How the input is split into items.
    pub fn split(&self) -> Split {
        match (self.delimiter, &self.replace) {
            (Some(byte), _) => Split::Byte(byte),
            (None, Some(_)) => Split::Lines,
            (None, None) => Split::Blanks,
        }
    }
}

/// What the words after `xargs` ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Invocation {
    /// Run commands with these options.
    Run(Options),
    /// `--help`.
    Help,
    /// `--version`.
    Version,
}

/// Where the command starts in the words after `xargs`, for the plan: its index (`None` when
/// there is none and `echo` runs) and the replace string of `-I`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandStart {
    /// The index of the command word, if one is given.
    pub index: Option<usize>,
    /// The `-I` string.
    pub replace: Option<String>,
}

/// Reads the words after `xargs`. The error is a message for `xargs: ...` (exit status 1).
pub fn parse_args(args: &[String]) -> Result<Invocation, String> {
    parse(args).map(|(invocation, _)| invocation)
}

/// Where the command starts in `args`, or `None` when the options are refused (nothing runs)
/// or ask for help.
pub fn command_start(args: &[String]) -> Option<CommandStart> {
    match parse(args) {
        Ok((Invocation::Run(options), index)) => Some(CommandStart {
            index: (index < args.len()).then_some(index),
            replace: options.replace,
        }),
        _ => None,
    }
}

/// The options that take a value in the next word (or attached), short and long.
const WITH_VALUE: &[(char, &str)] = &[
    ('a', "arg-file"),
    ('d', "delimiter"),
    ('E', ""),
    ('I', ""),
    ('L', "max-lines"),
    ('n', "max-args"),
    ('P', "max-procs"),
    ('s', "max-chars"),
];

fn parse(args: &[String]) -> Result<(Invocation, usize), String> {
    let mut options = Options::default();
    let mut index = 0;
    while let Some(arg) = args.get(index) {
        if arg == "--" {
            index += 1;
            break;
        }
        if let Some(long) = arg.strip_prefix("--") {
            let (name, attached) = match long.split_once('=') {
                Some((name, value)) => (name, Some(value.to_string())),
                None => (long, None),
            };
            let takes_value = WITH_VALUE
                .iter()
                .any(|(_, long)| !long.is_empty() && *long == name);
            let value = if takes_value && attached.is_none() {
                index += 1;
                Some(args.get(index).cloned().ok_or_else(|| {
                    format!("option '--{name}' requires an argument; see xargs --help")
                })?)
            } else {
                attached
            };
            match name {
                "help" => return Ok((Invocation::Help, index)),
                "version" => return Ok((Invocation::Version, index)),
                "null" => options.delimiter = Some(0),
                "no-run-if-empty" => options.no_run_if_empty = true,
                "verbose" => options.verbose = true,
                "exit" => options.exit_if_too_long = true,
                "eof" => options.eof = value.filter(|end| !end.is_empty()),
                "replace" => set_replace(&mut options, value.unwrap_or_else(|| "{}".into())),
                "max-lines" => set_lines(&mut options, value.as_deref().unwrap_or("1"))?,
                _ if takes_value => {
                    let short = WITH_VALUE
                        .iter()
                        .find(|(_, long)| *long == name)
                        .map(|(short, _)| *short)
                        .unwrap_or('?');
                    apply(&mut options, short, &value.unwrap_or_default())?;
                }
                "interactive" | "open-tty" => return Err(no_terminal(name)),
                _ => {
                    return Err(format!("unrecognized option '--{name}'; see xargs --help"));
                }
            }
            index += 1;
            continue;
        }
        let Some(flags) = arg.strip_prefix('-').filter(|flags| !flags.is_empty()) else {
            break;
        };
        for (position, flag) in flags.char_indices() {
            let attached = &flags[position + flag.len_utf8()..];
            match flag {
                '0' => options.delimiter = Some(0),
                'r' => options.no_run_if_empty = true,
                't' => options.verbose = true,
                'x' => options.exit_if_too_long = true,
                'p' | 'o' => return Err(no_terminal(&flag.to_string())),
                // Optional values, attached only.
                'e' => {
                    options.eof = (!attached.is_empty()).then(|| attached.to_string());
                    break;
                }
                'i' => {
                    let repl = if attached.is_empty() { "{}" } else { attached };
                    set_replace(&mut options, repl.to_string());
                    break;
                }
                'l' => {
                    set_lines(
                        &mut options,
                        if attached.is_empty() { "1" } else { attached },
                    )?;
                    break;
                }
                _ if WITH_VALUE.iter().any(|(short, _)| *short == flag) => {
                    let value = if attached.is_empty() {
                        index += 1;
                        args.get(index).cloned().ok_or_else(|| {
                            format!("option requires an argument -- '{flag}'; see xargs --help")
                        })?
                    } else {
                        attached.to_string()
                    };
                    apply(&mut options, flag, &value)?;
                    break;
                }
                other => {
                    return Err(format!("invalid option -- '{other}'; see xargs --help"));
                }
            }
        }
        index += 1;
    }
    options.command = args.get(index..).unwrap_or(&[]).to_vec();
    Ok((Invocation::Run(options), index))
}

fn no_terminal(option: &str) -> String {
    format!("-{option}: there is no terminal here to ask on or to read from; leave the option out")
}

fn set_replace(options: &mut Options, repl: String) {
    options.replace = Some(repl);
    options.max_args = None;
    options.max_lines = None;
    options.exit_if_too_long = true;
}

fn set_lines(options: &mut Options, value: &str) -> Result<(), String> {
    options.max_lines = Some(positive(value, "-L")?);
    options.max_args = None;
    options.exit_if_too_long = true;
    Ok(())
}

/// An option that takes a value.
fn apply(options: &mut Options, flag: char, value: &str) -> Result<(), String> {
    match flag {
        'a' => options.arg_file = Some(value.to_string()),
        'd' => options.delimiter = Some(delimiter(value)?),
        'E' => options.eof = (!value.is_empty()).then(|| value.to_string()),
        'I' => set_replace(options, value.to_string()),
        'L' => set_lines(options, value)?,
        'n' => {
            options.max_args = Some(positive(value, "-n")?);
            options.max_lines = None;
        }
        'P' => {
            value
                .parse::<usize>()
                .map_err(|_| format!("invalid number \"{value}\" for -P option"))?;
        }
        's' => {
            let chars = positive(value, "-s")?;
            if chars > MAX_COMMAND_BYTES {
                options.warnings.push(format!(
                    "value {chars} for -s option should be <= {MAX_COMMAND_BYTES}; using {MAX_COMMAND_BYTES}"
                ));
            }
            options.max_chars = chars.min(MAX_COMMAND_BYTES);
        }
        _ => return Err(format!("invalid option -- '{flag}'; see xargs --help")),
    }
    Ok(())
}

fn positive(value: &str, option: &str) -> Result<usize, String> {
    let number: usize = value
        .parse()
        .map_err(|_| format!("invalid number \"{value}\" for {option} option"))?;
    if number == 0 {
        return Err(format!("value 0 for {option} option should be >= 1"));
    }
    Ok(number)
}

/// The byte of `-d`: one character, or an escape (`\n`, `\t`, `\0`, `\\`, `\xHH`, `\NNN`).
pub fn delimiter(text: &str) -> Result<u8, String> {
    let invalid = || {
        format!(
            "invalid input delimiter specification {text}: the delimiter must be either a single character or an escape sequence starting with \\"
        )
    };
    let mut chars = text.chars();
    match (chars.next(), chars.next()) {
        (Some(c), None) if c.is_ascii() => return Ok(c as u8),
        (Some('\\'), Some(_)) => {}
        _ => return Err(invalid()),
    }
    let escape = &text[1..];
    let byte = match escape {
        "a" => 0x07,
        "b" => 0x08,
        "f" => 0x0c,
        "n" => b'\n',
        "r" => b'\r',
        "t" => b'\t',
        "v" => 0x0b,
        "\\" => b'\\',
        _ => {
            let (digits, radix) = match escape.strip_prefix('x') {
                Some(hex) => (hex, 16),
                None => (escape, 8),
            };
            if digits.is_empty() || digits.len() > 3 {
                return Err(invalid());
            }
            u8::from_str_radix(digits, radix).map_err(|_| invalid())?
        }
    };
    Ok(byte)
}

/// One item of the input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    /// The argument it becomes.
    pub text: String,
    /// Whether it ends a non-blank input line (for `-L`).
    pub ends_line: bool,
}

/// Reads items from the input one at a time (a huge input is never held as a list of items).
pub struct Reader<'a> {
    input: &'a [u8],
    position: usize,
    split: Split,
    eof: Option<String>,
    finished: bool,
}

impl<'a> Reader<'a> {
    /// A reader of `input` as `options` split it.
    pub fn new(input: &'a [u8], options: &Options) -> Self {
        let split = options.split();
        Reader {
            input,
            position: 0,
            split,
            // GNU ignores the end string with -0 and -d.
            eof: options
                .eof
                .clone()
                .filter(|_| !matches!(split, Split::Byte(_))),
            finished: false,
        }
    }

    /// The next item, `None` at the end of the input (or at the `-E` line). The error is a
    /// message for `xargs: ...`: a quote left open.
    pub fn next_item(&mut self) -> Result<Option<Item>, String> {
        if self.finished {
            return Ok(None);
        }
        let item = match self.split {
            Split::Byte(delimiter) => self.delimited(delimiter),
            Split::Blanks => self.quoted(false)?,
            Split::Lines => self.quoted(true)?,
        };
        match item {
            Some(item) if self.eof.as_deref() == Some(item.text.as_str()) => {
                self.finished = true;
                Ok(None)
            }
            None => {
                self.finished = true;
                Ok(None)
            }
            some => Ok(some),
        }
    }

    fn delimited(&mut self, delimiter: u8) -> Option<Item> {
        let rest = self
            .input
            .get(self.position..)
            .filter(|rest| !rest.is_empty())?;
        let end = rest
            .iter()
            .position(|byte| *byte == delimiter)
            .unwrap_or(rest.len());
        self.position += end + 1;
        Some(Item {
            text: String::from_utf8_lossy(&rest[..end]).into_owned(),
            ends_line: true,
        })
    }

    /// An item of the default splitting, or (`whole_line`) a line of `-I`.
    fn quoted(&mut self, whole_line: bool) -> Result<Option<Item>, String> {
        let input = self.input;
        while self.position < input.len() && matches!(input[self.position], b' ' | b'\t' | b'\n') {
            self.position += 1;
        }
        if self.position >= input.len() {
            return Ok(None);
        }
        let mut word = Vec::new();
        let mut ends_line = true;
        while self.position < input.len() {
            let byte = input[self.position];
            self.position += 1;
            match byte {
                b'\n' => break,
                b' ' | b'\t' if whole_line => word.push(byte),
                b' ' | b'\t' => {
                    // A blank ends the item; a line that ends in blanks goes on to the next
                    // line (GNU's rule for -L).
                    while self.position < input.len()
                        && matches!(input[self.position], b' ' | b'\t')
                    {
                        self.position += 1;
                    }
                    match input.get(self.position) {
                        Some(b'\n') => {
                            self.position += 1;
                            ends_line = false;
                        }
                        Some(_) => ends_line = false,
                        None => {}
                    }
                    break;
                }
                b'\'' | b'"' => {
                    let Some(length) = input[self.position..]
                        .iter()
                        .position(|next| *next == byte || *next == b'\n')
                        .filter(|length| input[self.position + length] == byte)
                    else {
                        let which = if byte == b'\'' { "single" } else { "double" };
                        return Err(format!(
                            "unmatched {which} quote; by default quotes are special to xargs unless you use the -0 option"
                        ));
                    };
                    word.extend_from_slice(&input[self.position..self.position + length]);
                    self.position += length + 1;
                }
                b'\\' => {
                    if let Some(next) = input.get(self.position) {
                        word.push(*next);
                        self.position += 1;
                    }
                }
                other => word.push(other),
            }
        }
        Ok(Some(Item {
            text: String::from_utf8_lossy(&word).into_owned(),
            ends_line,
        }))
    }
}

/// What to do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Run this command line (the command first).
    Run(Vec<String>),
    /// Stop with this error (exit status 1).
    Fail(String),
    /// The input is used up.
    Done,
}

/// The command lines of one `xargs` run, built one at a time as the input is read.
pub struct Batches<'a> {
    options: &'a Options,
    command: Vec<String>,
    reader: Reader<'a>,
    /// An item read but left for the next command line (it did not fit).
    pending: Option<Item>,
    /// An input error, reported after the items before it have run.
    failed: Option<String>,
    ran: bool,
    done: bool,
}

impl<'a> Batches<'a> {
    /// The command lines of `options` over `input`.
    pub fn new(options: &'a Options, input: &'a [u8]) -> Self {
        Batches {
            options,
            command: options.command(),
            reader: Reader::new(input, options),
            pending: None,
            failed: None,
            ran: false,
            done: false,
        }
    }

    /// The next command line.
    pub fn next_step(&mut self) -> Step {
        if let Some(error) = self.failed.take() {
            self.done = true;
            return Step::Fail(error);
        }
        if self.done {
            return Step::Done;
        }
        let step = match &self.options.replace {
            Some(repl) => self.replaced(&repl.clone()),
            None => self.appended(),
        };
        if matches!(step, Step::Fail(_) | Step::Done) {
            self.done = true;
        }
        step
    }

    fn read(&mut self) -> Option<Item> {
        if let Some(item) = self.pending.take() {
            return Some(item);
        }
        match self.reader.next_item() {
            Ok(item) => item,
            Err(error) => {
                self.failed = Some(error);
                None
            }
        }
    }

    /// `-I`: one command line per input line.
    fn replaced(&mut self, repl: &str) -> Step {
        let Some(item) = self.read() else {
            return match self.failed.take() {
                Some(error) => Step::Fail(error),
                None => Step::Done,
            };
        };
        let base = size(&self.command);
        if base + item.text.len() + 1 > self.options.max_chars {
            return Step::Fail("argument line too long".to_string());
        }
        let mut argv = Vec::with_capacity(self.command.len());
        argv.push(self.command[0].clone());
        for arg in &self.command[1..] {
            argv.push(if repl.is_empty() {
                arg.clone()
            } else {
                arg.replace(repl, &item.text)
            });
        }
        if size(&argv) > self.options.max_chars {
            return Step::Fail("argument list too long".to_string());
        }
        self.ran = true;
        Step::Run(argv)
    }

    /// The default: items appended to the command, as many as `-n`, `-L` and the size allow.
    fn appended(&mut self) -> Step {
        let mut argv = self.command.clone();
        let mut total = size(&argv);
        if total > self.options.max_chars {
            return Step::Fail("argument line too long".to_string());
        }
        let (mut count, mut lines) = (0usize, 0usize);
        while let Some(item) = self.read() {
            let needed = item.text.len() + 1;
            if total + needed > self.options.max_chars {
                if count == 0 {
                    return Step::Fail("argument line too long".to_string());
                }
                if self.options.exit_if_too_long
                    && (self.options.max_args.is_some() || self.options.max_lines.is_some())
                {
                    return Step::Fail("argument list too long".to_string());
                }
                self.pending = Some(item);
                break;
            }
            total += needed;
            count += 1;
            lines += usize::from(item.ends_line);
            argv.push(item.text);
            if self.options.max_args == Some(count) || self.options.max_lines == Some(lines) {
                break;
            }
        }
        if count == 0 {
            if let Some(error) = self.failed.take() {
                return Step::Fail(error);
            }
            // GNU runs the command once on an empty input unless -r is given.
            if self.ran || self.options.no_run_if_empty {
                return Step::Done;
            }
            self.done = true;
        }
        self.ran = true;
        Step::Run(argv)
    }
}

/// The size of a command line as GNU counts it: every word and its terminating NUL.
fn size(argv: &[String]) -> usize {
    argv.iter().map(|word| word.len() + 1).sum()
}

/// A command line as `-t` prints it: words that need it in single quotes.
pub fn trace(argv: &[String]) -> String {
    let words: Vec<String> = argv
        .iter()
        .map(|word| {
            let plain = !word.is_empty()
                && word.chars().all(|c| {
                    c.is_ascii_alphanumeric()
                        || matches!(c, '_' | '@' | '%' | '+' | '=' | ':' | ',' | '.' | '/' | '-')
                });
            if plain {
                word.clone()
            } else {
                format!("'{}'", word.replace('\'', "'\\''"))
            }
        })
        .collect();
    format!("{}\n", words.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(args: &[&str]) -> Options {
        let args: Vec<String> = args.iter().map(|arg| arg.to_string()).collect();
        match parse_args(&args) {
            Ok(Invocation::Run(options)) => options,
            other => panic!("{args:?}: {other:?}"),
        }
    }

    fn error(args: &[&str]) -> String {
        let args: Vec<String> = args.iter().map(|arg| arg.to_string()).collect();
        match parse_args(&args) {
            Err(message) => message,
            other => panic!("{args:?} parsed: {other:?}"),
        }
    }

    /// Every step of `xargs ARGS` over `input`, `Fail` as `!message`.
    fn runs(args: &[&str], input: &str) -> Vec<String> {
        let options = options(args);
        let mut batches = Batches::new(&options, input.as_bytes());
        let mut steps = Vec::new();
        loop {
            match batches.next_step() {
                Step::Run(argv) => steps.push(argv.join("|")),
                Step::Fail(message) => {
                    steps.push(format!("!{message}"));
                    break;
                }
                Step::Done => break,
            }
            assert!(steps.len() < 10_000, "runaway");
        }
        steps
    }

    fn items(args: &[&str], input: &str) -> Vec<String> {
        let options = options(args);
        let mut reader = Reader::new(input.as_bytes(), &options);
        let mut items = Vec::new();
        while let Some(item) = reader.next_item().expect("items") {
            items.push(item.text);
        }
        items
    }

    #[test]
    fn blanks_and_newlines_separate_and_quotes_and_backslashes_protect() {
        assert_eq!(
            items(&[], "  a\tb\n\n c 'd e' \"f  g\" h\\ i j'k'l \"\" ''\n"),
            ["a", "b", "c", "d e", "f  g", "h i", "jkl", "", ""]
        );
        // Inside single quotes a double quote and a backslash are plain, and the other way round.
        assert_eq!(items(&[], r#"'a"b' "c'd" 'e\f'"#), ["a\"b", "c'd", "e\\f"]);
        // A backslash protects a newline too.
        assert_eq!(items(&[], "a\\\nb c"), ["a\nb", "c"]);
        assert!(items(&[], "").is_empty());
        assert!(items(&[], " \n\t\n").is_empty());
    }

    #[test]
    fn an_open_quote_is_an_error_after_the_items_before_it_ran() {
        assert_eq!(
            runs(&["echo"], "a 'b"),
            [
                "echo|a",
                "!unmatched single quote; by default quotes are special to xargs unless you use the -0 option"
            ]
        );
        // A quote does not span lines.
        assert_eq!(
            runs(&["echo"], "x\"a\nb\"\n"),
            [
                "!unmatched double quote; by default quotes are special to xargs unless you use the -0 option"
            ]
        );
    }

    #[test]
    fn nul_and_delimiter_split_literally() {
        assert_eq!(
            items(&["-0"], "a b\0'c'\0\0d\\e\0"),
            ["a b", "'c'", "", "d\\e"]
        );
        assert_eq!(items(&["-0"], "a\0b"), ["a", "b"]);
        assert_eq!(items(&["--null"], "x\ny\0"), ["x\ny"]);
        assert_eq!(items(&["-d", ","], "a,,b c\n"), ["a", "", "b c\n"]);
        assert_eq!(items(&["-d\\n"], "a b\n'c\n"), ["a b", "'c"]);
        assert_eq!(items(&["--delimiter=\\t"], "a\tb"), ["a", "b"]);
        assert_eq!(items(&["-d", "\\x3a"], "a:b"), ["a", "b"]);
        assert_eq!(items(&["-d", "\\072"], "a:b"), ["a", "b"]);
        assert_eq!(items(&["-d", "\\0"], "a\0b"), ["a", "b"]);
        assert!(error(&["-d", "ab"]).contains("single character or an escape"));
        assert!(error(&["-d", "\\x"]).contains("single character or an escape"));
    }

    #[test]
    fn max_args_groups_items() {
        assert_eq!(
            runs(&["-n", "2", "rm", "-f"], "a b c\nd e"),
            ["rm|-f|a|b", "rm|-f|c|d", "rm|-f|e"]
        );
        assert_eq!(runs(&["-n1"], "a b"), ["echo|a", "echo|b"]);
        assert_eq!(runs(&["--max-args=3", "x"], "1 2 3 4"), ["x|1|2|3", "x|4"]);
        assert_eq!(runs(&["--max-args", "3", "x"], "1"), ["x|1"]);
        // All in one command line by default.
        assert_eq!(runs(&["wc", "-l"], "a\nb\nc\n"), ["wc|-l|a|b|c"]);
    }

    #[test]
    fn max_lines_counts_non_blank_lines_and_a_trailing_blank_goes_on() {
        assert_eq!(
            runs(&["-L", "2"], "a b\nc\nd e f\n"),
            ["echo|a|b|c", "echo|d|e|f"]
        );
        assert_eq!(runs(&["-L1"], "a b \nc\n\n\nd\n"), ["echo|a|b|c", "echo|d"]);
        assert_eq!(runs(&["-l"], "a\nb\n"), ["echo|a", "echo|b"]);
        // The last of -n and -L wins.
        assert_eq!(
            runs(&["-L", "1", "-n", "2"], "a\nb\nc\n"),
            ["echo|a|b", "echo|c"]
        );
    }

    #[test]
    fn replace_runs_once_per_line_and_replaces_every_occurrence() {
        assert_eq!(
            runs(&["-I{}", "mv", "{}", "{}.bak"], "a b\n\n  c\n"),
            ["mv|a b|a b.bak", "mv|c|c.bak"]
        );
        assert_eq!(
            runs(&["-I", "X", "echo", "pre-X-X"], "1\n"),
            ["echo|pre-1-1"]
        );
        assert_eq!(
            runs(&["-i", "echo", "[{}]"], " 'q  r' s \n"),
            ["echo|[q  r s ]"]
        );
        assert_eq!(runs(&["--replace=@", "echo", "@"], "a\n"), ["echo|a"]);
        // The command's own name is never replaced (as GNU xargs).
        assert_eq!(runs(&["-I{}", "{}", "x"], "rm\n"), ["{}|x"]);
        // Without the string in the arguments the line is dropped, the command still runs.
        assert_eq!(runs(&["-I{}", "echo", "x"], "a\nb\n"), ["echo|x", "echo|x"]);
        // An empty input runs nothing with -I.
        assert!(runs(&["-I{}", "echo", "{}"], "\n  \n").is_empty());
        // A redirection in an item is text: the item is one argument.
        assert_eq!(runs(&["-I{}", "echo", "{}"], "> f\n"), ["echo|> f"]);
    }

    #[test]
    fn an_empty_input_runs_once_unless_no_run_if_empty() {
        assert_eq!(runs(&[], ""), ["echo"]);
        assert_eq!(runs(&["rm"], "\n \n"), ["rm"]);
        assert!(runs(&["-r", "rm"], "").is_empty());
        assert!(runs(&["--no-run-if-empty", "rm"], "  ").is_empty());
        assert_eq!(runs(&["-r", "rm"], "a"), ["rm|a"]);
    }

    #[test]
    fn the_eof_string_ends_the_input() {
        assert_eq!(runs(&["-E", "STOP"], "a\nSTOP\nb\n"), ["echo|a"]);
        assert_eq!(runs(&["-eEND"], "a END b"), ["echo|a"]);
        assert_eq!(runs(&["-E", "a"], "a\nb\n"), ["echo"]);
        // Ignored with -0.
        assert_eq!(runs(&["-0", "-E", "a"], "a\0b"), ["echo|a|b"]);
    }

    #[test]
    fn the_size_limit_splits_command_lines_and_an_item_too_long_is_an_error() {
        // `echo 1 2` is 9 bytes with their NULs.
        assert_eq!(
            runs(&["-s", "10", "echo"], "1 2 3 4 5"),
            ["echo|1|2", "echo|3|4", "echo|5"]
        );
        assert_eq!(
            runs(&["-x", "-n", "3", "-s", "8", "echo"], "1 2 3 4 5"),
            ["!argument list too long"]
        );
        let long = "a".repeat(MAX_COMMAND_BYTES);
        assert_eq!(
            runs(&["echo"], &format!("x {long} y")),
            ["echo|x", "!argument line too long"]
        );
        assert_eq!(
            runs(&["-I{}", "echo", "{}"], &long),
            ["!argument line too long"]
        );
        let half = "a".repeat(MAX_COMMAND_BYTES / 2);
        assert_eq!(
            runs(&["-I{}", "echo", "{} {}"], &half),
            ["!argument list too long"]
        );
        // Many short items make several command lines, none over the limit.
        let input = "word ".repeat(100_000);
        let options = options(&["echo"]);
        let mut batches = Batches::new(&options, input.as_bytes());
        let mut count = 0;
        while let Step::Run(argv) = batches.next_step() {
            assert!(size(&argv) <= MAX_COMMAND_BYTES);
            count += argv.len() - 1;
        }
        assert_eq!(count, 100_000);
        let options = super::tests::options(&["-s", "999999999"]);
        assert_eq!(options.max_chars, MAX_COMMAND_BYTES);
        assert_eq!(options.warnings.len(), 1);
    }

    #[test]
    fn options_are_read_as_gnu_reads_them() {
        let parsed = options(&["-0rt", "-n5", "-P", "4", "grep", "-l", "x"]);
        assert_eq!(parsed.delimiter, Some(0));
        assert!(parsed.no_run_if_empty && parsed.verbose);
        assert_eq!(parsed.max_args, Some(5));
        assert_eq!(parsed.command, ["grep", "-l", "x"]);
        // Options end at the command: its own options are its.
        assert_eq!(options(&["rm", "-r", "-n"]).command, ["rm", "-r", "-n"]);
        assert_eq!(options(&["--", "-weird"]).command, ["-weird"]);
        assert_eq!(
            options(&["-a", "list.txt"]).arg_file.as_deref(),
            Some("list.txt")
        );
        assert_eq!(options(&["-I", "{}"]).replace.as_deref(), Some("{}"));
        assert!(matches!(
            parse_args(&["--help".to_string()]),
            Ok(Invocation::Help)
        ));
        assert!(error(&["-n", "0"]).contains("should be >= 1"));
        assert!(error(&["-n", "x"]).contains("invalid number"));
        assert!(error(&["-n"]).contains("requires an argument"));
        assert!(error(&["-q"]).contains("invalid option"));
        assert!(error(&["--frobnicate"]).contains("unrecognized option"));
        assert!(error(&["-p", "rm"]).contains("no terminal"));
    }

    #[test]
    fn the_plan_finds_the_command_word() {
        let start = |args: &[&str]| {
            let args: Vec<String> = args.iter().map(|arg| arg.to_string()).collect();
            command_start(&args)
        };
        assert_eq!(
            start(&["-0", "-n", "1", "rm", "-f"]),
            Some(CommandStart {
                index: Some(3),
                replace: None
            })
        );
        assert_eq!(
            start(&["-I", "%", "mv", "%"]),
            Some(CommandStart {
                index: Some(2),
                replace: Some("%".into())
            })
        );
        assert_eq!(
            start(&["-r"]),
            Some(CommandStart {
                index: None,
                replace: None
            })
        );
        assert_eq!(start(&["-n"]), None);
        assert_eq!(start(&["--help", "rm"]), None);
    }

    #[test]
    fn trace_quotes_what_needs_it() {
        let argv: Vec<String> = ["echo", "a b", "it's", "", "x/y.z"]
            .iter()
            .map(|word| word.to_string())
            .collect();
        assert_eq!(trace(&argv), "echo 'a b' 'it'\\''s' '' x/y.z\n");
    }
}
