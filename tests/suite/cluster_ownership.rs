//! The partitions' owners when several hosts serve at once ([`Ownership`]), against a real
//! `nats-server`: three hosts share the 64 partitions exactly as the rendezvous placement says,
//! none held twice; a host killed (its leases left to expire) has its partitions taken by the
//! others after one time to live, under larger epochs, its own fences shut by then; a host that
//! joins gets its share handed over by the hosts that held it, each told to stop serving first
//! and the lease given up only once it said so; a host that stops gives its partitions back at
//! once; a host that never answers a hand-over loses the partition after the grace anyway; and
//! a host whose server hangs past its fences loses its partitions, their fences shut for good,
//! and takes them again under new epochs once the server goes on.
//! Each host's stores, checking the fences it keeps, write only the sessions of its partitions.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use clawcage_agent::TranscriptStore;
use clawcage_cluster::leases::{PARTITIONS, partition_lease, partition_of, partitions_won};
use clawcage_cluster::{
    ClusterOptions, Holder, JetStreamTranscripts, Ownership, OwnershipOptions, PartitionChange,
    PartitionFences, WriteFence,
};
use clawcage_core::redact::Redactor;
use clawcage_tests::nats::NatsServer;
use tokio::sync::mpsc;

use crate::cluster::{connect_with, event};
use crate::cluster_leases::short_leases;

/// The leases' time to live in these tests.
const TTL: Duration = Duration::from_secs(2);

/// One host keeping its partitions, with what it was told.
struct Host {
    name: String,
    ownership: Option<Ownership>,
    changes: mpsc::UnboundedReceiver<PartitionChange>,
    /// The fences of the partitions it gained, by partition (the latest).
    fences: BTreeMap<u32, WriteFence>,
    /// The table its stores check, kept as a gateway keeps it: held on a gain, let go on a
    /// hand-over before it is answered.
    table: PartitionFences,
    /// Hand-overs asked of it, answered or not (by `answer_releases`).
    released: Vec<u32>,
    answer_releases: bool,
    /// Hand-overs kept unanswered, so that the grace is what ends them.
    unanswered: Vec<tokio::sync::oneshot::Sender<()>>,
    /// Partitions it was told it lost, where a test expects losses (`None`: a loss fails it).
    lost: Option<Vec<u32>>,
}

impl Host {
    async fn start(server: &NatsServer, name: &str) -> Self {
        let leases = connect_with(server, &short_leases(TTL.as_secs()))
            .await
            .leases(Holder {
                host: name.to_string(),
                incarnation: format!("{name}-1"),
            })
            .await
            .unwrap();
        let (ownership, changes) =
            Ownership::start(leases, OwnershipOptions::for_ttl(PARTITIONS, TTL)).unwrap();
        Self {
            name: name.to_string(),
            ownership: Some(ownership),
            changes,
            fences: BTreeMap::new(),
            table: PartitionFences::new(),
            released: Vec::new(),
            answer_releases: true,
            unanswered: Vec::new(),
            lost: None,
        }
    }

    fn owned(&self) -> BTreeMap<u32, u64> {
        self.ownership
            .as_ref()
            .map(Ownership::owned)
            .unwrap_or_default()
    }

    /// Takes in what it was told so far, answering hand-overs as a gateway does once it
    /// stopped serving the partition (unless told not to).
    fn drain_changes(&mut self) {
        while let Ok(change) = self.changes.try_recv() {
            match change {
                PartitionChange::Gained {
                    partition,
                    epoch,
                    fence,
                } => {
                    assert!(fence.is_open(), "partition {partition} gained shut");
                    assert!(epoch > 0);
                    self.table.hold(partition, fence.clone(), epoch);
                    self.fences.insert(partition, fence);
                }
                PartitionChange::Release { partition, done } => {
                    self.released.push(partition);
                    self.table.let_go(partition);
                    if self.answer_releases {
                        done.send(()).unwrap();
                    } else {
                        self.unanswered.push(done);
                    }
                }
                PartitionChange::Lost { partition, why } => match &mut self.lost {
                    Some(lost) => {
                        self.table.let_go(partition);
                        lost.push(partition);
                    }
                    None => panic!("{} lost partition {partition}: {why}", self.name),
                },
            }
        }
    }
}

fn names(hosts: &[&Host]) -> Vec<String> {
    hosts.iter().map(|host| host.name.clone()).collect()
}

