//! The RPC layer: one tonic channel, a deadline on every call, and retries with
//! backoff that reuse the request id.
//!
//! Where it sits: below everything else in the crate. [`Rpc::call`] runs one
//! logical request: each attempt gets the time left until the operation's
//! deadline (sent as `grpc-timeout` and enforced locally); an attempt that fails
//! with a retryable status (see [`crate::error`]) is retried after
//! [`Backoff::delay`], until the deadline. The caller builds each attempt from the
//! same message, so every retry carries the same `request_id` and the server
//! answers a retry with the first outcome (never a second grant). The tonic
//! [`Channel`] reconnects by itself on the next attempt after a transport failure.

use std::future::Future;
use std::time::Duration;

use fencelock_proto::v1::lock_client::LockClient;
use tokio::time::Instant;
use tonic::transport::Channel;
use tonic::{Response, Status};

use crate::backoff::Backoff;
use crate::error::{is_retryable, Error};
use crate::metrics;

/// A new random, non-zero request id for one logical request.
pub(crate) fn new_request_id() -> u64 {
    fastrand::u64(1..)
}

/// A request message with the attempt's time budget as its `grpc-timeout`.
pub(crate) fn request<T>(msg: T, timeout: Duration) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    req.set_timeout(timeout);
    req
}

/// The connection to one server, shared by every handle of a [`crate::Client`].
#[derive(Debug, Clone)]
pub(crate) struct Rpc {
    client: LockClient<Channel>,
    /// Deadline of a call that does not wait (and the part of a waiting acquire's
    /// deadline beyond its wait).
    pub(crate) rpc_timeout: Duration,
    backoff: Backoff,
}

impl Rpc {
    pub(crate) fn new(channel: Channel, rpc_timeout: Duration, backoff: Backoff) -> Rpc {
        Rpc { client: LockClient::new(channel), rpc_timeout, backoff }
    }

    /// The retry policy.
    pub(crate) fn backoff(&self) -> Backoff {
        self.backoff
    }

    /// The raw tonic client (for the session stream).
    pub(crate) fn raw(&self) -> LockClient<Channel> {
        self.client.clone()
    }

    /// The deadline of a non-waiting call that starts now.
    pub(crate) fn deadline(&self) -> Instant {
        Instant::now() + self.rpc_timeout
    }

    /// Runs one logical request until `deadline`. `attempt(client, time_left)` must
    /// send the same message (same request id) every time. `op` names the call in
    /// logs and metrics.
    pub(crate) async fn call<T, F, Fut>(&self, op: &'static str, deadline: Instant, mut attempt: F) -> Result<T, Error>
    where
        F: FnMut(LockClient<Channel>, Duration) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        let mut retries = 0u32;
        let mut last: Option<Status> = None;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(exhausted(last));
            }
            let status = match tokio::time::timeout(left, attempt(self.client.clone(), left)).await {
                Err(_elapsed) => return Err(Error::Timeout),
                Ok(Ok(resp)) => return Ok(resp.into_inner()),
                Ok(Err(status)) if is_retryable(&status) => status,
                Ok(Err(status)) => return Err(Error::from_status(&status)),
            };
            let delay = self.backoff.delay(retries, fastrand::f64());
            tracing::debug!(op, retries, ?delay, %status, "fencelock: retrying");
            metrics::rpc_retry(op);
            if Instant::now() + delay >= deadline {
                return Err(exhausted(Some(status)));
            }
            tokio::time::sleep(delay).await;
            retries += 1;
            last = Some(status);
        }
    }
}

/// The error once the deadline leaves no room for another retry: the server
/// kept refusing or dropping the call (a closed connection arrives as
/// `Cancelled`), so it is unavailable; with no answer at all, a timeout.
fn exhausted(last: Option<Status>) -> Error {
    match last {
        Some(s) => Error::Unavailable(s.message().to_string()),
        None => Error::Timeout,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    fn rpc() -> Rpc {
        // Never connected: the tests below never touch the channel.
        let ch = tonic::transport::Endpoint::from_static("http://127.0.0.1:1").connect_lazy();
        let backoff = Backoff { initial: Duration::from_millis(1), max: Duration::from_millis(4) };
        Rpc::new(ch, Duration::from_secs(5), backoff)
    }

    #[test]
    fn request_ids_are_never_zero() {
        assert!((0..10_000).all(|_| new_request_id() != 0));
    }

    #[tokio::test]
    async fn retries_unavailable_then_succeeds() {
        let calls = AtomicU32::new(0);
        let got = rpc()
            .call("test", Instant::now() + Duration::from_secs(5), |_, _| {
                let n = calls.fetch_add(1, Ordering::SeqCst);
                async move {
                    if n < 3 {
                        Err(Status::unavailable("no leader"))
                    } else {
                        Ok(Response::new(n))
                    }
                }
            })
            .await;
        assert_eq!(got, Ok(3));
        assert_eq!(calls.load(Ordering::SeqCst), 4);
    }

    #[tokio::test]
    async fn does_not_retry_a_server_refusal() {
        let calls = AtomicU32::new(0);
        let got: Result<(), _> = rpc()
            .call("test", Instant::now() + Duration::from_secs(5), |_, _| {
                calls.fetch_add(1, Ordering::SeqCst);
                async { Err(Status::not_found("lease 9 not found")) }
            })
            .await;
        assert_eq!(got, Err(Error::LeaseNotFound("lease 9 not found".into())));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn retries_stop_at_the_deadline_with_unavailable() {
        let start = Instant::now();
        let deadline = start + Duration::from_millis(500);
        let got: Result<(), _> = rpc().call("test", deadline, |_, _| async { Err(Status::unavailable("down")) }).await;
        assert_eq!(got, Err(Error::Unavailable("down".into())));
        assert!(Instant::now() <= deadline, "never sleeps past the deadline");
    }

    #[tokio::test(start_paused = true)]
    async fn a_hung_attempt_ends_at_the_deadline_with_timeout() {
        let start = Instant::now();
        let got: Result<(), _> = rpc()
            .call("test", start + Duration::from_millis(300), |_, left| async move {
                assert_eq!(left, Duration::from_millis(300));
                futures::future::pending().await
            })
            .await;
        assert_eq!(got, Err(Error::Timeout));
        assert_eq!(Instant::now() - start, Duration::from_millis(300));
    }
}
