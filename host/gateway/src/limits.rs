//! How many connections the gateway holds, and how long one may stay without the token.
//!
//! Every accepted TCP connection first takes a place among the *unauthenticated* ones (the web
//! chat's page and assets, `/healthz`, webhooks, a WebSocket before its `connect`). There are at
//! most [`Limits::max_unauthenticated`] of them, and at most [`Admissions::per_address`] from one
//! source address (an IPv6 address counts by its /64). A new connection is never turned away:
//! when its address, or the gateway, is at the cap, the *oldest* unauthenticated connection (of
//! that address first) is closed at once to make room, so the newest one — the owner
//! reconnecting — always gets its seconds to authenticate, and the first such eviction in a
//! minute is logged as one warning naming the cap and the addresses. A WebSocket whose `connect`
//! carries the token leaves that pool for the *authenticated* one
//! ([`PendingSlot::promote`]), which holds the rest of [`Limits::max_connections`] and which no
//! unauthenticated connection can fill or evict from. A loopback listener counts every peer as
//! one address: all local users are 127.0.0.1 (or another address of 127/8, which any of them
//! may pick), so a per-address cap would tell the owner from no one.
//!
//! The caps are sized from the process's open-file limit, which [`raise_open_file_limit`] lifts
//! to the hard limit (at most [`OPEN_FILES_WANTED`]) at the start, so that the connections at
//! their caps still leave descriptors for the sessions' files. The timeouts of an
//! unauthenticated connection are applied where it is served (`http.rs`, `connection.rs`):
//! [`Limits::unauthenticated_timeout`] for each request's headers (and the idle time before the
//! next one) and for the WebSocket's `connect`, [`LIFETIME_TIMEOUTS`] times it for the whole
//! HTTP connection.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

/// How long an unauthenticated connection may wait for each step by default.
pub const UNAUTHENTICATED_TIMEOUT: Duration = Duration::from_secs(10);

/// An unauthenticated HTTP connection lives at most this many timeouts in all (then it is shut
/// down gracefully: the request in flight is answered, the connection closed).
pub const LIFETIME_TIMEOUTS: u32 = 3;

/// The open-file soft limit the gateway raises itself to when the hard limit allows.
pub const OPEN_FILES_WANTED: u64 = 1 << 16;

/// Connections at most whatever the open-file limit (a personal gateway needs far fewer).
const MAX_CONNECTIONS_CEILING: usize = 8192;

/// Unauthenticated connections at most whatever the open-file limit.
const MAX_UNAUTHENTICATED_CEILING: usize = 1024;

/// How often the cap's warning is logged at most.
const NOTICE_EVERY: Duration = Duration::from_secs(60);

/// The caps and the timeout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Connections at once in all, authenticated or not.
    pub max_connections: usize,
    /// Of those, connections that have not presented the token yet.
    pub max_unauthenticated: usize,
    /// How long an unauthenticated connection may take for its request headers (counted from
    /// its start or from the previous response) and for the WebSocket's `connect`.
    pub unauthenticated_timeout: Duration,
}

impl Limits {
    /// The caps that fit `open_files` descriptors: a quarter (at least 128) kept for the
    /// gateway's own files, a quarter of the rest (8 to 1,024) for unauthenticated connections.
    pub fn for_open_files(open_files: u64) -> Self {
        let usable = open_files.saturating_sub((open_files / 4).max(128));
        let max_connections = usize::try_from(usable)
            .unwrap_or(usize::MAX)
            .clamp(16, MAX_CONNECTIONS_CEILING);
        Self {
            max_connections,
            max_unauthenticated: (max_connections / 4).clamp(8, MAX_UNAUTHENTICATED_CEILING),
            unauthenticated_timeout: UNAUTHENTICATED_TIMEOUT,
        }
    }

    /// The caps that fit the process's current open-file limit.
    pub fn for_this_process() -> Self {
        Self::for_open_files(open_file_limit().map_or(1024, |(soft, _)| soft))
    }

    /// Authenticated connections at most: what the unauthenticated ones leave.
    pub fn max_authenticated(&self) -> usize {
        self.max_connections
            .saturating_sub(self.max_unauthenticated)
            .max(1)
    }

    /// How long an unauthenticated HTTP connection lives at most.
    pub fn unauthenticated_lifetime(&self) -> Duration {
        self.unauthenticated_timeout * LIFETIME_TIMEOUTS
    }

