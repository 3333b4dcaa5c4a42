//! The web tools on their happy paths: the real web component in the real engine, fetching from
//! real HTTP servers on 127.0.0.1 through the host's network policy. HTML becomes text, JSON
//! passes through, long pages are cut with a marker, redirects between allowed pages are
//! followed, names resolve through the policy's resolver, and web_search sends the operator's
//! secret to the search host without the component, the output or the logs ever holding it.

use std::sync::Arc;

use clawcage_agent::ToolRegistry;
use clawcage_sandbox::components::bundled;
use clawcage_sandbox::network::{AllowList, NetworkPolicy, Secret, SecretValue};
use clawcage_sandbox::{Grants, Limits};
use clawcage_tests::web::{Reply, TestResolver, WebServer, capture_logs};
use clawcage_tests::{registry_of, sandbox};
use serde_json::json;

/// A registry with the web component granted `allow`, names resolved by `resolver`.
pub async fn web_registry(allow: &[String], resolver: Option<Arc<TestResolver>>) -> ToolRegistry {
    let mut policy = NetworkPolicy::new(AllowList::parse(allow).unwrap());
    if let Some(resolver) = resolver {
        policy = policy.with_resolver(resolver);
    }
    registry_of(
        &[("web", bundled::WEB)],
        Grants::none().with_network(policy),
    )
    .await
}

