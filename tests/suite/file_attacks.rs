//! Attacks on the file tools. Each must be refused, and the host side is checked afterwards:
//! nothing outside the workspace was read into the output or changed on disk.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;

use clawcage_sandbox::components::bundled;
use clawcage_sandbox::{FsMode, Limits};
use clawcage_tests::{SecretLayout, file_registry, grants, registry_of};
use serde_json::json;

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
