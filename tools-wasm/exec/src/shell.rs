//! The shell interpreter: parses a command line with brush-parser, refuses unsupported syntax
//! before anything runs, and executes the rest. Programs run through [`Process`]: a pipeline of
//! programs is one host call whose stages stream into each other. Builtins and compound commands
//! run here; when they take part in a pipeline, the stages run one after the other with the
//! output of one kept in memory as the input of the next. This file holds the shell's state and
//! the run loop (lists, `&&`/`||`, pipelines, compound commands); the submodules hold parsing
//! (`parse`), word expansion (`expand`), `$((...))` (`arithmetic`), redirections (`redirect`),
//! running programs (`launch`) and the builtins (`builtins`, `xargs_builtin`).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

use brush_parser::ast;
use clawcage_tool_sdk::ToolError;

use crate::glob;
use crate::output::Collected;
use crate::{OUTPUT_CHARS, Process};

mod arithmetic;
mod builtins;
mod expand;
mod launch;
mod parse;
mod read;
mod redirect;
mod xargs_builtin;

pub(crate) use parse::check_nesting;
use parse::{check_supported, parse, unsupported};
use redirect::{Dest, Redirected};

/// Nested `sh -c`, scripts and command substitutions allowed.
const MAX_DEPTH: usize = 32;
/// Bytes one command substitution or in-memory pipe may hold.
const BUFFER_LIMIT: u32 = 16 << 20;
/// Bytes of program output the host keeps at each end of one run.
const HOST_OUTPUT_LIMIT: u32 = 32 << 10;
/// Shell builtins.
const BUILTINS: &[&str] = &[
    ":", "[[", "bash", "cd", "command", "echo", "env", "exit", "export", "false", "printenv",
    "pwd", "read", "set", "sh", "true", "type", "unset", "which", "xargs",
];

/// Why execution stops early.
#[derive(Debug)]
enum Stop {
    /// `exit N`, or `set -e` after a failure.
    Exit(i32),
    /// The time limit passed.
    Timeout,
    /// Programs wrote more to files than the call allows.
    WriteLimit,
    /// Unsupported or malformed input; the text explains it.
    Refused(String),
}

type Flow<T> = Result<T, Stop>;

/// Where a command's standard output goes.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Sink {
    /// The output shown to the model.
    Main,
    /// Capture buffer number N (command substitution, in-memory pipe).
    Capture(usize),
    /// Nowhere (`2>/dev/null` on a command that runs others, such as `xargs`).
    Discard,
}

/// Where a command reads its standard input: nothing, or bytes shared with the commands after it
/// (a `read` consumes a line of them).
#[derive(Debug, Clone)]
enum Stdin {
    None,
    Bytes(Rc<RefCell<(Vec<u8>, usize)>>),
}

impl Stdin {
    fn bytes(data: Vec<u8>) -> Stdin {
        Stdin::Bytes(Rc::new(RefCell::new((data, 0))))
    }

    /// What is left, consumed.
    fn take_rest(&self) -> Option<Vec<u8>> {
        match self {
            Stdin::None => None,
            Stdin::Bytes(shared) => {
                let mut shared = shared.borrow_mut();
                let rest = shared.0[shared.1..].to_vec();
                shared.1 = shared.0.len();
                Some(rest)
            }
        }
    }

    /// Consumes input up to `delimiter` (consumed, not returned) or `max_chars` characters,
    /// whichever comes first: the text and whether the delimiter ended it. `None` at the end of
    /// the input.
    fn read_until(
        &self,
        delimiter: Option<u8>,
        max_chars: Option<usize>,
    ) -> Option<(String, bool)> {
        let Stdin::Bytes(shared) = self else {
            return None;
        };
        let mut shared = shared.borrow_mut();
        let (data, position) = &mut *shared;
        if *position >= data.len() || max_chars == Some(0) {
            return None;
        }
        let rest = &data[*position..];
        let mut chars = 0;
        let mut end = rest.len();
        let mut ended = false;
        for (at, byte) in rest.iter().enumerate() {
            if Some(*byte) == delimiter {
                end = at;
                ended = true;
                break;
            }
            // A character starts at every byte that does not continue one.
            if byte & 0xC0 != 0x80 {
                if max_chars == Some(chars) {
                    end = at;
                    break;
                }
                chars += 1;
            }
        }
        let text = String::from_utf8_lossy(&rest[..end]).into_owned();
        *position += end + usize::from(ended);
        Some((text, ended))
    }
}

