//! The shell interpreter: parses a command line with brush-parser, refuses unsupported syntax
//! before anything runs, and executes the rest. Programs run through [`Process`]: a pipeline of
//! programs is one host call whose stages stream into each other. Builtins and compound commands
//! run here; when they take part in a pipeline, the stages run one after the other with the
//! output of one kept in memory as the input of the next.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

use brush_parser::ast;
use brush_parser::word::{
    Parameter, ParameterExpr, ParameterTestType, SpecialParameter, TildeExpr, WordPiece,
};
use clawcage_tool_sdk::ToolError;

use crate::glob::{self, PatternChar};
use crate::output::Collected;
use crate::wit;
use crate::{OUTPUT_CHARS, Process};

mod xargs_builtin;

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

    fn read_line(&self) -> Option<String> {
        let Stdin::Bytes(shared) = self else {
            return None;
        };
        let mut shared = shared.borrow_mut();
        let (data, position) = &mut *shared;
        if *position >= data.len() {
            return None;
        }
        let rest = &data[*position..];
        let end = rest.iter().position(|byte| *byte == b'\n');
        let line = match end {
            Some(end) => {
                *position += end + 1;
                &rest[..end]
            }
            None => {
                *position = data.len();
                rest
            }
        };
        Some(String::from_utf8_lossy(line).into_owned())
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

/// Where one descriptor of a command ends up after its redirections.
#[derive(Debug, Clone, PartialEq)]
enum Dest {
    Sink(Sink),
    /// The model's output (standard error).
    Err,
    Discard,
    /// The next stage of a streaming pipeline.
    Pipe,
    /// A file of the command's file list.
    File(u32),
}

/// A command's resolved redirections.
#[derive(Debug, Clone)]
struct Redirected {
    stdin: In,
    stdout: Dest,
    stderr: Dest,
    files: Vec<wit::FileOpen>,
}

#[derive(Debug, Clone)]
enum In {
    Inherit,
    None,
    Bytes(Vec<u8>),
    File(u32),
    Pipe,
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
        let stdin = match &resolved.stdin {
            In::Inherit | In::Pipe => io.stdin.clone(),
            In::None => Stdin::None,
            In::Bytes(bytes) => Stdin::bytes(bytes.clone()),
            In::File(index) => match std::fs::read(&resolved.files[*index as usize].path) {
                Ok(bytes) => Stdin::bytes(bytes),
                Err(error) => {
                    let path = resolved.files[*index as usize].path.clone();
                    self.error(&format!("{path}: {error}"));
                    return Ok(1);
                }
            },
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

    /// Expands a simple command's words, assignments and redirection list.
    fn prepare(&mut self, simple: &ast::SimpleCommand) -> Flow<Prepared> {
        let mut assignments = Vec::new();
        let mut redirects = Vec::new();
        let mut words: Vec<&str> = Vec::new();
        for item in simple.prefix.iter().flat_map(|prefix| prefix.0.iter()) {
            match item {
                ast::CommandPrefixOrSuffixItem::AssignmentWord(assignment, _) => {
                    let name = match &assignment.name {
                        ast::AssignmentName::VariableName(name) => name.clone(),
                        ast::AssignmentName::ArrayElementName(..) => {
                            return Err(Stop::Refused(unsupported("arrays")));
                        }
                    };
                    let value = match &assignment.value {
                        ast::AssignmentValue::Scalar(word) => self.expand_single(&word.value)?,
                        ast::AssignmentValue::Array(_) => {
                            return Err(Stop::Refused(unsupported("arrays")));
                        }
                    };
                    let value = if assignment.append {
                        self.var(&name).unwrap_or_default() + &value
                    } else {
                        value
                    };
                    assignments.push((name, value));
                }
                ast::CommandPrefixOrSuffixItem::IoRedirect(redirect) => {
                    redirects.push(redirect.clone());
                }
                ast::CommandPrefixOrSuffixItem::Word(word) => words.push(&word.value),
                ast::CommandPrefixOrSuffixItem::ProcessSubstitution(..) => {
                    return Err(Stop::Refused(unsupported("process substitution <(...)")));
                }
            }
        }
        if let Some(name) = &simple.word_or_name {
            words.push(&name.value);
        }
        for item in simple.suffix.iter().flat_map(|suffix| suffix.0.iter()) {
            match item {
                ast::CommandPrefixOrSuffixItem::IoRedirect(redirect) => {
                    redirects.push(redirect.clone());
                }
                ast::CommandPrefixOrSuffixItem::Word(word)
                | ast::CommandPrefixOrSuffixItem::AssignmentWord(_, word) => {
                    words.push(&word.value)
                }
                ast::CommandPrefixOrSuffixItem::ProcessSubstitution(..) => {
                    return Err(Stop::Refused(unsupported("process substitution <(...)")));
                }
            }
        }
        let mut argv = Vec::new();
        for word in words {
            argv.extend(self.expand_fields(word)?);
        }
        Ok(Prepared {
            argv,
            assignments,
            redirects,
        })
    }

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
                    // `> file` alone creates or empties the file.
                    for file in &resolved.files {
                        if file.mode != wit::OpenMode::Read {
                            self.deliver(&resolved, &Dest::File(0), b"", &io)?;
                            break;
                        }
                    }
                }
                Err(message) => {
                    self.error(&message);
                    return Ok(1);
                }
            }
        }
        Ok(0)
    }

    /// Resolves `redirects` in order. The outer error stops the shell; the inner one is a
    /// redirection failure of this command (reported, status 1).
    fn redirections(
        &mut self,
        redirects: &[ast::IoRedirect],
        io: &Io,
    ) -> Flow<Result<Redirected, String>> {
        let mut resolved = Redirected {
            stdin: In::Inherit,
            stdout: Dest::Sink(io.stdout),
            stderr: Dest::Err,
            files: Vec::new(),
        };
        for redirect in redirects {
            match redirect {
                ast::IoRedirect::File(fd, kind, target) => {
                    let fd = fd.unwrap_or(match kind {
                        ast::IoFileRedirectKind::Read
                        | ast::IoFileRedirectKind::DuplicateInput
                        | ast::IoFileRedirectKind::ReadAndWrite => 0,
                        _ => 1,
                    });
                    if !(0..=2).contains(&fd) {
                        return Ok(Err(format!(
                            "file descriptor {fd} is not supported (only 0, 1 and 2)"
                        )));
                    }
                    match (kind, target) {
                        (
                            ast::IoFileRedirectKind::DuplicateOutput
                            | ast::IoFileRedirectKind::DuplicateInput,
                            ast::IoFileRedirectTarget::Fd(from),
                        ) => {
                            let copied = match from {
                                1 => resolved.stdout.clone(),
                                2 => resolved.stderr.clone(),
                                0 if fd == 0 => continue,
                                other => {
                                    return Ok(Err(format!("{other}: bad file descriptor")));
                                }
                            };
                            set_output(&mut resolved, fd, copied);
                        }
                        (
                            ast::IoFileRedirectKind::DuplicateOutput
                            | ast::IoFileRedirectKind::DuplicateInput,
                            ast::IoFileRedirectTarget::Duplicate(word),
                        ) => {
                            let text = self.expand_single(&word.value)?;
                            match text.as_str() {
                                "-" => set_output(&mut resolved, fd, Dest::Discard),
                                "1" => {
                                    let copied = resolved.stdout.clone();
                                    set_output(&mut resolved, fd, copied);
                                }
                                "2" => {
                                    let copied = resolved.stderr.clone();
                                    set_output(&mut resolved, fd, copied);
                                }
                                _ if fd == 1 || fd == 2 => {
                                    // `>&file` means `>file 2>&1`.
                                    let index =
                                        self.open(&mut resolved, &text, wit::OpenMode::Truncate);
                                    resolved.stdout = Dest::File(index);
                                    resolved.stderr = Dest::File(index);
                                }
                                other => return Ok(Err(format!("{other}: bad file descriptor"))),
                            }
                        }
                        (_, ast::IoFileRedirectTarget::Filename(word)) => {
                            let path = self.expand_single(&word.value)?;
                            let mode = match kind {
                                ast::IoFileRedirectKind::Read
                                | ast::IoFileRedirectKind::ReadAndWrite => wit::OpenMode::Read,
                                ast::IoFileRedirectKind::Append => wit::OpenMode::Append,
                                _ => wit::OpenMode::Truncate,
                            };
                            if fd == 0 {
                                resolved.stdin = match path.as_str() {
                                    "/dev/null" => In::None,
                                    "/dev/stdin" => In::Inherit,
                                    _ => In::File(self.open(
                                        &mut resolved,
                                        &path,
                                        wit::OpenMode::Read,
                                    )),
                                };
                                continue;
                            }
                            let dest = match path.as_str() {
                                "/dev/null" => Dest::Discard,
                                "/dev/stdout" => resolved.stdout.clone(),
                                "/dev/stderr" => resolved.stderr.clone(),
                                _ => Dest::File(self.open(&mut resolved, &path, mode)),
                            };
                            set_output(&mut resolved, fd, dest);
                        }
                        _ => return Ok(Err(unsupported("this kind of redirection"))),
                    }
                }
                ast::IoRedirect::HereDocument(_, here) => {
                    let text = if here.requires_expansion {
                        self.expand_heredoc(&here.doc.value)?
                    } else {
                        here.doc.value.clone()
                    };
                    resolved.stdin = In::Bytes(text.into_bytes());
                }
                ast::IoRedirect::HereString(_, word) => {
                    let text = self.expand_single(&word.value)?;
                    resolved.stdin = In::Bytes(format!("{text}\n").into_bytes());
                }
                ast::IoRedirect::OutputAndError(word, append) => {
                    let path = self.expand_single(&word.value)?;
                    let dest = if path == "/dev/null" {
                        Dest::Discard
                    } else {
                        let mode = if *append {
                            wit::OpenMode::Append
                        } else {
                            wit::OpenMode::Truncate
                        };
                        Dest::File(self.open(&mut resolved, &path, mode))
                    };
                    resolved.stdout = dest.clone();
                    resolved.stderr = dest;
                }
            }
        }
        Ok(Ok(resolved))
    }

    fn open(&self, resolved: &mut Redirected, path: &str, mode: wit::OpenMode) -> u32 {
        resolved.files.push(wit::FileOpen {
            path: self.absolute(path),
            mode,
        });
        (resolved.files.len() - 1) as u32
    }

    fn absolute(&self, path: &str) -> String {
        if path.starts_with('/') {
            path.to_string()
        } else if self.cwd.ends_with('/') {
            format!("{}{path}", self.cwd)
        } else {
            format!("{}/{path}", self.cwd)
        }
    }

    fn programs(&mut self) -> Vec<String> {
        if self.programs.is_none() {
            self.programs = Some(self.process.programs());
        }
        self.programs.clone().unwrap_or_default()
    }

    /// The program `name` stands for: itself, or the last part of a path such as `/bin/ls`.
    fn program_name(&mut self, name: &str) -> Option<String> {
        let programs = self.programs();
        if programs.iter().any(|program| program == name) {
            return Some(name.to_string());
        }
        let base = name.rsplit('/').next()?;
        (name.contains('/') && programs.iter().any(|program| program == base))
            .then(|| base.to_string())
    }

    fn not_found(&mut self, name: &str) -> i32 {
        let message = self.not_found_message(name);
        self.error(&message);
        127
    }

    /// `command not found: NAME`, and the programs and builtins there are.
    fn not_found_message(&mut self, name: &str) -> String {
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

    fn exported_env(&self, extra: &[(String, String)]) -> Vec<(String, String)> {
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
    fn run_programs(&mut self, prepared: Vec<Prepared>, io: &Io) -> Flow<i32> {
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

    /// Sends `bytes` a builtin wrote to `dest`: the model's output, a capture, or a file (through
    /// the host, so the write is checked and counted like a program's). The host takes a lone
    /// `cat` without arguments from given bytes into one file as this, the shell's own output:
    /// it writes the bytes itself and judges the redirection's write, never `cat` as a program.
    fn deliver(&mut self, resolved: &Redirected, dest: &Dest, bytes: &[u8], io: &Io) -> Flow<bool> {
        match dest {
            Dest::Sink(sink) => self.write(*sink, bytes),
            Dest::Err => self.write(io.stderr, bytes),
            Dest::Pipe => self.write(Sink::Main, bytes),
            Dest::Discard => {}
            Dest::File(index) => {
                let Some(file) = resolved.files.get(*index as usize).cloned() else {
                    return Ok(false);
                };
                let remaining = self.remaining()?;
                let pipeline = wit::Pipeline {
                    stages: vec![wit::Stage {
                        program: "cat".to_string(),
                        args: Vec::new(),
                        env: Vec::new(),
                        cwd: self.cwd.clone(),
                        stdin: wit::Input::Bytes(bytes.to_vec()),
                        stdout: wit::Output::File(0),
                        stderr: wit::Output::Output,
                    }],
                    files: vec![file],
                    timeout_ms: u64::try_from(remaining.as_millis()).unwrap_or(u64::MAX),
                    output_limit: HOST_OUTPUT_LIMIT,
                    capture_limit: 0,
                };
                match self.process.run(&pipeline) {
                    Ok(result) => {
                        self.out.push_cut(
                            &result.output.head,
                            result.output.omitted,
                            &result.output.tail,
                        );
                        if result.write_limit_reached {
                            return Err(Stop::WriteLimit);
                        }
                    }
                    Err(wit::RunError::Redirect(message))
                    | Err(wit::RunError::Invalid(message))
                    | Err(wit::RunError::NotFound(message)) => {
                        self.error(&message);
                        self.status = 1;
                        return Ok(false);
                    }
                }
            }
        }
        Ok(true)
    }

    fn run_builtin(&mut self, prepared: Prepared, io: &Io) -> Flow<i32> {
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
                    text = text
                        .replace("\\n", "\n")
                        .replace("\\t", "\t")
                        .replace("\\\\", "\\");
                }
                stdout.extend_from_slice(text.as_bytes());
                if newline {
                    stdout.push(b'\n');
                }
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
            "read" => {
                let names: Vec<&String> = args.iter().filter(|arg| !arg.starts_with('-')).collect();
                match stdin.read_line() {
                    Some(line) => {
                        let mut fields: Vec<&str> = line.split_whitespace().collect();
                        if names.is_empty() {
                            self.set_var("REPLY", line.clone());
                        }
                        for (position, name) in names.iter().enumerate() {
                            let value = if position + 1 == names.len() {
                                let rest = fields.join(" ");
                                fields.clear();
                                rest
                            } else if fields.is_empty() {
                                String::new()
                            } else {
                                fields.remove(0).to_string()
                            };
                            self.set_var(name, value);
                        }
                        0
                    }
                    None => 1,
                }
            }
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
        let mut delivered = true;
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

    /// The standard input of a builtin after its redirections; `None` when its file cannot be
    /// read (reported).
    fn builtin_stdin(&mut self, resolved: &Redirected, io: &Io) -> Option<Stdin> {
        Some(match &resolved.stdin {
            In::Inherit | In::Pipe => io.stdin.clone(),
            In::None => Stdin::None,
            In::Bytes(bytes) => Stdin::bytes(bytes.clone()),
            In::File(index) => match std::fs::read(&resolved.files[*index as usize].path) {
                Ok(bytes) => Stdin::bytes(bytes),
                Err(error) => {
                    let path = resolved.files[*index as usize].path.clone();
                    self.error(&format!("{path}: {error}"));
                    return None;
                }
            },
        })
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

    // ---- expansion ----

    /// Expands `word` into fields: parameters, command substitution, arithmetic, then field
    /// splitting of unquoted results and globbing.
    fn expand_fields(&mut self, word: &str) -> Flow<Vec<String>> {
        let pieces = self.pieces(word)?;
        let mut fields: Vec<(Vec<PatternChar>, bool)> = Vec::new();
        let mut current: Vec<PatternChar> = Vec::new();
        let mut quoted_any = false;
        let mut started = false;
        for piece in pieces {
            match piece {
                Piece::Literal(text) => {
                    current.extend(text.chars().map(|c| PatternChar { c, literal: false }));
                    started = true;
                }
                Piece::Quoted(text) => {
                    current.extend(text.chars().map(|c| PatternChar { c, literal: true }));
                    quoted_any = true;
                    started = true;
                }
                Piece::Split(text) => {
                    for c in text.chars() {
                        if c == ' ' || c == '\t' || c == '\n' {
                            if !current.is_empty() || quoted_any {
                                fields.push((std::mem::take(&mut current), quoted_any));
                                quoted_any = false;
                            }
                            started = false;
                        } else {
                            current.push(PatternChar { c, literal: true });
                            started = true;
                        }
                    }
                }
            }
        }
        if started || !current.is_empty() || quoted_any {
            fields.push((current, quoted_any));
        }
        let mut result = Vec::new();
        for (chars, _quoted) in fields {
            if glob::has_wildcards(&chars) {
                let matches = glob::expand(&chars, &self.cwd);
                if !matches.is_empty() {
                    result.extend(matches);
                    continue;
                }
            }
            result.push(chars.iter().map(|pc| pc.c).collect());
        }
        Ok(result)
    }

    /// Expands `word` into one string (no splitting, no globbing).
    fn expand_single(&mut self, word: &str) -> Flow<String> {
        let pieces = self.pieces(word)?;
        Ok(pieces
            .into_iter()
            .map(|piece| match piece {
                Piece::Literal(text) | Piece::Quoted(text) | Piece::Split(text) => text,
            })
            .collect())
    }

    /// Expands `word` as a pattern (`case`): quoted parts match literally.
    fn expand_pattern(&mut self, word: &str) -> Flow<Vec<PatternChar>> {
        let pieces = self.pieces(word)?;
        let mut chars = Vec::new();
        for piece in pieces {
            match piece {
                Piece::Literal(text) => chars.extend(glob::unquoted(&text)),
                Piece::Quoted(text) | Piece::Split(text) => {
                    chars.extend(text.chars().map(|c| PatternChar { c, literal: true }))
                }
            }
        }
        Ok(chars)
    }

    fn expand_heredoc(&mut self, text: &str) -> Flow<String> {
        let options = brush_parser::ParserOptions::default();
        let pieces = brush_parser::word::parse_heredoc(text, &options)
            .map_err(|error| Stop::Refused(format!("cannot expand the here-document: {error}")))?;
        let mut out = Vec::new();
        for piece in pieces {
            self.piece(piece.piece, true, &mut out)?;
        }
        Ok(out
            .into_iter()
            .map(|piece| match piece {
                Piece::Literal(text) | Piece::Quoted(text) | Piece::Split(text) => text,
            })
            .collect())
    }

    fn pieces(&mut self, word: &str) -> Flow<Vec<Piece>> {
        let options = brush_parser::ParserOptions::default();
        let parsed = brush_parser::word::parse(word, &options)
            .map_err(|error| Stop::Refused(format!("cannot expand `{word}`: {error}")))?;
        let mut out = Vec::new();
        for piece in parsed {
            self.piece(piece.piece, false, &mut out)?;
        }
        Ok(out)
    }

    fn piece(&mut self, piece: WordPiece, quoted: bool, out: &mut Vec<Piece>) -> Flow<()> {
        let wrap = |text: String, split: bool| {
            if quoted {
                Piece::Quoted(text)
            } else if split {
                Piece::Split(text)
            } else {
                Piece::Literal(text)
            }
        };
        match piece {
            WordPiece::Text(text) => out.push(if quoted {
                Piece::Quoted(text)
            } else {
                Piece::Literal(text)
            }),
            WordPiece::SingleQuotedText(text) => out.push(Piece::Quoted(text)),
            WordPiece::AnsiCQuotedText(text) => out.push(Piece::Quoted(ansi_c(&text))),
            WordPiece::EscapeSequence(text) => {
                let unescaped = text.strip_prefix('\\').unwrap_or(&text).to_string();
                let unescaped = if unescaped == "\n" {
                    String::new()
                } else {
                    unescaped
                };
                out.push(Piece::Quoted(unescaped));
            }
            WordPiece::DoubleQuotedSequence(inner)
            | WordPiece::GettextDoubleQuotedSequence(inner) => {
                out.push(Piece::Quoted(String::new()));
                for piece in inner {
                    self.piece(piece.piece, true, out)?;
                }
            }
            WordPiece::TildeExpansion(tilde) => {
                let text = match tilde {
                    TildeExpr::Home => self.var("HOME").unwrap_or_else(|| "~".to_string()),
                    TildeExpr::WorkingDir => self.cwd.clone(),
                    TildeExpr::OldWorkingDir => self.var("OLDPWD").unwrap_or_default(),
                    TildeExpr::UserHome(user) => format!("~{user}"),
                    _ => return Err(Stop::Refused(unsupported("the directory stack (~N)"))),
                };
                out.push(Piece::Quoted(text));
            }
            WordPiece::ParameterExpansion(expr) => {
                let text = self.parameter_expression(expr)?;
                out.push(wrap(text, true));
            }
            WordPiece::CommandSubstitution(script)
            | WordPiece::BackquotedCommandSubstitution(script) => {
                let text = self.command_substitution(&script)?;
                out.push(wrap(text, true));
            }
            WordPiece::ArithmeticExpression(expr) => {
                let expanded = self.expand_single(&expr.value)?;
                let parsed = brush_parser::arithmetic::parse(&expanded).map_err(|error| {
                    Stop::Refused(format!(
                        "bad arithmetic expression `{}`: {error}",
                        expr.value
                    ))
                })?;
                let value = self.arithmetic(&parsed)?;
                out.push(wrap(value.to_string(), true));
            }
        }
        Ok(())
    }

    fn command_substitution(&mut self, script: &str) -> Flow<String> {
        if self.depth >= MAX_DEPTH {
            return Err(Stop::Refused(
                "command substitutions are nested too deeply".to_string(),
            ));
        }
        let program = parse(script).map_err(Stop::Refused)?;
        check_supported(&program).map_err(Stop::Refused)?;
        self.captures.push(Vec::new());
        let level = self.captures.len() - 1;
        let saved = (self.vars.clone(), self.cwd.clone());
        self.depth += 1;
        let io = Io {
            stdin: Stdin::None,
            stdout: Sink::Capture(level),
            stderr: Sink::Main,
        };
        let result = self.run_program(&program, &io);
        self.depth -= 1;
        (self.vars, self.cwd) = saved;
        let captured = self.captures.pop().unwrap_or_default();
        match result {
            Ok(_) | Err(Stop::Exit(_)) => {}
            Err(other) => return Err(other),
        }
        let mut text = String::from_utf8_lossy(&captured).into_owned();
        while text.ends_with('\n') {
            text.pop();
        }
        Ok(text)
    }

    fn parameter(&self, parameter: &Parameter) -> Flow<Option<String>> {
        Ok(match parameter {
            Parameter::Named(name) => self.var(name),
            Parameter::Positional(index) => self.positional.get(*index as usize).cloned(),
            Parameter::Special(special) => Some(match special {
                SpecialParameter::LastExitStatus => self.status.to_string(),
                SpecialParameter::PositionalParameterCount => {
                    (self.positional.len().saturating_sub(1)).to_string()
                }
                SpecialParameter::AllPositionalParameters { .. } => self
                    .positional
                    .iter()
                    .skip(1)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(" "),
                SpecialParameter::ProcessId => "1".to_string(),
                SpecialParameter::ShellName => self.positional.first().cloned().unwrap_or_default(),
                SpecialParameter::CurrentOptionFlags => String::new(),
                SpecialParameter::LastBackgroundProcessId => String::new(),
            }),
            Parameter::NamedWithIndex { .. } | Parameter::NamedWithAllIndices { .. } => {
                return Err(Stop::Refused(unsupported("arrays")));
            }
        })
    }

    fn parameter_name(parameter: &Parameter) -> String {
        match parameter {
            Parameter::Named(name) => name.clone(),
            other => other.to_string(),
        }
    }

    fn parameter_expression(&mut self, expr: ParameterExpr) -> Flow<String> {
        let unset_or_null = |value: &Option<String>, test: &ParameterTestType| match test {
            ParameterTestType::UnsetOrNull => value.as_deref().is_none_or(str::is_empty),
            ParameterTestType::Unset => value.is_none(),
        };
        match expr {
            ParameterExpr::Parameter {
                parameter,
                indirect: false,
            } => {
                let value = self.parameter(&parameter)?;
                if value.is_none() && self.nounset && matches!(parameter, Parameter::Named(_)) {
                    self.error(&format!(
                        "{}: unbound variable",
                        Self::parameter_name(&parameter)
                    ));
                    return Err(Stop::Exit(1));
                }
                Ok(value.unwrap_or_default())
            }
            ParameterExpr::UseDefaultValues {
                parameter,
                indirect: false,
                test_type,
                default_value,
            } => {
                let value = self.parameter(&parameter)?;
                if unset_or_null(&value, &test_type) {
                    self.expand_single(&default_value.unwrap_or_default())
                } else {
                    Ok(value.unwrap_or_default())
                }
            }
            ParameterExpr::AssignDefaultValues {
                parameter,
                indirect: false,
                test_type,
                default_value,
            } => {
                let value = self.parameter(&parameter)?;
                if unset_or_null(&value, &test_type) {
                    let new = self.expand_single(&default_value.unwrap_or_default())?;
                    if let Parameter::Named(name) = &parameter {
                        self.set_var(name, new.clone());
                    }
                    Ok(new)
                } else {
                    Ok(value.unwrap_or_default())
                }
            }
            ParameterExpr::UseAlternativeValue {
                parameter,
                indirect: false,
                test_type,
                alternative_value,
            } => {
                let value = self.parameter(&parameter)?;
                if unset_or_null(&value, &test_type) {
                    Ok(String::new())
                } else {
                    self.expand_single(&alternative_value.unwrap_or_default())
                }
            }
            ParameterExpr::IndicateErrorIfNullOrUnset {
                parameter,
                indirect: false,
                test_type,
                error_message,
            } => {
                let value = self.parameter(&parameter)?;
                if unset_or_null(&value, &test_type) {
                    let message = self.expand_single(
                        &error_message.unwrap_or_else(|| "parameter null or not set".to_string()),
                    )?;
                    self.error(&format!("{}: {message}", Self::parameter_name(&parameter)));
                    return Err(Stop::Exit(1));
                }
                Ok(value.unwrap_or_default())
            }
            ParameterExpr::ParameterLength {
                parameter,
                indirect: false,
            } => Ok(self
                .parameter(&parameter)?
                .unwrap_or_default()
                .chars()
                .count()
                .to_string()),
            ParameterExpr::RemoveSmallestSuffixPattern {
                parameter,
                indirect: false,
                pattern,
            } => self.remove_pattern(&parameter, pattern, true, false),
            ParameterExpr::RemoveLargestSuffixPattern {
                parameter,
                indirect: false,
                pattern,
            } => self.remove_pattern(&parameter, pattern, true, true),
            ParameterExpr::RemoveSmallestPrefixPattern {
                parameter,
                indirect: false,
                pattern,
            } => self.remove_pattern(&parameter, pattern, false, false),
            ParameterExpr::RemoveLargestPrefixPattern {
                parameter,
                indirect: false,
                pattern,
            } => self.remove_pattern(&parameter, pattern, false, true),
            _ => Err(Stop::Refused(unsupported("this form of ${...} expansion"))),
        }
    }

    /// `${X%PATTERN}`, `${X%%PATTERN}`, `${X#PATTERN}`, `${X##PATTERN}`.
    fn remove_pattern(
        &mut self,
        parameter: &Parameter,
        pattern: Option<String>,
        suffix: bool,
        largest: bool,
    ) -> Flow<String> {
        let value = self.parameter(parameter)?.unwrap_or_default();
        let pattern = self.expand_pattern(&pattern.unwrap_or_default())?;
        let chars: Vec<char> = value.chars().collect();
        let count = chars.len();
        let ascending: Vec<usize> = (0..=count).collect();
        let descending: Vec<usize> = (0..=count).rev().collect();
        if suffix {
            for &start in if largest { &ascending } else { &descending } {
                let tail: String = chars[start..].iter().collect();
                if glob::matches(&pattern, &tail) {
                    return Ok(chars[..start].iter().collect());
                }
            }
        } else {
            for &end in if largest { &descending } else { &ascending } {
                let head: String = chars[..end].iter().collect();
                if glob::matches(&pattern, &head) {
                    return Ok(chars[end..].iter().collect());
                }
            }
        }
        Ok(value)
    }

    fn arithmetic(&mut self, expr: &ast::ArithmeticExpr) -> Flow<i64> {
        use ast::ArithmeticExpr as E;
        use ast::BinaryOperator as B;
        Ok(match expr {
            E::Literal(value) => *value,
            E::Reference(ast::ArithmeticTarget::Variable(name)) => self
                .var(name)
                .and_then(|value| value.trim().parse().ok())
                .unwrap_or(0),
            E::Reference(_) => return Err(Stop::Refused(unsupported("arrays"))),
            E::UnaryOp(op, inner) => {
                let value = self.arithmetic(inner)?;
                match op {
                    ast::UnaryOperator::UnaryPlus => value,
                    ast::UnaryOperator::UnaryMinus => value.wrapping_neg(),
                    ast::UnaryOperator::BitwiseNot => !value,
                    ast::UnaryOperator::LogicalNot => i64::from(value == 0),
                }
            }
            E::BinaryOp(op, left, right) => {
                let a = self.arithmetic(left)?;
                let b = self.arithmetic(right)?;
                match op {
                    B::Power => a.wrapping_pow(u32::try_from(b).unwrap_or(0)),
                    B::Multiply => a.wrapping_mul(b),
                    B::Divide | B::Modulo if b == 0 => {
                        return Err(Stop::Refused("division by zero in $((...))".to_string()));
                    }
                    B::Divide => a.wrapping_div(b),
                    B::Modulo => a.wrapping_rem(b),
                    B::Comma => b,
                    B::Add => a.wrapping_add(b),
                    B::Subtract => a.wrapping_sub(b),
                    B::ShiftLeft => a.wrapping_shl(u32::try_from(b).unwrap_or(0)),
                    B::ShiftRight => a.wrapping_shr(u32::try_from(b).unwrap_or(0)),
                    B::LessThan => i64::from(a < b),
                    B::LessThanOrEqualTo => i64::from(a <= b),
                    B::GreaterThan => i64::from(a > b),
                    B::GreaterThanOrEqualTo => i64::from(a >= b),
                    B::Equals => i64::from(a == b),
                    B::NotEquals => i64::from(a != b),
                    B::BitwiseAnd => a & b,
                    B::BitwiseXor => a ^ b,
                    B::BitwiseOr => a | b,
                    B::LogicalAnd => i64::from(a != 0 && b != 0),
                    B::LogicalOr => i64::from(a != 0 || b != 0),
                }
            }
            E::Conditional(test, yes, no) => {
                if self.arithmetic(test)? != 0 {
                    self.arithmetic(yes)?
                } else {
                    self.arithmetic(no)?
                }
            }
            E::Assignment(..) | E::BinaryAssignment(..) | E::UnaryAssignment(..) => {
                return Err(Stop::Refused(unsupported(
                    "assignments inside $((...)) (write i=$((i+1)) instead)",
                )));
            }
        })
    }
}

/// Expansion results before splitting: literal text, quoted text, and unquoted expansion
/// results (split on whitespace).
enum Piece {
    Literal(String),
    Quoted(String),
    Split(String),
}

/// What a builtin's two streams become: one write per destination. When descriptor 2 is a copy
/// of descriptor 1 into a file (`> f 2>&1`, `&> f`, `>& f`), both are one open of that file, so
/// they go as one write, output then errors: two writes would open (and truncate) it twice, and
/// the second, often empty, would wipe the first.
fn deliveries(
    stdout_dest: &Dest,
    stderr_dest: &Dest,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
) -> Vec<(Dest, Vec<u8>)> {
    if stdout_dest == stderr_dest && matches!(stdout_dest, Dest::File(_)) {
        let mut both = stdout;
        both.extend_from_slice(&stderr);
        return vec![(stdout_dest.clone(), both)];
    }
    vec![(stdout_dest.clone(), stdout), (stderr_dest.clone(), stderr)]
}

fn set_output(resolved: &mut Redirected, fd: i32, dest: Dest) {
    if fd == 2 {
        resolved.stderr = dest;
    } else {
        resolved.stdout = dest;
    }
}

fn ansi_c(text: &str) -> String {
    text.replace("\\n", "\n")
        .replace("\\t", "\t")
        .replace("\\'", "'")
        .replace("\\\\", "\\")
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

fn unsupported(what: &str) -> String {
    format!("{what} are not supported by this shell")
}

/// Parses a command line.
fn parse(command: &str) -> Result<ast::Program, String> {
    let options = brush_parser::ParserOptions::default();
    let mut parser = brush_parser::Parser::new(std::io::Cursor::new(command.as_bytes()), &options);
    parser
        .parse_program()
        .map_err(|error| format!("syntax error: {error}; check the quoting and the command line"))
}

/// Refuses, before anything runs, syntax this shell does not support: background jobs,
/// functions, coprocesses.
fn check_supported(program: &ast::Program) -> Result<(), String> {
    fn list(list: &ast::CompoundList) -> Result<(), String> {
        for ast::CompoundListItem(and_or, separator) in &list.0 {
            if matches!(separator, ast::SeparatorOperator::Async) {
                return Err(
                    "background jobs (`&`) are not supported by this shell: commands run one after another; remove the `&`"
                        .to_string(),
                );
            }
            pipeline(&and_or.first)?;
            for next in &and_or.additional {
                match next {
                    ast::AndOr::And(p) | ast::AndOr::Or(p) => pipeline(p)?,
                }
            }
        }
        Ok(())
    }
    fn pipeline(pipeline: &ast::Pipeline) -> Result<(), String> {
        for command in &pipeline.seq {
            match command {
                ast::Command::Function(_) => {
                    return Err("shell functions are not supported by this shell (and `:(){ :|:& };:` cannot fork here); write the commands out".to_string());
                }
                ast::Command::Compound(compound, _) => match compound {
                    ast::CompoundCommand::BraceGroup(group) => list(&group.list)?,
                    ast::CompoundCommand::Subshell(subshell) => list(&subshell.list)?,
                    ast::CompoundCommand::IfClause(clause) => {
                        list(&clause.condition)?;
                        list(&clause.then)?;
                        for branch in clause.elses.iter().flatten() {
                            if let Some(condition) = &branch.condition {
                                list(condition)?;
                            }
                            list(&branch.body)?;
                        }
                    }
                    ast::CompoundCommand::WhileClause(clause)
                    | ast::CompoundCommand::UntilClause(clause) => {
                        list(&clause.0)?;
                        list(&clause.1.list)?;
                    }
                    ast::CompoundCommand::ForClause(clause) => list(&clause.body.list)?,
                    ast::CompoundCommand::CaseClause(clause) => {
                        for item in &clause.cases {
                            if let Some(body) = &item.cmd {
                                list(body)?;
                            }
                        }
                    }
                    ast::CompoundCommand::Coprocess(_) => {
                        return Err("coprocesses are not supported by this shell".to_string());
                    }
                    ast::CompoundCommand::Arithmetic(_)
                    | ast::CompoundCommand::ArithmeticForClause(_) => {
                        return Err("(( ... )) arithmetic commands are not supported by this shell; use $((...)) with test".to_string());
                    }
                },
                ast::Command::Simple(_) | ast::Command::ExtendedTest(..) => {}
            }
        }
        Ok(())
    }
    for command in &program.complete_commands {
        list(command)?;
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_streams_into_one_file_are_one_write_output_first() {
        let writes = deliveries(
            &Dest::File(0),
            &Dest::File(0),
            b"out\n".to_vec(),
            b"err\n".to_vec(),
        );
        assert_eq!(writes, vec![(Dest::File(0), b"out\nerr\n".to_vec())]);
        // An empty stderr does not become a second (truncating) write of the file.
        let writes = deliveries(&Dest::File(0), &Dest::File(0), b"x\n".to_vec(), Vec::new());
        assert_eq!(writes, vec![(Dest::File(0), b"x\n".to_vec())]);
    }

    #[test]
    fn streams_into_different_places_are_written_apart() {
        let writes = deliveries(&Dest::File(0), &Dest::File(1), b"y\n".to_vec(), Vec::new());
        assert_eq!(
            writes,
            vec![
                (Dest::File(0), b"y\n".to_vec()),
                (Dest::File(1), Vec::new())
            ]
        );
        let writes = deliveries(
            &Dest::Sink(Sink::Main),
            &Dest::Err,
            b"a".to_vec(),
            b"b".to_vec(),
        );
        assert_eq!(
            writes,
            vec![
                (Dest::Sink(Sink::Main), b"a".to_vec()),
                (Dest::Err, b"b".to_vec())
            ]
        );
    }
}
