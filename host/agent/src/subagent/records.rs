//! The record of every sub-agent run, kept in `<state-dir>/subagents/runs.json` so that runs cut
//! off by a restart are reported as interrupted: the record type, and the file read, locked and
//! written atomically.

use std::path::Path;

use serde::{Deserialize, Serialize};

/// Where a run stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SubagentStatus {
    /// Still working.
    Running,
    /// Answered.
    Completed,
    /// Its turn failed (provider error, iteration cap, loop).
    Failed,
    /// Stopped by its time limit.
    TimedOut,
    /// Stopped by the `subagents` tool.
    Stopped,
    /// Cut off by a restart of clawcage.
    Interrupted,
}

impl SubagentStatus {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            SubagentStatus::Running => "running",
            SubagentStatus::Completed => "completed",
            SubagentStatus::Failed => "failed",
            SubagentStatus::TimedOut => "timed out",
            SubagentStatus::Stopped => "stopped",
            SubagentStatus::Interrupted => "interrupted",
        }
    }
}

/// One child's run, as persisted in `runs.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubagentRecord {
    /// `sub-N`.
    pub id: String,
    /// The session its result is announced to.
    pub parent_session: String,
    /// A short name given by the parent.
    pub label: Option<String>,
    /// The task.
    pub task: String,
    /// 1 for a child of the main agent.
    pub depth: u32,
    /// The process that runs (or ran) it; a `running` record whose process is gone was cut off.
    #[serde(default)]
    pub pid: u32,
    /// Where it stands.
    pub status: SubagentStatus,
    /// Milliseconds since the epoch.
    pub started_ms: u64,
    /// When it ended.
    pub finished_ms: Option<u64>,
    /// Model calls made.
    pub turns: usize,
    /// Tool calls made.
    pub tool_calls: usize,
    /// The final answer or the error, cut to [`MAX_RESULT_CHARS`].
    pub result: Option<String>,
}

impl SubagentRecord {
    /// The record of child `id`, starting now in this process on `task` for `parent_session` at
    /// `depth`.
    pub(crate) fn starting(
        id: &str,
        parent_session: &str,
        label: Option<String>,
        task: &str,
        depth: u32,
    ) -> Self {
        Self {
            id: id.to_string(),
            parent_session: parent_session.to_string(),
            label,
            task: task.to_string(),
            depth,
            pid: std::process::id(),
            status: SubagentStatus::Running,
            started_ms: crate::transcript::now_ms(),
            finished_ms: None,
            turns: 0,
            tool_calls: 0,
            result: None,
        }
    }

    pub(crate) fn name(&self) -> String {
        match &self.label {
            Some(label) => format!("{} ({label})", self.id),
            None => self.id.clone(),
        }
    }
}

pub(super) fn load_records(file: &Path) -> std::io::Result<Vec<SubagentRecord>> {
    match std::fs::read(file) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|error| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "{} is not a valid sub-agent record file ({error}); move it away to start afresh",
                    file.display()
                ),
            )
        }),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(error) => Err(error),
    }
}

/// An exclusive advisory lock on `runs.lock` beside `file`, released when the file is dropped.
pub(super) fn lock_records_file(file: &Path) -> std::io::Result<std::fs::File> {
    let dir = file.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join("runs.lock"))?;
    lock.lock()?;
    Ok(lock)
}

/// Whether process `pid` still runs (Linux: `/proc/PID` exists; elsewhere assumed gone).
pub(super) fn process_alive(pid: u32) -> bool {
    pid != 0 && cfg!(target_os = "linux") && Path::new("/proc").join(pid.to_string()).exists()
}

/// Write `records` to `file` atomically (`clawcage_core::files::write_atomically`: synced, renamed,
/// the directory synced).
pub(super) fn save_records(file: &Path, records: &[SubagentRecord]) -> std::io::Result<()> {
    let bytes = serde_json::to_vec_pretty(records).map_err(std::io::Error::other)?;
    clawcage_core::files::write_atomically(file, &bytes, false)
}
