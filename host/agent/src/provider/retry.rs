//! Resilience around providers. [`Retrying`] sends a failed request again when the failure may
//! pass (429, 408, 5xx, timeouts, refused connections, an overloaded stream), waiting an
//! exponentially growing delay with jitter, or exactly what the server's `retry-after` asked for.
//! [`FailoverChain`] tries a list of provider/model pairs in order and answers with the first that
//! succeeds. Both are [`Provider`]s themselves, so they compose.

use std::sync::Arc;
use std::time::Duration;

use clawcage_core::BoxFuture;

use super::{ChatRequest, ChatResponse, Provider, ProviderError, ProviderEvents};

/// How often and how long to wait before sending a failed request again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts after the first (0: no retries).
    pub max_retries: u32,
    /// The delay before the first retry; it doubles each time.
    pub base_delay: Duration,
    /// The longest computed delay.
    pub max_delay: Duration,
    /// The longest `retry-after` honoured; a server asking for more makes the request fail at
    /// once (so a fail-over chain moves on instead of sleeping).
    pub max_retry_after: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_retries: 3,
            base_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(30),
            max_retry_after: Duration::from_secs(60),
        }
    }
}

impl RetryPolicy {
    /// The wait before retry number `retry` (0-based): `retry-after` if the server sent it,
    /// else `base * 2^retry` capped at `max_delay`, with "equal jitter" (a random point in the
    /// upper half) so that many clients do not retry in step. `None`: do not retry.
    pub fn delay(&self, retry: u32, retry_after: Option<Duration>) -> Option<Duration> {
        if retry >= self.max_retries {
            return None;
        }
        if let Some(asked) = retry_after {
            return (asked <= self.max_retry_after).then_some(asked);
        }
        let exponential = self
            .base_delay
            .saturating_mul(2u32.saturating_pow(retry.min(20)))
            .min(self.max_delay);
        let half = exponential / 2;
        let jitter = half.mul_f64(fastrand::f64());
        Some(half + jitter)
    }
}

/// A provider whose retryable failures are retried under a [`RetryPolicy`].
#[derive(Debug)]
pub struct Retrying {
    inner: Arc<dyn Provider>,
    policy: RetryPolicy,
}

impl Retrying {
    /// Wrap `inner`.
    pub fn new(inner: Arc<dyn Provider>, policy: RetryPolicy) -> Self {
        Self { inner, policy }
    }
}

impl Provider for Retrying {
    fn label(&self) -> String {
        self.inner.label()
    }

    fn complete<'a>(
        &'a self,
        request: ChatRequest<'a>,
        events: &'a dyn ProviderEvents,
    ) -> BoxFuture<'a, Result<ChatResponse, ProviderError>> {
        Box::pin(async move {
            let mut retry = 0;
            loop {
                match self.inner.complete(request, events).await {
                    Ok(response) => return Ok(response),
                    Err(error) if error.is_retryable() => {
                        let Some(delay) = self.policy.delay(retry, error.retry_after()) else {
                            return Err(error);
                        };
                        tracing::debug!(provider = %self.inner.label(), retry, ?delay, "{error}; retrying");
                        events.retrying(&self.inner.label(), &error.to_string(), delay);
                        tokio::time::sleep(delay).await;
                        retry += 1;
                    }
                    Err(error) => return Err(error),
                }
            }
        })
    }
}

/// Providers tried in order; the first answer wins. Every failure is kept, so when all fail the
/// error names each.
#[derive(Debug)]
pub struct FailoverChain {
    members: Vec<Arc<dyn Provider>>,
}

impl FailoverChain {
    /// A chain of `members` (the first is the primary). Fails when the list is empty.
    pub fn new(members: Vec<Arc<dyn Provider>>) -> Result<Self, ProviderError> {
        if members.is_empty() {
            return Err(ProviderError::Config(
                "the provider chain is empty; configure [provider]".to_string(),
            ));
        }
        Ok(Self { members })
    }
}

impl Provider for FailoverChain {
    fn label(&self) -> String {
        self.members
            .iter()
            .map(|member| member.label())
            .collect::<Vec<_>>()
            .join(" -> ")
    }

    fn complete<'a>(
        &'a self,
        request: ChatRequest<'a>,
        events: &'a dyn ProviderEvents,
    ) -> BoxFuture<'a, Result<ChatResponse, ProviderError>> {
        Box::pin(async move {
            let mut failures = Vec::new();
            for (index, member) in self.members.iter().enumerate() {
                match member.complete(request, events).await {
                    Ok(response) => return Ok(response),
                    Err(error) => {
                        if let Some(next) = self.members.get(index + 1) {
                            tracing::debug!(from = %member.label(), to = %next.label(), "{error}; failing over");
                            events.failing_over(&member.label(), &next.label(), &error.to_string());
                        }
                        failures.push(error);
                    }
                }
            }
            match failures.len() {
                1 => Err(failures.remove(0)),
                _ => Err(ProviderError::AllFailed(
                    failures
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join("; "),
                )),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_exponentially_with_jitter_and_stop() {
        let policy = RetryPolicy {
            max_retries: 4,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_millis(500),
            max_retry_after: Duration::from_secs(5),
        };
        for _ in 0..200 {
            let bounds = [(50, 100), (100, 200), (200, 400), (250, 500)];
            for (retry, (low, high)) in bounds.into_iter().enumerate() {
                let delay = policy.delay(retry as u32, None).unwrap();
                assert!(
                    delay >= Duration::from_millis(low) && delay <= Duration::from_millis(high),
                    "retry {retry}: {delay:?}"
                );
            }
            assert_eq!(policy.delay(4, None), None);
        }
    }

    #[test]
    fn retry_after_is_honoured_up_to_a_limit() {
        let policy = RetryPolicy::default();
        assert_eq!(
            policy.delay(0, Some(Duration::from_secs(7))),
            Some(Duration::from_secs(7))
        );
        assert_eq!(policy.delay(0, Some(Duration::from_secs(3600))), None);
        assert_eq!(
            RetryPolicy {
                max_retries: 0,
                ..policy
            }
            .delay(0, Some(Duration::ZERO)),
            None
        );
    }
}
