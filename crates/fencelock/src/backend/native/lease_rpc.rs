//! The native leases' RPCs: grant, revoke, and the watchdog that keeps a
//! lease alive through the shared renewal loop ([`crate::lease::renew_loop`]).

use std::sync::Arc;
use std::time::Duration;

use fencelock_proto::v1::{GrantLeaseRequest, KeepAliveRequest, RevokeLeaseRequest};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::rpc::{new_request_id, request, Rpc};
use crate::error::{Error, LeaseLost};
use crate::lease::{renew_loop, LeaseCell, Renewed};
use crate::types::{ms, to_ms};

/// Grants a lease of `ttl` before `deadline`. Returns the cell and the send time
/// of the grant's first attempt (what the deadline counts from).
pub(crate) async fn grant(rpc: &Rpc, ttl: Duration, deadline: Instant) -> Result<(Arc<LeaseCell>, Instant), Error> {
    let msg = GrantLeaseRequest { request_id: new_request_id(), ttl_ms: to_ms(ttl) };
    let sent = Instant::now();
    let resp =
        rpc.call("grant_lease", deadline, |mut c, left| async move { c.grant_lease(request(msg, left)).await }).await?;
    if resp.lease_id == 0 {
        return Err(Error::Protocol("GrantLeaseResponse with lease id 0".into()));
    }
    let ttl = if resp.ttl_ms > 0 { ms(resp.ttl_ms) } else { ttl };
    Ok((LeaseCell::new(resp.lease_id, ttl, sent + ttl), sent))
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
    renew_loop(&cell, rpc.backoff(), round, last_sent, |end| keep_alive(&rpc, cell.id, end)).await;
    // Lost because the client could not prove the lease: the server may still
    // hold it, but nobody will use its locks any more. Free them for others.
    if cell.state().lost == Some(LeaseLost::Expired) {
        let _ = revoke(&rpc, cell.id).await;
    }
}

/// One keep-alive round: the confirmed TTL (None if the server sent 0), or
/// `Renewed::Gone` for the server's "lease not found" (the one place that
/// answer becomes an outcome).
async fn keep_alive(rpc: &Rpc, lease_id: u64, deadline: Instant) -> Result<Renewed, Error> {
    let msg = KeepAliveRequest { request_id: new_request_id(), lease_id };
    match rpc.call("keep_alive", deadline, |mut c, left| async move { c.keep_alive(request(msg, left)).await }).await {
        Ok(resp) => Ok(Renewed::Confirmed((resp.ttl_ms > 0).then(|| ms(resp.ttl_ms)))),
        Err(Error::LeaseNotFound(_)) => Ok(Renewed::Gone),
        Err(e) => Err(e),
    }
}
