//! `diff`: compare two files line by line, or two directories name by name. Output is GNU's
//! normal format by default, unified with `-u`/`-U N`, one line per differing pair with `-q`.
//! `-r` descends into common subdirectories, `-N` treats a file missing on one side as empty
//! (its unified header says `/dev/null`, which patch reads as create or delete), `--label`
//! replaces a header name, `-i`, `-b` and `-w` ignore case and white space, `-x` leaves names
//! out of a directory comparison. Lines are matched by similar's Myers with a time budget: past
//! it the script stays correct but may be longer than the shortest one. It is one file
//! (over 700 lines) because it is one command: the options and the `Differ` that compares files and
//! directories and writes each output format work together, with the edit script in `script`.

use std::fs;
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use similar::DiffTag;

use crate::lines::split_lines;

mod script;

use script::{diff_lines, write_normal, write_unified};

const USAGE: &str = "usage: diff [-u | -U N] [-q] [-s] [-r] [-N] [-a] [-i] [-b] [-w] [-x PATTERN]... \
[--label NAME]... FROM TO";

/// How long the line matcher may look for the shortest edit script. Past it, similar settles
/// for a longer script (still correct), so very different large files finish in bounded time.
const MATCH_BUDGET: Duration = Duration::from_secs(4);

/// How many leading bytes are checked for a NUL byte, the sign of a binary file (as GNU does).
const BINARY_PROBE: usize = 8192;

/// The exit status: no differences, differences, trouble.
const SAME: i32 = 0;
const DIFFERENT: i32 = 1;
const TROUBLE: i32 = 2;

#[derive(Debug, Default)]
struct Options {
    /// Lines of context when the output is unified; `None` for the normal format.
    unified: Option<usize>,
    brief: bool,
    report_identical: bool,
    recursive: bool,
    new_file: bool,
    text: bool,
    ignore_case: bool,
    ignore_space_change: bool,
    ignore_all_space: bool,
    labels: Vec<String>,
    excludes: Vec<String>,
    /// The options as given, repeated in the `diff ...` line before each pair in a directory.
    switches: Vec<String>,
    operands: Vec<String>,
    help: bool,
}

impl Options {
    fn ignores_something(&self) -> bool {
        self.ignore_case || self.ignore_space_change || self.ignore_all_space
    }
}

/// Run `diff` with `args` (the arguments after the program name); return the exit status.
pub fn main(args: &[String]) -> i32 {
    let options = match parse_args(args) {
        Ok(options) => options,
        Err(message) => {
            eprintln!("diff: {message}\n{USAGE}");
            return TROUBLE;
        }
    };
    if options.help {
        println!("{USAGE}");
        return SAME;
    }
    let [from, to] = options.operands.as_slice() else {
        let problem = if options.operands.len() < 2 {
            "missing operand: give the two files or directories to compare"
        } else {
            "extra operand: diff compares exactly two files or directories"
        };
        eprintln!("diff: {problem}\n{USAGE}");
        return TROUBLE;
    };
    let stdout = io::stdout();
    let mut differ = Differ {
        options: &options,
        out: BufWriter::new(stdout.lock()),
    };
    let status = differ.compare_operands(from, to);
    let flushed = differ.out.flush();
    match status.and_then(|status| flushed.map(|()| status)) {
        Ok(status) => status,
        Err(error) if error.kind() == io::ErrorKind::BrokenPipe => DIFFERENT,
        Err(error) => {
            eprintln!("diff: cannot write the output: {error}");
            TROUBLE
        }
    }
}

