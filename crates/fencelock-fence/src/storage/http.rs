//! The HTTP surface of the storage server: routes, header parsing, and the
//! one critical section per fenced request.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde::Deserialize;
use serde_json::json;

use super::audit::{AuditLog, Durability, Outcome, Record};
use super::log_stream::log_body;
use super::objects::{invalid_object_key, ObjectStore};
use super::tokens::{TokenLimit, TokenRefused};
use crate::fence::{Access, Fence, FenceError, Fenced, Stale, MAX_TOKEN};
use crate::keylocks::KeyLocks;
use crate::FileFence;

/// Header naming the lock whose token a request carries.
pub const LOCK_HEADER: &str = "fencing-lock";
/// Header carrying the fencing token, in decimal.
pub const TOKEN_HEADER: &str = "fencing-token";

/// Everything a handler needs.
pub(crate) struct Store {
    pub fence: FileFence,
    pub objects: ObjectStore,
    pub audit: AuditLog,
    /// Refuses tokens that could not have been issued.
    pub tokens: TokenLimit,
    /// Makes "admit, act, log" one step per key: without it, holder 5's
    /// admitted but slow write could land after holder 6's.
    pub locks: KeyLocks,
    pub max_body: usize,
    /// Set when the audit log could not be written: refuse fenced requests
    /// (fail closed) until restarted.
    pub failed: AtomicBool,
    /// Reject stale tokens (always, except in the `--unfenced` demonstration).
    pub enforce: bool,
    /// Where refused stale writes are reported, if anywhere.
    pub reporter: Option<crate::report::Reporter>,
}

pub(crate) fn router(store: Arc<Store>) -> Router {
    Router::new()
        .route("/objects/{key}", get(get_object).put(put_object).delete(delete_object))
        .route("/fence/{key}", get(get_fence))
        .route("/log", get(get_log))
        .route("/healthz", get(healthz))
        .with_state(store)
}

/// A request's answer when it is not a success.
#[derive(Debug)]
pub(crate) enum ApiError {
    BadRequest(String),
    TooLarge(usize),
    Stale(Stale),
    Token(TokenRefused),
    /// `If-None-Match: *` and the object exists.
    Exists(String),
    NotFound(String),
    Internal(String),
    Unavailable(String),
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, body) = match self {
            ApiError::BadRequest(msg) => (StatusCode::BAD_REQUEST, json!({ "error": msg })),
            ApiError::TooLarge(limit) => {
                (StatusCode::PAYLOAD_TOO_LARGE, json!({ "error": "body too large", "limit": limit }))
            }
            ApiError::Stale(stale) => (
                StatusCode::CONFLICT,
                json!({ "error": "stale token", "rule": stale.to_string(), "highest": stale.highest, "got": stale.got }),
            ),
            ApiError::Token(refused) => match refused.limit() {
                Some(limit) => (StatusCode::BAD_REQUEST, json!({ "error": refused.to_string(), "limit": limit })),
                None => (StatusCode::SERVICE_UNAVAILABLE, json!({ "error": refused.to_string() })),
            },
            ApiError::Exists(key) => {
                (StatusCode::PRECONDITION_FAILED, json!({ "error": "object exists (If-None-Match: *)", "key": key }))
            }
            ApiError::NotFound(key) => (StatusCode::NOT_FOUND, json!({ "error": "not found", "key": key })),
            ApiError::Internal(msg) => (StatusCode::INTERNAL_SERVER_ERROR, json!({ "error": msg })),
            ApiError::Unavailable(msg) => (StatusCode::SERVICE_UNAVAILABLE, json!({ "error": msg })),
        };
        (status, Json(body)).into_response()
    }
}

impl From<FenceError> for ApiError {
    fn from(err: FenceError) -> Self {
        match err {
            FenceError::Poisoned => ApiError::Unavailable(err.to_string()),
            other => ApiError::Internal(other.to_string()),
        }
    }
}

