//! The operations' gRPC statuses ([`crate::api`]) as the HTTP port's
//! [`ApiError`]s, by their codes.
//!
//! Where it sits: the handlers of [`super`] answer an operation's refusal
//! through this conversion; the error shape itself is [`crate::http_error`].

use fencelock_core::ErrorCode;

use crate::api::LEADER_METADATA;
pub(crate) use crate::http_error::ApiError;

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

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;
    use axum::response::IntoResponse;

    /// A follower's refusal carries the leader's address as `leader`, with
    /// the code `not_leader` and status 503; a quota is 429.
    #[test]
    fn a_status_naming_the_leader_is_not_leader() {
        let mut s = tonic::Status::unavailable("not the leader");
        s.metadata_mut().insert(LEADER_METADATA, "10.0.0.2:7070".parse().unwrap());
        let e = ApiError::from(s);
        assert_eq!(e.code, ErrorCode::NotLeader);
        assert_eq!(e.body()["error"]["leader"], "10.0.0.2:7070");
        assert_eq!(e.into_response().status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(ApiError::from(tonic::Status::unavailable("no leader")).code, ErrorCode::Unavailable);
        let quota = ApiError::from(tonic::Status::resource_exhausted("leases quota")).into_response();
        assert_eq!(quota.status(), StatusCode::TOO_MANY_REQUESTS);
    }
}
