//! What a command line will run, as the exec component's planner reports it before anything
//! runs: the programs with their arguments (each exact, or a glob over what it may expand to)
//! and the files it writes by redirection, and whether what really runs fits the plan.

use super::*;

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
pub(super) fn args_match(planned: &[PlannedArg], actual: &[String]) -> bool {
    let planned: Vec<&ArgMatch> = planned.iter().map(|arg| &arg.matches).collect();
    words_match(&planned, actual, entry_word_matches)
}

/// Whether `actual` fits `planned`: each `Exact` is that one argument, each `Glob` one argument
/// `glob` accepts, each `Any` zero or more arguments. The same star loop as [`glob_match`], over
/// arguments instead of characters: linear in practice, no backtracking blow-up (this runs on
/// the host for every program a call starts, whatever the guest planned).
pub(super) fn words_match(
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
