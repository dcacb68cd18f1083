//! `fencelock-core` is the pure lock engine of fencelock.
//!
//! It decides who holds what: leases, exclusive locks bound to leases, FIFO wait
//! queues, fencing tokens, lock-delay and request de-duplication. It does no IO and
//! never reads a clock: every [`Input`] carries `now`, a monotonic instant in
//! milliseconds on the clock of the node that leads the group. The server feeds it
//! inputs from its replicated log, so every replica reaches the same state; the
//! lease deadlines that it keeps are meaningful only on the leader's clock, and
//! [`Input::LeaderStart`] re-bases them when leadership moves (or the single node
//! restarts).
//!
//! Where it sits: `fencelock-server` owns one [`Engine`] inside its Raft state
//! machine; nothing else mutates it. See `docs/design.md` for the model and the
//! numbered invariants (INV-n) that the tests cite.

pub mod b64;
mod engine;
mod error;
#[cfg(feature = "mutants")]
pub mod mutants;
mod name;
pub mod policy;
mod types;
mod validate;

pub use engine::Engine;
pub use error::EngineError;
pub use name::{LockName, NameError, MAX_LOCK_NAME_BYTES};
pub use policy::{Policy, PolicyChange, Quota};
pub use types::*;
pub use validate::{check_identity, check_value};
