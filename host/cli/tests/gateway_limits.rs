//! Attacks on `clawcage gateway` before authentication, against a real gateway process on
//! 127.0.0.1: a connection that sends nothing, one that sends its headers a byte a second, an
//! idle keep-alive connection, one that keeps asking forever, and a WebSocket that never sends
//! `connect` are all closed, while an authenticated connection outlives them; a flood of idle
//! connections larger than the gateway's open-file limit does not lock the token holder out (the
//! oldest unauthenticated connection is evicted, logged once); the authenticated connections
//! have a cap of their own that says so. Every wait has a generous deadline; nothing is timed.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail by panicking"
)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use clawcage_tests::gateway_client::{GatewayClient, connect_params};
use clawcage_tests::gateway_process::GatewayProcess;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

const TOKEN: &str = "gateway-limits-token-0123456789";

/// The secret of the `ops` webhook (no request here is signed with it).
const HOOK_SECRET_ENV: &str = "CLAWCAGE_LIMITS_TEST_HOOK_SECRET";

/// Far longer than any timeout the tests give the gateway: a connection still open after this
/// was not going to be closed.
const DEADLINE: Duration = Duration::from_secs(40);

/// A state directory (sharing the CLI tests' compiled components), workspace and configuration.
struct Setup {
    _root: tempfile::TempDir,
    state: PathBuf,
    workspace: PathBuf,
    config: PathBuf,
}

impl Setup {
    /// With `extra` appended to the configuration.
    fn new(extra: &str) -> Setup {
        let binary = Path::new(env!("CARGO_BIN_EXE_clawcage"));
        clawcage_tests::cli_state::warm_components(binary);
        let cache = clawcage_tests::cli_state::shared_state_dir().join("cache");
        let root = tempfile::tempdir().unwrap();
        let state = root.path().join("state");
        let workspace = root.path().join("ws");
        std::fs::create_dir_all(&state).unwrap();
        std::fs::create_dir_all(&workspace).unwrap();
        std::fs::create_dir_all(&cache).unwrap();
        std::os::unix::fs::symlink(&cache, state.join("cache")).unwrap();
        let config = root.path().join("clawcage.toml");
        // No turn runs here: the provider is never asked.
        std::fs::write(
            &config,
            format!("[provider]\nkind = \"anthropic\"\nmodel = \"claude-test\"\nbase_url = \"http://127.0.0.1:9\"\nmax_retries = 0\n\n[subagents]\nenabled = false\n\n{extra}"),
        )
        .unwrap();
        Setup {
            _root: root,
            state,
            workspace,
            config,
        }
    }

    /// `clawcage gateway` with `extra` arguments, under an open-file limit of `open_files`
    /// (soft and hard, so it cannot raise it) when given.
    fn start(&self, open_files: Option<u32>, extra: &[&str]) -> GatewayProcess {
        let binary = env!("CARGO_BIN_EXE_clawcage");
        let mut command = match open_files {
            Some(limit) => {
                let mut command = Command::new("sh");
                command.args([
                    "-c",
                    &format!("ulimit -n {limit} && exec \"$0\" \"$@\""),
                    binary,
                ]);
                command
            }
            None => Command::new(binary),
        };
        command
            .arg("--config")
            .arg(&self.config)
            .arg("--state-dir")
            .arg(&self.state)
            .arg("--workspace")
            .arg(&self.workspace)
            .args(["gateway", "--bind", "127.0.0.1:0", "--token", TOKEN])
            .args(extra)
            .env_remove("RUST_LOG")
            .env_remove("OPENAI_API_KEY")
            .env_remove("CLAWCAGE_GATEWAY_TOKEN")
            .env("ANTHROPIC_API_KEY", "sk-gateway-limits-test")
            .env(HOOK_SECRET_ENV, "hook-secret-0123456789abcdef");
        GatewayProcess::start(command)
    }
}

/// Connects with the token, within the deadline (a gateway out of descriptors never answers).
async fn owner(addr: SocketAddr) -> GatewayClient {
    tokio::time::timeout(DEADLINE, GatewayClient::connect(addr, TOKEN))
        .await
        .expect("the token holder connects and gets hello-ok")
        .0
}

fn health_ok(response: &Value) {
    assert_eq!(response["ok"], true, "{response}");
}