    /// Checks caps chosen on the command line against each other and against `open_files`;
    /// says what to change.
    pub fn check(&self, open_files: Option<u64>) -> Result<(), String> {
        if self.max_unauthenticated == 0 || self.max_unauthenticated >= self.max_connections {
            return Err(format!(
                "--max-unauthenticated ({}) must be at least 1 and below --max-connections ({}), which also counts the authenticated connections",
                self.max_unauthenticated, self.max_connections
            ));
        }
        if self.unauthenticated_timeout.is_zero() {
            return Err("--unauthenticated-timeout must be at least 1 second".to_string());
        }
        if let Some(open_files) = open_files {
            let fits = Self::for_open_files(open_files).max_connections;
            let asked = u64::try_from(self.max_connections).unwrap_or(u64::MAX);
            if asked > open_files.saturating_sub(64) {
                return Err(format!(
                    "--max-connections {} does not fit the open-file limit of {open_files} (about {fits} connections do, beside the gateway's own files): pass a smaller --max-connections, or raise the hard limit (ulimit -Hn) before starting the gateway",
                    self.max_connections
                ));
            }
        }
        Ok(())
    }
}

/// The open-file limit, soft and hard (`None` when it cannot be read or there is none).
pub fn open_file_limit() -> Option<(u64, u64)> {
    #[cfg(unix)]
    {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        #[expect(
            unsafe_code,
            reason = "getrlimit writes into the rlimit it is given, which lives on this stack"
        )]
        let read = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
        (read == 0).then_some((widen(limit.rlim_cur), widen(limit.rlim_max)))
    }
    #[cfg(not(unix))]
    {
        None
    }
}

/// An rlimit value as a u64: `rlim_t` is u64 on Linux and macOS, i64 on the BSDs.
#[cfg(unix)]
#[allow(
    clippy::useless_conversion,
    clippy::unnecessary_fallible_conversions,
    reason = "rlim_t is u64 here, not on every unix"
)]
fn widen(value: libc::rlim_t) -> u64 {
    u64::try_from(value).unwrap_or(u64::MAX)
}

/// Raises the open-file soft limit to the hard limit, at most [`OPEN_FILES_WANTED`]; returns
/// the soft and hard limits in force afterwards, or why they could not be read or raised.
pub fn raise_open_file_limit() -> Result<(u64, u64), String> {
    let Some((soft, hard)) = open_file_limit() else {
        return Err("cannot read the open-file limit".to_string());
    };
    let wanted = hard.min(OPEN_FILES_WANTED);
    if soft >= wanted {
        return Ok((soft, hard));
    }
    #[cfg(unix)]
    {
        let limit = libc::rlimit {
            rlim_cur: wanted as libc::rlim_t,
            rlim_max: hard as libc::rlim_t,
        };
        #[expect(
            unsafe_code,
            reason = "setrlimit only reads the rlimit it is given, which lives on this stack"
        )]
        let set = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) };
        if set != 0 {
            return Err(format!(
                "cannot raise the open-file limit from {soft} to {wanted}: {}",
                std::io::Error::last_os_error()
            ));
        }
    }
    open_file_limit().ok_or_else(|| "cannot read the open-file limit".to_string())
}

/// The address a peer is counted under: IPv4 as it is, IPv6 by its /64 (one host's share),
/// every address on a loopback listener as one.
fn group_of(ip: IpAddr, loopback: bool) -> IpAddr {
    if loopback {
        return IpAddr::V6(Ipv6Addr::LOCALHOST);
    }
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Addr::from(
                u128::from(v6) & 0xffff_ffff_ffff_ffff_0000_0000_0000_0000,
            )),
        },
    }
}

/// One unauthenticated connection in the pool.
struct Pending {
    peer: SocketAddr,
    group: IpAddr,
    evict: CancellationToken,
}

#[derive(Default)]
struct Pool {
    next: u64,
    /// By admission order: the first is the oldest.
    pending: BTreeMap<u64, Pending>,
    by_group: HashMap<IpAddr, BTreeSet<u64>>,
    authenticated: usize,
}

