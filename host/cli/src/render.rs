//! How a turn looks in a terminal: streamed text as it arrives, each tool call shown when it
//! starts (on a terminal with its elapsed seconds counting, rewritten in place) and ended with
//! its verdict (`ok`, `denied`, `failed`, `invalid`, `not run`, `interrupted` and why), retries
//! and fail-overs as notes, and the token count after the turn. The model's reasoning, when
//! shown, is set apart on lines of its own, dimmed on a terminal (plain text elsewhere).
//! `clawcage chat` and `clawcage demo` write it to stdout and show reasoning; `clawcage run`
//! writes it to stderr so stdout holds only the answer, and shows reasoning only with
//! `--show-reasoning`.

use std::io::{IsTerminal as _, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clawcage_agent::provider::{ProviderEvents, preview};
use clawcage_agent::{SendCallback, TurnObserver, Verdict};
use clawcage_core::{Tool as _, ToolCall, Usage};
use clawcage_sandbox::PluginReport;

/// Where the lines go.
#[derive(Clone)]
pub enum Sink {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
    /// A function (e.g. a line editor's printer that keeps the prompt intact).
    Lines(Arc<dyn Fn(String) + Send + Sync>),
}

/// A [`TurnObserver`] that prints.
pub struct Console {
    sink: Sink,
    /// Print streamed text (chat, demo) or not (run prints only the final answer).
    show_text: bool,
    /// Print the model's reasoning.
    show_reasoning: bool,
    /// The sink is a terminal: a running call's line is rewritten in place as seconds pass.
    terminal: bool,
    state: Mutex<LineState>,
    calls: AtomicU64,
}

#[derive(Default)]
struct LineState {
    /// Text printed since the last newline.
    mid_line: bool,
    /// Whether any text was streamed this turn.
    streamed: bool,
    /// Reasoning is being printed (dimmed on a terminal) and its line not yet ended.
    reasoning: bool,
    /// Buffered text when the sink takes whole lines.
    pending: String,
    /// The tool call running now, if any.
    call: Option<RunningCall>,
}

/// A tool call shown as started and not yet ended.
struct RunningCall {
    number: u64,
    /// `  > name {args}`.
    shown: String,
    started: Instant,
    /// Its line is still the last one and unterminated (a terminal rewrites it in place).
    open: bool,
}

impl Console {
    /// A console writing to `sink`.
    pub fn new(sink: Sink, show_text: bool) -> Self {
        let terminal = match &sink {
            Sink::Stdout => std::io::stdout().is_terminal(),
            Sink::Stderr => std::io::stderr().is_terminal(),
            Sink::Lines(_) => false,
        };
        Self {
            sink,
            show_text,
            show_reasoning: show_text,
            terminal,
            state: Mutex::new(LineState::default()),
            calls: AtomicU64::new(0),
        }
    }

    /// This console showing the model's reasoning or not (by default it does when it shows
    /// streamed text).
    pub fn with_reasoning(mut self, show: bool) -> Self {
        self.show_reasoning = show;
        self
    }

    fn write(&self, text: &str) {
        match &self.sink {
            Sink::Stdout => {
                let mut out = std::io::stdout().lock();
                let _ = out.write_all(text.as_bytes());
                let _ = out.flush();
            }
            Sink::Stderr => {
                let mut out = std::io::stderr().lock();
                let _ = out.write_all(text.as_bytes());
                let _ = out.flush();
            }
            Sink::Lines(print) => {
                let mut state = self.lock();
                state.pending.push_str(text);
                while let Some(end) = state.pending.find('\n') {
                    let line: String = state.pending.drain(..=end).collect();
                    print(line.trim_end_matches('\n').to_string());
                }
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LineState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// End a streamed line or a running call's line, if one is open.
    pub fn break_line(&self) {
        let (open, reasoning) = {
            let mut state = self.lock();
            let call_open = state
                .call
                .as_mut()
                .is_some_and(|call| std::mem::replace(&mut call.open, false));
            let reasoning = std::mem::replace(&mut state.reasoning, false);
            (
                std::mem::replace(&mut state.mid_line, false) || call_open,
                reasoning,
            )
        };
        if reasoning && self.terminal {
            self.write(DIM_OFF);
        }
        if open {
            self.write("\n");
        }
    }

    /// Shows a piece of the model's reasoning: on lines of its own, dimmed on a terminal.
    fn reasoning(&self, text: &str) {
        if !self.show_reasoning || text.is_empty() {
            return;
        }
        let starting = !self.lock().reasoning;
        if starting {
            self.break_line();
            if self.terminal {
                self.write(DIM_ON);
            }
        }
        {
            let mut state = self.lock();
            state.reasoning = true;
            state.mid_line = !text.ends_with('\n');
        }
        self.write(text);
    }

    /// Shows `call` as started; on a terminal its line then counts the seconds until it ends.
    fn call_started(self: &Arc<Self>, call: &ToolCall) {
        self.break_line();
        let number = self.calls.fetch_add(1, Ordering::Relaxed) + 1;
        let shown = format!(
            "  > {} {}",
            call.name,
            preview(&call.arguments.to_string(), 80)
        );
        if self.terminal {
            self.write(&format!("{shown} …"));
        } else {
            self.write(&format!("{shown} …\n"));
        }
        self.lock().call = Some(RunningCall {
            number,
            shown,
            started: Instant::now(),
            open: self.terminal,
        });
        if self.terminal && tokio::runtime::Handle::try_current().is_ok() {
            let console = Arc::downgrade(self);
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    let Some(console) = console.upgrade() else {
                        return;
                    };
                    let line = {
                        let state = console.lock();
                        match &state.call {
                            Some(call) if call.number == number && call.open => format!(
                                "\r\x1b[2K{} … {} s",
                                call.shown,
                                call.started.elapsed().as_secs()
                            ),
                            _ => return,
                        }
                    };
                    console.write(&line);
                }
            });
        }
    }

    /// Ends the running call's line with `verdict` (a whole line of its own when other output
    /// came in between).
    fn call_ended(&self, line: String) {
        let running = self.lock().call.take();
        let elapsed = running
            .as_ref()
            .map(|call| call.started.elapsed())
            .filter(|elapsed| *elapsed >= Duration::from_secs(1))
            .map(|elapsed| format!(" ({:.1} s)", elapsed.as_secs_f64()))
            .unwrap_or_default();
        match running {
            Some(call) if call.open => self.write(&format!("\r\x1b[2K{line}{elapsed}\n")),
            _ => self.write(&format!("{line}{elapsed}\n")),
        }
    }

    /// The turn was interrupted (Ctrl-C): said once, on the running call's line if a call was
    /// running.
    pub fn interrupted(&self) {
        let running = self.lock().call.as_ref().map(|call| call.shown.clone());
        match running {
            Some(shown) => self.call_ended(format!("{shown}  interrupted")),
            None => self.line("  interrupted"),
        }
    }

    /// Print a full line.
    pub fn line(&self, text: &str) {
        self.break_line();
        self.write(&format!("{text}\n"));
    }

    /// Start a turn: forget what the last one streamed.
    pub fn begin_turn(&self) {
        let mut state = self.lock();
        state.streamed = false;
        state.mid_line = false;
    }

    /// Whether this turn's text was already shown while streaming.
    pub fn streamed(&self) -> bool {
        self.lock().streamed
    }

    /// Close the turn: end the streamed line and print the usage line.
    pub fn end_turn(&self, answered_by: &str, turn: Usage, session: Usage) {
        self.break_line();
        if turn.input_tokens == 0 && turn.output_tokens == 0 {
            self.line(&format!(
                "  ({answered_by}; the server reported no token usage for this turn)"
            ));
            return;
        }
        self.line(&format!(
            "  ({answered_by}; tokens this turn {} in / {} out; session {} in / {} out)",
            turn.input_tokens, turn.output_tokens, session.input_tokens, session.output_tokens
        ));
    }
}

/// ANSI faint text on, and back to normal.
const DIM_ON: &str = "\x1b[2m";
const DIM_OFF: &str = "\x1b[22m";

impl ProviderEvents for Console {
    fn text_delta(&self, text: &str) {
        if !self.show_text || text.is_empty() {
            return;
        }
        // The answer starts on a line of its own after the reasoning.
        if self.lock().reasoning {
            self.break_line();
        }
        {
            let mut state = self.lock();
            state.mid_line = !text.ends_with('\n');
            state.streamed = true;
        }
        self.write(text);
    }

    fn reasoning_delta(&self, text: &str) {
        self.reasoning(text);
    }

    fn retrying(&self, provider: &str, reason: &str, delay: Duration) {
        self.line(&format!(
            "  … {provider}: {}; retrying in {:.1}s",
            preview(reason, 160),
            delay.as_secs_f64()
        ));
    }

    fn failing_over(&self, from: &str, to: &str, reason: &str) {
        self.line(&format!(
            "  … {from} failed ({}); trying {to}",
            preview(reason, 160)
        ));
    }
}

/// The console as the observer of a turn (it needs its `Arc` to count a call's seconds).
#[derive(Clone)]
pub struct Shown(pub Arc<Console>);

impl ProviderEvents for Shown {
    fn text_delta(&self, text: &str) {
        self.0.text_delta(text);
    }

    fn reasoning_delta(&self, text: &str) {
        self.0.reasoning(text);
    }

    fn retrying(&self, provider: &str, reason: &str, delay: Duration) {
        self.0.retrying(provider, reason, delay);
    }

    fn failing_over(&self, from: &str, to: &str, reason: &str) {
        self.0.failing_over(from, to, reason);
    }
}

impl TurnObserver for Shown {
    fn tool_started(&self, call: &ToolCall) {
        self.0.call_started(call);
    }

    fn tool_finished(&self, call: &ToolCall, verdict: &Verdict, output: &str) {
        self.0.tool_finished(call, verdict, output);
    }

    fn note(&self, text: &str) {
        self.0.note(text);
    }
}

impl TurnObserver for Console {
    fn tool_finished(&self, call: &ToolCall, verdict: &Verdict, _output: &str) {
        let started = self.lock().call.is_some();
        if started {
            self.call_ended(tool_line(call, verdict));
        } else {
            self.line(&tool_line(call, verdict));
        }
    }

    fn note(&self, text: &str) {
        self.line(&format!("  note: {text}"));
    }
}

/// `  > read_file {"path":"notes.txt"}  ok` or `... denied: why`.
pub fn tool_line(call: &ToolCall, verdict: &Verdict) -> String {
    let args = preview(&call.arguments.to_string(), 80);
    match verdict.reason() {
        None => format!("  > {} {args}  {}", call.name, verdict.label()),
        Some(why) => {
            let first_line = why.lines().next().unwrap_or_default();
            format!(
                "  > {} {args}  {}: {}",
                call.name,
                verdict.label(),
                preview(first_line, 160)
            )
        }
    }
}

/// A `message` tool callback that prints through `console`.
pub fn print_messages(console: Arc<Console>) -> SendCallback {
    clawcage_runtime::print_messages_with(Arc::new(move |line: String| console.line(&line)))
}

/// The plugins section of `clawcage tools`: each loaded plugin with its grant and what it was
/// not granted, then each refused plugin with the reason.
pub fn print_plugin_report(report: &PluginReport) {
    if report.loaded.is_empty() && report.refused.is_empty() {
        return;
    }
    outln!();
    outln!("plugins:");
    for plugin in &report.loaded {
        let tools: Vec<&str> = plugin
            .tools
            .iter()
            .map(|tool| tool.spec().name.as_str())
            .collect();
        outln!(
            "  {} loaded from {} (sha256 {}): {}",
            plugin.origin(),
            plugin.manifest.display(),
            &plugin.sha256[..12],
            tools.join(", ")
        );
        outln!("    grants: {}", plugin.grants);
        for note in &plugin.notes {
            outln!("    note: {note}");
        }
    }
    for refused in &report.refused {
        outln!("  refused: {refused}");
    }
}

/// Every refused plugin and every plugin warning, on stderr (each command shows them once).
pub fn report_plugin_problems(report: &PluginReport) {
    for refused in &report.refused {
        clawcage_runtime::tell!("clawcage: {refused}");
    }
    for warning in &report.warnings {
        clawcage_runtime::tell!("clawcage: warning: {warning}");
    }
}

/// Writes `text` and a newline to stdout. When the reader has gone (a closed pipe), the process
/// ends quietly with status 0: the output was not wanted any more.
pub fn out(text: &str) {
    let mut stdout = std::io::stdout().lock();
    let written = stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.write_all(b"\n"))
        .and_then(|()| stdout.flush());
    if let Err(error) = written
        && error.kind() == std::io::ErrorKind::BrokenPipe
    {
        std::process::exit(0);
    }
}

/// `ms` milliseconds since the Unix epoch as an RFC 3339 UTC time to the second.
pub fn rfc3339(ms: u64) -> String {
    let seconds = ms / 1000;
    let days = seconds / 86_400;
    let rest = seconds % 86_400;
    let (year, month, day) = civil_from_days(days as i64);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

/// The calendar date of `days` since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// `bytes` as `812 B`, `3.4 KiB` or `1.2 MiB`.
pub fn human_bytes(bytes: u64) -> String {
    match bytes {
        0..1024 => format!("{bytes} B"),
        1024..1_048_576 => format!("{:.1} KiB", bytes as f64 / 1024.0),
        _ => format!("{:.1} MiB", bytes as f64 / 1_048_576.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_and_sizes_read_well() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_796_094_245_000), "2026-12-01T03:04:05Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(human_bytes(812), "812 B");
        assert_eq!(human_bytes(3_500), "3.4 KiB");
        assert_eq!(human_bytes(5 << 20), "5.0 MiB");
    }
}
