//! The hosts of the cluster tests: each with its configuration (a `[cluster]` on the test's
//! nats-server, its own `host_id`, a 2 s lease) and state directory, started as `clawcage
//! gateway` processes on one shared workspace; a standby started in the background (where it
//! relays clients meanwhile, and a client relayed through it), the failover of a killed active
//! host to it, and both hosts stopped.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use clawcage_tests::gateway_client::GatewayClient;
use clawcage_tests::gateway_process::GatewayProcess;
use clawcage_tests::llm_server::{
    LlmServer, ReplyGate, anthropic, last_user, text_of, tool_result_of,
};
use serde_json::json;

pub const TOKEN: &str = "cluster-failover-token";
/// The webhook's signing secret and the variable that holds it.
pub const HOOK_SECRET_ENV: &str = "CLAWCAGE_TEST_HOOK_SECRET";
pub const HOOK_SECRET: &str = "failover-hook-secret-0123456789abcdef";

/// A host of the cluster: its configuration (naming its `host_id`) and state directory.
pub struct Host {
    pub root: tempfile::TempDir,
    pub state: tempfile::TempDir,
}

impl Host {
    pub fn new(nats: &str, model: &str, host_id: &str) -> Host {
        Self::with(nats, model, host_id, "")
    }

    /// A host whose configuration has `extra` sections too.
    pub fn with(nats: &str, model: &str, host_id: &str, extra: &str) -> Host {
        Self::with_cluster(nats, model, host_id, "lease_secs = 2\n", extra)
    }

    /// A host whose `[cluster]` section says `cluster` besides its servers and `host_id` (the
    /// benchmarks keep the default lease), and whose configuration has `extra` sections too.
    pub fn with_cluster(
        nats: &str,
        model: &str,
        host_id: &str,
        cluster: &str,
        extra: &str,
    ) -> Host {
        clawcage_tests::cli_state::warm_components(Path::new(env!("CARGO_BIN_EXE_clawcage")));
        let root = tempfile::tempdir().unwrap();
        std::fs::write(
            root.path().join("clawcage.toml"),
            format!(
                "[provider]\nkind = \"anthropic\"\nmodel = \"claude-test\"\nbase_url = \"{model}\"\nmax_retries = 0\n\n\
                 [cluster]\nnats = \"{nats}\"\nhost_id = \"{host_id}\"\n{cluster}\n{extra}"
            ),
        )
        .unwrap();
        Host {
            root,
            state: clawcage_tests::cli_state::private_state_dir(),
        }
    }

    pub fn command(&self, workspace: &Path, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_clawcage"));
        command
            .arg("--config")
            .arg(self.root.path().join("clawcage.toml"))
            .arg("--state-dir")
            .arg(self.state.path())
            .arg("--workspace")
            .arg(workspace)
            .args(args)
            .env_remove("RUST_LOG")
            .env_remove("CLAWCAGE_GATEWAY_TOKEN")
            .env("ANTHROPIC_API_KEY", "sk-failover-test")
            .env(HOOK_SECRET_ENV, HOOK_SECRET);
        command
    }

    pub fn gateway(&self, workspace: &Path) -> Command {
        self.command(
            workspace,
            &["gateway", "--bind", "127.0.0.1:0", "--token", TOKEN],
        )
    }

    /// This host started as a standby in `workspace` ([`standby_started`]).
    pub async fn standby_relaying(
        &self,
        workspace: &Path,
    ) -> (
        tokio::task::JoinHandle<Result<GatewayProcess, String>>,
        SocketAddr,
    ) {
        standby_started(self.gateway(workspace)).await
    }
}

/// `host` started as a standby in `workspace`: the task ends once it serves.
pub fn standby_of(host: &Host, workspace: &Path) -> tokio::task::JoinHandle<GatewayProcess> {
    let command = host.gateway(workspace);
    tokio::task::spawn_blocking(move || GatewayProcess::start(command))
}

/// Kills `active` with SIGKILL and returns `standby` once it serves in its place.
pub async fn fail_over(
    active: GatewayProcess,
    standby: tokio::task::JoinHandle<GatewayProcess>,
) -> GatewayProcess {
    let said = active.kill();
    assert!(!said.contains("panicked"), "{said}");
    tokio::time::timeout(Duration::from_secs(60), standby)
        .await
        .expect("the standby took over within 60 s")
        .unwrap()
}

/// A model that answers "Answered: <the user's message>", each answer held at `gate` until the
/// test opens it.
pub async fn answering_after(gate: &ReplyGate) -> LlmServer {
    let gate = gate.clone();
    LlmServer::start_routed(move |body| {
        let (text, _) = last_user(body);
        gate.hold(anthropic::message(&[anthropic::text(&format!(
            "Answered: {text}"
        ))]))
    })
    .await
}

/// The standby `command` starts: the task that ends once it serves, and where it accepts
/// clients meanwhile (it relays them to the active host).
pub async fn standby_started(
    command: Command,
) -> (
    tokio::task::JoinHandle<Result<GatewayProcess, String>>,
    SocketAddr,
) {
    let (relay_tx, relay_rx) = std::sync::mpsc::channel();
    let standby = tokio::task::spawn_blocking(move || {
        GatewayProcess::try_start_watching(
            command,
            |_| {},
            move |addr| {
                let _ = relay_tx.send(addr);
            },
        )
    });
    let relay =
        tokio::task::spawn_blocking(move || relay_rx.recv_timeout(Duration::from_secs(180)))
            .await
            .unwrap()
            .expect("the standby says where it accepts clients");
    (standby, relay)
}

