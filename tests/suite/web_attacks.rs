//! Attacks on the network policy through the real web component: hosts off the list, loopback
//! in every spelling, the cloud metadata address, names that resolve inside, redirects that lead
//! inside, DNS rebinding, a body that never ends, a server that never answers, URLs that are not
//! web URLs, a secret chased across a redirect, and a host that echoes the secret it was sent back
//! in its body, a header or a redirect (scrubbed for both the `http` import and `wasi:http`). Every
//! refusal must happen before a connection and must name the configuration key that would allow
//! the request. All servers are on loopback; refused addresses are never connected to.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use clawcage_agent::ToolRegistry;
use clawcage_sandbox::components::{bundled, fixtures};
use clawcage_sandbox::network::{AllowList, NetworkLimits, NetworkPolicy, Secret, SecretValue};
use clawcage_sandbox::{ComponentCode, Grants};
use clawcage_tests::web::{Reply, TestResolver, WebServer, echo_server};
use clawcage_tests::{fixture, registry_of};
use serde_json::json;

use crate::web::web_registry;

async fn registry_with(policy: NetworkPolicy) -> ToolRegistry {
    registry_of(
        &[("web", bundled::WEB)],
        Grants::none().with_network(policy),
    )
    .await
}

async fn fetch_error(registry: &ToolRegistry, url: &str) -> clawcage_core::ToolError {
    registry
        .execute_value("web_fetch", &json!({"url": url}))
        .await
        .expect_err(url)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_not_on_the_list_is_refused_before_any_connection() {
    let server = WebServer::start(|_| Reply::html("<p>secret</p>"));
    let resolver = TestResolver::new().map("other.test", &["127.0.0.1"]);
    let registry = web_registry(&["allowed.test:*".to_string()], Some(resolver.clone())).await;
    let url = format!("http://other.test:{}/", server.port());
    let error = fetch_error(&registry, &url).await;
    assert_eq!(error.kind(), "denied", "{error}");
    assert!(
        error.message().contains(&format!(
            "add \"http://other.test:{}\" to [network] allow in clawcage.toml",
            server.port()
        )),
        "{error}"
    );
    assert_eq!(resolver.total_lookups(), 0, "refused before resolving");
    assert_eq!(server.connections(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_allow_list_refuses_everything_with_the_hint() {
    let server = WebServer::start(|_| Reply::html("<p>x</p>"));
    let registry = web_registry(&[], None).await;
    let error = fetch_error(&registry, &server.url("/")).await;
    assert_eq!(error.kind(), "denied");
    assert!(error.message().contains("no host is allowed"), "{error}");
    assert!(
        error
            .message()
            .contains(&format!("add \"127.0.0.1:{}\"", server.port())),
        "{error}"
    );
    assert_eq!(server.connections(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loopback_in_every_spelling_is_refused() {
    let server = WebServer::start(|_| Reply::html("<p>internal admin page</p>"));
    let port = server.port();
    // Everything under .test is allowed, and one other loopback port: none of these is.
    let registry = web_registry(&["*.test:*".to_string(), "127.0.0.1:1".to_string()], None).await;
    for (url, shown) in [
        (
            format!("http://127.0.0.1:{port}/"),
            "127.0.0.1 (a loopback address",
        ),
        (
            format!("http://0x7f000001:{port}/"),
            "127.0.0.1 (a loopback address",
        ),
        (
            format!("http://2130706433:{port}/"),
            "127.0.0.1 (a loopback address",
        ),
        (
            format!("http://0177.0.0.1:{port}/"),
            "127.0.0.1 (a loopback address",
        ),
        (
            format!("http://127.1:{port}/"),
            "127.0.0.1 (a loopback address",
        ),
        (
            format!("http://[::ffff:127.0.0.1]:{port}/"),
            "127.0.0.1 (a loopback address",
        ),
        (
            format!("http://[::ffff:7f00:1]:{port}/"),
            "127.0.0.1 (a loopback address",
        ),
        (format!("http://[::1]:{port}/"), "[::1] (a loopback address"),
        (format!("http://localhost:{port}/"), "localhost"),
        (format!("http://LOCALHOST.:{port}/"), "localhost"),
    ] {
        let error = fetch_error(&registry, &url).await;
        assert_eq!(error.kind(), "denied", "{url}: {error}");
        assert!(error.message().contains(shown), "{url}: {error}");
        assert!(
            error.message().contains("[network] allow in clawcage.toml"),
            "{url}: {error}"
        );
    }
    assert_eq!(
        server.connections(),
        0,
        "nothing reached the loopback server"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cloud_metadata_address_is_refused() {
    let resolver = TestResolver::new().map("metadata.test", &["169.254.169.254"]);
    let registry = web_registry(&["*.test:*".to_string()], Some(resolver)).await;
    let error = fetch_error(&registry, "http://169.254.169.254/latest/meta-data/").await;
    assert_eq!(error.kind(), "denied", "{error}");
    assert!(
        error
            .message()
            .contains("169.254.169.254 (a link-local address"),
        "{error}"
    );
    // Plain http to a non-loopback address also needs an http:// entry.
    assert!(
        error.message().contains("add \"http://169.254.169.254\""),
        "{error}"
    );

    let error = fetch_error(&registry, "http://metadata.test/latest/meta-data/").await;
    assert_eq!(error.kind(), "denied", "{error}");
    assert!(
        error
            .message()
            .contains("metadata.test resolves to 169.254.169.254, a link-local address"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_that_resolve_to_internal_addresses_are_refused() {
    let server = WebServer::start(|_| Reply::html("<p>internal</p>"));
    let port = server.port();
    let resolver = TestResolver::new()
        .map("loop.test", &["127.0.0.1"])
        .map("six.test", &["::1"])
        .map("mapped.test", &["::ffff:127.0.0.1"])
        .map("compat.test", &["::127.0.0.1"])
        .map("private.test", &["10.0.0.7"])
        .map("cgnat.test", &["100.64.0.1"])
        .map("ula.test", &["fd00::1"])
        .map("zero.test", &["0.0.0.0"])
        .map("mixed.test", &["127.0.0.1", "::1"]);
    let registry = web_registry(&["*.test:*".to_string()], Some(resolver.clone())).await;
    for (name, range) in [
        ("loop.test", "loopback"),
        ("six.test", "loopback"),
        ("mapped.test", "loopback"),
        ("compat.test", "loopback"),
        ("private.test", "private-network"),
        ("cgnat.test", "carrier-grade NAT"),
        ("ula.test", "private-network"),
        ("zero.test", "unspecified"),
        ("mixed.test", "loopback"),
    ] {
        let url = format!("http://{name}:{port}/");
        let error = fetch_error(&registry, &url).await;
        assert_eq!(error.kind(), "denied", "{url}: {error}");
        assert!(
            error.message().contains(&format!("{name} resolves to")),
            "{error}"
        );
        assert!(error.message().contains(range), "{url}: {error}");
        assert!(
            error
                .message()
                .contains(&format!("add \"{name}:{port}\" or ")),
            "{url}: {error}"
        );
        assert_eq!(resolver.lookups_of(name), 1, "{name}");
    }
    assert_eq!(server.connections(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redirects_to_refused_destinations_are_refused() {
    let inside = WebServer::start(|_| Reply::html("<p>internal secret</p>"));
    let inside_port = inside.port();
    let outside = WebServer::start(move |request| match request.path.as_str() {
        "/to-inside" => Reply::Redirect(302, format!("http://127.0.0.1:{inside_port}/secret")),
        "/to-localhost" => Reply::Redirect(301, format!("http://localhost:{inside_port}/")),
        "/to-name" => Reply::Redirect(307, format!("http://loop.test:{inside_port}/")),
        "/to-metadata" => Reply::Redirect(302, "http://169.254.169.254/latest/meta-data/".into()),
        "/to-file" => Reply::Redirect(302, "file:///etc/passwd".into()),
        "/loop" => Reply::Redirect(302, "/loop".into()),
        _ => Reply::html("<p>fine</p>"),
    });
    let resolver = TestResolver::new().map("loop.test", &["127.0.0.1"]);
    let registry = web_registry(
        &[
            format!("127.0.0.1:{}", outside.port()),
            "*.test:*".to_string(),
        ],
        Some(resolver),
    )
    .await;
    for (path, needle) in [
        ("/to-inside", "127.0.0.1 (a loopback address"),
        ("/to-localhost", "requests to localhost"),
        ("/to-name", "loop.test resolves to 127.0.0.1"),
        ("/to-metadata", "169.254.169.254 (a link-local address"),
        (
            "/to-file",
            "only http:// and https:// redirects are followed",
        ),
        ("/loop", "redirected more than 5 times"),
    ] {
        let error = fetch_error(&registry, &outside.url(path)).await;
        assert_eq!(error.kind(), "denied", "{path}: {error}");
        assert!(error.message().contains(needle), "{path}: {error}");
        if path != "/to-file" && path != "/loop" {
            assert!(
                error.message().starts_with("after a redirect from"),
                "{error}"
            );
            assert!(
                error.message().contains("[network] allow in clawcage.toml"),
                "{error}"
            );
        }
    }
    assert_eq!(
        inside.connections(),
        0,
        "no redirect reached the inside server"
    );
    let loops = outside
        .requests()
        .iter()
        .filter(|r| r.path == "/loop")
        .count();
    assert_eq!(loops, 6, "the first request and five redirects, then stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_is_not_forwarded_when_a_redirect_leaves_its_host() {
    let secret = "sk-redirect-5e6f7a8b";
    let elsewhere = WebServer::start(|_| {
        Reply::json(
            r#"{"web":{"results":[{"title":"T","url":"https://x.test/","description":"d"}]}}"#,
        )
    });
    let target = elsewhere.url("/search");
    let search = WebServer::start(move |_| Reply::Redirect(307, target.clone()));
    let search_host = format!("127.0.0.1:{}", search.port());
    let policy = NetworkPolicy::new(
        AllowList::parse([
            search_host.clone(),
            format!("127.0.0.1:{}", elsewhere.port()),
        ])
        .unwrap(),
    )
    .with_secrets(vec![
        Secret::new(
            &search_host,
            "X-Subscription-Token",
            SecretValue::new(secret),
            "KEY",
        )
        .unwrap(),
    ]);
    let grants = Grants::none()
        .with_network(policy)
        .with_setting(
            "CLAWCAGE_SEARCH_ENDPOINT",
            &search.url("/res/v1/web/search"),
        )
        .unwrap();
    let registry = registry_of(&[("web", bundled::WEB)], grants).await;
    let output = registry
        .execute_value("web_search", &json!({"query": "q"}))
        .await
        .unwrap()
        .text;
    assert!(output.contains("1. T"), "{output}");
    assert_eq!(
        search.requests()[0].header("x-subscription-token"),
        Some(secret)
    );
    let forwarded = &elsewhere.requests()[0];
    assert_eq!(
        forwarded.header("x-subscription-token"),
        None,
        "{forwarded:?}"
    );
    assert!(
        forwarded
            .headers
            .iter()
            .all(|(_, value)| !value.contains(secret))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dns_rebinding_cannot_switch_the_checked_address() {
    // Two servers on one port: the checked address (127.0.0.1, allowed by address) and another
    // loopback address (127.0.0.2, not allowed). The resolver answers 127.0.0.1 first and
    // 127.0.0.2 afterwards, as a rebinding attacker's DNS would.
    let (good, evil) = (0..20)
        .find_map(|_| {
            let good = WebServer::start(|_| Reply::html("<p>checked server</p>"));
            let evil_addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)), good.port());
            WebServer::start_on(evil_addr, |_| Reply::html("<p>rebound server</p>"))
                .ok()
                .map(|evil| (good, evil))
        })
        .expect("a port free on both 127.0.0.1 and 127.0.0.2");
    let port = good.port();
    let resolver =
        TestResolver::new().map_sequence("rebind.test", &[&["127.0.0.1"], &["127.0.0.2"]]);
    let registry = web_registry(
        &["*.test:*".to_string(), format!("127.0.0.1:{port}")],
        Some(resolver.clone()),
    )
    .await;
    let url = format!("http://rebind.test:{port}/");
    let output = registry
        .execute_value("web_fetch", &json!({"url": url}))
        .await
        .unwrap()
        .text;
    assert!(output.ends_with("checked server"), "{output}");
    assert_eq!(
        resolver.lookups_of("rebind.test"),
        1,
        "exactly one lookup per request"
    );
    assert_eq!(evil.connections(), 0);
    assert_eq!(good.connections(), 1);

    // The next request gets the rebound answer, which is checked and refused.
    let error = fetch_error(&registry, &url).await;
    assert_eq!(error.kind(), "denied", "{error}");
    assert!(
        error
            .message()
            .contains("rebind.test resolves to 127.0.0.2"),
        "{error}"
    );
    assert_eq!(resolver.lookups_of("rebind.test"), 2);
    assert_eq!(
        evil.connections(),
        0,
        "the rebound address was never connected to"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_50_mb_body_is_capped_while_streaming() {
    const FIFTY_MB: u64 = 50 << 20;
    let server = WebServer::start(|_| Reply::Endless(FIFTY_MB));
    let policy =
        NetworkPolicy::new(AllowList::parse([format!("127.0.0.1:{}", server.port())]).unwrap())
            .with_limits(NetworkLimits {
                max_response_bytes: 1 << 20,
                ..NetworkLimits::default()
            });
    let registry = registry_with(policy).await;
    let output = registry
        .execute_value(
            "web_fetch",
            &json!({"url": server.url("/big"), "max_chars": 500}),
        )
        .await
        .unwrap()
        .text;
    assert!(
        output.contains("Note: the page is larger than the host's download limit; only its first 1048576 bytes were read."),
        "{}",
        &output[..output.len().min(600)]
    );
    assert!(
        output.contains("showing 500 of 1048576 characters"),
        "{}",
        &output[..600]
    );
    // The host stopped reading at the cap and dropped the connection; what the server pushed
    // beyond it is only what the socket buffers took. Give it a moment to notice the close.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let sent = server.body_bytes_sent();
    assert!(
        sent < FIFTY_MB / 2,
        "the server sent {sent} bytes: the body was not cut off"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_never_answers_times_out() {
    let server = WebServer::start(|_| Reply::Hang);
    let policy =
        NetworkPolicy::new(AllowList::parse([format!("127.0.0.1:{}", server.port())]).unwrap())
            .with_limits(NetworkLimits {
                total_timeout: Duration::from_secs(1),
                ..NetworkLimits::default()
            });
    let registry = registry_with(policy).await;
    let started = Instant::now();
    let error = fetch_error(&registry, &server.url("/slow")).await;
    assert_eq!(error.kind(), "failed", "{error}");
    assert!(
        error
            .message()
            .contains("did not answer within 1 s ([network] timeout_secs)"),
        "{error}"
    );
    // Generous bound: only checks that the request was stopped rather than left waiting.
    assert!(started.elapsed() < Duration::from_secs(20));
    assert_eq!(server.requests().len(), 1, "the request did arrive");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_urls_and_other_schemes_are_invalid_arguments() {
    let server = WebServer::start(|_| Reply::html("<p>x</p>"));
    let registry = web_registry(&[format!("127.0.0.1:{}", server.port())], None).await;
    for url in [
        "http://exa mple.com/",
        "http://[::1",
        "http://",
        "not a url at all",
        "file:///etc/passwd",
        "FILE:///etc/shadow",
        "ftp://example.com/file",
        "javascript:alert(1)",
        "data:text/html,<p>x</p>",
        "",
    ] {
        let error = fetch_error(&registry, url).await;
        assert_eq!(error.kind(), "invalid_args", "{url:?}: {error}");
    }
    assert_eq!(server.connections(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn narrowing_a_grant_narrows_the_network() {
    let server = WebServer::start(|_| Reply::html("<p>reachable</p>"));
    let host = format!("127.0.0.1:{}", server.port());
    let parent = Grants::none().with_network(NetworkPolicy::new(
        AllowList::parse([host.clone(), "example.com".to_string()]).unwrap(),
    ));
    let loaded = clawcage_tests::sandbox()
        .load("web", "test", bundled::WEB, parent)
        .await
        .unwrap();
    let fetch = loaded
        .tools()
        .iter()
        .find(|tool| clawcage_core::Tool::spec(*tool).name == "web_fetch")
        .unwrap();
    let args = json!({"url": server.url("/")}).to_string();
    fetch.call_json(&args).await.unwrap();

    // A child allowed only example.com cannot reach what its parent could.
    let child = Grants::none().with_network(NetworkPolicy::new(
        AllowList::parse(["example.com"]).unwrap(),
    ));
    let narrowed_grants = fetch.grants().narrowed_by(&child);
    assert!(
        narrowed_grants
            .describe()
            .contains("and within example.com")
    );
    let narrowed = clawcage_tests::sandbox()
        .load("web", "test", bundled::WEB, narrowed_grants)
        .await
        .unwrap();
    let narrowed_fetch = narrowed
        .tools()
        .iter()
        .find(|tool| clawcage_core::Tool::spec(*tool).name == "web_fetch")
        .unwrap();
    let error = narrowed_fetch.call_json(&args).await.unwrap_err();
    assert_eq!(error.kind(), "denied", "{error}");
    assert!(
        error
            .message()
            .contains("not on the network allow-list (example.com)"),
        "{error}"
    );

    // Narrowed by grants without network, the component does not load at all: the import it
    // needs is not granted.
    let error = clawcage_tests::sandbox()
        .load(
            "web",
            "test",
            bundled::WEB,
            fetch.grants().narrowed_by(&Grants::none()),
        )
        .await
        .unwrap_err();
    assert!(error.to_string().contains("network grant"), "{error}");
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_echoing_its_secret_back_shows_only_a_redaction() {
    let secret = "sk-echo-4f9a2b7c9d1e";
    let server = echo_server("x-subscription-token");
    let host = format!("127.0.0.1:{}", server.port());
    let policy = NetworkPolicy::new(AllowList::parse([host.clone()]).unwrap()).with_secrets(vec![
        Secret::new(
            &host,
            "X-Subscription-Token",
            SecretValue::new(secret),
            "TEST_ECHO_KEY",
        )
        .unwrap(),
    ]);
    let wasi_fixture = fixture(fixtures::WASI_HTTP_FETCH);
    let registry = registry_of(
        &[
            ("web", ComponentCode::from(bundled::WEB)),
            ("wasi-http-fetch", ComponentCode::from(&wasi_fixture)),
        ],
        Grants::none().with_network(policy),
    )
    .await;
    let redacted = "[redacted: TEST_ECHO_KEY]";
    // The location is scrubbed before it is followed, so the next URL carries the label.
    let landed = "landed at /landing?token=[redacted:%20TEST_ECHO_KEY]";
    for (tool, path, shown) in [
        (
            "web_fetch",
            "/headers",
            format!("\"x-subscription-token\":\"{redacted}\""),
        ),
        (
            "web_fetch",
            "/content-type",
            "Content-Type: text/x-[redacted: test_echo_key]".to_string(),
        ),
        ("web_fetch", "/redirect", landed.to_string()),
        (
            "web_fetch",
            "/split",
            format!("first part {redacted} second part"),
        ),
        (
            "wasi_http_fetch",
            "/headers",
            format!("\"x-subscription-token\":\"{redacted}\""),
        ),
        (
            "wasi_http_fetch",
            "/redirect",
            format!("HTTP 200\n{landed}"),
        ),
        (
            "wasi_http_fetch",
            "/split",
            format!("HTTP 200\nfirst part {redacted} second part"),
        ),
    ] {
        let output = registry
            .execute_value(tool, &json!({"url": server.url(path)}))
            .await
            .unwrap_or_else(|error| panic!("{tool} {path}: {error}"))
            .text;
        assert!(!output.contains(secret), "{tool} {path}: {output}");
        assert!(output.contains(&shown), "{tool} {path}: {output}");
    }
    // The secret did go out with every request: the server echoed what it was sent.
    let requests = server.requests();
    assert_eq!(requests.len(), 9);
    assert!(
        requests
            .iter()
            .all(|request| request.header("x-subscription-token") == Some(secret))
    );
}
