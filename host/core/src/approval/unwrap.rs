//! Wrapper programs taken off (`timeout rm` is `rm`, `coreutils rm` is `rm`), and what a safe
//! bin's arguments may be while it reads standard input only.

use super::*;

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

pub(super) fn opaque(program: String, args: Vec<String>, why: &str) -> Effective {
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
pub(super) fn skip_options(
    args: &[String],
    with_value: &[&str],
    positional: usize,
) -> Option<usize> {
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
pub(super) fn reads_stdin_only(program: &str, args: &[String]) -> bool {
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
