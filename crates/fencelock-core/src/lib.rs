//! `fencelock-core` is the pure lock engine of fencelock.
//!
//! It decides who holds what: leases, read-write locks and semaphores bound to
//! leases, FIFO wait queues, fencing tokens, lock-delay and request
//! de-duplication. It does no IO and
//! never reads a clock: every [`Input`] carries `now`, a monotonic instant in
//! milliseconds on the clock of the node that leads the group. The server feeds it
//! inputs from its replicated log, so every replica reaches the same state; the
//! lease deadlines that it keeps are meaningful only on the leader's clock, and
//! [`Input::LeaderStart`] re-bases them when leadership moves (or the single node
//! restarts).
//!
//! Where it sits: `fencelock-server` owns one [`Engine`] inside its Raft state
//! machine; nothing else mutates it. See `docs/design.md` for the model and the
//! numbered invariants (INV-n) that the tests cite. Those of shared locks and
//! semaphores:
//! - INV-15 the holders of a lock fit together: on a read-write lock any number
//!   of shared holders or one exclusive holder and nobody else; on a semaphore of
//!   N permits, holders whose weights add up to at most N ([`Acquire::mode`],
//!   [`Acquire::weight`], [`Acquire::permits`]).
//! - INV-16 FIFO across modes and weights: a request is granted only when it
//!   fits (INV-15) and no live request is queued before it, so a queued writer
//!   holds back later readers and a large semaphore request holds back later
//!   small ones; nobody barges.
//! - INV-17 hold-at-least: however a grant made with
//!   [`Acquire::hold_at_least_ms`] ends, its lock stays closed until that long
//!   after the grant, by the engine's clock; a new leader never shortens it.
//! - INV-18 never a partial multi-lock: an acquire that names several
//!   read-write locks ([`Acquire::also`]) gets all of them in one step, one
//!   token each (consecutive, in the order asked, [`Reply::AcquiredAll`]), or
//!   none. Waiting, it is queued on every one of its locks in the same step,
//!   and granted when it heads every one of those queues and fits in each;
//!   since each queue is in arrival order, multi-acquires never deadlock one
//!   another. A blocked multi-acquire at the head of a queue holds back the
//!   requests behind it (INV-16), which is what keeps it from starving. Once
//!   granted, its grants are independent (released, expiring, downgraded one
//!   by one); a `CancelWait` of its request releases all that are still held.
//!
//! Every grant, shared or not, gets its own token from the one counter (INV-2),
//! so a writer's token is above that of every reader granted before it. A
//! [`Command::Downgrade`] keeps the token. The mode of a semaphore's acquire is
//! ignored: its holders are counted by weight only (and shown as exclusive).

pub mod b64;
mod engine;
mod error;
mod error_code;
mod ids;
#[cfg(feature = "mutants")]
pub mod mutants;
mod name;
pub mod policy;
mod types;
mod validate;

pub use engine::{Engine, LongHold};
pub use error::EngineError;
pub use error_code::ErrorCode;
pub use ids::{LeaseId, RequestId, Token};
pub use name::{LockName, NameError, MAX_LOCK_NAME_BYTES};
pub use policy::{Policy, PolicyChange, Quota, MAX_CALLER_NAME};
pub use types::*;
pub use validate::{check_identity, check_multi_count, check_slot, check_value};
