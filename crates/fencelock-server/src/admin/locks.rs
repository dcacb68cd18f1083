//! The HTTP API's lock operations: acquire (a long-poll in the server's
//! queue), release, check, set value, complete a slot, downgrade, resize.
//!
//! - `POST /v1/locks/{name}/acquire` (`acquire`): on `lease_id`, or with
//!   `ttl_ms` on a lease the call grants (kept alive by the server while the
//!   request waits, renewed once more at the grant, and revoked again if the
//!   call ends without a grant); `wait_ms` waits in the lock's FIFO queue,
//!   answered when the grant is pushed or with 409 `timed_out`; a client that
//!   goes away while it waits leaves the queue (the dropped request cancels
//!   its wait). A lease given by `lease_id` is the client's to keep alive
//!   while it waits, as ever.
//!   200 `{"lock","lease_id","token","waited_ms","lease_created","ttl_ms"?,
//!   "grants":[{"lock","token"}]}`; 409 `busy` (with `holder`), `timed_out`,
//!   `slot_done`.
//! - `POST /v1/locks/{name}/release` `{"lease_id","token"}` (`release`):
//!   compare-and-delete; 200 `{"released": true}`, 409 `not_holder`.
//! - `GET /v1/locks/{name}/check?token=` (`check`): `{"current","current_token"}`.
//! - `PUT /v1/locks/{name}/value` (`setValue`), `POST …/complete`
//!   (`completeSlot`), `POST …/downgrade` (`downgrade`): 409 `not_holder`
//!   when the grant is not current; `PUT …/permits` (`resize`, admin).
//! - `POST /v1/locks/{name}/refusals` `{"refused_token","highest_token",
//!   "resource"?}` (`reportRefusal`): a fence's report that it refused a
//!   stale write (needs `check`); 200 `{"recorded": true}`, 400 for a report
//!   no fence makes, 429 `limit_reached` beyond the node's rate of reports.
//!
//! A lock name with `/` in it is percent-encoded in the path (`jobs%2Fnightly`).
//! Ids and tokens are decimal strings ([`Id`]).
//!
//! Where it sits: handlers of the admin router ([`super`]) over
//! [`crate::api::Ops`], as the gRPC port's; elections ([`super::elections`])
//! campaign through [`acquire_on`].

use std::collections::HashMap;

use axum::extract::{Path, Query, State};
use axum::Json;
use fencelock_core::{ErrorCode, LockName};
use fencelock_proto::v1 as pb;
use serde::{Deserialize, Serialize};

use super::body::{value_bytes, Id, JsonBody};
use super::errors::ApiError;
use super::{Admin, Caller};
use crate::access::auth::{Verb, Who};

/// The lock mode of an acquire.
#[derive(Deserialize, Default, Clone, Copy)]
#[serde(rename_all = "snake_case")]
pub(super) enum ModeJson {
    #[default]
    Exclusive,
    Shared,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct AcquireBody {
    #[serde(default)]
    lease_id: Option<Id>,
    #[serde(default)]
    ttl_ms: Option<u64>,
    #[serde(default)]
    wait_ms: u64,
    #[serde(default)]
    mode: ModeJson,
    #[serde(default)]
    permits: u32,
    #[serde(default)]
    weight: u32,
    #[serde(default)]
    identity: String,
    #[serde(default)]
    value: Option<String>,
    #[serde(default)]
    value_base64: Option<String>,
    #[serde(default)]
    hold_at_least_ms: u64,
    #[serde(default)]
    lock_delay_ms: u64,
    #[serde(default)]
    once_per: String,
    #[serde(default)]
    also: Vec<String>,
    #[serde(default)]
    request_id: Option<Id>,
}

/// The lease an acquire runs on.
pub(super) enum LeaseArg {
    /// One the caller holds.
    Given(u64),
    /// One the call grants with this TTL.
    Create(u64),
}

impl LeaseArg {
    /// Exactly one of `lease_id` and `ttl_ms`.
    pub(super) fn of(lease_id: Option<Id>, ttl_ms: Option<u64>) -> Result<LeaseArg, ApiError> {
        match (lease_id, ttl_ms) {
            (Some(Id(id)), None) => Ok(LeaseArg::Given(id)),
            (None, Some(ttl)) => Ok(LeaseArg::Create(ttl)),
            _ => Err(ApiError::field(
                "lease_id",
                "give lease_id (a lease you hold) or ttl_ms (a new lease), one of them",
            )),
        }
    }
}

#[derive(Serialize)]
pub(super) struct AcquiredJson {
    pub(super) lock: String,
    pub(super) lease_id: Id,
    pub(super) token: Id,
    pub(super) waited_ms: u64,
    /// Whether this call granted the lease (`ttl_ms` given): keep it alive.
    pub(super) lease_created: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) ttl_ms: Option<u64>,
    /// Every lock granted, in the order asked (one unless `also` named more).
    pub(super) grants: Vec<GrantJson>,
}

