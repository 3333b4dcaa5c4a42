//! The builtins: `:`, `true`, `false`, `echo`, `pwd`, `cd`, `export`, `unset`, `env`,
//! `printenv`, `exit`, `set`, `read`, `type`/`which`/`command -v`, and `sh`/`bash` (the same
//! interpreter on a script, with a copy of the shell's state); `xargs` is in `xargs_builtin`.

use super::expand::unescape;
use super::parse::{check_supported, parse, unsupported};
use super::read::{parse_read_args, read_record, split_record};
use super::redirect::{Dest, Redirected, deliveries};
use super::{BUILTINS, Flow, Io, MAX_DEPTH, Prepared, Shell, Stdin, Stop, Variable};

impl Shell<'_> {
    /// Runs the builtin `prepared.argv[0]` (not `xargs`) with its redirections, its `NAME=value`
    /// prefixes set while it runs (`IFS= read -r line`) and put back after.
    pub(super) fn run_builtin(&mut self, prepared: Prepared, io: &Io) -> Flow<i32> {
        let earlier: Vec<(String, Option<Variable>)> = prepared
            .assignments
            .iter()
            .map(|(name, value)| {
                let before = self.vars.get(name).cloned();
                self.set_var(name, value.clone());
                (name.clone(), before)
            })
            .collect();
        let ran = self.run_builtin_itself(prepared, io);
        for (name, before) in earlier.into_iter().rev() {
            match before {
                Some(variable) => {
                    self.vars.insert(name, variable);
                }
                None => {
                    self.vars.remove(&name);
                }
            }
        }
        ran
    }

    fn run_builtin_itself(&mut self, prepared: Prepared, io: &Io) -> Flow<i32> {
        let resolved = match self.redirections(&prepared.redirects, io)? {
            Ok(resolved) => resolved,
            Err(message) => {
                self.error(&message);
                return Ok(1);
            }
        };
        let Some(stdin) = self.builtin_stdin(&resolved, io) else {
            return Ok(1);
        };
        let mut stdout = Vec::new();
        let mut stderr = Vec::new();
        let argv = prepared.argv;
        let name = argv[0].clone();
        let args = &argv[1..];
        let status = match name.as_str() {
            ":" | "true" => 0,
            "false" => 1,
            "echo" => {
                stdout = echo(args);
                0
            }
            "pwd" => {
                stdout.extend_from_slice(format!("{}\n", self.cwd).as_bytes());
                0
            }
            "cd" => self.cd(args, &mut stderr),
            "export" => {
                for arg in args {
                    if arg == "-p" {
                        continue;
                    }
                    let (name, value) = match arg.split_once('=') {
                        Some((name, value)) => (name.to_string(), Some(value.to_string())),
                        None => (arg.clone(), None),
                    };
                    let value = value.or_else(|| self.var(&name)).unwrap_or_default();
                    self.vars.insert(
                        name,
                        Variable {
                            value,
                            exported: true,
                        },
                    );
                }
                for (name, value) in &prepared.assignments {
                    self.vars.insert(
                        name.clone(),
                        Variable {
                            value: value.clone(),
                            exported: true,
                        },
                    );
                }
                0
            }
            "unset" => {
                for arg in args.iter().filter(|arg| !arg.starts_with('-')) {
                    self.vars.remove(arg);
                }
                0
            }
            "env" | "printenv" => {
                if args.is_empty() || name == "printenv" {
                    let env = self.exported_env(&prepared.assignments);
                    if name == "printenv" && !args.is_empty() {
                        let mut found = 0;
                        for arg in args {
                            if let Some((_, value)) = env.iter().find(|(key, _)| key == arg) {
                                stdout.extend_from_slice(format!("{value}\n").as_bytes());
                                found += 1;
                            }
                        }
                        i32::from(found != args.len())
                    } else {
                        for (key, value) in env {
                            stdout.extend_from_slice(format!("{key}={value}\n").as_bytes());
                        }
                        0
                    }
                } else {
                    stderr.extend_from_slice(
                        b"sh: env: running a program through env is not supported here; write `NAME=value program` instead\n",
                    );
                    2
                }
            }
            "exit" => {
                let code = args
                    .first()
                    .and_then(|arg| arg.parse::<i32>().ok())
                    .unwrap_or(self.status);
                return Err(Stop::Exit(code & 0xff));
            }
            "set" => self.set(args, &mut stderr),
            "read" => match parse_read_args(args) {
                Ok(options) => {
                    // At the end of the input the names are emptied, so that `while read line ||
                    // [ -n "$line" ]` ends.
                    let (record, whole) = read_record(&stdin, &options).unwrap_or_default();
                    if options.names.is_empty() {
                        self.set_var("REPLY", record);
                    } else {
                        // Unset IFS splits as the default does.
                        let ifs = self.var("IFS").unwrap_or_else(|| " \t\n".to_string());
                        let values = split_record(&record, &ifs, options.names.len());
                        for (name, value) in options.names.iter().zip(values) {
                            self.set_var(name, value);
                        }
                    }
                    i32::from(!whole)
                }
                Err(message) => {
                    stderr.extend_from_slice(format!("sh: {message}\n").as_bytes());
                    2
                }
            },
            "type" | "which" | "command" => {
                let mut names: Vec<&String> =
                    args.iter().filter(|arg| !arg.starts_with('-')).collect();
                if name == "command" && !args.iter().any(|arg| arg == "-v" || arg == "-V") {
                    return Err(Stop::Refused(
                        "`command NAME` is not supported; run the program directly".to_string(),
                    ));
                }
                let mut missing = 0;
                for candidate in names.drain(..) {
                    if BUILTINS.contains(&candidate.as_str()) {
                        stdout
                            .extend_from_slice(format!("{candidate}: shell builtin\n").as_bytes());
                    } else if let Some(program) = self.program_name(candidate) {
                        stdout.extend_from_slice(format!("/usr/bin/{program}\n").as_bytes());
                    } else {
                        missing += 1;
                        if name == "type" {
                            stderr.extend_from_slice(
                                format!("sh: type: {candidate}: not found\n").as_bytes(),
                            );
                        }
                    }
                }
                i32::from(missing > 0)
            }
            "sh" | "bash" => self.nested_shell(args, &stdin, io, &resolved, &mut stderr)?,
            "[[" => {
                return Err(Stop::Refused(unsupported(
                    "[[ ... ]] tests (use [ ... ] or test)",
                )));
            }
            _ => 127,
        };
        let mut delivered = self.open_unwritten(&resolved, io)?;
        for (dest, bytes) in deliveries(&resolved.stdout, &resolved.stderr, stdout, stderr) {
            delivered &= self.deliver(&resolved, &dest, &bytes, io)?;
        }
        // A redirection that could not be opened fails the builtin, as in any shell.
        let status = if delivered && status == 0 {
            0
        } else if status == 0 {
            1
        } else {
            status
        };
        self.status = status;
        Ok(status)
    }

    /// `sh -c SCRIPT [NAME ARGS...]` or `sh FILE [ARGS...]`: the same interpreter, with a copy of
    /// the variables and working directory.
    fn nested_shell(
        &mut self,
        args: &[String],
        stdin: &Stdin,
        io: &Io,
        resolved: &Redirected,
        stderr: &mut Vec<u8>,
    ) -> Flow<i32> {
        if self.depth >= MAX_DEPTH {
            stderr.extend_from_slice(b"sh: too many nested shells\n");
            return Ok(2);
        }
        let mut rest = args;
        let mut script = None;
        let mut positional = vec!["sh".to_string()];
        while let Some(arg) = rest.first() {
            match arg.as_str() {
                "-c" => {
                    script = rest.get(1).cloned();
                    if script.is_none() {
                        stderr.extend_from_slice(b"sh: -c: option requires an argument\n");
                        return Ok(2);
                    }
                    rest = &rest[2..];
                    if let Some(name) = rest.first() {
                        positional = rest.to_vec();
                        let _ = name;
                    }
                    break;
                }
                "-e" | "-x" | "-u" | "-eu" | "-ex" | "-euo" | "-l" | "--login" | "-i" => {
                    rest = &rest[1..];
                }
                "-o" => rest = rest.get(2..).unwrap_or(&[]),
                file => {
                    let path = self.absolute(file);
                    match std::fs::read_to_string(&path) {
                        Ok(text) => script = Some(text),
                        Err(error) => {
                            stderr.extend_from_slice(format!("sh: {file}: {error}\n").as_bytes());
                            return Ok(127);
                        }
                    }
                    positional = rest.to_vec();
                    break;
                }
            }
        }
        let Some(script) = script else {
            stderr.extend_from_slice(
                b"sh: an interactive shell is not available; use sh -c 'COMMANDS'\n",
            );
            return Ok(2);
        };
        let program = parse(&script).map_err(Stop::Refused)?;
        check_supported(&program).map_err(Stop::Refused)?;
        let saved = (
            self.vars.clone(),
            self.cwd.clone(),
            std::mem::replace(&mut self.positional, positional),
            self.errexit,
            self.nounset,
            self.pipefail,
        );
        self.depth += 1;
        let inner_io = Io {
            stdin: stdin.clone(),
            stdout: match resolved.stdout {
                Dest::Sink(sink) => sink,
                _ => io.stdout,
            },
            stderr: match resolved.stderr {
                Dest::Sink(sink) => sink,
                _ => io.stderr,
            },
        };
        let result = self.run_program(&program, &inner_io);
        self.depth -= 1;
        (
            self.vars,
            self.cwd,
            self.positional,
            self.errexit,
            self.nounset,
            self.pipefail,
        ) = saved;
        match result {
            Ok(status) | Err(Stop::Exit(status)) => Ok(status),
            Err(other) => Err(other),
        }
    }

    fn cd(&mut self, args: &[String], stderr: &mut Vec<u8>) -> i32 {
        let target = match args
            .iter()
            .find(|arg| !arg.starts_with('-') || arg.as_str() == "-")
        {
            Some(target) if target == "-" => self.var("OLDPWD").unwrap_or_else(|| self.cwd.clone()),
            Some(target) => target.clone(),
            None => match self.var("HOME").or_else(|| self.workspace.clone()) {
                Some(home) => home,
                None => return 0,
            },
        };
        let path = normalize(&self.absolute(&target));
        if let Some(workspace) = &self.workspace
            && !(path == *workspace || path.starts_with(&format!("{workspace}/")))
        {
            stderr.extend_from_slice(
                format!(
                    "sh: cd: {target}: outside the workspace; only {workspace} and what is under it exist here\n"
                )
                .as_bytes(),
            );
            return 1;
        }
        match std::fs::metadata(&path) {
            Ok(metadata) if metadata.is_dir() => {
                let old = std::mem::replace(&mut self.cwd, path.clone());
                self.set_var("OLDPWD", old);
                self.set_var("PWD", path);
                0
            }
            Ok(_) => {
                stderr.extend_from_slice(format!("sh: cd: {target}: Not a directory\n").as_bytes());
                1
            }
            Err(_) => {
                stderr.extend_from_slice(
                    format!("sh: cd: {target}: No such file or directory\n").as_bytes(),
                );
                1
            }
        }
    }

    fn set(&mut self, args: &[String], stderr: &mut Vec<u8>) -> i32 {
        let mut rest = args.iter();
        while let Some(arg) = rest.next() {
            let (enable, flags) = if let Some(flags) = arg.strip_prefix('-') {
                (true, flags)
            } else if let Some(flags) = arg.strip_prefix('+') {
                (false, flags)
            } else {
                // `set -- a b`: positional parameters.
                break;
            };
            if flags == "-" {
                self.positional.truncate(1);
                self.positional.extend(rest.by_ref().cloned());
                break;
            }
            for flag in flags.chars() {
                match flag {
                    'e' => self.errexit = enable,
                    'u' => self.nounset = enable,
                    'x' | 'v' | 'h' | 'B' | 'C' | 'f' => {}
                    'o' => match rest.next().map(String::as_str) {
                        Some("pipefail") => self.pipefail = enable,
                        Some("errexit") => self.errexit = enable,
                        Some("nounset") => self.nounset = enable,
                        Some(_) | None => {}
                    },
                    other => {
                        stderr.extend_from_slice(
                            format!("sh: set: -{other}: invalid option\n").as_bytes(),
                        );
                        return 2;
                    }
                }
            }
        }
        0
    }
}