/// The fencing headers of a request.
#[derive(Debug, Clone)]
pub(crate) struct Fencing {
    lock: String,
    token: u64,
}

/// Both headers, one, or neither: `Ok(None)` for neither.
fn fencing(headers: &HeaderMap) -> Result<Option<Fencing>, ApiError> {
    let lock = header_str(headers, LOCK_HEADER)?;
    let token = header_str(headers, TOKEN_HEADER)?;
    match (lock, token) {
        (None, None) => Ok(None),
        (None, Some(_)) => Err(ApiError::BadRequest("missing Fencing-Lock header".into())),
        (Some(_), None) => Err(ApiError::BadRequest("missing Fencing-Token header".into())),
        (Some(lock), Some(token)) => Ok(Some(Fencing { lock: parse_lock(lock)?, token: parse_token(token)? })),
    }
}

/// Both headers, required (writes).
fn required_fencing(headers: &HeaderMap) -> Result<Fencing, ApiError> {
    fencing(headers)?.ok_or_else(|| ApiError::BadRequest("writes need Fencing-Lock and Fencing-Token headers".into()))
}

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Result<Option<&'a str>, ApiError> {
    let mut values = headers.get_all(name).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(ApiError::BadRequest(format!("more than one {name} header")));
    }
    value.to_str().map(|s| Some(s.trim())).map_err(|_| ApiError::BadRequest(format!("{name} is not ASCII")))
}

fn parse_token(raw: &str) -> Result<u64, ApiError> {
    let bad =
        || ApiError::BadRequest(format!("malformed Fencing-Token {raw:?}: expected a decimal in 1..={MAX_TOKEN}"));
    if raw.is_empty() || !raw.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    match raw.parse::<u64>() {
        Ok(0) => Err(ApiError::BadRequest("Fencing-Token 0 is not a token (tokens start at 1)".into())),
        Ok(token) if token <= MAX_TOKEN => Ok(token),
        _ => Err(bad()),
    }
}

/// `If-None-Match: *` (create only): `true`; absent: `false`.
fn if_none_match(headers: &HeaderMap) -> Result<bool, ApiError> {
    match header_str(headers, header::IF_NONE_MATCH.as_str())? {
        None => Ok(false),
        Some("*") => Ok(true),
        Some(_) => Err(ApiError::BadRequest("only If-None-Match: * (create only) is supported".into())),
    }
}

fn parse_lock(raw: &str) -> Result<String, ApiError> {
    if raw.is_empty() || raw.len() > 256 {
        return Err(ApiError::BadRequest("Fencing-Lock must be 1 to 256 characters".into()));
    }
    Ok(raw.to_owned())
}

fn object_key(path: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    let Path(key) = path.map_err(|e| ApiError::BadRequest(format!("invalid object key: {e}")))?;
    match invalid_object_key(&key) {
        Some(reason) => Err(ApiError::BadRequest(format!("invalid object key: {reason}"))),
        None => Ok(key),
    }
}

/// Read the body, refusing more than `limit` bytes with 413.
async fn read_body(headers: &HeaderMap, body: Body, limit: usize) -> Result<Vec<u8>, ApiError> {
    let declared = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(ApiError::TooLarge(limit));
    }
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes().to_vec()),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => Err(ApiError::TooLarge(limit)),
        Err(e) => Err(ApiError::BadRequest(format!("could not read body: {e}"))),
    }
}

/// What a fenced request does once admitted.
enum Act {
    /// The bytes, and whether only to create (`If-None-Match: *`).
    Put(Vec<u8>, bool),
    Delete,
    Read,
}

impl Act {
    fn op(&self) -> &'static str {
        match self {
            Act::Put(..) => "PUT",
            Act::Delete => "DELETE",
            Act::Read => "GET",
        }
    }

    /// Which fence rule judges it.
    fn access(&self) -> Access {
        match self {
            Act::Read => Access::Read,
            Act::Put(..) | Act::Delete => Access::Write,
        }
    }
}

