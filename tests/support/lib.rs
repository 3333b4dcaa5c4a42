//! Shared helpers for clawcage's integration tests and benchmarks: one sandbox per process with
//! one compiled-artifact cache shared by every test run, temporary workspaces, registries built
//! from the real bundled and fixture components, a scripted LLM server ([`llm_server`]) speaking
//! the Anthropic and OpenAI wire formats on 127.0.0.1, (in [`web`]) a scripted HTTP server on
//! loopback, a test name resolver and a capture of the tracing output, and the other languages'
//! [`toolchains`], a WebSocket client of the gateway protocol ([`gateway_client`]), a gateway
//! process ([`gateway_process`]), the state the command-line tests share ([`cli_state`]), a real
//! OCI registry with the tools that push to it and read it back ([`registry`]) and a misbehaving
//! one ([`fake_registry`]).

#![allow(
    clippy::expect_used,
    reason = "test helpers fail the test by panicking"
)]

pub mod bench;
pub mod channels;
pub mod cli_state;
pub mod fake_registry;
pub mod gateway_client;
pub mod gateway_process;
pub mod host_tools;
pub mod installed;
pub mod llm_server;
pub mod nats;
pub mod outside;
pub mod registry;
pub mod seeded;
pub mod toolchains;
pub mod web;

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use clawcage_agent::ToolRegistry;
use clawcage_sandbox::{
    ArtifactCache, ComponentCode, ExecGrant, FsMode, Grants, Limits, ProgramCatalog, Sandbox,
    SandboxOptions, WorkspaceGrant, components,
};
use tokio::sync::OnceCell;

/// The compiled-artifact cache every test and benchmark shares, under the build's target dir.
pub fn cache_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("target")
        .join("clawcage-test-cache")
}

/// One sandbox for the whole test process (its engine reserves address space for its pool).
pub fn sandbox() -> Arc<Sandbox> {
    static SANDBOX: OnceLock<Arc<Sandbox>> = OnceLock::new();
    SANDBOX
        .get_or_init(|| {
            Sandbox::new(SandboxOptions::new(ArtifactCache::in_dir(cache_dir())))
                .expect("the test sandbox starts")
        })
        .clone()
}

/// A grant of `dir` in `mode` with `limits`.
pub fn grants(dir: &Path, mode: FsMode, limits: Limits) -> Grants {
    Grants::workspace(WorkspaceGrant::new(dir, mode).expect("the test workspace exists"))
        .with_limits(limits)
}

/// A registry with the bundled file tools granted `dir` in `mode`.
pub async fn file_registry(dir: &Path, mode: FsMode) -> ToolRegistry {
    registry_of(
        &[("file", components::bundled::FILE)],
        grants(dir, mode, Limits::default()),
    )
    .await
}

/// The bundled programs, compiled once per test process.
pub async fn programs() -> ProgramCatalog {
    static PROGRAMS: OnceCell<ProgramCatalog> = OnceCell::const_new();
    PROGRAMS
        .get_or_init(|| async {
            sandbox()
                .programs(None)
                .await
                .expect("the bundled programs load")
        })
        .await
        .clone()
}

/// A registry with the exec tool granted `dir` in `mode` with `limits` and the bundled programs.
pub async fn exec_registry_with(dir: &Path, mode: FsMode, limits: Limits) -> ToolRegistry {
    let grants = grants(dir, mode, limits).with_exec(ExecGrant::new(programs().await));
    registry_of(&[("exec", components::bundled::EXEC)], grants).await
}

/// A registry with the exec tool granted `dir` in `mode`, default limits.
pub async fn exec_registry(dir: &Path, mode: FsMode) -> ToolRegistry {
    exec_registry_with(dir, mode, Limits::default()).await
}

/// A registry with the given components, all under `grants`.
/// (A slice mixing bundled components and bytes names them as [`ComponentCode`]s.)
pub async fn registry_of<'a, C>(components: &[(&str, C)], grants: Grants) -> ToolRegistry
where
    C: Into<ComponentCode<'a>> + Copy,
{
    let sandbox = sandbox();
    let mut registry = ToolRegistry::new();
    for (name, code) in components {
        let loaded = sandbox
            .load(name, &format!("test:{name}"), *code, grants.clone())
            .await
            .unwrap_or_else(|error| panic!("loading {name}: {error}"));
        for tool in loaded.into_tools() {
            registry
                .register(Arc::new(tool))
                .expect("unique tool names");
        }
    }
    registry
}

/// The bytes of a fixture component built for the tests.
pub fn fixture(path: &str) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|error| panic!("reading fixture {path}: {error}"))
}

/// Every regular file beneath `roots` with its bytes (symbolic links are not followed, so a
/// state directory's link to the shared component cache is not searched): what a test that
/// no secret reaches the disk reads.
pub fn files_beneath(roots: &[&Path]) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files = Vec::new();
    let mut stack: Vec<PathBuf> = roots.iter().map(|root| root.to_path_buf()).collect();
    while let Some(dir) = stack.pop() {
        let entries = std::fs::read_dir(&dir)
            .unwrap_or_else(|error| panic!("reading {}: {error}", dir.display()));
        for entry in entries.flatten() {
            let kind = entry.file_type().expect("a file type");
            if kind.is_dir() {
                stack.push(entry.path());
            } else if kind.is_file() {
                let bytes = std::fs::read(entry.path())
                    .unwrap_or_else(|error| panic!("reading {}: {error}", entry.path().display()));
                files.push((entry.path(), bytes));
            }
        }
    }
    files
}

/// A workspace `ws/` (holding `inside.txt`) inside a temporary directory that also holds
/// `secret.txt` next to it: what an escape would reach.
pub struct SecretLayout {
    _root: tempfile::TempDir,
    /// The directory granted to the tools.
    pub workspace: PathBuf,
    /// The host file outside it.
    pub secret: PathBuf,
}

impl SecretLayout {
    /// The layout with `secret` as the secret file's content.
    pub fn new(secret: &str) -> SecretLayout {
        let root = tempfile::tempdir().expect("a temporary directory");
        let workspace = root.path().join("ws");
        std::fs::create_dir(&workspace).expect("the workspace");
        let secret_path = root.path().join("secret.txt");
        std::fs::write(&secret_path, secret).expect("the secret file");
        std::fs::write(workspace.join("inside.txt"), "inside").expect("a file inside");
        SecretLayout {
            _root: root,
            workspace,
            secret: secret_path,
        }
    }
}

/// An operator that answers the next requests of `broker` with `decisions`, in order, and
/// returns what each request was (its tool and its plan's command line). Ends early, with what
/// it saw, when the broker is gone.
pub fn answer_in_order(
    broker: &clawcage_agent::approvals::ApprovalBroker,
    decisions: Vec<clawcage_core::approval::ApprovalDecision>,
) -> tokio::task::JoinHandle<Vec<(String, String)>> {
    use clawcage_agent::approvals::{OperatorEvent, OperatorFilter};
    let mut operator = broker.operator(OperatorFilter::All);
    tokio::spawn(async move {
        let mut asked = Vec::new();
        for decision in decisions {
            loop {
                match operator.next().await {
                    Some(OperatorEvent::Requested(request)) => {
                        asked.push((request.tool.clone(), request.plan.command.clone()));
                        operator
                            .resolve(&request.id, decision, "test")
                            .expect("the request waits");
                        break;
                    }
                    Some(_) => continue,
                    None => return asked,
                }
            }
        }
        asked
    })
}
