//! The compiled-artifact cache: the first load compiles and stores, a new engine with the same
//! cache directory loads without compiling, and a damaged entry is replaced instead of trusted.

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
    let key = ArtifactCache::key(first.engine(), bundled::FILE);
    assert_eq!(
        ArtifactCache::key_for_digest(first.engine(), bundled::sha256::FILE),
        key,
        "the build-time digest gives the same key as hashing the bytes"
    );
    assert_eq!(
        entries,
        [
            dir.path().join(format!("{key}.cwasm")),
            dir.path().join(format!("{key}.describe.json"))
        ],
        "the artifact and its description, no temporary files"
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
