//! The one error shape of the HTTP port: `{"error": {"code", "message", …}}`
//! with a code from [`ErrorCode`] and the HTTP status that code has, plus
//! what the case adds (`field` for a bad request, `leader` for a node that
//! does not lead, `holder` for a busy lock).
//!
//! Where it sits: every handler of [`super`] answers its refusals as an
//! [`ApiError`]; the operations' gRPC statuses ([`crate::api`]) and the
//! authentication refusals ([`crate::access::auth::Refusal`]) convert here,
//! so the HTTP and gRPC ports refuse the same cases the same way.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use fencelock_core::ErrorCode;
use serde_json::{Map, Value};

use crate::access::auth::Refusal;
use crate::api::LEADER_METADATA;

/// A refusal, as the HTTP port answers it.
#[derive(Debug)]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
    /// Fields beside `code` and `message`.
    extra: Map<String, Value>,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError { code, message: message.into(), extra: Map::new() }
    }

    /// A bad request that names the field at fault.
    pub fn field(field: &str, message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidArgument, message).with("field", field)
    }

    /// Adds `key: value` beside the code and message.
    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.extra.insert(key.to_string(), value.into());
        self
    }

    /// The JSON body.
    pub fn body(&self) -> Value {
        let mut error = Map::new();
        error.insert("code".into(), self.code.as_str().into());
        error.insert("message".into(), self.message.clone().into());
        error.extend(self.extra.clone());
        serde_json::json!({ "error": error })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut resp = (status, Json(self.body())).into_response();
        if self.code == ErrorCode::Unauthenticated {
            resp.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        resp
    }
}

/// An operation's gRPC status, by its code: the operations answer
/// `NotFound` only for a lease that does not exist or ended, and
/// `Unavailable` with the leader's address in [`LEADER_METADATA`] on a node
/// that does not lead.
impl From<tonic::Status> for ApiError {
    fn from(s: tonic::Status) -> Self {
        let message = s.message().to_string();
        let code = match s.code() {
            tonic::Code::InvalidArgument | tonic::Code::OutOfRange => ErrorCode::InvalidArgument,
            tonic::Code::NotFound => ErrorCode::LeaseNotFound,
            tonic::Code::PermissionDenied => ErrorCode::PermissionDenied,
            tonic::Code::Unauthenticated => ErrorCode::Unauthenticated,
            tonic::Code::ResourceExhausted => ErrorCode::LimitReached,
            tonic::Code::Unavailable => {
                let leader = s.metadata().get(LEADER_METADATA).and_then(|v| v.to_str().ok());
                if let Some(leader) = leader {
                    return ApiError::new(ErrorCode::NotLeader, message).with("leader", leader);
                }
                ErrorCode::Unavailable
            }
            _ => ErrorCode::Internal,
        };
        ApiError::new(code, message)
    }
}

impl From<Refusal> for ApiError {
    fn from(r: Refusal) -> Self {
        let code = match r {
            Refusal::Unauthenticated(_) => ErrorCode::Unauthenticated,
            Refusal::Denied { .. } => ErrorCode::PermissionDenied,
        };
        ApiError::new(code, r.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A follower's refusal carries the leader's address as `leader`, with
    /// the code `not_leader` and status 503.
    #[test]
    fn a_status_naming_the_leader_is_not_leader() {
        let mut s = tonic::Status::unavailable("not the leader");
        s.metadata_mut().insert(LEADER_METADATA, "10.0.0.2:7070".parse().unwrap());
        let e = ApiError::from(s);
        assert_eq!(e.code, ErrorCode::NotLeader);
        assert_eq!(e.body()["error"]["leader"], "10.0.0.2:7070");
        assert_eq!(e.into_response().status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(ApiError::from(tonic::Status::unavailable("no leader")).code, ErrorCode::Unavailable);
    }

    /// The body is `{"error": {"code", "message", …}}`, extras beside them.
    #[test]
    fn the_body_has_code_message_and_extras() {
        let e = ApiError::field("ttl_ms", "ttl_ms must be a number");
        assert_eq!(
            e.body(),
            serde_json::json!({"error": {"code": "invalid_argument", "message": "ttl_ms must be a number", "field": "ttl_ms"}})
        );
        let resp = ApiError::from(tonic::Status::resource_exhausted("leases quota")).into_response();
        assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    }
}
