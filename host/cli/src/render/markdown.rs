//! The streamed answer's Markdown styled as it arrives on a terminal: headings and `**bold**`
//! bold, `` `code` `` and fenced blocks coloured, with their markup left out; a piece that ends
//! in the middle of a marker is held back until the next piece says what it is.

use super::Style;

/// The streamed answer's Markdown state, for styling it as it arrives.
#[derive(Default)]
pub(super) struct Markdown {
    /// Nothing of the current line was seen yet.
    not_at_line_start: bool,
    /// Characters held back at a line's start, to tell a heading or a fence from text.
    line_head: String,
    /// Inside a fenced code block.
    in_fence: bool,
    /// The current line is a heading or fence line: its style ends with it.
    line_style: Option<Style>,
    /// Inside `**bold**`.
    bold: bool,
    /// Inside `` `code` ``.
    code: bool,
    /// A `*` held back: the next character says whether it is `**`.
    star: bool,
}

impl Markdown {
    /// `text` (already sanitised) with the styles of its Markdown; held-back characters wait
    /// for the next piece or [`Markdown::finish`].
    pub(super) fn style(&mut self, text: &str) -> String {
        let mut out = String::with_capacity(text.len() + 16);
        for c in text.chars() {
            if c == '\n' {
                self.end_line(&mut out);
                out.push('\n');
                continue;
            }
            if !self.not_at_line_start {
                let head_kind = self.line_head.chars().next();
                let same = head_kind.is_none_or(|kind| kind == c);
                if (c == '#' || c == '`') && same && self.line_head.len() < 6 {
                    self.line_head.push(c);
                    if self.line_head == "```" {
                        self.fence_line(&mut out);
                    }
                    continue;
                }
                self.decide_line(c, &mut out);
            }
            self.inline(c, &mut out);
        }
        out
    }

    fn in_fence_line(&self) -> bool {
        self.line_style == Some(Style::Dim)
    }

    /// Three backticks at a line's start: a fence opens or closes; the line is dimmed.
    fn fence_line(&mut self, out: &mut String) {
        self.not_at_line_start = true;
        self.in_fence = !self.in_fence;
        self.line_style = Some(Style::Dim);
        out.push_str(Style::Dim.on());
        out.push_str(&std::mem::take(&mut self.line_head));
    }

    /// The first character after a line's held-back head decides what the line is.
    fn decide_line(&mut self, next: char, out: &mut String) {
        self.not_at_line_start = true;
        let head = std::mem::take(&mut self.line_head);
        if self.in_fence {
            self.line_style = Some(Style::Code);
            out.push_str(Style::Code.on());
            out.push_str(&head);
        } else if !head.is_empty() && head.starts_with('#') && next == ' ' {
            self.line_style = Some(Style::Bold);
            out.push_str(Style::Bold.on());
            out.push_str(&head);
        } else {
            for c in head.chars() {
                self.inline(c, out);
            }
        }
    }

    /// One character of a line's text: `**` and `` ` `` switch styles outside code blocks.
    fn inline(&mut self, c: char, out: &mut String) {
        if self.in_fence || self.in_fence_line() {
            out.push(c);
            return;
        }
        if self.star {
            self.star = false;
            if c == '*' {
                self.bold = !self.bold;
                out.push_str(if self.bold {
                    Style::Bold.on()
                } else {
                    Style::Bold.off()
                });
                if !self.bold
                    && let Some(style) = self.line_style
                {
                    out.push_str(style.on());
                }
                return;
            }
            out.push('*');
        }
        match c {
            '*' if !self.code => self.star = true,
            '`' => {
                self.code = !self.code;
                out.push_str(if self.code {
                    Style::Code.on()
                } else {
                    Style::Code.off()
                });
            }
            c => out.push(c),
        }
    }

    /// A line ends: what it held back is written and its styles end.
    fn end_line(&mut self, out: &mut String) {
        if !self.not_at_line_start && !self.line_head.is_empty() {
            let head = std::mem::take(&mut self.line_head);
            if self.in_fence {
                out.push_str(&head);
            } else {
                for c in head.chars() {
                    self.inline(c, out);
                }
            }
        }
        if self.star {
            self.star = false;
            out.push('*');
        }
        if self.bold {
            self.bold = false;
            out.push_str(Style::Bold.off());
        }
        if self.code {
            self.code = false;
            out.push_str(Style::Code.off());
        }
        if let Some(style) = self.line_style.take() {
            out.push_str(style.off());
        }
        self.not_at_line_start = false;
    }

    /// The answer stops here for now (a tool call, the turn's end): what was held back is
    /// written and every style ends; a fence stays open for the next piece.
    pub(super) fn finish(&mut self) -> String {
        let mut out = String::new();
        let in_fence = self.in_fence;
        self.end_line(&mut out);
        self.in_fence = in_fence;
        out
    }
}
