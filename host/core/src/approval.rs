//! The approvals contract between the sandbox and the agent: what a command line will run (the
//! [`ExecPlan`] the exec component reports before anything runs), the operator's exec policy
//! (`deny` / `allowlist` / `full`, allowlist entries, safe bins), the unwrapping of wrapper
//! programs (`timeout rm` is `rm`; `coreutils rm` is `rm`), and the [`ApprovalGate`] the sandbox
//! asks before an exec call and the [`ApprovedExec`] it checks every program against while the
//! call runs. Plain types and pure functions, so the rules are unit-tested without a runtime; the
//! agent crate implements the gate (the broker that asks a person).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// What one command line will run, as the shell parsed it, before anything runs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecPlan {
    /// The command line as the model wrote it.
    pub command: String,
    /// Every program of every pipeline stage of every `&&`, `||` and `;` segment, including those
    /// inside `sh -c`, command substitutions, loops and conditionals, in source order.
    pub commands: Vec<PlannedCommand>,
    /// Every file the command line opens for writing by redirection (`> f`, `>> f`, `>| f`,
    /// `<> f`, `&> f`, `>& f`), a program's or a builtin's (`echo x > f`, `: > f`) or a group's
    /// (`{ ...; } > f`), in source order. `2>&1` and `> /dev/null` write no file.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub writes: Vec<PlannedWrite>,
}

/// One file a command line writes by redirection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedWrite {
    /// The redirection as written (`> copy.txt`, `2>> "$LOG"`).
    pub redirection: String,
    /// What the file's name may become at run time.
    pub target: ArgMatch,
}

impl PlannedWrite {
    /// Whether a file the shell opens for writing at `path` (absolute: the shell joins a relative
    /// name to its working directory) is this write. A relative target matches by its last
    /// components, whatever the working directory (`cd` is not followed by the plan); a target
    /// known only at run time (`> "$F"`, `> $F`) matches any path of its shape.
    pub fn matches_path(&self, path: &str) -> bool {
        match &self.target {
            ArgMatch::Exact(name) if name.starts_with('/') => path == name,
            ArgMatch::Exact(name) => path
                .strip_suffix(name.as_str())
                .is_some_and(|parent| parent.ends_with('/')),
            ArgMatch::Glob(pattern) if pattern.starts_with('/') => glob_match(pattern, path),
            ArgMatch::Glob(pattern) => glob_match(&format!("*/{pattern}"), path),
            ArgMatch::Any => true,
        }
    }
}

/// One program the command line may run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedCommand {
    /// The program's name, or `None` when the name is only known at run time (`$CMD args`).
    pub program: Option<String>,
    /// The command word as written (`rm`, `/bin/rm`, `$CMD`).
    pub written: String,
    /// The arguments as written, each with what it may become at run time.
    pub args: Vec<PlannedArg>,
    /// The redirections as written (`> out.txt`, `2>&1`), shown to the operator.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub redirections: Vec<String>,
}

/// One argument of a planned command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedArg {
    /// The word as written (`-r`, `"$f"`, `*.txt`).
    pub written: String,
    /// What it expands to.
    pub matches: ArgMatch,
}

/// What a written word may expand to at run time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "value")]
pub enum ArgMatch {
    /// Exactly this one argument.
    Exact(String),
    /// One argument matching this glob (`*` any text, `?` one character, `\` escapes): a quoted
    /// word with an expansion inside, such as `"$f"` or `"out-$(date)"`.
    Glob(String),
    /// Any number of arguments (zero included): an unquoted expansion or glob, which field
    /// splitting and pathname expansion may turn into several.
    Any,
}

impl PlannedCommand {
    /// The command as the operator reads it: the written words joined by spaces.
    pub fn display(&self) -> String {
        let mut words = vec![self.written.clone()];
        words.extend(self.args.iter().map(|arg| arg.written.clone()));
        words.extend(self.redirections.iter().cloned());
        words.join(" ")
    }

    /// Whether a program run with `program` and `args` (already unwrapped) is this command.
    pub fn matches(&self, program: &str, args: &[String]) -> bool {
        if let Some(planned) = &self.program
            && planned != program
        {
            return false;
        }
        args_match(&self.args, args)
    }
}

impl ExecPlan {
    /// The plan as one line per command, then one line per write by redirection, for the
    /// operator.
    pub fn summary(&self) -> String {
        self.commands
            .iter()
            .map(PlannedCommand::display)
            .chain(self.writes.iter().map(PlannedWrite::display))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl PlannedWrite {
    /// The write as the operator reads it: `writes a file: > copy.txt`.
    pub fn display(&self) -> String {
        format!("writes a file: {}", self.redirection)
    }
}

/// Whether the arguments a program really got fit the planned ones: each `Exact` or `Glob` is one
/// argument, each `Any` zero or more. A `Glob` (an argument partly known only at run time, such
/// as `build/$X` or xargs's `build/{}`) follows the allowlist's rule: an argument climbing out
/// with `..` fits only a pattern that writes `..` itself, so an approved `rm -r build/$X` never
/// removes `build/../victim.txt`.
fn args_match(planned: &[PlannedArg], actual: &[String]) -> bool {
    let planned: Vec<&ArgMatch> = planned.iter().map(|arg| &arg.matches).collect();
    words_match(&planned, actual, entry_word_matches)
}

/// Whether `actual` fits `planned`: each `Exact` is that one argument, each `Glob` one argument
/// `glob` accepts, each `Any` zero or more arguments. The same star loop as [`glob_match`], over
/// arguments instead of characters: linear in practice, no backtracking blow-up (this runs on
/// the host for every program a call starts, whatever the guest planned).
fn words_match(
    planned: &[&ArgMatch],
    actual: &[String],
    glob: impl Fn(&str, &str) -> bool,
) -> bool {
    let one = |planned: &ArgMatch, actual: &String| match planned {
        ArgMatch::Exact(text) => text == actual,
        ArgMatch::Glob(pattern) => glob(pattern, actual),
        ArgMatch::Any => false,
    };
    let (mut p, mut a) = (0usize, 0usize);
    let mut any: Option<(usize, usize)> = None;
    while a < actual.len() {
        match planned.get(p) {
            Some(ArgMatch::Any) => {
                any = Some((p, a));
                p += 1;
                continue;
            }
            Some(next) if one(next, &actual[a]) => {
                p += 1;
                a += 1;
                continue;
            }
            _ => {}
        }
        match any {
            Some((any_p, any_a)) => {
                p = any_p + 1;
                a = any_a + 1;
                any = Some((any_p, any_a + 1));
            }
            None => return false,
        }
    }
    planned[p..]
        .iter()
        .all(|rest| matches!(rest, ArgMatch::Any))
}

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
fn escape_white_space(pattern: &str) -> String {
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
fn entry_words(pattern: &str) -> Vec<ArgMatch> {
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
fn entry_word_matches(word: &str, argument: &str) -> bool {
    glob_match(word, argument)
        && (word.contains("..") || !argument.split(['/', '=']).any(|part| part == ".."))
}

/// What exec may run at all: `[approvals] exec`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ExecMode {
    /// Nothing: every exec call is refused.
    Deny,
    /// Only allowlisted programs and safe bins.
    Allowlist,
    /// Anything the sandbox lets it reach (the default).
    #[default]
    Full,
}

/// When the operator is asked: `[approvals] ask`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AskMode {
    /// Never (the default): the mode alone decides.
    #[default]
    Off,
    /// When a command is not covered by the allowlist.
    OnMiss,
    /// For every command line.
    Always,
}

impl ExecMode {
    /// Every mode, in the order they are listed to the operator.
    pub const ALL: [ExecMode; 3] = [ExecMode::Deny, ExecMode::Allowlist, ExecMode::Full];

    /// `deny`, `allowlist` or `full`: the name in the configuration and on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            ExecMode::Deny => "deny",
            ExecMode::Allowlist => "allowlist",
            ExecMode::Full => "full",
        }
    }
}

