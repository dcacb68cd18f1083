//! The engine's identifiers: a lease's id, a fencing token, a request's id.
//! Plain numbers with their rules.
//!
//! Where it sits: at the bottom of the crate, so that the engine's errors
//! ([`crate::EngineError`]) can name a lease while the vocabulary
//! (`types`) names the errors.

use serde::{Deserialize, Serialize};

/// Lease identifier: proposed at random by the leader (see
/// [`Command::GrantLease`](crate::Command::GrantLease)) or, when none is
/// proposed, assigned by the engine from a counter in replicated state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct LeaseId(pub u64);

/// Fencing token: strictly greater than every token issued before it, for any lock
/// (INV-2). Never 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Token(pub u64);

/// Client-chosen request id (non-zero). A retry of a request reuses its id and gets
/// the first outcome again (INV-6). Scoped to the lease for lease-bound requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RequestId(pub u64);

impl std::fmt::Display for LeaseId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl std::fmt::Display for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}
