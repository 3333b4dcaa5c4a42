//! The state the command-line tests share: one state directory under
//! `target/clawcage-test-cache/cli-state` whose compiled-component cache every CLI test uses,
//! private state directories that link to that cache (for tests whose sessions, cron jobs or
//! gateway must not meet another test's), and a warm-up that fills the cache once per test
//! process, so that no test's deadline includes compiling components.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The state directory the CLI tests share.
pub fn shared_state_dir() -> PathBuf {
    crate::cache_dir().join("cli-state")
}

/// A state directory of its own, sharing the compiled components of [`shared_state_dir`].
pub fn private_state_dir() -> tempfile::TempDir {
    let state = tempfile::tempdir().expect("a temporary state directory");
    let cache = shared_state_dir().join("cache");
    std::fs::create_dir_all(&cache).expect("the shared component cache can be created");
    std::os::unix::fs::symlink(&cache, state.path().join("cache"))
        .expect("the private state directory links the shared cache");
    state
}

/// Compile (on the first run) and describe every component and exec program into the shared
/// cache with the `clawcage` binary at `binary`, once per test process: `tools` describes every
/// component, an exec pipeline loads the programs. Call it before starting a test's clock.
pub fn warm_components(binary: &Path) {
    static WARM: OnceLock<()> = OnceLock::new();
    WARM.get_or_init(|| {
        let workspace = tempfile::tempdir().expect("a temporary workspace");
        for args in [
            &["tools"][..],
            &["call", "exec", r#"{"command":"echo warm | cat"}"#][..],
        ] {
            let output = Command::new(binary)
                .args(args)
                .arg("--workspace")
                .arg(workspace.path())
                .arg("--state-dir")
                .arg(shared_state_dir())
                .env_remove("RUST_LOG")
                .output()
                .expect("clawcage runs");
            assert!(
                output.status.success(),
                "warming the component cache with {args:?} failed: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
    });
}
