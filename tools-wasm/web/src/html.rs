//! HTML to readable text. The page is parsed by html5ever (through `scraper`),
//! the same HTML5 algorithm browsers use, so broken markup, entities and
//! implied tags come out as a browser would see them. The tree is then written
//! as light Markdown: headings as `#`, paragraphs separated by blank lines,
//! list items as `-` or `1.`, links as `[text](absolute url)`, `<pre>` as a
//! fenced block, table rows with cells joined by ` | `. Scripts, styles,
//! templates, forms' controls, embedded media and hidden elements are dropped.

use scraper::{Html, Node};
use url::Url;

/// A page as text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered {
    /// The `<title>`, whitespace collapsed, if any.
    pub title: Option<String>,
    /// The readable text.
    pub text: String,
}

/// Elements whose content is never shown.
const SKIPPED: &[&str] = &[
    "script", "style", "noscript", "template", "head", "svg", "math", "iframe", "object", "embed",
    "canvas", "video", "audio", "select", "button", "input", "textarea", "map", "dialog",
];

/// Elements that start and end a block of text.
const BLOCKS: &[&str] = &[
    "address",
    "article",
    "aside",
    "blockquote",
    "details",
    "dialog",
    "div",
    "dl",
    "dt",
    "dd",
    "fieldset",
    "figcaption",
    "figure",
    "footer",
    "form",
    "header",
    "hgroup",
    "main",
    "nav",
    "section",
    "summary",
    "table",
    "thead",
    "tbody",
    "tfoot",
    "caption",
    "center",
    "body",
];

/// Render `html`; relative links resolve against `base` when given.
pub fn render(html: &str, base: Option<&Url>) -> Rendered {
    let document = Html::parse_document(html);
    let mut base = base.cloned();
    let mut title = None;
    for node in document.tree.root().descendants() {
        if let Node::Element(element) = node.value() {
            match element.name() {
                "title" if title.is_none() => {
                    let text: String = node
                        .descendants()
                        .filter_map(|n| match n.value() {
                            Node::Text(t) => Some(&**t),
                            _ => None,
                        })
                        .collect();
                    let collapsed = collapse_whitespace(&text);
                    if !collapsed.is_empty() {
                        title = Some(collapsed);
                    }
                }
                "base" => {
                    if let Some(href) = element.attr("href")
                        && let Some(resolved) = resolve(base.as_ref(), href)
                    {
                        base = Some(resolved);
                    }
                }
                _ => {}
            }
        }
    }
    let mut writer = Writer {
        out: String::new(),
        pending_space: false,
        lists: Vec::new(),
        pre_depth: 0,
        base,
    };
    writer.children(document.tree.root());
    Rendered {
        title,
        text: tidy(&writer.out),
    }
}

/// Text of an HTML fragment (such as a search snippet with `<strong>`), with
/// entities decoded and whitespace collapsed.
pub fn fragment_text(fragment: &str) -> String {
    let parsed = Html::parse_fragment(fragment);
    let text: String = parsed
        .tree
        .root()
        .descendants()
        .filter_map(|n| match n.value() {
            Node::Text(t) => Some(&**t),
            _ => None,
        })
        .collect();
    collapse_whitespace(&text)
}

