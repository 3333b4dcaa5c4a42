//! The stores a gateway on one machine runs on: its event log (the state directory's files,
//! saying at info level when each turn starts and ends) and its epoch as the sessions' writer,
//! recorded across starts. A gateway sharing sessions with others gets both from the cluster
//! instead.

use std::path::Path;
use std::sync::Arc;

use clawcage_agent::events::{AgentEvent, Epoch, EventFuture, EventLog, Follow, Replay, Stream};
use clawcage_runtime::Error;
use serde_json::Value;

/// The gateway's event log, saying at info level when each turn starts and ends (the
/// operator's view of the traffic; `RUST_LOG=clawcage_gateway=info` shows it).
#[derive(Debug)]
pub(crate) struct LoggedEvents(pub(crate) Arc<dyn EventLog>);

impl EventLog for LoggedEvents {
    fn append(&self, event: AgentEvent, epoch: Epoch) -> EventFuture<'_, AgentEvent> {
        if event.stream == Stream::Lifecycle {
            let phase = event
                .data
                .get("phase")
                .and_then(Value::as_str)
                .unwrap_or("");
            let session = event.session_key.as_str();
            let run = event.run_id.as_str();
            let field = |name: &str| event.data.get(name).and_then(Value::as_str).unwrap_or("");
            let (kind, end) = (field("kind"), field("end"));
            let aborted = event.data.get("aborted") == Some(&Value::Bool(true));
            match phase {
                "start" => tracing::info!(session, run, kind, "turn started"),
                "end" => tracing::info!(session, run, end, "turn ended"),
                "error" => tracing::info!(session, run, aborted, "turn failed"),
                _ => {}
            }
        }
        self.0.append(event, epoch)
    }

    fn read<'a>(
        &'a self,
        session_key: &'a str,
        since: u64,
        limit: usize,
    ) -> EventFuture<'a, Replay> {
        self.0.read(session_key, since, limit)
    }

    fn last_seq<'a>(&'a self, session_key: &'a str) -> EventFuture<'a, u64> {
        self.0.last_seq(session_key)
    }

    fn follow<'a>(&'a self, session_key: &'a str, since: u64) -> EventFuture<'a, Follow> {
        self.0.follow(session_key, since)
    }

    fn remove<'a>(&'a self, session_key: &'a str) -> EventFuture<'a, ()> {
        self.0.remove(session_key)
    }

    fn sync(&self) -> EventFuture<'_, ()> {
        self.0.sync()
    }
}

/// This start's epoch as the sessions' writer, recorded in `<gateway-dir>/epoch`: one more than
/// the last start's, and never less than the time in milliseconds (so a lost file cannot give
/// an epoch older than the events already written). The gateway's lock is held.
pub(crate) fn next_epoch(gateway_dir: &Path) -> Result<Epoch, Error> {
    let path = gateway_dir.join("epoch");
    let previous = std::fs::read_to_string(&path)
        .ok()
        .and_then(|text| text.trim().parse::<Epoch>().ok())
        .unwrap_or(0);
    let epoch = previous
        .saturating_add(1)
        .max(clawcage_agent::transcript::now_ms());
    std::fs::create_dir_all(gateway_dir)
        .and_then(|()| {
            clawcage_core::files::write_atomically(&path, epoch.to_string().as_bytes(), true)
        })
        .map_err(|error| {
            Error::Failed(format!(
                "cannot record the gateway's epoch in {}: {error}; check that the state directory is writable",
                path.display()
            ))
        })?;
    Ok(epoch)
}
