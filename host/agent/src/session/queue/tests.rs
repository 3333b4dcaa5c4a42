//! The queue's policy on plain state, without a runtime: each mode, the cap and its drop
//! policies, collect batches, and the `/queue` parser.

use std::collections::BTreeMap;

use super::*;

fn user(text: &str) -> QueuedJob {
    QueuedJob::User {
        text: text.into(),
        origin: Origin::default(),
    }
}

fn from(channel: &str, text: &str) -> QueuedJob {
    QueuedJob::User {
        text: text.into(),
        origin: Origin {
            channel: Some(channel.into()),
            thread: None,
        },
    }
}

fn config(mode: QueueMode, cap: usize, drop: DropPolicy) -> QueueConfig {
    QueueConfig {
        settings: QueueSettings {
            mode,
            debounce_ms: 0,
            cap,
            drop,
        },
        by_channel: BTreeMap::new(),
    }
}

fn texts(state: &mut QueueState) -> Vec<String> {
    let mut texts = Vec::new();
    loop {
        match state.next_job(u64::MAX) {
            NextJob::Run(LaneJob {
                work: LaneWork::Turn { text },
                ..
            }) => texts.push(text),
            NextJob::Run(_) => texts.push("<reset>".into()),
            NextJob::Idle => return texts,
            NextJob::WaitUntil { .. } => panic!("waiting at u64::MAX"),
        }
    }
}

#[test]
fn an_idle_session_starts_at_once_and_a_busy_one_queues_in_order() {
    let config = config(QueueMode::Followup, 20, DropPolicy::Old);
    let mut state = QueueState::default();
    let first = state.admit(user("a"), &config, 0);
    assert_eq!(first.admission, Admission::Started);
    assert_eq!(
        state.admit(user("b"), &config, 0).admission,
        Admission::Queued { position: 1 }
    );
    assert_eq!(
        state.admit(QueuedJob::Reset, &config, 0).admission,
        Admission::Queued { position: 2 }
    );
    assert_eq!(
        state.admit(user("c"), &config, 0).admission,
        Admission::Queued { position: 3 }
    );
    assert_eq!(texts(&mut state), ["a", "b", "<reset>", "c"]);
}

#[test]
fn steer_needs_a_running_turn_with_nothing_else_ahead() {
    let config = config(QueueMode::Steer, 20, DropPolicy::Old);
    let mut state = QueueState::default();
    state.admit(user("a"), &config, 0);
    assert_eq!(
        state.admit(user("b"), &config, 0).admission,
        Admission::Steered
    );
    let notification = QueuedJob::Notification {
        message: InboundMessage {
            channel: "system".into(),
            sender: "cron".into(),
            session_key: "s".into(),
            content: "tick".into(),
        },
    };
    assert_eq!(
        state.admit(notification, &config, 0).admission,
        Admission::Queued { position: 2 },
        "a notification is never steered"
    );
    assert_eq!(
        state.admit(user("c"), &config, 0).admission,
        Admission::Queued { position: 3 },
        "nothing jumps the notification queued before it"
    );
    assert!(matches!(state.next_job(0), NextJob::Run(_)));
    assert_eq!(state.take_steered(), Some((vec![1], "b".to_string())));
    assert_eq!(state.take_steered(), None);
    state.turn_answered();
    assert_eq!(
        texts(&mut state),
        [
            "[notification on the `system` channel from cron]\ntick".to_string(),
            "c".to_string()
        ]
    );
}

#[test]
fn collect_waits_for_the_quiet_window_and_keeps_channels_apart() {
    let mut config = config(QueueMode::Collect, 20, DropPolicy::Old);
    config.settings.debounce_ms = 100;
    let mut state = QueueState::default();
    state.admit(from("x", "running"), &config, 0);
    assert!(matches!(state.next_job(0), NextJob::Run(_)));
    state.admit(from("x", "x1"), &config, 10);
    state.admit(from("y", "y1"), &config, 20);
    state.admit(from("x", "x2"), &config, 50);
    assert_eq!(state.next_job(120), NextJob::WaitUntil { at_ms: 150 });
    let NextJob::Run(job) = state.next_job(150) else {
        panic!("the window is over");
    };
    assert_eq!(job.tickets, [1, 3]);
    assert_eq!(
        job.work,
        LaneWork::Turn {
            text: "[Queued messages while the agent was busy]\n\n---\nQueued #1\nx1\n\n---\nQueued #2\nx2".into()
        }
    );
    let NextJob::Run(job) = state.next_job(200) else {
        panic!("y waits");
    };
    assert_eq!(job.tickets, [2]);
}

