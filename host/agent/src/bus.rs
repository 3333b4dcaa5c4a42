//! The inbound message bus: subsystems (sub-agents, cron, outside channels) publish
//! [`InboundMessage`]s by channel name, and the runtime takes them either by subscribing or by
//! draining. Each message takes exactly one path: it goes to one live subscriber of its channel
//! (the oldest), or, when there is none, into the channel's queue for [`MessageBus::drain`]. A
//! subscription that ends hands its undelivered messages back to the queue, so nothing published
//! is lost or seen twice. Queues are bounded: publishing to a full queue is an error the
//! publisher sees.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use clawcage_core::InboundMessage;
use tokio::sync::mpsc;

/// Messages kept per channel while nobody subscribes.
pub const DEFAULT_QUEUE_CAPACITY: usize = 10_000;

/// Where a published message went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// To a subscriber.
    Subscriber,
    /// Into the channel's queue.
    Queued,
}

/// Why a message could not be published.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BusError {
    /// The channel's queue is full; nobody is draining it.
    #[error(
        "the `{channel}` channel already holds {capacity} undelivered messages; the message was not published"
    )]
    Full {
        /// The channel.
        channel: String,
        /// Its capacity.
        capacity: usize,
    },
}

#[derive(Default)]
struct Channel {
    subscribers: Vec<(u64, mpsc::UnboundedSender<InboundMessage>)>,
    queue: VecDeque<InboundMessage>,
}

struct Inner {
    channels: HashMap<String, Channel>,
    next_id: u64,
    capacity: usize,
}

/// The bus. Cloning shares it.
#[derive(Clone)]
pub struct MessageBus {
    inner: Arc<Mutex<Inner>>,
}

impl std::fmt::Debug for MessageBus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MessageBus").finish_non_exhaustive()
    }
}

impl Default for MessageBus {
    fn default() -> Self {
        Self::with_capacity(DEFAULT_QUEUE_CAPACITY)
    }
}

impl MessageBus {
    /// A bus whose queues hold [`DEFAULT_QUEUE_CAPACITY`] messages each.
    pub fn new() -> Self {
        Self::default()
    }

