//! The layout the attack tests share: a workspace `ws` inside a parent directory that also holds
//! `secret.txt`, so a test can check that nothing outside the workspace was read, changed or
//! created; and the exec tool's text for a command, with a failed call worded the same way in
//! every module (`ERROR kind: message`).

use std::fs;
use std::path::PathBuf;

use clawcage_agent::ToolRegistry;
use serde_json::json;

/// The marker written outside the workspace; finding it in an output means it leaked.
pub const SECRET: &str = "TOP-SECRET-HOST-DATA";

/// A workspace with a secret beside it. The directories go away when it is dropped.
pub struct Layout {
    _root: tempfile::TempDir,
    /// The directory holding `secret.txt` and the workspace.
    pub parent: PathBuf,
    /// The workspace, `parent/ws`.
    pub workspace: PathBuf,
}

/// A new workspace `ws` in a fresh parent directory holding `secret.txt` (the marker and a
/// newline).
pub fn layout() -> Layout {
    let root = tempfile::tempdir().expect("a temporary directory");
    let parent = root
        .path()
        .canonicalize()
        .expect("the temporary directory has a canonical path");
    let workspace = parent.join("ws");
    fs::create_dir(&workspace).expect("the workspace can be made");
    fs::write(parent.join("secret.txt"), format!("{SECRET}\n")).expect("the secret is written");
    Layout {
        _root: root,
        parent,
        workspace,
    }
}

/// Fails the test unless the parent directory holds exactly the workspace and the untouched
/// secret.
pub fn assert_outside_untouched(layout: &Layout) {
    assert_eq!(
        fs::read_to_string(layout.parent.join("secret.txt")).expect("the secret is still there"),
        format!("{SECRET}\n"),
        "the secret outside the workspace was changed"
    );
    let mut names: Vec<String> = fs::read_dir(&layout.parent)
        .expect("the parent directory can be listed")
        .map(|entry| {
            entry
                .expect("an entry of the parent directory")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    assert_eq!(names, ["secret.txt", "ws"], "something was created outside");
}

/// The exec tool's text for `command`, or `ERROR kind: message` when the call failed as a whole.
pub async fn exec_text(registry: &ToolRegistry, command: &str) -> String {
    match registry
        .execute_value("exec", &json!({ "command": command }))
        .await
    {
        Ok(output) => output.text,
        Err(error) => format!("ERROR {}: {}", error.kind(), error.message()),
    }
}