fn collapse_whitespace(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn resolve(base: Option<&Url>, href: &str) -> Option<Url> {
    let href = href.trim();
    match base {
        Some(base) => base.join(href).ok(),
        None => Url::parse(href).ok(),
    }
}

/// A node of the parsed tree.
type NodeRef<'a> = ego_tree::NodeRef<'a, Node>;

struct Writer {
    out: String,
    pending_space: bool,
    /// Open lists: `None` for `ul`, `Some(next number)` for `ol`.
    lists: Vec<Option<u64>>,
    pre_depth: usize,
    base: Option<Url>,
}

impl Writer {
    fn children(&mut self, node: NodeRef<'_>) {
        for child in node.children() {
            self.node(child);
        }
    }

    fn node(&mut self, node: NodeRef<'_>) {
        match node.value() {
            Node::Text(text) => self.text(text),
            Node::Element(element) => {
                let name = element.name();
                let hidden = element.attr("hidden").is_some()
                    || element
                        .attr("aria-hidden")
                        .is_some_and(|v| v.eq_ignore_ascii_case("true"));
                if SKIPPED.contains(&name) || hidden {
                    return;
                }
                match name {
                    "h1" | "h2" | "h3" | "h4" | "h5" | "h6" => {
                        let level = usize::from(name.as_bytes()[1] - b'0');
                        self.blank_line();
                        self.out.push_str(&"#".repeat(level));
                        self.out.push(' ');
                        self.children(node);
                        self.blank_line();
                    }
                    "p" => {
                        self.blank_line();
                        self.children(node);
                        self.blank_line();
                    }
                    "br" => self.newline(),
                    "hr" => {
                        self.blank_line();
                        self.out.push_str("---");
                        self.blank_line();
                    }
                    "ul" | "ol" | "menu" => {
                        if self.lists.is_empty() {
                            self.blank_line();
                        } else {
                            self.newline();
                        }
                        let start = element
                            .attr("start")
                            .and_then(|s| s.trim().parse().ok())
                            .unwrap_or(1);
                        self.lists.push((name == "ol").then_some(start));
                        self.children(node);
                        self.lists.pop();
                        if self.lists.is_empty() {
                            self.blank_line();
                        } else {
                            self.newline();
                        }
                    }
                    "li" => {
                        self.newline();
                        let depth = self.lists.len().max(1);
                        self.out.push_str(&"  ".repeat(depth - 1));
                        match self.lists.last_mut() {
                            Some(Some(number)) => {
                                self.out.push_str(&format!("{number}. "));
                                *number += 1;
                            }
                            _ => self.out.push_str("- "),
                        }
                        self.pending_space = false;
                        self.children(node);
                        self.newline();
                    }
                    "a" => self.link(node, element.attr("href")),
                    "pre" => {
                        self.blank_line();
                        self.out.push_str("```\n");
                        self.pre_depth += 1;
                        self.children(node);
                        self.pre_depth -= 1;
                        self.newline();
                        self.out.push_str("```");
                        self.blank_line();
                    }
                    "code" if self.pre_depth == 0 => {
                        self.flush_space();
                        self.out.push('`');
                        self.children(node);
                        self.out.push('`');
                    }
                    "tr" => {
                        self.newline();
                        let mut first = true;
                        for cell in node.children() {
                            if let Node::Element(cell_element) = cell.value()
                                && matches!(cell_element.name(), "td" | "th")
                            {
                                if !first {
                                    self.out.push_str(" | ");
                                }
                                first = false;
                                self.pending_space = false;
                                self.children(cell);
                            }
                        }
                        self.newline();
                    }
                    "img" => {
                        if let Some(alt) = element.attr("alt").map(collapse_whitespace)
                            && !alt.is_empty()
                        {
                            self.flush_space();
                            self.out.push_str(&format!("[image: {alt}]"));
                        }
                    }
                    _ if BLOCKS.contains(&name) => {
                        self.newline();
                        self.children(node);
                        self.newline();
                    }
                    _ => self.children(node),
                }
            }
            Node::Document | Node::Fragment => self.children(node),
            _ => {}
        }
    }

    fn link(&mut self, node: NodeRef<'_>, href: Option<&str>) {
        let target = href
            .map(str::trim)
            .filter(|h| !h.is_empty() && !h.starts_with('#'))
            .and_then(|h| resolve(self.base.as_ref(), h))
            .filter(|url| matches!(url.scheme(), "http" | "https" | "mailto"));
        let Some(target) = target else {
            self.children(node);
            return;
        };
        self.flush_space();
        let start = self.out.len();
        self.out.push('[');
        self.children(node);
        let inner = self.out[start + 1..].trim();
        if inner.is_empty() {
            self.out.truncate(start);
            return;
        }
        let inner = inner.to_string();
        self.out.truncate(start);
        self.out.push_str(&format!("[{inner}]({target})"));
    }

    fn text(&mut self, text: &str) {
        if self.pre_depth > 0 {
            self.out.push_str(text);
            return;
        }
        for c in text.chars() {
            if c.is_whitespace() {
                self.pending_space = true;
            } else {
                self.flush_space();
                self.out.push(c);
            }
        }
    }

    /// Write a pending space unless the line just started or a bracket opened.
    fn flush_space(&mut self) {
        if self.pending_space {
            let last = self.out.chars().last();
            if !matches!(last, None | Some('\n' | ' ' | '[' | '`')) && !self.out.ends_with("- ") {
                self.out.push(' ');
            }
            self.pending_space = false;
        }
    }

    fn trim_trailing_spaces(&mut self) {
        let kept = self.out.trim_end_matches([' ', '\t']).len();
        self.out.truncate(kept);
    }

    fn newline(&mut self) {
        self.trim_trailing_spaces();
        self.pending_space = false;
        if !self.out.is_empty() && !self.out.ends_with('\n') {
            self.out.push('\n');
        }
    }

    fn blank_line(&mut self) {
        self.newline();
        if !self.out.is_empty() && !self.out.ends_with("\n\n") {
            self.out.push('\n');
        }
    }
}

/// Trim every line's end and keep at most one blank line in a row.
fn tidy(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut blank_run = 0;
    for line in text.lines() {
        let line = line.trim_end();
        if line.is_empty() {
            blank_run += 1;
            if blank_run > 1 {
                continue;
            }
        } else {
            blank_run = 0;
        }
        out.push_str(line);
        out.push('\n');
    }
    out.trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(html: &str) -> String {
        render(
            html,
            Url::parse("https://example.com/docs/page").ok().as_ref(),
        )
        .text
    }

    #[test]
    fn headings_paragraphs_lists_and_links() {
        let page = r#"<!doctype html><html><head><title> The  Title </title>
            <style>body { color: red }</style><script>alert("x")</script></head>
            <body><h1>Main heading</h1><p>First   paragraph with a
            <a href="/other">relative link</a> and <b>bold</b> text.</p>
            <h2>Section</h2><ul><li>one</li><li>two <a href="https://x.org/">x</a></li></ul>
            <ol start="3"><li>three</li><li>four</li></ol>
            <p>Second &amp; last.</p></body></html>"#;
        let rendered = render(
            page,
            Url::parse("https://example.com/docs/page").ok().as_ref(),
        );
        assert_eq!(rendered.title.as_deref(), Some("The Title"));
        assert_eq!(
            rendered.text,
            "# Main heading\n\nFirst paragraph with a [relative link](https://example.com/other) and bold text.\n\n\
             ## Section\n\n- one\n- two [x](https://x.org/)\n\n3. three\n4. four\n\nSecond & last."
        );
    }

    #[test]
    fn scripts_styles_and_hidden_content_are_dropped() {
        let page = r#"<body><script>var secret = 1;</script><noscript>enable js</noscript>
            <style>.a{}</style><div hidden>hidden text</div><span aria-hidden="true">icon</span>
            <template><p>tpl</p></template><p>visible</p></body>"#;
        assert_eq!(text(page), "visible");
    }

    #[test]
    fn nested_lists_pre_and_tables() {
        let page = "<ul><li>a<ul><li>b</li></ul></li></ul><pre>  x = 1\n  y = 2</pre>\
                    <table><tr><th>k</th><th>v</th></tr><tr><td>a</td><td>1</td></tr></table>";
        assert_eq!(
            text(page),
            "- a\n  - b\n\n```\n  x = 1\n  y = 2\n```\n\nk | v\na | 1"
        );
    }

    #[test]
    fn broken_markup_is_read_as_a_browser_would() {
        let page = "<p>one<p>two <i>three<p>four &lt;tag&gt; &eacute;";
        assert_eq!(text(page), "one\n\ntwo three\n\nfour <tag> é");
    }

    #[test]
    fn links_without_text_or_to_fragments_and_scripts() {
        let page = r##"<p><a href="/x"><img src="i.png"></a> <a href="#top">top</a>
            <a href="javascript:alert(1)">js</a> <a href="/y"><img alt="logo"></a></p>"##;
        assert_eq!(text(page), "top js [[image: logo]](https://example.com/y)");
    }

    #[test]
    fn snippets_lose_their_markup() {
        assert_eq!(
            fragment_text("The <strong>Rust</strong> &amp; <em>wasm</em>  book"),
            "The Rust & wasm book"
        );
    }
}