impl AskMode {
    /// Every mode, in the order they are listed to the operator.
    pub const ALL: [AskMode; 3] = [AskMode::Off, AskMode::OnMiss, AskMode::Always];

    /// `off`, `on-miss` or `always`: the name in the configuration and on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            AskMode::Off => "off",
            AskMode::OnMiss => "on-miss",
            AskMode::Always => "always",
        }
    }
}

/// The valid names of `modes`, quoted and joined for an error message.
fn valid_names(names: impl Iterator<Item = &'static str>) -> String {
    let quoted: Vec<String> = names.map(|name| format!("\"{name}\"")).collect();
    match quoted.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        _ => quoted.join(""),
    }
}

impl std::str::FromStr for ExecMode {
    type Err = String;

    /// Reads a mode's name; the error lists the valid ones.
    fn from_str(text: &str) -> Result<ExecMode, String> {
        ExecMode::ALL
            .into_iter()
            .find(|mode| mode.as_str() == text)
            .ok_or_else(|| {
                format!(
                    "use {}",
                    valid_names(ExecMode::ALL.iter().map(|m| m.as_str()))
                )
            })
    }
}

impl std::str::FromStr for AskMode {
    type Err = String;

    /// Reads a mode's name; the error lists the valid ones.
    fn from_str(text: &str) -> Result<AskMode, String> {
        AskMode::ALL
            .into_iter()
            .find(|mode| mode.as_str() == text)
            .ok_or_else(|| {
                format!(
                    "use {}",
                    valid_names(AskMode::ALL.iter().map(|m| m.as_str()))
                )
            })
    }
}

/// The programs that pass without an allowlist entry when they read standard input only.
pub const DEFAULT_SAFE_BINS: &[&str] = &["head", "tail", "wc", "cut", "uniq", "tr", "sort"];

/// One allowlist entry: a program and, optionally, a glob over its arguments joined by spaces.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllowEntry {
    /// The program's name (`rm`, `grep`); never a path.
    pub program: String,
    /// The arguments' pattern, one word per argument (white space in a word escaped with `\`):
    /// a word is a glob over one argument (`*` any text within it, `?` one character), and a
    /// word that is `*` alone any number of arguments. `None` allows any arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<String>,
}

impl AllowEntry {
    /// Reads `PROGRAM [ARGS-GLOB]` (`"ls"`, `"rm -r build/*"`). The program is a bare name.
    pub fn parse(text: &str) -> Result<AllowEntry, String> {
        let text = text.trim();
        let (program, args) = match text.split_once(char::is_whitespace) {
            Some((program, args)) => (program, Some(args.trim().to_string())),
            None => (text, None),
        };
        if program.is_empty() {
            return Err("an allowlist entry is empty; write a program name such as \"ls\" or \"rm -r build/*\"".to_string());
        }
        if program.contains('/') || program.contains('*') || program.contains('?') {
            return Err(format!(
                "allowlist entry `{text}`: the program must be a bare name (such as `rm`), not a path or a pattern"
            ));
        }
        Ok(AllowEntry {
            program: program.to_string(),
            args,
        })
    }

    /// Whether `program args` is allowed by this entry: each word of the pattern covers one
    /// argument, never a run of them (`rm -r build/*` allows `rm -r build/x`, not
    /// `rm -r build/x src`), except a lone `*`, which covers any number.
    pub fn allows(&self, program: &str, args: &[String]) -> bool {
        self.program == program
            && match &self.args {
                None => true,
                Some(pattern) => {
                    let words = entry_words(pattern);
                    let words: Vec<&ArgMatch> = words.iter().collect();
                    words_match(&words, args, entry_word_matches)
                }
            }
    }

    /// An entry that allows exactly `command` (its arguments as globs, `Any` as `*`), or `None`
    /// when its program is only known at run time.
    pub fn exactly(command: &PlannedCommand) -> Option<AllowEntry> {
        let program = command.program.clone()?;
        let args = command
            .args
            .iter()
            .map(|arg| match &arg.matches {
                ArgMatch::Exact(text) => glob_escape(text),
                ArgMatch::Glob(pattern) => escape_white_space(pattern),
                ArgMatch::Any => "*".to_string(),
            })
            .collect::<Vec<_>>()
            .join(" ");
        Some(AllowEntry {
            program,
            args: Some(args),
        })
    }
}

impl fmt::Display for AllowEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.args {
            Some(args) => write!(f, "{} {args}", self.program),
            None => write!(f, "{} *", self.program),
        }
    }
}

