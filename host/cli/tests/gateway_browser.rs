//! The web chat in real headless Chromium through WebDriver (chromedriver and the fantoccini
//! client), against `clawcage gateway` and the scripted LLM server: a message typed and sent,
//! the answer streamed, a tool card with the sandbox's denial of a `/etc/passwd` read, a turn
//! from another client while the page's connection was dropped (shown once), the stop button,
//! and a reload that shows the same history; replies rendered from Markdown and attacks on that
//! rendering (scripts, event handlers, `javascript:` and `data:` links, raw HTML, partial fences
//! while streaming); approvals on their tool cards; the thinking indicator; scrolling; a
//! phone-sized window; session titles; the token dialog. Screenshots go to `target/`; those the
//! README shows also to `docs/screenshots/` with `CLAWCAGE_UPDATE_SCREENSHOTS=1`. It is one file
//! (over 700 lines) because every test drives one browser against one gateway through the same
//! start-up and page helpers, one test per behaviour, and much of its length is the JavaScript
//! those tests run in the page.
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
use clawcage_tests::llm_server::{LlmServer, Reply, ReplyGate, anthropic, tool_result_of};
use fantoccini::{ClientBuilder, Locator};
use serde_json::{Value, json};

const TOKEN: &str = "browser-test-token-0123456789";

fn repo_target() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target")
}

/// Keeps a screenshot the README shows: in `target/`, and in `docs/screenshots/` when
/// `CLAWCAGE_UPDATE_SCREENSHOTS` is set (each run's session keys differ, so a plain run leaves
/// the checked-in pictures alone).
fn keep_screenshot(name: &str, png: &[u8]) {
    std::fs::write(repo_target().join(name), png).unwrap();
    if std::env::var_os("CLAWCAGE_UPDATE_SCREENSHOTS").is_some() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/screenshots");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(name), png).unwrap();
    }
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
    start_gateway_at(root, llm, extra, env, "127.0.0.1:0")
}

/// [`start_gateway_with`] listening on `bind` (started again on the same `root`, it is the same
/// gateway after a restart).
fn start_gateway_at(
    root: &Path,
    llm: &str,
    extra: &str,
    env: &[(&str, &str)],
    bind: &str,
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
    if !state.join("cache").exists() {
        std::os::unix::fs::symlink(&cache, state.join("cache")).unwrap();
    }
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
        .args(["gateway", "--bind", bind, "--token", TOKEN])
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
    open_browser_sized(chromium, driver, (1280, 860)).await
}

/// [`open_browser`] with a window of `width` × `height` CSS pixels.
async fn open_browser_sized(
    chromium: &Path,
    driver: &Path,
    (width, height): (u32, u32),
) -> (Process, tempfile::TempDir, fantoccini::Client) {
    // Six browsers start at once on a small machine: a chromedriver can lose its port to another
    // test between `free_port` and its bind, or reset the first session while Chromium starts.
    // Each attempt starts a fresh driver on a fresh port; three failures fail the test.
    let mut failures = Vec::new();
    for _attempt in 0..3 {
        match start_browser(chromium, driver, (width, height)).await {
            Ok(started) => return started,
            Err(failure) => failures.push(failure),
        }
    }
    panic!("chromedriver could not start a headless Chromium three times: {failures:#?}");
}