fn parse_args(args: &[String]) -> Result<Options, String> {
    let mut options = Options::default();
    let mut iter = args.iter();
    let mut only_operands = false;
    while let Some(arg) = iter.next() {
        if only_operands || arg == "-" || !arg.starts_with('-') {
            options.operands.push(arg.clone());
            continue;
        }
        if arg == "--" {
            only_operands = true;
            continue;
        }
        options.switches.push(arg.clone());
        if let Some(long) = arg.strip_prefix("--") {
            let (name, inline) = match long.split_once('=') {
                Some((name, value)) => (name, Some(value.to_string())),
                None => (long, None),
            };
            let mut value = |what: &str| -> Result<String, String> {
                if let Some(value) = inline.clone() {
                    return Ok(value);
                }
                iter.next()
                    .cloned()
                    .ok_or_else(|| format!("option '--{name}' needs {what}"))
            };
            match name {
                "unified" => {
                    options.unified = Some(match &inline {
                        Some(count) => parse_count(count)?,
                        None => 3,
                    })
                }
                "normal" => options.unified = None,
                "brief" => options.brief = true,
                "report-identical-files" => options.report_identical = true,
                "recursive" => options.recursive = true,
                "new-file" => options.new_file = true,
                "text" => options.text = true,
                "ignore-case" => options.ignore_case = true,
                "ignore-space-change" => options.ignore_space_change = true,
                "ignore-all-space" => options.ignore_all_space = true,
                "label" => {
                    let label = value("a name")?;
                    options.labels.push(label);
                }
                "exclude" => {
                    let pattern = value("a pattern")?;
                    options.excludes.push(pattern);
                }
                "help" => options.help = true,
                "context" | "ed" | "side-by-side" | "rcs" | "ifdef" => {
                    return Err(format!(
                        "the output format '--{name}' is not supported; use -u (unified) or the \
                         default normal format"
                    ));
                }
                _ => return Err(format!("unrecognized option '{arg}'")),
            }
            continue;
        }
        let cluster = &arg[1..];
        for (index, flag) in cluster.char_indices() {
            let rest = &cluster[index + flag.len_utf8()..];
            match flag {
                'u' => {
                    if options.unified.is_none() {
                        options.unified = Some(3);
                    }
                }
                'q' => options.brief = true,
                's' => options.report_identical = true,
                'r' => options.recursive = true,
                'N' => options.new_file = true,
                'a' => options.text = true,
                'i' => options.ignore_case = true,
                'b' => options.ignore_space_change = true,
                'w' => options.ignore_all_space = true,
                'U' | 'x' => {
                    let value = if rest.is_empty() {
                        iter.next()
                            .cloned()
                            .ok_or_else(|| format!("option '-{flag}' needs a value"))?
                    } else {
                        rest.to_string()
                    };
                    if rest.is_empty() {
                        options.switches.push(value.clone());
                    }
                    if flag == 'U' {
                        options.unified = Some(parse_count(&value)?);
                    } else {
                        options.excludes.push(value);
                    }
                    break;
                }
                'c' | 'C' | 'e' | 'y' | 'n' => {
                    return Err(format!(
                        "the output format '-{flag}' is not supported; use -u (unified) or the \
                         default normal format"
                    ));
                }
                _ => return Err(format!("invalid option -- '{flag}'")),
            }
        }
    }
    Ok(options)
}

fn parse_count(text: &str) -> Result<usize, String> {
    text.parse()
        .map_err(|_| format!("invalid context length '{text}': give a whole number of lines"))
}

/// One side of a comparison.
#[derive(Debug, Clone)]
enum Input {
    Stdin,
    File(PathBuf),
    /// Missing, compared as empty (`-N`).
    Absent,
}

/// What a directory entry is, for a directory comparison.
#[derive(Debug, PartialEq)]
enum Kind {
    File {
        empty: bool,
    },
    Directory,
    /// A symbolic link to a directory: compared by its target, never followed (no loops).
    LinkToDirectory(PathBuf),
    Other,
}

impl Kind {
    fn describe(&self) -> &'static str {
        match self {
            Kind::File { empty: true } => "regular empty file",
            Kind::File { empty: false } => "regular file",
            Kind::Directory => "directory",
            Kind::LinkToDirectory(_) => "symbolic link",
            Kind::Other => "special file",
        }
    }
}

struct Differ<'a, W: Write> {
    options: &'a Options,
    out: W,
}

