//! `web_fetch`: check the URL, send a GET through the host, and turn the
//! answer into text by its content type.

use clawcage_tool_sdk::ToolError;
use clawcage_tool_sdk::http::{self, Request, Response};
use url::Url;

use crate::html;
use crate::text::{cut, decode};

/// Schemes a model might write that are not web pages.
const NON_WEB_SCHEMES: &[&str] = &[
    "file",
    "ftp",
    "ftps",
    "sftp",
    "data",
    "javascript",
    "mailto",
    "about",
    "blob",
    "gopher",
    "ws",
    "wss",
    "ssh",
    "telnet",
    "ldap",
    "dict",
    "tel",
    "chrome",
    "view-source",
];

/// Characters of an error page's text quoted in a failure.
const ERROR_EXCERPT_CHARS: usize = 300;

/// The URL to fetch: an absolute http or https URL, or a bare host and path
/// (fetched over https). Anything else is invalid arguments.
pub fn normalize_url(input: &str) -> Result<Url, ToolError> {
    let text = input.trim();
    if text.is_empty() {
        return Err(ToolError::InvalidArgs(
            "argument 'url' is empty".to_string(),
        ));
    }
    let invalid = |reason: String| {
        ToolError::InvalidArgs(format!(
            "{text:?} is not a valid URL ({reason}); give an http:// or https:// URL such as https://example.com/page"
        ))
    };
    let scheme_end = text.find(':');
    let named_scheme = scheme_end
        .map(|end| text[..end].to_ascii_lowercase())
        .filter(|scheme| {
            !scheme.is_empty()
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
        });
    let url = match named_scheme {
        Some(scheme) if text.contains("://") || NON_WEB_SCHEMES.contains(&scheme.as_str()) => {
            Url::parse(text).map_err(|error| invalid(error.to_string()))?
        }
        // `example.com/page` or `localhost:8080/x`: no scheme, https by default.
        _ => Url::parse(&format!("https://{text}")).map_err(|error| invalid(error.to_string()))?,
    };
    match url.scheme() {
        "http" | "https" => {}
        other => {
            return Err(ToolError::InvalidArgs(format!(
                "{other}: URLs cannot be fetched; web_fetch reads only http:// and https:// URLs"
            )));
        }
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(invalid("it names no host".to_string()));
    }
    Ok(url)
}

/// Fetch `url` and return its content as text, at most `max_chars`
/// characters of content after a short header.
pub fn web_fetch(url: &str, max_chars: usize) -> Result<String, ToolError> {
    let url = normalize_url(url)?;
    let request = Request::get(url.as_str())
        .header(
            "accept",
            "text/html,application/xhtml+xml,application/json;q=0.9,text/plain;q=0.9,*/*;q=0.5",
        )
        .header("accept-language", "en;q=1.0, *;q=0.5");
    let response = http::send(request)?;
    render_response(&response, max_chars)
}

/// What a body is, by its content type or, without one, by a look at it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Html,
    Text,
    Binary,
}

fn kind_of(mime: &str, body: &[u8]) -> Kind {
    match mime {
        "text/html" | "application/xhtml+xml" => Kind::Html,
        "" => sniff(body),
        m if m.starts_with("text/")
            || m.ends_with("+json")
            || m.ends_with("+xml")
            || matches!(
                m,
                "application/json"
                    | "application/xml"
                    | "application/javascript"
                    | "application/ecmascript"
                    | "application/x-ndjson"
                    | "application/yaml"
                    | "application/toml"
                    | "application/x-sh"
            ) =>
        {
            Kind::Text
        }
        _ => Kind::Binary,
    }
}

fn sniff(body: &[u8]) -> Kind {
    let head = String::from_utf8_lossy(&body[..body.len().min(1024)]).to_ascii_lowercase();
    let trimmed = head.trim_start();
    if trimmed.starts_with("<!doctype html")
        || trimmed.starts_with("<html")
        || head.contains("<body")
    {
        Kind::Html
    } else if looks_like_utf8(&body[..body.len().min(4096)]) {
        Kind::Text
    } else {
        Kind::Binary
    }
}

/// Valid UTF-8, allowing a character cut at the end of the sample.
fn looks_like_utf8(sample: &[u8]) -> bool {
    match std::str::from_utf8(sample) {
        Ok(_) => true,
        Err(error) => error.error_len().is_none(),
    }
}

/// Split `text/html; charset=UTF-8` into (`text/html`, `Some("UTF-8")`).
fn parse_content_type(value: &str) -> (String, Option<String>) {
    let mut parts = value.split(';');
    let mime = parts.next().unwrap_or_default().trim().to_ascii_lowercase();
    let charset = parts.find_map(|part| {
        let (key, value) = part.split_once('=')?;
        key.trim()
            .eq_ignore_ascii_case("charset")
            .then(|| value.trim().trim_matches('"').to_string())
    });
    (mime, charset)
}