#[derive(Serialize)]
pub(super) struct GrantJson {
    lock: String,
    token: Id,
}

pub(super) async fn acquire(
    State(a): State<Admin>,
    c: Caller,
    Path(name): Path<String>,
    body: Result<JsonBody<AcquireBody>, ApiError>,
) -> Result<Json<AcquiredJson>, ApiError> {
    let who = c.api(&a)?;
    let JsonBody(r) = body?;
    let lease = LeaseArg::of(r.lease_id, r.ttl_ms)?;
    let value = value_bytes(r.value, r.value_base64)?;
    let req = pb::AcquireRequest {
        request_id: super::request_id(r.request_id),
        lease_id: 0,
        lock: name,
        wait_ms: r.wait_ms,
        lock_delay_ms: r.lock_delay_ms,
        identity: r.identity,
        value,
        mode: match r.mode {
            ModeJson::Exclusive => pb::LockMode::Exclusive,
            ModeJson::Shared => pb::LockMode::Shared,
        } as i32,
        permits: r.permits,
        weight: r.weight,
        hold_at_least_ms: r.hold_at_least_ms,
        once_per: r.once_per,
        also: r.also,
        attempt: 0,
    };
    acquire_on(&a, &who, lease, req).await.map(Json)
}

/// `req` on `lease`: a lease the call grants is granted only once the
/// request is known valid and allowed (a refused request writes nothing),
/// and revoked again unless the lock is granted on it.
pub(super) async fn acquire_on(
    a: &Admin,
    who: &Who,
    lease: LeaseArg,
    mut req: pb::AcquireRequest,
) -> Result<AcquiredJson, ApiError> {
    use pb::acquire_response::Outcome;
    let (lease_id, created) = match lease {
        LeaseArg::Given(id) => (id, None),
        LeaseArg::Create(ttl_ms) => {
            precheck(a, who, &req)?;
            let grant = pb::GrantLeaseRequest { request_id: super::request_id(None), ttl_ms };
            let granted = a.ops.grant_lease(who, grant).await?;
            (granted.lease_id, Some(CreatedLease::new(a, who, granted.lease_id, granted.ttl_ms)))
        }
    };
    req.lease_id = lease_id;
    // A lease the call granted is the server's to keep alive while the
    // request waits: the client learns its id only from the answer.
    let renewing = created.as_ref().map(CreatedLease::renew_while_waiting);
    let outcome = a.ops.acquire(who, req).await?.outcome;
    drop(renewing);
    let grants: Vec<pb::Acquired> = match outcome {
        Some(Outcome::Acquired(g)) => vec![g],
        Some(Outcome::AcquiredAll(all)) => all.grants,
        Some(Outcome::Busy(b)) => return Err(busy(b)),
        Some(Outcome::TimedOut(_)) => {
            return Err(ApiError::new(ErrorCode::TimedOut, "the wait ran out before the lock was granted"))
        }
        Some(Outcome::SlotDone(s)) => {
            let message = format!("the slot was completed already (token {}, exit code {})", s.token, s.exit_code);
            return Err(ApiError::new(ErrorCode::SlotDone, message)
                .with("token", s.token.to_string())
                .with("identity", s.identity)
                .with("exit_code", s.exit_code));
        }
        None => return Err(ApiError::new(ErrorCode::Internal, "the acquire answered no outcome")),
    };
    let first = grants.first().ok_or_else(|| ApiError::new(ErrorCode::Internal, "a grant of no lock"))?;
    let ttl_ms = created.as_ref().map(|c| c.ttl_ms);
    let json = AcquiredJson {
        lock: first.lock.clone(),
        lease_id: Id(first.lease_id),
        token: Id(first.token),
        waited_ms: first.waited_ms,
        lease_created: created.is_some(),
        ttl_ms,
        grants: grants.iter().map(|g| GrantJson { lock: g.lock.clone(), token: Id(g.token) }).collect(),
    };
    if let Some(c) = created {
        // Its TTL starts again now: the client's keep-alives take over.
        c.renew().await?;
        c.keep();
    }
    Ok(json)
}

