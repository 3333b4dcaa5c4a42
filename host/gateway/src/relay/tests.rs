//! The relay against an active gateway played on 127.0.0.1 (the protocol's challenge, `connect`
//! and frames over a real WebSocket): where it refuses to relay, a client that does not read
//! while the active gateway floods it, and the active gateway's close passed on.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail by panicking"
)]

use super::*;
use crate::Token;
use crate::http::{Front, accept_loop};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

const TOKEN: &str = "a-token-of-thirty-two-characters-at-least";

fn standby_seeing(active: Option<ActiveGateway>) -> Arc<Standby> {
    let (_tell, seen) = watch::channel(active);
    Standby::new(
        Settings::new(Token::explicit(TOKEN)),
        seen,
        "host-b".to_string(),
    )
}

fn active(url: Option<&str>) -> Option<ActiveGateway> {
    Some(ActiveGateway {
        host: "host-a".to_string(),
        url: url.map(str::to_string),
    })
}

#[test]
fn the_active_gateway_is_reached_only_where_it_can_be() {
    let Ok(target) = standby_seeing(active(Some("http://10.0.0.5:18789/"))).target() else {
        panic!("an announced address is reached");
    };
    assert_eq!(
        (target.host.as_str(), target.authority.as_str()),
        ("host-a", "10.0.0.5:18789")
    );
    for (seen, named) in [
        (None, "no host of the cluster is active"),
        (active(None), "has not said where it listens"),
        (active(Some("https://gw:1/")), "not an http:// address"),
        (active(Some("http:///")), "not an http:// address"),
        (active(Some("http://0.0.0.0:18789/")), "advertise_url"),
        (active(Some("http://[::]:18789/")), "advertise_url"),
    ] {
        let why = standby_seeing(seen.clone())
            .target()
            .err()
            .expect("refused");
        assert!(why.contains(named), "{seen:?}: {why}");
    }
}

/// What the played active gateway does once its client is connected.
#[derive(Clone, Copy)]
enum Then {
    /// Sends frames of 64 KiB for as long as they are taken.
    Flood,
    /// Closes with 1013 and a reason.
    CloseSlow,
}

/// An active gateway on 127.0.0.1 that answers one connection's challenge and `connect`, and
/// then does `then`. Tells when that connection ended on its side.
async fn played_active(then: Then) -> (std::net::SocketAddr, tokio::sync::oneshot::Receiver<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (ended, ended_rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let mut socket = accept_relayed(&listener).await;
        match then {
            Then::Flood => {
                let frame = format!(
                    r#"{{"type":"event","event":"agent","payload":{{"delta":"{}"}}}}"#,
                    "x".repeat(64 << 10)
                );
                // Until the relay stops taking them (it closes, or stops reading for good).
                loop {
                    let sent = tokio::time::timeout(
                        Duration::from_secs(30),
                        socket.send(Message::text(frame.clone())),
                    )
                    .await;
                    if !matches!(sent, Ok(Ok(()))) {
                        break;
                    }
                }
            }
            Then::CloseSlow => {
                let frame = CloseFrame {
                    code: CloseCode::Again,
                    reason: "slow consumer: 4096 frames were waiting".into(),
                };
                let _ = socket.close(Some(frame)).await;
                while let Some(Ok(_)) = socket.next().await {}
            }
        }
        let _ = ended.send(());
    });
    (addr, ended_rx)
}

/// A standby's front on 127.0.0.1 relaying to the active gateway at `active`.
async fn relaying_to(active: std::net::SocketAddr) -> std::net::SocketAddr {
    let standby = standby_seeing(Some(ActiveGateway {
        host: "host-a".to_string(),
        url: Some(format!("http://{active}/")),
    }));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    tokio::spawn(async move {
        let _listener = accept_loop(Front::Standby(standby), listener, stop).await;
    });
    addr
}