/// Turn a response into the tool's output.
fn render_response(response: &Response, max_chars: usize) -> Result<String, ToolError> {
    let (mime, charset) = parse_content_type(response.header("content-type").unwrap_or_default());
    let kind = kind_of(&mime, &response.body);
    let shown_mime = if mime.is_empty() {
        "unknown type".to_string()
    } else {
        mime.clone()
    };
    if kind == Kind::Binary {
        return Err(ToolError::Failed(format!(
            "{} is {shown_mime} ({} bytes{}), which web_fetch cannot turn into text",
            response.final_url,
            response.body.len(),
            if response.truncated { " or more" } else { "" }
        )));
    }
    let decoded = decode(&response.body, charset.as_deref());
    let (title, content) = match kind {
        Kind::Html => {
            let base = Url::parse(&response.final_url).ok();
            let rendered = html::render(&decoded, base.as_ref());
            (rendered.title, rendered.text)
        }
        _ => (None, decoded),
    };
    if response.status >= 400 {
        let excerpt = cut(content.trim(), ERROR_EXCERPT_CHARS);
        let status_text = status_reason(response.status);
        return Err(ToolError::Failed(format!(
            "{} answered HTTP {}{status_text}{}",
            response.final_url,
            response.status,
            if excerpt.is_empty() {
                String::new()
            } else {
                format!(":\n{excerpt}")
            }
        )));
    }
    let mut out = format!("URL: {}\n", response.final_url);
    if let Some(title) = title {
        out.push_str(&format!("Title: {title}\n"));
    }
    out.push_str(&format!(
        "Content-Type: {shown_mime}, HTTP {}\n",
        response.status
    ));
    if response.truncated {
        out.push_str(&format!(
            "Note: the page is larger than the host's download limit; only its first {} bytes were read.\n",
            response.body.len()
        ));
    }
    out.push('\n');
    if content.trim().is_empty() {
        out.push_str("(the page has no text content)");
    } else {
        out.push_str(&cut(&content, max_chars));
    }
    Ok(out)
}

fn status_reason(status: u16) -> &'static str {
    match status {
        400 => " Bad Request",
        401 => " Unauthorized",
        403 => " Forbidden",
        404 => " Not Found",
        405 => " Method Not Allowed",
        410 => " Gone",
        429 => " Too Many Requests",
        500 => " Internal Server Error",
        502 => " Bad Gateway",
        503 => " Service Unavailable",
        504 => " Gateway Timeout",
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(content_type: &str, body: &str) -> Response {
        Response {
            status: 200,
            headers: vec![("content-type".to_string(), content_type.to_string())],
            body: body.as_bytes().to_vec(),
            truncated: false,
            final_url: "https://example.com/a".to_string(),
        }
    }

    #[test]
    fn urls_are_checked_and_default_to_https() {
        assert_eq!(
            normalize_url("example.com/x").unwrap().as_str(),
            "https://example.com/x"
        );
        assert_eq!(
            normalize_url(" http://a.b/ ").unwrap().as_str(),
            "http://a.b/"
        );
        assert_eq!(
            normalize_url("localhost:8080/x").unwrap().as_str(),
            "https://localhost:8080/x"
        );
        for bad in [
            "file:///etc/passwd",
            "ftp://example.com/f",
            "javascript:alert(1)",
            "mailto:a@b.c",
            "data:text/html,hi",
            "gopher://x/",
            "",
            "http://",
            "http://exa mple.com/",
            "not a url",
            "http://[::1",
        ] {
            assert!(
                matches!(normalize_url(bad), Err(ToolError::InvalidArgs(_))),
                "{bad:?}: {:?}",
                normalize_url(bad)
            );
        }
    }

    #[test]
    fn json_and_text_pass_through() {
        let json = r#"{"a": [1, 2], "b": "<p>not html</p>"}"#;
        let out = render_response(&response("application/json", json), 1000).unwrap();
        assert!(out.ends_with(json), "{out}");
        assert!(
            out.contains("Content-Type: application/json, HTTP 200"),
            "{out}"
        );
        let out =
            render_response(&response("text/plain; charset=utf-8", "a  b\n c"), 1000).unwrap();
        assert!(out.ends_with("a  b\n c"), "{out}");
    }

    #[test]
    fn html_is_rendered_with_title() {
        let out = render_response(
            &response(
                "text/html; charset=UTF-8",
                "<title>T</title><h1>H</h1><p>x</p>",
            ),
            1000,
        )
        .unwrap();
        assert!(out.contains("Title: T\n"), "{out}");
        assert!(out.ends_with("# H\n\nx"), "{out}");
    }

    #[test]
    fn binary_and_errors_fail() {
        assert!(matches!(
            render_response(&response("image/png", "\u{89}PNG"), 1000),
            Err(ToolError::Failed(m)) if m.contains("image/png")
        ));
        let mut not_found = response("text/html", "<h1>Nope</h1>");
        not_found.status = 404;
        assert!(matches!(
            render_response(&not_found, 1000),
            Err(ToolError::Failed(m)) if m.contains("HTTP 404 Not Found") && m.contains("# Nope")
        ));
    }

    #[test]
    fn untyped_bodies_are_sniffed() {
        assert_eq!(kind_of("", b"<!DOCTYPE html><p>x"), Kind::Html);
        assert_eq!(kind_of("", b"plain words"), Kind::Text);
        assert_eq!(kind_of("", &[0xff, 0xfe, 0x00, 0x80]), Kind::Binary);
    }
}