/// One attempt of [`open_browser_sized`]: a chromedriver on a free port and a session on it.
async fn start_browser(
    chromium: &Path,
    driver: &Path,
    (width, height): (u32, u32),
) -> Result<(Process, tempfile::TempDir, fantoccini::Client), String> {
    let port = free_port();
    let mut chromedriver = Process(
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
    if let Ok(Some(status)) = chromedriver.0.try_wait() {
        return Err(format!("chromedriver on port {port} exited with {status}"));
    }
    let profile = tempfile::tempdir().unwrap();
    let mut capabilities = serde_json::Map::new();
    let mut options = json!({
        "binary": chromium,
        "args": [
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--disable-dev-shm-usage", format!("--window-size={width},{height}"),
            format!("--user-data-dir={}", profile.path().display()),
        ],
    });
    // A desktop window is at least 500 pixels wide: a phone's width is emulated.
    if width < 500 {
        options["mobileEmulation"] =
            json!({"deviceMetrics": {"width": width, "height": height, "pixelRatio": 1.0}});
    }
    capabilities.insert("goog:chromeOptions".to_string(), options);
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    match ClientBuilder::new(connector)
        .capabilities(capabilities)
        .connect(&format!("http://127.0.0.1:{port}"))
        .await
    {
        Ok(browser) => Ok((chromedriver, profile, browser)),
        Err(error) => Err(format!("chromedriver on port {port}: {error}")),
    }
}

/// What the page shows, as JSON.
const PAGE: &str = r##"
const texts = (selector) => Array.from(document.querySelectorAll(selector), (e) => e.textContent.trim());
const messages = document.getElementById("messages");
const thinking = document.querySelector("#messages .thinking");
return {
  status: document.getElementById("status").textContent,
  user: texts(".msg.user"),
  assistant: texts(".msg.assistant .body"),
  notes: texts(".msg.note"),
  usage: texts(".msg .usage"),
  tools: Array.from(document.querySelectorAll(".tool-card"), (c) => ({
    id: c.dataset.id, name: c.dataset.tool, verdict: c.dataset.verdict, label: c.dataset.label || "",
    args: c.querySelector(".args").textContent,
    badge: c.querySelector(".verdict").textContent,
    approval: (c.querySelector(".approval") || {}).textContent || "",
    output: (c.querySelector("details pre") || {}).textContent || "",
    folded: c.querySelector("details") ? !c.querySelector("details").open : null,
  })),
  sidebarApprovals: texts("#approvals li"),
  approvalCalls: Array.from(state.approvals.values(), (ask) => ask.toolCallId || null),
  reasoning: Array.from(document.querySelectorAll("#messages .reasoning"), (d) => ({
    text: d.querySelector(".reasoning-text").textContent, open: d.open,
  })),
  thinking: thinking ? thinking.textContent : null,
  thinkingSeconds: thinking ? Number(thinking.dataset.seconds) : null,
  stopEnabled: !document.getElementById("stop").disabled,
  tokenPrompt: !document.getElementById("token-prompt").hidden,
  tokenError: document.getElementById("token-error").hidden ? "" : document.getElementById("token-error").textContent,
  hash: location.hash,
  storedToken: sessionStorage.getItem("clawcage.token"),
  title: document.getElementById("session-title").textContent,
  sessions: Array.from(document.querySelectorAll("#sessions li"), (li) => ({
    key: li.dataset.key, title: li.querySelector(".title").textContent,
    meta: li.querySelector(".meta").textContent, active: li.classList.contains("active"),
  })),
  scrollTop: messages.scrollTop,
  scrollBottomGap: messages.scrollHeight - messages.scrollTop - messages.clientHeight,
  jumpShown: !document.getElementById("jump").hidden,
  session: state.session,
  draft: state.draft,
  lastSeq: state.lastSeq,
};
"##;

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

/// Waits until a tool card of the open session asks for approval; the page then.
async fn wait_for_approval(browser: &fantoccini::Client, what: &str) -> Value {
    wait_for(browser, what, 60, PAGE, |page| {
        page["tools"].as_array().is_some_and(|tools| {
            tools
                .iter()
                .any(|tool| !tool["approval"].as_str().unwrap_or_default().is_empty())
        })
    })
    .await
}

/// The text of the approval question on the tool cards of `page`.
fn card_approval(page: &Value) -> String {
    page["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|tool| tool["approval"].as_str().unwrap_or_default())
        .collect()
}

/// Clicks `decision` (`allow-once`, `allow-always`, `deny`) on the tool card asking.
async fn answer_approval(browser: &fantoccini::Client, decision: &str) {
    browser
        .find(Locator::Css(&format!(
            ".tool-card .approval button[data-decision=\"{decision}\"]"
        )))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
}

/// Clicks the element `css` finds; again if the list it is in was drawn anew in between (the
/// session list is redrawn whenever the gateway's list is read).
async fn click_retrying(browser: &fantoccini::Client, css: &str) {
    for attempt in 0.. {
        let clicked = match browser.find(Locator::Css(css)).await {
            Ok(element) => element.click().await.map(|_| ()),
            Err(error) => Err(error),
        };
        match clicked {
            Ok(()) => return,
            Err(error) if attempt >= 20 => panic!("cannot click {css}: {error}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
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
    // The token is kept for this tab only and is gone from the address bar.
    let page = browser.execute(PAGE, vec![]).await.unwrap();
    assert_eq!(page["hash"], "", "{page:#}");
    assert_eq!(page["storedToken"], TOKEN, "{page:#}");
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
    assert_eq!(
        page["usage"],
        json!(["anthropic/claude-test · 200 in / 40 out"]),
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
    server.wait_for_requests(4).await;
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
    // The usage lines and the "stopped" note are the same as before the reload.
    assert_eq!(page["usage"].as_array().unwrap().len(), 2, "{stopped:#}");
    assert_eq!(page["usage"], stopped["usage"], "{page:#}\n{stopped:#}");
    assert_eq!(page["notes"], json!(["stopped"]), "{page:#}");
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
  sessionsOfApprovals: Array.from(document.querySelectorAll("#approvals li .where"), (e) => e.textContent),
  pairings: Array.from(document.querySelectorAll("#pairings li"), (e) => e.textContent),
  assistant: Array.from(document.querySelectorAll(".msg.assistant .body"), (e) => e.textContent.trim()),
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

    // An exec command the allowlist does not cover waits for this page: the question is on the
    // command's own tool card, not in the sidebar.
    send(&browser, "remove build").await;
    let page = wait_for_approval(&browser, "the approval request").await;
    let asked = card_approval(&page);
    assert!(
        asked.contains("Waiting for your approval")
            && asked.contains("exec wants to run:rm -r build"),
        "{page:#}"
    );
    assert_eq!(page["tools"][0]["name"], "exec", "{page:#}");
    assert_eq!(page["tools"][0]["verdict"], "waiting", "{page:#}");
    // The gateway names the call the request gates.
    assert_eq!(page["approvalCalls"], json!(["t1"]), "{page:#}");
    assert_eq!(page["tools"][0]["id"], "t1", "{page:#}");
    assert_eq!(page["sidebarApprovals"], json!([]), "{page:#}");
    assert_eq!(page["thinking"], Value::Null, "{page:#}");
    // After a reload the question is on the card again.
    browser.refresh().await.unwrap();
    let page = wait_for_approval(&browser, "the approval request after a reload").await;
    assert!(
        card_approval(&page).contains("exec wants to run:rm -r build"),
        "{page:#}"
    );
    assert_eq!(page["tools"].as_array().unwrap().len(), 1, "{page:#}");
    assert_eq!(page["sidebarApprovals"], json!([]), "{page:#}");
    let screenshot = browser.screenshot().await.unwrap();
    keep_screenshot("webchat-approval.png", &screenshot);
    assert!(root.path().join("ws/build").exists(), "ran before approval");
    answer_approval(&browser, "allow-once").await;
    let page = wait_for(&browser, "the answer after approval", 60, PAGE, |page| {
        count(&page["assistant"], "Removed it.") == 1
    })
    .await;
    assert_eq!(card_approval(&page), "", "{page:#}");
    assert_eq!(page["tools"][0]["verdict"], "ok", "{page:#}");
    assert!(!root.path().join("ws/build").exists());

    // Another session's request is listed in the sidebar, named by its session, and answered there.
    std::fs::create_dir_all(root.path().join("ws/other")).unwrap();
    let (mut other, _) = GatewayClient::connect(addr, TOKEN).await;
    let sent = other
        .request(
            "chat.send",
            json!({"sessionKey": "agent:main:webchat:elsewhere", "message": "remove other", "idempotencyKey": "o1"}),
        )
        .await;
    assert_eq!(sent["ok"], true, "{sent}");
    let panel = wait_for(
        &browser,
        "the other session's request",
        60,
        OPERATOR,
        |panel| {
            panel["approvals"]
                .as_array()
                .is_some_and(|list| !list.is_empty())
        },
    )
    .await;
    assert_eq!(panel["shown"], true, "{panel:#}");
    assert!(
        panel["approvals"][0]
            .as_str()
            .unwrap()
            .contains("exec wants to run:rm -r other"),
        "{panel:#}"
    );
    // Named by the session's title (its first message), not its key.
    wait_for(
        &browser,
        "the other session's title",
        10,
        OPERATOR,
        |panel| panel["sessionsOfApprovals"] == json!(["remove other"]),
    )
    .await;
    let page = browser.execute(PAGE, vec![]).await.unwrap();
    assert_eq!(
        card_approval(&page),
        "",
        "not on this session's cards: {page:#}"
    );
    browser
        .find(Locator::Css("#approvals button[data-decision=\"deny\"]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let done = other
        .request(
            "agent.wait",
            json!({"runId": sent["payload"]["runId"], "timeoutMs": 30000}),
        )
        .await;
    assert_eq!(done["payload"]["status"], "ok", "{done}");
    wait_for(&browser, "the sidebar to empty", 30, OPERATOR, |panel| {
        panel["approvals"].as_array().is_some_and(Vec::is_empty)
    })
    .await;
    assert!(root.path().join("ws/other").exists(), "denied, yet removed");

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
        4,
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
    let page = wait_for_approval(&browser, "the write request").await;
    let shown = card_approval(&page);
    assert!(
        shown.contains(&format!(
            "A change in the read-only workspace:create or change {}/denied.txt",
            workspace.display()
        )),
        "{page:#}"
    );
    assert_eq!(page["tools"][0]["name"], "write_file", "{page:#}");
    answer_approval(&browser, "deny").await;
    wait_for(&browser, "the answer after the denial", 60, PAGE, |page| {
        count(&page["assistant"], "Not saved.") == 1 && card_approval(page).is_empty()
    })
    .await;
    assert!(!workspace.join("denied.txt").exists());

    // Always: written, and kept for that path.
    send(&browser, "save kept.txt").await;
    wait_for_approval(&browser, "the second write request").await;
    answer_approval(&browser, "allow-always").await;
    let page = wait_for(
        &browser,
        "the answer after the approval",
        60,
        PAGE,
        |page| count(&page["assistant"], "Saved.") == 1,
    )
    .await;
    // The second call (the scripted model reuses the id `t1`) has a card of its own.
    let tools = page["tools"].as_array().unwrap();
    assert_eq!(tools.len(), 2, "{page:#}");
    assert_eq!(tools[1]["verdict"], "ok", "{page:#}");
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

/// A reply in Markdown: heading, emphasis, list, table, link, inline code and a code fence with a
/// line far wider than the bubble.
const MARKDOWN_REPLY: &str = "## Build status\n\nThe **release** build passed; *two* warnings remain:\n\n1. `unused_mut` in `src/lib.rs`\n2. a deprecated call in [the parser](https://example.org/parser)\n\n| crate | tests | time |\n|---|---:|---:|\n| core | 48 | 1.2 s |\n| agent | 131 | 6.8 s |\n\n```rust\nfn main() {\n    let greeting = \"hello from a code block whose line is far wider than the chat bubble, so it scrolls sideways instead of wrapping\";\n    println!(\"{greeting}\");\n}\n```\n\n> Run `cargo test` again after the fix.\n\nThe log is in build.log and setup.py, also at https://ci.example.org/run/42.";

/// A reply that tries every way into the page: scripts, event handlers, `javascript:`,
/// `vbscript:` and `data:` links, raw HTML blocks and inline HTML, an SVG, a style sheet, an
/// image that would fetch, HTML inside a table, and a fence left open at the end (as it is while
/// streaming).
const ATTACK_REPLY: &str = "Attack reply.\n\n<script>window.pwned = 1</script>\n\n<img src=x onerror=\"window.pwned = 2\">\n\n[click me](javascript:window.pwned=3) and [vb](vbscript:msgbox) and [data](data:text/html;base64,PHNjcmlwdD53aW5kb3cucHduZWQ9NDwvc2NyaXB0Pg==) and <javascript:window.pwned=5>\n\n<a href=\"javascript:window.pwned=6\">raw link</a> <b onmouseover=\"window.pwned=7\">bold</b>\n\n<iframe src=\"/\"></iframe><svg onload=\"window.pwned=8\"></svg><style>body{display:none}</style>\n\n![tracker](http://127.0.0.1:9/pixel.png) ![x](x\" onerror=\"window.pwned=9)\n\n| a | b |\n|---|---|\n| <i onclick=\"window.pwned=10\">cell</i> | [j](javascript:window.pwned=11) |\n\n<details open ontoggle=\"window.pwned=12\"><summary>s</summary></details>\n\n```html\n<script>window.pwned = 13</script>\n```\n\n```js\nconsole.log('a fence left open')";

/// Everything in the conversation's messages that could run code or fetch, recorded by a
/// MutationObserver over `#messages` from the moment it is installed: every intermediate render of a streamed
/// reply is checked, not only the last.
const WATCH_FOR_INJECTION: &str = r#"
window.injected = [];
const bad = (node) => {
  if (node.nodeType !== 1) return;
  for (const element of [node, ...node.querySelectorAll("*")]) {
    // The page's own cards hold details and buttons; what a message holds is checked.
    if (!element.closest(".msg")) continue;
    const tag = element.tagName.toLowerCase();
    if (["script", "iframe", "object", "embed", "img", "svg", "style", "link", "meta", "form", "input", "details", "base", "math", "video", "audio", "source"].includes(tag)) {
      window.injected.push(`element <${tag}>`);
    }
    for (const attribute of element.attributes) {
      const name = attribute.name.toLowerCase();
      if (name.startsWith("on") || name === "style" || name === "srcdoc" || name === "src" || name === "formaction") {
        window.injected.push(`attribute ${name} on <${tag}>`);
      }
      if (name === "href" && !/^(https?:|mailto:)/i.test(attribute.value)) {
        window.injected.push(`href ${attribute.value}`);
      }
    }
  }
};
const observer = new MutationObserver((records) => {
  for (const record of records) {
    if (record.type === "attributes") bad(record.target);
    for (const node of record.addedNodes) bad(node);
  }
});
observer.observe(document.getElementById("messages"), { childList: true, subtree: true, attributes: true });
return true;
"#;

/// The same checks as [`WATCH_FOR_INJECTION`] over every message shown now (after a reload, the
/// history is rendered before an observer could be installed).
const SCAN_FOR_INJECTION: &str = r#"
const injected = [];
for (const element of document.querySelectorAll(".msg, .msg *")) {
  const tag = element.tagName.toLowerCase();
  if (["script", "iframe", "object", "embed", "img", "svg", "style", "link", "meta", "form", "input", "details", "base", "math", "video", "audio", "source"].includes(tag)) {
    injected.push(`element <${tag}>`);
  }
  for (const attribute of element.attributes) {
    const name = attribute.name.toLowerCase();
    if (name.startsWith("on") || name === "style" || name === "srcdoc" || name === "src" || name === "formaction") {
      injected.push(`attribute ${name} on <${tag}>`);
    }
    if (name === "href" && !/^(https?:|mailto:)/i.test(attribute.value)) injected.push(`href ${attribute.value}`);
  }
}
return {
  injected,
  pwned: window.pwned === undefined ? null : window.pwned,
  codeBlocks: document.querySelectorAll(".msg .code-block").length,
  tables: document.querySelectorAll(".msg table").length,
  text: Array.from(document.querySelectorAll(".msg.assistant .body"), (e) => e.textContent).join("\n"),
};
"#;

/// The open session's last assistant bubble, as structure.
const LAST_REPLY: &str = r#"
const replies = document.querySelectorAll(".msg.assistant .body");
const body = replies[replies.length - 1];
const pre = body.querySelector(".code-block pre");
const bubble = body.closest(".msg");
return {
  html: body.innerHTML,
  text: body.textContent,
  headings: Array.from(body.querySelectorAll("h1,h2,h3"), (e) => e.textContent),
  strong: Array.from(body.querySelectorAll("strong"), (e) => e.textContent),
  items: Array.from(body.querySelectorAll("ol > li, ul > li"), (e) => e.textContent),
  cells: Array.from(body.querySelectorAll("table td, table th"), (e) => e.textContent),
  links: Array.from(body.querySelectorAll("a"), (a) => ({ text: a.textContent, href: a.getAttribute("href"), target: a.target, rel: a.rel })),
  inlineCode: Array.from(body.querySelectorAll("p code, li code"), (e) => e.textContent),
  codeBlocks: Array.from(body.querySelectorAll(".code-block"), (b) => ({
    language: b.querySelector(".language").textContent,
    code: b.querySelector("pre").textContent,
    copy: !!b.querySelector("button.copy"),
  })),
  codeFont: pre ? getComputedStyle(pre.querySelector("code") || pre).fontFamily : null,
  codeWhiteSpace: pre ? getComputedStyle(pre).whiteSpace : null,
  codeScrolls: pre ? pre.scrollWidth > pre.clientWidth && getComputedStyle(pre).overflowX === "auto" : null,
  bubbleWidth: bubble.getBoundingClientRect().width,
  injected: window.injected,
  pwned: window.pwned === undefined ? null : window.pwned,
};
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_web_chat_renders_markdown_safely_shows_thinking_and_follows_the_output() {
    let Some((chromium, driver)) = browser_programs(
        "the_web_chat_renders_markdown_safely_shows_thinking_and_follows_the_output",
    ) else {
        return;
    };
    // "How did the last build go?" gets the Markdown reply, "attack" the attack reply; "slow"
    // waits at the gate; "long" gets 80 lines; "tool" asks for a call the turn's one model call
    // leaves not run.
    let gate = ReplyGate::new();
    let held = gate.clone();
    let server = LlmServer::start_routed(move |body| {
        let last = body["messages"].as_array().unwrap().last().unwrap().clone();
        let text = clawcage_tests::llm_server::text_of(&last);
        match text.as_str() {
            "How did the last build go?" => {
                anthropic::stream(&[anthropic::text(MARKDOWN_REPLY)], 24)
            }
            "attack" => anthropic::stream(&[anthropic::text(ATTACK_REPLY)], 7),
            "slow" => held.hold(anthropic::stream(&[anthropic::text("Done thinking.")], 16)),
            "reason" => anthropic::stream(
                &[
                    anthropic::thinking("First the log, then the tests.", "sig-1"),
                    anthropic::text("**Checked** both."),
                ],
                16,
            ),
            "tool" => anthropic::stream(
                &[anthropic::tool(
                    "n1",
                    "exec",
                    json!({"command": "echo skipped"}),
                )],
                32,
            ),
            "long" => {
                let lines: Vec<String> = (1..=80)
                    .map(|n| format!("Line {n} of a long answer."))
                    .collect();
                anthropic::stream(&[anthropic::text(&lines.join("\n\n"))], 64)
            }
            other => anthropic::stream(&[anthropic::text(&format!("You said: {other}"))], 16),
        }
    })
    .await;
    let root = tempfile::tempdir().unwrap();
    let (_gateway, addr) = start_gateway_with(
        root.path(),
        server.url(),
        "\n[agent]\nmax_iterations = 1\n",
        &[],
    );
    let (_driver, _profile, browser) = open_browser(&chromium, &driver).await;
    connect_page(&browser, addr).await;
    assert_eq!(
        browser.execute(WATCH_FOR_INJECTION, vec![]).await.unwrap(),
        true
    );

    // Markdown, rendered.
    send(&browser, "How did the last build go?").await;
    wait_for(&browser, "the Markdown reply", 60, PAGE, |page| {
        count(&page["usage"], " in / ") == 1
    })
    .await;
    let reply = browser.execute(LAST_REPLY, vec![]).await.unwrap();
    assert_eq!(reply["headings"], json!(["Build status"]), "{reply:#}");
    assert_eq!(reply["strong"], json!(["release"]), "{reply:#}");
    assert_eq!(reply["items"].as_array().unwrap().len(), 2, "{reply:#}");
    assert_eq!(
        reply["cells"],
        json!([
            "crate", "tests", "time", "core", "48", "1.2 s", "agent", "131", "6.8 s"
        ]),
        "{reply:#}"
    );
    assert_eq!(
        reply["links"],
        json!([
            {"text": "the parser", "href": "https://example.org/parser", "target": "_blank", "rel": "noopener noreferrer nofollow"},
            {"text": "https://ci.example.org/run/42", "href": "https://ci.example.org/run/42", "target": "_blank", "rel": "noopener noreferrer nofollow"},
        ]),
        "{reply:#}"
    );
    assert!(
        reply["inlineCode"]
            .as_array()
            .unwrap()
            .contains(&json!("src/lib.rs")),
        "{reply:#}"
    );
    let blocks = reply["codeBlocks"].as_array().unwrap();
    assert_eq!(blocks.len(), 1, "{reply:#}");
    assert_eq!(blocks[0]["language"], "rust");
    assert!(
        blocks[0]["code"]
            .as_str()
            .unwrap()
            .starts_with("fn main() {\n    let greeting")
    );
    assert_eq!(blocks[0]["copy"], true);
    assert!(
        reply["codeFont"].as_str().unwrap().contains("monospace"),
        "{reply:#}"
    );
    assert_eq!(reply["codeWhiteSpace"], "pre", "{reply:#}");
    assert_eq!(reply["codeScrolls"], true, "a wide line scrolls: {reply:#}");
    assert!(reply["bubbleWidth"].as_f64().unwrap() <= 830.0, "{reply:#}");
    assert!(!reply["text"].as_str().unwrap().contains("**"), "{reply:#}");
    let screenshot = browser.screenshot().await.unwrap();
    keep_screenshot("webchat-markdown.png", &screenshot);

    // The copy button puts the code on the clipboard: pasted into the message box, it is there.
    browser
        .find(Locator::Css(".code-block button.copy"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let copied = wait_for(
        &browser,
        "the copy",
        10,
        r#"return document.querySelector(".code-block button.copy").dataset.copied || "";"#,
        |copied| copied != "",
    )
    .await;
    assert_eq!(copied, "yes");
    let input = browser.find(Locator::Id("input")).await.unwrap();
    input.send_keys("\u{E009}v\u{E000}").await.unwrap();
    let pasted = browser
        .execute(r#"const v = document.getElementById("input").value; document.getElementById("input").value = ""; return v;"#, vec![])
        .await
        .unwrap();
    assert!(
        pasted
            .as_str()
            .unwrap()
            .starts_with("fn main() {\n    let greeting"),
        "{pasted}"
    );

    // Attacks: nothing that runs or fetches reaches the page, at any point of the stream; raw
    // HTML is shown as the text it is.
    send(&browser, "attack").await;
    wait_for(&browser, "the attack reply", 60, PAGE, |page| {
        count(&page["usage"], " in / ") == 2
    })
    .await;
    let reply = browser.execute(LAST_REPLY, vec![]).await.unwrap();
    assert_eq!(reply["injected"], json!([]), "{reply:#}");
    assert_eq!(reply["pwned"], Value::Null, "{reply:#}");
    let text = reply["text"].as_str().unwrap();
    assert!(
        text.contains("<script>window.pwned = 1</script>"),
        "{reply:#}"
    );
    assert!(
        text.contains("<img src=x onerror=\"window.pwned = 2\">"),
        "{reply:#}"
    );
    assert!(text.contains("click me"), "{reply:#}");
    for link in reply["links"].as_array().unwrap() {
        let href = link["href"].as_str().unwrap_or("");
        assert!(href.is_empty() || href.starts_with("http"), "{reply:#}");
    }
    let blocks = reply["codeBlocks"].as_array().unwrap();
    assert_eq!(blocks.len(), 2, "{reply:#}");
    assert_eq!(blocks[0]["code"], "<script>window.pwned = 13</script>\n");
    assert_eq!(
        blocks[1]["language"], "js",
        "the open fence is a code block: {reply:#}"
    );
    assert_eq!(blocks[1]["code"], "console.log('a fence left open')");
    assert_eq!(reply["cells"].as_array().unwrap().len(), 4, "{reply:#}");

    // The renderer alone, on what a stream shows part-way: an open fence, half a table.
    let partial = browser
        .execute(
            r#"
const render = (text) => { const div = document.createElement("div"); div.append(renderMarkdown(text)); return div; };
const fence = render("Here:\n\n```python\nprint('hi')\nfor i in range(3):");
const halfTable = render("| a | b |\n|---");
const table = render("| a | b |\n|---|---|\n| 1 |");
const tag = render("text <scr");
return {
  fence: fence.querySelector(".code-block pre") ? fence.querySelector(".code-block pre").textContent : null,
  halfTable: halfTable.querySelector("table") !== null,
  table: Array.from(table.querySelectorAll("td"), (e) => e.textContent),
  tag: tag.textContent,
  tagElements: tag.querySelectorAll("*").length,
};
"#,
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(
        partial["fence"], "print('hi')\nfor i in range(3):",
        "{partial:#}"
    );
    assert_eq!(partial["table"], json!(["1", ""]), "{partial:#}");
    assert_eq!(
        partial["tag"].as_str().unwrap().trim(),
        "text <scr",
        "{partial:#}"
    );
    assert_eq!(partial["tagElements"], 1, "only the paragraph: {partial:#}");

    // The sanitiser alone, as if the Markdown renderer let raw HTML through: it still keeps
    // nothing that runs or fetches.
    let sanitised = browser
        .execute(
            r#"
const div = document.createElement("div");
div.append(sanitizeHtml(window.markdownit({ html: true }).render(arguments[0])));
const found = [];
for (const element of div.querySelectorAll("*")) {
  const tag = element.tagName.toLowerCase();
  if (!["p", "br", "strong", "em", "del", "s", "code", "pre", "blockquote", "ul", "ol", "li", "h1", "h2", "h3", "h4", "h5", "h6", "hr", "table", "thead", "tbody", "tr", "th", "td", "a", "div", "span", "button"].includes(tag)) found.push(`element <${tag}>`);
  for (const attribute of element.attributes) {
    if (!["href", "title", "class", "start", "target", "rel", "type"].includes(attribute.name)) found.push(`attribute ${attribute.name}`);
    if (attribute.name === "href" && !/^(https?:|mailto:)/i.test(attribute.value)) found.push(`href ${attribute.value}`);
  }
}
return { found, raw: window.markdownit({ html: true }).render(arguments[0]).includes("<script>"), text: div.textContent };
"#,
            vec![json!(ATTACK_REPLY)],
        )
        .await
        .unwrap();
    assert_eq!(
        sanitised["raw"], true,
        "the renderer alone keeps the script: {sanitised:#}"
    );
    assert_eq!(sanitised["found"], json!([]), "{sanitised:#}");
    assert!(
        sanitised["text"].as_str().unwrap().contains("raw link"),
        "{sanitised:#}"
    );

    // While the model has not answered, the page says it is thinking, with the seconds.
    send(&browser, "slow").await;
    let page = wait_for(&browser, "the thinking indicator", 30, PAGE, |page| {
        page["thinkingSeconds"]
            .as_u64()
            .is_some_and(|seconds| seconds >= 2)
    })
    .await;
    assert!(
        page["thinking"].as_str().unwrap().starts_with("thinking… "),
        "{page:#}"
    );
    gate.open();
    let page = wait_for(&browser, "the slow answer", 30, PAGE, |page| {
        count(&page["assistant"], "Done thinking.") == 1 && page["thinking"].is_null()
    })
    .await;
    assert!(page["thinking"].is_null());

    // Reasoning is shown folded, apart from the answer.
    send(&browser, "reason").await;
    let page = wait_for(&browser, "the reasoned answer", 30, PAGE, |page| {
        count(&page["assistant"], "Checked both.") == 1 && page["stopEnabled"] == false
    })
    .await;
    assert_eq!(
        page["reasoning"],
        json!([{"text": "First the log, then the tests.", "open": false}]),
        "{page:#}"
    );
    assert_eq!(count(&page["assistant"], "First the log"), 0, "{page:#}");

    // A call the turn did not run shows its tool's name and NOT RUN, live.
    send(&browser, "tool").await;
    let page = wait_for(&browser, "the call left not run", 30, PAGE, |page| {
        page["tools"]
            .as_array()
            .is_some_and(|tools| tools.iter().any(|tool| tool["label"] == "not_run"))
            && page["stopEnabled"] == false
    })
    .await;
    let tool = page["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|tool| tool["label"] == "not_run")
        .unwrap()
        .clone();
    assert_eq!(tool["name"], "exec", "{page:#}");
    assert_eq!(tool["badge"], "not run", "{page:#}");
    assert_eq!(tool["args"], r#"{"command":"echo skipped"}"#, "{page:#}");

    // Scrolled up on purpose, new output does not pull the view down; a button offers the way.
    send(&browser, "long").await;
    wait_for(&browser, "the long answer", 30, PAGE, |page| {
        count(&page["assistant"], "Line 80 of a long answer.") == 1
    })
    .await;
    // As a person's scroll: the position, then its event (the browser's own comes later).
    let following = browser
        .execute(
            r#"const m = document.getElementById("messages"); m.scrollTop = 0; m.dispatchEvent(new Event("scroll")); return state.follow;"#,
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(following, false);
    wait_for(&browser, "the scroll up", 10, PAGE, |page| {
        page["scrollTop"] == 0
    })
    .await;
    let session = browser.execute(PAGE, vec![]).await.unwrap()["session"]
        .as_str()
        .unwrap()
        .to_string();
    let (mut other, _) = GatewayClient::connect(addr, TOKEN).await;
    let sent = other
        .request(
            "chat.send",
            json!({"sessionKey": session, "message": "from elsewhere", "idempotencyKey": "e1"}),
        )
        .await;
    other
        .request(
            "agent.wait",
            json!({"runId": sent["payload"]["runId"], "timeoutMs": 20000}),
        )
        .await;
    let page = wait_for(&browser, "the other client's answer", 30, PAGE, |page| {
        count(&page["assistant"], "You said: from elsewhere") == 1
    })
    .await;
    assert_eq!(page["scrollTop"], 0, "{page:#}");
    assert_eq!(page["jumpShown"], true, "{page:#}");
    // A send brings the view to the bottom, and it follows the answer there.
    send(&browser, "after scrolling").await;
    let page = wait_for(&browser, "the answer at the bottom", 30, PAGE, |page| {
        count(&page["assistant"], "You said: after scrolling") == 1
    })
    .await;
    assert!(page["scrollBottomGap"].as_f64().unwrap() < 5.0, "{page:#}");
    assert_eq!(page["jumpShown"], false, "{page:#}");
    let reply = browser.execute(LAST_REPLY, vec![]).await.unwrap();
    assert_eq!(reply["injected"], json!([]), "{reply:#}");

    // After a reload the history is rendered the same way, the attack included.
    browser.refresh().await.unwrap();
    let page = wait_for(&browser, "the history after the reload", 30, PAGE, |page| {
        page["status"] == "connected" && count(&page["assistant"], "You said: after scrolling") == 1
    })
    .await;
    let tool = page["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|tool| tool["label"] == "not_run")
        .unwrap_or_else(|| panic!("the call not run, after the reload: {page:#}"))
        .clone();
    assert_eq!(tool["name"], "exec", "{page:#}");
    assert_eq!(tool["args"], r#"{"command":"echo skipped"}"#, "{page:#}");
    assert_eq!(
        page["reasoning"],
        json!([{"text": "First the log, then the tests.", "open": false}]),
        "{page:#}"
    );
    let scan = browser.execute(SCAN_FOR_INJECTION, vec![]).await.unwrap();
    assert_eq!(scan["injected"], json!([]), "{scan:#}");
    assert_eq!(scan["codeBlocks"], 3, "{scan:#}");
    assert_eq!(scan["tables"], 2, "{scan:#}");
    assert!(
        scan["text"]
            .as_str()
            .unwrap()
            .contains("<script>window.pwned = 1</script>"),
        "{scan:#}"
    );
    browser.close().await.unwrap();
}

/// `GET path` on the gateway: the status line and the headers, lower-cased.
fn http_get_head(addr: SocketAddr, path: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).unwrap();
    let answer = String::from_utf8_lossy(&answer).to_lowercase();
    answer
        .split("\r\n\r\n")
        .next()
        .unwrap_or_default()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_web_chat_fits_a_phone_names_its_sessions_and_asks_again_for_a_wrong_token() {
    let Some((chromium, driver)) = browser_programs(
        "the_web_chat_fits_a_phone_names_its_sessions_and_asks_again_for_a_wrong_token",
    ) else {
        return;
    };
    let server = LlmServer::start_routed(|body| {
        let last = body["messages"].as_array().unwrap().last().unwrap().clone();
        let text = clawcage_tests::llm_server::text_of(&last);
        anthropic::stream(
            &[anthropic::text(&format!(
                "Here is **{text}**, with code:\n\n```sh\nls -la ~/projects/clawcage && cargo test --workspace\n```"
            ))],
            16,
        )
    })
    .await;
    let root = tempfile::tempdir().unwrap();
    let (_gateway, addr) = start_gateway(root.path(), server.url());

    // The icon is served.
    let head = http_get_head(addr, "/favicon.ico");
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(head.contains("content-type: image/svg+xml"), "{head}");

    let (_driver, _profile, browser) = open_browser_sized(&chromium, &driver, (420, 860)).await;

    // A wrong token: the dialog says so, where the person types the right one.
    browser
        .goto(&format!("http://{addr}/#token=wrong-token-0000000000000"))
        .await
        .unwrap();
    let page = wait_for(&browser, "the wrong-token dialog", 30, PAGE, |page| {
        page["tokenPrompt"] == true && page["tokenError"] != ""
    })
    .await;
    assert!(
        page["tokenError"].as_str().unwrap().contains("Wrong token"),
        "{page:#}"
    );
    assert_eq!(page["hash"], "", "{page:#}");
    let field = browser.find(Locator::Id("token-input")).await.unwrap();
    field.send_keys(&format!("{TOKEN}\u{E007}")).await.unwrap();
    let page = wait_for(&browser, "the page to connect", 30, PAGE, |page| {
        page["status"] == "connected"
    })
    .await;
    assert_eq!(page["tokenPrompt"], false, "{page:#}");
    assert_eq!(page["storedToken"], TOKEN, "{page:#}");

    // A fresh page makes no session on the gateway until a message is sent.
    let (mut other, _) = GatewayClient::connect(addr, TOKEN).await;
    assert_eq!(page["draft"], true, "{page:#}");
    assert_eq!(page["title"], "New chat", "{page:#}");
    let webchat_sessions = |listed: &Value| -> Vec<String> {
        listed["payload"]["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|session| session["key"].as_str().unwrap().to_string())
            .filter(|key| key.contains(":webchat:"))
            .collect()
    };
    let listed = other.request("sessions.list", json!({})).await;
    assert_eq!(
        webchat_sessions(&listed),
        Vec::<String>::new(),
        "{listed:#}"
    );

    // A phone-sized window: the sidebar is a drawer, closed at first; the message box keeps
    // its width and nothing is wider than the window.
    let layout = r#"
const rect = (id) => { const r = document.getElementById(id).getBoundingClientRect(); return { left: r.left, right: r.right, width: r.width, height: r.height }; };
return {
  sidebar: rect("sidebar"), input: rect("input"), menu: rect("menu"),
  sidebarVisible: getComputedStyle(document.getElementById("sidebar")).visibility === "visible",
  pageWidth: document.documentElement.scrollWidth,
  windowWidth: window.innerWidth,
};
"#;
    let shape = browser.execute(layout, vec![]).await.unwrap();
    assert_eq!(shape["windowWidth"], 420, "{shape:#}");
    assert_eq!(shape["sidebarVisible"], false, "{shape:#}");
    assert!(
        shape["sidebar"]["right"].as_f64().unwrap() <= 0.0,
        "{shape:#}"
    );
    assert!(
        shape["input"]["width"].as_f64().unwrap() >= 250.0,
        "{shape:#}"
    );
    assert!(
        shape["input"]["height"].as_f64().unwrap() <= 80.0,
        "{shape:#}"
    );
    assert!(shape["menu"]["width"].as_f64().unwrap() > 0.0, "{shape:#}");
    assert!(shape["pageWidth"].as_f64().unwrap() <= 420.0, "{shape:#}");

    // The first message makes the session, titled by that message.
    send(&browser, "Plan the release notes").await;
    let page = wait_for(&browser, "the answer on a phone", 60, PAGE, |page| {
        count(&page["usage"], " in / ") == 1
    })
    .await;
    let first = page["session"].as_str().unwrap().to_string();
    assert_eq!(page["draft"], false, "{page:#}");
    assert_eq!(page["title"], "Plan the release notes", "{page:#}");
    let listed = other.request("sessions.list", json!({})).await;
    assert_eq!(webchat_sessions(&listed), vec![first.clone()], "{listed:#}");
    let reply = browser.execute(LAST_REPLY, vec![]).await.unwrap();
    assert!(reply["bubbleWidth"].as_f64().unwrap() <= 420.0, "{reply:#}");
    assert_eq!(reply["codeScrolls"], true, "{reply:#}");
    let shape = browser.execute(layout, vec![]).await.unwrap();
    assert!(shape["pageWidth"].as_f64().unwrap() <= 420.0, "{shape:#}");
    let screenshot = browser.screenshot().await.unwrap();
    keep_screenshot("webchat-phone.png", &screenshot);

    // The drawer opens with the menu button and lists the session by its title and time.
    browser
        .find(Locator::Id("menu"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let shape = wait_for(&browser, "the drawer to open", 10, layout, |shape| {
        shape["sidebarVisible"] == true && shape["sidebar"]["left"].as_f64().unwrap() >= 0.0
    })
    .await;
    assert!(
        shape["sidebar"]["right"].as_f64().unwrap() <= 420.0,
        "{shape:#}"
    );
    let page = browser.execute(PAGE, vec![]).await.unwrap();
    assert_eq!(
        page["sessions"],
        json!([{"key": first, "title": "Plan the release notes", "meta": "just now", "active": true}]),
        "{page:#}"
    );
    let screenshot = browser.screenshot().await.unwrap();
    std::fs::write(
        repo_target().join("gateway-webchat-phone-drawer.png"),
        screenshot,
    )
    .unwrap();

    // "New chat" (twice) closes the drawer and opens an empty chat the gateway does not know.
    browser
        .find(Locator::Id("new-chat"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_for(&browser, "the drawer to close", 10, layout, |shape| {
        shape["sidebarVisible"] == false
    })
    .await;
    browser
        .find(Locator::Id("menu"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_for(&browser, "the drawer to open again", 10, layout, |shape| {
        shape["sidebarVisible"] == true && shape["sidebar"]["left"].as_f64().unwrap() >= 0.0
    })
    .await;
    browser
        .find(Locator::Id("new-chat"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let page = wait_for(&browser, "the empty new chat", 10, PAGE, |page| {
        page["draft"] == true && page["user"].as_array().is_some_and(Vec::is_empty)
    })
    .await;
    assert_ne!(page["session"], first.as_str(), "{page:#}");
    assert_eq!(page["title"], "New chat", "{page:#}");
    let titles: Vec<&str> = page["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| entry["title"].as_str().unwrap())
        .collect();
    assert_eq!(titles, ["New chat", "Plan the release notes"], "{page:#}");
    let listed = other.request("sessions.list", json!({})).await;
    assert_eq!(webchat_sessions(&listed), vec![first.clone()], "{listed:#}");

    // Back to the first chat from the drawer: its history, its title.
    browser
        .find(Locator::Id("menu"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_for(
        &browser,
        "the drawer to open once more",
        10,
        layout,
        |shape| {
            shape["sidebarVisible"] == true && shape["sidebar"]["left"].as_f64().unwrap() >= 0.0
        },
    )
    .await;
    click_retrying(&browser, &format!("#sessions li[data-key=\"{first}\"]")).await;
    let page = wait_for(&browser, "the first chat again", 30, PAGE, |page| {
        page["user"] == json!(["Plan the release notes"])
    })
    .await;
    assert_eq!(page["title"], "Plan the release notes", "{page:#}");
    assert_eq!(
        count(&page["assistant"], "Here is Plan the release notes"),
        1,
        "{page:#}"
    );

    // Renamed: the gateway keeps the name, a reload shows it.
    browser
        .find(Locator::Id("rename"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let field = browser
        .find(Locator::Css("#session-title input"))
        .await
        .unwrap();
    // The field opens with the title selected: typing replaces it.
    field.send_keys("Release notes, v2\u{E007}").await.unwrap();
    wait_for(&browser, "the new name", 10, PAGE, |page| {
        page["title"] == "Release notes, v2"
    })
    .await;
    let listed = other.request("sessions.list", json!({})).await;
    let named = listed["payload"]["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|session| session["key"] == first.as_str())
        .unwrap()
        .clone();
    assert_eq!(named["title"], "Release notes, v2", "{listed:#}");
    browser.refresh().await.unwrap();
    let page = wait_for(&browser, "the name after a reload", 30, PAGE, |page| {
        page["status"] == "connected" && page["user"] == json!(["Plan the release notes"])
    })
    .await;
    assert_eq!(page["title"], "Release notes, v2", "{page:#}");
    let titles: Vec<&str> = page["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| entry["title"].as_str().unwrap())
        .collect();
    assert_eq!(titles, ["Release notes, v2"], "{page:#}");
    browser.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_web_chat_follows_a_turn_the_restarted_gateway_takes_up() {
    let Some((chromium, driver)) =
        browser_programs("the_web_chat_follows_a_turn_the_restarted_gateway_takes_up")
    else {
        return;
    };
    // The first model call never answers (the gateway is killed during it); the one the
    // restarted gateway makes is answered.
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = calls.clone();
    let server = LlmServer::start_routed(move |_| {
        if counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
            Reply::Hang
        } else {
            anthropic::stream(&[anthropic::text("Taken up again.")], 16)
        }
    })
    .await;
    let root = tempfile::tempdir().unwrap();
    let bind = format!("127.0.0.1:{}", free_port());
    let (gateway, addr) = start_gateway_at(root.path(), server.url(), "", &[], &bind);
    let (_driver, _profile, browser) = open_browser(&chromium, &driver).await;
    connect_page(&browser, addr).await;
    send(&browser, "Summarise the notes").await;
    wait_for(&browser, "the model to be asked", 30, PAGE, |page| {
        page["thinking"].is_string()
    })
    .await;
    server.wait_for_requests(1).await;

    gateway.kill();
    wait_for(&browser, "the page to notice", 30, PAGE, |page| {
        page["status"] == "disconnected"
    })
    .await;
    let (_gateway, again) = start_gateway_at(root.path(), server.url(), "", &[], &bind);
    assert_eq!(again, addr);

    let page = wait_for(&browser, "the turn taken up", 60, PAGE, |page| {
        page["status"] == "connected" && count(&page["assistant"], "Taken up again.") == 1
    })
    .await;
    assert_eq!(page["user"], json!(["Summarise the notes"]), "{page:#}");
    assert_eq!(
        count(&page["notes"], "resumed after a restart"),
        1,
        "{page:#}"
    );
    let page = wait_for(&browser, "the turn to end", 30, PAGE, |page| {
        page["stopEnabled"] == false && page["thinking"].is_null()
    })
    .await;
    assert_eq!(page["assistant"], json!(["Taken up again."]), "{page:#}");
    browser.close().await.unwrap();
}