#[test]
fn cap_and_each_drop_policy() {
    for (drop, expected) in [
        (DropPolicy::Old, vec!["b", "c"]),
        (DropPolicy::New, vec!["a", "b"]),
        (
            DropPolicy::Summarize,
            vec![
                "[Queue overflow] Dropped 1 message while the agent was busy; one line from each:\n- a\n\nb",
                "c",
            ],
        ),
    ] {
        let config = config(QueueMode::Followup, 2, drop);
        let mut state = QueueState::default();
        state.admit(user("running"), &config, 0);
        assert!(matches!(state.next_job(0), NextJob::Run(_)));
        state.admit(user("a"), &config, 0);
        state.admit(user("b"), &config, 0);
        let third = state.admit(user("c"), &config, 0);
        match drop {
            DropPolicy::New => {
                assert_eq!(
                    third.admission,
                    Admission::Dropped {
                        reason: DropReason::QueueFull { cap: 2 }
                    }
                );
                assert!(third.evicted.is_empty());
            }
            DropPolicy::Old => {
                assert_eq!(third.evicted, [(1, DropReason::Evicted { cap: 2 })])
            }
            DropPolicy::Summarize => {
                assert_eq!(third.evicted, [(1, DropReason::Summarized { cap: 2 })])
            }
        }
        assert_eq!(texts(&mut state), expected, "{drop}");
    }
}

#[test]
fn interrupt_stops_the_turn_and_supersedes_waiting_messages_of_its_channel() {
    let config = config(QueueMode::Interrupt, 20, DropPolicy::Old);
    let mut state = QueueState::default();
    state.admit(from("x", "running"), &config, 0);
    assert!(matches!(state.next_job(0), NextJob::Run(_)));
    let first = state.admit(from("x", "one"), &config, 0);
    assert_eq!(first.admission, Admission::Interrupting { position: 1 });
    assert_eq!(state.stop_requested(), Some(StopCause::NewMessage));
    state.admit(from("y", "other channel"), &config, 0);
    let second = state.admit(from("x", "two"), &config, 0);
    assert_eq!(second.evicted, [(1, DropReason::Superseded)]);
    assert_eq!(texts(&mut state), ["other channel", "two"]);
}

#[test]
fn precedence_is_session_then_channel_then_configuration() {
    let mut config = config(QueueMode::Followup, 20, DropPolicy::Old);
    config
        .by_channel
        .insert("telegram".into(), QueueMode::Collect);
    let mut state = QueueState::default();
    let telegram = Origin::of_key("agent:main:telegram:alice");
    assert_eq!(telegram.channel.as_deref(), Some("telegram"));
    assert_eq!(
        state.settings_for(&telegram, &config).mode,
        QueueMode::Collect
    );
    assert_eq!(
        state.settings_for(&Origin::of_key("cli"), &config).mode,
        QueueMode::Followup
    );
    state.set_session_override(Some(QueueOverride {
        mode: QueueMode::Steer,
        debounce_ms: None,
        cap: Some(3),
        drop: None,
    }));
    let settings = state.settings_for(&telegram, &config);
    assert_eq!(
        (settings.mode, settings.cap, settings.drop),
        (QueueMode::Steer, 3, DropPolicy::Old)
    );
    assert_eq!(
        QueueState::default()
            .settings_for(&Origin::default(), &QueueConfig::default())
            .mode,
        QueueMode::Steer,
        "steer by default"
    );
}

#[test]
fn queue_commands_parse_and_name_the_valid_values() {
    assert_eq!(parse_queue_command("/queue"), Ok(QueueCommand::Show));
    assert_eq!(parse_queue_command("/queue reset"), Ok(QueueCommand::Reset));
    assert_eq!(
        parse_queue_command("/queue collect debounce:2s cap:25 drop:summarize"),
        Ok(QueueCommand::Set(QueueOverride {
            mode: QueueMode::Collect,
            debounce_ms: Some(2000),
            cap: Some(25),
            drop: Some(DropPolicy::Summarize),
        }))
    );
    assert_eq!(parse_duration_ms("500ms"), Ok(500));
    assert_eq!(parse_duration_ms("1.5s"), Ok(1500));
    assert_eq!(parse_duration_ms("1m"), Ok(60_000));
    assert_eq!(parse_duration_ms("250"), Ok(250));
    for (line, needle) in [
        ("/queue fast", "use steer, followup, collect or interrupt"),
        (
            "/queue collect speed:3",
            "the options are debounce, cap and drop",
        ),
        ("/queue collect drop:all", "use old, new or summarize"),
        ("/queue collect cap:0", "from 1 to 10000"),
        ("/queue collect debounce:soon", "such as 500ms, 2s or 1m"),
        ("/queue cap:3", "the mode comes first"),
        ("/queue reset now", "takes nothing after it"),
    ] {
        let error = parse_queue_command(line).unwrap_err().to_string();
        assert!(error.contains(needle), "{line}: {error}");
        assert!(error.contains(QUEUE_USAGE), "{line}: {error}");
    }
}

#[test]
fn summaries_are_one_line_of_at_most_160_characters() {
    let long = format!("first line\n\n  {}", "word ".repeat(100));
    let line = summary_line(&long);
    assert!(!line.contains('\n'));
    assert_eq!(line.chars().count(), SUMMARY_CHARS);
    assert!(line.starts_with("first line word"));
    assert!(line.ends_with('…'));
    assert_eq!(summary_line("short"), "short");
}