/// A client (with `token`) of the standby at `relay`, once it has seen the active host: until
/// then a `connect` there is refused as unavailable.
pub async fn relayed_client(relay: SocketAddr, token: &str) -> GatewayClient {
    for _ in 0..100 {
        match GatewayClient::try_connect(relay, token).await {
            Ok((client, _)) => return client,
            Err(why) => assert!(
                why.contains("UNAVAILABLE") || why.contains("no host"),
                "{why}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the standby did not relay a client within 10 s");
}

/// Stops `active` (it hands over to the standby), then the standby once it serves; both end well.
pub async fn stop_both(
    active: GatewayProcess,
    standby: tokio::task::JoinHandle<Result<GatewayProcess, String>>,
) {
    let (exit, output) = active.terminate();
    assert!(exit.success(), "{output}");
    let standby = tokio::time::timeout(Duration::from_secs(60), standby)
        .await
        .expect("the standby took over within 60 s")
        .unwrap()
        .expect("the standby serves");
    let (exit, output) = standby.terminate();
    assert!(exit.success(), "{output}");
}

/// A model that runs `rm -r DIR` for "remove DIR", then repeats the tool's result.
pub async fn removing_model() -> LlmServer {
    LlmServer::start_routed(|body| {
        let last = body["messages"].as_array().unwrap().last().unwrap().clone();
        if let Some(result) = tool_result_of(&last) {
            return anthropic::message(&[anthropic::text(&format!("RESULT: {result}"))]);
        }
        match text_of(&last).strip_prefix("remove ") {
            Some(dir) => anthropic::message(&[anthropic::tool(
                "t1",
                "exec",
                json!({"command": format!("rm -r {dir}")}),
            )]),
            None => anthropic::message(&[anthropic::text("ok")]),
        }
    })
    .await
}

/// `client` asks `session` to remove `build` in `workspace` (a command the allowlist does not
/// cover); `approver` hears the request, finds it in its `exec.approval.list`, and allows it
/// once: nothing runs before the answer, the
/// run ends `ok` with the directory gone, and a second answer is refused (the first won).
pub async fn approve_a_removal(
    approver: &mut GatewayClient,
    client: &mut GatewayClient,
    session: &str,
    workspace: &Path,
) {
    let sent = client
        .request(
            "chat.send",
            json!({"sessionKey": session, "message": "remove build", "idempotencyKey": "a1"}),
        )
        .await;
    assert_eq!(sent["ok"], true, "{sent}");
    let run_id = sent["payload"]["runId"].as_str().unwrap().to_string();
    let request = approver.event_named("exec.approval.requested").await;
    assert_eq!(request["sessionKey"], session, "{request}");
    assert_eq!(request["summary"], "rm -r build", "{request}");
    assert!(
        workspace.join("build").exists(),
        "nothing runs before the answer"
    );
    let id = request["id"].as_str().unwrap().to_string();
    // The approver's list shows it, whichever host asked.
    let listed = approver.request("exec.approval.list", json!({})).await;
    let waiting: Vec<&str> = listed["payload"]["pending"]
        .as_array()
        .unwrap_or_else(|| panic!("{listed}"))
        .iter()
        .filter_map(|request| request["id"].as_str())
        .collect();
    assert_eq!(waiting, [id.as_str()], "{listed}");
    let answered = approver
        .request(
            "exec.approval.resolve",
            json!({"id": id, "decision": "allow-once"}),
        )
        .await;
    assert_eq!(answered["ok"], true, "{answered}");
    let resolved = approver.event_named("exec.approval.resolved").await;
    assert_eq!(resolved["decision"], "allow-once", "{resolved}");
    let waited = client
        .request("agent.wait", json!({"runId": run_id, "timeoutMs": 60000}))
        .await;
    assert_eq!(waited["payload"]["status"], "ok", "{waited}");
    assert!(
        !workspace.join("build").exists(),
        "the command ran once allowed"
    );
    let again = approver
        .request(
            "exec.approval.resolve",
            json!({"id": id, "decision": "deny"}),
        )
        .await;
    assert_eq!(again["ok"], false, "a second answer is refused: {again}");
}

/// Through `client`, run `run_id` (sent to `session` as `message` under `key`) ended `ok`, its
/// `answer` is in the history once, and the key sent again is a duplicate of that run: a turn
/// that another host resumed ended exactly once.
pub async fn ended_once(
    client: &mut GatewayClient,
    run_id: &str,
    session: &str,
    (message, key, answer): (&str, &str, &str),
) {
    let waited = client
        .request("agent.wait", json!({"runId": run_id, "timeoutMs": 60000}))
        .await;
    assert_eq!(waited["ok"], true, "{waited}");
    assert_eq!(waited["payload"]["status"], "ok", "{waited}");
    let history = client
        .request("chat.history", json!({"sessionKey": session}))
        .await
        .to_string();
    assert_eq!(
        history.matches(answer).count(),
        1,
        "the turn ended once: {history}"
    );
    let again = client
        .request(
            "chat.send",
            json!({"sessionKey": session, "message": message, "idempotencyKey": key}),
        )
        .await;
    assert_eq!(again["payload"]["runId"], run_id, "{again}");
    assert_eq!(again["payload"]["duplicate"], true, "{again}");
}