/// Whether the gateway closes `stream` within the deadline; whatever it sends is read and
/// dropped. Every `tick`, `trickle` (if any) sends its next byte; a failed write is a close.
async fn closed_by_gateway(mut stream: TcpStream, mut trickle: Option<&[u8]>) -> bool {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut buffer = [0u8; 4096];
    loop {
        tokio::select! {
            read = stream.read(&mut buffer) => match read {
                Ok(0) | Err(_) => return true,
                Ok(_) => {}
            },
            _ = tick.tick(), if trickle.is_some_and(|bytes| !bytes.is_empty()) => {
                let bytes = trickle.unwrap_or_default();
                if stream.write_all(&bytes[..1]).await.is_err() {
                    return true;
                }
                trickle = Some(&bytes[1..]);
            }
            () = tokio::time::sleep_until(deadline) => return false,
        }
    }
}

/// The number of `streams` the gateway has not closed (a read would block).
fn still_open(streams: &[TcpStream]) -> usize {
    let mut buffer = [0u8; 512];
    streams
        .iter()
        .filter(|stream| {
            loop {
                match stream.try_read(&mut buffer) {
                    Ok(0) => break false,
                    Ok(_) => continue,
                    Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => break true,
                    Err(_) => break false,
                }
            }
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthenticated_connections_are_closed_and_authenticated_ones_are_not() {
    let setup = Setup::new(&format!(
        "[channels.webhooks.ops]\nsecret_env = \"{HOOK_SECRET_ENV}\"\nreply_url = \"http://127.0.0.1:9/reply\"\n"
    ));
    let gateway = setup.start(None, &["--unauthenticated-timeout", "2"]);
    let addr = gateway.addr;
    let mut authenticated = owner(addr).await;

    let silent = tokio::spawn(async move {
        closed_by_gateway(TcpStream::connect(addr).await.unwrap(), None).await
    });
    // Slowloris: a header line that never ends, one byte a second.
    let slow = tokio::spawn(async move {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            .await
            .unwrap();
        closed_by_gateway(stream, Some(&[b'a'; 600])).await
    });
    // A keep-alive connection idle after its answer.
    let idle = tokio::spawn(async move {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            .await
            .unwrap();
        let mut answer = [0u8; 16];
        stream.read_exact(&mut answer).await.unwrap();
        assert!(answer.starts_with(b"HTTP/1.1 200"), "{answer:?}");
        closed_by_gateway(stream, None).await
    });
    // A keep-alive connection that asks again and again, each request on time, for longer
    // than the deadline: it is shut down once it has lived its time.
    let busy = tokio::spawn(async move {
        const REQUEST: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
        let (mut reader, mut writer) = TcpStream::connect(addr).await.unwrap().into_split();
        let writing = tokio::spawn(async move {
            for _ in 0..2 * DEADLINE.as_secs() + 20 {
                if writer.write_all(REQUEST).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        });
        let mut buffer = [0u8; 4096];
        let deadline = tokio::time::Instant::now() + DEADLINE;
        let closed = loop {
            match tokio::time::timeout_at(deadline, reader.read(&mut buffer)).await {
                Ok(Ok(0) | Err(_)) => break true,
                Ok(Ok(_)) => {}
                Err(_) => break false,
            }
        };
        writing.abort();
        closed
    });
    // A webhook request whose body comes a byte a second: answered 408, then closed.
    let slow_body = tokio::spawn(async move {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(
                b"POST /hooks/ops HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{",
            )
            .await
            .unwrap();
        let (mut reader, mut writer) = stream.into_split();
        let writing = tokio::spawn(async move {
            for _ in 0..2 * DEADLINE.as_secs() {
                if writer.write_all(b" ").await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        let mut answer = Vec::new();
        let read = tokio::time::timeout(DEADLINE, reader.read_to_end(&mut answer)).await;
        writing.abort();
        (read.is_ok(), String::from_utf8_lossy(&answer).into_owned())
    });
    // A WebSocket that never sends connect.
    let (mut mute, challenge) = GatewayClient::open(addr, None).await.unwrap();
    assert_eq!(challenge["event"], "connect.challenge", "{challenge}");
    let (_, closed) = mute.until_closed().await;
    assert_eq!(closed.code, 1008, "{closed:?}");
    assert!(closed.reason.contains("handshake timeout"), "{closed:?}");

    assert!(silent.await.unwrap(), "a silent connection stays open");
    assert!(slow.await.unwrap(), "a byte-a-second request stays open");
    assert!(
        idle.await.unwrap(),
        "an idle keep-alive connection stays open"
    );
    assert!(
        busy.await.unwrap(),
        "a connection that keeps asking stays open forever"
    );
    let (closed, answer) = slow_body.await.unwrap();
    assert!(
        closed,
        "a webhook body that trickles in stays open: {answer}"
    );
    assert!(
        answer.starts_with("HTTP/1.1 408") && answer.contains("did not arrive within 2 s"),
        "{answer}"
    );

    // The token holder's connection has outlived all of them, idle the whole time.
    health_ok(&authenticated.request("health", json!({})).await);
    let (status, _) = gateway.terminate();
    assert!(status.success(), "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_idle_connections_does_not_lock_the_token_holder_out() {
    const OPEN_FILES: u32 = 512;
    const FLOOD: usize = 700;
    let setup = Setup::new("");
    // Timeouts long enough that only the cap, not a timeout, can make room during the test.
    let gateway = setup.start(Some(OPEN_FILES), &["--unauthenticated-timeout", "120"]);
    let addr = gateway.addr;
    // The connections of the limit and more, half of them WebSockets waiting with no connect.
    let mut flood = Vec::new();
    let mut sockets = Vec::new();
    for index in 0..FLOOD {
        if index % 20 == 0 {
            let (socket, _) = tokio::time::timeout(DEADLINE, GatewayClient::open(addr, None))
                .await
                .expect("the gateway keeps accepting")
                .unwrap();
            sockets.push(socket);
        } else {
            flood.push(TcpStream::connect(addr).await.unwrap());
        }
    }

    let mut first = owner(addr).await;
    health_ok(&first.request("health", json!({})).await);
    // Again, as a reconnect would, with the flood still there.
    let mut second = owner(addr).await;
    health_ok(&second.request("health", json!({})).await);

    // The gateway holds at most its cap of them: (512 - 128) / 4 = 96.
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let open = still_open(&flood);
        if open <= 96 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{open} of {} idle connections are still open",
            flood.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The evictions are logged, once.
    let warning =
        "connection cap reached: the gateway holds its cap of 96 unauthenticated connections";
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while !gateway.output().contains(warning) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no warning: {}",
            gateway.output()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    health_ok(&first.request("health", json!({})).await);
    let output = gateway.output();
    assert_eq!(
        output.matches("connection cap reached").count(),
        1,
        "{output}"
    );
    assert!(
        output.contains("closed the oldest, from 127.0.0.1:"),
        "{output}"
    );
    drop(sockets);
    drop(flood);
    let (status, _) = gateway.terminate();
    assert!(status.success(), "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authenticated_connections_have_a_cap_of_their_own_that_says_so() {
    let setup = Setup::new("");
    let gateway = setup.start(
        None,
        &["--max-connections", "6", "--max-unauthenticated", "2"],
    );
    let addr = gateway.addr;
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(owner(addr).await);
    }
    let (mut fifth, _) = GatewayClient::open(addr, None).await.unwrap();
    let refused = fifth.request("connect", connect_params(TOKEN)).await;
    assert_eq!(refused["error"]["code"], "UNAVAILABLE", "{refused}");
    let message = refused["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("too many connections"), "{message}");
    assert!(message.contains("--max-connections"), "{message}");
    let (_, closed) = fifth.until_closed().await;
    assert_eq!(closed.code, 1008, "{closed:?}");

    // One closes: there is room again (once the gateway has seen it go).
    clients.pop().unwrap().close().await;
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let (mut again, _) = GatewayClient::open(addr, None).await.unwrap();
        let answer = again.request("connect", connect_params(TOKEN)).await;
        if answer["ok"] == true {
            health_ok(&again.request("health", json!({})).await);
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{answer}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for client in &mut clients {
        health_ok(&client.request("health", json!({})).await);
    }
    let output = gateway.output();
    assert_eq!(
        output.matches("connection cap reached").count(),
        1,
        "{output}"
    );
    assert!(
        output.contains("4 authenticated connections are open"),
        "{output}"
    );
    let (status, _) = gateway.terminate();
    assert!(status.success(), "{status:?}");
}
