//! How a turn looks in a terminal: streamed text as it arrives, a "thinking" line counting the
//! seconds while the model has said nothing yet, each tool call shown when it starts (on a
//! terminal with its elapsed seconds counting, rewritten in place) and ended with its verdict
//! (`ok`, `denied`, `failed`, `invalid`, `not run`, `interrupted` and why; the time a person took
//! to approve it shown apart), retries and fail-overs as notes, and the token count after the
//! turn. The model's reasoning, when shown, is set apart on lines of its own, dimmed on a
//! terminal (plain text elsewhere). On a terminal, unless `NO_COLOR` is set, verdicts and errors
//! are coloured and the answer's Markdown (headings, `**bold**`, `` `code` ``, fenced blocks) is
//! styled as it streams. Text from the model or a tool never reaches the terminal raw: control
//! characters (escape sequences, carriage returns) are shown as visible symbols.
//! `clawcage chat` and `clawcage demo` write it to stdout and show reasoning; `clawcage run`
//! writes it to stderr so stdout holds only the answer, and shows reasoning only with
//! `--show-reasoning`. It is one file (over 700 lines) because the [`Console`]'s streamed text,
//! thinking line, call tickers, approval pauses and notes all write to one terminal line and must
//! each know what the others left on it; only the Markdown styling (`markdown`) stands apart.

mod markdown;

use markdown::Markdown;

use std::borrow::Cow;
use std::io::{IsTerminal as _, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
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

/// Whether text written to a terminal may carry colour and styles: not when `NO_COLOR` is set
/// to anything (<https://no-color.org>), nor on a `dumb` terminal.
pub fn colour_allowed() -> bool {
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|value| !value.is_empty());
    let dumb = std::env::var("TERM").is_ok_and(|term| term == "dumb");
    !no_color && !dumb
}

/// `text` safe to write to a terminal: every control character but newline and tab (ESC, CR,
/// BEL, backspace, the C1 controls such as CSI) becomes a visible symbol, so text from a model
/// or a tool can neither move the cursor, recolour the screen nor retitle the window.
pub fn sanitize(text: &str) -> Cow<'_, str> {
    let unsafe_char = |c: char| (c.is_control() && c != '\n' && c != '\t') || c == '\u{2028}';
    if !text.chars().any(unsafe_char) {
        return Cow::Borrowed(text);
    }
    Cow::Owned(
        text.chars()
            .map(|c| match c {
                '\u{1b}' => '␛',
                '\r' => '␍',
                c if (c as u32) < 0x20 => char::from_u32(0x2400 + c as u32).unwrap_or('�'),
                '\u{7f}' => '␡',
                c if unsafe_char(c) => '�',
                c => c,
            })
            .collect(),
    )
}

/// How a piece of text is shown on a colour terminal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// A good verdict.
    Good,
    /// An error, a denial, a failure.
    Bad,
    /// Something to look at: a note, an approval question, a call not run.
    Attention,
    /// Secondary text: usage lines, reasoning.
    Dim,
    /// Emphasis.
    Bold,
    /// Code.
    Code,
}

impl Style {
    fn on(self) -> &'static str {
        match self {
            Style::Good => "\x1b[32m",
            Style::Bad => "\x1b[31m",
            Style::Attention => "\x1b[33m",
            Style::Dim => DIM_ON,
            Style::Bold => "\x1b[1m",
            Style::Code => "\x1b[36m",
        }
    }

    fn off(self) -> &'static str {
        match self {
            Style::Good | Style::Bad | Style::Attention | Style::Code => "\x1b[39m",
            Style::Dim | Style::Bold => DIM_OFF,
        }
    }
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
    /// Colours and styles are written (a terminal, and `NO_COLOR` unset).
    colour: bool,
    state: Mutex<LineState>,
    calls: AtomicU64,
    /// Numbers each "thinking" line, so a ticker knows when its line is gone.
    thinking_lines: AtomicU64,
    /// The last tool call's name, arguments and output (`/last` shows it).
    last_output: Mutex<Option<(String, String, String)>>,
    /// The terminal's width in columns (0: unknown); a live line is kept within it, so
    /// rewriting it never leaves a wrapped part behind.
    columns: AtomicU64,
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
    /// The "thinking" line shown while the model has not answered yet, if any.
    thinking: Option<Thinking>,
    /// Where the streamed answer's Markdown is.
    markdown: Markdown,
    /// What the person is typing during the turn, not sent yet (shown on the live line).
    typed: String,
}

