//! `[cluster]` and `clawcage cluster status` against a real `nats-server`: the status lists the
//! live hosts, the leases with their holders and the backend's streams and buckets, in words and
//! in JSON; a configuration without `[cluster]` or with a bad one is a usage error naming the key
//! (for every command, since the whole configuration is checked at load); a server that is not
//! there is a failure saying what to check, for the gateway too.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail by panicking"
)]

use std::path::Path;
use std::process::{Command, Output};

use clawcage_cluster::leases::partition_lease;
use clawcage_cluster::{Cluster, ClusterOptions, Holder};
use clawcage_tests::nats::NatsServer;
use serde_json::Value;

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_clawcage"))
}

/// `clawcage ARGS` with `config` as its configuration and a private state directory.
fn clawcage(config: &str, args: &[&str]) -> Output {
    let root = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("clawcage.toml"), config).unwrap();
    let state = clawcage_tests::cli_state::private_state_dir();
    Command::new(binary())
        .arg("--config")
        .arg(root.path().join("clawcage.toml"))
        .arg("--state-dir")
        .arg(state.path())
        .arg("--workspace")
        .arg({
            let workspace = root.path().join("ws");
            std::fs::create_dir_all(&workspace).unwrap();
            workspace
        })
        .args(args)
        .env_remove("RUST_LOG")
        .env("ANTHROPIC_API_KEY", "sk-cluster-test")
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test]
async fn status_lists_hosts_leases_and_streams_in_words_and_json() {
    let Some(server) = NatsServer::start("status_lists_hosts_leases_and_streams") else {
        return;
    };
    // A host of the cluster: announced, holding partition 3's lease.
    let cluster = Cluster::connect(&server.url(), &ClusterOptions::default())
        .await
        .unwrap();
    let leases = cluster
        .leases(Holder {
            host: "gw-a".to_string(),
            incarnation: "gw-a-1".to_string(),
        })
        .await
        .unwrap();
    leases
        .announce(Some("http://10.0.0.1:18789/".to_string()), 1)
        .await
        .unwrap();
    let lease = leases.acquire(&partition_lease(3)).await.unwrap().unwrap();
    let config = format!(
        "[cluster]\nnats = \"{}\"\nhost_id = \"status-test\"\n",
        server.url()
    );

    let output = tokio::task::spawn_blocking({
        let config = config.clone();
        move || clawcage(&config, &["cluster", "status"])
    })
    .await
    .unwrap();
    let stdout = text(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        text(&output.stderr)
    );
    assert!(
        stdout.contains(&format!("cluster at {}", server.url())),
        "{stdout}"
    );
    assert!(stdout.contains("hosts: 1 live"), "{stdout}");
    assert!(
        stdout.contains("gw-a  incarnation gw-a-1  http://10.0.0.1:18789/"),
        "{stdout}"
    );
    assert!(stdout.contains("partitions: 1 of 64 held"), "{stdout}");
    assert!(
        stdout.contains(&format!(
            "part.3  gw-a (gw-a-1)  revision {}",
            lease.epoch()
        )),
        "{stdout}"
    );
    for stream in ["CLAW_EV", "KV_claw_leases", "KV_claw_hosts", "KV_claw_runs"] {
        assert!(
            stdout.contains(&format!("  {stream}  ")),
            "{stream}: {stdout}"
        );
    }

    let output =
        tokio::task::spawn_blocking(move || clawcage(&config, &["cluster", "status", "--json"]))
            .await
            .unwrap();
    assert!(output.status.success(), "{}", text(&output.stderr));
    let status: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(status["partitions"], 64);
    assert_eq!(status["hosts"][0]["holder"]["host"], "gw-a");
    assert_eq!(status["leases"][0][0], "part.3");
    assert_eq!(status["leases"][0][1]["incarnation"], "gw-a-1");
    assert!(status["serverVersion"].as_str().unwrap().starts_with("2."));
    let leases_stream = status["streams"]
        .as_array()
        .unwrap()
        .iter()
        .find(|stream| stream["name"] == "KV_claw_leases")
        .expect("the leases bucket is listed");
    assert_eq!(leases_stream["messages"], 1, "{leases_stream}");
}

#[test]
fn without_or_with_a_bad_cluster_section_commands_say_what_to_fix() {
    let output = clawcage("", &["cluster", "status"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        text(&output.stderr).contains("no [cluster]: add nats = \"nats://HOST:4222\""),
        "{}",
        text(&output.stderr)
    );
    // The whole configuration is checked at load, for every command.
    for args in [&["cluster", "status"][..], &["tools"][..]] {
        let output = clawcage(
            "[cluster]\nnats = \"nats://127.0.0.1:1\"\nreplicas = 9\n",
            args,
        );
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        assert!(
            text(&output.stderr).contains("[cluster] replicas = 9 is out of range"),
            "{args:?}: {}",
            text(&output.stderr)
        );
    }
    let output = clawcage(
        "[cluster]\nnats = \"nats://127.0.0.1:4222\"\nnatz = 1\n",
        &["tools"],
    );
    assert_eq!(output.status.code(), Some(2));
    assert!(
        text(&output.stderr).contains("natz"),
        "{}",
        text(&output.stderr)
    );
}

#[test]
fn an_absent_server_is_a_failure_saying_what_to_check() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let output = clawcage(
        &format!("[cluster]\nnats = \"nats://127.0.0.1:{port}\"\n"),
        &["cluster", "status"],
    );
    assert_eq!(output.status.code(), Some(1));
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains(&format!(
            "cannot connect to the NATS server at nats://127.0.0.1:{port}"
        )) && stderr.contains("check that nats-server runs there"),
        "{stderr}"
    );
}

#[test]
fn a_gateway_whose_cluster_cannot_be_reached_says_what_to_check() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let output = clawcage(
        &format!("[cluster]\nnats = \"nats://127.0.0.1:{port}\"\n"),
        &[
            "gateway",
            "--bind",
            "127.0.0.1:0",
            "--token",
            "a-token-of-enough-length",
        ],
    );
    assert_eq!(output.status.code(), Some(1), "{}", text(&output.stderr));
    assert!(
        text(&output.stderr).contains(&format!(
            "cannot connect to the NATS server at nats://127.0.0.1:{port}"
        )),
        "{}",
        text(&output.stderr)
    );
}
