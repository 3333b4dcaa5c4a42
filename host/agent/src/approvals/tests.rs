//! The broker, the store and the policy decisions, against real files in temp dirs.

use std::sync::Arc;

use super::*;
use clawcage_core::approval::{
    AllowEntry, ApprovalGate, ApprovedExec, ArgMatch, GateAnswer, PlannedArg, PlannedCommand,
};

fn command(program: &str, args: &[&str]) -> PlannedCommand {
    PlannedCommand {
        program: Some(program.to_string()),
        written: program.to_string(),
        args: args
            .iter()
            .map(|arg| PlannedArg {
                written: arg.to_string(),
                matches: ArgMatch::Exact(arg.to_string()),
            })
            .collect(),
        redirections: Vec::new(),
    }
}

fn plan(commands: Vec<PlannedCommand>) -> Option<ExecPlan> {
    Some(ExecPlan {
        command: "test".to_string(),
        commands,
        writes: Vec::new(),
    })
}

fn settings(mode: ExecMode, ask: AskMode, allow: &[&str]) -> ApprovalSettings {
    let mut settings = ApprovalSettings::default();
    settings.exec.mode = mode;
    settings.exec.allow = allow
        .iter()
        .map(|entry| AllowEntry::parse(entry).expect("entry"))
        .collect();
    settings.ask = ask;
    settings
}

fn denied(answer: GateAnswer) -> String {
    match answer {
        GateAnswer::Denied(message) => message,
        GateAnswer::Allowed(_) => panic!("allowed"),
    }
}

fn allowed(answer: GateAnswer) -> Arc<ApprovedExec> {
    match answer {
        GateAnswer::Allowed(approved) => approved,
        GateAnswer::Denied(message) => panic!("denied: {message}"),
    }
}

#[tokio::test]
async fn the_policy_alone_decides_when_asking_is_off() {
    let broker = ApprovalBroker::new(
        settings(ExecMode::Allowlist, AskMode::Off, &["ls"]),
        None,
        None,
    );
    assert!(broker.active());
    allowed(
        broker
            .review("exec", plan(vec![command("ls", &["-l"])]))
            .await,
    );
    let message = denied(
        broker
            .review("exec", plan(vec![command("rm", &["x"])]))
            .await,
    );
    assert!(
        message.contains("`rm x` is not on the allowlist"),
        "{message}"
    );
    let deny = ApprovalBroker::new(settings(ExecMode::Deny, AskMode::Off, &[]), None, None);
    assert!(denied(deny.review("exec", plan(vec![])).await).contains("exec = \"deny\""));
    let full = ApprovalBroker::new(ApprovalSettings::default(), None, None);
    assert!(!full.active());
}

#[tokio::test]
async fn an_operator_decides_and_a_timeout_denies() {
    let mut config = settings(ExecMode::Allowlist, AskMode::OnMiss, &[]);
    config.timeout = Duration::from_millis(200);
    let broker = ApprovalBroker::new(config, None, None);
    // Nobody connected: the fallback (deny) decides at once.
    let message = denied(
        broker
            .review("exec", plan(vec![command("rm", &["x"])]))
            .await,
    );
    assert!(message.contains("no operator is connected"), "{message}");
    // The refusal reaches the model as `denied: …`: the message itself does not say it again.
    assert!(!message.starts_with("denied"), "{message}");

    let mut operator = broker.operator(OperatorFilter::All);
    let review = tokio::spawn(broker.review("exec", plan(vec![command("rm", &["x"])])));
    let Some(OperatorEvent::Requested(request)) = operator.next().await else {
        panic!("no request");
    };
    assert_eq!(request.plan.commands[0].display(), "rm x");
    operator
        .resolve(&request.id, ApprovalDecision::AllowOnce, "test")
        .expect("resolve");
    let approved = allowed(review.await.expect("join"));
    assert!(approved.check("rm", &["x".to_string()]).is_ok());
    assert!(approved.check("rm", &["y".to_string()]).is_err());
    assert!(matches!(
        operator.next().await,
        Some(OperatorEvent::Resolved { .. })
    ));
    // The id cannot be used twice.
    assert!(
        operator
            .resolve(&request.id, ApprovalDecision::AllowOnce, "test")
            .is_err()
    );

    // Unanswered: denied at the timeout.
    let message = denied(
        broker
            .review("exec", plan(vec![command("rm", &["x"])]))
            .await,
    );
    assert!(message.contains("nobody approved"), "{message}");
    assert!(broker.pending().is_empty());
}