/// Waits (taking in every host's changes) until `hosts` hold exactly their rendezvous shares
/// among themselves, every partition once; the time it took.
async fn until_settled(hosts: &mut [&mut Host], within: Duration) -> Duration {
    let started = Instant::now();
    let live: Vec<String> = hosts.iter().map(|host| host.name.clone()).collect();
    loop {
        for host in hosts.iter_mut() {
            host.drain_changes();
        }
        let settled = hosts.iter().all(|host| {
            let owned: BTreeSet<u32> = host.owned().into_keys().collect();
            owned
                == partitions_won(&host.name, &live, PARTITIONS)
                    .into_iter()
                    .collect()
        });
        if settled {
            let all: usize = hosts.iter().map(|host| host.owned().len()).sum();
            assert_eq!(all, PARTITIONS as usize, "every partition once");
            return started.elapsed();
        }
        assert!(
            started.elapsed() < within,
            "the partitions did not settle on {live:?} within {within:?}: {:?}",
            hosts
                .iter()
                .map(|host| (host.name.clone(), host.owned().len()))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn three_hosts_share_the_partitions_and_a_killed_hosts_move_to_the_others() {
    let Some(server) = NatsServer::start("three_hosts_share_the_partitions") else {
        return;
    };
    let mut a = Host::start(&server, "a").await;
    let mut b = Host::start(&server, "b").await;
    let mut c = Host::start(&server, "c").await;
    until_settled(&mut [&mut a, &mut b, &mut c], Duration::from_secs(15)).await;
    // The server says the same as the hosts: every partition's lease names its owner.
    let look = connect_with(&server, &short_leases(TTL.as_secs()))
        .await
        .leases(Holder {
            host: "status".to_string(),
            incarnation: "status-1".to_string(),
        })
        .await
        .unwrap();
    for host in [&a, &b, &c] {
        for (partition, epoch) in host.owned() {
            let (holder, _) = look
                .holder(&partition_lease(partition))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(holder.host, host.name, "partition {partition}");
            assert!(epoch > 0);
        }
    }
    let c_had = c.owned();
    assert!(!c_had.is_empty());
    // (Each host that started took what it found free, and handed over what the next won.)
    a.released.clear();
    b.released.clear();
    let c_fences: Vec<WriteFence> = c_had.keys().map(|p| c.fences[p].clone()).collect();

    // c dies: nothing given back.
    let killed = Instant::now();
    c.ownership.take().unwrap().abandon().await;
    let took = until_settled(&mut [&mut a, &mut b], Duration::from_secs(15)).await;
    let moved = killed.elapsed();
    eprintln!("a killed host's partitions were taken {moved:?} after the kill (lease {TTL:?})");
    // Not before its leases expired (one time to live), and soon after.
    assert!(
        moved >= TTL * 3 / 4,
        "taken after {moved:?}, before the lease (renewed up to a tick before) expired"
    );
    assert!(moved < TTL * 4, "taken only after {moved:?} ({took:?})");
    // By then the dead host's fences had shut (it would have stopped writing).
    for fence in &c_fences {
        assert!(!fence.is_open(), "a dead holder's fence stays open");
    }
    for (partition, old_epoch) in &c_had {
        let now = a
            .owned()
            .get(partition)
            .or(b.owned().get(partition))
            .copied();
        let now = now.unwrap_or_else(|| panic!("partition {partition} has no owner"));
        assert!(
            now > *old_epoch,
            "partition {partition}: epoch {now} after {old_epoch}"
        );
    }
    assert!(a.released.is_empty() && b.released.is_empty());
    for host in [a, b] {
        host.ownership.unwrap().stop().await;
    }
}

#[tokio::test]
async fn a_joining_host_is_handed_its_share_and_a_stopping_one_gives_its_back() {
    let Some(server) = NatsServer::start("a_joining_host_is_handed_its_share") else {
        return;
    };
    let mut a = Host::start(&server, "a").await;
    let mut b = Host::start(&server, "b").await;
    until_settled(&mut [&mut a, &mut b], Duration::from_secs(15)).await;
    let before: BTreeMap<u32, u64> = a.owned().into_iter().chain(b.owned()).collect();
    a.released.clear();
    b.released.clear();
    // b does not answer its hand-overs: the grace ends them.
    b.answer_releases = false;

    let mut c = Host::start(&server, "c").await;
    let took = until_settled(&mut [&mut a, &mut b, &mut c], Duration::from_secs(15)).await;
    eprintln!("a joining host had its share after {took:?} (one holder let its grace run out)");
    let c_won: BTreeSet<u32> = partitions_won("c", &names(&[&a, &b, &c]), PARTITIONS)
        .into_iter()
        .collect();
    // Exactly c's share was handed over, each by the host that held it, before c took it.
    let handed: BTreeSet<u32> = a.released.iter().chain(&b.released).copied().collect();
    assert_eq!(handed, c_won);
    for partition in &c_won {
        assert!(c.owned()[partition] > before[partition]);
    }
    // What b left unanswered was taken only after the grace (half the time to live) and well
    // before a time to live (it was given back, not left to expire).
    if !b.released.is_empty() {
        assert!(took >= TTL / 2, "b's hand-overs ended after {took:?}");
    }
    assert!(took < TTL * 3, "the hand-over took {took:?}");
    drop(b.unanswered.drain(..));

    // c stops: its partitions go back to a and b within a tick or two, not a time to live.
    let stopping = Instant::now();
    c.ownership.take().unwrap().stop().await;
    let fences_of_c: Vec<&WriteFence> = c_won.iter().map(|p| &c.fences[p]).collect();
    assert!(fences_of_c.iter().all(|fence| !fence.is_open()));
    // Its liveness lease is gone at once too, so a and b want its partitions back at once.
    b.answer_releases = true;
    until_settled(&mut [&mut a, &mut b], Duration::from_secs(15)).await;
    let back = stopping.elapsed();
    eprintln!("a stopping host's partitions were taken {back:?} after it stopped");
    assert!(back < TTL, "given back, yet taken only after {back:?}");
    for host in [a, b] {
        host.ownership.unwrap().stop().await;
    }
}

/// A session of a partition `host` owns now.
fn session_of(host: &Host, name: &str) -> String {
    (0..10_000)
        .map(|n| format!("agent:main:{name}-{n}"))
        .find(|key| host.table.owns(key))
        .unwrap_or_else(|| panic!("{} owns no partition", host.name))
}

/// Two hosts serving their shares at once: each host's stores write a session only while the
/// host owns its partition (another's is refused before it leaves the process, and its events
/// carry the partition's epoch); when one host dies, the other takes its partitions and, after
/// taking the session up, writes it, while the dead host's stores stay refused; the session's
/// stored events carry first the dead host's epoch, then the larger one of the host that took
/// it over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_hosts_stores_write_only_the_sessions_of_its_partitions() {
    let Some(server) = NatsServer::start("stores_write_only_their_partitions") else {
        return;
    };
    let mut a = Host::start(&server, "a").await;
    let mut b = Host::start(&server, "b").await;
    until_settled(&mut [&mut a, &mut b], Duration::from_secs(15)).await;
    let (mine, theirs) = (session_of(&a, "mine"), session_of(&b, "theirs"));
    let server = &server;
    let stores_of = |host: &Host| {
        let options = ClusterOptions {
            write_fences: host.table.clone().into(),
            ..short_leases(TTL.as_secs())
        };
        let url = server.url();
        async move {
            let events = connect_with(server, &options).await.event_log();
            let transcripts = tokio::task::spawn_blocking(move || {
                JetStreamTranscripts::connect(&url, &options, Redactor::default()).unwrap()
            })
            .await
            .unwrap();
            (transcripts, events)
        }
    };
    let (a_transcripts, a_events) = stores_of(&a).await;
    let (b_transcripts, b_events) = stores_of(&b).await;
    // The user's messages at odd times, the assistant's at even ones.
    let append = |store: &JetStreamTranscripts, key: &str, at_ms: u64, text: &str| {
        let (store, key, text) = (store.clone(), key.to_string(), text.to_string());
        tokio::task::spawn_blocking(move || {
            store
                .append_steps(&key, &[crate::cluster_stores::message(at_ms, &text)])
                .map_err(|error| error.to_string())
        })
    };
    append(&a_transcripts, &mine, 1, "a writes its own")
        .await
        .unwrap()
        .unwrap();
    append(&b_transcripts, &theirs, 1, "b writes its own")
        .await
        .unwrap()
        .unwrap();
    let refused = append(&a_transcripts, &theirs, 2, "a writes b's")
        .await
        .unwrap();
    let refused = refused.expect_err("a session of another host's partition is refused");
    assert!(refused.contains("was not sent"), "{refused}");
    let epoch = a.table.epoch_of(&mine).unwrap();
    assert_eq!(Some(epoch), a.owned().get(&partition_of(&mine)).copied());
    a_events
        .append(event(&mine, 1, "a's event"), epoch)
        .await
        .unwrap();
    let refused = a_events.append(event(&theirs, 1, "a's event"), epoch).await;
    assert!(refused.is_err(), "an event of b's session is refused");

    // b dies: a takes its partitions, takes the session up, and writes it.
    let b_epoch = b.table.epoch_of(&theirs).unwrap();
    b_events
        .append(event(&theirs, 1, "b's event"), b_epoch)
        .await
        .unwrap();
    b.ownership.take().unwrap().abandon().await;
    until_settled(&mut [&mut a], Duration::from_secs(15)).await;
    assert!(a.table.owns(&theirs));
    assert!(
        a.table.epoch_of(&theirs).unwrap() > b_epoch,
        "the session's new writer has a larger epoch"
    );
    let taken = a_transcripts.clone();
    let key = theirs.clone();
    tokio::task::spawn_blocking(move || taken.take_up(&[key]).unwrap())
        .await
        .unwrap();
    append(&a_transcripts, &theirs, 2, "a writes it now")
        .await
        .unwrap()
        .unwrap();
    let a_epoch = a.table.epoch_of(&theirs).unwrap();
    a_events
        .append(event(&theirs, 2, "a's event"), a_epoch)
        .await
        .unwrap();
    // The session's events, as the stream holds them: each with its writer's epoch.
    let writers = connect_with(server, &short_leases(TTL.as_secs()))
        .await
        .event_writers(&theirs)
        .await
        .unwrap();
    assert_eq!(writers, [(1, b_epoch), (2, a_epoch)]);
    let refused = append(&b_transcripts, &theirs, 3, "b, dead, writes")
        .await
        .unwrap();
    assert!(refused.is_err(), "the dead host's store writes on");
    let read = a_transcripts.clone();
    let key = theirs.clone();
    let texts: Vec<String> = tokio::task::spawn_blocking(move || read.load(&key, 100).unwrap())
        .await
        .unwrap()
        .messages
        .iter()
        .map(|message| format!("{message:?}"))
        .collect();
    assert_eq!(texts.len(), 2, "{texts:?}");
    assert!(texts[0].contains("b writes its own") && texts[1].contains("a writes it now"));
    a.ownership.take().unwrap().stop().await;
}

#[tokio::test]
async fn a_host_whose_server_hangs_past_its_fences_takes_its_partitions_again_under_new_epochs() {
    let Some(server) = NatsServer::start("a_host_whose_server_hangs") else {
        return;
    };
    let mut a = Host::start(&server, "a").await;
    until_settled(&mut [&mut a], Duration::from_secs(15)).await;
    a.lost = Some(Vec::new());
    let had = a.owned();
    let fences: Vec<WriteFence> = had.keys().map(|p| a.fences[p].clone()).collect();

    // Longer than the fences' 70% of the time to live: every renewal comes back too late.
    server.pause();
    tokio::time::sleep(TTL).await;
    assert!(
        fences.iter().all(|fence| !fence.is_open()),
        "the fences shut while the server hung"
    );
    server.resume();
    let resumed = Instant::now();
    while a.lost.as_ref().map_or(0, Vec::len) < PARTITIONS as usize {
        assert!(
            resumed.elapsed() < Duration::from_secs(15),
            "lost only {:?}",
            a.lost
        );
        a.drain_changes();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    until_settled(&mut [&mut a], Duration::from_secs(15)).await;
    eprintln!(
        "a host whose server hung took its partitions again {:?} after the server went on",
        resumed.elapsed()
    );
    let lost: BTreeSet<u32> = a.lost.clone().unwrap_or_default().into_iter().collect();
    assert_eq!(lost.len(), PARTITIONS as usize, "each partition lost once");
    for fence in &fences {
        assert!(!fence.is_open(), "a fence that shut stays shut");
    }
    for (partition, epoch) in a.owned() {
        assert!(
            epoch > had[&partition],
            "partition {partition}: epoch {epoch} after {}",
            had[&partition]
        );
        assert!(a.fences[&partition].is_open(), "the new fence is open");
    }
    a.ownership.unwrap().stop().await;
}
