//! What every layer of the native client puts on the wire: the gRPC client of
//! one server, request ids, a request's `grpc-timeout`, and the leader hint
//! a refusal carries.
//!
//! Where it sits: at the bottom, under the stream ([`super::mux`]), the
//! transports ([`super::transport`]) and the retries ([`super::rpc`]), so that
//! none of them imports another for these.

use std::time::Duration;

use fencelock_proto::v1::lock_client::LockClient;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic::Status;

use crate::backend::native::auth::Auth;

/// Pings on a connection with calls in flight (HTTP/2's, and the framed
/// session's: see [`super::mux`]): one this often...
pub(crate) const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(1);
/// ...and the connection is dead if a ping is not answered within this.
pub(crate) const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(2);

/// Metadata with which a follower names the leader's gRPC `host:port` (and
/// what the retry loop reads of a session error's `leader` field).
pub(crate) const LEADER_HEADER: &str = "fencelock-leader";

/// The leader a refusing follower named, if it did.
pub(crate) fn leader_hint(status: &Status) -> Option<String> {
    status.metadata().get(LEADER_HEADER).and_then(|v| v.to_str().ok()).map(str::to_string)
}

/// A gRPC client of one server. Every one is made by `rpc::Dial::client`, so
/// every call through it, unary or streaming, carries the token of [`Auth`].
pub(crate) type Grpc = LockClient<InterceptedService<Channel, Auth>>;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_are_never_zero() {
        assert!((0..10_000).all(|_| new_request_id() != 0));
    }
}