/// `sort < notes.txt > copy.txt`: a safe bin and one write by redirection.
fn sort_into_copy() -> Option<ExecPlan> {
    let mut sort = command("sort", &[]);
    sort.redirections = vec!["< notes.txt".into(), "> copy.txt".into()];
    Some(ExecPlan {
        command: "sort < notes.txt > copy.txt".to_string(),
        commands: vec![sort],
        writes: vec![clawcage_core::approval::PlannedWrite {
            redirection: "> copy.txt".into(),
            target: ArgMatch::Exact("copy.txt".into()),
        }],
    })
}

#[tokio::test]
async fn a_write_by_redirection_is_refused_or_asked_and_approved_for_that_call_only() {
    // Refused by an allowlist without asking, for the write and not for a program.
    let broker = ApprovalBroker::new(
        settings(ExecMode::Allowlist, AskMode::Off, &["ls *", "cat *"]),
        None,
        None,
    );
    let message = denied(broker.review("exec", sort_into_copy()).await);
    assert!(
        message.contains(
            "`> copy.txt` writes a file, and writes by redirection are not on the allowlist"
        ),
        "{message}"
    );
    assert!(
        !message.contains("`cat`") && !message.contains("`sort"),
        "{message}"
    );
    // `sort < notes.txt` alone writes nothing: the safe bin passes.
    let read_only = sort_into_copy().map(|plan| ExecPlan {
        writes: Vec::new(),
        ..plan
    });
    let approved = allowed(broker.review("exec", read_only).await);
    assert!(approved.check_write("/ws/copy.txt", false).is_err());
    // Under `full` nothing changes (here decided by the fallback `full`).
    let mut config = settings(ExecMode::Full, AskMode::Always, &[]);
    config.ask_fallback = ExecMode::Full;
    let full_fallback = ApprovalBroker::new(config, None, None);
    let approved = allowed(full_fallback.review("exec", sort_into_copy()).await);
    assert!(approved.check_write("/ws/copy.txt", false).is_ok());
    // With nobody to ask and ask_fallback = "allowlist", the write is still refused.
    let mut config = settings(ExecMode::Allowlist, AskMode::OnMiss, &[]);
    config.ask_fallback = ExecMode::Allowlist;
    let fallback = ApprovalBroker::new(config, None, None);
    let message = denied(fallback.review("exec", sort_into_copy()).await);
    assert!(message.contains("`> copy.txt` writes a file"), "{message}");

    // Asked on a miss; allow-always approves the write for this call and keeps nothing
    // (the safe bin needed no entry, and a write by redirection has none).
    let dir = tempfile::tempdir().expect("tempdir");
    let store = ApprovalStore::in_state_dir(dir.path());
    let broker = ApprovalBroker::new(
        settings(ExecMode::Allowlist, AskMode::OnMiss, &[]),
        Some(store.clone()),
        None,
    );
    let mut operator = broker.operator(OperatorFilter::All);
    let review = tokio::spawn(broker.review("exec", sort_into_copy()));
    let Some(OperatorEvent::Requested(request)) = operator.next().await else {
        panic!("no request");
    };
    assert_eq!(
        request.reasons,
        ["`> copy.txt` writes a file, and writes by redirection are not on the allowlist"]
    );
    assert!(
        request.describe().ends_with("writes a file: > copy.txt"),
        "{}",
        request.describe()
    );
    operator
        .resolve(&request.id, ApprovalDecision::AllowAlways, "test")
        .expect("resolve");
    let approved = allowed(review.await.expect("join"));
    assert!(approved.check_write("/ws/copy.txt", false).is_ok());
    assert!(approved.check_write("/ws/notes.txt", false).is_err());
    assert!(store.list().expect("list").is_empty());
    drop(operator);
    let message = denied(broker.review("exec", sort_into_copy()).await);
    assert!(message.contains("no operator is connected"), "{message}");
}