#[derive(Debug, Clone)]
struct Io {
    stdin: Stdin,
    stdout: Sink,
    /// Where standard error goes: the model's output, or the same buffer as `stdout` inside a
    /// group whose `2>&1` made descriptor 2 a copy of descriptor 1.
    stderr: Sink,
}

#[derive(Debug, Clone)]
struct Variable {
    value: String,
    exported: bool,
}

/// One expanded simple command.
struct Prepared {
    argv: Vec<String>,
    assignments: Vec<(String, String)>,
    redirects: Vec<ast::IoRedirect>,
}

/// The interpreter's state for one tool call.
pub struct Shell<'a> {
    process: &'a mut dyn Process,
    workspace: Option<String>,
    vars: BTreeMap<String, Variable>,
    positional: Vec<String>,
    cwd: String,
    status: i32,
    out: Collected,
    captures: Vec<Vec<u8>>,
    programs: Option<Vec<String>>,
    started: Instant,
    timeout: Duration,
    errexit: bool,
    nounset: bool,
    pipefail: bool,
    depth: usize,
    /// Inside an `if`/`while` condition or a `&&`/`||` left side, where `set -e` does not apply.
    condition: usize,
    /// Why the last run of programs did not end normally, if it did not (`xargs` reports it).
    last_failure: Option<RunFailure>,
}

/// How a run of programs failed other than by an exit status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RunFailure {
    /// A program of that name does not exist.
    NotFound,
    /// The host refused to start it (the approvals policy, a redirection).
    Refused,
    /// The host stopped a program (a crash, its memory cap).
    Killed,
}

impl<'a> Shell<'a> {
    /// A shell in `workspace` (also its working directory) with the environment `env`.
    pub fn new(
        process: &'a mut dyn Process,
        workspace: Option<String>,
        env: Vec<(String, String)>,
        timeout: Duration,
    ) -> Self {
        let mut vars = BTreeMap::new();
        for (name, value) in env {
            vars.insert(
                name,
                Variable {
                    value,
                    exported: true,
                },
            );
        }
        let cwd = workspace.clone().unwrap_or_else(|| "/".to_string());
        vars.insert(
            "PWD".into(),
            Variable {
                value: cwd.clone(),
                exported: true,
            },
        );
        Shell {
            process,
            workspace,
            vars,
            positional: vec!["sh".to_string()],
            cwd,
            status: 0,
            out: Collected::default(),
            captures: Vec::new(),
            programs: None,
            started: Instant::now(),
            timeout,
            errexit: false,
            nounset: false,
            pipefail: false,
            depth: 0,
            condition: 0,
            last_failure: None,
        }
    }

    /// Runs `command` and returns the text for the model: the output, then the exit status.
    pub fn run_command_line(&mut self, command: &str) -> Result<String, ToolError> {
        let program = parse(command).map_err(ToolError::InvalidArgs)?;
        check_supported(&program).map_err(ToolError::InvalidArgs)?;
        let io = Io {
            stdin: Stdin::None,
            stdout: Sink::Main,
            stderr: Sink::Main,
        };
        let status = match self.run_program(&program, &io) {
            Ok(status) | Err(Stop::Exit(status)) => status,
            Err(Stop::Refused(message)) => {
                let so_far = self.output_so_far();
                return Err(ToolError::InvalidArgs(format!("{message}{so_far}")));
            }
            Err(Stop::Timeout) => {
                let so_far = self.output_so_far();
                return Err(ToolError::Failed(format!(
                    "the command line was stopped at its time limit of {:.1} s (it may loop forever, wait for input or have too much work; do less per call, or raise timeout_secs up to the operator's limit, [limits] timeout_secs){so_far}",
                    self.timeout.as_secs_f64()
                )));
            }
            Err(Stop::WriteLimit) => {
                let so_far = self.output_so_far();
                return Err(ToolError::Failed(format!(
                    "the command line was stopped: its programs wrote more to files than the write limit of this sandbox allows (no space left for this call){so_far}"
                )));
            }
        };
        let text = self.out.render(OUTPUT_CHARS);
        let separator = if text.is_empty() || text.ends_with('\n') {
            ""
        } else {
            "\n"
        };
        Ok(format!("{text}{separator}[exit status: {status}]"))
    }