/// What an admitted act produced.
enum Done {
    Put { created: bool, size: usize },
    Deleted(bool),
    Read(Option<Vec<u8>>),
}

/// The critical section, in its own task so that a client hanging up cannot
/// cut it short: lock the key, admit durably, act durably, log durably.
/// A token that could not have been issued is refused first.
async fn fenced(store: Arc<Store>, key: String, fencing: Fencing, act: Act) -> Result<Done, ApiError> {
    store.tokens.check(fencing.token).await.map_err(ApiError::Token)?;
    tokio::spawn(async move { fenced_locked(&store, &key, &fencing, act).await })
        .await
        .map_err(|e| ApiError::Internal(format!("request task failed: {e}")))?
}

async fn fenced_locked(store: &Arc<Store>, key: &str, fencing: &Fencing, act: Act) -> Result<Done, ApiError> {
    if store.failed.load(Ordering::SeqCst) {
        return Err(ApiError::Unavailable("audit log failed earlier; restart the storage server".into()));
    }
    let _guard = store.locks.lock(key).await;
    let op = act.op();
    match act {
        Act::Put(_, true) if exists(store, key).await? => return Err(ApiError::Exists(key.to_owned())),
        // Nothing to read and no mark to raise: no mark is created (see
        // "Reads of missing objects" in the module docs).
        Act::Read if store.fence.highest(key).await?.is_none() && !exists(store, key).await? => {
            return Ok(Done::Read(None))
        }
        _ => {}
    }
    // 1. check and raise the fence, durably.
    let mut outcome = (Outcome::Accepted, fencing.token);
    if let Fenced::Stale(stale) = store.fence.admit_as(key, fencing.token, act.access()).await? {
        if store.enforce {
            let (outcome, highest) = (Outcome::Stale, stale.highest);
            log(store, op, key, fencing, outcome, highest, Durability::Buffered).await?;
            if let (Some(reporter), Access::Write) = (&store.reporter, stale.access) {
                reporter.report(&fencing.lock, &stale, key);
            }
            return Err(ApiError::Stale(stale));
        }
        outcome = (Outcome::Unfenced, stale.highest);
    }
    // 2. act on the object, durably.
    let done = act_on(store, key, act).await?;
    // 3. log, durably; 4. the caller answers 2xx.
    log(store, op, key, fencing, outcome.0, outcome.1, Durability::Sync).await?;
    Ok(done)
}

async fn exists(store: &Arc<Store>, key: &str) -> Result<bool, ApiError> {
    let (store, key) = (store.clone(), key.to_owned());
    tokio::task::spawn_blocking(move || store.objects.exists(&key))
        .await
        .map_err(|e| ApiError::Internal(format!("object task failed: {e}")))
}

async fn act_on(store: &Arc<Store>, key: &str, act: Act) -> Result<Done, ApiError> {
    let (store, key) = (store.clone(), key.to_owned());
    tokio::task::spawn_blocking(move || match act {
        Act::Put(bytes, _) => store.objects.put(&key, &bytes).map(|created| Done::Put { created, size: bytes.len() }),
        Act::Delete => store.objects.delete(&key).map(Done::Deleted),
        Act::Read => store.objects.get(&key).map(Done::Read),
    })
    .await
    .map_err(|e| ApiError::Internal(format!("object task failed: {e}")))?
    .map_err(|e| ApiError::Internal(format!("object storage failed: {e}")))
}

async fn log(
    store: &Arc<Store>,
    op: &'static str,
    key: &str,
    fencing: &Fencing,
    outcome: Outcome,
    highest: u64,
    durability: Durability,
) -> Result<(), ApiError> {
    let record = Record { op, key: key.to_owned(), lock: fencing.lock.clone(), token: fencing.token, outcome, highest };
    let audit_store = store.clone();
    match tokio::task::spawn_blocking(move || audit_store.audit.append(record, durability)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => {
            audit_failed(store, &e);
            Err(ApiError::Internal(format!("audit log failed: {e}")))
        }
        Err(e) => Err(ApiError::Internal(format!("audit task failed: {e}"))),
    }
}

