//! `web_search`: a query to the Brave Search web API (or the endpoint the
//! operator configured in `CLAWCAGE_SEARCH_ENDPOINT`), answered as a
//! numbered list of title, URL and snippet. The API key is not here: the
//! host adds it to requests for the search host, so this code never sees it.

use clawcage_tool_sdk::http::{self, Request, Response};
use clawcage_tool_sdk::{ToolError, Value};
use url::Url;

use crate::html::fragment_text;

/// The Brave Search web endpoint.
pub const DEFAULT_ENDPOINT: &str = "https://api.search.brave.com/res/v1/web/search";
/// The setting that overrides it (tests point it at a local server).
pub const ENDPOINT_SETTING: &str = "CLAWCAGE_SEARCH_ENDPOINT";
/// Characters kept of one snippet.
const SNIPPET_CHARS: usize = 400;

/// One search result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hit {
    /// The page's title.
    pub title: String,
    /// Its URL.
    pub url: String,
    /// A short extract, markup removed.
    pub snippet: String,
}

/// The endpoint to ask, from the setting or the default.
fn endpoint() -> Result<Url, ToolError> {
    let configured = std::env::var(ENDPOINT_SETTING)
        .ok()
        .filter(|v| !v.trim().is_empty());
    let text = configured.as_deref().unwrap_or(DEFAULT_ENDPOINT);
    Url::parse(text.trim()).map_err(|error| {
        ToolError::Failed(format!(
            "the search endpoint {text:?} is not a valid URL ({error}); the operator sets it with [web] search_endpoint"
        ))
    })
}

/// The request for `query`, asking for `count` results.
pub fn request_url(endpoint: &Url, query: &str, count: u64) -> Url {
    let mut url = endpoint.clone();
    url.query_pairs_mut()
        .append_pair("q", query)
        .append_pair("count", &count.to_string());
    url
}

/// Search for `query` and format at most `count` results.
pub fn web_search(query: &str, count: u64) -> Result<String, ToolError> {
    let query = query.trim();
    if query.is_empty() {
        return Err(ToolError::InvalidArgs(
            "argument 'query' is empty".to_string(),
        ));
    }
    let url = request_url(&endpoint()?, query, count);
    let response = http::send(Request::get(url.as_str()).header("accept", "application/json"))?;
    let hits = parse_response(&response)?;
    Ok(format_hits(query, &hits, count as usize))
}

/// Read the API's answer, explaining the errors an operator can fix.
fn parse_response(response: &Response) -> Result<Vec<Hit>, ToolError> {
    match response.status {
        200..=299 => {}
        401 | 403 => {
            return Err(ToolError::Failed(format!(
                "the search service refused the request (HTTP {}): the API key is missing or wrong. \
                 The operator sets it in the environment (BRAVE_API_KEY for api.search.brave.com, \
                 or the variable named in [[network.secrets]])",
                response.status
            )));
        }
        429 => {
            return Err(ToolError::Failed(
                "the search service is rate-limiting requests (HTTP 429); wait a moment and try again"
                    .to_string(),
            ));
        }
        status => {
            let body = String::from_utf8_lossy(&response.body);
            let excerpt: String = body.chars().take(300).collect();
            return Err(ToolError::Failed(format!(
                "the search service answered HTTP {status}: {excerpt}"
            )));
        }
    }
    if response.truncated {
        return Err(ToolError::Failed(
            "the search service's answer was larger than the host's download limit and was cut; \
             ask for fewer results"
                .to_string(),
        ));
    }
    let json: Value = serde_json::from_slice(&response.body).map_err(|error| {
        ToolError::Failed(format!(
            "the search service's answer is not JSON ({error}); is [web] search_endpoint a Brave Search API endpoint?"
        ))
    })?;
    let results = json
        .pointer("/web/results")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    Ok(results
        .iter()
        .filter_map(|result| {
            let url = result.get("url")?.as_str()?.to_string();
            let title = result
                .get("title")
                .and_then(Value::as_str)
                .map(fragment_text)
                .filter(|t| !t.is_empty())
                .unwrap_or_else(|| url.clone());
            let snippet = result
                .get("description")
                .and_then(Value::as_str)
                .map(fragment_text)
                .unwrap_or_default();
            Some(Hit {
                title,
                url,
                snippet: snippet.chars().take(SNIPPET_CHARS).collect(),
            })
        })
        .collect())
}

/// `1. title\n   url\n   snippet`, one block per hit.
pub fn format_hits(query: &str, hits: &[Hit], count: usize) -> String {
    if hits.is_empty() {
        return format!("No results for {query:?}.");
    }
    let shown = &hits[..hits.len().min(count)];
    let mut out = format!("Results for {query:?} ({}):\n", shown.len());
    for (index, hit) in shown.iter().enumerate() {
        out.push_str(&format!("\n{}. {}\n   {}\n", index + 1, hit.title, hit.url));
        if !hit.snippet.is_empty() {
            out.push_str(&format!("   {}\n", hit.snippet));
        }
    }
    out.trim_end().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(body: &str) -> Response {
        Response {
            status: 200,
            headers: vec![],
            body: body.as_bytes().to_vec(),
            truncated: false,
            final_url: DEFAULT_ENDPOINT.to_string(),
        }
    }

    #[test]
    fn the_query_is_encoded() {
        let endpoint = Url::parse(DEFAULT_ENDPOINT).unwrap();
        assert_eq!(
            request_url(&endpoint, "rust & wasm?", 3).as_str(),
            "https://api.search.brave.com/res/v1/web/search?q=rust+%26+wasm%3F&count=3"
        );
    }

    #[test]
    fn brave_results_are_listed() {
        let body = r#"{"type":"search","web":{"results":[
            {"title":"The <strong>Rust</strong> Book","url":"https://doc.rust-lang.org/book/","description":"Learn <strong>Rust</strong> &amp; more"},
            {"title":"","url":"https://example.com/","description":""},
            {"title":"no url"}
        ]}}"#;
        let hits = parse_response(&ok(body)).unwrap();
        assert_eq!(hits.len(), 2);
        assert_eq!(
            format_hits("rust", &hits, 5),
            "Results for \"rust\" (2):\n\n1. The Rust Book\n   https://doc.rust-lang.org/book/\n   Learn Rust & more\n\n2. https://example.com/\n   https://example.com/"
        );
        assert_eq!(format_hits("x", &[], 5), "No results for \"x\".");
        assert!(parse_response(&ok(r#"{"query":{}}"#)).unwrap().is_empty());
    }

    #[test]
    fn api_errors_are_explained() {
        let mut refused = ok("{}");
        refused.status = 401;
        assert!(
            matches!(parse_response(&refused), Err(ToolError::Failed(m)) if m.contains("BRAVE_API_KEY"))
        );
        assert!(
            matches!(parse_response(&ok("<html>")), Err(ToolError::Failed(m)) if m.contains("not JSON"))
        );
    }
}
