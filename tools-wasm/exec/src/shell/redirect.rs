//! Redirections: resolving a command's `<`, `>`, `>>`, `2>&1`, `&>`, here-documents and
//! here-strings into where each descriptor goes ([`Redirected`]), the standard input a builtin
//! or group reads after them, and delivering what a builtin or group wrote to its destination
//! (a file write goes through the host, which checks and counts it like a program's).

use brush_parser::ast;

use super::parse::unsupported;
use super::{Flow, HOST_OUTPUT_LIMIT, Io, Shell, Sink, Stdin, Stop};
use crate::wit;

/// Where one descriptor of a command ends up after its redirections.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Dest {
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
pub(super) struct Redirected {
    pub(super) stdin: In,
    pub(super) stdout: Dest,
    pub(super) stderr: Dest,
    pub(super) files: Vec<wit::FileOpen>,
}

/// Where a command's standard input comes from after its redirections.
#[derive(Debug, Clone)]
pub(super) enum In {
    Inherit,
    None,
    Bytes(Vec<u8>),
    File(u32),
    Pipe,
}

impl Shell<'_> {
    /// Resolves `redirects` in order. The outer error stops the shell; the inner one is a
    /// redirection failure of this command (reported, status 1).
    pub(super) fn redirections(
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

    /// Sends `bytes` a builtin wrote to `dest`: the model's output, a capture, or a file (through
    /// the host, so the write is checked and counted like a program's). The host takes a lone
    /// `cat` without arguments from given bytes into one file as this, the shell's own output:
    /// it writes the bytes itself and judges the redirection's write, never `cat` as a program.
    pub(super) fn deliver(
        &mut self,
        resolved: &Redirected,
        dest: &Dest,
        bytes: &[u8],
        io: &Io,
    ) -> Flow<bool> {
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

    /// Creates or empties (or, appending, creates) each file `resolved` writes that nothing is
    /// delivered to: `echo hi > a > b` leaves `a` empty, as any shell does. False when one could
    /// not be opened (reported).
    pub(super) fn open_unwritten(&mut self, resolved: &Redirected, io: &Io) -> Flow<bool> {
        let mut opened = true;
        for (index, file) in resolved.files.iter().enumerate() {
            let dest = Dest::File(index as u32);
            if file.mode == wit::OpenMode::Read
                || resolved.stdout == dest
                || resolved.stderr == dest
            {
                continue;
            }
            opened &= self.deliver(resolved, &dest, b"", io)?;
        }
        Ok(opened)
    }

    /// The standard input of a builtin after its redirections; `None` when its file cannot be
    /// read (reported).
    pub(super) fn builtin_stdin(&mut self, resolved: &Redirected, io: &Io) -> Option<Stdin> {
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
}

/// What a builtin's two streams become: one write per destination. When descriptor 2 is a copy
/// of descriptor 1 into a file (`> f 2>&1`, `&> f`, `>& f`), both are one open of that file, so
/// they go as one write, output then errors: two writes would open (and truncate) it twice, and
/// the second, often empty, would wipe the first.
pub(super) fn deliveries(
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

/// Points descriptor `fd` (1, or 2) at `dest`.
fn set_output(resolved: &mut Redirected, fd: i32, dest: Dest) {
    if fd == 2 {
        resolved.stderr = dest;
    } else {
        resolved.stdout = dest;
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