const PAGE: &str = r#"<!doctype html>
<html><head><title>Test page</title>
<style>body { font-family: serif }</style>
<script>document.write("tracking")</script></head>
<body>
<nav><a href="/home">Home</a></nav>
<h1>Welcome</h1>
<p>This is the <em>first</em> paragraph, with a <a href="/docs/intro">link to the intro</a>.</p>
<h2>Features</h2>
<ul><li>fast</li><li>safe</li></ul>
<script>var hidden = "never shown";</script>
</body></html>"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allowed_html_page_becomes_readable_text() {
    let server = WebServer::start(|_| Reply::html(PAGE));
    let registry = web_registry(&[format!("127.0.0.1:{}", server.port())], None).await;
    let output = registry
        .execute_value("web_fetch", &json!({"url": server.url("/page")}))
        .await
        .unwrap()
        .text;
    let base = server.url("");
    assert!(
        output.starts_with(&format!("URL: {base}/page\n")),
        "{output}"
    );
    assert!(output.contains("Title: Test page\n"), "{output}");
    assert!(
        output.contains("Content-Type: text/html, HTTP 200"),
        "{output}"
    );
    assert!(output.contains(&format!("[Home]({base}/home)")), "{output}");
    assert!(
        output.contains("# Welcome\n\nThis is the first paragraph, with a "),
        "{output}"
    );
    assert!(
        output.contains(&format!("[link to the intro]({base}/docs/intro)")),
        "{output}"
    );
    assert!(output.contains("## Features\n\n- fast\n- safe"), "{output}");
    for dropped in ["tracking", "never shown", "font-family", "<p>"] {
        assert!(!output.contains(dropped), "{dropped} leaked into: {output}");
    }
    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].method, "GET");
    assert_eq!(requests[0].path, "/page");
    assert!(requests[0].header("accept").unwrap().contains("text/html"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_and_plain_text_pass_through() {
    let json_body = r#"{"items": [1, 2, 3], "html": "<b>not rendered</b>"}"#;
    let server = WebServer::start(move |request| match request.path.as_str() {
        "/data.json" => Reply::json(json_body),
        _ => Reply::Ok(
            "text/plain; charset=utf-8",
            b"line one\n  line two\n".to_vec(),
        ),
    });
    let registry = web_registry(&[format!("127.0.0.1:{}", server.port())], None).await;
    let output = registry
        .execute_value("web_fetch", &json!({"url": server.url("/data.json")}))
        .await
        .unwrap()
        .text;
    assert!(
        output.contains("Content-Type: application/json, HTTP 200"),
        "{output}"
    );
    assert!(output.ends_with(json_body), "{output}");
    let output = registry
        .execute_value("web_fetch", &json!({"url": server.url("/notes.txt")}))
        .await
        .unwrap()
        .text;
    assert!(output.ends_with("line one\n  line two\n"), "{output:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_page_is_cut_with_a_marker_stating_the_total() {
    let paragraphs: String = (0..2000)
        .map(|i| format!("<p>Paragraph number {i:04} of the long page.</p>"))
        .collect();
    let server = WebServer::start(move |_| Reply::html(format!("<body>{paragraphs}</body>")));
    let registry = web_registry(&[format!("127.0.0.1:{}", server.port())], None).await;
    let output = registry
        .execute_value(
            "web_fetch",
            &json!({"url": server.url("/long"), "max_chars": 1000}),
        )
        .await
        .unwrap()
        .text;
    // 2000 paragraphs of 39 characters, separated by blank lines.
    let total = 2000 * 39 + 1999 * 2;
    assert!(
        output.contains(&format!(
            " of {total} characters; call web_fetch again with a larger max_chars"
        )),
        "{output}"
    );
    assert!(output.contains("Paragraph number 0000"), "{output}");
    assert!(!output.contains("Paragraph number 1999"), "{output}");
    assert!(output.len() < 1500, "{}", output.len());

    let default = registry
        .execute_value("web_fetch", &json!({"url": server.url("/long")}))
        .await
        .unwrap()
        .text;
    assert!(
        default.contains(&format!("of {total} characters")),
        "default max_chars cuts too"
    );
    assert!(
        default.len() > 20_000 && default.len() < 21_000,
        "{}",
        default.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redirects_between_allowed_pages_are_followed() {
    let server = WebServer::start(|request| match request.path.as_str() {
        "/old" => Reply::Redirect(301, "/middle".to_string()),
        "/middle" => Reply::Redirect(302, "/new?x=1".to_string()),
        _ => Reply::html("<title>New</title><p>arrived</p>"),
    });
    let registry = web_registry(&[format!("127.0.0.1:{}", server.port())], None).await;
    let output = registry
        .execute_value("web_fetch", &json!({"url": server.url("/old")}))
        .await
        .unwrap()
        .text;
    assert!(
        output.starts_with(&format!("URL: {}\n", server.url("/new?x=1"))),
        "{output}"
    );
    assert!(output.ends_with("arrived"), "{output}");
    let paths: Vec<String> = server.requests().into_iter().map(|r| r.path).collect();
    assert_eq!(paths, ["/old", "/middle", "/new?x=1"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exactly_allowed_name_resolves_through_the_policy_and_reaches_loopback() {
    let server = WebServer::start(|_| Reply::html("<p>named</p>"));
    let resolver = TestResolver::new().map("docs.test", &["127.0.0.1"]);
    let registry = web_registry(
        &[format!("docs.test:{}", server.port())],
        Some(resolver.clone()),
    )
    .await;
    let url = format!("http://docs.test:{}/x", server.port());
    let output = registry
        .execute_value("web_fetch", &json!({"url": url}))
        .await
        .unwrap()
        .text;
    assert!(output.ends_with("named"), "{output}");
    assert_eq!(resolver.lookups_of("docs.test"), 1);
    let requests = server.requests();
    assert_eq!(
        requests[0].header("host"),
        Some(format!("docs.test:{}", server.port()).as_str())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_url_without_a_scheme_is_fetched_over_https() {
    // Nothing listens for https here; the point is which URL the policy is asked about.
    let registry = web_registry(&[], None).await;
    let error = registry
        .execute_value("web_fetch", &json!({"url": "example.com/page"}))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), "denied", "{error}");
    assert!(
        error
            .message()
            .contains("add \"example.com\" to [network] allow in clawcage.toml"),
        "{error}"
    );
}

/// A search API speaking the Brave wire format.
fn search_server() -> WebServer {
    WebServer::start(|request| {
        if !request.path.starts_with("/res/v1/web/search?") {
            return Reply::Full(404, vec![], b"not found".to_vec());
        }
        let results: Vec<serde_json::Value> = (1..=12)
            .map(|i| {
                json!({
                    "title": format!("Result <strong>{i}</strong>"),
                    "url": format!("https://example.com/{i}"),
                    "description": format!("Snippet &amp; text {i}"),
                })
            })
            .collect();
        Reply::json(json!({"type": "search", "web": {"results": results}}).to_string())
    })
}

fn search_grants(server: &WebServer, secret: &str) -> Grants {
    let host = format!("127.0.0.1:{}", server.port());
    let policy = NetworkPolicy::new(AllowList::parse([&host]).unwrap()).with_secrets(vec![
        Secret::new(
            &host,
            "X-Subscription-Token",
            SecretValue::new(secret),
            "TEST_SEARCH_KEY",
        )
        .unwrap(),
    ]);
    Grants::none()
        .with_network(policy)
        .with_setting(
            "CLAWCAGE_SEARCH_ENDPOINT",
            &server.url("/res/v1/web/search"),
        )
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_search_lists_results_and_the_secret_reaches_only_the_server() {
    let logs = capture_logs();
    let secret = "sk-search-7f3a9c2e-never-in-output";
    let server = search_server();
    let registry = registry_of(&[("web", bundled::WEB)], search_grants(&server, secret)).await;

    let output = registry
        .execute_value("web_search", &json!({"query": "rust wasm & sandboxes"}))
        .await
        .unwrap()
        .text;
    assert!(
        output.starts_with("Results for \"rust wasm & sandboxes\" (5):"),
        "{output}"
    );
    assert!(
        output.contains("1. Result 1\n   https://example.com/1\n   Snippet & text 1"),
        "{output}"
    );
    assert!(output.contains("5. Result 5"), "{output}");
    assert!(!output.contains("6. Result 6"), "{output}");

    let ten = registry
        .execute_value("web_search", &json!({"query": "q", "count": 10}))
        .await
        .unwrap()
        .text;
    assert!(
        ten.contains("10. Result 10") && !ten.contains("11."),
        "{ten}"
    );

    let too_many = registry
        .execute_value("web_search", &json!({"query": "q", "count": 11}))
        .await
        .unwrap_err();
    assert_eq!(too_many.kind(), "invalid_args", "{too_many}");

    let requests = server.requests();
    assert_eq!(
        requests.len(),
        2,
        "the invalid call never reached the server"
    );
    assert_eq!(
        requests[0].path,
        "/res/v1/web/search?q=rust+wasm+%26+sandboxes&count=5"
    );
    assert_eq!(requests[1].path, "/res/v1/web/search?q=q&count=10");
    for request in &requests {
        assert_eq!(request.header("x-subscription-token"), Some(secret));
    }

    // The value is nowhere but on the wire: not in the output, not in an error, not in the logs.
    assert!(!output.contains(secret) && !ten.contains(secret));
    assert!(!too_many.to_string().contains(secret));
    let log_text = logs.text();
    assert!(
        log_text.contains(&server.url("/res/v1/web/search?q=rust+wasm")),
        "the request was logged, so the capture works"
    );
    assert!(
        !log_text.contains(secret),
        "the secret appeared in the logs"
    );
    let debug: String = registry.tools().map(|tool| format!("{tool:?}")).collect();
    assert!(!debug.contains(secret), "{debug}");
    let summary = registry
        .tools()
        .map(|tool| tool.grants_summary())
        .collect::<String>();
    assert!(
        summary.contains("x-subscription-token for 127.0.0.1"),
        "{summary}"
    );
    assert!(!summary.contains(secret));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_search_endpoint_must_be_allowed_like_any_host() {
    let server = search_server();
    // The endpoint is set, but the allow-list does not name it.
    let grants = Grants::none()
        .with_network(NetworkPolicy::new(
            AllowList::parse(["example.com"]).unwrap(),
        ))
        .with_setting(
            "CLAWCAGE_SEARCH_ENDPOINT",
            &server.url("/res/v1/web/search"),
        )
        .unwrap();
    let registry = registry_of(&[("web", bundled::WEB)], grants).await;
    let error = registry
        .execute_value("web_search", &json!({"query": "x"}))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), "denied", "{error}");
    assert!(
        error
            .message()
            .contains(&format!("add \"127.0.0.1:{}\"", server.port())),
        "{error}"
    );
    assert!(server.requests().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn components_that_import_http_do_not_load_without_a_network_grant() {
    for (name, bytes) in [
        ("web", bundled::WEB.bytes().unwrap()),
        (
            "wasi-http-fetch",
            clawcage_tests::fixture(clawcage_sandbox::components::fixtures::WASI_HTTP_FETCH),
        ),
    ] {
        let error = sandbox()
            .load(
                name,
                "test",
                &bytes,
                Grants::none().with_limits(Limits::default()),
            )
            .await
            .unwrap_err()
            .to_string();
        assert!(
            error.contains(&format!("component `{name}` imports `")),
            "{error}"
        );
        assert!(
            error.contains("clawcage:tool/http@0.1.0") || error.contains("wasi:http/"),
            "{error}"
        );
        assert!(
            error.contains("[network] allow in clawcage.toml"),
            "{error}"
        );
    }
    // The file component imports no HTTP and loads without a network grant.
    sandbox()
        .load("file", "test", bundled::FILE, Grants::none())
        .await
        .unwrap();
}
