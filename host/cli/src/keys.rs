//! Keys typed while a turn runs, in `chat` and `chat --gateway` on a terminal. The terminal is
//! put out of line mode and echo for the turn (`stty`, restored when the turn ends), so what a
//! person types is neither smeared over the streamed output nor left for the next prompt: a
//! thread reads the keys, the turn's loop gets them one by one — a single `y`, `a` or `n`
//! answers an approval question, and a line ended by Enter is a message sent to the busy session
//! through its queue mode. Ctrl-C still reaches the process as SIGINT. Without a terminal on
//! standard input nothing changes.

use std::io::{IsTerminal as _, Read as _};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use tokio::sync::mpsc;

/// One key a person pressed during a turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Key {
    /// A printable character.
    Char(char),
    /// Enter.
    Enter,
    /// Backspace.
    Backspace,
    /// Ctrl-U: forget the line typed so far.
    KillLine,
}

/// The terminal out of line mode for one turn, and the thread reading its keys. Dropping it
/// stops the thread and gives the terminal its settings back.
pub struct TurnKeys {
    keys: mpsc::UnboundedReceiver<Key>,
    stop: Arc<AtomicBool>,
    reader: Option<JoinHandle<()>>,
    /// The terminal's settings before (`stty -g`), given back at the end.
    saved: String,
    /// The terminal's width in columns, if `stty size` says.
    pub columns: Option<usize>,
}

/// The terminal's settings while a turn has changed them, to give back if the process is told
/// to end (SIGTERM, SIGHUP) before the turn does.
static SAVED: Mutex<Option<String>> = Mutex::new(None);

fn saved_settings() -> std::sync::MutexGuard<'static, Option<String>> {
    SAVED
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Ends the process on SIGTERM or SIGHUP as those signals do, after giving the terminal back
/// its settings if a turn had changed them (otherwise the shell would be left without echo).
/// Call once, inside the runtime, before the first turn.
pub fn restore_on_termination() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let (Ok(mut terminate), Ok(mut hangup)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::hangup()),
        ) else {
            return;
        };
        tokio::spawn(async move {
            let status = tokio::select! {
                _ = terminate.recv() => 143,
                _ = hangup.recv() => 129,
            };
            if let Some(settings) = saved_settings().take() {
                let _ = stty(&[settings.as_str()]);
            }
            std::process::exit(status);
        });
    }
}

/// Runs `stty` on standard input with `args`; its output when it succeeded.
fn stty(args: &[&str]) -> Option<String> {
    let output = Command::new("stty")
        .args(args)
        .stdin(Stdio::inherit())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).trim().to_string())
}

impl TurnKeys {
    /// Starts reading keys, when standard input is a terminal whose mode can be changed.
    pub fn start() -> Option<TurnKeys> {
        if !std::io::stdin().is_terminal() {
            return None;
        }
        let saved = stty(&["-g"])?;
        let columns = stty(&["size"]).and_then(|size| {
            size.split_whitespace()
                .nth(1)
                .and_then(|columns| columns.parse().ok())
        });
        // No line mode, no echo; a read returns after 0.1 s without a key, so the reader can
        // stop between keys and leave the rest of the input to the next prompt.
        *saved_settings() = Some(saved.clone());
        if stty(&["-icanon", "-echo", "min", "0", "time", "1"]).is_none() {
            *saved_settings() = None;
            return None;
        }
        let (sender, keys) = mpsc::unbounded_channel();
        let stop = Arc::new(AtomicBool::new(false));
        let reader = {
            let stop = stop.clone();
            std::thread::spawn(move || read_keys(&stop, &sender))
        };
        Some(TurnKeys {
            keys,
            stop,
            reader: Some(reader),
            saved,
            columns,
        })
    }

    /// The next key; never when the reader has stopped.
    pub async fn next(&mut self) -> Key {
        match self.keys.recv().await {
            Some(key) => key,
            None => std::future::pending().await,
        }
    }
}

impl Drop for TurnKeys {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        let _ = stty(&[self.saved.as_str()]);
        *saved_settings() = None;
    }
}