/// The audit log could not be written: fail closed until restarted.
pub(crate) fn audit_failed(store: &Store, err: &std::io::Error) {
    store.failed.store(true, Ordering::SeqCst);
    tracing::error!(error = %err, "audit log write failed; refusing fenced requests");
}

async fn put_object(
    State(store): State<Arc<Store>>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let key = object_key(path)?;
    let fencing = required_fencing(&headers)?;
    let create_only = if_none_match(&headers)?;
    let bytes = read_body(&headers, body, store.max_body).await?;
    let token = fencing.token;
    match fenced(store, key.clone(), fencing, Act::Put(bytes, create_only)).await? {
        Done::Put { created, size } => {
            let status = if created { StatusCode::CREATED } else { StatusCode::OK };
            Ok((status, Json(json!({ "key": key, "token": token, "size": size }))).into_response())
        }
        _ => unreachable!("a put returns Done::Put"),
    }
}

async fn delete_object(
    State(store): State<Arc<Store>>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let key = object_key(path)?;
    let fencing = required_fencing(&headers)?;
    let token = fencing.token;
    match fenced(store, key.clone(), fencing, Act::Delete).await? {
        Done::Deleted(existed) => Ok(Json(json!({ "key": key, "token": token, "existed": existed })).into_response()),
        _ => unreachable!("a delete returns Done::Deleted"),
    }
}

async fn get_object(
    State(store): State<Arc<Store>>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let key = object_key(path)?;
    let bytes = match fencing(&headers)? {
        Some(fencing) => match fenced(store, key.clone(), fencing, Act::Read).await? {
            Done::Read(bytes) => bytes,
            _ => unreachable!("a read returns Done::Read"),
        },
        None => match act_on(&store, &key, Act::Read).await? {
            Done::Read(bytes) => bytes,
            _ => unreachable!("a read returns Done::Read"),
        },
    };
    let bytes = bytes.ok_or(ApiError::NotFound(key))?;
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response())
}

async fn get_fence(
    State(store): State<Arc<Store>>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let key = object_key(path)?;
    let marks = store.fence.marks(&key).await?;
    let last_write = marks.map(|m| m.write).filter(|&w| w > 0);
    Ok(Json(json!({ "key": key, "highest": marks.map(|m| m.seen), "last_write": last_write })).into_response())
}

/// `GET /log?from=&limit=`: entries with `seq >= from`, at most `limit`.
#[derive(Deserialize)]
struct LogQuery {
    from: Option<u64>,
    limit: Option<u64>,
}

async fn get_log(
    State(store): State<Arc<Store>>,
    query: Result<Query<LogQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = query.map_err(|e| ApiError::BadRequest(format!("invalid query: {}", e.body_text())))?;
    let files = tokio::task::spawn_blocking(move || store.audit.snapshot())
        .await
        .map_err(|e| ApiError::Internal(format!("log task failed: {e}")))?
        .map_err(|e| ApiError::Internal(format!("reading the audit log failed: {e}")))?;
    // The whole log's length is known from the snapshot: say it, so that
    // clients that do not read chunked answers get the whole log as before.
    let whole = (q.from.is_none() && q.limit.is_none()).then(|| files.iter().map(|f| f.len).sum::<u64>());
    let body = log_body(files, q.from.unwrap_or(0), q.limit.unwrap_or(u64::MAX));
    let mut response = ([(header::CONTENT_TYPE, "application/x-ndjson")], body).into_response();
    if let Some(len) = whole {
        response.headers_mut().insert(header::CONTENT_LENGTH, len.into());
    }
    Ok(response)
}

async fn healthz(State(store): State<Arc<Store>>) -> Response {
    if store.failed.load(Ordering::SeqCst) {
        return ApiError::Unavailable("audit log failed".into()).into_response();
    }
    Json(json!({ "status": "ok" })).into_response()
}
