//! The stable, machine-readable codes of what an API call can answer other
//! than a success: the one list the HTTP API's error bodies, its OpenAPI file
//! and the clients that read them share.
//!
//! Where it sits: the server's HTTP API (`fencelock-server`'s `admin::errors`)
//! names each refusal with one of these and answers its HTTP status; the
//! OpenAPI file (`crates/fencelock-server/openapi.json`) lists them, and a
//! test checks that the two agree. Contention (busy, timed out, not the
//! holder, slot done) is an outcome in the Rust client, and a code here only
//! because an HTTP answer that is not a grant must say which it is.

/// One kind of answer that is not a success. Its wire form is
/// [`ErrorCode::as_str`] (`snake_case`), never renamed once released.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// The lock is held and the request did not wait (its holder is named).
    Busy,
    /// The request waited in the queue for its whole `wait` without a grant.
    TimedOut,
    /// The lease and token given are not a current grant of the lock (it was
    /// released, expired, or never this lease's).
    NotHolder,
    /// The lease does not exist (never granted, revoked or expired), or ended
    /// while the request waited.
    LeaseNotFound,
    /// The once-per slot was completed already (by its holder, named).
    SlotDone,
    /// The request is malformed or out of the limits (the message names the
    /// field).
    InvalidArgument,
    /// No such route, or no such object to describe.
    NotFound,
    /// The path does not take this method.
    MethodNotAllowed,
    /// The request body is larger than the server reads.
    PayloadTooLarge,
    /// A watch asked to resume from a revision the node no longer holds (the
    /// answer names the oldest it holds).
    Compacted,
    /// No credentials, or credentials the server does not know.
    Unauthenticated,
    /// The caller may not do this to this object (or the lease is another
    /// identity's).
    PermissionDenied,
    /// A quota or rate limit of the caller (or of the node) is reached.
    LimitReached,
    /// This node does not lead the group; the answer names the leader if it
    /// knows it.
    NotLeader,
    /// The node cannot serve now (no leader, shutting down, storage failed).
    Unavailable,
    /// A fault of the server (a bug): the message says what.
    Internal,
}

impl ErrorCode {
    /// Every code, in the order of the docs.
    pub const ALL: [ErrorCode; 16] = [
        ErrorCode::Busy,
        ErrorCode::TimedOut,
        ErrorCode::NotHolder,
        ErrorCode::LeaseNotFound,
        ErrorCode::SlotDone,
        ErrorCode::InvalidArgument,
        ErrorCode::NotFound,
        ErrorCode::MethodNotAllowed,
        ErrorCode::PayloadTooLarge,
        ErrorCode::Compacted,
        ErrorCode::Unauthenticated,
        ErrorCode::PermissionDenied,
        ErrorCode::LimitReached,
        ErrorCode::NotLeader,
        ErrorCode::Unavailable,
        ErrorCode::Internal,
    ];

    /// The wire form, as in `{"error": {"code": "busy", …}}`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::Busy => "busy",
            ErrorCode::TimedOut => "timed_out",
            ErrorCode::NotHolder => "not_holder",
            ErrorCode::LeaseNotFound => "lease_not_found",
            ErrorCode::SlotDone => "slot_done",
            ErrorCode::InvalidArgument => "invalid_argument",
            ErrorCode::NotFound => "not_found",
            ErrorCode::MethodNotAllowed => "method_not_allowed",
            ErrorCode::PayloadTooLarge => "payload_too_large",
            ErrorCode::Compacted => "compacted",
            ErrorCode::Unauthenticated => "unauthenticated",
            ErrorCode::PermissionDenied => "permission_denied",
            ErrorCode::LimitReached => "limit_reached",
            ErrorCode::NotLeader => "not_leader",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::Internal => "internal",
        }
    }

    /// The code whose wire form is `s`.
    pub fn parse(s: &str) -> Option<ErrorCode> {
        Self::ALL.into_iter().find(|c| c.as_str() == s)
    }

    /// The HTTP status it is answered with. The four outcomes of contention
    /// are 409 (the request was fine; the lock's state refused it), so that
    /// `curl --fail` fails on them and no client retries them as it may a 408.
    pub fn http_status(self) -> u16 {
        match self {
            ErrorCode::Busy | ErrorCode::TimedOut | ErrorCode::NotHolder | ErrorCode::SlotDone => 409,
            ErrorCode::InvalidArgument => 400,
            ErrorCode::Unauthenticated => 401,
            ErrorCode::PermissionDenied => 403,
            ErrorCode::LeaseNotFound | ErrorCode::NotFound => 404,
            ErrorCode::MethodNotAllowed => 405,
            ErrorCode::Compacted => 410,
            ErrorCode::PayloadTooLarge => 413,
            ErrorCode::LimitReached => 429,
            ErrorCode::Internal => 500,
            ErrorCode::NotLeader | ErrorCode::Unavailable => 503,
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::ErrorCode;

    /// Each code has its own wire form, and parses back to itself.
    #[test]
    fn wire_forms_are_distinct_and_parse_back() {
        let mut seen = std::collections::HashSet::new();
        for code in ErrorCode::ALL {
            assert!(seen.insert(code.as_str()), "{code:?} repeats a wire form");
            assert_eq!(ErrorCode::parse(code.as_str()), Some(code));
        }
        assert_eq!(ErrorCode::parse("Busy"), None, "wire forms are snake_case, exactly");
    }

    /// Contention answers 409; refusals of the caller 401/403; limits 429;
    /// a node that cannot serve 503.
    #[test]
    fn statuses_group_the_codes() {
        assert_eq!(ErrorCode::Busy.http_status(), 409);
        assert_eq!(ErrorCode::TimedOut.http_status(), 409);
        assert_eq!(ErrorCode::Unauthenticated.http_status(), 401);
        assert_eq!(ErrorCode::PermissionDenied.http_status(), 403);
        assert_eq!(ErrorCode::LimitReached.http_status(), 429);
        assert_eq!(ErrorCode::NotLeader.http_status(), 503);
        assert!(ErrorCode::ALL.iter().all(|c| (400..600).contains(&c.http_status())));
    }
}