/// What the acquire would be refused for, checked before a lease is
/// granted for it: its fields (the engine's rules) and the caller's
/// permission on every lock it names (refused as the operation refuses:
/// audited).
fn precheck(a: &Admin, who: &Who, req: &pb::AcquireRequest) -> Result<(), ApiError> {
    let acquire = fencelock_core::Acquire {
        req: fencelock_core::RequestId(1),
        lease: fencelock_core::LeaseId(1),
        lock: req.lock.clone(),
        wait_ms: req.wait_ms,
        lock_delay_ms: req.lock_delay_ms,
        identity: req.identity.clone(),
        value: req.value.clone(),
        mode: fencelock_core::Mode::Exclusive,
        weight: req.weight.max(1),
        permits: req.permits,
        hold_at_least_ms: req.hold_at_least_ms,
        once_per: req.once_per.clone(),
        also: req.also.clone(),
    };
    acquire.validate().map_err(|e| ApiError::from(crate::api::engine_status(e)))?;
    for lock in std::iter::once(&req.lock).chain(&req.also) {
        if let Err(r) = who.require(Verb::Acquire, lock) {
            return Err(a.ops.refused(who.name(), who.remote(), r).into());
        }
    }
    Ok(())
}

/// A lease an acquire granted: revoked in the background when dropped
/// before [`CreatedLease::keep`] (the lock was not granted on it, or the
/// client went away while it waited).
struct CreatedLease {
    ops: crate::api::Ops,
    who: Who,
    lease: u64,
    ttl_ms: u64,
    keep: bool,
}

impl CreatedLease {
    fn new(a: &Admin, who: &Who, lease: u64, ttl_ms: u64) -> Self {
        CreatedLease { ops: a.ops.clone(), who: who.clone(), lease, ttl_ms, keep: false }
    }

    fn keep(mut self) {
        self.keep = true;
    }

    /// One keep-alive of the lease.
    async fn renew(&self) -> Result<(), ApiError> {
        let req = pb::KeepAliveRequest { request_id: super::request_id(None), lease_id: self.lease };
        self.ops.keep_alive(&self.who, req).await.map(drop).map_err(ApiError::from)
    }

    /// Keeps the lease alive every third of its TTL until the returned
    /// guard is dropped (the request was answered, or went away).
    fn renew_while_waiting(&self) -> Renewing {
        let lease = CreatedLease { ops: self.ops.clone(), who: self.who.clone(), keep: true, ..*self };
        let every = std::time::Duration::from_millis((self.ttl_ms / 3).max(1));
        Renewing(tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                match lease.renew().await {
                    Ok(()) => {}
                    // Gone: the wait ends with lease_not_found by itself.
                    Err(e) if e.code == ErrorCode::LeaseNotFound => return,
                    Err(e) => {
                        tracing::debug!(lease = lease.lease, error = %e.message, "keep-alive of a waiting HTTP acquire's lease failed; trying again")
                    }
                }
            }
        }))
    }
}

