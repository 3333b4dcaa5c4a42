//! The web chat in real headless Chromium through WebDriver (chromedriver and the fantoccini
//! client), against `clawcage gateway` and the scripted LLM server: a message typed and sent,
//! the answer streamed, a tool card with the sandbox's denial of a `/etc/passwd` read, a turn
//! from another client while the page's connection was dropped (shown once), the stop button,
//! and a reload that shows the same history. Screenshots go to `target/`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail by panicking"
)]

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use clawcage_tests::gateway_client::GatewayClient;
use clawcage_tests::gateway_process::GatewayProcess;
use clawcage_tests::llm_server::{LlmServer, Reply, anthropic, tool_result_of};
use fantoccini::{ClientBuilder, Locator};
use serde_json::{Value, json};

const TOKEN: &str = "browser-test-token-0123456789";

fn repo_target() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target")
}

/// A child process killed when dropped.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn find(program: &str, candidates: &[&str]) -> Option<PathBuf> {
    candidates
        .iter()
        .map(PathBuf::from)
        .find(|path| path.exists())
        .or_else(|| {
            let path = std::env::var_os("PATH")?;
            std::env::split_paths(&path)
                .map(|dir| dir.join(program))
                .find(|candidate| candidate.is_file())
        })
}

fn start_gateway(root: &Path, llm: &str) -> (GatewayProcess, SocketAddr) {
    start_gateway_with(root, llm, "", &[])
}

/// [`start_gateway`] with `extra` configuration and environment variables.
fn start_gateway_with(
    root: &Path,
    llm: &str,
    extra: &str,
    env: &[(&str, &str)],
) -> (GatewayProcess, SocketAddr) {
    let state = root.join("state");
    let workspace = root.join("ws");
    let cache = clawcage_tests::cli_state::shared_state_dir().join("cache");
    // The components compiled and described first, so the start-up deadline counts the
    // gateway's own work only.
    clawcage_tests::cli_state::warm_components(Path::new(env!("CARGO_BIN_EXE_clawcage")));
    std::fs::create_dir_all(&state).unwrap();
    std::fs::create_dir_all(&workspace).unwrap();
    std::fs::create_dir_all(&cache).unwrap();
    std::os::unix::fs::symlink(&cache, state.join("cache")).unwrap();
    let config = root.join("clawcage.toml");
    std::fs::write(
        &config,
        format!(
            "[provider]\nkind = \"anthropic\"\nmodel = \"claude-test\"\nbase_url = \"{llm}\"\nmax_retries = 0\n\n[subagents]\nenabled = false\n{extra}"
        ),
    )
    .unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_clawcage"));
    command
        .arg("--config")
        .arg(&config)
        .arg("--state-dir")
        .arg(&state)
        .arg("--workspace")
        .arg(&workspace)
        .args(["gateway", "--bind", "127.0.0.1:0", "--token", TOKEN])
        .env_remove("RUST_LOG")
        .env("ANTHROPIC_API_KEY", "sk-browser-test")
        .envs(env.iter().copied());
    let gateway = GatewayProcess::start(command);
    let addr = gateway.addr;
    (gateway, addr)
}