    fn output_so_far(&self) -> String {
        if self.out.is_empty() {
            String::new()
        } else {
            format!(". Output so far:\n{}", self.out.render(OUTPUT_CHARS))
        }
    }

    fn remaining(&self) -> Flow<Duration> {
        self.timeout
            .checked_sub(self.started.elapsed())
            .filter(|left| !left.is_zero())
            .ok_or(Stop::Timeout)
    }

    fn write(&mut self, sink: Sink, bytes: &[u8]) {
        match sink {
            Sink::Main => self.out.push(bytes),
            Sink::Discard => {}
            Sink::Capture(level) => {
                if let Some(buffer) = self.captures.get_mut(level)
                    && buffer.len() < BUFFER_LIMIT as usize
                {
                    buffer.extend_from_slice(bytes);
                }
            }
        }
    }

    fn error(&mut self, message: &str) {
        self.out.push(format!("sh: {message}\n").as_bytes());
    }

    fn var(&self, name: &str) -> Option<String> {
        self.vars.get(name).map(|var| var.value.clone())
    }

    fn set_var(&mut self, name: &str, value: String) {
        let exported = self.vars.get(name).is_some_and(|var| var.exported);
        self.vars
            .insert(name.to_string(), Variable { value, exported });
    }

    fn run_program(&mut self, program: &ast::Program, io: &Io) -> Flow<i32> {
        for command in &program.complete_commands {
            self.run_list(command, io)?;
        }
        Ok(self.status)
    }

    fn run_list(&mut self, list: &ast::CompoundList, io: &Io) -> Flow<i32> {
        for ast::CompoundListItem(and_or, _separator) in &list.0 {
            self.run_and_or(and_or, io)?;
        }
        Ok(self.status)
    }

    fn run_and_or(&mut self, list: &ast::AndOrList, io: &Io) -> Flow<i32> {
        let has_more = !list.additional.is_empty();
        self.condition += usize::from(has_more);
        let first = self.run_pipeline(&list.first, io);
        self.condition -= usize::from(has_more);
        let mut status = first?;
        for (position, next) in list.additional.iter().enumerate() {
            let last = position + 1 == list.additional.len();
            let (run, pipeline) = match next {
                ast::AndOr::And(pipeline) => (status == 0, pipeline),
                ast::AndOr::Or(pipeline) => (status != 0, pipeline),
            };
            if run {
                self.condition += usize::from(!last);
                let result = self.run_pipeline(pipeline, io);
                self.condition -= usize::from(!last);
                status = result?;
            }
        }
        if status != 0 && self.errexit && self.condition == 0 {
            return Err(Stop::Exit(status));
        }
        Ok(status)
    }

    fn run_pipeline(&mut self, pipeline: &ast::Pipeline, io: &Io) -> Flow<i32> {
        self.remaining()?;
        if pipeline.bang {
            self.condition += 1;
        }
        let result = if pipeline.seq.len() == 1 {
            self.run_command(&pipeline.seq[0], io)
        } else {
            self.run_multi(&pipeline.seq, io)
        };
        if pipeline.bang {
            self.condition -= 1;
        }
        let mut status = result?;
        if pipeline.bang {
            status = i32::from(status == 0);
        }
        self.status = status;
        Ok(status)
    }