/// The operator's exec policy: the mode, the allowlist (configured and approved-always) and the
/// safe bins.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecPolicy {
    /// What exec may run at all.
    pub mode: ExecMode,
    /// The allowlist.
    pub allow: Vec<AllowEntry>,
    /// Programs that pass when they read standard input only.
    pub safe_bins: Vec<String>,
}

/// Why a command is, or is not, covered without asking.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Coverage {
    /// The mode is `full`.
    Full,
    /// An allowlist entry covers it.
    Allowlisted,
    /// A safe bin reading standard input only.
    SafeBin,
    /// Not covered; the text says why, for the operator and the model.
    Miss(String),
}

impl ExecPolicy {
    /// Whether a program about to run (`program args`, as the host receives it) is covered.
    pub fn covers(&self, program: &str, args: &[String]) -> Coverage {
        let effective = unwrap_program(program, args);
        if let Some(reason) = &effective.opaque {
            return match self.mode {
                ExecMode::Full => Coverage::Full,
                _ => Coverage::Miss(reason.clone()),
            };
        }
        self.covers_effective(&effective.program, &effective.args)
    }

    fn covers_effective(&self, program: &str, args: &[String]) -> Coverage {
        match self.mode {
            ExecMode::Full => Coverage::Full,
            ExecMode::Deny => Coverage::Miss("exec is disabled by the operator".to_string()),
            ExecMode::Allowlist => {
                if self.allow.iter().any(|entry| entry.allows(program, args)) {
                    Coverage::Allowlisted
                } else if self.safe_bins.iter().any(|bin| bin == program)
                    && reads_stdin_only(program, args)
                {
                    Coverage::SafeBin
                } else {
                    Coverage::Miss(format!(
                        "`{}` is not on the allowlist",
                        shown(program, args)
                    ))
                }
            }
        }
    }

    /// Whether a planned command is covered. A command whose program or arguments are only
    /// known at run time is covered by `full` only, or by an entry that allows any arguments.
    pub fn covers_planned(&self, command: &PlannedCommand) -> Coverage {
        if self.mode == ExecMode::Full {
            return Coverage::Full;
        }
        let Some(program) = &command.program else {
            return Coverage::Miss(format!(
                "`{}` names its program only at run time",
                command.display()
            ));
        };
        let exact: Option<Vec<String>> = command
            .args
            .iter()
            .map(|arg| match &arg.matches {
                ArgMatch::Exact(text) => Some(text.clone()),
                _ => None,
            })
            .collect();
        match exact {
            Some(args) => self.covers(program, &args),
            None => {
                let effective = unwrap_program(program, &[]);
                let any_args = self.mode == ExecMode::Allowlist
                    && effective.opaque.is_none()
                    && self
                        .allow
                        .iter()
                        .any(|entry| entry.program == effective.program && entry.args.is_none());
                if any_args {
                    Coverage::Allowlisted
                } else {
                    Coverage::Miss(format!(
                        "`{}` has arguments known only at run time",
                        command.display()
                    ))
                }
            }
        }
    }
}

impl ExecPolicy {
    /// Whether a write by redirection is covered. An allowlist entry allows running a program,
    /// never writing a file through the shell, so under `allowlist` no such write is covered: it
    /// is refused or asked like a program the list misses.
    pub fn covers_write(&self, write: &PlannedWrite) -> Coverage {
        match self.mode {
            ExecMode::Full => Coverage::Full,
            ExecMode::Deny => Coverage::Miss("exec is disabled by the operator".to_string()),
            ExecMode::Allowlist => Coverage::Miss(format!(
                "`{}` writes a file, and writes by redirection are not on the allowlist",
                write.redirection
            )),
        }
    }

    /// Why the plan is not covered, one reason per command or write the policy misses (none:
    /// covered).
    pub fn misses(&self, plan: &ExecPlan) -> Vec<String> {
        let commands = plan
            .commands
            .iter()
            .map(|command| self.covers_planned(command));
        let writes = plan.writes.iter().map(|write| self.covers_write(write));
        commands
            .chain(writes)
            .filter_map(|coverage| match coverage {
                Coverage::Miss(reason) => Some(reason),
                _ => None,
            })
            .collect()
    }
}

fn shown(program: &str, args: &[String]) -> String {
    if args.is_empty() {
        program.to_string()
    } else {
        format!("{program} {}", args.join(" "))
    }
}

/// A program as it really runs, after wrappers are taken off.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Effective {
    /// The program that really runs.
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Set when what really runs cannot be known from the arguments (`xargs`, `find -exec`, a
    /// shell): the text says why. Such a command is never covered by an allowlist.
    pub opaque: Option<String>,
}

/// The multicall program whose first argument names the program that runs.
pub const MULTICALL: &str = "coreutils";

/// Takes wrapper programs off: `coreutils NAME`, `timeout`, `nice`, `nohup`, `env`, `stdbuf`,
/// `command`, `builtin`, `exec`. Programs that run a command whose words come from somewhere
/// else (`xargs`, `find -exec`, `sh`, `eval`, `chroot`, ...) are reported as opaque.
pub fn unwrap_program(program: &str, args: &[String]) -> Effective {
    let mut program = program.rsplit('/').next().unwrap_or(program).to_string();
    let mut args = args.to_vec();
    for _ in 0..16 {
        let rest: Option<usize> = match program.as_str() {
            MULTICALL | "command" | "builtin" | "exec" | "nohup" => skip_options(&args, &[], 0),
            "timeout" => skip_options(&args, &["-s", "--signal", "-k", "--kill-after"], 1),
            "nice" => skip_options(&args, &["-n", "--adjustment"], 0),
            "stdbuf" => skip_options(
                &args,
                &["-i", "-o", "-e", "--input", "--output", "--error"],
                0,
            ),
            "env" => {
                let after = skip_options(
                    &args,
                    &["-u", "--unset", "-C", "--chdir", "-S", "--split-string"],
                    0,
                );
                if args
                    .iter()
                    .any(|arg| arg == "-S" || arg.starts_with("--split-string"))
                {
                    return opaque(program, args, "`env -S` splits a string into a command");
                }
                after.map(|start| {
                    start
                        + args[start..]
                            .iter()
                            .take_while(|arg| arg.contains('=') && !arg.starts_with('='))
                            .count()
                })
            }
            "xargs" => {
                return opaque(
                    program,
                    args,
                    "`xargs` builds the command's arguments from its input",
                );
            }
            "find" => {
                if args
                    .iter()
                    .any(|arg| matches!(arg.as_str(), "-exec" | "-execdir" | "-ok" | "-okdir"))
                {
                    return opaque(
                        program,
                        args,
                        "`find -exec` runs a command for every file it finds",
                    );
                }
                None
            }
            "sh" | "bash" | "dash" | "zsh" | "ksh" | "eval" | "source" | "." | "chroot" | "su"
            | "sudo" | "doas" | "setsid" | "unshare" | "nsenter" | "runcon" | "chrt" | "ionice"
            | "taskset" | "watch" | "parallel" | "busybox" | "script" => {
                return opaque(program, args, "it runs commands given as text");
            }
            _ => None,
        };
        match rest {
            Some(start) if start < args.len() => {
                program = args[start]
                    .rsplit('/')
                    .next()
                    .unwrap_or(&args[start])
                    .to_string();
                args = args[start + 1..].to_vec();
            }
            Some(_) => break,
            None => break,
        }
    }
    Effective {
        program,
        args,
        opaque: None,
    }
}