impl Pool {
    fn remove(&mut self, seq: u64) -> Option<Pending> {
        let pending = self.pending.remove(&seq)?;
        if let Some(set) = self.by_group.get_mut(&pending.group) {
            set.remove(&seq);
            if set.is_empty() {
                self.by_group.remove(&pending.group);
            }
        }
        Some(pending)
    }
}

/// Logs a cap's warning at most once per [`NOTICE_EVERY`], with how many more there were.
#[derive(Default)]
struct Notice {
    last: Option<Instant>,
    unlogged: u64,
}

impl Notice {
    /// Whether to log now, and how many were not logged since the last time.
    fn due(&mut self, now: Instant) -> Option<u64> {
        if self
            .last
            .is_some_and(|last| now.duration_since(last) < NOTICE_EVERY)
        {
            self.unlogged += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.unlogged))
    }
}

/// Why an authenticated connection was not admitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Full {
    /// The cap of authenticated connections.
    pub cap: usize,
}

/// The gateway's connections, counted against [`Limits`].
pub struct Admissions {
    limits: Limits,
    per_address: usize,
    loopback: bool,
    pool: Mutex<Pool>,
    evictions: Mutex<Notice>,
    refusals: Mutex<Notice>,
}

impl Admissions {
    /// Admissions under `limits` for a listener that is on loopback or not.
    pub fn new(limits: Limits, loopback: bool) -> Arc<Self> {
        // Off loopback, one address may hold a quarter of the unauthenticated places: another
        // address's connection is then never closed for its sake.
        let per_address = if loopback {
            limits.max_unauthenticated
        } else {
            (limits.max_unauthenticated / 4).max(1)
        };
        Arc::new(Self {
            limits,
            per_address,
            loopback,
            pool: Mutex::new(Pool::default()),
            evictions: Mutex::new(Notice::default()),
            refusals: Mutex::new(Notice::default()),
        })
    }

    /// The caps.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Unauthenticated connections one address may hold.
    pub fn per_address(&self) -> usize {
        self.per_address
    }

    fn pool(&self) -> MutexGuard<'_, Pool> {
        self.pool
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Unauthenticated and authenticated connections now.
    pub fn counts(&self) -> (usize, usize) {
        let pool = self.pool();
        (pool.pending.len(), pool.authenticated)
    }

    /// Admits a new connection from `peer` as unauthenticated: when its address or the pool is
    /// at its cap, the oldest unauthenticated connection (of that address first) is evicted.
    pub fn admit(self: &Arc<Self>, peer: SocketAddr) -> PendingSlot {
        let group = group_of(peer.ip(), self.loopback);
        let evict = CancellationToken::new();
        let (seq, evicted) = {
            let mut pool = self.pool();
            let of_group = pool.by_group.get(&group).map_or(0, BTreeSet::len);
            // On loopback every peer is one address, whose cap is the pool's.
            let victim = if of_group >= self.per_address
                && self.per_address < self.limits.max_unauthenticated
            {
                pool.by_group
                    .get(&group)
                    .and_then(|set| set.first().copied())
                    .map(|seq| (seq, true))
            } else if pool.pending.len() >= self.limits.max_unauthenticated {
                pool.pending.keys().next().map(|&seq| (seq, false))
            } else {
                None
            };
            let evicted = victim.and_then(|(seq, own_address)| {
                pool.remove(seq).map(|pending| {
                    pending.evict.cancel();
                    (pending.peer, own_address)
                })
            });
            let seq = pool.next;
            pool.next += 1;
            pool.pending.insert(
                seq,
                Pending {
                    peer,
                    group,
                    evict: evict.clone(),
                },
            );
            pool.by_group.entry(group).or_default().insert(seq);
            (seq, evicted)
        };
        if let Some((old, own_address)) = evicted {
            self.note_eviction(old, peer, own_address);
        }
        PendingSlot {
            admissions: self.clone(),
            seq,
            peer,
            evict,
            admitted: tokio::time::Instant::now(),
        }
    }

    fn note_eviction(&self, old: SocketAddr, new: SocketAddr, own_address: bool) {
        let due = self
            .evictions
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .due(Instant::now());
        let Some(unlogged) = due else { return };
        let cap = if own_address {
            format!(
                "its address holds its cap of {} unauthenticated connections",
                self.per_address
            )
        } else {
            format!(
                "the gateway holds its cap of {} unauthenticated connections (--max-unauthenticated)",
                self.limits.max_unauthenticated
            )
        };
        tracing::warn!(
            "connection cap reached: {cap}; closed the oldest, from {old}, to admit {new} (unauthenticated connections are closed after {} s without a request; this warning is logged once a minute, {unlogged} more since the last one)",
            self.limits.unauthenticated_timeout.as_secs()
        );
    }

