//! The slash commands a person types into a conversation, parsed once for every front end (the
//! terminal chat, `chat --gateway`, the gateway's `chat.send`, Telegram): which command a line is,
//! and whether its words are right, so `/approve` with a word too many is refused the same way
//! everywhere. What a command does is the front end's; a front end that does not offer one says
//! so. A line that does not start with `/` is a message, not a command.

use crate::approval::ApprovalDecision;

/// How `/approve` is written.
pub const APPROVE_USAGE: &str = "/approve ID allow-once|allow-always|deny";

/// A slash command, its words checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// `/exit` or `/quit`.
    Exit,
    /// `/help`.
    Help,
    /// `/start` (a Telegram bot's greeting).
    Start,
    /// `/last`: the last tool call's whole output.
    Last,
    /// `/tools`.
    Tools,
    /// `/reset`.
    Reset,
    /// `/compact`.
    Compact,
    /// `/usage`.
    Usage,
    /// `/queue …`: the whole line, for the queue's own parser (`/queue` alone shows it).
    Queue(String),
    /// `/approvals …`: the words after it (none: show).
    Approvals(Vec<String>),
    /// `/approve ID DECISION`.
    Approve {
        /// The request's id.
        id: String,
        /// The answer.
        decision: ApprovalDecision,
    },
    /// `/approve` without its two words: show what waits, with the usage.
    ApproveUsage,
}

/// Why a line that looks like a command is not one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommandError {
    /// No such command.
    Unknown(String),
    /// A command that takes no words got some.
    ExtraWords {
        /// The command.
        command: String,
    },
    /// `/approve` with a word that is not a decision, or a word too many.
    BadApprove(String),
}

impl std::fmt::Display for CommandError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CommandError::Unknown(command) => {
                write!(f, "unknown command {command}; /help lists the commands")
            }
            CommandError::ExtraWords { command } => {
                write!(f, "{command} takes nothing after it")
            }
            CommandError::BadApprove(why) => write!(f, "{why}; use {APPROVE_USAGE}"),
        }
    }
}

impl std::error::Error for CommandError {}

impl Command {
    /// The command `line` is: `None` for a message (it does not start with `/`). A bot's name
    /// after the command word (`/queue@my_bot`, as Telegram writes it in groups) is dropped.
    pub fn parse(line: &str) -> Option<Result<Command, CommandError>> {
        let line = line.trim();
        if !line.starts_with('/') {
            return None;
        }
        let mut words = line.split_whitespace();
        let first = words.next().unwrap_or_default();
        let name = first.split('@').next().unwrap_or(first);
        let rest: Vec<&str> = words.collect();
        let bare = |command: Command| {
            if rest.is_empty() {
                Ok(command)
            } else {
                Err(CommandError::ExtraWords {
                    command: name.to_string(),
                })
            }
        };
        Some(match name {
            "/exit" | "/quit" => bare(Command::Exit),
            "/help" => bare(Command::Help),
            "/start" => bare(Command::Start),
            "/last" => bare(Command::Last),
            "/tools" => bare(Command::Tools),
            "/reset" => bare(Command::Reset),
            "/compact" => bare(Command::Compact),
            "/usage" => bare(Command::Usage),
            "/queue" => Ok(Command::Queue(
                std::iter::once("/queue")
                    .chain(rest.iter().copied())
                    .collect::<Vec<_>>()
                    .join(" "),
            )),
            "/approvals" => Ok(Command::Approvals(
                rest.iter().map(|word| word.to_string()).collect(),
            )),
            "/approve" => match rest.as_slice() {
                [] | [_] => Ok(Command::ApproveUsage),
                [id, decision] => match ApprovalDecision::parse(decision) {
                    Some(decision) => Ok(Command::Approve {
                        id: id.to_string(),
                        decision,
                    }),
                    None => Err(CommandError::BadApprove(format!(
                        "`{decision}` is not a decision"
                    ))),
                },
                [_, _, extra, ..] => Err(CommandError::BadApprove(format!(
                    "`{extra}` is one word too many"
                ))),
            },
            other => Err(CommandError::Unknown(other.to_string())),
        })
    }

    /// The command's word, as typed without arguments (`/queue`, `/approve`).
    pub fn word(&self) -> &'static str {
        match self {
            Command::Exit => "/exit",
            Command::Help => "/help",
            Command::Start => "/start",
            Command::Last => "/last",
            Command::Tools => "/tools",
            Command::Reset => "/reset",
            Command::Compact => "/compact",
            Command::Usage => "/usage",
            Command::Queue(_) => "/queue",
            Command::Approvals(_) => "/approvals",
            Command::Approve { .. } | Command::ApproveUsage => "/approve",
        }
    }

    /// What a front end that does not offer this command says.
    pub fn not_here(&self) -> String {
        format!(
            "{} is not available here; /help lists the commands",
            self.word()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(line: &str) -> Result<Command, CommandError> {
        Command::parse(line).unwrap_or_else(|| panic!("{line:?} is a command"))
    }

    #[test]
    fn a_message_is_not_a_command() {
        assert_eq!(Command::parse("hello /reset"), None);
        assert_eq!(Command::parse(""), None);
        assert_eq!(Command::parse("  plain"), None);
    }

    #[test]
    fn commands_and_their_words() {
        assert_eq!(parsed("/exit"), Ok(Command::Exit));
        assert_eq!(parsed(" /quit "), Ok(Command::Exit));
        assert_eq!(parsed("/reset"), Ok(Command::Reset));
        assert_eq!(
            parsed("/queue  collect   cap:3"),
            Ok(Command::Queue("/queue collect cap:3".into()))
        );
        assert_eq!(parsed("/queue"), Ok(Command::Queue("/queue".into())));
        assert_eq!(
            parsed("/queue@clawcage_bot reset"),
            Ok(Command::Queue("/queue reset".into()))
        );
        assert_eq!(
            parsed("/approvals exec deny"),
            Ok(Command::Approvals(vec!["exec".into(), "deny".into()]))
        );
        assert_eq!(
            parsed("/approve a1b2 always"),
            Ok(Command::Approve {
                id: "a1b2".into(),
                decision: ApprovalDecision::AllowAlways
            })
        );
        assert_eq!(parsed("/approve"), Ok(Command::ApproveUsage));
        assert_eq!(parsed("/approve a1b2"), Ok(Command::ApproveUsage));
    }

    #[test]
    fn wrong_words_are_refused_the_same_way_everywhere() {
        assert_eq!(
            parsed("/approve a1b2 deny now"),
            Err(CommandError::BadApprove(
                "`now` is one word too many".into()
            ))
        );
        assert!(
            parsed("/approve a1b2 maybe")
                .unwrap_err()
                .to_string()
                .contains("`maybe` is not a decision; use /approve ID")
        );
        assert_eq!(
            parsed("/reset everything"),
            Err(CommandError::ExtraWords {
                command: "/reset".into()
            })
        );
        assert_eq!(
            parsed("/frobnicate"),
            Err(CommandError::Unknown("/frobnicate".into()))
        );
        assert_eq!(
            parsed("/").unwrap_err().to_string(),
            "unknown command /; /help lists the commands"
        );
    }
}
