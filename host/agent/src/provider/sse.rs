//! A server-sent-events parser for streaming responses (the `text/event-stream` format of the
//! HTML standard): bytes go in as they arrive, complete events come out. Lines end in `\n`,
//! `\r\n` or `\r`; `data:` lines of one event are joined with `\n`; comments (`:`) and unknown
//! fields are ignored; an event ends at a blank line. Bytes are buffered until a line is
//! complete, so a chunk boundary inside a line or inside a UTF-8 character is harmless.

/// One event.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SseEvent {
    /// The `event:` field, empty when absent.
    pub event: String,
    /// The `data:` lines joined with `\n`.
    pub data: String,
}

/// Incremental parser state.
#[derive(Debug, Default)]
pub struct SseParser {
    line: Vec<u8>,
    last_was_cr: bool,
    event: String,
    data: Vec<String>,
    has_data: bool,
    buffered: usize,
}

/// The longest event accepted, so that a stream without line ends cannot grow memory forever.
pub const MAX_EVENT_BYTES: usize = 8 << 20;

impl SseParser {
    /// A parser at the start of a stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feed bytes; returns the events they completed, or an error if one event grew past
    /// [`MAX_EVENT_BYTES`].
    pub fn push(&mut self, bytes: &[u8]) -> Result<Vec<SseEvent>, String> {
        let mut events = Vec::new();
        for &byte in bytes {
            if self.last_was_cr {
                self.last_was_cr = false;
                if byte == b'\n' {
                    continue;
                }
            }
            match byte {
                b'\n' | b'\r' => {
                    self.last_was_cr = byte == b'\r';
                    let line = std::mem::take(&mut self.line);
                    if let Some(event) = self.end_line(&line) {
                        events.push(event);
                    }
                }
                _ => {
                    self.line.push(byte);
                    self.buffered += 1;
                    if self.buffered > MAX_EVENT_BYTES {
                        return Err(format!(
                            "a streamed event is larger than {} MiB",
                            MAX_EVENT_BYTES >> 20
                        ));
                    }
                }
            }
        }
        Ok(events)
    }

    fn end_line(&mut self, line: &[u8]) -> Option<SseEvent> {
        if line.is_empty() {
            self.buffered = 0;
            if !self.has_data {
                self.event.clear();
                return None;
            }
            let event = SseEvent {
                event: std::mem::take(&mut self.event),
                data: std::mem::take(&mut self.data).join("\n"),
            };
            self.has_data = false;
            return Some(event);
        }
        let text = String::from_utf8_lossy(line);
        if text.starts_with(':') {
            return None;
        }
        let (field, value) = match text.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (text.as_ref(), ""),
        };
        match field {
            "event" => self.event = value.to_string(),
            "data" => {
                self.data.push(value.to_string());
                self.has_data = true;
            }
            _ => {}
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_in_pieces(input: &[u8], piece: usize) -> Vec<SseEvent> {
        let mut parser = SseParser::new();
        let mut events = Vec::new();
        for chunk in input.chunks(piece) {
            events.extend(parser.push(chunk).unwrap());
        }
        events
    }

    #[test]
    fn events_survive_any_chunking_and_any_line_ending() {
        let input = "event: message_start\ndata: {\"a\":1}\n\n: keep-alive comment\n\nevent: delta\r\ndata: héllo\r\ndata: wörld\r\n\r\ndata:no-space\r\rid: 7\nretry: 10\ndata: [DONE]\n\n";
        let expected = vec![
            SseEvent {
                event: "message_start".into(),
                data: "{\"a\":1}".into(),
            },
            SseEvent {
                event: "delta".into(),
                data: "héllo\nwörld".into(),
            },
            SseEvent {
                event: String::new(),
                data: "no-space".into(),
            },
            SseEvent {
                event: String::new(),
                data: "[DONE]".into(),
            },
        ];
        for piece in 1..=input.len() {
            assert_eq!(
                parse_in_pieces(input.as_bytes(), piece),
                expected,
                "piece size {piece}"
            );
        }
    }

    #[test]
    fn an_unfinished_event_is_not_emitted_and_events_without_data_are_dropped() {
        let mut parser = SseParser::new();
        assert!(parser.push(b"event: ping\n\n").unwrap().is_empty());
        // An event not closed by a blank line is never emitted (the standard discards it).
        assert!(parser.push(b"data: half").unwrap().is_empty());
    }

    #[test]
    fn an_endless_line_is_refused() {
        let mut parser = SseParser::new();
        let chunk = vec![b'x'; 1 << 20];
        let mut result = Ok(Vec::new());
        for _ in 0..10 {
            result = parser.push(&chunk);
            if result.is_err() {
                break;
            }
        }
        assert!(result.unwrap_err().contains("larger than"));
    }
}