/// A tool call shown as started and not yet ended.
struct RunningCall {
    number: u64,
    /// `  > name {args}`.
    shown: String,
    started: Instant,
    /// Its line is still the last one and unterminated (a terminal rewrites it in place).
    open: bool,
    /// Time spent waiting for a person's approval, not counted as the call's own.
    waited: Duration,
    /// Since when it waits for a person, while it does.
    paused_at: Option<Instant>,
}

impl RunningCall {
    /// The call's own time so far: without the time it waited for a person.
    fn own_time(&self) -> Duration {
        let waiting = self.paused_at.map_or(Duration::ZERO, |at| at.elapsed());
        self.started.elapsed().saturating_sub(self.waited + waiting)
    }
}

/// The line that says the model is working before it has said anything.
struct Thinking {
    number: u64,
    started: Instant,
}

/// The console that draws the turn now, for lines written from elsewhere (compile progress)
/// that must not collide with its live line.
static ACTIVE: Mutex<Option<Weak<Console>>> = Mutex::new(None);

/// Writes `line` on stderr above the active console's live line (a running call or "thinking"),
/// which is drawn again below it; without one, just writes it.
pub fn interject(line: &str) {
    let active = ACTIVE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .as_ref()
        .and_then(Weak::upgrade);
    match active {
        Some(console) => console.interject(line),
        None => {
            let _ = writeln!(std::io::stderr(), "{}", sanitize(line));
        }
    }
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
            colour: terminal && colour_allowed(),
            state: Mutex::new(LineState::default()),
            calls: AtomicU64::new(0),
            thinking_lines: AtomicU64::new(0),
            last_output: Mutex::new(None),
            columns: AtomicU64::new(0),
        }
    }

    /// This console showing the model's reasoning or not (by default it does when it shows
    /// streamed text).
    pub fn with_reasoning(mut self, show: bool) -> Self {
        self.show_reasoning = show;
        self
    }

    /// The terminal is `columns` wide.
    pub fn set_columns(&self, columns: usize) {
        self.columns.store(columns as u64, Ordering::Relaxed);
    }

    /// Shows what the person is typing during the turn on the live line (a running call's or
    /// the thinking line), never in the streamed output; empty when it was sent.
    pub fn show_typed(&self, typed: &str) {
        let line = {
            let mut state = self.lock();
            state.typed = typed.to_string();
            self.live_text(&state)
        };
        if let Some(line) = line {
            self.write(&format!("\r\x1b[2K{line}"));
        }
    }

    /// The live line as it is to be drawn now, if one is open: the running call's with its
    /// seconds, or the thinking line; then what the person is typing. Cut to the terminal's
    /// width.
    fn live_text(&self, state: &LineState) -> Option<String> {
        let (base, dim) = if let Some(call) = state.call.as_ref().filter(|call| call.open) {
            let seconds = call.own_time().as_secs();
            let text = if seconds == 0 {
                format!("{} …", call.shown)
            } else {
                format!("{} … {seconds} s", call.shown)
            };
            (text, false)
        } else if let Some(thinking) = &state.thinking {
            let seconds = thinking.started.elapsed().as_secs();
            let text = if seconds == 0 {
                "  … thinking".to_string()
            } else {
                format!("  … thinking, {seconds} s")
            };
            (text, true)
        } else {
            return None;
        };
        let width = match self.columns.load(Ordering::Relaxed) {
            0 => usize::MAX,
            columns => (columns as usize).saturating_sub(1).max(20),
        };
        let base: String = base.chars().take(width).collect();
        let mut line = if dim {
            self.paint(Style::Dim, &base)
        } else {
            base.clone()
        };
        let room = width.saturating_sub(base.chars().count() + 8);
        if !state.typed.is_empty() && room > 0 {
            let typed = sanitize(&state.typed);
            let count = typed.chars().count();
            let tail: String = typed.chars().skip(count.saturating_sub(room)).collect();
            line.push_str(&format!("   {} {tail}", self.paint(Style::Bold, "you>")));
        }
        Some(line)
    }

    /// Makes this console the one [`interject`] writes above.
    pub fn activate(self: &Arc<Self>) {
        if self.terminal {
            *ACTIVE
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(Arc::downgrade(self));
        }
    }

    /// `text` in `style` when colours are on, else as it is.
    pub fn paint(&self, style: Style, text: &str) -> String {
        if self.colour {
            format!("{}{text}{}", style.on(), style.off())
        } else {
            text.to_string()
        }
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

    /// Erases the "thinking" line, if one is shown.
    fn clear_thinking(&self) {
        if self.lock().thinking.take().is_some() {
            self.write("\r\x1b[2K");
        }
    }

    /// On a terminal: shows that the model is working, counting the seconds, until the first
    /// text, reasoning, tool call or line replaces it.
    pub fn thinking(self: &Arc<Self>) {
        if !self.terminal || tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        {
            let state = self.lock();
            if state.thinking.is_some()
                || state.mid_line
                || state.call.as_ref().is_some_and(|call| call.open)
            {
                return;
            }
        }
        let number = self.thinking_lines.fetch_add(1, Ordering::Relaxed) + 1;
        self.lock().thinking = Some(Thinking {
            number,
            started: Instant::now(),
        });
        self.keep_live_line(move |state| {
            state
                .thinking
                .as_ref()
                .is_some_and(|thinking| thinking.number == number)
        });
    }

    /// Draws the live line (the thinking line or the running call's) now and again every
    /// second, with its seconds counting, while `current` says it is still the one shown.
    fn keep_live_line(self: &Arc<Self>, current: impl Fn(&LineState) -> bool + Send + 'static) {
        let line = self.live_text(&self.lock());
        if let Some(line) = line {
            self.write(&format!("\r\x1b[2K{line}"));
        }
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        let console = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let Some(console) = console.upgrade() else {
                    return;
                };
                let line = {
                    let state = console.lock();
                    if !current(&state) {
                        return;
                    }
                    console.live_text(&state)
                };
                if let Some(line) = line {
                    console.write(&format!("\r\x1b[2K{line}"));
                }
            }
        });
    }

    /// End a streamed line or a running call's line, if one is open.
    pub fn break_line(&self) {
        self.clear_thinking();
        let (open, reasoning, held) = {
            let mut state = self.lock();
            let call_open = state
                .call
                .as_mut()
                .is_some_and(|call| std::mem::replace(&mut call.open, false));
            let reasoning = std::mem::replace(&mut state.reasoning, false);
            let held = if self.colour {
                state.markdown.finish()
            } else {
                String::new()
            };
            (
                std::mem::replace(&mut state.mid_line, false) || call_open,
                reasoning,
                held,
            )
        };
        if !held.is_empty() {
            self.write(&held);
        }
        if reasoning && self.colour {
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
        self.clear_thinking();
        let starting = !self.lock().reasoning;
        if starting {
            self.break_line();
            if self.colour {
                self.write(DIM_ON);
            }
        }
        {
            let mut state = self.lock();
            state.reasoning = true;
            state.mid_line = !text.ends_with('\n');
        }
        self.write(&sanitize(text));
    }

    /// Shows `call` as started; on a terminal its line then counts the seconds until it ends.
    fn call_started(self: &Arc<Self>, call: &ToolCall) {
        self.break_line();
        let number = self.calls.fetch_add(1, Ordering::Relaxed) + 1;
        let shown = sanitize(&format!(
            "  > {} {}",
            call.name,
            preview(&call.arguments.to_string(), 80)
        ))
        .into_owned();
        self.lock().call = Some(RunningCall {
            number,
            shown,
            started: Instant::now(),
            open: self.terminal,
            waited: Duration::ZERO,
            paused_at: None,
        });
        self.draw_call(number);
    }

    /// Draws running call `number`'s line (again), and on a terminal keeps its seconds counting.
    fn draw_call(self: &Arc<Self>, number: u64) {
        let Some(shown) = self
            .lock()
            .call
            .as_ref()
            .filter(|call| call.number == number)
            .map(|call| call.shown.clone())
        else {
            return;
        };
        if !self.terminal {
            self.write(&format!("{shown} …\n"));
            return;
        }
        self.keep_live_line(move |state| {
            state
                .call
                .as_ref()
                .is_some_and(|call| call.number == number && call.open)
        });
    }

    /// A person is asked to approve the running call: its line stops counting and is ended,
    /// so the question stands on lines of its own; the wait is not counted as the call's time.
    pub fn pause_for_approval(&self) {
        self.break_line();
        if let Some(call) = self.lock().call.as_mut()
            && call.paused_at.is_none()
        {
            call.paused_at = Some(Instant::now());
        }
    }

    /// The person answered: the call's line is drawn again below the answer and counts on.
    pub fn resume_after_approval(self: &Arc<Self>) {
        let number = {
            let mut state = self.lock();
            let Some(call) = state.call.as_mut() else {
                return;
            };
            if let Some(at) = call.paused_at.take() {
                call.waited += at.elapsed();
            }
            call.open = self.terminal;
            call.number
        };
        self.draw_call(number);
    }

    /// Writes `line` on stderr above the live line, which is drawn again below it.
    fn interject(&self, line: &str) {
        let live = self.live_text(&self.lock());
        if live.is_some() {
            self.write("\r\x1b[2K");
        } else {
            self.break_line();
        }
        let _ = writeln!(std::io::stderr(), "{}", sanitize(line));
        if let Some(live) = live {
            self.write(&live);
        }
    }

    /// Ends the running call's line with `verdict` (a whole line of its own when other output
    /// came in between): its own time, and apart from it the time it waited for a person.
    fn call_ended(&self, line: String) {
        self.clear_thinking();
        let running = self.lock().call.take();
        let own = running
            .as_ref()
            .map(RunningCall::own_time)
            .filter(|own| *own >= Duration::from_secs(1))
            .map(|own| format!("{:.1} s", own.as_secs_f64()));
        let waited = running
            .as_ref()
            .map(|call| call.waited + call.paused_at.map_or(Duration::ZERO, |at| at.elapsed()))
            .filter(|waited| *waited >= Duration::from_millis(100))
            .map(|waited| format!("{:.1} s waiting for approval", waited.as_secs_f64()));
        let times: Vec<String> = own.into_iter().chain(waited).collect();
        let times = if times.is_empty() {
            String::new()
        } else {
            format!(" ({})", times.join("; "))
        };
        match running {
            Some(call) if call.open => self.write(&format!("\r\x1b[2K{line}{times}\n")),
            _ => self.write(&format!("{line}{times}\n")),
        }
    }

    /// The turn was interrupted (Ctrl-C): said once, on the running call's line if a call was
    /// running.
    pub fn interrupted(&self) {
        let running = self.lock().call.as_ref().map(|call| call.shown.clone());
        let said = self.paint(Style::Attention, "interrupted");
        match running {
            Some(shown) => self.call_ended(format!("{shown}  {said}")),
            None => self.line_raw(&format!("  {said}")),
        }
    }

    /// Print a full line (control characters made visible).
    pub fn line(&self, text: &str) {
        self.line_raw(&sanitize(text));
    }

    /// Print a full line in `style` (control characters made visible).
    pub fn styled_line(&self, style: Style, text: &str) {
        self.line_raw(&self.paint(style, &sanitize(text)));
    }

    /// The error that ended a turn: `error: ...` from the first column (the notes before it,
    /// such as retries, are indented), red on a colour terminal.
    pub fn error(&self, text: &str) {
        self.styled_line(Style::Bad, &format!("error: {text}"));
    }

    /// Print a full line as it is: for text this console built itself.
    fn line_raw(&self, text: &str) {
        self.break_line();
        self.write(&format!("{text}\n"));
    }

    /// Start a turn: forget what the last one streamed; on a terminal say the model is working.
    pub fn begin_turn(self: &Arc<Self>) {
        {
            let mut state = self.lock();
            state.streamed = false;
            state.mid_line = false;
            state.markdown = Markdown::default();
        }
        self.thinking();
    }

    /// Whether this turn's text was already shown while streaming.
    pub fn streamed(&self) -> bool {
        self.lock().streamed
    }

    /// The last tool call this console showed ended: its name, arguments and output.
    pub fn last_output(&self) -> Option<(String, String, String)> {
        self.last_output
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Prints the last tool call's output (`/last`), control characters made visible.
    pub fn print_last_output(&self) {
        match self.last_output() {
            None => self.line("  no tool has run in this chat yet"),
            Some((name, arguments, output)) => {
                self.styled_line(Style::Bold, &format!("  > {name} {arguments}"));
                if output.is_empty() {
                    self.line("  (no output)");
                }
                for line in output.lines() {
                    self.line(&format!("  │ {line}"));
                }
            }
        }
    }

    /// Close the turn: end the streamed line and print the usage line.
    pub fn end_turn(&self, answered_by: &str, turn: Usage, session: Usage) {
        self.break_line();
        if turn.input_tokens == 0 && turn.output_tokens == 0 {
            self.styled_line(
                Style::Dim,
                &format!("  ({answered_by}; the server reported no token usage for this turn)"),
            );
            return;
        }
        self.styled_line(
            Style::Dim,
            &format!(
                "  ({answered_by}; tokens this turn {} in / {} out; session {} in / {} out)",
                turn.input_tokens, turn.output_tokens, session.input_tokens, session.output_tokens
            ),
        );
    }

    /// The verdict line of `call`, its verdict coloured.
    fn verdict_line(&self, call: &ToolCall, verdict: &Verdict) -> String {
        let style = match verdict {
            Verdict::Ok => Style::Good,
            Verdict::NotRun(_) => Style::Attention,
            _ => Style::Bad,
        };
        let head = sanitize(&format!(
            "  > {} {}",
            call.name,
            preview(&call.arguments.to_string(), 80)
        ))
        .into_owned();
        // The label is this console's own text; the arguments and the reason are not.
        let label = self.paint(style, verdict.label());
        match verdict_reason(verdict) {
            None => format!("{head}  {label}"),
            Some(why) => format!("{head}  {label}: {}", sanitize(&preview(&why, 160))),
        }
    }

    fn tool_finished(&self, call: &ToolCall, verdict: &Verdict, output: &str) {
        *self
            .last_output
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some((
            call.name.clone(),
            preview(&call.arguments.to_string(), 200),
            output.to_string(),
        ));
        let started = self.lock().call.is_some();
        let line = self.verdict_line(call, verdict);
        if started {
            self.call_ended(line);
        } else {
            self.line_raw(&line);
        }
    }

    fn note(&self, text: &str) {
        self.styled_line(Style::Attention, &format!("  note: {text}"));
    }
}

/// ANSI faint text on, and back to normal.
const DIM_ON: &str = "\x1b[2m";
const DIM_OFF: &str = "\x1b[22m";

/// `text` without a label said twice at its start (`denied: denied: ...` becomes
/// `denied: ...`).
pub fn without_repeated_label(text: &str) -> &str {
    for label in ["denied: ", "failed: "] {
        let mut rest = text;
        while rest.starts_with(label) && rest[label.len()..].starts_with(label) {
            rest = &rest[label.len()..];
        }
        if rest.len() != text.len() {
            return rest;
        }
    }
    text
}

/// Why, for a verdict that has a reason: its first line, without a repeated `denied: `.
fn verdict_reason(verdict: &Verdict) -> Option<String> {
    let why = verdict.reason()?;
    let first_line = why.lines().next().unwrap_or_default();
    let label = verdict.label();
    let mut reason = first_line;
    while let Some(rest) = reason
        .strip_prefix(label)
        .and_then(|rest| rest.strip_prefix(": "))
    {
        reason = rest;
    }
    Some(reason.to_string())
}

impl ProviderEvents for Console {
    fn text_delta(&self, text: &str) {
        if !self.show_text || text.is_empty() {
            return;
        }
        self.clear_thinking();
        // The answer starts on a line of its own after the reasoning.
        if self.lock().reasoning {
            self.break_line();
        }
        let text = sanitize(text);
        let shown = {
            let mut state = self.lock();
            state.mid_line = !text.ends_with('\n');
            state.streamed = true;
            if self.colour {
                Cow::Owned(state.markdown.style(&text))
            } else {
                text
            }
        };
        self.write(&shown);
    }

    fn reasoning_delta(&self, text: &str) {
        self.reasoning(text);
    }

    fn retrying(&self, provider: &str, reason: &str, delay: Duration) {
        self.styled_line(
            Style::Attention,
            &format!(
                "  … {provider}: {}; retrying in {:.1}s",
                preview(reason, 160),
                delay.as_secs_f64()
            ),
        );
    }

    fn failing_over(&self, from: &str, to: &str, reason: &str) {
        self.styled_line(
            Style::Attention,
            &format!("  … {from} failed ({}); trying {to}", preview(reason, 160)),
        );
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
        self.0.thinking();
    }

    fn failing_over(&self, from: &str, to: &str, reason: &str) {
        self.0.failing_over(from, to, reason);
        self.0.thinking();
    }
}

impl TurnObserver for Shown {
    fn tool_started(&self, call: &ToolCall) {
        self.0.call_started(call);
    }

    fn tool_finished(&self, call: &ToolCall, verdict: &Verdict, output: &str) {
        self.0.tool_finished(call, verdict, output);
        // The model is asked again next.
        self.0.thinking();
    }

    fn note(&self, text: &str) {
        self.0.note(text);
    }
}

impl TurnObserver for Console {
    fn tool_finished(&self, call: &ToolCall, verdict: &Verdict, output: &str) {
        Console::tool_finished(self, call, verdict, output);
    }

    fn note(&self, text: &str) {
        Console::note(self, text);
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
    let time = i64::try_from(ms)
        .ok()
        .and_then(chrono::DateTime::<chrono::Utc>::from_timestamp_millis)
        .unwrap_or_default();
    time.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
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

    /// `pieces` streamed through the Markdown styler, then finished.
    fn styled(pieces: &[&str]) -> String {
        let mut markdown = Markdown::default();
        let mut out: String = pieces.iter().map(|piece| markdown.style(piece)).collect();
        out.push_str(&markdown.finish());
        out
    }

    #[test]
    fn markdown_is_styled_as_it_streams_whatever_the_pieces() {
        let whole = styled(&["# Title\nSay **hi** to `x`, 2 * 3.\n"]);
        let pieces = styled(&["#", " Ti", "tle\nSay *", "*hi*", "* to `", "x`, 2 * 3.\n"]);
        assert_eq!(whole, pieces);
        assert_eq!(
            whole,
            "\x1b[1m# Title\x1b[22m\nSay \x1b[1mhi\x1b[22m to \x1b[36mx\x1b[39m, 2 * 3.\n"
        );
        // A fence: its lines dimmed, the code coloured, no inline styling inside.
        assert_eq!(
            styled(&["```rust\na **b**\n```\nok\n"]),
            "\x1b[2m```rust\x1b[22m\n\x1b[36ma **b**\x1b[39m\n\x1b[2m```\x1b[22m\nok\n"
        );
        // An unclosed style ends with its line; a lone `#` is text.
        assert_eq!(styled(&["**open\n#5\n"]), "\x1b[1mopen\x1b[22m\n#5\n");
        assert_eq!(styled(&["*"]), "*");
    }

    #[test]
    fn control_characters_become_visible_symbols() {
        assert_eq!(sanitize("plain\ttext\n"), "plain\ttext\n");
        assert_eq!(
            sanitize("a\x1b[2Jb\rc\x07d\u{9b}31m\x7f"),
            "a␛[2Jb␍c␇d�31m␡"
        );
        assert_eq!(without_repeated_label("denied: denied: no"), "denied: no");
        assert_eq!(without_repeated_label("denied: no"), "denied: no");
    }

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
