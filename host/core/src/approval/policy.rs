//! The operator's exec policy: the modes (`[approvals] exec`, `ask`), the allowlist entries, the
//! safe bins, and whether a program with its arguments is covered without asking.

use super::*;

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
pub(super) fn valid_names(names: impl Iterator<Item = &'static str>) -> String {
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

pub(super) fn shown(program: &str, args: &[String]) -> String {
    if args.is_empty() {
        program.to_string()
    } else {
        format!("{program} {}", args.join(" "))
    }
}
