//! The native leases' RPCs: grant, revoke, and the watchdog that keeps a
//! lease alive through the shared renewal loop ([`crate::lease::renew_loop`])
//! and listens to the server's `WatchLeases` push stream beside it.
//!
//! # The push stream
//! One stream per lease, opened by its watchdog: a client shares one lease per
//! TTL ([`super::registry`]), so it has a handful of leases and as many idle
//! streams (HTTP/2 streams on its gRPC connection); a stream per lease needs no
//! re-subscription when the set of leases changes, and ends with its watchdog.
//! When the server pushes that the lease was revoked or expired (or was not
//! found when the stream opened), the cell is lost at once with
//! [`LeaseLost::Revoked`], [`LeaseLost::Expired`] or [`LeaseLost::NotFound`]:
//! `lost()` fires within a round trip of the server's decision instead of at the
//! next keep-alive. The stream only ever brings the loss forward: the keep-alives
//! go on exactly as without it and stay the only thing that moves the deadline.
//! A broken stream is opened again after the client's backoff; a server that
//! refuses it for good (an older server without the RPC, a refused identity)
//! leaves the lease to its keep-alives.

use std::sync::Arc;
use std::time::Duration;

use fencelock_proto::v1::lease_event::Kind;
use fencelock_proto::v1::{GrantLeaseRequest, KeepAliveRequest, RevokeLeaseRequest, WatchLeasesRequest};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::rpc::Rpc;
use super::wire::{new_request_id, request};
use crate::error::{Error, LeaseLost};
use crate::lease::{renew_loop, LeaseCell, Renewed};
use crate::types::{ms, to_ms};

/// Grants a lease of `ttl` before `deadline`. Returns the cell and the send time
/// of the grant's first attempt (what the deadline counts from).
pub(crate) async fn grant(rpc: &Rpc, ttl: Duration, deadline: Instant) -> Result<(Arc<LeaseCell>, Instant), Error> {
    let msg = GrantLeaseRequest { request_id: new_request_id(), ttl_ms: to_ms(ttl) };
    let sent = crate::clock::now();
    let resp = rpc.send("grant_lease", deadline, || msg).await?;
    if resp.lease_id == 0 {
        return Err(Error::Protocol("GrantLeaseResponse with lease id 0".into()));
    }
    let ttl = if resp.ttl_ms > 0 { ms(resp.ttl_ms) } else { ttl };
    let cell = LeaseCell::new(resp.lease_id, ttl, sent + ttl);
    cell.seen_term(resp.leader_term);
    Ok((cell, sent))
}

/// Revokes `lease_id`, with retries until the RPC deadline.
pub(crate) async fn revoke(rpc: &Rpc, lease_id: u64) -> Result<(), Error> {
    let msg = RevokeLeaseRequest { request_id: new_request_id(), lease_id };
    rpc.call("revoke_lease", rpc.deadline(), |mut c, left| async move { c.revoke_lease(request(msg, left)).await })
        .await
        .map(|_| ())
}

/// Revokes `lease_id` in the background; failures are logged (the lease then
/// expires on the server after its TTL, as nobody renews it).
pub(crate) fn spawn_revoke(runtime: &tokio::runtime::Handle, rpc: Rpc, lease_id: u64) {
    runtime.spawn(async move {
        match revoke(&rpc, lease_id).await {
            Ok(()) | Err(Error::LeaseNotFound(_)) => {}
            Err(e) => tracing::debug!(lease = lease_id, error = %e, "fencelock: revoke failed"),
        }
    });
}

/// Starts the watchdog of `cell`, whose last confirmed request was sent at `sent`.
pub(crate) fn spawn_watchdog(rpc: Rpc, cell: Arc<LeaseCell>, sent: Instant) -> JoinHandle<()> {
    tokio::spawn(watchdog(rpc, cell, sent))
}

/// Keeps the lease alive until it is lost (or the task is aborted by the
/// registry when the last guard goes); then revokes it if it was lost by its
/// deadline, to free its locks for others.
async fn watchdog(rpc: Rpc, cell: Arc<LeaseCell>, last_sent: Instant) {
    let round = rpc.rpc_timeout;
    let renew = renew_loop(&cell, rpc.backoff(), round, last_sent, |end| keep_alive(&rpc, &cell, end));
    // Either returns only once the lease is lost.
    tokio::select! {
        _ = renew => {}
        _ = listen(&rpc, &cell) => {}
    }
    // Lost because the client could not prove the lease: the server may still
    // hold it, but nobody will use its locks any more. Free them for others.
    if cell.state().lost == Some(LeaseLost::Expired) {
        let _ = revoke(&rpc, cell.id).await;
    }
}

