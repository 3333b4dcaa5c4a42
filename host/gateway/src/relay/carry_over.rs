//! Carrying a relayed connection over to the next active gateway ([`carry_over`]): while no
//! host serves, the client's requests are held ([`Carried::hold`]); the relay tries the host the
//! cluster names active every half second (dropping an attempt that hangs once another host is
//! named), and once one takes the client's `connect`, sends it the re-subscriptions and the held
//! requests ([`Carried::resume`]) and hands the connection back to the relay. What ends the wait
//! instead: the client leaving or sending too much, the next host refusing the client, or no
//! host serving within the standby's patience.

use futures_util::{SinkExt as _, StreamExt as _};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::{Error as WsError, Message, Utf8Bytes};

use super::carry::{self, Carried};
use super::{Ended, Standby, open_upstream};
use crate::connection::{WRITE_TIMEOUT, capacity_reason};

/// The pause between two attempts to reach the next active gateway.
const CARRY_OVER_PAUSE: std::time::Duration = std::time::Duration::from_millis(500);

/// Tells the client its requests in flight went unanswered; false when it cannot be told.
pub(super) async fn answer_unanswered<S>(
    socket: &mut WebSocketStream<S>,
    carried: &mut Carried,
) -> bool
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    for answer in carried.unanswered() {
        let sent = tokio::time::timeout(WRITE_TIMEOUT, socket.send(Message::Text(answer))).await;
        if !matches!(sent, Ok(Ok(()))) {
            return false;
        }
    }
    true
}

/// A connection being opened to the next active gateway: it, its answer to the client's
/// `connect`, and its host.
type Opening = futures_util::future::BoxFuture<
    'static,
    Result<(WebSocketStream<TcpStream>, Utf8Bytes, String), String>,
>;

/// Waits for the next active gateway and connects the client to it: held requests and the
/// followed sessions go to it first. Meanwhile the client's requests are held. How the
/// connection ended instead: the client left, sent too much, or no host served in time.
pub(super) async fn carry_over<S>(
    standby: &Standby,
    connect: &Utf8Bytes,
    socket: &mut WebSocketStream<S>,
    carried: &mut Carried,
    max_frame: usize,
) -> Result<(WebSocketStream<TcpStream>, String), Ended>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let patience = standby.carry_over_patience;
    let deadline = tokio::time::Instant::now() + patience;
    let mut next_try = tokio::time::Instant::now() + CARRY_OVER_PAUSE / 2;
    let mut attempt: Option<(Opening, String)> = None;
    let mut why = "no host of the cluster is active yet".to_string();
    // Another host named active meanwhile ends an attempt to reach the one named before (it
    // may hang rather than refuse).
    let mut active = standby.active.clone();
    let mut watching = true;
    loop {
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return Err(Ended::Upstream(
                CloseCode::Restart,
                format!(
                    "the active gateway went away and no other host served within {} s ({why}): connect again",
                    patience.as_secs()
                ),
            ));
        }
        if attempt.is_none() && now >= next_try {
            match standby.target() {
                Ok(target) => {
                    let me = standby.me.clone();
                    let connect = connect.clone();
                    let host = target.host.clone();
                    let opening: Opening = Box::pin(async move {
                        open_upstream(&me, &target, connect)
                            .await
                            .map(|(upstream, answer)| (upstream, answer, target.host))
                    });
                    attempt = Some((opening, host));
                }
                Err(reason) => {
                    why = reason;
                    next_try = now + CARRY_OVER_PAUSE;
                }
            }
        }
        let trying = attempt.is_some();
        let (mut opening, trying_host): (Opening, String) = attempt
            .take()
            .unwrap_or_else(|| (Box::pin(std::future::pending()), String::new()));
        let step = tokio::select! {
            changed = active.changed(), if watching => {
                watching = changed.is_ok();
                Step::Tick
            }
            message = socket.next() => Step::Client(message),
            opened = &mut opening, if trying => {
                Step::Opened(opened.map(|(upstream, answer, host)| (Box::new(upstream), answer, host)))
            }
            () = tokio::time::sleep_until(next_try), if !trying => Step::Tick,
            () = tokio::time::sleep_until(deadline) => Step::Tick,
        };
        let opened = match step {
            Step::Opened(opened) => opened,
            other => {
                let named = active.borrow().as_ref().map(|active| active.host.clone());
                if trying && named.as_deref() == Some(trying_host.as_str()) {
                    attempt = Some((opening, trying_host));
                } else if trying {
                    // Another host is active now: try it at once.
                    next_try = tokio::time::Instant::now();
                }
                match other {
                    Step::Client(Some(Ok(Message::Text(text)))) => {
                        if !carried.hold(text) {
                            return Err(Ended::Upstream(
                                CloseCode::Again,
                                format!(
                                    "more than {} requests (or {} bytes) while the next active gateway was awaited: connect again and send them then",
                                    carry::MAX_HELD_REQUESTS,
                                    carry::MAX_HELD_BYTES
                                ),
                            ));
                        }
                    }
                    Step::Client(Some(Ok(Message::Close(_))) | None) => return Err(Ended::Client),
                    Step::Client(Some(Err(WsError::Capacity(error)))) => {
                        return Err(Ended::Oversized(capacity_reason(&error, max_frame)));
                    }
                    Step::Client(Some(Err(_))) => return Err(Ended::Client),
                    Step::Client(Some(Ok(_))) | Step::Tick | Step::Opened(_) => {}
                }
                continue;
            }
        };
        next_try = tokio::time::Instant::now() + CARRY_OVER_PAUSE;
        match opened {
            Ok((mut upstream, answer, host)) => {
                let accepted = serde_json::from_str::<serde_json::Value>(answer.as_str())
                    .is_ok_and(|answer| answer["ok"] == true);
                if !accepted {
                    return Err(Ended::Upstream(
                        CloseCode::Policy,
                        format!(
                            "the next active gateway {host} refused this connection: connect again"
                        ),
                    ));
                }
                let mut resumed = true;
                for frame in carried.resume() {
                    let sent =
                        tokio::time::timeout(WRITE_TIMEOUT, upstream.send(Message::Text(frame)))
                            .await;
                    resumed &= matches!(sent, Ok(Ok(())));
                }
                if resumed {
                    return Ok((*upstream, host));
                }
                // Gone again at once: what was sent is in flight, and unanswered.
                why = format!("{host} went away too");
                if !answer_unanswered(socket, carried).await {
                    return Err(Ended::Client);
                }
            }
            Err(reason) => why = reason,
        }
    }
}

/// What a carried-over connection's wait brought.
enum Step {
    /// A frame (or the end) from the client.
    Client(Option<Result<Message, WsError>>),
    /// The attempt to reach the next active gateway ended.
    Opened(Result<(Box<WebSocketStream<TcpStream>>, Utf8Bytes, String), String>),
    /// Time to look again.
    Tick,
}
