//! The HTTP API's leader election: an election is a lock, its leader the
//! lock's holder, the term the holder's token (the same rule as the Rust
//! client's `Election` on this server, so both kinds of candidates take part
//! in one election).
//!
//! - `POST /v1/elections/{name}/campaign` (`campaign`): `{"lease_id"|"ttl_ms",
//!   "wait_ms", "identity", "value"|"value_base64"}` → `{"name","term",
//!   "lease_id","lease_created","ttl_ms"?}` once elected (a long-poll, as an
//!   acquire); 409 `timed_out` or `busy` (`wait_ms` 0).
//! - `POST /v1/elections/{name}/proclaim` (`proclaim`): `{"lease_id","term",
//!   "value"|"value_base64"}` → `{"proclaimed": true}`; 409 `not_holder`
//!   once the term is over.
//! - `POST /v1/elections/{name}/resign` (`resign`): `{"lease_id","term"}` →
//!   `{"resigned": true}`; 409 `not_holder`.
//! - `GET /v1/elections/{name}/leader` (`leader`): `{"name","leader": {"term",
//!   "lease_id","identity","value_base64"} | null}`.
//!
//! Where it sits: handlers of the admin router ([`super`]), over
//! [`super::locks::acquire_on`] and [`crate::api::Ops`].

use axum::extract::{Path, State};
use axum::Json;
use fencelock_proto::v1 as pb;
use serde::{Deserialize, Serialize};

use super::body::{value_bytes, Id, JsonBody};
use super::errors::ApiError;
use super::locks::{acquire_on, done, lock_name, release_grant, set_value_of, LeaseArg, Named};
use super::{Admin, Caller};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CampaignBody {
    #[serde(default)]
    lease_id: Option<Id>,
    #[serde(default)]
    ttl_ms: Option<u64>,
    #[serde(default)]
    wait_ms: u64,
    #[serde(default)]
    identity: String,
    #[serde(default)]
    value: Option<String>,
    #[serde(default)]
    value_base64: Option<String>,
    #[serde(default)]
    request_id: Option<Id>,
}

#[derive(Serialize)]
pub(super) struct ElectedJson {
    name: String,
    term: Id,
    lease_id: Id,
    lease_created: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    ttl_ms: Option<u64>,
}

pub(super) async fn campaign(
    State(a): State<Admin>,
    c: Caller,
    Path(name): Path<String>,
    body: Result<JsonBody<CampaignBody>, ApiError>,
) -> Result<Json<ElectedJson>, ApiError> {
    let who = c.api(&a)?;
    let JsonBody(r) = body?;
    let lease = LeaseArg::of(r.lease_id, r.ttl_ms)?;
    let req = pb::AcquireRequest {
        request_id: super::request_id(r.request_id),
        lock: name,
        wait_ms: r.wait_ms,
        identity: r.identity,
        value: value_bytes(r.value, r.value_base64)?,
        mode: pb::LockMode::Exclusive as i32,
        ..Default::default()
    };
    let g = acquire_on(&a, &who, lease, req).await?;
    Ok(Json(ElectedJson {
        name: g.lock,
        term: g.token,
        lease_id: g.lease_id,
        lease_created: g.lease_created,
        ttl_ms: g.ttl_ms,
    }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ProclaimBody {
    lease_id: Id,
    term: Id,
    #[serde(default)]
    value: Option<String>,
    #[serde(default)]
    value_base64: Option<String>,
    #[serde(default)]
    request_id: Option<Id>,
}

pub(super) async fn proclaim(
    State(a): State<Admin>,
    c: Caller,
    Path(name): Path<String>,
    body: Result<JsonBody<ProclaimBody>, ApiError>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let who = c.api(&a)?;
    let JsonBody(r) = body?;
    let value = value_bytes(r.value, r.value_base64)?;
    let term = Named { lock: name, lease: r.lease_id, token: r.term, request_id: r.request_id };
    done("proclaimed", set_value_of(&a, &who, term, value).await?, TERM_OVER)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ResignBody {
    lease_id: Id,
    term: Id,
    #[serde(default)]
    request_id: Option<Id>,
}

pub(super) async fn resign(
    State(a): State<Admin>,
    c: Caller,
    Path(name): Path<String>,
    body: Result<JsonBody<ResignBody>, ApiError>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let who = c.api(&a)?;
    let JsonBody(r) = body?;
    let term = Named { lock: name, lease: r.lease_id, token: r.term, request_id: r.request_id };
    done("resigned", release_grant(&a, &who, term).await?, TERM_OVER)
}

pub(super) async fn leader(
    State(a): State<Admin>,
    c: Caller,
    Path(name): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let who = c.api(&a)?;
    let name = lock_name(name)?;
    let r = a.ops.describe_lock(&who, pb::DescribeLockRequest { lock: name.to_string() }).await?;
    let leader = r.lock.and_then(|l| l.holder).map(|h| {
        serde_json::json!({
            "term": h.token.to_string(),
            "lease_id": h.lease_id.to_string(),
            "identity": h.identity,
            "value_base64": fencelock_core::b64::encode(&h.value),
        })
    });
    Ok(Json(serde_json::json!({ "name": name.as_str(), "leader": leader })))
}

/// Why a proclaim or resign of a term that is over is refused.
const TERM_OVER: &str =
    "this lease and term do not lead the election (the term is over: resigned, expired, or never won)";
