//! Watch: the ordered stream of lock events (granted, released, expired,
//! revoked, queued, dequeued) that the `Watch` RPC and the admin port's
//! `GET /v1/watch` serve.
//!
//! Where it sits: the Raft state machine ([`crate::raft::state_machine`])
//! turns each applied entry's engine output into [`Event`]s ([`events`]) and
//! publishes them to this node's [`Hub`] ([`hub`]), on every node, leader and
//! followers alike, in log order. [`serve`] turns a hub subscription into a
//! caller's stream: filtered by prefix and by the caller's read permission.
//!
//! An event's [`Rev`] is (log index, position among the entry's events): the
//! same on every node, and totally ordered. Lease expiry and revocation reach
//! the engine only through log entries (a driver tick is a `Batch` whose `now`
//! expires what is due; a revoke is a command), so every node produces the
//! same events at the same revisions.

pub mod events;
pub mod hub;
pub mod serve;
pub mod sse;

pub use events::{Event, Kind, PendingWaits, Rev};
pub use hub::{Compacted, Hub, Subscription, WatchError};