/// One keep-alive round: the confirmed TTL (None if the server sent 0), or
/// `Renewed::Gone` for the server's "lease not found" (the one place that
/// answer becomes an outcome).
async fn keep_alive(rpc: &Rpc, cell: &LeaseCell, deadline: Instant) -> Result<Renewed, Error> {
    let msg = KeepAliveRequest { request_id: new_request_id(), lease_id: cell.id };
    match rpc.send("keep_alive", deadline, || msg).await {
        Ok(resp) => {
            cell.seen_term(resp.leader_term);
            Ok(Renewed::Confirmed((resp.ttl_ms > 0).then(|| ms(resp.ttl_ms))))
        }
        Err(Error::LeaseNotFound(_)) => Ok(Renewed::Gone),
        Err(e) => Err(e),
    }
}

/// Listens to the push stream of `cell`'s lease until the server says the lease
/// ended, then marks the cell lost and returns. Never returns otherwise: a
/// broken stream is opened again after a backoff (reset once the server
/// confirms it watches the lease); a final refusal leaves it to the keep-alives.
async fn listen(rpc: &Rpc, cell: &LeaseCell) {
    let backoff = rpc.backoff();
    let mut failures = 0u32;
    loop {
        match watch_once(rpc, cell, &mut failures).await {
            Ok(reason) => {
                cell.lose(reason);
                return;
            }
            Err(e) if !e.is_transient() => {
                tracing::debug!(lease = cell.id, error = %e, "fencelock: no lease events; keep-alives only");
                return std::future::pending().await;
            }
            Err(e) => {
                failures += 1;
                tracing::debug!(lease = cell.id, failures, error = %e, "fencelock: lease events stream failed");
            }
        }
        tokio::time::sleep(backoff.delay(failures.saturating_sub(1), fastrand::f64())).await;
    }
}

/// One `WatchLeases` stream for `cell`'s lease: the loss it reports, or the
/// error that ended it. `failures` is reset once the server watches the lease;
/// the leader term it watches with is recorded (a stream reopened on a new
/// leader tells of the fail-over before the next keep-alive does).
async fn watch_once(rpc: &Rpc, cell: &LeaseCell, failures: &mut u32) -> Result<LeaseLost, Error> {
    let lease_id = cell.id;
    let msg = WatchLeasesRequest { lease_ids: vec![lease_id] };
    // No grpc-timeout: the stream lives as long as the lease. The call's deadline
    // bounds the wait for the server to open it.
    let mut stream = rpc
        .call("watch_leases", rpc.deadline(), |mut c, _left| {
            let msg = msg.clone();
            async move { c.watch_leases(msg).await }
        })
        .await?;
    loop {
        let event = match stream.message().await {
            Ok(Some(event)) => event,
            Ok(None) => return Err(Error::Unavailable("lease events stream ended".into())),
            Err(status) => return Err(Error::from_status(&status)),
        };
        if event.lease_id != lease_id {
            continue;
        }
        if let Some(Kind::Watching(w)) = &event.kind {
            cell.seen_term(w.leader_term);
        }
        match event.kind.as_ref().and_then(pushed_loss) {
            Some(reason) => return Ok(reason),
            None => *failures = 0,
        }
    }
}

/// The loss a pushed event reports (`None`: the lease is watched and live, or
/// an event this client does not know).
fn pushed_loss(kind: &Kind) -> Option<LeaseLost> {
    match kind {
        Kind::Watching(_) => None,
        Kind::Revoked(_) => Some(LeaseLost::Revoked),
        Kind::Expired(_) => Some(LeaseLost::Expired),
        Kind::NotFound(_) => Some(LeaseLost::NotFound),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fencelock_proto::v1::lease_event as ev;

    /// Each pushed end is the loss `lost()` reports; `watching` is none.
    #[test]
    fn pushed_events_map_to_their_losses() {
        let watching = Kind::Watching(ev::Watching { ttl_ms: 60_000, ttl_left_ms: 59_000, leader_term: 3 });
        assert_eq!(pushed_loss(&watching), None);
        assert_eq!(pushed_loss(&Kind::Revoked(ev::Revoked {})), Some(LeaseLost::Revoked));
        assert_eq!(pushed_loss(&Kind::Expired(ev::Expired {})), Some(LeaseLost::Expired));
        assert_eq!(pushed_loss(&Kind::NotFound(ev::NotFound {})), Some(LeaseLost::NotFound));
    }
}