    /// A pipeline of several commands: one streaming host run when every stage is a program,
    /// else stage by stage through memory.
    fn run_multi(&mut self, seq: &[ast::Command], io: &Io) -> Flow<i32> {
        let mut prepared = Vec::with_capacity(seq.len());
        for command in seq {
            match command {
                ast::Command::Simple(simple) => {
                    let ready = self.prepare(simple)?;
                    let is_program = ready
                        .argv
                        .first()
                        .is_some_and(|name| !BUILTINS.contains(&name.as_str()));
                    if !is_program {
                        break;
                    }
                    prepared.push(ready);
                }
                _ => break,
            }
        }
        if prepared.len() == seq.len() {
            return self.run_programs(prepared, io);
        }
        // Stage by stage: each stage's output becomes the next one's input.
        let mut stdin = io.stdin.clone();
        let mut statuses = Vec::with_capacity(seq.len());
        for (position, command) in seq.iter().enumerate() {
            let last = position + 1 == seq.len();
            if last {
                let stage_io = Io {
                    stdin: stdin.clone(),
                    stdout: io.stdout,
                    stderr: io.stderr,
                };
                statuses.push(self.run_command(command, &stage_io)?);
            } else {
                self.captures.push(Vec::new());
                let level = self.captures.len() - 1;
                let stage_io = Io {
                    stdin: stdin.clone(),
                    stdout: Sink::Capture(level),
                    stderr: io.stderr,
                };
                let result = self.run_command(command, &stage_io);
                let captured = self.captures.pop().unwrap_or_default();
                statuses.push(result?);
                stdin = Stdin::bytes(captured);
            }
        }
        Ok(self.pipeline_status(&statuses))
    }

    fn pipeline_status(&self, statuses: &[i32]) -> i32 {
        if self.pipefail {
            statuses
                .iter()
                .rev()
                .copied()
                .find(|s| *s != 0)
                .unwrap_or(0)
        } else {
            statuses.last().copied().unwrap_or(0)
        }
    }

    fn run_command(&mut self, command: &ast::Command, io: &Io) -> Flow<i32> {
        self.remaining()?;
        let status = match command {
            ast::Command::Simple(simple) => {
                let prepared = self.prepare(simple)?;
                match prepared.argv.first() {
                    None => self.assign_only(prepared)?,
                    Some(name) if name == "xargs" => self.run_xargs(prepared, io)?,
                    Some(name) if BUILTINS.contains(&name.as_str()) => {
                        self.run_builtin(prepared, io)?
                    }
                    Some(_) => self.run_programs(vec![prepared], io)?,
                }
            }
            ast::Command::Compound(compound, redirects) => {
                self.run_compound_redirected(compound, redirects.as_ref(), io)?
            }
            ast::Command::Function(_) => {
                return Err(Stop::Refused(unsupported("shell functions")));
            }
            ast::Command::ExtendedTest(..) => {
                return Err(Stop::Refused(unsupported(
                    "[[ ... ]] tests (use [ ... ] or test)",
                )));
            }
        };
        self.status = status;
        Ok(status)
    }

    /// A compound command with redirections: input from a file or here-document; output into a
    /// buffer that goes to its file at the end.
    fn run_compound_redirected(
        &mut self,
        compound: &ast::CompoundCommand,
        redirects: Option<&ast::RedirectList>,
        io: &Io,
    ) -> Flow<i32> {
        let Some(redirects) = redirects.filter(|list| !list.0.is_empty()) else {
            return self.run_compound(compound, io);
        };
        let resolved = self.redirections(&redirects.0, io)?;
        let resolved = match resolved {
            Ok(resolved) => resolved,
            Err(message) => {
                self.error(&message);
                return Ok(1);
            }
        };
        let Some(stdin) = self.builtin_stdin(&resolved, io) else {
            return Ok(1);
        };
        self.captures.push(Vec::new());
        let level = self.captures.len() - 1;
        // With `2>&1` both descriptors are one destination: the group's errors go into the same
        // buffer as its output, in the order they were written, and that buffer is delivered
        // once.
        let stderr = match &resolved.stderr {
            same if *same == resolved.stdout => Sink::Capture(level),
            Dest::Sink(sink) => *sink,
            _ => io.stderr,
        };
        let inner = Io {
            stdin,
            stdout: Sink::Capture(level),
            stderr,
        };
        let result = self.run_compound(compound, &inner);
        let captured = self.captures.pop().unwrap_or_default();
        let status = result?;
        self.open_unwritten(&resolved, io)?;
        self.deliver(&resolved, &resolved.stdout.clone(), &captured, io)?;
        Ok(status)
    }