impl<W: Write> Differ<'_, W> {
    /// Compare the two operands given on the command line.
    fn compare_operands(&mut self, from: &str, to: &str) -> io::Result<i32> {
        let from_meta = (from != "-").then(|| fs::metadata(from));
        let to_meta = (to != "-").then(|| fs::metadata(to));
        let missing = |meta: &Option<io::Result<fs::Metadata>>| matches!(meta, Some(Err(error)) if error.kind() == io::ErrorKind::NotFound);
        let (from_missing, to_missing) = (missing(&from_meta), missing(&to_meta));
        let mut trouble = false;
        for (name, meta, other_missing) in
            [(from, &from_meta, to_missing), (to, &to_meta, from_missing)]
        {
            if let Some(Err(error)) = meta {
                let absent_is_fine = self.options.new_file
                    && error.kind() == io::ErrorKind::NotFound
                    && !other_missing;
                if !absent_is_fine {
                    eprintln!("diff: {name}: {}", describe_error(error));
                    trouble = true;
                }
            }
        }
        if trouble {
            return Ok(TROUBLE);
        }
        let is_dir = |meta: &Option<io::Result<fs::Metadata>>| matches!(meta, Some(Ok(meta)) if meta.is_dir());
        match (is_dir(&from_meta), is_dir(&to_meta)) {
            (true, true) => {
                self.compare_directories(Some(Path::new(from)), Some(Path::new(to)), from, to)
            }
            (true, false) | (false, true) if from == "-" || to == "-" => {
                eprintln!("diff: cannot compare '-' to a directory");
                Ok(TROUBLE)
            }
            (true, false) if to_missing => {
                eprintln!("diff: {to}: No such file or directory");
                Ok(TROUBLE)
            }
            (false, true) if from_missing => {
                eprintln!("diff: {from}: No such file or directory");
                Ok(TROUBLE)
            }
            (true, false) => {
                let inner = join(from, file_name(to));
                self.compare_files(
                    Input::File(PathBuf::from(&inner)),
                    Input::File(PathBuf::from(to)),
                    &inner,
                    to,
                    None,
                )
            }
            (false, true) => {
                let inner = join(to, file_name(from));
                self.compare_files(
                    Input::File(PathBuf::from(from)),
                    Input::File(PathBuf::from(&inner)),
                    from,
                    &inner,
                    None,
                )
            }
            (false, false) => {
                let input = |name: &str, missing: bool| match (name, missing) {
                    ("-", _) => Input::Stdin,
                    (_, true) => Input::Absent,
                    _ => Input::File(PathBuf::from(name)),
                };
                self.compare_files(
                    input(from, from_missing),
                    input(to, to_missing),
                    from,
                    to,
                    None,
                )
            }
        }
    }

    /// Compare two directories entry by entry; either may be absent (`-N -r`, a directory on
    /// one side only), and then each entry of the other is compared with nothing.
    fn compare_directories(
        &mut self,
        from: Option<&Path>,
        to: Option<&Path>,
        from_name: &str,
        to_name: &str,
    ) -> io::Result<i32> {
        let mut status = SAME;
        let mut list = |dir: Option<&Path>, name: &str| -> Vec<String> {
            let Some(dir) = dir else {
                return Vec::new();
            };
            match read_names(dir) {
                Ok(names) => names
                    .into_iter()
                    .filter(|entry| !self.is_excluded(entry))
                    .collect(),
                Err(error) => {
                    eprintln!("diff: {name}: {}", describe_error(&error));
                    status = TROUBLE;
                    Vec::new()
                }
            }
        };
        let from_names = list(from, from_name);
        let to_names = list(to, to_name);
        let (mut left, mut right) = (0, 0);
        while left < from_names.len() || right < to_names.len() {
            let order = match (from_names.get(left), to_names.get(right)) {
                (Some(a), Some(b)) => a.as_bytes().cmp(b.as_bytes()),
                (Some(_), None) => std::cmp::Ordering::Less,
                _ => std::cmp::Ordering::Greater,
            };
            let (in_from, in_to) = match order {
                std::cmp::Ordering::Less => (from_names.get(left), None),
                std::cmp::Ordering::Greater => (None, to_names.get(right)),
                std::cmp::Ordering::Equal => (from_names.get(left), to_names.get(right)),
            };
            if in_from.is_some() {
                left += 1;
            }
            if in_to.is_some() {
                right += 1;
            }
            let Some(entry) = in_from.or(in_to) else {
                break;
            };
            let from_entry = join(from_name, entry);
            let to_entry = join(to_name, entry);
            let entry_status = if (in_from.is_some() && in_to.is_some()) || self.options.new_file {
                self.compare_entries(
                    in_from.and(from.map(|dir| dir.join(entry))),
                    in_to.and(to.map(|dir| dir.join(entry))),
                    &from_entry,
                    &to_entry,
                )?
            } else {
                let dir_name = if in_from.is_some() {
                    from_name
                } else {
                    to_name
                };
                writeln!(self.out, "Only in {dir_name}: {entry}")?;
                DIFFERENT
            };
            status = status.max(entry_status);
        }
        Ok(status)
    }

    /// Compare one name found in a directory comparison (on one side or both).
    fn compare_entries(
        &mut self,
        from: Option<PathBuf>,
        to: Option<PathBuf>,
        from_name: &str,
        to_name: &str,
    ) -> io::Result<i32> {
        let kind = |path: &Option<PathBuf>, name: &str| match path {
            None => Ok(None),
            Some(path) => entry_kind(path).map(Some).map_err(|error| {
                eprintln!("diff: {name}: {}", describe_error(&error));
            }),
        };
        let (Ok(from_kind), Ok(to_kind)) = (kind(&from, from_name), kind(&to, to_name)) else {
            return Ok(TROUBLE);
        };
        match (from_kind, to_kind) {
            (Some(Kind::Directory), Some(Kind::Directory)) if !self.options.recursive => {
                writeln!(self.out, "Common subdirectories: {from_name} and {to_name}")?;
                Ok(SAME)
            }
            (Some(Kind::Directory), Some(Kind::Directory))
            | (Some(Kind::Directory), None)
            | (None, Some(Kind::Directory))
                if self.options.recursive =>
            {
                self.compare_directories(from.as_deref(), to.as_deref(), from_name, to_name)
            }
            (Some(Kind::File { .. }), Some(Kind::File { .. }))
            | (Some(Kind::File { .. }), None)
            | (None, Some(Kind::File { .. })) => {
                let input = |path: Option<PathBuf>| path.map_or(Input::Absent, Input::File);
                let command = self.command_line(from_name, to_name);
                self.compare_files(input(from), input(to), from_name, to_name, Some(command))
            }
            (Some(Kind::LinkToDirectory(a)), Some(Kind::LinkToDirectory(b))) => {
                if a == b {
                    Ok(SAME)
                } else {
                    writeln!(self.out, "Symbolic links {from_name} and {to_name} differ")?;
                    Ok(DIFFERENT)
                }
            }
            (Some(_), None) => {
                writeln!(
                    self.out,
                    "Only in {}: {}",
                    parent_name(from_name),
                    file_name(from_name)
                )?;
                Ok(DIFFERENT)
            }
            (None, Some(_)) => {
                writeln!(
                    self.out,
                    "Only in {}: {}",
                    parent_name(to_name),
                    file_name(to_name)
                )?;
                Ok(DIFFERENT)
            }
            (Some(a), Some(b)) => {
                writeln!(
                    self.out,
                    "File {from_name} is a {} while file {to_name} is a {}",
                    a.describe(),
                    b.describe()
                )?;
                Ok(DIFFERENT)
            }
            (None, None) => Ok(SAME),
        }
    }

    /// The `diff -r a/x b/x` line printed before a pair's differences in a directory.
    fn command_line(&self, from_name: &str, to_name: &str) -> String {
        let mut line = String::from("diff");
        for switch in &self.options.switches {
            line.push(' ');
            line.push_str(switch);
        }
        line.push_str(&format!(" {from_name} {to_name}"));
        line
    }

    fn is_excluded(&self, name: &str) -> bool {
        self.options
            .excludes
            .iter()
            .any(|pattern| glob_matches(pattern.as_bytes(), name.as_bytes()))
    }

    /// Compare two files (or standard input, or nothing) and print their differences.
    fn compare_files(
        &mut self,
        from: Input,
        to: Input,
        from_name: &str,
        to_name: &str,
        command: Option<String>,
    ) -> io::Result<i32> {
        let (from_text, to_text) = match (read_input(&from), read_input(&to)) {
            (Ok(a), Ok(b)) => (a, b),
            (a, b) => {
                for (result, name) in [(a, from_name), (b, to_name)] {
                    if let Err(error) = result {
                        eprintln!("diff: {name}: {}", describe_error(&error));
                    }
                }
                return Ok(TROUBLE);
            }
        };
        if from_text == to_text {
            if self.options.report_identical {
                writeln!(self.out, "Files {from_name} and {to_name} are identical")?;
            }
            return Ok(SAME);
        }
        let binary = !self.options.text && (looks_binary(&from_text) || looks_binary(&to_text));
        if binary {
            writeln!(self.out, "Binary files {from_name} and {to_name} differ")?;
            return Ok(DIFFERENT);
        }
        if self.options.brief && !self.options.ignores_something() {
            writeln!(self.out, "Files {from_name} and {to_name} differ")?;
            return Ok(DIFFERENT);
        }
        let old = split_lines(&from_text);
        let new = split_lines(&to_text);
        let ops = diff_lines(&old, &new, self.options);
        if ops.iter().all(|op| op.tag() == DiffTag::Equal) {
            return Ok(SAME);
        }
        if self.options.brief {
            writeln!(self.out, "Files {from_name} and {to_name} differ")?;
            return Ok(DIFFERENT);
        }
        if let Some(command) = command {
            writeln!(self.out, "{command}")?;
        }
        match self.options.unified {
            Some(context) => {
                let from_header = self.header(0, &from, from_name);
                let to_header = self.header(1, &to, to_name);
                writeln!(self.out, "--- {from_header}")?;
                writeln!(self.out, "+++ {to_header}")?;
                write_unified(&mut self.out, &old, &new, ops, context)?;
            }
            None => write_normal(&mut self.out, &old, &new, &ops)?,
        }
        Ok(DIFFERENT)
    }

    /// The name and time shown after `---` (side 0) or `+++` (side 1) in a unified diff.
    fn header(&self, side: usize, input: &Input, name: &str) -> String {
        if let Some(label) = self.options.labels.get(side) {
            return label.clone();
        }
        match input {
            Input::Absent => "/dev/null".to_string(),
            Input::Stdin => format!("{name}\t{}", format_time(SystemTime::now())),
            Input::File(path) => match fs::metadata(path).and_then(|meta| meta.modified()) {
                Ok(time) => format!("{name}\t{}", format_time(time)),
                Err(_) => name.to_string(),
            },
        }
    }
}

