//! The output of one command line as the model sees it: everything written to stdout and stderr
//! in order, kept at its head and tail, with a marker in the middle stating how much there was.
//! Writing never fails, so a program that floods its output keeps running normally.

use std::collections::VecDeque;

/// Bytes kept at each end before the final cut to characters.
const KEPT_BYTES: usize = 64 << 10;

/// Output kept at its head and tail; the middle is counted.
#[derive(Debug, Default)]
pub struct Collected {
    head: Vec<u8>,
    tail: VecDeque<u8>,
    omitted: u64,
    total: u64,
}

impl Collected {
    /// Appends `bytes`.
    pub fn push(&mut self, mut bytes: &[u8]) {
        self.total += bytes.len() as u64;
        if self.omitted == 0 && self.tail.is_empty() && self.head.len() < KEPT_BYTES {
            let take = bytes.len().min(KEPT_BYTES - self.head.len());
            self.head.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
        }
        self.push_tail(bytes);
    }

    fn push_tail(&mut self, bytes: &[u8]) {
        if bytes.len() >= KEPT_BYTES {
            self.omitted += (self.tail.len() + bytes.len() - KEPT_BYTES) as u64;
            self.tail.clear();
            self.tail.extend(&bytes[bytes.len() - KEPT_BYTES..]);
            return;
        }
        self.tail.extend(bytes);
        let excess = self.tail.len().saturating_sub(KEPT_BYTES);
        if excess > 0 {
            self.tail.drain(..excess);
            self.omitted += excess as u64;
        }
    }

    /// Appends output that was already cut by the host: its head, then `omitted` bytes that are
    /// gone, then its tail.
    pub fn push_cut(&mut self, head: &[u8], omitted: u64, tail: &[u8]) {
        self.push(head);
        if omitted > 0 {
            self.total += omitted;
            self.omitted += omitted + self.tail.len() as u64;
            self.tail.clear();
        }
        self.push(tail);
    }

    /// Whether nothing was written.
    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// The text for the model: all of it when it fits in `max_chars`, else the first two thirds
    /// and the last third of `max_chars` around a marker stating the total.
    pub fn render(&self, max_chars: usize) -> String {
        let head = String::from_utf8_lossy(&self.head);
        let tail_bytes: Vec<u8> = self.tail.iter().copied().collect();
        let tail = String::from_utf8_lossy(&tail_bytes);
        let head_chars = head.chars().count();
        let tail_chars = tail.chars().count();
        if self.omitted == 0 && head_chars + tail_chars <= max_chars {
            return format!("{head}{tail}");
        }
        let keep_head = max_chars * 2 / 3;
        let keep_tail = max_chars - keep_head;
        let all: String;
        let (head, tail): (&str, &str) = if self.omitted == 0 {
            all = format!("{head}{tail}");
            (&all, &all)
        } else {
            (&head, &tail)
        };
        let shown_head: String = head.chars().take(keep_head).collect();
        let tail_total = tail.chars().count();
        let shown_tail: String = tail
            .chars()
            .skip(tail_total.saturating_sub(keep_tail))
            .collect();
        format!(
            "{shown_head}\n[... output cut: {} bytes in total; showing the first {} and the last {} characters ...]\n{shown_tail}",
            self.total,
            shown_head.chars().count(),
            shown_tail.chars().count()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_output_is_kept_whole() {
        let mut out = Collected::default();
        out.push(b"hello ");
        out.push(b"world");
        assert_eq!(out.render(100), "hello world");
    }

    #[test]
    fn long_output_keeps_head_and_tail_and_states_the_total() {
        let mut out = Collected::default();
        for i in 0..100_000 {
            out.push(format!("{i}\n").as_bytes());
        }
        let text = out.render(10_000);
        assert!(text.starts_with("0\n1\n2\n"));
        assert!(text.ends_with("99999\n"));
        assert!(
            text.contains("588890 bytes in total"),
            "{}",
            &text[6000..7000]
        );
        assert!(text.chars().count() < 10_200);
    }

    #[test]
    fn host_cut_output_counts_what_the_host_dropped() {
        let mut out = Collected::default();
        out.push_cut(b"start", 1_000_000, b"end");
        let text = out.render(10_000);
        assert!(text.starts_with("start"));
        assert!(text.ends_with("end"));
        assert!(text.contains("1000008 bytes in total"), "{text}");
    }
}
