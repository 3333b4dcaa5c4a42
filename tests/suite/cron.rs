//! Cron: the bundled `cron` component in the real sandbox, granted a real `CronService` whose
//! jobs live in a temporary directory and whose firings go out on a real message bus. Jobs are
//! added, listed and removed through the registry as a model would; `every_seconds` jobs fire
//! repeatedly; jobs and their ids survive a restart; a firing missed while down fires once;
//! invalid expressions are refused with the field named; the `scheduler` import is refused
//! without the grant; the job cap, the minimum interval and the size caps hold even for a caller
//! that skips the tool's schema; and a job added during a turn fires into that session's lane.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use clawcage_agent::cron::{CronOptions, CronService, MAX_MESSAGE_CHARS, Schedule, next_fire};
use clawcage_agent::provider::NoEvents;
use clawcage_agent::subagent::SYSTEM_CHANNEL;
use clawcage_agent::{
    AgentConfig, AgentError, AgentLoop, MessageBus, Sessions, Subscription, ToolRegistry,
};
use clawcage_core::{InboundMessage, JobRequest, Scheduler, ToolError};
use clawcage_sandbox::{Grants, LoadError, components};
use clawcage_tests::llm_server::{LlmServer, anthropic};
use clawcage_tests::{registry_of, sandbox};
use serde_json::{Value, json};

use crate::agent_loop::anthropic_provider;

fn open(dir: &Path, bus: &MessageBus, max_jobs: usize) -> Arc<CronService> {
    CronService::open(
        dir,
        bus.clone(),
        CronOptions {
            default_session: "main".to_string(),
            max_jobs,
        },
    )
    .unwrap()
}

async fn cron_registry(service: &Arc<CronService>) -> ToolRegistry {
    let scheduler: Arc<dyn Scheduler> = service.clone();
    registry_of(
        &[("cron", components::bundled::CRON)],
        Grants::none().with_scheduler(scheduler),
    )
    .await
}

async fn call(registry: &ToolRegistry, args: Value) -> Result<String, ToolError> {
    registry
        .execute("cron", &args.to_string())
        .await
        .map(|output| output.text)
}

async fn next_message(subscription: &mut Subscription) -> InboundMessage {
    tokio::time::timeout(Duration::from_secs(30), subscription.recv())
        .await
        .expect("a firing within 30 s")
        .expect("the bus is open")
}

/// Counts the messages that arrive within `window`.
async fn count_for(subscription: &mut Subscription, window: Duration) -> usize {
    let deadline = tokio::time::Instant::now() + window;
    let mut count = 0;
    while let Ok(Some(_)) = tokio::time::timeout_at(deadline, subscription.recv()).await {
        count += 1;
    }
    count
}

fn request(every_seconds: Option<u64>, cron: Option<&str>, message: &str) -> JobRequest {
    JobRequest {
        every_seconds,
        cron: cron.map(str::to_string),
        message: message.to_string(),
        ..JobRequest::default()
    }
}

