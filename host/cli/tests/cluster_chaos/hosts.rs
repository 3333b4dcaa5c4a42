//! The chaos suite's gateway hosts: each host's configuration (the cluster's servers, its id, a
//! 3 s lease, the queue modes by channel) and state directory, and its start in a thread of its
//! own, which notes its process id while it waits as a standby and where it accepts clients.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail by panicking"
)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, mpsc};

use clawcage_tests::gateway_process::GatewayProcess;

use super::workload::QUEUE_CONFIG;
use super::{HOSTS, TOKEN, lock};

/// One host's configuration and state directory.
pub(super) struct Host {
    pub(super) config: PathBuf,
    pub(super) state: tempfile::TempDir,
    _root: tempfile::TempDir,
}

/// Host `id` of the cluster at `nats`, its `[cluster]` saying `cluster` too (`serve = …`).
pub(super) fn host(nats: &str, model: &str, id: &str, replicas: usize, cluster: &str) -> Host {
    let root = tempfile::tempdir().unwrap();
    let config = root.path().join("clawcage.toml");
    std::fs::write(
        &config,
        format!(
            "[provider]\nkind = \"anthropic\"\nmodel = \"claude-test\"\nbase_url = \"{model}\"\nmax_retries = 0\n\n\
             {QUEUE_CONFIG}\n\
             [cluster]\nnats = \"{nats}\"\nhost_id = \"{id}\"\nlease_secs = 3\nreplicas = {replicas}\n{cluster}"
        ),
    )
    .unwrap();
    Host {
        config,
        state: clawcage_tests::cli_state::private_state_dir(),
        _root: root,
    }
}

/// Where a host's start reports: the host serving, or why it stopped before it served.
pub(super) type Serving = mpsc::Sender<Result<(usize, GatewayProcess), String>>;

/// `clawcage` with host `index`'s configuration and state directory.
pub(super) fn clawcage(hosts: &[Host], index: usize, workspace: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_clawcage"));
    command
        .arg("--config")
        .arg(&hosts[index].config)
        .arg("--state-dir")
        .arg(hosts[index].state.path())
        .arg("--workspace")
        .arg(workspace);
    command
}

/// The process id of each host while it waits as a standby (to kill it there).
pub(super) type Standbys = Arc<Mutex<[Option<u32>; HOSTS.len()]>>;

/// Where each host accepts clients (from its start: a standby relays them to the active host).
pub(super) type Addresses = Arc<Mutex<[Option<std::net::SocketAddr>; HOSTS.len()]>>;

/// Starts host `index` in a thread of its own; it reports on `serving` once it serves (a
/// standby waits until then, its process id in `standbys`).
/// Where it accepts clients goes into `addresses`.
pub(super) fn start(
    hosts: &[Host],
    index: usize,
    workspace: &Path,
    serving: &Serving,
    standbys: &Standbys,
    addresses: &Addresses,
) {
    let mut command = clawcage(hosts, index, workspace);
    command
        .args(["gateway", "--bind", "127.0.0.1:0", "--token", TOKEN])
        .args(["--sends-per-minute", "10000"])
        .env_remove("RUST_LOG")
        .env_remove("CLAWCAGE_GATEWAY_TOKEN")
        .env("ANTHROPIC_API_KEY", "sk-chaos-test");
    let (serving, standbys, addresses) = (serving.clone(), standbys.clone(), addresses.clone());
    std::thread::spawn(move || {
        let mut mine = None;
        let started = GatewayProcess::try_start_watching(
            command,
            |pid| {
                mine = Some(pid);
                lock(&standbys)[index] = Some(pid);
            },
            |addr| lock(&addresses)[index] = Some(addr),
        );
        // Serving or gone: no longer a standby (unless the host was started again meanwhile).
        let mut slots = lock(&standbys);
        if slots[index] == mine {
            slots[index] = None;
        }
        drop(slots);
        // A standby still waiting when its run ends stops with its cluster (nobody listens).
        let _ = serving.send(started.map(|process| (index, process)));
    });
}