    /// A bus whose queues hold `capacity` messages each.
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            inner: Arc::new(Mutex::new(Inner {
                channels: HashMap::new(),
                next_id: 0,
                capacity,
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding this lock leaves consistent data (every update is one step).
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Publish `message` on its channel.
    pub fn publish(&self, message: InboundMessage) -> Result<Delivery, BusError> {
        let mut inner = self.lock();
        let capacity = inner.capacity;
        let channel = inner.channels.entry(message.channel.clone()).or_default();
        let mut message = message;
        // The oldest live subscriber takes it; closed ones are forgotten on the way.
        while let Some((_, sender)) = channel.subscribers.first() {
            match sender.send(message) {
                Ok(()) => return Ok(Delivery::Subscriber),
                Err(mpsc::error::SendError(returned)) => {
                    message = returned;
                    channel.subscribers.remove(0);
                }
            }
        }
        if channel.queue.len() >= capacity {
            return Err(BusError::Full {
                channel: message.channel,
                capacity,
            });
        }
        channel.queue.push_back(message);
        Ok(Delivery::Queued)
    }

    /// Take every queued message of `channel`, oldest first.
    pub fn drain(&self, channel: &str) -> Vec<InboundMessage> {
        let mut inner = self.lock();
        match inner.channels.get_mut(channel) {
            Some(channel) => channel.queue.drain(..).collect(),
            None => Vec::new(),
        }
    }

    /// Messages waiting in `channel`'s queue.
    pub fn queued(&self, channel: &str) -> usize {
        self.lock()
            .channels
            .get(channel)
            .map_or(0, |channel| channel.queue.len())
    }

    /// Receive the messages published on `channel` from now on (queued ones stay for
    /// [`drain`](Self::drain)). The subscription ends when it is dropped or
    /// [`unsubscribed`](Subscription::unsubscribe).
    pub fn subscribe(&self, channel: &str) -> Subscription {
        let (sender, receiver) = mpsc::unbounded_channel();
        let mut inner = self.lock();
        let id = inner.next_id;
        inner.next_id += 1;
        inner
            .channels
            .entry(channel.to_string())
            .or_default()
            .subscribers
            .push((id, sender));
        Subscription {
            bus: self.clone(),
            channel: channel.to_string(),
            id,
            receiver: Some(receiver),
        }
    }

    fn end_subscription(
        &self,
        channel: &str,
        id: u64,
        receiver: &mut mpsc::UnboundedReceiver<InboundMessage>,
    ) {
        let mut inner = self.lock();
        if let Some(state) = inner.channels.get_mut(channel) {
            state.subscribers.retain(|(other, _)| *other != id);
            // Nothing can be sent to us any more (we hold the lock and are no longer listed):
            // what is still in our buffer goes back to the queue, after what was queued before.
            receiver.close();
            while let Ok(message) = receiver.try_recv() {
                state.queue.push_back(message);
            }
        }
    }
}

/// A live subscription to one channel.
#[derive(Debug)]
pub struct Subscription {
    bus: MessageBus,
    channel: String,
    id: u64,
    receiver: Option<mpsc::UnboundedReceiver<InboundMessage>>,
}

impl Subscription {
    /// The next message, or `None` once unsubscribed.
    pub async fn recv(&mut self) -> Option<InboundMessage> {
        self.receiver.as_mut()?.recv().await
    }

    /// The channel.
    pub fn channel(&self) -> &str {
        &self.channel
    }

    /// End the subscription; undelivered messages go back to the channel's queue.
    pub fn unsubscribe(mut self) {
        self.end();
    }

    fn end(&mut self) {
        if let Some(mut receiver) = self.receiver.take() {
            self.bus
                .end_subscription(&self.channel, self.id, &mut receiver);
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.end();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(channel: &str, content: &str) -> InboundMessage {
        InboundMessage {
            channel: channel.into(),
            sender: "test".into(),
            session_key: "s".into(),
            content: content.into(),
        }
    }

    #[tokio::test]
    async fn each_message_takes_exactly_one_path() {
        let bus = MessageBus::new();
        assert_eq!(
            bus.publish(message("system", "early")),
            Ok(Delivery::Queued)
        );
        let mut first = bus.subscribe("system");
        let mut second = bus.subscribe("system");
        assert_eq!(
            bus.publish(message("system", "one")),
            Ok(Delivery::Subscriber)
        );
        assert_eq!(
            bus.publish(message("other", "elsewhere")),
            Ok(Delivery::Queued)
        );
        assert_eq!(first.recv().await.unwrap().content, "one");

        // Two messages reach the first subscriber, one is read, then it unsubscribes: the
        // unread one goes back to the queue, and later ones go to the second subscriber.
        bus.publish(message("system", "two")).unwrap();
        bus.publish(message("system", "three")).unwrap();
        assert_eq!(first.recv().await.unwrap().content, "two");
        first.unsubscribe();
        bus.publish(message("system", "four")).unwrap();
        assert_eq!(second.recv().await.unwrap().content, "four");
        drop(second);
        bus.publish(message("system", "five")).unwrap();

        let drained: Vec<String> = bus.drain("system").into_iter().map(|m| m.content).collect();
        assert_eq!(drained, ["early", "three", "five"]);
        assert!(bus.drain("system").is_empty());
        assert_eq!(bus.drain("other")[0].content, "elsewhere");
    }

    #[tokio::test]
    async fn a_flood_fills_the_queue_and_then_is_refused() {
        let bus = MessageBus::with_capacity(100);
        for i in 0..100 {
            bus.publish(message("system", &i.to_string())).unwrap();
        }
        let refused = bus.publish(message("system", "one too many")).unwrap_err();
        assert!(refused.to_string().contains("100 undelivered"), "{refused}");
        assert_eq!(bus.queued("system"), 100);
        assert_eq!(bus.drain("system").len(), 100);
        assert_eq!(
            bus.publish(message("system", "room again")),
            Ok(Delivery::Queued)
        );
    }
}
