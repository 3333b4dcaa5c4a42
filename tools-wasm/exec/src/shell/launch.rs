//! Running programs: finding a command's program among the host's, the environment it gets, and
//! a pipeline of programs sent to the host as one [`wit::Pipeline`] whose stages stream into
//! each other; a program that does not exist gets a "command not found" that lists what does.

use std::collections::BTreeMap;

use super::redirect::{Dest, In};
use super::{
    BUFFER_LIMIT, BUILTINS, Flow, HOST_OUTPUT_LIMIT, Io, Prepared, RunFailure, Shell, Sink, Stdin,
    Stop,
};
use crate::wit;

impl Shell<'_> {
    /// The programs the host can run, asked once per call.
    fn programs(&mut self) -> Vec<String> {
        if self.programs.is_none() {
            self.programs = Some(self.process.programs());
        }
        self.programs.clone().unwrap_or_default()
    }

    /// The program `name` stands for: itself, or the last part of a path such as `/bin/ls`.
    pub(super) fn program_name(&mut self, name: &str) -> Option<String> {
        let programs = self.programs();
        if programs.iter().any(|program| program == name) {
            return Some(name.to_string());
        }
        let base = name.rsplit('/').next()?;
        (name.contains('/') && programs.iter().any(|program| program == base))
            .then(|| base.to_string())
    }

    /// Reports `name` as not found; the status of that, 127.
    fn not_found(&mut self, name: &str) -> i32 {
        let message = self.not_found_message(name);
        self.error(&message);
        127
    }

    /// `command not found: NAME`, and the programs and builtins there are.
    pub(super) fn not_found_message(&mut self, name: &str) -> String {
        let programs = self.programs().join(" ");
        let message = if name.starts_with("./") || name.contains('/') {
            format!(
                "command not found: {name} (programs cannot be started from files here; run shell scripts with `sh FILE`)"
            )
        } else if let Some(program) = installable(name) {
            format!(
                "command not found: {name} ({program} is not installed; an operator installs it with `clawcage programs install {program}`)"
            )
        } else {
            format!("command not found: {name}")
        };
        format!(
            "{message}\navailable programs: {programs}\nshell builtins: {}",
            BUILTINS.join(" ")
        )
    }

    /// The exported variables, `extra` (a command's `NAME=value` prefixes) over them, and `PWD`.
    pub(super) fn exported_env(&self, extra: &[(String, String)]) -> Vec<(String, String)> {
        let mut env: BTreeMap<String, String> = self
            .vars
            .iter()
            .filter(|(_, var)| var.exported)
            .map(|(name, var)| (name.clone(), var.value.clone()))
            .collect();
        for (name, value) in extra {
            env.insert(name.clone(), value.clone());
        }
        env.insert("PWD".into(), self.cwd.clone());
        env.into_iter().collect()
    }

    /// Runs programs as one streaming pipeline on the host.
    pub(super) fn run_programs(&mut self, prepared: Vec<Prepared>, io: &Io) -> Flow<i32> {
        self.last_failure = None;
        let count = prepared.len();
        let mut stages = Vec::with_capacity(count);
        let mut files: Vec<wit::FileOpen> = Vec::new();
        for (position, command) in prepared.into_iter().enumerate() {
            let Some(name) = command.argv.first().cloned() else {
                continue;
            };
            if name == "sh" || name == "bash" {
                return Err(Stop::Refused(
                    "`sh`/`bash` inside a pipeline of programs is not supported; run it as its own command".to_string(),
                ));
            }
            let Some(program) = self.program_name(&name) else {
                let status = self.not_found(&name);
                self.status = status;
                self.last_failure = Some(RunFailure::NotFound);
                return Ok(status);
            };
            let stage_io = Io {
                stdin: if position == 0 {
                    io.stdin.clone()
                } else {
                    Stdin::None
                },
                stdout: io.stdout,
                stderr: io.stderr,
            };
            let mut resolved = match self.redirections(&command.redirects, &stage_io)? {
                Ok(resolved) => resolved,
                Err(message) => {
                    self.error(&message);
                    return Ok(1);
                }
            };
            let last = position + 1 == count;
            if !last {
                if resolved.stdout == Dest::Sink(io.stdout) {
                    resolved.stdout = Dest::Pipe;
                }
                if resolved.stderr == Dest::Sink(io.stdout) {
                    resolved.stderr = Dest::Pipe;
                }
            }
            if position > 0 && matches!(resolved.stdin, In::Inherit) {
                resolved.stdin = In::Pipe;
            }
            let offset = files.len() as u32;
            files.extend(resolved.files.iter().cloned());
            // The shell's standard error is the captured buffer only when it is the same one as
            // standard output (a group's `2>&1`); the host has one capture per run.
            let stderr_captured = matches!(io.stderr, Sink::Capture(_)) && io.stderr == io.stdout;
            let map_out = |dest: &Dest| match dest {
                Dest::Err if stderr_captured => wit::Output::Capture,
                Dest::Err if io.stderr == Sink::Discard => wit::Output::Discard,
                Dest::Sink(Sink::Discard) => wit::Output::Discard,
                Dest::Sink(Sink::Main) | Dest::Err => wit::Output::Output,
                Dest::Sink(Sink::Capture(_)) => wit::Output::Capture,
                Dest::Discard => wit::Output::Discard,
                Dest::Pipe => wit::Output::Pipe,
                Dest::File(index) => wit::Output::File(index + offset),
            };
            let stdin = match &resolved.stdin {
                In::Inherit => match io.stdin.take_rest() {
                    Some(bytes) => wit::Input::Bytes(bytes),
                    None => wit::Input::None,
                },
                In::None => wit::Input::None,
                In::Bytes(bytes) => wit::Input::Bytes(bytes.clone()),
                In::File(index) => wit::Input::File(index + offset),
                In::Pipe => wit::Input::Pipe,
            };
            stages.push(wit::Stage {
                program,
                args: command.argv[1..].to_vec(),
                env: self.exported_env(&command.assignments),
                cwd: self.cwd.clone(),
                stdin,
                stdout: map_out(&resolved.stdout),
                stderr: map_out(&resolved.stderr),
            });
        }
        let remaining = self.remaining()?;
        let pipeline = wit::Pipeline {
            stages,
            files,
            timeout_ms: u64::try_from(remaining.as_millis()).unwrap_or(u64::MAX),
            output_limit: HOST_OUTPUT_LIMIT,
            capture_limit: BUFFER_LIMIT,
        };
        let result = match self.process.run(&pipeline) {
            Ok(result) => result,
            Err(wit::RunError::NotFound(name)) => {
                self.last_failure = Some(RunFailure::NotFound);
                return Ok(self.not_found(&name));
            }
            Err(wit::RunError::Redirect(message)) | Err(wit::RunError::Invalid(message)) => {
                self.error(&message);
                self.status = 1;
                self.last_failure = Some(RunFailure::Refused);
                return Ok(1);
            }
        };
        self.out.push_cut(
            &result.output.head,
            result.output.omitted,
            &result.output.tail,
        );
        if let Sink::Capture(level) = io.stdout {
            let captured = result.captured.clone();
            self.write(Sink::Capture(level), &captured);
        }
        let mut statuses = Vec::with_capacity(result.ends.len());
        for end in &result.ends {
            match end {
                wit::StageEnd::Exited(code) => statuses.push(i32::from(*code)),
                wit::StageEnd::Killed(reason) => {
                    if !result.timed_out {
                        self.error(reason);
                    }
                    self.last_failure = Some(RunFailure::Killed);
                    statuses.push(137);
                }
            }
        }
        if result.timed_out {
            return Err(Stop::Timeout);
        }
        if result.write_limit_reached {
            return Err(Stop::WriteLimit);
        }
        let status = self.pipeline_status(&statuses);
        self.status = status;
        Ok(status)
    }
}

/// The program `clawcage programs install` provides under `name` (its own name or another it
/// answers to), for the "command not found" message. The same names as the host's installable
/// programs (`host/sandbox/src/install.rs`).
fn installable(name: &str) -> Option<&'static str> {
    match name {
        "python3" | "python" => Some("python3"),
        "qjs" | "quickjs" => Some("qjs"),
        _ => None,
    }
}