/// Polls `script` (a function body returning JSON) until `ready` holds, at most `seconds`.
async fn wait_for(
    browser: &fantoccini::Client,
    what: &str,
    seconds: u64,
    script: &str,
    ready: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(seconds);
    loop {
        let value = browser.execute(script, vec![]).await.unwrap();
        if ready(&value) {
            return value;
        }
        if std::time::Instant::now() > deadline {
            panic!("timed out waiting for {what}; last state: {value:#}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Chromium and chromedriver, or `None` after [`skip`](clawcage_tests::toolchains::skip) (which
/// fails the test under CI) when either is missing.
fn browser_programs(test: &str) -> Option<(PathBuf, PathBuf)> {
    let chromium = find(
        "chromium",
        &["/usr/bin/chromium", "/usr/bin/chromium-browser"],
    );
    let driver = find("chromedriver", &["/usr/bin/chromedriver"]);
    if chromium.is_none() || driver.is_none() {
        clawcage_tests::toolchains::skip(
            test,
            "chromium and chromedriver are not installed (apt-get install chromium chromium-driver)",
        );
    }
    chromium.zip(driver)
}

/// A headless Chromium driven through a chromedriver of its own; both end with the test.
async fn open_browser(
    chromium: &Path,
    driver: &Path,
) -> (Process, tempfile::TempDir, fantoccini::Client) {
    let port = free_port();
    let chromedriver = Process(
        Command::new(driver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let profile = tempfile::tempdir().unwrap();
    let mut capabilities = serde_json::Map::new();
    capabilities.insert(
        "goog:chromeOptions".to_string(),
        json!({
            "binary": chromium,
            "args": [
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", "--window-size=1280,860",
                format!("--user-data-dir={}", profile.path().display()),
            ],
        }),
    );
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    let browser = ClientBuilder::new(connector)
        .capabilities(capabilities)
        .connect(&format!("http://127.0.0.1:{port}"))
        .await
        .expect("chromedriver starts a headless Chromium");
    (chromedriver, profile, browser)
}

/// What the page shows, as JSON.
const PAGE: &str = r#"
const texts = (selector) => Array.from(document.querySelectorAll(selector), (e) => e.firstChild ? e.firstChild.textContent : "");
return {
  status: document.getElementById("status").textContent,
  user: texts(".msg.user"),
  assistant: texts(".msg.assistant"),
  notes: texts(".msg.note"),
  tools: Array.from(document.querySelectorAll(".tool-card"), (c) => ({
    name: c.dataset.tool, verdict: c.dataset.verdict,
    output: (c.querySelector("pre") || {}).textContent || "",
    folded: c.querySelector("details") ? !c.querySelector("details").open : null,
  })),
  stopEnabled: !document.getElementById("stop").disabled,
  session: state.session,
  lastSeq: state.lastSeq,
};
"#;

/// Opens the web chat with the operator's token and waits until it is connected.
async fn connect_page(browser: &fantoccini::Client, addr: SocketAddr) {
    browser
        .goto(&format!("http://{addr}/#token={TOKEN}"))
        .await
        .unwrap();
    wait_for(browser, "the page to connect", 30, PAGE, |page| {
        page["status"] == "connected"
    })
    .await;
}

/// Waits until the sidebar shows an approval request; the operator panel then.
async fn wait_for_approval(browser: &fantoccini::Client, what: &str) -> Value {
    wait_for(browser, what, 60, OPERATOR, |panel| {
        panel["approvals"]
            .as_array()
            .is_some_and(|list| !list.is_empty())
    })
    .await
}

/// Clicks `decision` (`allow-once`, `allow-always`, `deny`) on the request shown.
async fn answer_approval(browser: &fantoccini::Client, decision: &str) {
    browser
        .find(Locator::Css(&format!(
            "#approvals button[data-decision=\"{decision}\"]"
        )))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
}

async fn send(browser: &fantoccini::Client, text: &str) {
    let input = browser.find(Locator::Id("input")).await.unwrap();
    input.send_keys(text).await.unwrap();
    browser
        .find(Locator::Id("send"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
}

fn count(list: &Value, needle: &str) -> usize {
    list.as_array()
        .unwrap()
        .iter()
        .filter(|text| text.as_str().unwrap_or_default().contains(needle))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_web_chat_streams_shows_the_sandbox_verdict_stops_and_resumes_after_a_reload() {
    let Some((chromium, driver)) = browser_programs(
        "the_web_chat_streams_shows_the_sandbox_verdict_stops_and_resumes_after_a_reload",
    ) else {
        return;
    };
    let refusal =
        "The sandbox refused: /etc/passwd lies outside the workspace, so I cannot read it.";
    let server = LlmServer::start(vec![
        anthropic::stream(
            &[
                anthropic::text("Let me try to read it."),
                anthropic::tool("t1", "read_file", json!({"path": "/etc/passwd"})),
            ],
            32,
        ),
        anthropic::stream(&[anthropic::text(refusal)], 16),
        anthropic::stream(&[anthropic::text("Answered while you were away.")], 16),
        Reply::Hang,
    ])
    .await;
    let root = tempfile::tempdir().unwrap();
    let (_gateway, addr) = start_gateway(root.path(), server.url());

    let (_driver, _profile, browser) = open_browser(&chromium, &driver).await;

    connect_page(&browser, addr).await;
    send(&browser, "Please read /etc/passwd").await;
    let page = wait_for(
        &browser,
        "the denied tool card and the answer",
        120,
        PAGE,
        |page| count(&page["assistant"], "The sandbox refused") == 1,
    )
    .await;
    assert_eq!(page["user"], json!(["Please read /etc/passwd"]), "{page:#}");
    assert_eq!(
        page["assistant"],
        json!(["Let me try to read it.", refusal]),
        "{page:#}"
    );
    let tools = page["tools"].as_array().unwrap();
    assert_eq!(tools.len(), 1, "{page:#}");
    assert_eq!(tools[0]["name"], "read_file");
    assert_eq!(tools[0]["verdict"], "denied", "{page:#}");
    assert_eq!(tools[0]["folded"], true, "the output is folded");
    assert!(
        tools[0]["output"].as_str().unwrap().contains("/etc/passwd"),
        "{page:#}"
    );
    let screenshot = browser.screenshot().await.unwrap();
    std::fs::write(repo_target().join("gateway-webchat.png"), screenshot).unwrap();

    // The page's connection drops; another client's turn in the same session meanwhile is shown
    // once when the page is back.
    let session = page["session"].as_str().unwrap().to_string();
    browser.execute("state.ws.close();", vec![]).await.unwrap();
    let (mut other, _) = GatewayClient::connect(addr, TOKEN).await;
    let sent = other
        .request(
            "chat.send",
            json!({"sessionKey": session, "message": "Sent from another client", "idempotencyKey": "x1"}),
        )
        .await;
    let done = other
        .request(
            "agent.wait",
            json!({"runId": sent["payload"]["runId"], "timeoutMs": 20000}),
        )
        .await;
    assert_eq!(done["payload"]["status"], "ok", "{done}");
    let page = wait_for(&browser, "the missed turn", 30, PAGE, |page| {
        page["status"] == "connected"
            && count(&page["assistant"], "Answered while you were away.") > 0
    })
    .await;
    assert_eq!(
        count(&page["assistant"], "Answered while you were away."),
        1,
        "{page:#}"
    );
    assert_eq!(count(&page["user"], "Sent from another client"), 1);
    assert_eq!(count(&page["assistant"], "The sandbox refused"), 1);

    // A turn whose model never answers: the stop button ends it.
    send(&browser, "Now wait for me").await;
    wait_for(&browser, "the stop button", 30, PAGE, |page| {
        page["stopEnabled"] == true
    })
    .await;
    while server.requests().len() < 4 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    browser
        .find(Locator::Id("stop"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let stopped = wait_for(&browser, "the stop", 30, PAGE, |page| {
        count(&page["notes"], "stopped") == 1 && page["stopEnabled"] == false
    })
    .await;
    let before_reload = stopped["lastSeq"].as_u64().unwrap();

    // After a reload: the same history, nothing twice.
    browser.refresh().await.unwrap();
    let page = wait_for(&browser, "the history after the reload", 30, PAGE, |page| {
        page["status"] == "connected" && count(&page["assistant"], "The sandbox refused") == 1
    })
    .await;
    assert_eq!(
        page["user"],
        json!([
            "Please read /etc/passwd",
            "Sent from another client",
            "Now wait for me"
        ]),
        "{page:#}"
    );
    assert_eq!(
        page["assistant"],
        json!([
            "Let me try to read it.",
            refusal,
            "Answered while you were away."
        ]),
        "{page:#}"
    );
    let tools = page["tools"].as_array().unwrap();
    assert_eq!(tools.len(), 1, "{page:#}");
    assert_eq!(tools[0]["verdict"], "denied", "{page:#}");
    assert_eq!(page["lastSeq"].as_u64().unwrap(), before_reload);
    let screenshot = browser.screenshot().await.unwrap();
    std::fs::write(
        repo_target().join("gateway-webchat-reloaded.png"),
        screenshot,
    )
    .unwrap();
    browser.close().await.unwrap();
}

/// The operator panel, as JSON: the approvals and pairings waiting.
const OPERATOR: &str = r##"
return {
  shown: !document.getElementById("operator").hidden,
  approvals: Array.from(document.querySelectorAll("#approvals li"), (e) => e.textContent),
  pairings: Array.from(document.querySelectorAll("#pairings li"), (e) => e.textContent),
  assistant: Array.from(document.querySelectorAll(".msg.assistant"), (e) => e.firstChild ? e.firstChild.textContent : ""),
};
"##;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_web_chat_answers_exec_approvals_and_approves_a_telegram_sender() {
    use clawcage_tests::channels::FakeBotApi;
    let Some((chromium, driver)) =
        browser_programs("the_web_chat_answers_exec_approvals_and_approves_a_telegram_sender")
    else {
        return;
    };
    // "remove DIR" runs `rm -r DIR`; anything else is answered in words.
    let server = LlmServer::start_routed(|body| {
        let last = body["messages"].as_array().unwrap().last().unwrap().clone();
        let is_result = last["content"]
            .as_array()
            .is_some_and(|blocks| blocks.iter().any(|block| block["type"] == "tool_result"));
        match clawcage_tests::llm_server::text_of(&last).strip_prefix("remove ") {
            Some(dir) if !is_result => anthropic::stream(
                &[anthropic::tool(
                    "t1",
                    "exec",
                    json!({"command": format!("rm -r {dir}")}),
                )],
                32,
            ),
            _ if is_result => anthropic::stream(&[anthropic::text("Removed it.")], 16),
            _ => anthropic::stream(&[anthropic::text("Hello from the agent.")], 16),
        }
    })
    .await;
    let bot_token = "123456:browser-test-bot-token";
    let bot = FakeBotApi::start(bot_token).await;
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("ws/build")).unwrap();
    let extra = format!(
        "\n[approvals]\nexec = \"allowlist\"\nask = \"on-miss\"\n\n[channels.telegram]\ntoken_env = \"BROWSER_TEST_BOT_TOKEN\"\napi_base = \"{}\"\npoll_timeout_secs = 2\n",
        bot.url()
    );
    let (_gateway, addr) = start_gateway_with(
        root.path(),
        server.url(),
        &extra,
        &[("BROWSER_TEST_BOT_TOKEN", bot_token)],
    );
    let (_driver, _profile, browser) = open_browser(&chromium, &driver).await;
    connect_page(&browser, addr).await;

    // An exec command the allowlist does not cover waits for this page.
    send(&browser, "remove build").await;
    let panel = wait_for_approval(&browser, "the approval request").await;
    assert_eq!(panel["shown"], true, "{panel:#}");
    assert!(
        panel["approvals"][0]
            .as_str()
            .unwrap()
            .contains("exec wants to run:rm -r build"),
        "{panel:#}"
    );
    assert!(root.path().join("ws/build").exists(), "ran before approval");
    answer_approval(&browser, "allow-once").await;
    wait_for(
        &browser,
        "the answer after approval",
        60,
        OPERATOR,
        |panel| {
            count(&panel["assistant"], "Removed it.") == 1
                && panel["approvals"].as_array().is_some_and(Vec::is_empty)
        },
    )
    .await;
    assert!(!root.path().join("ws/build").exists());

    // An unknown Telegram sender gets a code; the page shows it and approves it.
    bot.private_message(77, "Grace", "hi");
    bot.wait_delivered(77, 1).await;
    let panel = wait_for(&browser, "the pairing request", 30, OPERATOR, |panel| {
        panel["pairings"]
            .as_array()
            .is_some_and(|list| !list.is_empty())
    })
    .await;
    assert!(
        panel["pairings"][0].as_str().unwrap().contains("Grace"),
        "{panel:#}"
    );
    assert_eq!(
        server.requests().len(),
        2,
        "the unpaired message reached the model"
    );
    browser
        .find(Locator::Css("#pairings button"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_for(
        &browser,
        "the pairing to be approved",
        30,
        OPERATOR,
        |panel| panel["pairings"].as_array().is_some_and(Vec::is_empty) && panel["shown"] == false,
    )
    .await;
    // Approved: the next message reaches the agent and is answered in the chat.
    bot.private_message(77, "Grace", "hello again");
    bot.wait_delivered(77, 2).await;
    assert!(
        bot.delivered_texts(77)
            .iter()
            .any(|text| text.contains("Hello from the agent.")),
        "{:?}",
        bot.delivered_texts(77)
    );
    browser.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_web_chat_asks_before_a_write_in_a_read_only_workspace() {
    let Some((chromium, driver)) =
        browser_programs("the_web_chat_asks_before_a_write_in_a_read_only_workspace")
    else {
        return;
    };
    // "save NAME" writes NAME with write_file; a tool result is answered with what it said.
    let server = LlmServer::start_routed(|body| {
        let last = body["messages"].as_array().unwrap().last().unwrap().clone();
        if let Some(result) = tool_result_of(&last) {
            let verdict = if result.contains("denied by the operator") {
                "Not saved."
            } else {
                "Saved."
            };
            return anthropic::stream(&[anthropic::text(verdict)], 16);
        }
        match clawcage_tests::llm_server::text_of(&last).strip_prefix("save ") {
            Some(name) => anthropic::stream(
                &[anthropic::tool(
                    "t1",
                    "write_file",
                    json!({"path": name, "content": "kept\n"}),
                )],
                32,
            ),
            None => anthropic::stream(&[anthropic::text("Hello.")], 16),
        }
    })
    .await;
    let root = tempfile::tempdir().unwrap();
    let extra = "\n[workspace]\nmode = \"ro\"\n\n[approvals]\nwrite = \"ask\"\n";
    let (_gateway, addr) = start_gateway_with(root.path(), server.url(), extra, &[]);
    let workspace = root.path().join("ws").canonicalize().unwrap();
    let (_driver, _profile, browser) = open_browser(&chromium, &driver).await;
    connect_page(&browser, addr).await;

    // Denied: nothing written, the model reads the operator's no.
    send(&browser, "save denied.txt").await;
    let panel = wait_for_approval(&browser, "the write request").await;
    let shown = panel["approvals"][0].as_str().unwrap().to_string();
    assert!(
        shown.contains(&format!(
            "A change in the read-only workspace:create or change {}/denied.txt",
            workspace.display()
        )),
        "{panel:#}"
    );
    answer_approval(&browser, "deny").await;
    wait_for(
        &browser,
        "the answer after the denial",
        60,
        OPERATOR,
        |panel| {
            count(&panel["assistant"], "Not saved.") == 1
                && panel["approvals"].as_array().is_some_and(Vec::is_empty)
        },
    )
    .await;
    assert!(!workspace.join("denied.txt").exists());

    // Always: written, and kept for that path.
    send(&browser, "save kept.txt").await;
    wait_for_approval(&browser, "the second write request").await;
    answer_approval(&browser, "allow-always").await;
    wait_for(
        &browser,
        "the answer after the approval",
        60,
        OPERATOR,
        |panel| count(&panel["assistant"], "Saved.") == 1,
    )
    .await;
    assert_eq!(
        std::fs::read_to_string(workspace.join("kept.txt")).unwrap(),
        "kept\n"
    );
    let kept = std::fs::read_to_string(root.path().join("state/approvals.json")).unwrap();
    assert!(kept.contains("\"write\""), "{kept}");
    assert!(
        kept.contains(&format!("{}/kept.txt", workspace.display())),
        "{kept}"
    );
    browser.close().await.unwrap();
}
