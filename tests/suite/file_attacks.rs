//! Attacks on the file tools. Each must be refused, and the host side is checked afterwards:
//! nothing outside the workspace was read into the output or changed on disk.

use std::fs;
use std::os::unix::fs::{FileTypeExt as _, symlink};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clawcage_sandbox::components::{bundled, fixtures};
use clawcage_sandbox::{FsMode, Limits};
use clawcage_tests::{SecretLayout, file_registry, fixture, grants, registry_of};
use serde_json::{Value, json};

const SECRET: &str = "TOP-SECRET-HOST-DATA";

fn layout() -> SecretLayout {
    SecretLayout::new(SECRET)
}

fn assert_untouched(secret: &Path) {
    assert_eq!(
        fs::read_to_string(secret).unwrap(),
        SECRET,
        "the host file outside was changed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dot_dot_escapes_are_refused() {
    let layout = layout();
    let registry = file_registry(&layout.workspace, FsMode::ReadWrite).await;
    for path in ["../secret.txt", "sub/../../secret.txt", "./../secret.txt"] {
        let error = registry
            .execute_value("read_file", &json!({"path": path}))
            .await
            .unwrap_err();
        assert_eq!(error.kind(), "denied", "{path}: {error}");
        assert!(
            error.message().contains("outside the workspace"),
            "{path}: {error}"
        );
        assert!(!error.message().contains(SECRET));
    }
    let error = registry
        .execute_value(
            "write_file",
            &json!({"path": "../secret.txt", "content": "pwned"}),
        )
        .await
        .unwrap_err();
    assert_eq!(error.kind(), "denied", "{error}");
    let error = registry
        .execute_value(
            "write_file",
            &json!({"path": "../new.txt", "content": "pwned"}),
        )
        .await
        .unwrap_err();
    assert_eq!(error.kind(), "denied", "{error}");
    assert!(!layout.workspace.parent().unwrap().join("new.txt").exists());
    let error = registry
        .execute_value("list_dir", &json!({"path": ".."}))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), "denied", "{error}");
    assert_untouched(&layout.secret);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absolute_paths_outside_the_workspace_are_refused() {
    let layout = layout();
    let registry = file_registry(&layout.workspace, FsMode::ReadWrite).await;
    for path in [
        "/etc/passwd",
        "/",
        layout.secret.to_str().unwrap(),
        "/proc/self/environ",
    ] {
        let error = registry
            .execute_value("read_file", &json!({"path": path}))
            .await
            .unwrap_err();
        assert_eq!(error.kind(), "denied", "{path}: {error}");
        assert!(!error.message().contains("root:"), "{error}");
    }
    let error = registry
        .execute_value(
            "write_file",
            &json!({"path": "/tmp/clawcage-escape.txt", "content": "x"}),
        )
        .await
        .unwrap_err();
    assert_eq!(error.kind(), "denied", "{error}");
    assert!(!Path::new("/tmp/clawcage-escape.txt").exists());
    assert_untouched(&layout.secret);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn symlinks_pointing_outside_are_refused_by_the_sandbox() {
    let layout = layout();
    symlink(&layout.secret, layout.workspace.join("link-to-secret")).unwrap();
    symlink(
        layout.secret.parent().unwrap(),
        layout.workspace.join("link-to-parent"),
    )
    .unwrap();
    symlink("/etc", layout.workspace.join("etc")).unwrap();
    let registry = file_registry(&layout.workspace, FsMode::ReadWrite).await;

    for path in ["link-to-secret", "link-to-parent/secret.txt", "etc/passwd"] {
        let error = registry
            .execute_value("read_file", &json!({"path": path}))
            .await
            .unwrap_err();
        assert!(
            matches!(error.kind(), "denied" | "failed"),
            "{path} must be refused: {error}"
        );
        assert!(!error.message().contains(SECRET), "{error}");
        assert!(!error.message().contains("root:"), "{error}");
    }
    let error = registry
        .execute_value(
            "write_file",
            &json!({"path": "link-to-parent/secret.txt", "content": "pwned"}),
        )
        .await
        .unwrap_err();
    assert!(matches!(error.kind(), "denied" | "failed"), "{error}");
    let error = registry
        .execute_value(
            "edit_file",
            &json!({"path": "link-to-secret", "old_text": "TOP", "new_text": "PWNED"}),
        )
        .await
        .unwrap_err();
    assert!(matches!(error.kind(), "denied" | "failed"), "{error}");
    let listing = registry
        .execute_value("list_dir", &json!({"path": "link-to-parent"}))
        .await;
    assert!(
        listing.is_err(),
        "listing through an escaping symlink must fail: {listing:?}"
    );
    assert_untouched(&layout.secret);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_symlink_loop_fails_cleanly() {
    let layout = layout();
    symlink("loop-b", layout.workspace.join("loop-a")).unwrap();
    symlink("loop-a", layout.workspace.join("loop-b")).unwrap();
    let registry = file_registry(&layout.workspace, FsMode::ReadWrite).await;
    let error = registry
        .execute_value("read_file", &json!({"path": "loop-a"}))
        .await
        .unwrap_err();
    assert!(matches!(error.kind(), "denied" | "failed"), "{error}");
    // The registry keeps serving.
    let text = registry
        .execute("read_file", r#"{"path":"inside.txt"}"#)
        .await
        .unwrap()
        .text;
    assert!(text.contains("inside"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_under_a_read_only_grant_are_refused() {
    let layout = layout();
    let registry = file_registry(&layout.workspace, FsMode::ReadOnly).await;
    let error = registry
        .execute_value("write_file", &json!({"path": "new.txt", "content": "x"}))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), "denied", "{error}");
    assert!(error.message().contains("read-only"), "{error}");
    assert!(!layout.workspace.join("new.txt").exists());

    let error = registry
        .execute_value(
            "edit_file",
            &json!({"path": "inside.txt", "old_text": "inside", "new_text": "changed"}),
        )
        .await
        .unwrap_err();
    assert_eq!(error.kind(), "denied", "{error}");
    assert_eq!(
        fs::read_to_string(layout.workspace.join("inside.txt")).unwrap(),
        "inside"
    );
    let entries: Vec<_> = fs::read_dir(&layout.workspace).unwrap().collect();
    assert_eq!(entries.len(), 1, "no temporary file was left behind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_very_large_file_is_read_capped_within_a_small_memory_limit() {
    let layout = layout();
    // 40 MB of text against a 48 MiB memory cap: the tool must stream, not load the file.
    let line = "x".repeat(99) + "\n";
    let mut file =
        std::io::BufWriter::new(fs::File::create(layout.workspace.join("huge.txt")).unwrap());
    for _ in 0..400_000 {
        std::io::Write::write_all(&mut file, line.as_bytes()).unwrap();
    }
    drop(file);
    let limits = Limits {
        memory_bytes: 48 << 20,
        ..Limits::default()
    };
    let registry = registry_of(
        &[("file", bundled::FILE)],
        grants(&layout.workspace, FsMode::ReadOnly, limits),
    )
    .await;
    let text = registry
        .execute("read_file", r#"{"path":"huge.txt"}"#)
        .await
        .unwrap()
        .text;
    assert!(text.len() <= 60_000, "output capped: {} bytes", text.len());
    assert!(
        text.contains("400000"),
        "the cut note states the total lines: {}",
        &text[text.len() - 300..]
    );
    assert!(
        text.contains("offset="),
        "the cut note says how to continue"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_arguments_are_invalid_args_naming_the_problem() {
    let layout = layout();
    let registry = file_registry(&layout.workspace, FsMode::ReadWrite).await;
    let cases = [
        ("read_file", r#"{"path": "#, "not valid JSON"),
        ("read_file", r#"{"path": 42}"#, "field `path`"),
        (
            "read_file",
            r#"{"path": "a", "offset": "ten"}"#,
            "field `offset`",
        ),
        (
            "read_file",
            r#"{"path": "a", "offset": 0}"#,
            "field `offset`",
        ),
        ("read_file", r#"{}"#, "\"path\" is a required property"),
        (
            "write_file",
            r#"{"path": "a"}"#,
            "\"content\" is a required property",
        ),
        (
            "edit_file",
            r#"{"path": "a", "old_text": "", "new_text": "b"}"#,
            "old_text",
        ),
        (
            "list_dir",
            r#"{"path": ".", "recursive": true}"#,
            "recursive",
        ),
        (
            "delete_everything",
            r#"{}"#,
            "unknown tool `delete_everything`",
        ),
    ];
    for (tool, args, expected) in cases {
        let error = registry.execute(tool, args).await.unwrap_err();
        assert_eq!(error.kind(), "invalid_args", "{tool} {args}: {error}");
        assert!(error.message().contains(expected), "{tool} {args}: {error}");
    }
}

/// A FIFO (named pipe) made for a test, as only a host process can make one. Shared by the
/// attack tests of the file tools, exec and plugins.
pub(crate) struct Fifo {
    pub(crate) path: PathBuf,
}

impl Fifo {
    pub(crate) fn make(path: &Path) -> Fifo {
        let status = std::process::Command::new("mkfifo")
            .arg(path)
            .status()
            .unwrap();
        assert!(status.success(), "mkfifo {}", path.display());
        Fifo {
            path: path.to_path_buf(),
        }
    }

    /// Starts a watchdog until the returned guard is dropped: from `after` on, it keeps opening
    /// the FIFO's other end, which releases anything waiting in `open(2)` on it, so that a
    /// regression fails the test's own assertions (time, message) instead of hanging the suite.
    pub(crate) fn watchdog(&self, after: Duration) -> Watchdog {
        let stop = Arc::new(AtomicBool::new(false));
        let (stopped, watched) = (stop.clone(), self.path.clone());
        let started = Instant::now();
        std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                let still_a_fifo = fs::symlink_metadata(&watched)
                    .is_ok_and(|metadata| metadata.file_type().is_fifo());
                if started.elapsed() >= after && still_a_fifo {
                    // Read and write at once: on Linux this open never waits, and it releases
                    // an open waiting on either end; closing it ends a waiting read.
                    if let Ok(other_end) =
                        fs::OpenOptions::new().read(true).write(true).open(&watched)
                    {
                        std::thread::sleep(Duration::from_millis(100));
                        drop(other_end);
                    }
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        Watchdog(stop)
    }

    /// The FIFO is still there and still a FIFO: nothing replaced it.
    pub(crate) fn assert_still_a_fifo(&self) {
        let metadata = fs::symlink_metadata(&self.path).unwrap();
        assert!(
            metadata.file_type().is_fifo(),
            "{} was replaced",
            self.path.display()
        );
    }
}

/// Stops its [`Fifo::watchdog`] when dropped.
pub(crate) struct Watchdog(Arc<AtomicBool>);

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// When the watchdog of a test with a time limit steps in: well after the limit plus a second.
pub(crate) const RESCUE_AFTER: Duration = Duration::from_secs(8);

/// The small time limit of the special-file tests; every call must end within it plus a second.
fn short_limits() -> Limits {
    Limits {
        timeout: Duration::from_secs(2),
        ..Limits::default()
    }
}

/// Asserts that a call that started at `started` ended within `limits` plus a second.
pub(crate) fn assert_within_limit(started: Instant, limits: &Limits, what: &str) {
    let elapsed = started.elapsed();
    assert!(
        elapsed <= limits.timeout + Duration::from_secs(1),
        "{what} took {elapsed:?}, past its time limit of {:?} plus a second",
        limits.timeout
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifos_are_refused_by_the_file_tools_without_waiting() {
    let layout = layout();
    let fifo = Fifo::make(&layout.workspace.join("pipe"));
    symlink("pipe", layout.workspace.join("link")).unwrap();
    let limits = short_limits();
    let registry = registry_of(
        &[("file", bundled::FILE)],
        grants(&layout.workspace, FsMode::ReadWrite, limits),
    )
    .await;
    let _watchdog = fifo.watchdog(RESCUE_AFTER);
    for path in ["pipe", "link"] {
        let calls = [
            ("read_file", json!({"path": path})),
            ("write_file", json!({"path": path, "content": "x"})),
            (
                "edit_file",
                json!({"path": path, "old_text": "a", "new_text": "b"}),
            ),
            ("list_dir", json!({"path": path})),
        ];
        for (tool, args) in calls {
            let started = Instant::now();
            let error = registry.execute_value(tool, &args).await.unwrap_err();
            assert_within_limit(started, &limits, &format!("{tool} {path}"));
            assert_eq!(error.kind(), "failed", "{tool} {path}: {error}");
            assert!(
                error.message().starts_with(&format!("{path} is a FIFO")),
                "{tool} {path}: {error}"
            );
        }
    }
    let text = registry
        .execute_value("read_file", &json!({"path": "inside.txt"}))
        .await
        .unwrap()
        .text;
    assert_eq!(text, "inside");
    fifo.assert_still_a_fifo();
}

/// The host's guard itself, under the file tools' message: a component that opens the FIFO
/// without looking first gets an error at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_component_opening_a_fifo_gets_an_error_at_once() {
    let layout = layout();
    let fifo = Fifo::make(&layout.workspace.join("pipe"));
    symlink("pipe", layout.workspace.join("link")).unwrap();
    let limits = short_limits();
    let probe = fixture(fixtures::PROBE);
    let registry = registry_of(
        &[("probe", probe.as_slice())],
        grants(&layout.workspace, FsMode::ReadWrite, limits),
    )
    .await;
    let _watchdog = fifo.watchdog(RESCUE_AFTER);
    for name in ["pipe", "link"] {
        let path = layout.workspace.join(name).display().to_string();
        let started = Instant::now();
        let output = registry
            .execute_value("probe", &json!({"read": path, "write": path}))
            .await
            .unwrap();
        assert_within_limit(started, &limits, &format!("probe {name}"));
        let report: Value = serde_json::from_str(&output.text).unwrap();
        for access in ["read", "write"] {
            let error = report[access]["error"].as_str();
            assert!(
                error.is_some_and(|error| error.to_lowercase().contains("not supported")),
                "{access} {name}: {}",
                report[access]
            );
        }
    }
    fifo.assert_still_a_fifo();
}
