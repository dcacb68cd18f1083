//! The HTTP API's leases: grant, keep-alive, revoke, describe.
//!
//! - `POST /v1/leases` `{"ttl_ms"}` → `{"lease_id", "ttl_ms"}` (`grantLease`)
//! - `POST /v1/leases/{id}/keepalive` → `{"lease_id", "ttl_ms"}` (`keepAlive`)
//! - `DELETE /v1/leases/{id}` → `{"revoked": true}` (`revokeLease`)
//! - `GET /v1/leases/{id}` → `{"lease_id", "owner"?, "ttl_ms", "ttl_left_ms",
//!   "locks": [{"lock", "token"}]}` (`describeLease`; `owner` only when the
//!   lease has one)
//!
//! Where it sits: handlers of the admin router ([`super`]) over the same
//! operations as the gRPC port ([`crate::api::Ops`]), so the same permission,
//! quota, ownership and audit rules hold. A lease ends unless kept alive
//! within its TTL: over HTTP that is the client's job (a keep-alive every
//! third of the TTL is the rule of thumb `docs/http-api.md` gives).

use axum::extract::{Path, State};
use axum::Json;
use fencelock_core::ErrorCode;
use fencelock_proto::v1 as pb;
use serde::{Deserialize, Serialize};

use super::body::{Id, JsonBody};
use super::errors::ApiError;
use super::{Admin, Caller};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct GrantLease {
    ttl_ms: u64,
    #[serde(default)]
    request_id: Option<Id>,
}

/// An empty body, or one that names the request for de-duplication.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct Request {
    #[serde(default)]
    request_id: Option<Id>,
}

#[derive(Serialize)]
pub(super) struct LeaseJson {
    lease_id: Id,
    ttl_ms: u64,
}

#[derive(Serialize)]
pub(super) struct Revoked {
    revoked: bool,
}

#[derive(Serialize)]
pub(super) struct LeaseInfoJson {
    lease_id: Id,
    /// The identity that owns it (absent: granted without authentication).
    #[serde(skip_serializing_if = "Option::is_none")]
    owner: Option<String>,
    ttl_ms: u64,
    ttl_left_ms: u64,
    locks: Vec<HeldJson>,
}

#[derive(Serialize)]
pub(super) struct HeldJson {
    lock: String,
    token: Id,
}

pub(super) async fn grant(
    State(a): State<Admin>,
    c: Caller,
    body: Result<JsonBody<GrantLease>, ApiError>,
) -> Result<Json<LeaseJson>, ApiError> {
    let who = c.api(&a)?;
    let JsonBody(r) = body?;
    let req = pb::GrantLeaseRequest { request_id: super::request_id(r.request_id), ttl_ms: r.ttl_ms };
    let resp = a.ops.grant_lease(&who, req).await?;
    Ok(Json(LeaseJson { lease_id: Id(resp.lease_id), ttl_ms: resp.ttl_ms }))
}

pub(super) async fn keep_alive(
    State(a): State<Admin>,
    c: Caller,
    Path(id): Path<String>,
    body: Result<JsonBody<Request>, ApiError>,
) -> Result<Json<LeaseJson>, ApiError> {
    let who = c.api(&a)?;
    let (lease, JsonBody(r)) = (lease_id(&id)?, body?);
    let req = pb::KeepAliveRequest { request_id: super::request_id(r.request_id), lease_id: lease };
    let resp = a.ops.keep_alive(&who, req).await?;
    Ok(Json(LeaseJson { lease_id: Id(resp.lease_id), ttl_ms: resp.ttl_ms }))
}

pub(super) async fn revoke(
    State(a): State<Admin>,
    c: Caller,
    Path(id): Path<String>,
) -> Result<Json<Revoked>, ApiError> {
    let who = c.api(&a)?;
    let lease = lease_id(&id)?;
    let req = pb::RevokeLeaseRequest { request_id: super::request_id(None), lease_id: lease };
    a.ops.revoke_lease(&who, req).await?;
    Ok(Json(Revoked { revoked: true }))
}

pub(super) async fn describe(
    State(a): State<Admin>,
    c: Caller,
    Path(id): Path<String>,
) -> Result<Json<LeaseInfoJson>, ApiError> {
    let who = c.api(&a)?;
    let lease = lease_id(&id)?;
    let Some(info) = a.ops.describe_lease(&who, lease).await? else {
        let message = format!("lease {lease} not found (never granted, revoked, or expired)");
        return Err(ApiError::new(ErrorCode::LeaseNotFound, message));
    };
    let locks = info.locks.into_iter().map(|g| HeldJson { lock: g.lock.to_string(), token: Id(g.token.0) }).collect();
    Ok(Json(LeaseInfoJson {
        lease_id: Id(info.lease.0),
        owner: info.owner,
        ttl_ms: info.ttl_ms,
        ttl_left_ms: info.ttl_left_ms,
        locks,
    }))
}

/// The `{id}` of a lease's path.
fn lease_id(s: &str) -> Result<u64, ApiError> {
    match s.parse::<u64>() {
        Ok(id) if id > 0 => Ok(id),
        _ => Err(ApiError::field("lease_id", format!("lease id {s:?} is not a positive decimal number"))),
    }
}