    fn run_compound(&mut self, compound: &ast::CompoundCommand, io: &Io) -> Flow<i32> {
        match compound {
            ast::CompoundCommand::BraceGroup(group) => self.run_list(&group.list, io),
            ast::CompoundCommand::Subshell(subshell) => {
                let saved = (self.vars.clone(), self.cwd.clone(), self.positional.clone());
                let result = match self.run_list(&subshell.list, io) {
                    Err(Stop::Exit(status)) => Ok(status),
                    other => other,
                };
                (self.vars, self.cwd, self.positional) = saved;
                result
            }
            ast::CompoundCommand::IfClause(clause) => {
                self.condition += 1;
                let test = self.run_list(&clause.condition, io);
                self.condition -= 1;
                if test? == 0 {
                    return self.run_list(&clause.then, io);
                }
                for branch in clause.elses.iter().flatten() {
                    match &branch.condition {
                        Some(condition) => {
                            self.condition += 1;
                            let test = self.run_list(condition, io);
                            self.condition -= 1;
                            if test? == 0 {
                                return self.run_list(&branch.body, io);
                            }
                        }
                        None => return self.run_list(&branch.body, io),
                    }
                }
                self.status = 0;
                Ok(0)
            }
            ast::CompoundCommand::WhileClause(clause)
            | ast::CompoundCommand::UntilClause(clause) => {
                let until = matches!(compound, ast::CompoundCommand::UntilClause(_));
                let mut status = 0;
                loop {
                    self.remaining()?;
                    self.condition += 1;
                    let test = self.run_list(&clause.0, io);
                    self.condition -= 1;
                    if (test? == 0) == until {
                        break;
                    }
                    status = self.run_list(&clause.1.list, io)?;
                }
                self.status = status;
                Ok(status)
            }
            ast::CompoundCommand::ForClause(clause) => {
                let values = match &clause.values {
                    Some(words) => {
                        let mut values = Vec::new();
                        for word in words {
                            values.extend(self.expand_fields(&word.value)?);
                        }
                        values
                    }
                    None => self.positional.iter().skip(1).cloned().collect(),
                };
                let mut status = 0;
                for value in values {
                    self.remaining()?;
                    self.set_var(&clause.variable_name, value);
                    status = self.run_list(&clause.body.list, io)?;
                }
                self.status = status;
                Ok(status)
            }
            ast::CompoundCommand::CaseClause(clause) => {
                let value = self.expand_single(&clause.value.value)?;
                for item in &clause.cases {
                    let mut hit = false;
                    for pattern in &item.patterns {
                        let chars = self.expand_pattern(&pattern.value)?;
                        if glob::matches(&chars, &value) {
                            hit = true;
                            break;
                        }
                    }
                    if hit {
                        return match &item.cmd {
                            Some(list) => self.run_list(list, io),
                            None => Ok(0),
                        };
                    }
                }
                Ok(0)
            }
            ast::CompoundCommand::Arithmetic(_) | ast::CompoundCommand::ArithmeticForClause(_) => {
                Err(Stop::Refused(unsupported(
                    "(( ... )) arithmetic commands (use $((...)) or test)",
                )))
            }
            ast::CompoundCommand::Coprocess(_) => Err(Stop::Refused(unsupported("coprocesses"))),
        }
    }

    /// A command of assignments and redirections only (`X=1`, `> file`): the assignments stay in
    /// the shell, and the first file opened for writing is created or emptied.
    fn assign_only(&mut self, prepared: Prepared) -> Flow<i32> {
        for (name, value) in prepared.assignments {
            self.set_var(&name, value);
        }
        if !prepared.redirects.is_empty() {
            let io = Io {
                stdin: Stdin::None,
                stdout: Sink::Main,
                stderr: Sink::Main,
            };
            match self.redirections(&prepared.redirects, &io)? {
                Ok(resolved) => {
                    // `> file` alone creates or empties the file (each of them).
                    let resolved = Redirected {
                        stdout: Dest::Discard,
                        stderr: Dest::Discard,
                        ..resolved
                    };
                    self.open_unwritten(&resolved, &io)?;
                }
                Err(message) => {
                    self.error(&message);
                    return Ok(1);
                }
            }
        }
        Ok(0)
    }

    /// `path` made absolute against the working directory.
    fn absolute(&self, path: &str) -> String {
        if path.starts_with('/') {
            path.to_string()
        } else if self.cwd.ends_with('/') {
            format!("{}{path}", self.cwd)
        } else {
            format!("{}/{path}", self.cwd)
        }
    }
}

#[cfg(test)]
mod tests;
