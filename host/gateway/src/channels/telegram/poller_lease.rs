//! The one Telegram poller of a cluster whose hosts serve partitions: every host may send
//! (its channel without a poller answers the `message` tool), and the host holding the
//! `telegram` lease polls. It takes the lease when it is free, polls from the journal the last
//! poller left (read at that moment), renews the lease a few times per time to live, and stops
//! polling as soon as it cannot renew in time, before another host may take the lease over; a
//! host that stops gives the lease back at once. The journal's versions fence a poller that
//! lost the lease: its next write is refused and it handles nothing more.

use std::sync::Arc;
use std::time::Duration;

use clawcage_cluster::{LeaseError, Leases};
use clawcage_runtime::channel_config::Telegram as TelegramSettings;

use super::Telegram;
use crate::channels::Shared;

/// The lease the Telegram poller holds.
pub(crate) const TELEGRAM_LEASE: &str = "telegram";

/// Polls Telegram while this host holds the poller's lease, for as long as the gateway runs;
/// `ttl` is the leases' time to live.
pub(crate) async fn poll_while_leased(
    shared: Arc<Shared>,
    settings: TelegramSettings,
    leases: Leases,
    ttl: Duration,
) {
    let pause = (ttl / 4).max(Duration::from_millis(250));
    loop {
        let taken = match leases.acquire(TELEGRAM_LEASE).await {
            Ok(Some(lease)) => Ok(Some(lease)),
            Ok(None) => leases.take_over_from_earlier_self(TELEGRAM_LEASE).await,
            Err(error) => Err(error),
        };
        let mut lease = match taken {
            Ok(Some(lease)) => lease,
            Ok(None) => {
                if !wait(&shared, pause).await {
                    return;
                }
                continue;
            }
            Err(error) => {
                tracing::warn!("cannot look at the Telegram poller's lease: {error}");
                if !wait(&shared, pause).await {
                    return;
                }
                continue;
            }
        };
        let stop = shared.shutdown.child_token();
        if let Err(error) = Telegram::start(shared.clone(), &settings, stop.clone()) {
            tracing::error!("cannot poll Telegram: {error}");
            let _ = leases.release(lease).await;
            if !wait(&shared, pause * 4).await {
                return;
            }
            continue;
        }
        tracing::info!(
            epoch = lease.epoch(),
            "this host polls Telegram for the cluster"
        );
        loop {
            if !wait(&shared, pause).await {
                stop.cancel();
                // Given back at once: another host polls without waiting out the lease.
                let _ = leases.release(lease).await;
                return;
            }
            let fresh_until = tokio::time::Instant::from_std(lease.fresh_until());
            match tokio::time::timeout_at(fresh_until, leases.renew(&mut lease)).await {
                Ok(Ok(())) => continue,
                Ok(Err(LeaseError::Lost { .. })) => {}
                Ok(Err(error)) if lease.is_fresh() => {
                    tracing::warn!("cannot renew the Telegram poller's lease: {error}");
                    continue;
                }
                _ if lease.is_fresh() => continue,
                _ => {}
            }
            stop.cancel();
            tracing::warn!(
                "this host no longer holds the Telegram poller's lease: it stops polling"
            );
            break;
        }
    }
}

/// Waits `pause`; `false` when the gateway stops first.
async fn wait(shared: &Shared, pause: Duration) -> bool {
    tokio::select! {
        () = tokio::time::sleep(pause) => true,
        () = shared.shutdown.cancelled() => false,
    }
}