/// A client of `relay` past its `connect`.
async fn relayed(relay: std::net::SocketAddr) -> WebSocketStream<TcpStream> {
    let stream = TcpStream::connect(relay).await.unwrap();
    let request = format!("ws://{relay}/ws").into_client_request().unwrap();
    let config = WebSocketConfig::default()
        .max_message_size(Some(64 << 20))
        .max_frame_size(Some(64 << 20));
    let (mut socket, _) =
        tokio_tungstenite::client_async_with_config(request, stream, Some(config))
            .await
            .unwrap();
    let Some(Ok(Message::Text(challenge))) = socket.next().await else {
        panic!("no challenge");
    };
    assert!(challenge.contains("connect.challenge"), "{challenge}");
    let connect = serde_json::json!({"type": "req", "id": "c1", "method": "connect", "params": {
        "minProtocol": 1, "maxProtocol": 1, "auth": {"token": TOKEN},
        "client": {"id": "test", "version": "1", "mode": "test"}}});
    socket
        .send(Message::text(connect.to_string()))
        .await
        .unwrap();
    let Some(Ok(Message::Text(hello))) = socket.next().await else {
        panic!("no answer to connect");
    };
    assert!(hello.contains("hello-ok"), "{hello}");
    socket
}

/// Reads `socket` to its end: how it ended (the close frame's code, or `None` when the socket
/// just ended), and the frames before.
async fn read_to_end(socket: &mut WebSocketStream<TcpStream>) -> (Option<CloseCode>, usize) {
    let mut frames = 0;
    loop {
        match tokio::time::timeout(Duration::from_secs(30), socket.next()).await {
            Ok(Some(Ok(Message::Close(frame)))) => {
                return (frame.map(|frame| frame.code), frames);
            }
            Ok(Some(Ok(_))) => frames += 1,
            Ok(Some(Err(_)) | None) => return (None, frames),
            Err(_) => panic!("the relay held the connection open for 30 s without a frame"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relayed_client_that_does_not_read_is_cut_off_and_the_active_gateway_let_go() {
    let (active, active_ended) = played_active(Then::Flood).await;
    let relay = relaying_to(active).await;
    let mut client = relayed(relay).await;
    // The client reads nothing while the relay's write waits for longer than its timeout.
    tokio::time::sleep(WRITE_TIMEOUT + Duration::from_secs(3)).await;
    tokio::time::timeout(Duration::from_secs(30), active_ended)
        .await
        .expect("the relay let the active gateway go")
        .unwrap();
    let (closed, frames) = read_to_end(&mut client).await;
    // What the sockets held came, then the end: a close frame when it still fit, else the
    // socket's end.
    assert!(
        closed.is_none_or(|code| code == CloseCode::Again),
        "{closed:?}"
    );
    assert!(
        frames < 10_000,
        "{frames} frames of 64 KiB were not held anywhere"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_active_gateways_close_reaches_the_relayed_client() {
    let (active, _ended) = played_active(Then::CloseSlow).await;
    let relay = relaying_to(active).await;
    let mut client = relayed(relay).await;
    let frame = loop {
        match tokio::time::timeout(Duration::from_secs(10), client.next()).await {
            Ok(Some(Ok(Message::Close(frame)))) => break frame.expect("a close frame with a code"),
            Ok(Some(Ok(_))) => {}
            other => panic!("no close frame: {other:?}"),
        }
    };
    assert_eq!(frame.code, CloseCode::Again);
    assert!(frame.reason.contains("slow consumer"), "{}", frame.reason);
}

/// Takes one connection on `listener` past the challenge and `connect`, as an active gateway.
async fn accept_relayed(listener: &TcpListener) -> WebSocketStream<TcpStream> {
    let (stream, _) = listener.accept().await.unwrap();
    let mut socket = tokio_tungstenite::accept_async(stream).await.unwrap();
    let challenge = r#"{"type":"event","event":"connect.challenge","payload":{"nonce":"n"}}"#;
    socket.send(Message::text(challenge)).await.unwrap();
    let Some(Ok(Message::Text(connect))) = socket.next().await else {
        panic!("no connect");
    };
    let connect: serde_json::Value = serde_json::from_str(connect.as_str()).unwrap();
    assert_eq!(connect["params"]["auth"]["token"], TOKEN, "{connect}");
    let hello = serde_json::json!({"type": "res", "id": connect["id"], "ok": true, "payload": {"type": "hello-ok"}});
    socket.send(Message::text(hello.to_string())).await.unwrap();
    socket
}

async fn next_json(socket: &mut WebSocketStream<TcpStream>) -> serde_json::Value {
    loop {
        match tokio::time::timeout(Duration::from_secs(30), socket.next()).await {
            Ok(Some(Ok(Message::Text(text)))) => {
                return serde_json::from_str(text.as_str()).unwrap();
            }
            Ok(Some(Ok(_))) => {}
            other => panic!("no frame: {other:?}"),
        }
    }
}

fn agent_event(session: &str, seq: u64) -> Message {
    Message::text(
        crate::protocol::event(
            "agent",
            serde_json::json!({"sessionKey": session, "seq": seq, "stream": "assistant", "data": {"delta": format!("d{seq}")}}),
            Some(seq),
        )
        .to_string(),
    )
}

/// A standby's front relaying to whichever active gateway `active` names, its connections
/// waiting `patience` for the next one.
async fn front_following(
    active: watch::Receiver<Option<ActiveGateway>>,
    patience: Duration,
) -> std::net::SocketAddr {
    let mut standby = Standby::new(
        Settings::new(Token::explicit(TOKEN)),
        active,
        "host-c".to_string(),
    );
    Arc::get_mut(&mut standby).unwrap().carry_over_patience = patience;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _listener =
            accept_loop(Front::Standby(standby), listener, CancellationToken::new()).await;
    });
    addr
}

fn at(host: &str, addr: std::net::SocketAddr) -> Option<ActiveGateway> {
    Some(ActiveGateway {
        host: host.to_string(),
        url: Some(format!("http://{addr}/")),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relayed_client_is_carried_over_to_the_next_active_gateway() {
    let first = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let second = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (first_addr, second_addr) = (first.local_addr().unwrap(), second.local_addr().unwrap());
    let (tell, seen) = watch::channel(at("host-a", first_addr));
    let relay = front_following(seen, Duration::from_secs(30)).await;
    let (mut client, mut gateway) = tokio::join!(relayed(relay), accept_relayed(&first));

    // The client follows a session and gets three of its events; then it waits on a run.
    let subscribe = serde_json::json!({"type": "req", "id": 1, "method": "sessions.subscribe", "params": {"sessionKey": "s"}});
    client
        .send(Message::text(subscribe.to_string()))
        .await
        .unwrap();
    let asked = next_json(&mut gateway).await;
    assert_eq!(asked["method"], "sessions.subscribe");
    let answer = serde_json::json!({"type": "res", "id": 1, "ok": true, "payload": {"sessionKey": "s", "lastSeq": 0, "more": false}});
    gateway
        .send(Message::text(answer.to_string()))
        .await
        .unwrap();
    for seq in 1..=3 {
        gateway.send(agent_event("s", seq)).await.unwrap();
    }
    let wait = serde_json::json!({"type": "req", "id": "w", "method": "agent.wait", "params": {"runId": "r1"}});
    client.send(Message::text(wait.to_string())).await.unwrap();
    assert_eq!(next_json(&mut gateway).await["method"], "agent.wait");
    let mut seen_by_client = Vec::new();
    while seen_by_client.len() < 4 {
        seen_by_client.push(next_json(&mut client).await);
    }
    assert_eq!(seen_by_client[3]["seq"], 3, "{seen_by_client:?}");

    // The active gateway dies (no close frame). The wait is answered UNAVAILABLE at once.
    // (Its listener stays: a host that hangs rather than refuses.)
    drop(gateway);
    let unanswered = next_json(&mut client).await;
    assert_eq!(unanswered["id"], "w", "{unanswered}");
    assert_eq!(unanswered["error"]["code"], "UNAVAILABLE", "{unanswered}");
    // A request sent meanwhile is held; then another host is active.
    let send = serde_json::json!({"type": "req", "id": "h", "method": "chat.send", "params": {"sessionKey": "s", "message": "hi"}});
    client.send(Message::text(send.to_string())).await.unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    tell.send_replace(at("host-d", second_addr));
    let mut next = tokio::time::timeout(Duration::from_secs(10), accept_relayed(&second))
        .await
        .expect("the relay connects to the next active gateway");
    // First the session again, from the last event the client got; then the held request.
    let again = next_json(&mut next).await;
    assert_eq!(again["method"], "sessions.subscribe", "{again}");
    assert_eq!(
        again["params"],
        serde_json::json!({"sessionKey": "s", "since": 3})
    );
    let held = next_json(&mut next).await;
    assert_eq!(held["id"], "h", "{held}");
    let answer = serde_json::json!({"type": "res", "id": again["id"], "ok": true, "payload": {"sessionKey": "s", "lastSeq": 4, "more": false}});
    next.send(Message::text(answer.to_string())).await.unwrap();
    next.send(agent_event("s", 4)).await.unwrap();
    let done =
        serde_json::json!({"type": "res", "id": "h", "ok": true, "payload": {"runId": "r2"}});
    next.send(Message::text(done.to_string())).await.unwrap();
    // The client gets the event after its last and its answer, not the relay's own answer.
    let event = next_json(&mut client).await;
    assert_eq!(event["seq"], 4, "{event}");
    let answered = next_json(&mut client).await;
    assert_eq!(answered["id"], "h", "{answered}");
    assert_eq!(answered["ok"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relayed_client_is_closed_when_no_host_serves_in_time_or_it_sends_too_much() {
    let first = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (_tell, seen) = watch::channel(at("host-a", first.local_addr().unwrap()));
    let relay = front_following(seen, Duration::from_secs(2)).await;
    let (mut client, gateway) = tokio::join!(relayed(relay), accept_relayed(&first));
    // Nothing listens after it: the relay tries, then gives up and says so.
    drop(gateway);
    drop(first);
    let started = std::time::Instant::now();
    let frame = loop {
        match tokio::time::timeout(Duration::from_secs(30), client.next()).await {
            Ok(Some(Ok(Message::Close(frame)))) => break frame.expect("a close frame"),
            Ok(Some(Ok(_))) => {}
            other => panic!("no close frame: {other:?}"),
        }
    };
    assert_eq!(frame.code, CloseCode::Restart);
    assert!(
        frame.reason.contains("no other host served within 2 s"),
        "{}",
        frame.reason
    );
    assert!(
        started.elapsed() >= Duration::from_millis(1500),
        "{:?}",
        started.elapsed()
    );

    // A client that floods requests while it waits is closed.
    let first = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (_tell, seen) = watch::channel(at("host-a", first.local_addr().unwrap()));
    let relay = front_following(seen, Duration::from_secs(30)).await;
    let (mut client, gateway) = tokio::join!(relayed(relay), accept_relayed(&first));
    drop(gateway);
    drop(first);
    let request =
        serde_json::json!({"type": "req", "id": 1, "method": "status", "params": {}}).to_string();
    let frame = loop {
        if client.send(Message::text(request.clone())).await.is_err() {
            break None;
        }
        if let Ok(Some(Ok(Message::Close(frame)))) =
            tokio::time::timeout(Duration::from_millis(1), client.next()).await
        {
            break frame;
        }
    };
    let (code, _) = read_to_end(&mut client).await;
    let code = frame.map(|frame| frame.code).or(code);
    assert_eq!(code, Some(CloseCode::Again));
}