fn opaque(program: String, args: Vec<String>, why: &str) -> Effective {
    let reason = format!(
        "`{}`: {why}, so what runs cannot be checked",
        shown(&program, &args)
    );
    Effective {
        program,
        args,
        opaque: Some(reason),
    }
}

/// The index of the first word after the options (and `positional` more words), or `None` when
/// no command follows. `with_value` lists the options that take the next word as their value.
fn skip_options(args: &[String], with_value: &[&str], positional: usize) -> Option<usize> {
    let mut index = 0;
    while let Some(arg) = args.get(index) {
        if arg == "--" {
            index += 1;
            break;
        }
        if !arg.starts_with('-') || arg == "-" {
            break;
        }
        let takes_value = with_value.iter().any(|option| arg == option);
        index += if takes_value { 2 } else { 1 };
    }
    let start = index + positional;
    (start < args.len()).then_some(start)
}

/// Whether a safe bin's arguments name no file: only options it knows, with their values.
fn reads_stdin_only(program: &str, args: &[String]) -> bool {
    // Options that take the next word as their value, and flags without one, per program.
    let (with_value, flags): (&[&str], &[&str]) = match program {
        "head" | "tail" => (
            &["-n", "-c"],
            &[
                "-q",
                "-v",
                "-z",
                "-f",
                "-F",
                "--quiet",
                "--silent",
                "--verbose",
                "--zero-terminated",
            ],
        ),
        "wc" => (
            &[],
            &[
                "-l",
                "-w",
                "-c",
                "-m",
                "-L",
                "--lines",
                "--words",
                "--bytes",
                "--chars",
                "--max-line-length",
            ],
        ),
        "cut" => (
            &["-d", "-f", "-c", "-b", "--output-delimiter"],
            &[
                "-s",
                "-n",
                "-z",
                "--complement",
                "--only-delimited",
                "--zero-terminated",
            ],
        ),
        "uniq" => (
            &["-f", "-s", "-w"],
            &[
                "-c",
                "-d",
                "-D",
                "-u",
                "-i",
                "-z",
                "--count",
                "--repeated",
                "--unique",
                "--ignore-case",
                "--zero-terminated",
            ],
        ),
        "tr" => (
            &[],
            &[
                "-c",
                "-C",
                "-d",
                "-s",
                "-t",
                "--complement",
                "--delete",
                "--squeeze-repeats",
                "--truncate-set1",
            ],
        ),
        "sort" => (
            &[
                "-k",
                "-t",
                "-S",
                "--key",
                "--field-separator",
                "--buffer-size",
            ],
            &[
                "-b",
                "-d",
                "-f",
                "-g",
                "-h",
                "-i",
                "-M",
                "-n",
                "-r",
                "-R",
                "-s",
                "-u",
                "-V",
                "-z",
                "--reverse",
                "--unique",
                "--numeric-sort",
                "--stable",
                "--ignore-case",
            ],
        ),
        _ => return false,
    };
    let mut index = 0;
    while let Some(arg) = args.get(index) {
        if program == "tr" && !arg.starts_with('-') {
            // tr's operands are character sets, never files.
            index += 1;
            continue;
        }
        if with_value.contains(&arg.as_str()) {
            index += 2;
            continue;
        }
        if flags.contains(&arg.as_str()) {
            index += 1;
            continue;
        }
        // An attached value (`-n5`, `-d,`, `--key=2`) of a known option.
        let attached = with_value.iter().any(|option| {
            (option.len() == 2 && arg.len() > 2 && arg.starts_with(option))
                || (option.starts_with("--") && arg.starts_with(&format!("{option}=")))
        }) || (program != "tr"
            && arg.len() > 1
            && arg.starts_with('-')
            && !arg.starts_with("--")
            && arg[1..]
                .chars()
                .all(|c| flags.contains(&format!("-{c}").as_str())));
        // `head -5` and `tail -5` are line counts.
        let count = matches!(program, "head" | "tail")
            && arg.len() > 1
            && arg.starts_with('-')
            && arg[1..].chars().all(|c| c.is_ascii_digit());
        if attached || count {
            index += 1;
            continue;
        }
        return false;
    }
    true
}

/// The operator's decision on one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ApprovalDecision {
    /// This request only.
    AllowOnce,
    /// This request and, from now on, the same command (or host, or path).
    AllowAlways,
    /// Not this request.
    Deny,
}

impl ApprovalDecision {
    /// Reads `allow-once`, `allow-always`, `deny` (and the one-letter answers `y`, `a`, `n`).
    pub fn parse(text: &str) -> Option<ApprovalDecision> {
        match text.trim().to_ascii_lowercase().as_str() {
            "allow-once" | "once" | "y" | "yes" => Some(ApprovalDecision::AllowOnce),
            "allow-always" | "always" | "a" => Some(ApprovalDecision::AllowAlways),
            "deny" | "n" | "no" => Some(ApprovalDecision::Deny),
            _ => None,
        }
    }

    /// `allow-once`, `allow-always` or `deny`.
    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalDecision::AllowOnce => "allow-once",
            ApprovalDecision::AllowAlways => "allow-always",
            ApprovalDecision::Deny => "deny",
        }
    }
}

