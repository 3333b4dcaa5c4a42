//! Standard `wasi:http` goes through the same policy as the `http` import: a fixture component
//! with a plain wasi:http client and the web component, under one grant, get the same verdict for
//! the same request — allowed, denied, invalid or failed — and the same server sees the same
//! (absent) traffic; and both count the body cap in bytes on the wire while scrubbing the
//! policy's secrets from what they hand on.

use std::time::Duration;

use clawcage_agent::ToolRegistry;
use clawcage_sandbox::components::{bundled, fixtures};
use clawcage_sandbox::network::{AllowList, NetworkLimits, NetworkPolicy, Secret, SecretValue};
use clawcage_sandbox::{ComponentCode, Grants};
use clawcage_tests::web::{Reply, TestResolver, WebServer, capture_logs, echo_server};
use clawcage_tests::{fixture, registry_of};
use serde_json::json;

/// The verdict of a call: `ok` or the error kind.
async fn verdict(registry: &ToolRegistry, tool: &str, url: &str) -> (String, String) {
    match registry.execute_value(tool, &json!({"url": url})).await {
        Ok(output) => ("ok".to_string(), output.text),
        Err(error) => (error.kind().to_string(), error.message().to_string()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wasi_http_gets_the_same_verdicts_as_the_http_import() {
    let logs = capture_logs();
    let inside = WebServer::start(|_| Reply::html("<p>inside</p>"));
    let inside_port = inside.port();
    let server = WebServer::start(move |request| match request.path.as_str() {
        "/page" => Reply::Ok("text/plain", b"hello from the allowed server".to_vec()),
        "/hop" => Reply::Redirect(302, "/page".to_string()),
        "/to-inside" => Reply::Redirect(302, format!("http://127.0.0.1:{inside_port}/")),
        "/to-name" => Reply::Redirect(302, format!("http://loop.test:{inside_port}/")),
        "/big" => Reply::Endless(50 << 20),
        "/hang" => Reply::Hang,
        _ => Reply::Full(404, vec![], b"missing".to_vec()),
    });
    let port = server.port();
    let resolver = TestResolver::new()
        .map("loop.test", &["127.0.0.1"])
        .map("site.test", &["127.0.0.1"]);
    let policy = NetworkPolicy::new(
        AllowList::parse([format!("127.0.0.1:{port}"), "*.test:*".to_string()]).unwrap(),
    )
    .with_resolver(resolver)
    .with_limits(NetworkLimits {
        total_timeout: Duration::from_secs(2),
        max_response_bytes: 1 << 20,
        ..NetworkLimits::default()
    });
    let wasi_fixture = fixture(fixtures::WASI_HTTP_FETCH);
    let registry = registry_of(
        &[
            ("web", ComponentCode::from(bundled::WEB)),
            ("wasi-http-fetch", ComponentCode::from(&wasi_fixture)),
        ],
        Grants::none().with_network(policy),
    )
    .await;

    let base = format!("http://127.0.0.1:{port}");
    for (url, expected) in [
        (format!("{base}/page"), "ok"),
        (format!("{base}/hop"), "ok"),
        (format!("http://elsewhere.example:{port}/"), "denied"),
        (format!("http://127.0.0.1:{inside_port}/"), "denied"),
        (format!("http://[::1]:{port}/"), "denied"),
        (format!("http://2130706433:{inside_port}/"), "denied"),
        (format!("http://loop.test:{inside_port}/"), "denied"),
        (
            "http://169.254.169.254/latest/meta-data/".to_string(),
            "denied",
        ),
        (format!("{base}/to-inside"), "denied"),
        (format!("{base}/to-name"), "denied"),
        ("file:///etc/passwd".to_string(), "invalid_args"),
        ("ftp://example.com/x".to_string(), "invalid_args"),
        ("http://exa mple.com/".to_string(), "invalid_args"),
        (format!("{base}/hang"), "failed"),
    ] {
        let (import_kind, import_text) = verdict(&registry, "web_fetch", &url).await;
        let (wasi_kind, wasi_text) = verdict(&registry, "wasi_http_fetch", &url).await;
        assert_eq!(import_kind, expected, "http import, {url}: {import_text}");
        assert_eq!(wasi_kind, expected, "wasi:http, {url}: {wasi_text}");
        if expected == "ok" {
            assert!(
                import_text.contains("hello from the allowed server"),
                "{import_text}"
            );
            assert_eq!(wasi_text, "HTTP 200\nhello from the allowed server");
        }
    }
    assert_eq!(
        inside.connections(),
        0,
        "neither client reached the inside server"
    );

    // The body cap holds for both: the import cuts the body and says so, wasi:http ends the
    // stream with the standard body-size error. Neither lets the server push 50 MB.
    let (kind, text) = verdict(&registry, "web_fetch", &format!("{base}/big")).await;
    assert_eq!(kind, "ok");
    assert!(
        text.contains("only its first 1048576 bytes were read"),
        "{}",
        &text[..300]
    );
    let (kind, text) = verdict(&registry, "wasi_http_fetch", &format!("{base}/big")).await;
    assert_eq!(kind, "failed", "{}", &text[..text.len().min(300)]);
    assert!(
        text.contains("HTTP response body size exceeds limit: 1048576 bytes"),
        "{text}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        server.body_bytes_sent() < 50 << 20,
        "{}",
        server.body_bytes_sent()
    );

    // The guest only gets an error code; the operator's log has the full refusal with the hint.
    let log_text = logs.text();
    assert!(
        log_text.contains("wasi:http request refused: requests to elsewhere.example"),
        "missing refusal in the log"
    );
    assert!(log_text.contains("[network] allow in clawcage.toml"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wasi_http_sets_no_host_header_of_its_own_and_pins_the_address() {
    let server = WebServer::start(|_| Reply::Ok("text/plain", b"pinned".to_vec()));
    let resolver = TestResolver::new().map("site.test", &["127.0.0.1"]);
    let port = server.port();
    let policy = NetworkPolicy::new(AllowList::parse([format!("site.test:{port}")]).unwrap())
        .with_resolver(resolver.clone());
    let wasi_fixture = fixture(fixtures::WASI_HTTP_FETCH);
    let registry = registry_of(
        &[("wasi-http-fetch", &wasi_fixture)],
        Grants::none().with_network(policy),
    )
    .await;
    let (kind, text) = verdict(
        &registry,
        "wasi_http_fetch",
        &format!("http://site.test:{port}/x"),
    )
    .await;
    assert_eq!((kind.as_str(), text.as_str()), ("ok", "HTTP 200\npinned"));
    assert_eq!(resolver.lookups_of("site.test"), 1);
    let request = &server.requests()[0];
    assert_eq!(
        request.header("host"),
        Some(format!("site.test:{port}").as_str())
    );
    assert_eq!(
        request
            .headers
            .iter()
            .filter(|(name, _)| name == "host")
            .count(),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_body_cap_counts_wire_bytes_while_secrets_are_scrubbed() {
    let secret = "sk-capped-8e7d6c5b4a";
    let server = echo_server("x-api-key");
    let host = format!("127.0.0.1:{}", server.port());
    let policy = NetworkPolicy::new(AllowList::parse([host.clone()]).unwrap())
        .with_secrets(vec![
            Secret::new(&host, "X-Api-Key", SecretValue::new(secret), "TEST_CAP_KEY").unwrap(),
        ])
        .with_limits(NetworkLimits {
            max_response_bytes: 1024,
            ..NetworkLimits::default()
        });
    let wasi_fixture = fixture(fixtures::WASI_HTTP_FETCH);
    let registry = registry_of(
        &[
            ("web", ComponentCode::from(bundled::WEB)),
            ("wasi-http-fetch", ComponentCode::from(&wasi_fixture)),
        ],
        Grants::none().with_network(policy),
    )
    .await;
    let redacted = "[redacted: TEST_CAP_KEY]";

    // Exactly the cap on the wire; longer once scrubbed. Neither client sees a cut body.
    let exact = server.url("/pad?before=500&total=1024");
    let (kind, text) = verdict(&registry, "wasi_http_fetch", &exact).await;
    assert_eq!(kind, "ok", "{text}");
    let body = text.strip_prefix("HTTP 200\n").unwrap_or_default();
    assert_eq!(body.len(), 1024 - secret.len() + redacted.len(), "{text}");
    assert_eq!(&body[500..500 + redacted.len()], redacted);
    let (kind, text) = verdict(&registry, "web_fetch", &exact).await;
    assert_eq!(kind, "ok", "{text}");
    assert!(text.contains(redacted) && !text.contains(secret), "{text}");
    assert!(!text.contains("download limit"), "{text}");

    // The cap falls inside the secret: the import's cut body ends with the label, not with the
    // secret's first half; wasi:http ends the stream with the body-size error.
    let cut = server.url("/pad?before=1014&total=4096");
    let (kind, text) = verdict(&registry, "web_fetch", &cut).await;
    assert_eq!(kind, "ok", "{text}");
    assert!(text.contains("only its first"), "{text}");
    assert!(text.ends_with(redacted), "{text}");
    assert!(!text.contains(&secret[..6]), "{text}");
    let (kind, text) = verdict(&registry, "wasi_http_fetch", &cut).await;
    assert_eq!(kind, "failed", "{text}");
    assert!(
        text.contains("HTTP response body size exceeds limit: 1024 bytes"),
        "{text}"
    );
    assert!(!text.contains(&secret[..6]), "{text}");
}