fn stored_jobs(dir: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(dir.join("jobs.json")).unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_are_added_listed_and_removed_through_the_tool() {
    let state = tempfile::tempdir().unwrap();
    let service = open(state.path(), &MessageBus::new(), 100);
    let registry = cron_registry(&service).await;

    let added = call(
        &registry,
        json!({"action": "add", "cron": "0 9 * * MON-FRI", "timezone": "Europe/Berlin",
               "message": "Post the stand-up reminder", "name": "standup"}),
    )
    .await
    .unwrap();
    assert!(
        added.starts_with("Scheduled job job-1 (standup): cron 0 9 * * MON-FRI (Europe/Berlin)"),
        "{added}"
    );
    let expected_next = next_fire(
        &Schedule::Cron {
            expression: "0 9 * * MON-FRI".into(),
            timezone: "Europe/Berlin".into(),
        },
        Utc::now(),
    )
    .unwrap();
    let shown: DateTime<Utc> = added
        .rsplit("next firing ")
        .next()
        .unwrap()
        .trim_end_matches('.')
        .parse()
        .unwrap();
    assert_eq!(shown, expected_next);

    let every = call(
        &registry,
        json!({"action": "add", "every_seconds": 3600, "message": "Check the queue"}),
    )
    .await
    .unwrap();
    assert!(
        every.starts_with("Scheduled job job-2 (job-2): every 3600 s"),
        "{every}"
    );

    let listed = call(&registry, json!({"action": "list"})).await.unwrap();
    assert!(listed.starts_with("2 scheduled jobs:"), "{listed}");
    assert!(
        listed.contains("- job-1 (standup): cron 0 9 * * MON-FRI (Europe/Berlin)"),
        "{listed}"
    );
    assert!(listed.contains("session main"), "{listed}");
    assert!(listed.contains("message: Check the queue"), "{listed}");

    // The file holds both, written whole.
    let file = stored_jobs(state.path());
    assert_eq!(file["jobs"].as_array().unwrap().len(), 2);
    assert_eq!(file["next_id"], 2);

    let removed = call(&registry, json!({"action": "remove", "id": "job-1"}))
        .await
        .unwrap();
    assert_eq!(removed, "Removed job job-1 (standup).");
    let missing = call(&registry, json!({"action": "remove", "id": "job-1"}))
        .await
        .unwrap_err();
    assert!(
        missing
            .to_string()
            .contains("there is no job `job-1`; the jobs are job-2"),
        "{missing}"
    );
    call(&registry, json!({"action": "remove", "id": "job-2"}))
        .await
        .unwrap();
    assert_eq!(
        call(&registry, json!({"action": "list"})).await.unwrap(),
        "No scheduled jobs."
    );
    assert_eq!(stored_jobs(state.path())["jobs"], json!([]));
    // No temporary file is left behind (the lock that orders clawcage processes stays).
    let mut names: Vec<String> = std::fs::read_dir(state.path())
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["jobs.json", "jobs.lock"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_every_seconds_job_fires_repeatedly_on_the_bus() {
    let state = tempfile::tempdir().unwrap();
    let bus = MessageBus::new();
    let mut firings = bus.subscribe(SYSTEM_CHANNEL);
    let service = open(state.path(), &bus, 100);
    let runner = service.start();
    let registry = cron_registry(&service).await;

    call(
        &registry,
        json!({"action": "add", "every_seconds": 1, "message": "tick", "name": "ticker"}),
    )
    .await
    .unwrap();
    for _ in 0..3 {
        let message = next_message(&mut firings).await;
        assert_eq!(message.channel, SYSTEM_CHANNEL);
        assert_eq!(message.sender, "cron:job-1");
        assert_eq!(message.session_key, "main");
        assert_eq!(message.content, "[cron job ticker] tick");
    }

    // Removing it stops it: at most a firing already under way arrives afterwards.
    call(&registry, json!({"action": "remove", "id": "job-1"}))
        .await
        .unwrap();
    let late = count_for(&mut firings, Duration::from_millis(2500)).await;
    assert!(late <= 1, "{late} firings after removal");
    runner.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_and_their_ids_survive_a_restart() {
    let state = tempfile::tempdir().unwrap();
    let bus = MessageBus::new();
    let before = {
        let service = open(state.path(), &bus, 100);
        let registry = cron_registry(&service).await;
        for args in [
            json!({"action": "add", "cron": "0 0 L * *", "message": "month end"}),
            json!({"action": "add", "cron": "*/30 * * * * *", "timezone": "Asia/Tokyo", "message": "half minute"}),
            json!({"action": "add", "every_seconds": 86400, "message": "daily"}),
        ] {
            call(&registry, args).await.unwrap();
        }
        call(&registry, json!({"action": "remove", "id": "job-2"}))
            .await
            .unwrap();
        service.list()
    };

    let service = open(state.path(), &bus, 100);
    assert_eq!(service.list(), before);
    let registry = cron_registry(&service).await;
    let added = call(
        &registry,
        json!({"action": "add", "every_seconds": 60, "message": "new"}),
    )
    .await
    .unwrap();
    // Ids are never reused, even for a removed job.
    assert!(added.starts_with("Scheduled job job-4 "), "{added}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn firings_missed_while_down_fire_once_then_continue_from_now() {
    let state = tempfile::tempdir().unwrap();
    let bus = MessageBus::new();
    {
        let service = open(state.path(), &bus, 100);
        service
            .add(request(None, Some("0 0 1 1 *"), "new year"))
            .unwrap();
        service.add(request(Some(3600), None, "hourly")).unwrap();
    }
    // The process was "down" since 2020: years of firings missed.
    let mut file = stored_jobs(state.path());
    for job in file["jobs"].as_array_mut().unwrap() {
        job["next_fire"] = json!("2020-01-01T00:00:00Z");
    }
    std::fs::write(
        state.path().join("jobs.json"),
        serde_json::to_vec(&file).unwrap(),
    )
    .unwrap();

    let mut firings = bus.subscribe(SYSTEM_CHANNEL);
    let started = Utc::now();
    let service = open(state.path(), &bus, 100);
    let runner = service.start();
    let mut contents = vec![
        next_message(&mut firings).await.content,
        next_message(&mut firings).await.content,
    ];
    contents.sort();
    assert_eq!(
        contents,
        ["[cron job job-1] new year", "[cron job job-2] hourly"]
    );
    // Once each, not once per missed firing.
    assert_eq!(
        count_for(&mut firings, Duration::from_millis(1500)).await,
        0
    );

    let jobs = service.list();
    let new_year = jobs.iter().find(|job| job.id == "job-1").unwrap();
    let expected = next_fire(
        &Schedule::Cron {
            expression: "0 0 1 1 *".into(),
            timezone: "UTC".into(),
        },
        Utc::now(),
    )
    .unwrap();
    assert_eq!(
        new_year
            .next_fire
            .as_deref()
            .unwrap()
            .parse::<DateTime<Utc>>()
            .unwrap(),
        expected
    );
    let hourly = jobs.iter().find(|job| job.id == "job-2").unwrap();
    let hourly_next: DateTime<Utc> = hourly.next_fire.as_deref().unwrap().parse().unwrap();
    // Listings show whole seconds.
    assert!(hourly_next >= started + chrono::Duration::seconds(3599));
    assert!(hourly_next <= Utc::now() + chrono::Duration::seconds(3600));
    // The moved-on times are on disk, so another restart does not fire again.
    let on_disk = stored_jobs(state.path());
    for job in on_disk["jobs"].as_array().unwrap() {
        let next: DateTime<Utc> = job["next_fire"].as_str().unwrap().parse().unwrap();
        assert!(next > started, "{job}");
    }
    runner.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_schedules_are_refused_with_the_field_named() {
    let state = tempfile::tempdir().unwrap();
    let service = open(state.path(), &MessageBus::new(), 100);
    let registry = cron_registry(&service).await;

    for (args, expected) in [
        (
            json!({"action": "add", "cron": "0 9 * * MOX", "message": "m"}),
            "the day-of-week field `MOX`",
        ),
        (
            json!({"action": "add", "cron": "0 25 * * *", "message": "m"}),
            "the hour field `25`",
        ),
        (
            json!({"action": "add", "cron": "*/0 * * * *", "message": "m"}),
            "the minute field `*/0`",
        ),
        (
            json!({"action": "add", "cron": "0 0 31 FEB *", "message": "m"}),
            "never fires",
        ),
        (
            json!({"action": "add", "cron": "0 9 * *", "message": "m"}),
            "has 4 fields",
        ),
        (
            json!({"action": "add", "cron": "0 9 * * *", "timezone": "Europe/Berlín", "message": "m"}),
            "unknown time zone `Europe/Berlín`",
        ),
        (
            json!({"action": "add", "cron": "0 9 * * *", "every_seconds": 5, "message": "m"}),
            "not both",
        ),
        (
            json!({"action": "add", "message": "m"}),
            "needs 'every_seconds'",
        ),
        (
            json!({"action": "add", "every_seconds": 0, "message": "m"}),
            "every_seconds",
        ),
        (
            json!({"action": "add", "every_seconds": 10, "timezone": "UTC", "message": "m"}),
            "'timezone' applies only",
        ),
        (
            json!({"action": "remove", "id": "job-1", "message": "m"}),
            "message",
        ),
        (json!({"action": "pause"}), "action"),
    ] {
        let error = call(&registry, args.clone()).await.unwrap_err();
        assert!(
            matches!(error, ToolError::InvalidArgs(_)),
            "{args}: {error:?}"
        );
        assert!(error.to_string().contains(expected), "{args}: {error}");
    }
    assert!(service.list().is_empty());
    assert!(!state.path().join("jobs.json").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scheduler_import_is_refused_without_the_grant() {
    let error = sandbox()
        .load(
            "cron",
            "test:cron",
            components::bundled::CRON,
            Grants::none(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(error, LoadError::UngrantedImport { .. }),
        "{error}"
    );
    let message = error.to_string();
    assert!(message.contains("clawcage:tool/scheduler"), "{message}");
    assert!(message.contains("Grants::with_scheduler"), "{message}");

    // Narrowing by grants without cron drops it, so a child cannot load the tool either.
    let state = tempfile::tempdir().unwrap();
    let service: Arc<dyn Scheduler> = open(state.path(), &MessageBus::new(), 100);
    let granted = Grants::none().with_scheduler(service.clone());
    // Grants compare a scheduler by identity.
    assert_eq!(granted, Grants::none().with_scheduler(service));
    let other: Arc<dyn Scheduler> = open(state.path(), &MessageBus::new(), 100);
    assert_ne!(granted, Grants::none().with_scheduler(other));
    assert!(
        granted.describe().contains(", cron"),
        "{}",
        granted.describe()
    );
    assert!(granted.narrowed_by(&granted).scheduler().is_some());
    let narrowed = granted.narrowed_by(&Grants::none());
    assert!(narrowed.scheduler().is_none());
    assert!(!narrowed.describe().contains("cron"));
    let error = sandbox()
        .load("cron", "test:cron", components::bundled::CRON, narrowed)
        .await
        .unwrap_err();
    assert!(
        matches!(error, LoadError::UngrantedImport { .. }),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_job_cap_refuses_a_flood() {
    let state = tempfile::tempdir().unwrap();
    let service = open(state.path(), &MessageBus::new(), 3);
    let registry = cron_registry(&service).await;
    for n in 0..3 {
        call(
            &registry,
            json!({"action": "add", "every_seconds": 60 + n, "message": "m"}),
        )
        .await
        .unwrap();
    }
    let error = call(
        &registry,
        json!({"action": "add", "every_seconds": 60, "message": "one too many"}),
    )
    .await
    .unwrap_err();
    assert!(
        error.to_string().contains("already 3 scheduled jobs")
            && error.to_string().contains("remove one first"),
        "{error}"
    );
    assert_eq!(service.list().len(), 3);
    assert_eq!(
        stored_jobs(state.path())["jobs"].as_array().unwrap().len(),
        3
    );

    // The default cap, straight through the scheduler as any importer would call it.
    let state = tempfile::tempdir().unwrap();
    let service =
        CronService::open(state.path(), MessageBus::new(), CronOptions::default()).unwrap();
    for _ in 0..clawcage_agent::cron::DEFAULT_MAX_JOBS {
        service.add(request(Some(3600), None, "m")).unwrap();
    }
    let error = service.add(request(Some(3600), None, "m")).unwrap_err();
    assert!(error.contains("already 100 scheduled jobs"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_and_malformed_requests_are_capped_even_past_the_schema() {
    let state = tempfile::tempdir().unwrap();
    let service = open(state.path(), &MessageBus::new(), 100);
    let registry = cron_registry(&service).await;

    // The tool's schema refuses an oversized message before the component runs.
    let huge = "x".repeat(MAX_MESSAGE_CHARS + 1);
    let error = call(
        &registry,
        json!({"action": "add", "every_seconds": 60, "message": huge}),
    )
    .await
    .unwrap_err();
    assert!(matches!(error, ToolError::InvalidArgs(_)), "{error:?}");

    // The scheduler itself holds the same line for a caller that skips the schema.
    let cases = [
        (
            request(Some(60), None, &"y".repeat(1 << 20)),
            "at most 4000",
        ),
        (request(Some(60), None, "   "), "message is empty"),
        (request(Some(0), None, "m"), "between 1 and"),
        (request(Some(u64::MAX), None, "m"), "between 1 and"),
        (
            request(None, Some(&"1,".repeat(10_000)), "m"),
            "longer than 200",
        ),
        (
            JobRequest {
                timezone: Some("Z".repeat(100_000)),
                ..request(None, Some("0 9 * * *"), "m")
            },
            "time zone name is longer",
        ),
        (
            JobRequest {
                name: Some("evil\nname".into()),
                ..request(Some(60), None, "m")
            },
            "no control characters",
        ),
        (
            JobRequest {
                session: Some("s".repeat(1_000)),
                ..request(Some(60), None, "m")
            },
            "session key",
        ),
        (
            request(None, Some("0 9 * * MON-FRI * *"), "m"),
            "has 7 fields",
        ),
        (request(None, Some("@reboot"), "m"), "nicknames"),
    ];
    for (request, expected) in cases {
        let error = service.add(request.clone()).unwrap_err();
        assert!(error.contains(expected), "{request:?}: {error}");
    }
    assert!(service.list().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_jobs_file_is_reported_and_kept() {
    let state = tempfile::tempdir().unwrap();
    let file = state.path().join("jobs.json");
    std::fs::write(&file, b"{\"next_id\": 1, \"jobs\": [").unwrap();
    let error = CronService::open(state.path(), MessageBus::new(), CronOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("jobs.json") && error.contains("move it away"),
        "{error}"
    );
    assert_eq!(
        std::fs::read(&file).unwrap(),
        b"{\"next_id\": 1, \"jobs\": ["
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_added_during_a_turn_fires_into_that_sessions_lane() {
    let state = tempfile::tempdir().unwrap();
    let bus = MessageBus::new();
    let service = open(state.path(), &bus, 100);
    let runner = service.start();
    let registry = cron_registry(&service).await;

    let server = LlmServer::start(vec![
        anthropic::message(&[anthropic::tool(
            "call-1",
            "cron",
            json!({"action": "add", "every_seconds": 1, "message": "water the plants", "name": "plants"}),
        )]),
        anthropic::message(&[anthropic::text("I will remind you.")]),
        anthropic::message(&[anthropic::text("Reminder: water the plants.")]),
    ])
    .await;
    let agent = AgentLoop::new(
        anthropic_provider(&server),
        registry,
        AgentConfig::default(),
    );
    let sessions = Sessions::new(agent, None, 100);
    let (sender, mut outcomes) = tokio::sync::mpsc::unbounded_channel();
    let service_for_done = service.clone();
    let _router = sessions.deliver_notifications(
        bus.subscribe(SYSTEM_CHANNEL),
        Arc::new(NoEvents),
        Arc::new(
            move |message: &InboundMessage, outcome: Result<_, AgentError>| {
                // One firing is enough for the test; stop the job before the next.
                let _ = service_for_done.remove("job-1");
                let _ = sender.send((message.clone(), outcome.map(|o| o.text)));
            },
        ),
    );

    let reply = sessions
        .send_user(
            "garden",
            "Remind me every second to water the plants.",
            Arc::new(NoEvents),
        )
        .await
        .unwrap();
    assert_eq!(reply.text, "I will remind you.");
    // The job belongs to the session whose turn added it, not to the default session.
    let jobs = service.list();
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].session, "garden");

    let (message, outcome) = tokio::time::timeout(Duration::from_secs(30), outcomes.recv())
        .await
        .expect("a firing within 30 s")
        .unwrap();
    assert_eq!(message.session_key, "garden");
    assert_eq!(message.content, "[cron job plants] water the plants");
    assert_eq!(outcome.unwrap(), "Reminder: water the plants.");
    // The lane's model request carried the firing as the newest user message.
    let third = &server.bodies()[2];
    let last = third["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .to_string();
    assert!(
        last.contains("[cron job plants] water the plants"),
        "{last}"
    );
    runner.abort();
}

/// Records the keys of the firings delivered to it; refuses the first `refusals`.
#[derive(Default)]
struct RecordingSink {
    delivered: std::sync::Mutex<Vec<String>>,
    refused: std::sync::Mutex<Vec<String>>,
    refusals: std::sync::atomic::AtomicUsize,
}

impl clawcage_agent::cron::FiringSink for RecordingSink {
    fn deliver<'a>(
        &'a self,
        message: InboundMessage,
        key: &'a str,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send + 'a>> {
        Box::pin(async move {
            assert!(message.content.contains("tick"), "{message:?}");
            // Delivery takes a while, as it does through a durable inbox: the runner holds
            // no lock meanwhile.
            tokio::time::sleep(Duration::from_millis(5)).await;
            let left = self.refusals.load(std::sync::atomic::Ordering::SeqCst);
            if left > 0 {
                self.refusals
                    .store(left - 1, std::sync::atomic::Ordering::SeqCst);
                self.refused.lock().unwrap().push(key.to_string());
                return Err("the inbox's disk is full".to_string());
            }
            self.delivered.lock().unwrap().push(key.to_string());
            Ok(())
        })
    }
}

async fn delivered(sink: &RecordingSink, count: usize) -> Vec<String> {
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let keys = sink.delivered.lock().unwrap().clone();
            if keys.len() >= count {
                return keys;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the firings arrive")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_sink_a_refused_firing_stays_due_and_the_same_slot_keeps_its_key() {
    let state = tempfile::tempdir().unwrap();
    let bus = MessageBus::new();
    let mut on_bus = bus.subscribe(SYSTEM_CHANNEL);
    let service = open(state.path(), &bus, 100);
    service
        .add(JobRequest {
            session: Some("agent:main:cli:cron".into()),
            ..request(Some(1), None, "tick")
        })
        .unwrap();
    // What the file says before the first firing: a process stopped between delivering that
    // firing and saving would leave exactly this.
    let before = std::fs::read(state.path().join("jobs.json")).unwrap();
    let sink = Arc::new(RecordingSink::default());
    sink.refusals.store(1, std::sync::atomic::Ordering::SeqCst);
    service.set_sink(sink.clone());
    let runner = service.start();
    let keys = delivered(&sink, 2).await;
    runner.abort();
    let refused = sink.refused.lock().unwrap().clone();
    assert_eq!(refused.len(), 1);
    assert_eq!(
        keys[0], refused[0],
        "the refused slot is delivered later, same key"
    );
    assert_ne!(keys[0], keys[1]);
    assert!(keys[0].starts_with("cron:job-1:"), "{keys:?}");
    assert_eq!(
        count_for(&mut on_bus, Duration::from_millis(100)).await,
        0,
        "with a sink nothing goes on the bus"
    );

    // A stop after the delivery and before the save: the next process fires the same slot
    // under the same key, and the inbox recognises it.
    std::fs::write(state.path().join("jobs.json"), before).unwrap();
    let again = open(state.path(), &bus, 100);
    let second = Arc::new(RecordingSink::default());
    again.set_sink(second.clone());
    let runner = again.start();
    let replayed = delivered(&second, 1).await;
    runner.abort();
    assert_eq!(replayed[0], keys[0]);
}