#[tokio::test]
async fn allow_always_is_stored_and_revoke_removes_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = ApprovalStore::in_state_dir(dir.path());
    let broker = ApprovalBroker::new(
        settings(ExecMode::Allowlist, AskMode::OnMiss, &[]),
        Some(store.clone()),
        None,
    );
    let mut operator = broker.operator(OperatorFilter::All);
    let review = tokio::spawn(broker.review("exec", plan(vec![command("rm", &["-r", "build"])])));
    let Some(OperatorEvent::Requested(request)) = operator.next().await else {
        panic!("no request");
    };
    operator
        .resolve(&request.id, ApprovalDecision::AllowAlways, "test")
        .expect("resolve");
    allowed(review.await.expect("join"));
    let stored = store.list().expect("list");
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].entry.to_string(), "rm -r build");
    assert_eq!(stored[0].rule(), "rm -r build");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(dir.path().join("approvals.json"))
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    // A new broker (a restart) allows it without asking; another command still asks.
    drop(operator);
    let restarted = ApprovalBroker::new(
        settings(ExecMode::Allowlist, AskMode::OnMiss, &[]),
        Some(store.clone()),
        None,
    );
    allowed(
        restarted
            .review("exec", plan(vec![command("rm", &["-r", "build"])]))
            .await,
    );
    denied(
        restarted
            .review("exec", plan(vec![command("rm", &["-r", "src"])]))
            .await,
    );
    store.revoke(&stored[0].id).expect("revoke");
    denied(
        restarted
            .review("exec", plan(vec![command("rm", &["-r", "build"])]))
            .await,
    );
    assert!(store.revoke("apv-missing").is_err());
}

#[tokio::test]
async fn a_request_whose_call_is_dropped_is_withdrawn() {
    let broker = ApprovalBroker::new(
        settings(ExecMode::Allowlist, AskMode::OnMiss, &[]),
        None,
        None,
    );
    let mut operator = broker.operator(OperatorFilter::All);
    let review = tokio::spawn(broker.review("exec", plan(vec![command("rm", &["x"])])));
    let Some(OperatorEvent::Requested(request)) = operator.next().await else {
        panic!("no request");
    };
    review.abort();
    assert!(review.await.is_err());
    assert!(matches!(
        operator.next().await,
        Some(OperatorEvent::Resolved { id, by, .. }) if id == request.id && by == "withdrawn"
    ));
    assert!(broker.pending().is_empty());
    assert!(
        operator
            .resolve(&request.id, ApprovalDecision::AllowOnce, "late")
            .is_err()
    );
}

#[tokio::test]
async fn a_session_policy_applies_to_that_session_and_its_sub_agents_only() {
    let broker = ApprovalBroker::new(ApprovalSettings::default(), None, None);
    let strict = SessionPolicy::parse(&["exec", "deny"]).expect("valid");
    broker.set_session_policy("agent:main:cli:a", Some(strict));
    let review = |key: &'static str| {
        let broker = broker.clone();
        crate::session::with_session_key(key.to_string(), async move {
            (
                broker.active(),
                broker.review("exec", plan(vec![command("ls", &[])])).await,
            )
        })
    };
    let (active, answer) = review("agent:main:cli:a").await;
    assert!(active);
    assert!(denied(answer).contains("disabled"));
    let (active, answer) = review("agent:main:cli:a/sub-1").await;
    assert!(active);
    denied(answer);
    let (active, answer) = review("agent:main:cli:b").await;
    assert!(
        !active,
        "another session keeps the configuration's (full, no asking)"
    );
    allowed(answer);
    broker.set_session_policy("agent:main:cli:a", None);
    assert!(!review("agent:main:cli:a").await.0);
    for bad in [&["exec"][..], &["ask", "sometimes"], &["mode", "full"], &[]] {
        assert!(SessionPolicy::parse(bad).is_err(), "{bad:?}");
    }
    assert_eq!(
        SessionPolicy::parse(&["ask", "always", "exec", "allowlist"]),
        Ok(SessionPolicy {
            exec: Some(ExecMode::Allowlist),
            ask: Some(AskMode::Always)
        })
    );
}

#[tokio::test]
async fn a_session_operator_hears_its_session_and_its_sub_agents_only() {
    let filter = OperatorFilter::Session("agent:main:cli:local".to_string());
    assert!(filter.accepts(Some("agent:main:cli:local")));
    assert!(filter.accepts(Some("agent:main:cli:local/sub-1")));
    assert!(!filter.accepts(Some("agent:main:cli:localx")));
    assert!(!filter.accepts(Some("agent:main:web:other")));
    assert!(!filter.accepts(None));
    assert!(OperatorFilter::All.accepts(None));
}

#[test]
fn a_corrupt_store_is_reported_not_ignored() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = ApprovalStore::in_state_dir(dir.path());
    std::fs::write(dir.path().join("approvals.json"), "{not json").expect("write");
    let error = store.list().expect_err("corrupt");
    assert!(
        error.to_string().contains("not a valid approvals file"),
        "{error}"
    );
}