    fn note_refusal(&self, peer: SocketAddr) {
        let due = self
            .refusals
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .due(Instant::now());
        let Some(unlogged) = due else { return };
        tracing::warn!(
            "connection cap reached: {} authenticated connections are open (--max-connections {} less --max-unauthenticated {}); refused the connect of {peer} (logged once a minute, {unlogged} more since the last one)",
            self.limits.max_authenticated(),
            self.limits.max_connections,
            self.limits.max_unauthenticated
        );
    }
}

/// An unauthenticated connection's place; given back when dropped.
pub struct PendingSlot {
    admissions: Arc<Admissions>,
    seq: u64,
    peer: SocketAddr,
    evict: CancellationToken,
    admitted: tokio::time::Instant,
}

impl PendingSlot {
    /// Cancelled when the connection is evicted to make room: close it at once.
    pub fn evicted(&self) -> CancellationToken {
        self.evict.clone()
    }

    /// When the connection was admitted.
    pub fn admitted(&self) -> tokio::time::Instant {
        self.admitted
    }

    /// Where it comes from.
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// Moves the connection, which has presented the token, to the authenticated ones; `Err`
    /// (and one warning a minute) when they are at their cap. Either way it is no longer
    /// unauthenticated. An evicted connection is refused too, as it is being closed.
    pub fn promote(self) -> Result<AuthenticatedSlot, Full> {
        let admissions = self.admissions.clone();
        let cap = admissions.limits.max_authenticated();
        let promoted = {
            let mut pool = admissions.pool();
            let present = pool.remove(self.seq).is_some();
            if present && pool.authenticated < cap {
                pool.authenticated += 1;
                true
            } else {
                false
            }
        };
        if promoted {
            Ok(AuthenticatedSlot { admissions })
        } else {
            if !self.evict.is_cancelled() {
                admissions.note_refusal(self.peer);
            }
            Err(Full { cap })
        }
    }
}

impl Drop for PendingSlot {
    fn drop(&mut self) {
        // Already gone when it was evicted or promoted.
        self.admissions.pool().remove(self.seq);
    }
}

/// An authenticated connection's place; given back when dropped.
pub struct AuthenticatedSlot {
    admissions: Arc<Admissions>,
}

