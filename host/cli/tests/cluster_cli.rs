//! `[cluster]` and `clawcage cluster status` against a real `nats-server`: the status lists the
//! live hosts, the leases with their holders, the inputs waiting per partition (with the host
//! that serves it) and the backend's streams and buckets, in words and in JSON; a configuration without `[cluster]` or with a bad one is a usage error naming the key
//! (for every command, since the whole configuration is checked at load); a server that is not
//! there is a failure saying what to check, for the gateway too.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail by panicking"
)]

use std::path::Path;
use std::process::{Command, Output};

use clawcage_agent::LaneInbox as _;
use clawcage_agent::inbox::InputRecord;
use clawcage_agent::session::queue::QueuedJob;
use clawcage_cluster::leases::{partition_lease, partition_of};
use clawcage_cluster::{Claims, Cluster, ClusterOptions, Holder, JetStreamInbox};
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
    // Inputs taken and not done: two in one session, one in another; a third session's input
    // is done, so it waits for nothing.
    let (url, sessions) = (
        server.url(),
        ["agent:main:lag:a", "agent:main:lag:b", "agent:main:lag:c"],
    );
    tokio::task::spawn_blocking(move || {
        let inbox = JetStreamInbox::connect(
            &url,
            &ClusterOptions::default(),
            Holder {
                host: "gw-a".to_string(),
                incarnation: "gw-a-1".to_string(),
            },
            Claims::CoveredByCaller,
        )
        .unwrap();
        for (session, id) in [(0, "i1"), (0, "i2"), (1, "i3"), (2, "i4")] {
            let record = InputRecord {
                id: id.to_string(),
                at_ms: 1_000,
                idempotency: None,
                job: QueuedJob::Reset,
                stop_requested: false,
            };
            inbox.append(sessions[session], &record).unwrap();
        }
        inbox
            .done(
                sessions[2],
                &["i4".to_string()],
                clawcage_agent::inbox::InputStatus::Ok,
            )
            .unwrap();
    })
    .await
    .unwrap();
    let (part_a, part_b) = (partition_of(sessions[0]), partition_of(sessions[1]));
    assert_ne!(
        part_a, part_b,
        "the two sessions were picked in different partitions"
    );
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
        stdout.contains("lag: 3 inputs not done, in 2 partitions"),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "  part.{part_a}  2 pending in 1 sessions  oldest "
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "  part.{part_b}  1 pending in 1 sessions  oldest "
        )),
        "{stdout}"
    );
    // Nobody holds those partitions' leases, nor the gateway lease.
    assert!(stdout.contains("served by nobody"), "{stdout}");
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
    let lag = status["lag"].as_array().unwrap();
    assert_eq!(lag.len(), 2, "{lag:?}");
    let of = |partition: u32| {
        lag.iter()
            .find(|entry| entry["partition"] == partition)
            .unwrap_or_else(|| panic!("partition {partition} in {lag:?}"))
            .clone()
    };
    assert_eq!(of(part_a)["pending"], 2);
    assert_eq!(of(part_a)["oldestMs"], 1_000);
    assert_eq!(of(part_b)["pending"], 1);
    assert_eq!(of(part_b)["sessions"], 1);
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

/// With `[cluster]`, `clawcage pairing` changes the pairings every gateway host shares: a code a
/// host issued (here, straight into the cluster's record) is approved from the command line, and
/// the approval is what every host then reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pairing_approves_a_code_in_the_clusters_shared_pairings() {
    let Some(server) = NatsServer::start("pairing_in_the_cluster") else {
        return;
    };
    let url = server.url();
    let store = tokio::task::spawn_blocking(move || {
        let records =
            clawcage_cluster::KvRecords::connect(&url, &ClusterOptions::default()).unwrap();
        clawcage_gateway::channels::pairing::PairingStore::in_store(std::sync::Arc::new(
            records.record(clawcage_cluster::records::PAIRING_RECORD),
        ))
    })
    .await
    .unwrap();
    let clawcage_gateway::channels::pairing::CodeRequest::Issued(code) =
        store.request("telegram", "4242", "Grace").unwrap()
    else {
        panic!("a code is issued");
    };
    let config = format!(
        "[cluster]\nnats = \"{}\"\nhost_id = \"pairing-test\"\n",
        server.url()
    );
    let listed = {
        let config = config.clone();
        tokio::task::spawn_blocking(move || clawcage(&config, &["pairing", "list"]))
            .await
            .unwrap()
    };
    assert!(listed.status.success(), "{}", text(&listed.stderr));
    assert!(
        text(&listed.stdout).contains("telegram:4242"),
        "{}",
        text(&listed.stdout)
    );
    let approved = tokio::task::spawn_blocking({
        let code = code.clone();
        move || clawcage(&config, &["pairing", "approve", &code])
    })
    .await
    .unwrap();
    assert!(approved.status.success(), "{}", text(&approved.stderr));
    assert!(store.is_approved("telegram", "4242").unwrap());
}