fn read_input(input: &Input) -> io::Result<Vec<u8>> {
    match input {
        Input::Stdin => {
            let mut text = Vec::new();
            io::stdin().lock().read_to_end(&mut text)?;
            Ok(text)
        }
        Input::File(path) => fs::read(path),
        Input::Absent => Ok(Vec::new()),
    }
}

fn looks_binary(text: &[u8]) -> bool {
    memchr::memchr(0, &text[..text.len().min(BINARY_PROBE)]).is_some()
}

/// The names in `dir`, sorted bytewise.
fn read_names(dir: &Path) -> io::Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in fs::read_dir(dir)? {
        names.push(entry?.file_name().to_string_lossy().into_owned());
    }
    names.sort_unstable_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    Ok(names)
}

/// What `path` is; a symbolic link to a file counts as the file, one to a directory as itself.
fn entry_kind(path: &Path) -> io::Result<Kind> {
    let link = fs::symlink_metadata(path)?;
    let meta = if link.file_type().is_symlink() {
        let meta = fs::metadata(path)?;
        if meta.is_dir() {
            return Ok(Kind::LinkToDirectory(fs::read_link(path)?));
        }
        meta
    } else {
        link
    };
    Ok(if meta.is_dir() {
        Kind::Directory
    } else if meta.is_file() {
        Kind::File {
            empty: meta.len() == 0,
        }
    } else {
        Kind::Other
    })
}