impl Drop for AuthenticatedSlot {
    fn drop(&mut self) {
        let mut pool = self.admissions.pool();
        pool.authenticated = pool.authenticated.saturating_sub(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max_connections: usize, max_unauthenticated: usize) -> Limits {
        Limits {
            max_connections,
            max_unauthenticated,
            unauthenticated_timeout: Duration::from_secs(10),
        }
    }

    fn peer(text: &str) -> SocketAddr {
        text.parse()
            .unwrap_or_else(|_| panic!("{text} is an address"))
    }

    #[tokio::test]
    async fn a_full_pool_evicts_its_oldest_and_admits_the_newest() {
        let admissions = Admissions::new(limits(6, 3), true);
        let slots: Vec<PendingSlot> = (0..3)
            .map(|port| admissions.admit(peer(&format!("127.0.0.1:{}", 1000 + port))))
            .collect();
        assert_eq!(admissions.counts(), (3, 0));
        let owner = admissions.admit(peer("127.0.0.2:2000"));
        assert_eq!(admissions.counts(), (3, 0));
        assert!(slots[0].evicted().is_cancelled(), "the oldest goes");
        assert!(!slots[1].evicted().is_cancelled() && !slots[2].evicted().is_cancelled());
        assert!(!owner.evicted().is_cancelled());
        // The evicted one's drop gives back nothing twice.
        let mut slots = slots.into_iter();
        drop(slots.next());
        assert_eq!(admissions.counts(), (3, 0));
        // The owner authenticates: out of the pool, which no longer holds it.
        let authenticated = owner.promote().expect("room");
        assert_eq!(admissions.counts(), (2, 1));
        let flood: Vec<PendingSlot> = (0..10)
            .map(|port| admissions.admit(peer(&format!("127.0.0.1:{}", 3000 + port))))
            .collect();
        assert_eq!(admissions.counts(), (3, 1));
        drop(flood);
        drop(slots);
        assert_eq!(admissions.counts(), (0, 1));
        drop(authenticated);
        assert_eq!(admissions.counts(), (0, 0));
    }

    #[tokio::test]
    async fn off_loopback_one_address_evicts_only_its_own() {
        let admissions = Admissions::new(limits(40, 8), false);
        assert_eq!(admissions.per_address(), 2);
        let other = admissions.admit(peer("192.0.2.1:1"));
        let first = admissions.admit(peer("198.51.100.7:1"));
        let second = admissions.admit(peer("198.51.100.7:2"));
        let third = admissions.admit(peer("198.51.100.7:3"));
        assert!(first.evicted().is_cancelled());
        assert!(!second.evicted().is_cancelled() && !third.evicted().is_cancelled());
        assert!(
            !other.evicted().is_cancelled(),
            "another address keeps its place"
        );
        // An IPv6 host counts by its /64.
        let a = admissions.admit(peer("[2001:db8::1]:1"));
        let _b = admissions.admit(peer("[2001:db8::2]:1"));
        let _c = admissions.admit(peer("[2001:db8::ffff:3]:1"));
        assert!(a.evicted().is_cancelled());
        // A mapped IPv4 address is that address.
        let _d = admissions.admit(peer("[::ffff:192.0.2.1]:2"));
        let _e = admissions.admit(peer("[::ffff:192.0.2.1]:3"));
        assert!(other.evicted().is_cancelled());
    }

    #[tokio::test]
    async fn authenticated_connections_have_their_own_cap() {
        let admissions = Admissions::new(limits(4, 2), true);
        assert_eq!(admissions.limits().max_authenticated(), 2);
        let one = admissions
            .admit(peer("127.0.0.1:1"))
            .promote()
            .expect("room");
        let _two = admissions
            .admit(peer("127.0.0.1:2"))
            .promote()
            .expect("room");
        let refused = admissions.admit(peer("127.0.0.1:3")).promote();
        assert_eq!(refused.err(), Some(Full { cap: 2 }));
        assert_eq!(admissions.counts(), (0, 2));
        drop(one);
        assert!(admissions.admit(peer("127.0.0.1:4")).promote().is_ok());
        // An evicted connection is not promoted.
        let old = admissions.admit(peer("127.0.0.1:5"));
        let _six = admissions.admit(peer("127.0.0.1:6"));
        let _seven = admissions.admit(peer("127.0.0.1:7"));
        assert!(old.evicted().is_cancelled());
        assert!(old.promote().is_err());
    }

    #[test]
    fn the_notice_is_logged_once_a_minute_with_the_count_between() {
        let mut notice = Notice::default();
        let start = Instant::now();
        assert_eq!(notice.due(start), Some(0));
        assert_eq!(notice.due(start + Duration::from_secs(1)), None);
        assert_eq!(notice.due(start + Duration::from_secs(59)), None);
        assert_eq!(notice.due(start + Duration::from_secs(61)), Some(2));
        assert_eq!(notice.due(start + Duration::from_secs(62)), None);
    }

    #[test]
    fn caps_are_sized_from_the_open_file_limit_and_checked() {
        let small = Limits::for_open_files(1024);
        assert_eq!(small.max_connections, 768);
        assert_eq!(small.max_unauthenticated, 192);
        assert_eq!(small.max_authenticated(), 576);
        let large = Limits::for_open_files(1 << 20);
        assert_eq!(large.max_connections, MAX_CONNECTIONS_CEILING);
        assert_eq!(large.max_unauthenticated, MAX_UNAUTHENTICATED_CEILING);
        assert!(small.check(Some(1024)).is_ok());
        let too_many = limits(5000, 100);
        let why = too_many.check(Some(1024)).expect_err("too many");
        assert!(why.contains("ulimit -Hn"), "{why}");
        assert!(limits(10, 10).check(None).is_err());
        assert!(limits(10, 0).check(None).is_err());
    }

    #[test]
    fn the_soft_limit_is_raised_as_far_as_the_hard_one_allows() {
        let (soft, hard) = raise_open_file_limit().expect("readable and raisable");
        assert!(soft >= hard.min(OPEN_FILES_WANTED), "{soft} {hard}");
    }
}
