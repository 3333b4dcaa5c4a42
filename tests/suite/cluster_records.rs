//! The records a cluster's hosts share (`claw_state` on a real `nats-server`). The cron jobs:
//! jobs added on one host are the jobs of every host; a write made at a revision another host has
//! since moved past is refused and nothing of it is stored; two hosts firing the same jobs at once
//! deliver every slot, none twice into the (deduplicating) inbox, and a host that dies mid-run
//! leaves no slot unfired; a record larger than the server takes is refused with what to do. The
//! pairings: a code issued on one host is approved on another, and hosts changing them at once
//! lose no change.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clawcage_agent::MessageBus;
use clawcage_agent::cron::{CronOptions, CronService, FiringSink};
use clawcage_cluster::records::{CRON_RECORD, PAIRING_RECORD};
use clawcage_cluster::{ClusterOptions, KvRecord, KvRecords};
use clawcage_core::records::{RecordStore, RecordWriteError, StoredRecord};
use clawcage_core::{InboundMessage, JobRequest, Scheduler};
use clawcage_gateway::channels::pairing::{CodeRequest, PairingStore};
use clawcage_tests::nats::NatsServer;

/// One host's connection to the shared records.
fn records(server: &NatsServer) -> KvRecords {
    KvRecords::connect(&server.url(), &ClusterOptions::default())
        .unwrap_or_else(|error| panic!("{error}\n{}", server.log()))
}

fn jobs(server: &NatsServer) -> Arc<KvRecord> {
    Arc::new(records(server).record(CRON_RECORD))
}

fn service(store: Arc<KvRecord>) -> Arc<CronService> {
    CronService::open_in(store, MessageBus::new(), CronOptions::default()).unwrap()
}

fn every(seconds: u64, message: &str) -> JobRequest {
    JobRequest {
        every_seconds: Some(seconds),
        message: message.to_string(),
        session: Some("agent:main:cron:shared".to_string()),
        ..JobRequest::default()
    }
}

/// An inbox as the hosts share it: a firing's key is taken once; every delivery is counted.
#[derive(Default)]
struct SharedInbox {
    /// Each key with how many times a host delivered it.
    deliveries: Mutex<BTreeMap<String, u32>>,
}