/// Reads standard input until `stop`, sending each key; escape sequences (arrows, function
/// keys) and other control keys are dropped.
fn read_keys(stop: &AtomicBool, keys: &mpsc::UnboundedSender<Key>) {
    // At least the standard input's own buffer size, so reads bypass it and nothing typed is
    // kept back from the next prompt.
    let mut buffer = vec![0u8; 16 << 10];
    let mut pending: Vec<u8> = Vec::new();
    let mut in_escape = false;
    while !stop.load(Ordering::SeqCst) {
        let read = match std::io::stdin().lock().read(&mut buffer) {
            Ok(0) => continue,
            Ok(read) => read,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        };
        pending.extend_from_slice(&buffer[..read]);
        let text = match std::str::from_utf8(&pending) {
            Ok(text) => text.to_string(),
            Err(error) if error.error_len().is_none() => {
                // An incomplete character: wait for the rest.
                let valid = error.valid_up_to();
                let text = String::from_utf8_lossy(&pending[..valid]).into_owned();
                pending.drain(..valid);
                send_keys(&text, &mut in_escape, keys);
                continue;
            }
            Err(_) => String::from_utf8_lossy(&pending).into_owned(),
        };
        pending.clear();
        send_keys(&text, &mut in_escape, keys);
    }
}

fn send_keys(text: &str, in_escape: &mut bool, keys: &mpsc::UnboundedSender<Key>) {
    for c in text.chars() {
        if *in_escape {
            // `ESC [ ... final` or `ESC O x`: skip to the final letter or `~`.
            if c.is_ascii_alphabetic() || c == '~' {
                *in_escape = false;
            }
            continue;
        }
        let key = match c {
            '\u{1b}' => {
                *in_escape = true;
                continue;
            }
            '\r' | '\n' => Key::Enter,
            '\u{7f}' | '\u{8}' => Key::Backspace,
            '\u{15}' => Key::KillLine,
            c if c.is_control() => continue,
            c => Key::Char(c),
        };
        if keys.send(key).is_err() {
            return;
        }
    }
}

/// The longest line kept while typing during a turn, in bytes; a longer paste is cut there.
pub const MAX_TYPED_BYTES: usize = 64 << 10;

/// A line typed during a turn, key by key.
#[derive(Debug, Default)]
pub struct TypedLine {
    text: String,
}

impl TypedLine {
    /// Takes `key`; the line when it was Enter and something was typed.
    pub fn take(&mut self, key: Key) -> Option<String> {
        match key {
            Key::Char(c) if self.text.len() + c.len_utf8() <= MAX_TYPED_BYTES => self.text.push(c),
            Key::Char(_) => {}
            Key::Backspace => {
                self.text.pop();
            }
            Key::KillLine => self.text.clear(),
            Key::Enter => {
                let line = std::mem::take(&mut self.text).trim().to_string();
                return (!line.is_empty()).then_some(line);
            }
        }
        None
    }

    /// What was typed and not sent yet.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// What was typed and not sent, for the next prompt.
    pub fn into_text(self) -> String {
        self.text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_sequences_and_control_keys_are_dropped() {
        let (sender, mut keys) = mpsc::unbounded_channel();
        let mut in_escape = false;
        send_keys("a\u{1b}[A\u{1b}[3~b\u{7}\r", &mut in_escape, &sender);
        let mut got = Vec::new();
        while let Ok(key) = keys.try_recv() {
            got.push(key);
        }
        assert_eq!(got, vec![Key::Char('a'), Key::Char('b'), Key::Enter]);
    }

    #[test]
    fn a_pasted_flood_is_cut_at_the_cap() {
        let mut line = TypedLine::default();
        for _ in 0..(MAX_TYPED_BYTES + 1000) {
            line.take(Key::Char('x'));
        }
        let sent = line.take(Key::Enter).unwrap();
        assert_eq!(sent.len(), MAX_TYPED_BYTES);
    }

    #[test]
    fn a_line_is_edited_and_sent_by_enter() {
        let mut line = TypedLine::default();
        for key in [
            Key::Char('h'),
            Key::Char('x'),
            Key::Backspace,
            Key::Char('i'),
        ] {
            assert_eq!(line.take(key), None);
        }
        assert_eq!(line.take(Key::Enter), Some("hi".to_string()));
        assert_eq!(line.take(Key::Enter), None, "an empty line is not sent");
        line.take(Key::Char('z'));
        line.take(Key::KillLine);
        assert_eq!(line.take(Key::Enter), None, "Ctrl-U forgot the line");
    }
}
