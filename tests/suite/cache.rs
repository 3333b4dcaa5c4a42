//! The compiled-artifact cache: the first load compiles and stores, a new engine with the same
//! cache directory loads without compiling, and a damaged entry is replaced instead of trusted.
//! Entries are sealed with the cache's own key: a valid artifact of another component moved
//! under a key, a changed byte, a changed description or an entry from another cache is never
//! run or believed.

use clawcage_sandbox::components::bundled;
use clawcage_sandbox::{ArtifactCache, CacheOutcome, Grants, Sandbox, SandboxOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_start_loads_from_the_cache_and_a_damaged_entry_is_recompiled() {
    let dir = tempfile::tempdir().unwrap();
    let options = SandboxOptions::new(ArtifactCache::in_dir(dir.path()));
    let workspace = tempfile::tempdir().unwrap();
    std::fs::write(workspace.path().join("a.txt"), "cached").unwrap();
    let grants = clawcage_tests::grants(
        workspace.path(),
        clawcage_sandbox::FsMode::ReadOnly,
        clawcage_sandbox::Limits::default(),
    );
    let read = |loaded: &clawcage_sandbox::LoadedComponent| {
        let tool = loaded
            .tools()
            .iter()
            .find(|tool| clawcage_core::Tool::spec(*tool).name == "read_file")
            .unwrap()
            .clone();
        async move { tool.call_json(r#"{"path":"a.txt"}"#).await.unwrap().text }
    };

    let first = Sandbox::new(options.clone()).unwrap();
    let loaded = first
        .load("file", "bundled:file", bundled::FILE, grants.clone())
        .await
        .unwrap();
    assert_eq!(loaded.cache_outcome(), CacheOutcome::Compiled);
    let mut entries: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    let key = ArtifactCache::key(first.engine(), &bundled::FILE.bytes().unwrap());
    assert_eq!(
        ArtifactCache::key_for_digest(first.engine(), bundled::FILE.sha256()),
        key,
        "the build-time digest gives the same key as hashing the bytes"
    );
    assert_eq!(
        entries,
        [
            dir.path().join(format!("{key}.cwasm")),
            dir.path().join(format!("{key}.describe.json")),
            dir.path().join("seal.key"),
        ],
        "the artifact, its description and the cache's key, no temporary files"
    );
    assert!(read(&loaded).await.contains("cached"));
    drop(loaded);
    drop(first);

    // A new process knows the tools from the description alone: nothing is compiled or even
    // loaded until a tool is called.
    let second = Sandbox::new(options.clone()).unwrap();
    assert!(!second.needs_compile(bundled::FILE));
    let loaded = second
        .load("file", "bundled:file", bundled::FILE, grants.clone())
        .await
        .unwrap();
    assert_eq!(loaded.cache_outcome(), CacheOutcome::Hit);
    assert_eq!(loaded.tools().len(), 4);
    assert!(
        !loaded.is_loaded(),
        "no code is loaded before the first call"
    );
    assert!(read(&loaded).await.contains("cached"));
    assert!(loaded.is_loaded());
    drop(loaded);
    drop(second);

    // A damaged artifact is not trusted: the first call compiles again and replaces it.
    std::fs::write(&entries[0], b"not a compiled component").unwrap();
    let third = Sandbox::new(options.clone()).unwrap();
    let loaded = third
        .load("file", "bundled:file", bundled::FILE, grants.clone())
        .await
        .unwrap();
    assert!(read(&loaded).await.contains("cached"));
    assert!(
        std::fs::read(&entries[0]).unwrap().len() > 1000,
        "the damaged entry was replaced"
    );
    drop(loaded);
    drop(third);

    // A damaged description is learnt again.
    std::fs::write(&entries[1], b"{").unwrap();
    let fourth = Sandbox::new(options).unwrap();
    let loaded = fourth
        .load("file", "bundled:file", bundled::FILE, grants)
        .await
        .unwrap();
    assert_eq!(loaded.tools().len(), 4);
    assert!(
        std::fs::read_to_string(&entries[1])
            .unwrap()
            .contains("read_file")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_that_are_not_a_component_are_refused_with_a_clear_error() {
    let sandbox = clawcage_tests::sandbox();
    let error = sandbox
        .load(
            "junk",
            "test:junk",
            b"\0asm definitely not valid",
            Grants::none(),
        )
        .await
        .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("component `junk` could not be compiled"),
        "{error}"
    );
}

/// A sandbox on the cache in `dir`, and the file component loaded in it under `grants`.
async fn file_component(
    dir: &std::path::Path,
    grants: &Grants,
) -> (
    std::sync::Arc<Sandbox>,
    clawcage_sandbox::LoadedComponent,
    String,
) {
    let sandbox = Sandbox::new(SandboxOptions::new(ArtifactCache::in_dir(dir))).unwrap();
    let loaded = sandbox
        .load("file", "bundled:file", bundled::FILE, grants.clone())
        .await
        .unwrap();
    let key = ArtifactCache::key(sandbox.engine(), &bundled::FILE.bytes().unwrap());
    (sandbox, loaded, key)
}

/// A workspace whose `a.txt` says "the real file tool", and its read-only grant.
fn real_file_tool_workspace() -> (tempfile::TempDir, Grants) {
    let workspace = tempfile::tempdir().unwrap();
    std::fs::write(workspace.path().join("a.txt"), "the real file tool").unwrap();
    let grants = clawcage_tests::grants(
        workspace.path(),
        clawcage_sandbox::FsMode::ReadOnly,
        clawcage_sandbox::Limits::default(),
    );
    (workspace, grants)
}

/// What `read_file` of `a.txt` answers, or its error.
async fn read_a(loaded: &clawcage_sandbox::LoadedComponent) -> String {
    let tool = loaded
        .tools()
        .iter()
        .find(|tool| clawcage_core::Tool::spec(*tool).name == "read_file")
        .expect("the component offers read_file")
        .clone();
    match tool.call_json(r#"{"path":"a.txt"}"#).await {
        Ok(output) => output.text,
        Err(error) => format!("error: {error}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_the_cache_did_not_seal_is_never_run_or_believed() {
    let dir = tempfile::tempdir().unwrap();
    let (_workspace, grants) = real_file_tool_workspace();

    // Fill the cache: the file component, and the echo fixture (another valid tool component).
    let (sandbox, loaded, key) = file_component(dir.path(), &grants).await;
    assert!(read_a(&loaded).await.contains("the real file tool"));
    let echo_bytes = std::fs::read(clawcage_sandbox::components::fixtures::ECHO).unwrap();
    let echo = sandbox
        .load("echo", "test:echo", &echo_bytes, Grants::none())
        .await
        .unwrap();
    let echo_tool = echo.tools()[0].clone();
    echo_tool.call_json("{}").await.ok();
    assert!(echo.is_loaded());
    let echo_key = ArtifactCache::key(sandbox.engine(), &echo_bytes);
    drop((loaded, echo, echo_tool, sandbox));
    let artifact = dir.path().join(format!("{key}.cwasm"));
    let description = dir.path().join(format!("{key}.describe.json"));
    let genuine = std::fs::read(&artifact).unwrap();
    let genuine_description = std::fs::read(&description).unwrap();

    // 1. A valid artifact of another component, moved under the file component's key, is not
    //    run in its place: the first call compiles the file component again and replaces it.
    std::fs::copy(dir.path().join(format!("{echo_key}.cwasm")), &artifact).unwrap();
    let (sandbox, loaded, _) = file_component(dir.path(), &grants).await;
    assert!(
        read_a(&loaded).await.contains("the real file tool"),
        "the echo artifact ran in place of the file tool"
    );
    assert_eq!(
        std::fs::read(&artifact).unwrap(),
        genuine,
        "the moved entry was replaced by the file tool's own"
    );
    drop((loaded, sandbox));

    // 2. One byte changed in the middle of the artifact (its code) is noticed the same way.
    let mut changed = genuine.clone();
    let middle = changed.len() / 2;
    changed[middle] ^= 0x40;
    std::fs::write(&artifact, &changed).unwrap();
    let (sandbox, loaded, _) = file_component(dir.path(), &grants).await;
    assert!(read_a(&loaded).await.contains("the real file tool"));
    assert_eq!(std::fs::read(&artifact).unwrap(), genuine);
    drop((loaded, sandbox));

    // 3. A description whose tool names were changed is not believed: the tools are learnt
    //    again from the component itself.
    let renamed = String::from_utf8_lossy(&genuine_description).replace("read_file", "read_fil3");
    std::fs::write(&description, renamed.as_bytes()).unwrap();
    let (sandbox, loaded, _) = file_component(dir.path(), &grants).await;
    let names: Vec<String> = loaded
        .tools()
        .iter()
        .map(|tool| clawcage_core::Tool::spec(tool).name.clone())
        .collect();
    assert!(names.iter().any(|name| name == "read_file"), "{names:?}");
    assert!(!names.iter().any(|name| name == "read_fil3"), "{names:?}");
    assert_eq!(std::fs::read(&description).unwrap(), genuine_description);
    drop((loaded, sandbox));

    // 4. Entries sealed by another cache (another key) are not taken: a cache copied from
    //    elsewhere, or a key replaced by someone else, means compiling again.
    let other = tempfile::tempdir().unwrap();
    for name in [format!("{key}.cwasm"), format!("{key}.describe.json")] {
        std::fs::copy(dir.path().join(&name), other.path().join(&name)).unwrap();
    }
    let (sandbox, loaded, _) = file_component(other.path(), &grants).await;
    assert_eq!(loaded.cache_outcome(), CacheOutcome::Compiled);
    assert!(read_a(&loaded).await.contains("the real file tool"));
    assert_ne!(
        std::fs::read(other.path().join(format!("{key}.cwasm"))).unwrap(),
        genuine,
        "sealed again under the other cache's key"
    );
    drop((loaded, sandbox));
}

/// The exec tool of a new engine `sandbox`, granted `workspace` read-only, and its programs.
async fn exec_tool(
    sandbox: std::sync::Arc<Sandbox>,
    workspace: &std::path::Path,
) -> (clawcage_sandbox::WasmTool, clawcage_sandbox::ProgramCatalog) {
    let catalog = sandbox.programs_on_demand(None);
    let grants = clawcage_tests::grants(
        workspace,
        clawcage_sandbox::FsMode::ReadOnly,
        clawcage_sandbox::Limits::default(),
    )
    .with_exec(clawcage_sandbox::ExecGrant::new(catalog.clone()));
    let loaded = sandbox
        .load("exec", "bundled:exec", bundled::EXEC, grants)
        .await
        .unwrap();
    (loaded.into_tools().remove(0), catalog)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_program_is_read_and_checked_only_when_it_first_runs() {
    let workspace = tempfile::tempdir().unwrap();
    std::fs::write(workspace.path().join("a.txt"), "one\ntwo\n").unwrap();
    let fresh_sandbox = || {
        Sandbox::new(SandboxOptions::new(ArtifactCache::in_dir(
            clawcage_tests::cache_dir(),
        )))
        .unwrap()
    };
    // Whatever the shared cache held before, every program is compiled and stored now.
    let (_, catalog) = exec_tool(fresh_sandbox(), workspace.path()).await;
    catalog.load_all().await.unwrap();

    // A new engine over that cache: a call that runs no program loads none, and one that runs
    // `wc` loads coreutils (which holds wc) and nothing else.
    let (exec, catalog) = exec_tool(fresh_sandbox(), workspace.path()).await;
    let text = exec
        .call_json(r#"{"command":"echo hi"}"#)
        .await
        .unwrap()
        .text;
    assert!(text.starts_with("hi"), "{text}");
    for name in ["wc", "grep", "sed", "jq"] {
        assert!(!catalog.is_loaded(name), "{name} was loaded for echo");
    }
    let text = exec
        .call_json(r#"{"command":"wc -l a.txt"}"#)
        .await
        .unwrap()
        .text;
    assert!(text.contains("2 a.txt"), "{text}");
    assert!(catalog.is_loaded("wc"));
    assert!(
        catalog.is_loaded("cat"),
        "cat is the same coreutils program"
    );
    for name in ["grep", "sed", "jq"] {
        assert!(!catalog.is_loaded(name), "{name} was loaded for wc");
    }
}

/// Whether this process maps the file at `path` (as wasmtime does for an artifact it loads from
/// the file rather than from bytes read into memory).
fn mapped(path: &std::path::Path) -> bool {
    let path = path.canonicalize().unwrap();
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .any(|line| line.ends_with(&*path.to_string_lossy()))
}

/// Once an artifact passed its seal check, the cache vouches for that file and later starts map
/// it without reading or hashing it. A byte changed in place with its modification time set
/// back, a file others may write, and a vouching record from another key are not taken: each
/// start checks the seal in full again, and what fails it is compiled again.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checked_artifact_is_mapped_and_any_change_to_it_is_noticed() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let (_workspace, grants) = real_file_tool_workspace();
    // The first start compiles and stores; the second checks the seal and vouches; the third
    // maps the vouched file.
    let (sandbox, loaded, key) = file_component(dir.path(), &grants).await;
    assert!(read_a(&loaded).await.contains("the real file tool"));
    drop((loaded, sandbox));
    let artifact = dir.path().join(format!("{key}.cwasm"));
    let vouched = dir.path().join(format!("{key}.vouched.json"));
    assert!(!vouched.exists(), "nothing is vouched for before a check");
    let (sandbox, loaded, _) = file_component(dir.path(), &grants).await;
    assert!(read_a(&loaded).await.contains("the real file tool"));
    assert!(
        !mapped(&artifact),
        "a file not yet vouched for is read, not mapped"
    );
    drop((loaded, sandbox));
    assert!(vouched.exists());
    let (sandbox, loaded, _) = file_component(dir.path(), &grants).await;
    assert!(read_a(&loaded).await.contains("the real file tool"));
    assert!(mapped(&artifact), "a vouched artifact is mapped");
    drop((loaded, sandbox));
    let genuine = std::fs::read(&artifact).unwrap();

    // 1. One byte changed in place (same inode, same size) with the modification time set back:
    //    the change time moved, so the seal is checked in full, fails, and the component is
    //    compiled again.
    let modified = std::fs::metadata(&artifact).unwrap().modified().unwrap();
    let mut changed = genuine.clone();
    let middle = changed.len() / 2;
    changed[middle] ^= 0x40;
    {
        use std::io::{Seek as _, Write as _};
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .open(&artifact)
            .unwrap();
        file.seek(std::io::SeekFrom::Start(middle as u64)).unwrap();
        file.write_all(&changed[middle..=middle]).unwrap();
        file.set_modified(modified).unwrap();
    }
    assert_eq!(
        std::fs::metadata(&artifact).unwrap().modified().unwrap(),
        modified
    );
    let (sandbox, loaded, _) = file_component(dir.path(), &grants).await;
    assert!(read_a(&loaded).await.contains("the real file tool"));
    assert!(!mapped(&artifact));
    assert_eq!(std::fs::read(&artifact).unwrap(), genuine, "replaced");
    drop((loaded, sandbox));

    // 2. An artifact its group may write is never mapped, nor vouched for: each start checks it.
    let (sandbox, loaded, _) = file_component(dir.path(), &grants).await;
    assert!(read_a(&loaded).await.contains("the real file tool"));
    drop((loaded, sandbox));
    std::fs::set_permissions(&artifact, std::fs::Permissions::from_mode(0o664)).unwrap();
    std::fs::remove_file(&vouched).unwrap();
    for _ in 0..2 {
        let (sandbox, loaded, _) = file_component(dir.path(), &grants).await;
        assert!(read_a(&loaded).await.contains("the real file tool"));
        assert!(!mapped(&artifact), "a file others may write is not mapped");
        drop((loaded, sandbox));
        assert!(!vouched.exists());
    }
    std::fs::set_permissions(&artifact, std::fs::Permissions::from_mode(0o600)).unwrap();

    // 3. A vouching record of another key (the echo fixture's, for its own artifact) put under
    //    this key is not believed.
    let echo_bytes = std::fs::read(clawcage_sandbox::components::fixtures::ECHO).unwrap();
    let mut echo_key = String::new();
    for _ in 0..2 {
        let sandbox = Sandbox::new(SandboxOptions::new(ArtifactCache::in_dir(dir.path()))).unwrap();
        let echo = sandbox
            .load("echo", "test:echo", &echo_bytes, Grants::none())
            .await
            .unwrap();
        echo.tools()[0].clone().call_json("{}").await.ok();
        echo_key = ArtifactCache::key(sandbox.engine(), &echo_bytes);
    }
    let echo_vouched = dir.path().join(format!("{echo_key}.vouched.json"));
    assert!(echo_vouched.exists());
    std::fs::copy(dir.path().join(format!("{echo_key}.cwasm")), &artifact).unwrap();
    std::fs::copy(&echo_vouched, &vouched).unwrap();
    let (_sandbox, loaded, _) = file_component(dir.path(), &grants).await;
    assert!(
        read_a(&loaded).await.contains("the real file tool"),
        "the echo artifact ran in place of the file tool"
    );
    assert!(!mapped(&artifact));
    assert_eq!(std::fs::read(&artifact).unwrap(), genuine);
}
