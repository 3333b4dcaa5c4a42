//! Benchmark of `web_fetch` against a direct reqwest GET of the same 100 KB HTML page from a
//! local server, measured in the same run and interleaved so that machine noise hits both alike.
//! A third line isolates the host's policy path (allow-list, resolution, pinned connection, body
//! cap) without the component, and a fourth fetches an 11-byte page through `web_fetch` (the
//! fixed cost of a call), so the overhead splits into policy, fixed cost and HTML conversion.
//!
//! Run: `cargo bench --workspace --bench web`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark fails by panicking"
)]

use clawcage_tests::bench::report;
use std::time::Instant;

use clawcage_sandbox::Grants;
use clawcage_sandbox::components::bundled;
use clawcage_sandbox::network::{AllowList, NetworkPolicy, OutboundRequest};
use clawcage_tests::registry_of;
use clawcage_tests::web::{Reply, WebServer};

const CALLS: usize = 300;

/// About 100 KB of ordinary article HTML: headings, paragraphs with links, lists, a script.
fn page() -> String {
    let mut html = String::from(
        "<!doctype html><html><head><title>Benchmark article</title><style>p{margin:0}</style>\
         <script>window.analytics = {}</script></head><body>",
    );
    let mut section = 0;
    while html.len() < 100 * 1024 {
        section += 1;
        html.push_str(&format!("<h2>Section {section}</h2>"));
        for paragraph in 0..6 {
            html.push_str(&format!(
                "<p>Paragraph {paragraph} of section {section} explains a detail of the system in \
                 plain words, with a <a href=\"/docs/{section}/{paragraph}\">reference link</a> and \
                 some <em>emphasis</em> to make the markup realistic.</p>"
            ));
        }
        html.push_str("<ul><li>first point</li><li>second point</li><li>third point</li></ul>");
    }
    html.push_str("</body></html>");
    html
}

fn main() {
    let runtime = clawcage_tests::bench::runtime();
    runtime.block_on(async {
        let body = page();
        let size = body.len();
        let server = WebServer::start(move |request| {
            if request.path == "/tiny" {
                Reply::html("<p>tiny</p>")
            } else {
                Reply::html(body.clone())
            }
        });
        let url = server.url("/article");
        let tiny_args = serde_json::json!({"url": server.url("/tiny")});
        let allow = AllowList::parse([format!("127.0.0.1:{}", server.port())]).unwrap();
        let policy = NetworkPolicy::new(allow);
        let registry = registry_of(
            &[("web", bundled::WEB)],
            Grants::none().with_network(policy.clone()),
        )
        .await;
        let args = serde_json::json!({"url": url, "max_chars": 100_000});
        let direct = reqwest::Client::builder().no_proxy().build().unwrap();

        println!("== web_fetch vs a direct reqwest GET ({size} bytes of HTML, {CALLS} calls each)");
        for _ in 0..20 {
            registry.execute_value("web_fetch", &args).await.unwrap();
            direct
                .get(&url)
                .send()
                .await
                .unwrap()
                .bytes()
                .await
                .unwrap();
        }
        let mut reqwest_samples = Vec::with_capacity(CALLS);
        let mut policy_samples = Vec::with_capacity(CALLS);
        let mut fetch_samples = Vec::with_capacity(CALLS);
        let mut tiny_samples = Vec::with_capacity(CALLS);
        let mut text_chars = 0;
        for _ in 0..CALLS {
            let started = Instant::now();
            let bytes = direct
                .get(&url)
                .send()
                .await
                .unwrap()
                .bytes()
                .await
                .unwrap();
            std::hint::black_box(bytes);
            reqwest_samples.push(started.elapsed());

            let started = Instant::now();
            let response = policy
                .send(OutboundRequest::get(url.clone()))
                .await
                .unwrap();
            std::hint::black_box(response);
            policy_samples.push(started.elapsed());

            let started = Instant::now();
            let output = registry.execute_value("web_fetch", &args).await.unwrap();
            fetch_samples.push(started.elapsed());
            text_chars = output.text.chars().count();

            let started = Instant::now();
            std::hint::black_box(registry.execute_value("web_fetch", &tiny_args).await.unwrap());
            tiny_samples.push(started.elapsed());
        }
        let direct_p50 = report("direct reqwest GET (pooled connection)", reqwest_samples);
        let policy_p50 = report(
            "host policy send (check, resolve, pin, cap)",
            policy_samples,
        );
        let fetch_p50 = report(
            "web_fetch (policy + fresh instance + HTML to text)",
            fetch_samples,
        );
        let tiny_p50 = report("web_fetch of an 11-byte page (fixed cost)", tiny_samples);
        println!("web_fetch output: {text_chars} characters of text");
        println!(
            "overhead at p50: policy path {:.1}x, web_fetch {:.1}x the direct GET (+{:.0} µs, of which \
             {:.0} µs fixed per call and the rest parsing and rendering the page)",
            policy_p50.as_secs_f64() / direct_p50.as_secs_f64(),
            fetch_p50.as_secs_f64() / direct_p50.as_secs_f64(),
            (fetch_p50.as_secs_f64() - direct_p50.as_secs_f64()) * 1e6,
            tiny_p50.as_secs_f64() * 1e6
        );
    });
}