impl FiringSink for SharedInbox {
    fn deliver<'a>(
        &'a self,
        _message: InboundMessage,
        key: &'a str,
    ) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send + 'a>> {
        *self
            .deliveries
            .lock()
            .unwrap()
            .entry(key.to_string())
            .or_default() += 1;
        Box::pin(async { Ok(()) })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_added_on_one_host_are_every_hosts_and_a_write_behind_another_is_refused() {
    let Some(server) = NatsServer::start("cron_jobs_are_every_hosts") else {
        return;
    };
    let (store_a, store_b) = (jobs(&server), jobs(&server));
    let (host_a, host_b) = (service(store_a.clone()), service(store_b.clone()));
    let first = host_a.add(every(60, "stand-up")).unwrap();
    let second = host_b.add(every(120, "water the plants")).unwrap();
    assert_ne!(first.id, second.id, "one numbering across hosts");
    for host in [&host_a, &host_b] {
        let listed: Vec<String> = host.list().into_iter().map(|job| job.message).collect();
        assert_eq!(listed, ["stand-up", "water the plants"]);
    }
    host_a.remove(&second.id).unwrap();
    assert_eq!(
        host_b.list().len(),
        1,
        "a removal is seen by the other host"
    );
    // A host opening later finds them.
    assert_eq!(service(jobs(&server)).list()[0].id, first.id);

    // The store itself: a write names the revision it read.
    let StoredRecord::Found { bytes, version } = store_a.read(None).unwrap() else {
        panic!("the jobs are stored");
    };
    assert!(matches!(
        store_a.read(Some(&version)).unwrap(),
        StoredRecord::Unchanged
    ));
    let newer = store_b.write(&bytes, Some(&version)).unwrap();
    assert!(
        matches!(
            store_a.write(b"{\"next_id\":0,\"jobs\":[]}", Some(&version)),
            Err(RecordWriteError::Changed)
        ),
        "a write behind another host's is refused"
    );
    assert!(
        matches!(
            store_a.write(b"{\"next_id\":0,\"jobs\":[]}", None),
            Err(RecordWriteError::Changed)
        ),
        "creating what exists is refused"
    );
    let StoredRecord::Found { version, .. } = store_a.read(None).unwrap() else {
        panic!("still stored");
    };
    assert_eq!(version, newer, "nothing of the refused writes was stored");
    assert_eq!(host_a.list().len(), 1);

    // A record larger than the server takes is refused before it is sent, saying what to do.
    let huge = vec![b' '; 1_100_000];
    match store_a.write(&huge, Some(&newer)) {
        Err(RecordWriteError::Failed(message)) => {
            assert!(message.contains("remove entries"), "{message}")
        }
        other => panic!("a 1.1 MB record must be refused: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hosts_firing_one_job_deliver_every_slot_and_the_inbox_takes_each_once() {
    let Some(server) = NatsServer::start("cron_two_hosts_fire") else {
        return;
    };
    let inbox = Arc::new(SharedInbox::default());
    let (host_a, host_b) = (service(jobs(&server)), service(jobs(&server)));
    let job = host_a.add(every(1, "tick")).unwrap();
    host_a.set_sink(inbox.clone());
    host_b.set_sink(inbox.clone());
    // Both fire at once (the worst case: a host that lost the gateway lease but has not
    // noticed yet); then one dies and the other goes on alone.
    let (runner_a, runner_b) = (host_a.start(), host_b.start());
    tokio::time::sleep(Duration::from_millis(3_300)).await;
    runner_a.abort();
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    runner_b.abort();

    let deliveries = inbox.deliveries.lock().unwrap().clone();
    let prefix = format!("cron:{}:", job.id);
    let slots: Vec<chrono::DateTime<chrono::Utc>> = deliveries
        .keys()
        .map(|key| {
            let due = key.strip_prefix(&prefix).unwrap_or_else(|| panic!("{key}"));
            chrono::DateTime::parse_from_rfc3339(due)
                .unwrap()
                .with_timezone(&chrono::Utc)
        })
        .collect();
    assert!(
        slots.len() >= 5,
        "about six slots in 6.3 s, got {deliveries:?}"
    );
    for pair in slots.windows(2) {
        assert_eq!(
            pair[1] - pair[0],
            chrono::Duration::seconds(1),
            "consecutive slots, none lost or fired off its cadence: {deliveries:?}"
        );
    }
    // A slot is delivered again only when both hosts took it before either moved the job on;
    // the inbox takes it once. Never more than once per host.
    assert!(
        deliveries.values().all(|count| *count <= 2),
        "{deliveries:?}"
    );
    // The job moved past every slot delivered.
    let next = host_b.list()[0].next_fire.clone().unwrap();
    let next = chrono::DateTime::parse_from_rfc3339(&next).unwrap();
    assert!(next > *slots.last().unwrap(), "{next} after {slots:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_code_issued_on_one_host_is_approved_on_another_and_no_change_is_lost() {
    let Some(server) = NatsServer::start("pairings_are_every_hosts") else {
        return;
    };
    let host_a = PairingStore::in_store(Arc::new(records(&server).record(PAIRING_RECORD)));
    let host_b = PairingStore::in_store(Arc::new(records(&server).record(PAIRING_RECORD)));
    let CodeRequest::Issued(code) = host_a.request("telegram", "111", "Ada").unwrap() else {
        panic!("a first request gets a code");
    };
    // The other host knows the code: the sender writing again is told it is pending.
    assert_eq!(
        host_b.request("telegram", "111", "Ada").unwrap(),
        CodeRequest::AlreadyPending(code.clone())
    );
    let approved = host_b.approve(&code).unwrap();
    assert_eq!(approved.peer, "111");
    assert!(host_a.is_approved("telegram", "111").unwrap());

    // Hosts issuing codes at once: each change is kept (a write behind another reads again).
    let threads: Vec<_> = (0..4)
        .map(|thread| {
            let store = if thread % 2 == 0 {
                host_a.clone()
            } else {
                host_b.clone()
            };
            std::thread::spawn(move || {
                for peer in 0..5 {
                    let peer = format!("{thread}-{peer}");
                    assert!(matches!(
                        store.request("telegram", &peer, "someone").unwrap(),
                        CodeRequest::Issued(_)
                    ));
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    let (pending, approved) = host_a.list().unwrap();
    assert_eq!(pending.len(), 20, "{pending:?}");
    assert_eq!(approved.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allow_always_decision_made_on_one_host_is_every_hosts() {
    let Some(server) = NatsServer::start("approvals_are_every_hosts") else {
        return;
    };
    let state = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let host_a = clawcage_agent::ApprovalStore::in_state_dir(state.0.path());
    let host_b = clawcage_agent::ApprovalStore::in_state_dir(state.1.path());
    for host in [&host_a, &host_b] {
        host.share_in(Arc::new(
            records(&server).record(clawcage_cluster::records::APPROVALS_RECORD),
        ));
    }
    let decision = clawcage_agent::approvals::StoredApproval {
        id: "apv-1".to_string(),
        kind: "exec".to_string(),
        entry: clawcage_core::approval::AllowEntry::parse("rm -r build").unwrap(),
        created: "2026-12-06T00:00:00Z".to_string(),
        session: None,
    };
    host_a.add(vec![decision.clone()]).unwrap();
    let seen = host_b.list().unwrap();
    assert_eq!(seen, vec![decision.clone()], "the other host knows it");
    assert!(
        host_b.describe().contains("claw_state"),
        "{}",
        host_b.describe()
    );
    // Nothing went to either state directory.
    assert!(!state.0.path().join("approvals.json").exists());
    host_b.revoke("apv-1").unwrap();
    assert!(host_a.list().unwrap().is_empty(), "revoked for every host");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_taken_once_on_one_host_is_taken_for_every_host() {
    let Some(server) = NatsServer::start("keys_taken_once") else {
        return;
    };
    let (host_a, host_b) = (records(&server), records(&server));
    assert!(host_a.take_once("webhook.ops.00ff").unwrap());
    assert!(
        !host_b.take_once("webhook.ops.00ff").unwrap(),
        "the other host"
    );
    assert!(
        !host_a.take_once("webhook.ops.00ff").unwrap(),
        "the same host"
    );
    assert!(host_b.take_once("webhook.ops.01ff").unwrap(), "another key");
    // Hosts racing for one key: exactly one takes it.
    let racers: Vec<_> = (0..6)
        .map(|index| {
            let records = if index % 2 == 0 {
                host_a.clone()
            } else {
                host_b.clone()
            };
            std::thread::spawn(move || records.take_once("webhook.ops.race").unwrap())
        })
        .collect();
    let taken = racers
        .into_iter()
        .map(|racer| racer.join().unwrap())
        .filter(|taken| *taken)
        .count();
    assert_eq!(taken, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_days_token_count_is_every_hosts_and_no_charge_is_lost() {
    let Some(server) = NatsServer::start("budget_is_every_hosts") else {
        return;
    };
    let config = clawcage_agent::BudgetConfig {
        session_tokens: None,
        daily_tokens: Some(1_000),
    };
    let budget = |records: &KvRecords| {
        Arc::new(clawcage_agent::Budget::in_store(
            config,
            Some(Arc::new(
                records.record(clawcage_cluster::records::BUDGET_RECORD),
            )),
        ))
    };
    let (host_a, host_b) = (budget(&records(&server)), budget(&records(&server)));
    // Charges made on both hosts at once: every one is counted.
    let chargers: Vec<_> = (0..4)
        .map(|index| {
            let budget = if index % 2 == 0 {
                host_a.clone()
            } else {
                host_b.clone()
            };
            std::thread::spawn(move || {
                for _ in 0..10 {
                    budget.charge(Some("agent:main:s"), 20);
                }
            })
        })
        .collect();
    for charger in chargers {
        charger.join().unwrap();
    }
    assert_eq!(host_a.used_today(), 800);
    assert_eq!(host_b.used_today(), 800);
    assert!(host_b.check(None).is_ok());
    host_a.charge(None, 200);
    let refused = host_b.check(None).unwrap_err();
    assert!(
        refused.contains("today's budget of 1000 tokens"),
        "{refused}"
    );
    // A host that starts later takes the day's count up.
    assert_eq!(budget(&records(&server)).used_today(), 1_000);
}
