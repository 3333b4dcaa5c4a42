//! The web tools of clawcage as one WebAssembly component: `web_fetch` reads a
//! page and turns it into text (HTML through a real HTML5 parser, JSON and
//! plain text passed through), and `web_search` asks a search API (Brave
//! Search by default). The component has no sockets: every request goes
//! through the host's `http` import, where the operator's allow-list, the
//! address checks, the body cap and any API keys are applied. The component
//! never sees a key; it learns only the search endpoint, a non-secret
//! setting (`CLAWCAGE_SEARCH_ENDPOINT`).

use clawcage_tool_sdk::{Spec, ToolError, Tools, Value, args, json};

mod fetch;
mod html;
mod search;
mod text;

/// Default characters of page text returned by `web_fetch`.
const DEFAULT_MAX_CHARS: u64 = 20_000;
/// Upper bound of `max_chars`.
const MAX_MAX_CHARS: u64 = 100_000;
/// Default number of search results.
const DEFAULT_COUNT: u64 = 5;
/// Upper bound of `count`.
const MAX_COUNT: u64 = 10;

/// The component's tools.
struct WebTools;

impl Tools for WebTools {
    fn specs() -> Vec<Spec> {
        vec![
            Spec::new(
                "web_fetch",
                format!(
                    "Fetch a web page or API URL and return its content as text. HTML is turned into readable \
                     text (headings as #, lists as -, links as [text](url); scripts and styles dropped); JSON and \
                     plain text are returned as they are. Output starts with the final URL (after redirects), \
                     the title and the content type, and is cut at max_chars (default {DEFAULT_MAX_CHARS}) with a \
                     note stating the full length. Only hosts the operator allowed can be reached; a refusal says \
                     which configuration entry would allow the host. A URL without a scheme is fetched over https."
                ),
                json!({
                    "type": "object",
                    "properties": {
                        "url": {
                            "type": "string",
                            "description": "The http:// or https:// URL to fetch, e.g. \"https://example.com/docs\"."
                        },
                        "max_chars": {
                            "type": "integer",
                            "minimum": 100,
                            "maximum": MAX_MAX_CHARS,
                            "default": DEFAULT_MAX_CHARS,
                            "description": "Characters of content to return; longer content is cut with a note."
                        }
                    },
                    "required": ["url"],
                    "additionalProperties": false
                }),
            ),
            Spec::new(
                "web_search",
                format!(
                    "Search the web and return the top results, each with title, URL and snippet. Use it to \
                     find pages, then web_fetch to read one. count is the number of results (default \
                     {DEFAULT_COUNT}, at most {MAX_COUNT})."
                ),
                json!({
                    "type": "object",
                    "properties": {
                        "query": {
                            "type": "string",
                            "minLength": 1,
                            "description": "What to search for."
                        },
                        "count": {
                            "type": "integer",
                            "minimum": 1,
                            "maximum": MAX_COUNT,
                            "default": DEFAULT_COUNT,
                            "description": "Number of results."
                        }
                    },
                    "required": ["query"],
                    "additionalProperties": false
                }),
            ),
        ]
    }

    fn call(name: &str, args: Value) -> Result<String, ToolError> {
        match name {
            "web_fetch" => {
                let url = args::required_str(&args, "url")?;
                let max_chars =
                    args::optional_u64(&args, "max_chars")?.unwrap_or(DEFAULT_MAX_CHARS);
                if !(100..=MAX_MAX_CHARS).contains(&max_chars) {
                    return Err(ToolError::InvalidArgs(format!(
                        "argument 'max_chars' must be between 100 and {MAX_MAX_CHARS}, got {max_chars}"
                    )));
                }
                fetch::web_fetch(url, max_chars as usize)
            }
            "web_search" => {
                let query = args::required_str(&args, "query")?;
                let count = args::optional_u64(&args, "count")?.unwrap_or(DEFAULT_COUNT);
                if !(1..=MAX_COUNT).contains(&count) {
                    return Err(ToolError::InvalidArgs(format!(
                        "argument 'count' must be between 1 and {MAX_COUNT}, got {count}"
                    )));
                }
                search::web_search(query, count)
            }
            _ => Err(ToolError::unknown_tool(name)),
        }
    }
}

clawcage_tool_sdk::export_tools!(WebTools);