/// Stops the keep-alives of [`CreatedLease::renew_while_waiting`] when dropped.
struct Renewing(tokio::task::JoinHandle<()>);

impl Drop for Renewing {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Drop for CreatedLease {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        let (ops, who, lease) = (self.ops.clone(), self.who.clone(), self.lease);
        tokio::spawn(async move {
            let req = pb::RevokeLeaseRequest { request_id: super::request_id(None), lease_id: lease };
            if let Err(e) = ops.revoke_lease(&who, req).await {
                tracing::debug!(lease, error = %e, "the lease an HTTP acquire granted was not revoked; it expires");
            }
        });
    }
}

fn busy(b: pb::Busy) -> ApiError {
    let mut e = ApiError::new(ErrorCode::Busy, "the lock is held").with("waiters", b.waiters);
    if let Some(h) = b.holder {
        let holder = serde_json::json!({ "lease_id": h.lease_id.to_string(), "token": h.token.to_string() });
        e = e.with("holder", holder);
    }
    if let Some(ms) = b.reopens_in_ms {
        e = e.with("reopens_in_ms", ms);
    }
    e
}

/// A grant named by its lease and token (release, downgrade).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct GrantBody {
    lease_id: Id,
    token: Id,
    #[serde(default)]
    request_id: Option<Id>,
}

pub(super) async fn release(
    State(a): State<Admin>,
    c: Caller,
    Path(name): Path<String>,
    body: Result<JsonBody<GrantBody>, ApiError>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let who = c.api(&a)?;
    let JsonBody(r) = body?;
    let grant = Named { lock: name, lease: r.lease_id, token: r.token, request_id: r.request_id };
    done("released", release_grant(&a, &who, grant).await?, NOT_HOLDER)
}

/// A grant a request names: its lock, lease and token (an election's term).
pub(super) struct Named {
    pub(super) lock: String,
    pub(super) lease: Id,
    pub(super) token: Id,
    pub(super) request_id: Option<Id>,
}

/// Releases `g` (compare-and-delete): whether it was the current grant.
pub(super) async fn release_grant(a: &Admin, who: &Who, g: Named) -> Result<bool, ApiError> {
    let req = pb::ReleaseRequest {
        request_id: super::request_id(g.request_id),
        lease_id: g.lease.0,
        lock: g.lock,
        token: g.token.0,
    };
    Ok(a.ops.release(who, req).await?.released)
}

/// Sets the value published with `g`: whether it was the current grant.
pub(super) async fn set_value_of(a: &Admin, who: &Who, g: Named, value: Vec<u8>) -> Result<bool, ApiError> {
    let req = pb::SetValueRequest {
        request_id: super::request_id(g.request_id),
        lease_id: g.lease.0,
        lock: g.lock,
        token: g.token.0,
        value,
    };
    Ok(a.ops.set_value(who, req).await?.set)
}

