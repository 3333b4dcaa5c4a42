//! What the hub reads for its clients: a session's history with the cursor to subscribe from
//! (and each turn's end, and the verdicts of its tool calls), the session list with titles, and
//! `sessions.rename`.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;

use clawcage_agent::events::EventLog;
use clawcage_agent::transcript::TurnMark;
use clawcage_agent::{AgentError, StateDir};
use serde_json::{Value, json};

use super::{Hub, SessionHub, lock};
use crate::protocol::{Code, GatewayError};

/// Characters of a title made from a first message.
const TITLE_CHARS: usize = 80;

/// The title a first message gives its session: its first non-empty line, cut to 80 characters.
fn title_of(text: &str) -> Option<String> {
    let line = text.lines().map(str::trim).find(|line| !line.is_empty())?;
    let mut title: String = line.chars().take(TITLE_CHARS).collect();
    if line.chars().count() > TITLE_CHARS {
        title.push('…');
    }
    Some(title)
}

impl Hub {
    /// The history of `key` (at most `limit` messages since its last reset), with the cursor to
    /// subscribe from: the transcript is read as it was at one instant, and the cursor is the
    /// last event it already contains. `skipRuns` lists runs whose messages are in it though
    /// their end event is still to come.
    pub async fn history(&self, key: &str, limit: usize) -> Result<Value, GatewayError> {
        // Its cursor is the last event numbered here: only the host serving it knows it.
        self.check_served(key)?;
        let session = self.open_session(key).await?;
        let (cursor, skip, running, bytes) = {
            let state = session.lock();
            // The last event numbered: what the snapshot below already contains (stored before
            // the answer goes out, below).
            let last = state.next_seq - 1;
            let committed = self
                .parts
                .transcripts
                .committed_position(key)
                .map_err(|error| GatewayError::internal("cannot read the transcript", error))?;
            match &state.current {
                Some(run) if committed > run.committed_at => (
                    last,
                    vec![run.run_id.clone()],
                    Some(run.run_id.clone()),
                    committed,
                ),
                Some(run) => (
                    run.start_seq.saturating_sub(1),
                    Vec::new(),
                    Some(run.run_id.clone()),
                    committed,
                ),
                None => (last, Vec::new(), None, committed),
            }
        };
        // The cursor's events stored before it is given: a number not stored yet would be given
        // again after a crash (to another event), which a client resuming from it would miss.
        super::subscribers::written(&session).await;
        let store = self.parts.transcripts.clone();
        let events = self.parts.events.clone();
        let owned_key = key.to_string();
        let loaded =
            tokio::task::spawn_blocking(move || store.load_until(&owned_key, limit, bytes))
                .await
                .map_err(|error| GatewayError::internal("reading the history failed", error))?;
        let verdicts = tool_verdicts(events.as_ref(), key).await;
        let loaded =
            loaded.map_err(|error| GatewayError::internal("cannot read the transcript", error))?;
        let mut messages = serde_json::to_value(&loaded.messages).unwrap_or_else(|_| json!([]));
        annotate_verdicts(&mut messages, &verdicts);
        let turns: Vec<Value> = loaded.turns.iter().map(turn_json).collect();
        Ok(json!({
            "sessionKey": key,
            "messages": messages,
            "turns": turns,
            "cursor": cursor,
            "skipRuns": skip,
            "running": running,
        }))
    }

    fn titles_path(&self) -> PathBuf {
        StateDir::new(&self.parts.state_dir).gateway_titles()
    }

    pub(super) fn read_titles(&self) -> BTreeMap<String, String> {
        std::fs::read(self.titles_path())
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .unwrap_or_default()
    }

