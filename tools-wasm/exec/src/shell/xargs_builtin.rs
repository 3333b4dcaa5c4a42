//! Running the `xargs` builtin: its redirections (they belong to xargs itself, never to the
//! commands it runs), its input, and each command line [`crate::xargs`] builds, run one after
//! another as a program through the host (checked against the approvals policy like any other)
//! or as a builtin, with GNU's exit statuses. The commands get no standard input; their output
//! goes where xargs's own output goes, so `... | xargs cat | wc -l` works.

use super::{
    BUFFER_LIMIT, BUILTINS, Dest, Flow, Io, MAX_DEPTH, Prepared, RunFailure, Shell, Sink, Stdin,
    Stop,
};
use crate::xargs::{self, Batches, Invocation, Step};

/// How one command line of xargs ended.
enum Ran {
    Exited(i32),
    NotFound,
    Refused,
    Killed,
}

/// Builtins that change the shell's state: run by xargs, they act as in a child process, so
/// their changes are undone afterwards.
const STATEFUL_BUILTINS: &[&str] = &["cd", "export", "unset", "set", "read"];

impl Shell<'_> {
    /// `xargs [OPTIONS] [COMMAND [ARGS...]]` with the command's redirections.
    pub(super) fn run_xargs(&mut self, prepared: Prepared, io: &Io) -> Flow<i32> {
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
        // Output into a file is gathered and written once at the end, like a group's; a second
        // file for standard error gets xargs's own messages.
        let out_buffer = matches!(resolved.stdout, Dest::File(_)).then(|| self.push_capture());
        let err_buffer = (matches!(resolved.stderr, Dest::File(_))
            && resolved.stderr != resolved.stdout)
            .then(|| self.push_capture());
        let sink_of = |dest: &Dest, buffer: Option<usize>| match dest {
            Dest::Sink(sink) => *sink,
            Dest::Err => io.stderr,
            Dest::Discard => Sink::Discard,
            Dest::Pipe => io.stdout,
            Dest::File(_) => buffer.map_or(io.stderr, Sink::Capture),
        };
        let stdout = sink_of(&resolved.stdout, out_buffer);
        let stderr = if resolved.stderr == resolved.stdout {
            stdout
        } else {
            sink_of(&resolved.stderr, None)
        };
        let messages = err_buffer.map_or(stderr, Sink::Capture);
        let runs_io = Io {
            stdin: Stdin::None,
            stdout,
            stderr,
        };
        let result = self.xargs_runs(&prepared, &stdin, &runs_io, messages);
        let err_bytes = err_buffer.map(|_| self.captures.pop().unwrap_or_default());
        let out_bytes = out_buffer.map(|_| self.captures.pop().unwrap_or_default());
        let status = result?;
        let mut delivered = true;
        if let Some(bytes) = out_bytes {
            delivered &= self.deliver(&resolved, &resolved.stdout.clone(), &bytes, io)?;
        }
        if let Some(bytes) = err_bytes {
            delivered &= self.deliver(&resolved, &resolved.stderr.clone(), &bytes, io)?;
        }
        let status = if delivered || status != 0 { status } else { 1 };
        self.status = status;
        Ok(status)
    }

    fn push_capture(&mut self) -> usize {
        self.captures.push(Vec::new());
        self.captures.len() - 1
    }

    /// Reads the options and the input and runs every command line; the status as GNU xargs.
    fn xargs_runs(
        &mut self,
        prepared: &Prepared,
        stdin: &Stdin,
        io: &Io,
        messages: Sink,
    ) -> Flow<i32> {
        let options = match xargs::parse_args(&prepared.argv[1..]) {
            Ok(Invocation::Run(options)) => options,
            Ok(Invocation::Help) => {
                self.write(io.stdout, xargs::HELP.as_bytes());
                return Ok(0);
            }
            Ok(Invocation::Version) => {
                self.write(io.stdout, b"xargs (builtin of the clawcage exec shell)\n");
                return Ok(0);
            }
            Err(message) => {
                self.write(messages, format!("xargs: {message}\n").as_bytes());
                return Ok(1);
            }
        };
        for warning in &options.warnings {
            self.write(messages, format!("xargs: warning: {warning}\n").as_bytes());
        }
        let input = match &options.arg_file {
            Some(path) => match self.read_arg_file(path) {
                Ok(bytes) => bytes,
                Err(message) => {
                    self.write(messages, format!("xargs: {message}\n").as_bytes());
                    return Ok(1);
                }
            },
            None => stdin.take_rest().unwrap_or_default(),
        };
        let name = options.command()[0].clone();
        let mut batches = Batches::new(&options, &input);
        let mut status = 0;
        loop {
            self.remaining()?;
            let argv = match batches.next_step() {
                Step::Done => return Ok(status),
                Step::Fail(message) => {
                    self.write(messages, format!("xargs: {message}\n").as_bytes());
                    return Ok(1);
                }
                Step::Run(argv) => argv,
            };
            if options.verbose {
                self.write(messages, xargs::trace(&argv).as_bytes());
            }
            let stop = |shell: &mut Self, text: String, code: i32| -> Flow<i32> {
                shell.write(messages, format!("xargs: {name}: {text}\n").as_bytes());
                Ok(code)
            };
            match self.xargs_run(argv, &prepared.assignments, io, messages)? {
                Ran::Exited(0) => {}
                Ran::Exited(255) => {
                    return stop(self, "exited with status 255; aborting".into(), 124);
                }
                Ran::Exited(_) => status = 123,
                Ran::Killed => return stop(self, "stopped by the sandbox; aborting".into(), 125),
                Ran::Refused => return stop(self, "could not be run; aborting".into(), 126),
                Ran::NotFound => return Ok(127),
            }
        }
    }

    /// The file of `-a`, whole (at most the size of an in-memory pipe).
    fn read_arg_file(&self, path: &str) -> Result<Vec<u8>, String> {
        let absolute = self.absolute(path);
        let metadata = std::fs::metadata(&absolute).map_err(|error| format!("{path}: {error}"))?;
        if !metadata.is_file() {
            return Err(format!("{path}: not a regular file"));
        }
        if metadata.len() > u64::from(BUFFER_LIMIT) {
            return Err(format!(
                "{path}: larger than {} MiB; split it (split -l) and run xargs on each part",
                BUFFER_LIMIT >> 20
            ));
        }
        std::fs::read(&absolute).map_err(|error| format!("{path}: {error}"))
    }

    /// Runs one command line: a builtin here, anything else as a program through the host
    /// (which checks it against the approvals policy as it would the same command written out).
    fn xargs_run(
        &mut self,
        argv: Vec<String>,
        assignments: &[(String, String)],
        io: &Io,
        messages: Sink,
    ) -> Flow<Ran> {
        let name = argv[0].clone();
        let prepared = Prepared {
            argv,
            assignments: assignments.to_vec(),
            redirects: Vec::new(),
        };
        if name == "xargs" {
            if self.depth >= MAX_DEPTH {
                self.write(messages, b"xargs: too many nested xargs\n");
                return Ok(Ran::Refused);
            }
            self.depth += 1;
            let result = self.run_xargs(prepared, io);
            self.depth -= 1;
            return result.map(Ran::Exited);
        }
        if BUILTINS.contains(&name.as_str()) {
            let saved = STATEFUL_BUILTINS.contains(&name.as_str()).then(|| {
                (
                    self.vars.clone(),
                    self.cwd.clone(),
                    self.positional.clone(),
                    self.errexit,
                    self.nounset,
                    self.pipefail,
                )
            });
            let result = self.run_builtin(prepared, io);
            if let Some(saved) = saved {
                (
                    self.vars,
                    self.cwd,
                    self.positional,
                    self.errexit,
                    self.nounset,
                    self.pipefail,
                ) = saved;
            }
            return match result {
                // `exit` ends only its own run, as a program's exit would.
                Ok(status) | Err(Stop::Exit(status)) => Ok(Ran::Exited(status)),
                Err(other) => Err(other),
            };
        }
        if self.program_name(&name).is_none() {
            let message = self.not_found_message(&name);
            self.write(messages, format!("xargs: {message}\n").as_bytes());
            return Ok(Ran::NotFound);
        }
        let status = self.run_programs(vec![prepared], io)?;
        Ok(match self.last_failure.take() {
            None => Ran::Exited(status),
            Some(RunFailure::NotFound) => Ran::NotFound,
            Some(RunFailure::Refused) => Ran::Refused,
            Some(RunFailure::Killed) => Ran::Killed,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::shell::Shell;
    use crate::{Process, wit};

    /// A host whose programs are scripted: `say ARGS` prints them, `status N` exits with N,
    /// `crash` is stopped by the host, `refused` is refused by the host (as the approvals
    /// policy refuses), `lines N` prints N short lines, `rm` and `touch` do nothing. Every
    /// stage it is asked to run is recorded.
    #[derive(Default)]
    struct Scripted {
        runs: Vec<(String, Vec<String>)>,
        opened_files: usize,
    }

    impl Process for Scripted {
        fn programs(&mut self) -> Vec<String> {
            ["crash", "lines", "refused", "rm", "say", "status", "touch"]
                .iter()
                .map(|name| name.to_string())
                .collect()
        }

        fn run(&mut self, pipeline: &wit::Pipeline) -> Result<wit::RunResult, wit::RunError> {
            self.opened_files += pipeline.files.len();
            let mut ends = Vec::new();
            let mut bytes = Vec::new();
            for stage in &pipeline.stages {
                self.runs.push((stage.program.clone(), stage.args.clone()));
                match stage.program.as_str() {
                    "refused" => {
                        return Err(wit::RunError::Invalid(
                            "denied by the operator's exec policy".to_string(),
                        ));
                    }
                    "crash" => ends.push(wit::StageEnd::Killed("it crashed".to_string())),
                    "status" => {
                        let code = stage.args.first().and_then(|arg| arg.parse().ok());
                        ends.push(wit::StageEnd::Exited(code.unwrap_or(0)));
                    }
                    "say" => {
                        bytes.extend_from_slice(stage.args.join(" ").as_bytes());
                        bytes.push(b'\n');
                        ends.push(wit::StageEnd::Exited(0));
                    }
                    "lines" => {
                        let count: usize = stage.args[0].parse().unwrap_or(0);
                        for line in 0..count {
                            bytes.extend_from_slice(format!("{line}\n").as_bytes());
                        }
                        ends.push(wit::StageEnd::Exited(0));
                    }
                    _ => ends.push(wit::StageEnd::Exited(0)),
                }
            }
            let last = pipeline.stages.last().expect("a stage");
            let (output, captured) = match last.stdout {
                wit::Output::Capture => (Vec::new(), bytes),
                wit::Output::Discard => (Vec::new(), Vec::new()),
                _ => (bytes, Vec::new()),
            };
            Ok(wit::RunResult {
                ends,
                output: wit::CutOutput {
                    head: output,
                    omitted: 0,
                    tail: Vec::new(),
                },
                captured,
                captured_truncated: false,
                timed_out: false,
                write_limit_reached: false,
            })
        }
    }

    fn run_with(host: &mut Scripted, command: &str, timeout: Duration) -> Result<String, String> {
        let mut shell = Shell::new(host, Some("/ws".to_string()), Vec::new(), timeout);
        shell
            .run_command_line(command)
            .map_err(|error| error.to_string())
    }

    fn run(command: &str) -> (String, Vec<String>) {
        let mut host = Scripted::default();
        let text = run_with(&mut host, command, Duration::from_secs(30))
            .unwrap_or_else(|error| panic!("`{command}`: {error}"));
        let runs = host
            .runs
            .iter()
            .map(|(program, args)| format!("{program} {}", args.join(" ")).trim().to_string())
            .collect();
        (text, runs)
    }

    #[test]
    fn each_command_line_runs_as_a_program_through_the_host() {
        let (text, runs) = run("echo a b c | xargs -n 2 rm -f");
        assert_eq!(runs, ["rm -f a b", "rm -f c"]);
        assert_eq!(text, "[exit status: 0]");
        let (text, _) = run("echo x 'y z' | xargs -n1 say");
        assert_eq!(text, "x\ny\nz\n[exit status: 0]");
        // Builtins run here, echo by default.
        let (text, runs) =
            run("printf_is_not_needed=1; echo a b | xargs -n1 echo item; echo q | xargs");
        assert_eq!(text, "item a\nitem b\nq\n[exit status: 0]");
        assert!(runs.is_empty(), "{runs:?}");
    }

    #[test]
    fn the_output_goes_on_down_a_pipeline_and_into_a_substitution() {
        let (text, _) = run("echo a b | xargs -n1 say | xargs -n1 -I{} echo got {}");
        assert_eq!(text, "got a\ngot b\n[exit status: 0]");
        let (text, _) = run("echo \"[$(echo a b | xargs say)]\"");
        assert_eq!(text, "[a b]\n[exit status: 0]");
        let (text, _) = run("echo a | xargs say 2>/dev/null >/dev/null; echo done");
        assert_eq!(text, "done\n[exit status: 0]");
    }

    #[test]
    fn the_exit_status_is_gnus() {
        let (text, runs) = run("echo 0 1 0 | xargs -n1 status");
        assert_eq!(runs.len(), 3);
        assert!(text.ends_with("[exit status: 123]"), "{text}");
        // 255 stops xargs at once.
        let (text, runs) = run("echo 255 0 | xargs -n1 status");
        assert_eq!(runs, ["status 255"]);
        assert!(
            text.contains("xargs: status: exited with status 255; aborting"),
            "{text}"
        );
        assert!(text.ends_with("[exit status: 124]"), "{text}");
        let (text, runs) = run("echo a b | xargs -n1 crash");
        assert_eq!(runs, ["crash a"]);
        assert!(text.ends_with("[exit status: 125]"), "{text}");
        let (text, runs) = run("echo a b | xargs -n1 refused");
        assert_eq!(runs, ["refused a"]);
        assert!(
            text.contains("denied by the operator's exec policy"),
            "{text}"
        );
        assert!(text.ends_with("[exit status: 126]"), "{text}");
        let (text, runs) = run("echo a | xargs nosuchprogram");
        assert!(runs.is_empty());
        assert!(
            text.contains("xargs: command not found: nosuchprogram"),
            "{text}"
        );
        assert!(
            text.contains("shell builtins:") && text.contains("xargs"),
            "{text}"
        );
        assert!(text.ends_with("[exit status: 127]"), "{text}");
        let (text, _) = run("echo a | xargs -n 0 say");
        assert!(
            text.contains("xargs: value 0 for -n option should be >= 1"),
            "{text}"
        );
        assert!(text.ends_with("[exit status: 1]"), "{text}");
        // A builtin's status counts too; `exit` ends only its own run.
        let (text, _) = run("echo a | xargs false");
        assert!(text.ends_with("[exit status: 123]"), "{text}");
        let (text, _) = run("echo 3 | xargs exit; echo after $?");
        assert_eq!(text, "after 123\n[exit status: 0]");
    }

    #[test]
    fn builtins_that_change_the_shell_change_nothing_through_xargs() {
        let workspace = std::env::temp_dir().join(format!("xargs-cd-{}", std::process::id()));
        std::fs::create_dir_all(workspace.join("sub")).expect("a directory");
        let workspace_text = workspace.to_string_lossy().into_owned();
        let mut host = Scripted::default();
        let mut shell = Shell::new(
            &mut host,
            Some(workspace_text.clone()),
            Vec::new(),
            Duration::from_secs(30),
        );
        let text = shell
            .run_command_line("echo sub | xargs cd; echo A=1 | xargs export; echo -e | xargs set; pwd; echo \"[$A]\"; false; echo $?")
            .expect("runs");
        assert_eq!(text, format!("{workspace_text}\n[]\n1\n[exit status: 0]"));
        // The same `cd` written out does change the directory (the test can fail).
        let text = shell.run_command_line("cd sub; pwd").expect("runs");
        assert!(
            text.ends_with(&format!("\n{workspace_text}/sub\n[exit status: 0]")),
            "{text}"
        );
        std::fs::remove_dir_all(&workspace).expect("cleaned up");
    }

    #[test]
    fn an_empty_input_runs_once_unless_r() {
        let (_, runs) = run("true | xargs rm");
        assert_eq!(runs, ["rm"]);
        let (text, runs) = run("true | xargs -r rm");
        assert!(runs.is_empty());
        assert_eq!(text, "[exit status: 0]");
    }

    #[test]
    fn trace_prints_each_command_line_before_it_runs() {
        let (text, _) = run("echo \"a 'b c'\" | xargs -t -n1 say");
        assert_eq!(text, "say a\na\nsay 'b c'\nb c\n[exit status: 0]");
        let (text, _) = run("echo a | xargs -t say 2>/dev/null");
        assert_eq!(text, "a\n[exit status: 0]");
    }

    #[test]
    fn input_comes_from_redirections_here_documents_and_nul_separated_lists() {
        let mut host = Scripted::default();
        run_with(
            &mut host,
            "xargs -d, rm <<< 'x y,z'",
            Duration::from_secs(30),
        )
        .expect("runs");
        assert_eq!(
            host.runs,
            [("rm".to_string(), vec!["x y".to_string(), "z\n".to_string()])]
        );
        let (_, runs) = run("xargs rm <<EOF\n'a b' c\nEOF\n");
        assert_eq!(runs, ["rm a b c"]);
    }

    #[test]
    fn an_item_is_never_a_redirection() {
        let mut host = Scripted::default();
        let text = run_with(
            &mut host,
            "echo '> pwned.txt' | xargs -I{} say {}; echo '>' f | xargs say",
            Duration::from_secs(30),
        )
        .expect("runs");
        assert_eq!(text, "> pwned.txt\n> f\n[exit status: 0]");
        assert_eq!(host.opened_files, 0);
    }

    #[test]
    fn too_long_an_item_is_an_error() {
        let long = "a".repeat(crate::xargs::MAX_COMMAND_BYTES);
        let mut host = Scripted::default();
        let text = run_with(
            &mut host,
            &format!("echo x {long} y | xargs say"),
            Duration::from_secs(30),
        )
        .expect("runs");
        assert_eq!(text, "x\nxargs: argument line too long\n[exit status: 1]");
    }

    #[test]
    fn a_huge_input_stops_at_the_time_limit() {
        let mut host = Scripted::default();
        let result = run_with(
            &mut host,
            "lines 1000000 | xargs -n 1 say",
            Duration::from_millis(300),
        );
        let error = result.expect_err("a million runs do not fit in 300 ms");
        assert!(error.contains("time limit"), "{error}");
        assert!(host.runs.len() < 1_000_001, "{}", host.runs.len());
        // Builtins are checked against the clock between runs too.
        let mut host = Scripted::default();
        let started = std::time::Instant::now();
        let result = run_with(
            &mut host,
            "lines 1000000 | xargs -n 1 true; lines 1000000 | xargs -n 1 true; lines 1000000 | xargs -n 1 true",
            Duration::from_millis(300),
        );
        assert!(started.elapsed() < Duration::from_secs(5));
        if let Err(error) = result {
            assert!(error.contains("time limit"), "{error}");
        }
    }
}
