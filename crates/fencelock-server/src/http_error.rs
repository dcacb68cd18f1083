//! The one error shape of the HTTP port: `{"error": {"code", "message", …}}`
//! with a code from [`ErrorCode`] and the HTTP status that code has, plus
//! what the case adds (`field` for a bad request, `leader` for a node that
//! does not lead, `holder` for a busy lock).
//!
//! Where it sits: every handler of the HTTP port ([`crate::admin`], the
//! watch's server-sent events in [`crate::watching::sse`]) answers its
//! refusals as an [`ApiError`]; the authentication refusals
//! ([`crate::access::auth::Refusal`]) convert here, the operations' gRPC
//! statuses in `admin::errors`, so the HTTP and gRPC ports refuse the same
//! cases the same way.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use fencelock_core::ErrorCode;
use serde_json::{Map, Value};

use crate::access::auth::Refusal;

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

    /// The body is `{"error": {"code", "message", …}}`, extras beside them;
    /// the status is the code's.
    #[test]
    fn the_body_has_code_message_and_extras() {
        let e = ApiError::field("ttl_ms", "ttl_ms must be a number");
        assert_eq!(
            e.body(),
            serde_json::json!({"error": {"code": "invalid_argument", "message": "ttl_ms must be a number", "field": "ttl_ms"}})
        );
        let resp = ApiError::new(ErrorCode::LimitReached, "leases quota").into_response();
        assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
        let resp = ApiError::new(ErrorCode::Unauthenticated, "who?").into_response();
        assert_eq!(resp.headers()[header::WWW_AUTHENTICATE], "Bearer");
    }
}