/// What an exec call may run, fixed before it starts: the policy and the commands the operator
/// approved. Every program the call starts is checked against it by the host.
#[derive(Debug, Clone, Default)]
pub struct ApprovedExec {
    /// The policy at the time of the decision.
    pub policy: ExecPolicy,
    /// The commands the operator approved for this call (empty when nobody was asked).
    pub approved: Vec<PlannedCommand>,
    /// The writes by redirection the operator approved for this call (empty when nobody was
    /// asked). Under `full` every write passes; otherwise only these.
    pub approved_writes: Vec<PlannedWrite>,
}

/// Why the host refused a program or a write of an exec call: it is outside the operator's
/// policy and outside the plan the operator approved. Shown to the model as a sentence.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExecRefusal {
    /// A program the call was about to start.
    #[error(
        "denied by the operator's exec policy: {reason}, and `{command}` is not part of the command that was approved; a different command needs its own approval"
    )]
    Program {
        /// Why the policy does not cover it.
        reason: String,
        /// The program and its arguments, as shown.
        command: String,
    },
    /// A file the shell was about to open for writing by redirection.
    #[error(
        "denied by the operator's exec policy: {reason}, and `{redirection}` is not part of the command that was approved; a different command needs its own approval"
    )]
    Write {
        /// Why the policy does not cover it.
        reason: String,
        /// The redirection, e.g. `> /ws/notes.txt`.
        redirection: String,
    },
}

impl ApprovedExec {
    /// Checks one program about to run.
    pub fn check(&self, program: &str, args: &[String]) -> Result<(), ExecRefusal> {
        match self.policy.covers(program, args) {
            Coverage::Miss(reason) => {
                let effective = unwrap_program(program, args);
                let approved = effective.opaque.is_none()
                    && self
                        .approved
                        .iter()
                        .any(|command| command.matches(&effective.program, &effective.args));
                let approved_as_written = self
                    .approved
                    .iter()
                    .any(|command| command.matches(program, args));
                if approved || approved_as_written {
                    Ok(())
                } else {
                    Err(ExecRefusal::Program {
                        reason,
                        command: shown(program, args),
                    })
                }
            }
            _ => Ok(()),
        }
    }
}

impl ApprovedExec {
    /// Checks one file the shell is about to open for writing by redirection (`path` absolute,
    /// `append` for `>>`). Under `full` every write passes;
    /// otherwise only a write the operator approved in this call's plan, so a write the plan did
    /// not show (a script rewritten after the plan, `sh -c "$X"`) is refused before the file is
    /// opened.
    pub fn check_write(&self, path: &str, append: bool) -> Result<(), ExecRefusal> {
        if self.policy.mode == ExecMode::Full
            || self
                .approved_writes
                .iter()
                .any(|write| write.matches_path(path))
        {
            return Ok(());
        }
        let redirection = format!("{} {path}", if append { ">>" } else { ">" });
        let reason = match self.policy.mode {
            ExecMode::Deny => "exec is disabled by the operator".to_string(),
            _ => format!(
                "`{redirection}` writes a file, and writes by redirection are not on the allowlist"
            ),
        };
        Err(ExecRefusal::Write {
            reason,
            redirection,
        })
    }
}

/// How the gate answered.
#[derive(Debug, Clone)]
pub enum GateAnswer {
    /// Run, checking every program against this.
    Allowed(Arc<ApprovedExec>),
    /// Do not run; the text is the tool result for the model.
    Denied(String),
}

/// A future the gate returns.
pub type GateFuture = Pin<Box<dyn Future<Output = GateAnswer> + Send>>;

/// Decides an exec call before it runs. Implemented by the agent crate's approvals broker, which
/// may ask a person; the sandbox holds it in the exec grant.
pub trait ApprovalGate: Send + Sync + fmt::Debug {
    /// Whether the gate needs the plan at all (false when the policy is `full` without asking:
    /// then no plan is made and nothing is checked).
    fn active(&self) -> bool;
    /// Decide on the plan of one exec call. `None` when the component could not report a plan:
    /// then only what the policy covers may run.
    fn review(&self, tool: &str, plan: Option<ExecPlan>) -> GateFuture;
    /// Whether a request to a host off the network allow-list is asked instead of refused
    /// (`[approvals] network = "ask"`).
    fn asks_network(&self) -> bool {
        false
    }
    /// Decides on one request to the host `entry` names (the allow-list entry that names exactly
    /// its host, port and scheme). `Ok` allows this request; the error is the sentence for the
    /// model. Allow-always answers are kept by the gate, which then allows later requests itself.
    fn review_network(&self, entry: &str) -> RequestGateFuture {
        let entry = entry.to_string();
        Box::pin(async move { Err(format!("requests to {entry} are not allowed")) })
    }
    /// Whether a change under a read-only workspace is asked instead of refused
    /// (`[approvals] write = "ask"`): the reviewer that asks, bound to the calling session (taken
    /// when this is called, so that programs running on other tasks ask for the same session),
    /// or `None` when such writes are refused.
    fn write_reviewer(&self) -> Option<WriteReviewer> {
        None
    }
}

/// A future the gate returns for one request beyond the grants (a host, a write): `Ok` allows
/// exactly that request; the error is the sentence for the model.
pub type RequestGateFuture = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

/// Decides on one write under a read-only workspace, for the session it was bound to.
pub type WriteReviewer = Arc<dyn Fn(WriteRequest) -> RequestGateFuture + Send + Sync>;

/// What a write under a read-only workspace would change, as the sandbox saw it: the operation
/// and the absolute paths it touches (lexically normalised, inside the workspace).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteRequest {
    /// What would be done.
    pub operation: WriteOperation,
    /// The path changed; for a rename or a hard link, the source then the new name.
    pub paths: Vec<String>,
    /// For a symbolic link: the text it would point to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_target: Option<String>,
}

/// The operations a write approval can allow, one per mutating `wasi:filesystem` function (and
/// the shell's output redirection).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WriteOperation {
    /// Open a file for writing: create it, empty it or change it.
    Write,
    /// Create a directory.
    CreateDirectory,
    /// Remove an empty directory.
    RemoveDirectory,
    /// Remove a file or a symbolic link.
    Remove,
    /// Rename or move.
    Rename,
    /// Create a symbolic link.
    Symlink,
    /// Create a hard link.
    HardLink,
    /// Change a file's access or modification time.
    SetTimes,
}