/// Removes `.` and `..` lexically (the logical working directory, as `cd` keeps it).
fn normalize(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            other => parts.push(other),
        }
    }
    format!("/{}", parts.join("/"))
}

/// What `echo ARGS` prints: the arguments after its flags (`-n` no newline, `-e` escapes, `-E`
/// none), joined by spaces.
fn echo(args: &[String]) -> Vec<u8> {
    let mut newline = true;
    let mut escapes = false;
    let mut rest = args;
    while let Some(flag) = rest.first() {
        if flag.len() > 1
            && flag.starts_with('-')
            && flag[1..].chars().all(|c| matches!(c, 'n' | 'e' | 'E'))
        {
            newline &= !flag.contains('n');
            escapes = flag.contains('e');
            rest = &rest[1..];
        } else {
            break;
        }
    }
    let mut text = rest.join(" ");
    if escapes {
        text = unescape(&text, |c| match c {
            'n' => Some('\n'),
            't' => Some('\t'),
            '\\' => Some('\\'),
            _ => None,
        });
    }
    let mut out = text.into_bytes();
    if newline {
        out.push(b'\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|arg| arg.to_string()).collect()
    }

    #[test]
    fn echo_flags_and_escapes() {
        assert_eq!(echo(&strings(&["a", "b"])), b"a b\n");
        assert_eq!(echo(&strings(&["-n", "a"])), b"a");
        assert_eq!(echo(&strings(&["-e", "a\\nb\\t\\\\"])), b"a\nb\t\\\n");
        assert_eq!(echo(&strings(&["a\\nb"])), b"a\\nb\n");
        assert_eq!(echo(&strings(&["-ne", "x\\n"])), b"x\n");
        assert_eq!(echo(&strings(&["-e", "-E", "x\\n"])), b"x\\n\n");
        assert_eq!(echo(&strings(&["-x", "-"])), b"-x -\n");
        assert_eq!(echo(&strings(&["-e", "\\\\n"])), b"\\n\n");
        assert_eq!(echo(&[]), b"\n");
    }

    #[test]
    fn normalize_removes_dots_lexically() {
        assert_eq!(normalize("/ws/a/../b/./c/"), "/ws/b/c");
        assert_eq!(normalize("/../.."), "/");
        assert_eq!(normalize("//ws//x"), "/ws/x");
        assert_eq!(normalize(""), "/");
    }
}