pub(super) async fn downgrade(
    State(a): State<Admin>,
    c: Caller,
    Path(name): Path<String>,
    body: Result<JsonBody<GrantBody>, ApiError>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let who = c.api(&a)?;
    let JsonBody(r) = body?;
    let req = pb::DowngradeRequest {
        request_id: super::request_id(r.request_id),
        lease_id: r.lease_id.0,
        lock: name,
        token: r.token.0,
    };
    let downgraded = a.ops.downgrade(&who, req).await?.downgraded;
    done("downgraded", downgraded, NOT_HOLDER)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ValueBody {
    lease_id: Id,
    token: Id,
    #[serde(default)]
    value: Option<String>,
    #[serde(default)]
    value_base64: Option<String>,
    #[serde(default)]
    request_id: Option<Id>,
}

pub(super) async fn set_value(
    State(a): State<Admin>,
    c: Caller,
    Path(name): Path<String>,
    body: Result<JsonBody<ValueBody>, ApiError>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let who = c.api(&a)?;
    let JsonBody(r) = body?;
    let value = value_bytes(r.value, r.value_base64)?;
    let grant = Named { lock: name, lease: r.lease_id, token: r.token, request_id: r.request_id };
    done("set", set_value_of(&a, &who, grant, value).await?, NOT_HOLDER)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CompleteBody {
    lease_id: Id,
    token: Id,
    slot: String,
    #[serde(default)]
    exit_code: i32,
    #[serde(default)]
    request_id: Option<Id>,
}

pub(super) async fn complete_slot(
    State(a): State<Admin>,
    c: Caller,
    Path(name): Path<String>,
    body: Result<JsonBody<CompleteBody>, ApiError>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let who = c.api(&a)?;
    let JsonBody(r) = body?;
    let req = pb::CompleteSlotRequest {
        request_id: super::request_id(r.request_id),
        lease_id: r.lease_id.0,
        lock: name,
        token: r.token.0,
        slot: r.slot,
        exit_code: r.exit_code,
    };
    let completed = a.ops.complete_slot(&who, req).await?.completed;
    done("completed", completed, NOT_HOLDER)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ResizeBody {
    permits: u32,
}

pub(super) async fn resize(
    State(a): State<Admin>,
    c: Caller,
    Path(name): Path<String>,
    body: Result<JsonBody<ResizeBody>, ApiError>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let who = c.api(&a)?;
    let JsonBody(r) = body?;
    let was = a.ops.resize(&who, pb::ResizeRequest { lock: name, permits: r.permits }).await?.was;
    Ok(Json(serde_json::json!({ "was": was })))
}

/// A fence's refusal report: the token it refused, its highest, what it
/// protects.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RefusalBody {
    refused_token: Id,
    highest_token: Id,
    #[serde(default)]
    resource: String,
}

pub(super) async fn report_refusal(
    State(a): State<Admin>,
    c: Caller,
    Path(name): Path<String>,
    body: Result<JsonBody<RefusalBody>, ApiError>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let who = c.api(&a)?;
    let JsonBody(r) = body?;
    let req = pb::ReportRefusalRequest {
        lock: name,
        refused_token: r.refused_token.0,
        highest_token: r.highest_token.0,
        resource: r.resource,
    };
    let recorded = a.ops.report_refusal(&who, req).await?.recorded;
    Ok(Json(serde_json::json!({ "recorded": recorded })))
}

pub(super) async fn check(
    State(a): State<Admin>,
    c: Caller,
    Path(name): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let who = c.api(&a)?;
    if let Some(other) = q.keys().find(|k| k.as_str() != "token") {
        return Err(ApiError::field(other, format!("unknown query parameter {other:?} (check takes token)")));
    }
    let token = match q.get("token").map(|t| t.parse::<u64>()) {
        Some(Ok(t)) => t,
        Some(Err(_)) => return Err(ApiError::field("token", "token is not a decimal 64-bit number")),
        None => return Err(ApiError::field("token", "check needs ?token=")),
    };
    let r = a.ops.check(&who, pb::CheckRequest { lock: name, token }).await?;
    Ok(Json(serde_json::json!({ "current": r.current, "current_token": r.current_token.map(|t| t.to_string()) })))
}

/// Why a request on a grant that is not current is refused.
const NOT_HOLDER: &str =
    "the lease and token are not a current grant of this lock (released, expired, or never theirs)";

/// `{"<what>": true}`, or 409 `not_holder` saying `why` when the grant was
/// not current.
pub(super) fn done(what: &str, ok: bool, why: &str) -> Result<Json<serde_json::Value>, ApiError> {
    match ok {
        true => Ok(Json(serde_json::json!({ what: true }))),
        false => Err(ApiError::new(ErrorCode::NotHolder, why)),
    }
}

/// A lock name from a path, or a 400 naming it.
pub(super) fn lock_name(name: String) -> Result<LockName, ApiError> {
    LockName::new(name).map_err(|e| ApiError::field("name", format!("invalid lock name: {e}")))
}