    pub(super) fn save_titles(
        &self,
        titles: &BTreeMap<String, String>,
    ) -> Result<(), GatewayError> {
        let text = serde_json::to_vec_pretty(titles)
            .map_err(|error| GatewayError::internal("cannot write the titles", error))?;
        let path = self.titles_path();
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|error| GatewayError::internal("cannot write the titles", error))?;
        }
        clawcage_core::files::write_atomically(&path, &text, true)
            .map_err(|error| GatewayError::internal("cannot write the titles", error))
    }

    /// Gives `key` the title of its first message unless it has one.
    pub(super) fn title_from_first_message(&self, key: &str, text: &str) {
        let mut titles = lock(&self.titles);
        if titles.contains_key(key) {
            return;
        }
        let Some(title) = title_of(text) else {
            return;
        };
        titles.insert(key.to_string(), title);
        if let Err(error) = self.save_titles(&titles) {
            tracing::warn!(?error, "cannot record a session's title");
        }
    }

    /// `key`'s title: its own, else its transcript's first user message (remembered).
    fn title(&self, key: &str) -> Option<String> {
        if let Some(title) = lock(&self.titles).get(key) {
            return Some(title.clone());
        }
        let loaded = self.parts.transcripts.load(key, usize::MAX).ok()?;
        let first = loaded
            .messages
            .iter()
            .find(|message| {
                message.role == clawcage_core::Role::User && !message.has_tool_results()
            })?
            .text();
        let title = title_of(&first)?;
        self.title_from_first_message(key, &first);
        Some(title)
    }

    /// `sessions.rename`: sets `key`'s title (an empty one goes back to the first message's).
    pub fn rename(&self, key: &str, title: &str) -> Result<Value, GatewayError> {
        let title = title.trim();
        if title.chars().count() > 200 || title.chars().any(char::is_control) {
            return Err(GatewayError::new(
                Code::InvalidParams,
                "invalid title: at most 200 characters, no control characters",
            ));
        }
        // Kept on the disk: scrubbed like everything else written there.
        let title = self.parts.sessions.agent().redactor().redact(title);
        let title = title.as_str();
        let mut titles = lock(&self.titles);
        if title.is_empty() {
            titles.remove(key);
        } else {
            titles.insert(key.to_string(), title.to_string());
        }
        self.save_titles(&titles)?;
        drop(titles);
        Ok(json!({"sessionKey": key, "title": self.title(key)}))
    }

    /// Every session: with a transcript or a run in flight, newest first. A session only
    /// subscribed to or asked for its history, with nothing sent, is not listed.
    pub fn list_sessions(&self, limit: usize) -> Result<Value, GatewayError> {
        let files = self
            .parts
            .transcripts
            .sessions()
            .map_err(|error| GatewayError::internal("cannot list the transcripts", error))?;
        let mut listed: Vec<(String, u64)> = files
            .into_iter()
            .map(|file| (file.key, file.modified_ms))
            .collect();
        let live: Vec<(String, Arc<SessionHub>)> = lock(&self.sessions)
            .iter()
            .map(|(key, session)| (key.clone(), session.clone()))
            .collect();
        for (key, session) in &live {
            let busy = {
                let state = session.lock();
                state.current.is_some() || !state.tickets.is_empty()
            };
            if busy && !listed.iter().any(|(known, _)| known == key) {
                listed.push((key.clone(), clawcage_agent::transcript::now_ms()));
            }
        }
        listed.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let sessions: Vec<Value> = listed
            .into_iter()
            .take(limit)
            .map(|(key, updated)| {
                let (running, queued) = live
                    .iter()
                    .find(|(known, _)| *known == key)
                    .map(|(_, session)| {
                        let state = session.lock();
                        (
                            state.current.as_ref().map(|run| run.run_id.clone()),
                            state.queued(),
                        )
                    })
                    .unwrap_or_default();
                json!({
                    "key": key,
                    "updatedAt": updated,
                    "lastActivityMs": updated,
                    "title": self.title(&key),
                    "running": running,
                    "queued": queued,
                    "writable": crate::keys::is_gateway_key(&key),
                })
            })
            .collect();
        Ok(json!({"sessions": sessions}))
    }
}

/// The verdict of every tool call still in the retained events, by tool call id.
async fn tool_verdicts(events: &dyn EventLog, key: &str) -> HashMap<String, (String, String)> {
    let mut verdicts = HashMap::new();
    let Ok(replay) = events.read(key, 0, usize::MAX).await else {
        return verdicts;
    };
    for event in replay.events {
        if event.stream != clawcage_agent::events::Stream::Tool || event.phase() != Some("end") {
            continue;
        }
        let field = |name: &str| {
            event
                .data
                .get(name)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        verdicts.insert(field("toolCallId"), (field("verdict"), field("label")));
    }
    verdicts
}

/// A committed turn's end as `chat.history` gives it.
fn turn_json(mark: &TurnMark) -> Value {
    let error = mark.outcome.strip_prefix("error: ");
    json!({
        "afterMessage": mark.after_messages,
        "atMs": mark.at_ms,
        "usage": {"inputTokens": mark.usage.input_tokens, "outputTokens": mark.usage.output_tokens},
        "answeredBy": if error.is_none() && !mark.outcome.is_empty() { Some(mark.outcome.as_str()) } else { None },
        "error": error,
        "aborted": error.is_some_and(|text| text == AgentError::Interrupted.to_string()),
    })
}

/// Adds `verdict` and `label` to each `tool_result` block whose call is in `verdicts`.
fn annotate_verdicts(messages: &mut Value, verdicts: &HashMap<String, (String, String)>) {
    let Some(messages) = messages.as_array_mut() else {
        return;
    };
    for message in messages {
        let Some(blocks) = message.get_mut("content").and_then(Value::as_array_mut) else {
            continue;
        };
        for block in blocks {
            if block.get("type").and_then(Value::as_str) != Some("tool_result") {
                continue;
            }
            let id = block
                .get("tool_use_id")
                .and_then(Value::as_str)
                .unwrap_or_default();
            if let Some((verdict, label)) = verdicts.get(id) {
                block["verdict"] = json!(verdict);
                block["label"] = json!(label);
            } else if block
                .get("content")
                .and_then(Value::as_str)
                .is_some_and(|text| text.starts_with("not run:"))
            {
                // Its event is no longer kept; the loop's own wording says it never ran.
                block["verdict"] = json!("error");
                block["label"] = json!("not_run");
            }
        }
    }
}
