//! The one route from the bus's `system` channel — sub-agent results, cron firings published on
//! the bus — into the sessions' lanes. A front end says only how it admits a notification and
//! shows the turn answering it ([`NotificationFront`]); the route takes the messages in arrival
//! order and admits one at a time, so arrival order is admission order, and it starts the report
//! of the sub-agent runs the last process left only once the channel is routed, so none of their
//! announcements waits for a subscriber that never comes.

use std::sync::Arc;

use clawcage_core::{BoxFuture, InboundMessage};

use crate::bus::{MessageBus, Subscription};
use crate::subagent::{SYSTEM_CHANNEL, SubagentManager};

/// How a front end takes a notification as a turn of its session and shows it its own way.
pub trait NotificationFront: Send + Sync + 'static {
    /// Admit `message` to the lane of `message.session_key` and return once it is admitted;
    /// the turn is awaited and shown in a task of the front end's own, so a long turn never
    /// holds up the next notification.
    fn admit(&self, message: InboundMessage) -> BoxFuture<'_, ()>;
}

/// A running route; it stops when dropped, and its undelivered messages go back to the bus.
#[derive(Debug)]
pub struct NotificationRoute {
    task: tokio::task::JoinHandle<()>,
}

impl NotificationRoute {
    /// Route the `system` channel of `bus` into `front`, then report the runs of `subagents`
    /// that the last process left running (their announcements take this route too). Every
    /// long-running front end starts exactly one.
    pub fn start(
        bus: &MessageBus,
        subagents: Option<&Arc<SubagentManager>>,
        front: Arc<dyn NotificationFront>,
    ) -> NotificationRoute {
        let route = NotificationRoute::over(bus.subscribe(SYSTEM_CHANNEL), front);
        if let Some(manager) = subagents.cloned() {
            tokio::spawn(async move {
                manager.recover().await;
            });
        }
        route
    }

    /// Route every message of `subscription` into `front`, until the subscription ends.
    pub fn over(mut subscription: Subscription, front: Arc<dyn NotificationFront>) -> Self {
        let task = tokio::spawn(async move {
            while let Some(message) = subscription.recv().await {
                front.admit(message).await;
            }
        });
        NotificationRoute { task }
    }

    /// Stop routing now.
    pub fn stop(&self) {
        self.task.abort();
    }
}

impl Drop for NotificationRoute {
    fn drop(&mut self) {
        self.task.abort();
    }
}
