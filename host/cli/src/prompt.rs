//! The REPL's line input, shared by `chat` and `chat --gateway`: a rustyline editor read on a
//! blocking thread (so the runtime keeps rendering while a person types), the sink that prints
//! through the editor so a waiting prompt survives output, each line trimmed and kept in the
//! history; and the lines `/tools` prints for one tool.

use std::path::Path;
use std::sync::{Arc, Mutex};

use rustyline::error::ReadlineError;
use rustyline::{DefaultEditor, ExternalPrinter as _};

use crate::Failure;
use crate::render::Sink;

/// What the person gave at the prompt.
pub enum Input {
    /// A line, trimmed (empty when only Enter was pressed).
    Line(String),
    /// Ctrl-C at the prompt.
    Interrupted,
    /// Ctrl-D or the end of the input.
    End,
}

/// The prompt `you> ` and its history.
pub struct Prompt {
    /// Absent only while a line is being read on the blocking thread.
    editor: Option<DefaultEditor>,
}

impl Prompt {
    /// A prompt with an empty history.
    pub fn new() -> Result<Prompt, Failure> {
        let editor = DefaultEditor::new()
            .map_err(|error| Failure::Tool(format!("cannot start the line editor: {error}")))?;
        Ok(Prompt {
            editor: Some(editor),
        })
    }

    /// Loads the history kept in `file`, if it can be read.
    pub fn load_history(&mut self, file: &Path) {
        if let Some(editor) = self.editor.as_mut() {
            let _ = editor.load_history(file);
        }
    }

    /// Keeps the history in `file`, creating its directory; a failure is not worth an error.
    pub fn save_history(&mut self, file: &Path) {
        if let Some(editor) = self.editor.as_mut() {
            if let Some(dir) = file.parent() {
                let _ = std::fs::create_dir_all(dir);
            }
            let _ = editor.save_history(file);
        }
    }

    /// Where output goes while the prompt waits: through the editor's printer, so the prompt
    /// survives, when `through_editor` and the terminal allows it; else straight to stdout.
    pub fn idle_sink(&mut self, through_editor: bool) -> Sink {
        let printer = self
            .editor
            .as_mut()
            .filter(|_| through_editor)
            .and_then(|editor| editor.create_external_printer().ok());
        match printer {
            Some(printer) => {
                let printer = Mutex::new(printer);
                Sink::Lines(Arc::new(move |line: String| {
                    if let Ok(mut printer) = printer.lock() {
                        let _ = printer.print(format!("{line}\n"));
                    }
                }))
            }
            None => Sink::Stdout,
        }
    }

    /// Reads the next line (kept in the history unless empty), starting from `typed`: what
    /// the person typed during the last turn and did not send.
    pub async fn read(&mut self, typed: &str) -> Result<Input, Failure> {
        self.read_after("you> ", typed, true).await
    }

    /// Reads one answer to `question` (not kept in the history).
    pub async fn ask(&mut self, question: &str) -> Result<Input, Failure> {
        self.read_after(question, "", false).await
    }

    async fn read_after(
        &mut self,
        prompt: &str,
        typed: &str,
        keep: bool,
    ) -> Result<Input, Failure> {
        let Some(mut editor) = self.editor.take() else {
            return Ok(Input::End);
        };
        let prompt = prompt.to_string();
        let typed = typed.to_string();
        let (editor, line) = tokio::task::spawn_blocking(move || {
            let line = if typed.is_empty() {
                editor.readline(&prompt)
            } else {
                editor.readline_with_initial(&prompt, (&typed, ""))
            };
            (editor, line)
        })
        .await
        .map_err(|error| Failure::Tool(format!("the line editor stopped: {error}")))?;
        let editor = self.editor.insert(editor);
        match line {
            Ok(line) => {
                let line = line.trim().to_string();
                if keep && !line.is_empty() {
                    let _ = editor.add_history_entry(&line);
                }
                Ok(Input::Line(line))
            }
            Err(ReadlineError::Interrupted) => Ok(Input::Interrupted),
            Err(ReadlineError::Eof) => Ok(Input::End),
            Err(error) => Err(Failure::Tool(format!("cannot read input: {error}"))),
        }
    }
}

/// The two lines `/tools` prints for a tool: its name and the first sentence of its
/// description, then what it may reach.
pub fn print_tool_summary(name: &str, description: &str, grants: &str) {
    let first_line = description.lines().next().unwrap_or_default();
    let summary = first_line.split(". ").next().unwrap_or(first_line);
    outln!("  {}  — {}", name, summary.trim_end_matches('.'));
    outln!("      reaches: {grants}");
}

/// Asks for a decision on an approval request until one is given: `y` once, `a` always, `n`
/// deny; Ctrl-C or the end of the input deny.
pub async fn ask_decision(
    prompt: &mut Prompt,
) -> Result<clawcage_core::approval::ApprovalDecision, Failure> {
    use clawcage_core::approval::ApprovalDecision;
    loop {
        match prompt
            .ask("  allow? type y (once), a (always) or n (deny), then Enter: ")
            .await?
        {
            Input::Line(line) => match ApprovalDecision::parse(&line) {
                Some(decision) => return Ok(decision),
                None => outln!("  answer y, a or n"),
            },
            Input::Interrupted | Input::End => return Ok(ApprovalDecision::Deny),
        }
    }
}
