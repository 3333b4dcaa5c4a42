//! The compiled-artifact cache: the first load compiles and stores, a new engine with the same
//! cache directory loads without compiling, and a damaged entry is replaced instead of trusted.

use clawcage_sandbox::components::bundled;
use clawcage_sandbox::{ArtifactCache, CacheOutcome, Grants, Sandbox, SandboxOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_start_loads_from_the_cache_and_a_damaged_entry_is_recompiled() {
    let dir = tempfile::tempdir().unwrap();
    let options = SandboxOptions {
        cache: ArtifactCache::in_dir(dir.path()),
    };

    let first = Sandbox::new(options.clone()).unwrap();
    let loaded = first
        .load("file", "bundled:file", bundled::FILE, Grants::none())
        .await
        .unwrap();
    assert_eq!(loaded.cache_outcome(), CacheOutcome::Compiled);
    let entries: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(
        entries.len(),
        1,
        "one artifact, no temporary files: {entries:?}"
    );
    let key = ArtifactCache::key(first.engine(), bundled::FILE);
    assert!(entries[0].ends_with(format!("{key}.cwasm")));
    drop(loaded);
    drop(first);

    let second = Sandbox::new(options.clone()).unwrap();
    let loaded = second
        .load("file", "bundled:file", bundled::FILE, Grants::none())
        .await
        .unwrap();
    assert_eq!(loaded.cache_outcome(), CacheOutcome::Hit);
    assert_eq!(loaded.tools().len(), 4);
    drop(loaded);
    drop(second);

    std::fs::write(&entries[0], b"not a compiled component").unwrap();
    let third = Sandbox::new(options).unwrap();
    let loaded = third
        .load("file", "bundled:file", bundled::FILE, Grants::none())
        .await
        .unwrap();
    assert_eq!(loaded.cache_outcome(), CacheOutcome::Compiled);
    assert_eq!(loaded.tools().len(), 4);
    assert!(
        std::fs::read(&entries[0]).unwrap().len() > 1000,
        "the damaged entry was replaced"
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
