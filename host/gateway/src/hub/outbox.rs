//! [`Outbox`]: the frames waiting to be sent to one connection, bounded; a client that does not
//! read fast enough is cut off with a reason instead of slowing anyone else.
use std::sync::{Arc, Mutex};

use tokio_tungstenite::tungstenite::Utf8Bytes;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_util::sync::CancellationToken;

use super::lock;

/// A frame queue to one connection. Pushing never waits: a full queue means the client does not
/// read fast enough, and it is disconnected with a reason rather than slowing anyone else.
#[derive(Clone)]
pub struct Outbox {
    /// The connection's id.
    pub id: u64,
    sender: tokio::sync::mpsc::Sender<Utf8Bytes>,
    kill: CancellationToken,
    reason: Arc<Mutex<Option<(CloseCode, String)>>>,
}

impl Outbox {
    /// An outbox holding at most `capacity` frames, and its receiving end.
    pub fn new(id: u64, capacity: usize) -> (Self, tokio::sync::mpsc::Receiver<Utf8Bytes>) {
        let (sender, receiver) = tokio::sync::mpsc::channel(capacity.max(1));
        (
            Self {
                id,
                sender,
                kill: CancellationToken::new(),
                reason: Arc::new(Mutex::new(None)),
            },
            receiver,
        )
    }

    /// Queue `frame`; false when the connection is gone or was just cut off for being slow.
    pub fn push(&self, frame: Utf8Bytes) -> bool {
        match self.sender.try_send(frame) {
            Ok(()) => true,
            Err(tokio::sync::mpsc::error::TrySendError::Full(_)) => {
                self.close(
                    CloseCode::Again,
                    format!(
                        "slow consumer: {} frames were waiting to be sent; read faster or subscribe to fewer sessions",
                        self.sender.max_capacity()
                    ),
                );
                false
            }
            Err(tokio::sync::mpsc::error::TrySendError::Closed(_)) => false,
        }
    }

    /// Ask the connection to close with `code` and `reason` (the first reason wins).
    pub fn close(&self, code: CloseCode, reason: String) {
        let mut slot = lock(&self.reason);
        if slot.is_none() {
            *slot = Some((code, reason));
        }
        self.kill.cancel();
    }

    /// Resolves when [`Outbox::close`] was called.
    pub fn closed(&self) -> tokio_util::sync::WaitForCancellationFuture<'_> {
        self.kill.cancelled()
    }

    /// Why it was closed.
    pub fn close_reason(&self) -> Option<(CloseCode, String)> {
        lock(&self.reason).clone()
    }
}
