//! The contracts of the durable stores, written once against the traits: every implementation
//! of [`LaneInbox`] and [`TranscriptStore`] must pass them (the files today; a distributed
//! backend adds its constructor to the list). Each contract starts from an empty store and a
//! second handle on the same storage stands for the next process.

use std::path::Path;
use std::sync::Arc;

use clawcage_agent::inbox::{Appended, InputRecord, InputStatus, LaneInbox};
use clawcage_agent::session::queue::{Origin, QueueMode, QueueOverride, QueuedJob};
use clawcage_agent::transcript::{Entry, Position, now_ms};
use clawcage_agent::{FileInbox, JsonlTranscripts, TranscriptStore};
use clawcage_core::{ChatMessage, Usage};

type MakeInbox = fn(&Path) -> Arc<dyn LaneInbox>;
type MakeTranscripts = fn(&Path) -> Arc<dyn TranscriptStore>;

const INBOXES: &[(&str, MakeInbox)] = &[("files", |dir| Arc::new(FileInbox::new(dir)))];
const TRANSCRIPTS: &[(&str, MakeTranscripts)] =
    &[("jsonl", |dir| JsonlTranscripts::new(dir).shared())];

fn input(id: &str, key: Option<&str>) -> InputRecord {
    InputRecord {
        id: id.to_string(),
        at_ms: now_ms(),
        idempotency: key.map(str::to_string),
        job: QueuedJob::User {
            text: format!("text of {id}"),
            origin: Origin::of_key("agent:main:test:contract"),
        },
        stop_requested: false,
    }
}

#[test]
fn every_inbox_keeps_order_keys_fates_stops_settings_and_one_owner() {
    for (name, make) in INBOXES {
        let dir = tempfile::tempdir().unwrap();
        let key = "agent:main:test:contract";
        let first = make(dir.path());
        assert!(
            first.pending(key).unwrap().is_empty(),
            "{name}: empty at first"
        );
        for (id, idempotency) in [("a", Some("ka")), ("b", None), ("c", Some("kc"))] {
            assert_eq!(
                first.append(key, &input(id, idempotency)).unwrap(),
                Appended::New,
                "{name}"
            );
        }
        assert_eq!(
            first.append(key, &input("z", Some("ka"))).unwrap(),
            Appended::Duplicate("a".into()),
            "{name}: a key seen is a duplicate"
        );
        first.done(key, &["b".into()], InputStatus::Ok).unwrap();
        first
            .done(key, &["c".into()], InputStatus::Refused)
            .unwrap();
        first.request_stop(key, "a").unwrap();
        let collect = QueueOverride {
            mode: QueueMode::Collect,
            debounce_ms: None,
            cap: Some(3),
            drop: None,
        };
        first.set_queue_override(key, Some(collect)).unwrap();
        assert!(first.claim(key).unwrap(), "{name}: the first owner");

        // The next process.
        let next = make(dir.path());
        assert!(!next.claim(key).unwrap(), "{name}: one live owner");
        let pending = next.pending(key).unwrap();
        let ids: Vec<&str> = pending.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids, ["a"], "{name}: pending in order, done ones gone");
        assert!(pending[0].stop_requested, "{name}: the stop is kept");
        assert_eq!(next.queue_override(key).unwrap(), Some(collect), "{name}");
        let finished = next.finished(key).unwrap();
        assert!(
            finished
                .iter()
                .any(|f| f.id == "b" && f.status == InputStatus::Ok),
            "{name}: {finished:?}"
        );
        assert_eq!(
            next.append(key, &input("c2", Some("kc"))).unwrap(),
            Appended::New,
            "{name}: a refused input's key may be sent again"
        );
        assert_eq!(next.sessions().unwrap(), [key], "{name}");
        drop(first);
        assert!(next.claim(key).unwrap(), "{name}: an ended owner frees it");
        next.remove(key).unwrap();
        assert!(next.pending(key).unwrap().is_empty(), "{name}: removed");
    }
}

#[test]
fn every_transcript_store_journals_commits_and_knows_the_open_turn() {
    for (name, make) in TRANSCRIPTS {
        let dir = tempfile::tempdir().unwrap();
        let key = "agent:main:test:contract";
        let store = make(dir.path());
        assert!(!store.exists(key).unwrap(), "{name}");
        assert_eq!(
            store.committed_position(key).unwrap(),
            Position(0),
            "{name}"
        );
        let turn = |input: &str, answer: &str| {
            vec![
                Entry::Start {
                    at_ms: 1,
                    inputs: vec![input.to_string()],
                },
                Entry::Message {
                    at_ms: 1,
                    message: ChatMessage::user(format!("question {input}")),
                },
                Entry::Message {
                    at_ms: 2,
                    message: ChatMessage::assistant(answer),
                },
            ]
        };
        store.append_steps(key, &turn("r1", "one")).unwrap();
        let open = store.load(key, 100).unwrap();
        assert_eq!(
            open.open.as_ref().map(|o| o.inputs.clone()),
            Some(vec!["r1".to_string()]),
            "{name}: a start without its turn is open"
        );
        assert_eq!(
            store.committed_position(key).unwrap(),
            Position(0),
            "{name}: nothing committed yet"
        );
        let commit = Entry::Turn {
            at_ms: 3,
            usage: Usage {
                input_tokens: 5,
                output_tokens: 2,
                ..Usage::default()
            },
            outcome: "test/model".into(),
        };
        store.commit(key, std::slice::from_ref(&commit)).unwrap();
        let after_first = store.committed_position(key).unwrap();
        assert!(after_first > Position(0), "{name}");
        store.append_steps(key, &turn("r2", "two")).unwrap();
        assert_eq!(
            store.committed_position(key).unwrap(),
            after_first,
            "{name}: an open turn does not move the committed position"
        );

        // The next process sees the same.
        let next = make(dir.path());
        assert_eq!(next.committed_position(key).unwrap(), after_first, "{name}");
        let loaded = next.load(key, 100).unwrap();
        assert_eq!(loaded.answered["r1"].text, "one", "{name}");
        assert_eq!(loaded.usage.input_tokens, 5, "{name}");
        assert!(loaded.open.is_some(), "{name}");
        let until = next.load_until(key, 100, after_first).unwrap();
        assert_eq!(until.messages.len(), 2, "{name}: the committed part only");
        assert!(until.open.is_none(), "{name}");
        assert_eq!(until.turns.len(), 1, "{name}");
        assert_eq!(until.turns[0].after_messages, 2, "{name}");
        let listed: Vec<String> = next
            .sessions()
            .unwrap()
            .into_iter()
            .map(|s| s.key)
            .collect();
        assert_eq!(listed, [key], "{name}");
        next.remove(key).unwrap();
        assert!(!next.exists(key).unwrap(), "{name}");
        assert_eq!(next.committed_position(key).unwrap(), Position(0), "{name}");
    }
}