/// `dir/name`, without doubling a slash the directory was given with.
fn join(dir: &str, name: &str) -> String {
    if dir.ends_with('/') {
        format!("{dir}{name}")
    } else {
        format!("{dir}/{name}")
    }
}

fn file_name(path: &str) -> &str {
    path.trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or(path)
}

fn parent_name(path: &str) -> &str {
    match path.trim_end_matches('/').rsplit_once('/') {
        Some((parent, _)) if !parent.is_empty() => parent,
        Some(_) => "/",
        None => ".",
    }
}

/// The usual wording of an I/O error, without Rust's `(os error N)` suffix.
pub fn describe_error(error: &io::Error) -> String {
    match error.kind() {
        io::ErrorKind::NotFound => "No such file or directory".to_string(),
        io::ErrorKind::PermissionDenied => "Permission denied".to_string(),
        io::ErrorKind::IsADirectory => "Is a directory".to_string(),
        io::ErrorKind::NotADirectory => "Not a directory".to_string(),
        _ => {
            let text = error.to_string();
            match text.find(" (os error") {
                Some(cut) => text[..cut].to_string(),
                None => text,
            }
        }
    }
}

/// A shell-style glob (`*`, `?`, `[...]`) matched against a whole name, for `-x`.
fn glob_matches(pattern: &[u8], name: &[u8]) -> bool {
    match pattern.split_first() {
        None => name.is_empty(),
        Some((b'*', rest)) => (0..=name.len()).any(|skip| glob_matches(rest, &name[skip..])),
        Some((b'?', rest)) => !name.is_empty() && glob_matches(rest, &name[1..]),
        Some((b'[', rest)) => {
            let Some((&first, name_rest)) = name.split_first() else {
                return false;
            };
            let (negated, set) = match rest.split_first() {
                Some((b'!' | b'^', set)) => (true, set),
                _ => (false, rest),
            };
            // The set ends at the first `]` after its first member.
            let Some(close) = set.iter().skip(1).position(|&byte| byte == b']') else {
                return first == b'[' && glob_matches(rest, name_rest);
            };
            let members = &set[..close + 1];
            let mut matched = false;
            let mut index = 0;
            while index < members.len() {
                if index + 2 < members.len() && members[index + 1] == b'-' {
                    matched |= (members[index]..=members[index + 2]).contains(&first);
                    index += 3;
                } else {
                    matched |= members[index] == first;
                    index += 1;
                }
            }
            matched != negated && glob_matches(&set[close + 2..], name_rest)
        }
        Some((&literal, rest)) => name.first() == Some(&literal) && glob_matches(rest, &name[1..]),
    }
}