impl WriteRequest {
    /// One line for the operator and the model: `create or change /ws/a.txt`,
    /// `rename /ws/a to /ws/b`.
    pub fn describe(&self) -> String {
        let first = self.paths.first().map(String::as_str).unwrap_or("?");
        let second = self.paths.get(1).map(String::as_str).unwrap_or("?");
        match self.operation {
            WriteOperation::Write => format!("create or change {first}"),
            WriteOperation::CreateDirectory => format!("create the directory {first}"),
            WriteOperation::RemoveDirectory => format!("remove the directory {first}"),
            WriteOperation::Remove => format!("remove {first}"),
            WriteOperation::Rename => format!("rename {first} to {second}"),
            WriteOperation::Symlink => format!(
                "create the symbolic link {first} -> {}",
                self.link_target.as_deref().unwrap_or("?")
            ),
            WriteOperation::HardLink => format!("create the hard link {second} to {first}"),
            WriteOperation::SetTimes => format!("change the times of {first}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(words: &[&str]) -> Vec<String> {
        words.iter().map(|word| word.to_string()).collect()
    }

    fn allowlist(entries: &[&str]) -> ExecPolicy {
        ExecPolicy {
            mode: ExecMode::Allowlist,
            allow: entries
                .iter()
                .map(|entry| AllowEntry::parse(entry).expect("entry"))
                .collect(),
            safe_bins: strings(DEFAULT_SAFE_BINS),
        }
    }

    #[test]
    fn planned_arguments_match_like_a_glob_over_words_and_stay_fast() {
        let arg = |matches: ArgMatch| PlannedArg {
            written: String::new(),
            matches,
        };
        let exact = |text: &str| arg(ArgMatch::Exact(text.to_string()));
        let words = |list: &[&str]| strings(list);
        let plan = [exact("-r"), arg(ArgMatch::Any), exact("end")];
        assert!(args_match(&plan, &words(&["-r", "end"])));
        assert!(args_match(&plan, &words(&["-r", "a", "b", "end"])));
        assert!(!args_match(&plan, &words(&["-r", "a", "b"])));
        assert!(!args_match(&plan, &words(&["-x", "end"])));
        let plan = [arg(ArgMatch::Glob("*.txt".into())), arg(ArgMatch::Any)];
        assert!(args_match(&plan, &words(&["a.txt"])));
        assert!(args_match(&plan, &words(&["a.txt", "b", "c"])));
        assert!(!args_match(&plan, &words(&[])));
        assert!(args_match(&[arg(ArgMatch::Any)], &words(&[])));
        assert!(args_match(&[], &words(&[])));
        assert!(!args_match(&[], &words(&["x"])));
        // A plan of many unquoted expansions against a long command that does not fit: the
        // backtracking form took C(n+k, k) steps (about 10^17 here); this one stays quick.
        let mut plan: Vec<PlannedArg> = (0..30).map(|_| arg(ArgMatch::Any)).collect();
        plan.push(exact("z"));
        let actual: Vec<String> = (0..60).map(|_| "a".to_string()).collect();
        let started = std::time::Instant::now();
        assert!(!args_match(&plan, &actual));
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
    }

    #[test]
    fn globs_match_any_text_and_escape_their_metacharacters() {
        assert!(glob_match("-r build/*", "-r build/a b"));
        assert!(!glob_match("-r build/*", "-r /etc"));
        assert!(glob_match("a?c", "abc"));
        assert!(glob_match("\\*", "*"));
        assert!(!glob_match("\\*", "x"));
        assert!(glob_match(&glob_escape("a*b?"), "a*b?"));
        assert!(!glob_match(&glob_escape("a*b?"), "aXXbY"));
        assert!(glob_match("", ""));
        assert!(!glob_match("", "x"));
        // A pathological pattern stays fast.
        let text = "a".repeat(10_000);
        assert!(!glob_match(&format!("{}b", "*a".repeat(50)), &text));
    }

    #[test]
    fn wrappers_are_taken_off_down_to_the_program_that_runs() {
        let unwrap = |words: &[&str]| {
            let words = strings(words);
            unwrap_program(&words[0], &words[1..])
        };
        for line in [
            &["timeout", "5", "rm", "-rf", "x"][..],
            &["timeout", "-s", "KILL", "5", "rm", "-rf", "x"],
            &["nice", "-n", "10", "rm", "-rf", "x"],
            &["nohup", "rm", "-rf", "x"],
            &["env", "A=1", "B=2", "rm", "-rf", "x"],
            &["env", "-i", "rm", "-rf", "x"],
            &["stdbuf", "-o", "L", "rm", "-rf", "x"],
            &["coreutils", "rm", "-rf", "x"],
            &["/usr/bin/coreutils", "rm", "-rf", "x"],
            &["command", "rm", "-rf", "x"],
            &["builtin", "rm", "-rf", "x"],
            &["timeout", "5", "nice", "coreutils", "/bin/rm", "-rf", "x"],
            &["./rm", "-rf", "x"],
        ] {
            let effective = unwrap(line);
            assert_eq!(effective.program, "rm", "{line:?}");
            assert_eq!(effective.args, strings(&["-rf", "x"]), "{line:?}");
            assert!(effective.opaque.is_none());
        }
        for line in [
            &["xargs", "rm"][..],
            &["find", ".", "-exec", "rm", "{}", ";"],
            &["find", ".", "-execdir", "rm", "{}", "+"],
            &["sh", "-c", "rm -rf x"],
            &["bash", "-c", "rm -rf x"],
            &["env", "bash", "-c", "rm -rf x"],
            &["eval", "rm -rf x"],
            &["env", "-S", "rm -rf x"],
            &["timeout", "5", "sh", "-c", "rm"],
        ] {
            assert!(unwrap(line).opaque.is_some(), "{line:?}");
        }
    }

    #[test]
    fn an_allowlist_covers_its_programs_and_nothing_wrapped_around_others() {
        let policy = allowlist(&["ls", "rm -r build/*", "grep *"]);
        let covers = |words: &[&str]| {
            let words = strings(words);
            policy.covers(&words[0], &words[1..])
        };
        assert_eq!(covers(&["ls", "-la"]), Coverage::Allowlisted);
        assert_eq!(covers(&["rm", "-r", "build/x"]), Coverage::Allowlisted);
        assert_eq!(
            covers(&["timeout", "3", "rm", "-r", "build/x"]),
            Coverage::Allowlisted
        );
        assert!(matches!(covers(&["rm", "-r", "src"]), Coverage::Miss(_)));
        assert!(matches!(
            covers(&["timeout", "3", "rm", "-r", "src"]),
            Coverage::Miss(_)
        ));
        assert!(matches!(
            covers(&["coreutils", "rm", "-r", "src"]),
            Coverage::Miss(_)
        ));
        assert!(matches!(covers(&["xargs", "ls"]), Coverage::Miss(_)));
        assert!(matches!(
            covers(&["find", ".", "-exec", "ls", ";"]),
            Coverage::Miss(_)
        ));
        assert!(matches!(
            covers(&["env", "sh", "-c", "ls"]),
            Coverage::Miss(_)
        ));
        assert!(matches!(covers(&["cat", "x"]), Coverage::Miss(_)));
    }

    #[test]
    fn an_allowlist_word_covers_one_argument_and_never_climbs_out() {
        let policy = allowlist(&[
            "rm -r build/*",
            "ls *",
            "git status *",
            r"cp a\ b.txt dest/",
            "tar -cf out.tar *",
            "make --directory=*",
        ]);
        let covers = |words: &[&str]| {
            let words = strings(words);
            policy.covers(&words[0], &words[1..])
        };
        for allowed in [
            &["rm", "-r", "build/x"][..],
            &["rm", "-r", "build/a b"],
            &["rm", "-r", "build/a/b"],
            &["ls"],
            &["ls", "-la", "a", "b"],
            &["git", "status"],
            &["git", "status", "--short"],
            &["cp", "a b.txt", "dest/"],
            &["tar", "-cf", "out.tar", "x", "y"],
            &["make", "--directory=sub"],
        ] {
            assert_eq!(covers(allowed), Coverage::Allowlisted, "{allowed:?}");
        }
        for refused in [
            // One word is one argument: `build/*` does not run on into a second one.
            &["rm", "-r", "build/x", "victim.txt"][..],
            &["rm", "-r", "build/x", "build/y"],
            &["rm", "-r"],
            // Nor does it climb out of the directory it names.
            &["rm", "-r", "build/../src"],
            &["rm", "-r", "build/a/../../src"],
            &["rm", "-r", "build/.."],
            &["make", "--directory=../elsewhere"],
            &["cp", "a", "b.txt", "dest/"],
            &["git", "stash"],
        ] {
            assert!(matches!(covers(refused), Coverage::Miss(_)), "{refused:?}");
        }
        // An entry kept from an approved plan: an argument with a space stays one word, and a
        // quoted expansion's glob stays one argument.
        let command = PlannedCommand {
            program: Some("rm".into()),
            written: "rm".into(),
            args: vec![
                PlannedArg {
                    written: "'my file.txt'".into(),
                    matches: ArgMatch::Exact("my file.txt".into()),
                },
                PlannedArg {
                    written: "\"out $N\"".into(),
                    matches: ArgMatch::Glob("out *".into()),
                },
            ],
            redirections: Vec::new(),
        };
        let entry = AllowEntry::exactly(&command).expect("named program");
        assert_eq!(entry.to_string(), r"rm my\ file.txt out\ *");
        let kept = AllowEntry::parse(&entry.to_string()).expect("parses back");
        assert!(kept.allows("rm", &strings(&["my file.txt", "out 3"])));
        assert!(!kept.allows("rm", &strings(&["my", "file.txt", "out 3"])));
        assert!(!kept.allows("rm", &strings(&["my file.txt", "out", "3"])));
    }

    #[test]
    fn safe_bins_pass_only_while_they_name_no_file() {
        let policy = allowlist(&[]);
        let covers = |words: &[&str]| {
            let words = strings(words);
            policy.covers(&words[0], &words[1..])
        };
        for ok in [
            &["head", "-n", "5"][..],
            &["head", "-5"],
            &["tail", "-n5"],
            &["wc", "-l"],
            &["wc", "-lw"],
            &["cut", "-d", ",", "-f", "1"],
            &["cut", "-d,", "-f1"],
            &["sort", "-rn"],
            &["sort", "-k", "2", "-t", ":"],
            &["uniq", "-c"],
            &["tr", "a-z", "A-Z"],
            &["tr", "-d", "x"],
        ] {
            assert_eq!(covers(ok), Coverage::SafeBin, "{ok:?}");
        }
        for file in [
            &["head", "secret.txt"][..],
            &["head", "-n", "5", "secret.txt"],
            &["wc", "-l", "secret.txt"],
            &["sort", "-o", "out.txt"],
            &["sort", "--files0-from=list"],
            &["cut", "-f1", "data.csv"],
            &["uniq", "in", "out"],
        ] {
            assert!(matches!(covers(file), Coverage::Miss(_)), "{file:?}");
        }
    }

    #[test]
    fn a_plan_binds_its_arguments() {
        let command = PlannedCommand {
            program: Some("rm".into()),
            written: "rm".into(),
            args: vec![
                PlannedArg {
                    written: "-r".into(),
                    matches: ArgMatch::Exact("-r".into()),
                },
                PlannedArg {
                    written: "\"out-$N\"".into(),
                    matches: ArgMatch::Glob("out-*".into()),
                },
                PlannedArg {
                    written: "*.tmp".into(),
                    matches: ArgMatch::Any,
                },
            ],
            redirections: Vec::new(),
        };
        assert!(command.matches("rm", &strings(&["-r", "out-1"])));
        assert!(command.matches("rm", &strings(&["-r", "out-1", "a.tmp", "b.tmp"])));
        assert!(!command.matches("rm", &strings(&["-rf", "out-1"])));
        assert!(!command.matches("rm", &strings(&["-r", "src"])));
        assert!(!command.matches("mv", &strings(&["-r", "out-1"])));
        // A part known only at run time never climbs out of the directory the plan named.
        assert!(!command.matches("rm", &strings(&["-r", "out-/../victim.txt"])));
        assert!(!command.matches("rm", &strings(&["-r", "out-x/../../victim.txt"])));
        let approved = ApprovedExec {
            policy: allowlist(&[]),
            approved: vec![command.clone()],
            approved_writes: Vec::new(),
        };
        assert!(approved.check("rm", &strings(&["-r", "out-2"])).is_ok());
        assert!(
            approved
                .check("coreutils", &strings(&["rm", "-r", "out-2"]))
                .is_ok()
        );
        let refused = approved
            .check("rm", &strings(&["-r", "/"]))
            .expect_err("outside the plan")
            .to_string();
        assert!(refused.contains("needs its own approval"), "{refused}");
        let entry = AllowEntry::exactly(&command).expect("named program");
        assert_eq!(entry.to_string(), "rm -r out-* *");
    }

    fn write(redirection: &str, target: ArgMatch) -> PlannedWrite {
        PlannedWrite {
            redirection: redirection.to_string(),
            target,
        }
    }

    #[test]
    fn a_write_by_redirection_is_never_covered_by_an_allowlist_entry() {
        let policy = allowlist(&["ls *", "cat *"]);
        let notes = write("> notes.txt", ArgMatch::Exact("notes.txt".into()));
        assert_eq!(
            policy.covers_write(&notes),
            Coverage::Miss(
                "`> notes.txt` writes a file, and writes by redirection are not on the allowlist"
                    .to_string()
            )
        );
        let full = ExecPolicy {
            mode: ExecMode::Full,
            ..policy.clone()
        };
        assert_eq!(full.covers_write(&notes), Coverage::Full);
        // `sort < a > b`: the safe bin is covered, its write is not, and the reason names the
        // redirection, not a program.
        let plan = ExecPlan {
            command: "sort < a > copy.txt".into(),
            commands: vec![PlannedCommand {
                program: Some("sort".into()),
                written: "sort".into(),
                args: Vec::new(),
                redirections: vec!["< a".into(), "> copy.txt".into()],
            }],
            writes: vec![write("> copy.txt", ArgMatch::Exact("copy.txt".into()))],
        };
        assert_eq!(
            policy.misses(&plan),
            ["`> copy.txt` writes a file, and writes by redirection are not on the allowlist"]
        );
        assert!(full.misses(&plan).is_empty());
        assert_eq!(
            plan.summary(),
            "sort < a > copy.txt\nwrites a file: > copy.txt"
        );
        // A plan without writes (an older component's) still reads; one with writes round-trips.
        let old: ExecPlan =
            serde_json::from_str(r#"{"command":"ls","commands":[]}"#).expect("old plan");
        assert!(old.writes.is_empty());
        let json = serde_json::to_string(&plan).expect("json");
        assert_eq!(serde_json::from_str::<ExecPlan>(&json).expect("back"), plan);
    }

    #[test]
    fn the_host_refuses_a_write_by_redirection_the_decision_did_not_approve() {
        let nothing = ApprovedExec {
            policy: allowlist(&["cat *"]),
            approved: Vec::new(),
            approved_writes: Vec::new(),
        };
        let refused = nothing
            .check_write("/ws/notes.txt", false)
            .expect_err("not approved")
            .to_string();
        assert!(
            refused.contains("`> /ws/notes.txt` writes a file, and writes by redirection are not on the allowlist"),
            "{refused}"
        );
        assert!(!refused.contains("cat"), "{refused}");
        let refused = nothing
            .check_write("/ws/log", true)
            .expect_err("not approved")
            .to_string();
        assert!(refused.contains("`>> /ws/log`"), "{refused}");
        // Approved writes pass, and only at the paths they name.
        let approved = ApprovedExec {
            approved_writes: vec![
                write("> copy.txt", ArgMatch::Exact("copy.txt".into())),
                write("> /ws/abs.txt", ArgMatch::Exact("/ws/abs.txt".into())),
                write("> \"out-$N\"", ArgMatch::Glob("out-*".into())),
            ],
            ..nothing.clone()
        };
        for ok in [
            "/ws/copy.txt",
            "/ws/sub/copy.txt",
            "/ws/abs.txt",
            "/ws/out-1",
        ] {
            assert!(approved.check_write(ok, false).is_ok(), "{ok}");
        }
        for refused in [
            "/ws/notes.txt",
            "/ws/xcopy.txt",
            "/ws/copy.txt.bak",
            "/ws/sub/abs.txt",
            "/ws/in-1",
        ] {
            assert!(approved.check_write(refused, false).is_err(), "{refused}");
        }
        // A target known only at run time was shown as such and matches any path.
        let any = ApprovedExec {
            approved_writes: vec![write("> $F", ArgMatch::Any)],
            ..nothing.clone()
        };
        assert!(any.check_write("/ws/anything", false).is_ok());
        // Under `full` every write passes; the planning instance (`deny`) writes nothing.
        let full = ApprovedExec {
            policy: ExecPolicy::default(),
            ..nothing.clone()
        };
        assert!(full.check_write("/ws/notes.txt", false).is_ok());
        let deny = ApprovedExec {
            policy: ExecPolicy {
                mode: ExecMode::Deny,
                ..ExecPolicy::default()
            },
            ..approved.clone()
        };
        assert!(deny.check_write("/ws/notes.txt", false).is_err());
    }

    #[test]
    fn allowlist_entries_are_bare_program_names() {
        assert_eq!(
            AllowEntry::parse("rm -r build/*").expect("ok"),
            AllowEntry {
                program: "rm".into(),
                args: Some("-r build/*".into())
            }
        );
        assert!(AllowEntry::parse("/bin/rm").is_err());
        assert!(AllowEntry::parse("r*").is_err());
        assert!(AllowEntry::parse("  ").is_err());
        assert_eq!(
            ApprovalDecision::parse("a"),
            Some(ApprovalDecision::AllowAlways)
        );
        assert_eq!(
            ApprovalDecision::parse("allow-once"),
            Some(ApprovalDecision::AllowOnce)
        );
        assert_eq!(ApprovalDecision::parse("nope"), None);
        for mode in ExecMode::ALL {
            assert_eq!(mode.as_str().parse::<ExecMode>(), Ok(mode));
            assert_eq!(serde_json::to_value(mode).expect("json"), mode.as_str());
        }
        for mode in AskMode::ALL {
            assert_eq!(mode.as_str().parse::<AskMode>(), Ok(mode));
            assert_eq!(serde_json::to_value(mode).expect("json"), mode.as_str());
        }
        assert_eq!(
            "some".parse::<ExecMode>(),
            Err("use \"deny\", \"allowlist\" or \"full\"".to_string())
        );
    }
}