/// `2024-05-01 12:34:56.123456789 +0000`, the time format of GNU's unified headers (in UTC: a
/// WASI program has no time zone).
fn format_time(time: SystemTime) -> String {
    let (seconds, nanos) = match time.duration_since(UNIX_EPOCH) {
        Ok(since) => (
            i64::try_from(since.as_secs()).unwrap_or(i64::MAX),
            since.subsec_nanos(),
        ),
        Err(_) => (0, 0),
    };
    let days = seconds.div_euclid(86_400);
    let of_day = seconds.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}.{nanos:09} +0000",
        of_day / 3600,
        of_day / 60 % 60,
        of_day % 60
    )
}

/// The proleptic Gregorian date of a day number counted from 1970-01-01 (Howard Hinnant's
/// algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (
        year,
        u32::try_from(month).unwrap_or(1),
        u32::try_from(day).unwrap_or(1),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(args: &[&str]) -> Options {
        parse_args(&args.iter().map(|arg| arg.to_string()).collect::<Vec<_>>()).unwrap()
    }

    fn render(old: &str, new: &str, args: &[&str]) -> String {
        let options = options(args);
        let old_lines = split_lines(old.as_bytes());
        let new_lines = split_lines(new.as_bytes());
        let ops = diff_lines(&old_lines, &new_lines, &options);
        let mut out = Vec::new();
        match options.unified {
            Some(context) => write_unified(&mut out, &old_lines, &new_lines, ops, context),
            None => write_normal(&mut out, &old_lines, &new_lines, &ops),
        }
        .unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn unified_hunks_match_gnu() {
        let old = "a\nb\nc\nd\ne\nf\ng\nh\ni\nj\n";
        let new = "a\nb\nC\nd\ne\nf\ng\nh\ni\nj\nk\n";
        assert_eq!(
            render(old, new, &["-u"]),
            "@@ -1,6 +1,6 @@\n a\n b\n-c\n+C\n d\n e\n f\n@@ -8,3 +8,4 @@\n h\n i\n j\n+k\n"
        );
        assert_eq!(
            render(old, new, &["-U1"]),
            "@@ -2,3 +2,3 @@\n b\n-c\n+C\n d\n@@ -10 +10,2 @@\n j\n+k\n"
        );
        assert_eq!(render("", "x\n", &["-u"]), "@@ -0,0 +1 @@\n+x\n");
        assert_eq!(render("a\nb\n", "a\n", &["-U", "0"]), "@@ -2 +1,0 @@\n-b\n");
    }

    #[test]
    fn missing_newline_is_marked() {
        assert_eq!(
            render("a\n", "a", &["-u"]),
            "@@ -1 +1 @@\n-a\n+a\n\\ No newline at end of file\n"
        );
    }

    #[test]
    fn normal_format_matches_gnu() {
        assert_eq!(
            render("a\nb\nc\n", "a\nB\nc\nd\n", &[]),
            "2c2\n< b\n---\n> B\n3a4\n> d\n"
        );
        assert_eq!(render("a\nb\nc\n", "c\n", &[]), "1,2d0\n< a\n< b\n");
    }

    #[test]
    fn white_space_and_case_can_be_ignored() {
        assert_eq!(render("a  b\n", "a b \n", &["-b"]), "");
        assert_eq!(render("a  b\n", "ab\n", &["-w"]), "");
        assert_eq!(render("Hello\n", "hello\n", &["-i"]), "");
        assert_ne!(render("a  b\n", "ab\n", &["-b"]), "");
        assert_ne!(render("  a\n", "a\n", &["-b"]), "");
        assert_eq!(render("  a\n", " a\t\n", &["-b"]), "");
    }

    #[test]
    fn options_combine() {
        let parsed = options(&["-ruN", "--label", "x", "--label=y", "-U5", "a", "b"]);
        assert!(parsed.recursive && parsed.new_file);
        assert_eq!(parsed.unified, Some(5));
        assert_eq!(parsed.labels, vec!["x", "y"]);
        assert_eq!(parsed.operands, vec!["a", "b"]);
        assert!(parse_args(&["-c".into()]).is_err());
        assert!(parse_args(&["--bogus".into()]).is_err());
        assert!(parse_args(&["-U".into(), "many".into()]).is_err());
    }

    #[test]
    fn globs_match_names() {
        assert!(glob_matches(b"*.o", b"main.o"));
        assert!(!glob_matches(b"*.o", b"main.c"));
        assert!(glob_matches(b"t?st", b"test"));
        assert!(glob_matches(b"[a-c]x", b"bx"));
        assert!(!glob_matches(b"[!a-c]x", b"bx"));
    }

    #[test]
    fn times_are_formatted_in_utc() {
        let time = UNIX_EPOCH + Duration::new(1_700_000_000, 5);
        assert_eq!(format_time(time), "2023-11-14 22:13:20.000000005 +0000");
        assert_eq!(
            format_time(UNIX_EPOCH),
            "1970-01-01 00:00:00.000000000 +0000"
        );
    }

    #[test]
    fn directories_compare_name_by_name() {
        let root = std::env::temp_dir().join(format!("clawcage-diff-dirs-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        for (path, text) in [
            ("a/same.txt", "same\n"),
            ("a/changed.txt", "one\n"),
            ("a/only-a.txt", "x\n"),
            ("a/sub/deep.txt", "old\n"),
            ("b/same.txt", "same\n"),
            ("b/changed.txt", "two\n"),
            ("b/only-b.txt", "y\n"),
            ("b/sub/deep.txt", "new\n"),
        ] {
            let path = root.join(path);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, text).unwrap();
        }
        let a = root.join("a").display().to_string();
        let b = root.join("b").display().to_string();
        let run = |args: &[&str]| {
            let options = options(args);
            let mut differ = Differ {
                options: &options,
                out: Vec::new(),
            };
            let status = differ.compare_operands(&a, &b).unwrap();
            (status, String::from_utf8(differ.out).unwrap())
        };
        let (status, text) = run(&["-r"]);
        assert_eq!(status, 1);
        assert_eq!(
            text,
            format!(
                "diff -r {a}/changed.txt {b}/changed.txt\n1c1\n< one\n---\n> two\n\
                 Only in {a}: only-a.txt\nOnly in {b}: only-b.txt\n\
                 diff -r {a}/sub/deep.txt {b}/sub/deep.txt\n1c1\n< old\n---\n> new\n"
            )
        );
        let (_, text) = run(&["-q"]);
        assert!(text.contains(&format!("Common subdirectories: {a}/sub and {b}/sub\n")));
        assert!(text.contains(&format!(
            "Files {a}/changed.txt and {b}/changed.txt differ\n"
        )));
        let (_, text) = run(&["-ruN"]);
        assert!(text.contains("--- /dev/null\n"), "{text}");
        assert!(
            text.contains("+++ /dev/null\n@@ -1 +0,0 @@\n-x\n"),
            "{text}"
        );
        assert!(text.contains("@@ -0,0 +1 @@\n+y\n"), "{text}");
        fs::remove_dir_all(&root).unwrap();
    }
}
