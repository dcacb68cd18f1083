//! Resource-side fencing for fencelock: the resource refuses an operation
//! whose fencing token is lower than one it has already admitted.
//!
//! A lease alone cannot protect data. A holder paused past its lease (GC, a
//! VM stall, SIGSTOP, a slow network) wakes up believing it still holds the
//! lock; only the resource can stop its write, by remembering the highest
//! token it has admitted per key and refusing lower ones (Kleppmann, "How to
//! do distributed locking", 2016). This crate is that memory, for several
//! kinds of resource:
//!
//! | type | where the mark lives | act atomic with the check? |
//! |---|---|---|
//! | [`MemoryFence`] | process memory (lost on restart) | no: serialize admit+act per key yourself |
//! | [`FileFence`] | fsynced append-only log in a directory | no: serialize admit+act per key yourself |
//! | [`PgFence`] (feature `postgres`) | row of `fencelock_fence` | yes: [`PgFence::run`], one transaction |
//! | [`RedisFence`] (feature `redis`) | a Redis string | yes: [`RedisFence::write`], one Lua script |
//! | [`CheckValidator`] | nowhere: asks the lock server | no, and weaker: see [`check`] |
//! | [`storage`] | [`FileFence`] under an HTTP object store | yes: per-key lock across admit+write |
//!
//! The contract every fence keeps is written on [`Fence`], and the rule on
//! [`Marks::admit`]. In short, per key the fence keeps the token of the last
//! write and the highest token admitted: a read is admitted when its token is
//! at or above the last write's, a write when its token is at or above every
//! admitted one (equal too); otherwise the answer is [`Fenced::Stale`] and
//! nothing changes. So readers of a read-write lock, whose tokens arrive in
//! any order, are all admitted, while a reader or writer granted before a
//! newer writer (or, for a writer, a newer reader) acted is refused. Stale is
//! an outcome, not an error; [`FenceError`] is for invalid input and failed
//! storage. **Fence reads as well as writes**: see the holder-5/holder-6
//! example on [`Fence`].
//!
//! A fence that refuses a stale write can say so to the lock service with a
//! [`report::Reporter`] (never in the way of the write path): the group then
//! shows a `write_refused` event of the lock to every watcher, and counts and
//! audits it. The storage server does it with [`storage::Config::reporter`].
//!
//! The crate's README documents the PostgreSQL SQL and the Redis script for
//! services not written in Rust.

pub mod check;
mod fence;
mod file;
mod keylocks;
mod memory;
#[cfg(feature = "postgres")]
pub mod pg;
#[cfg(feature = "redis")]
pub mod redis;
pub mod report;
pub mod storage;

pub use check::{CheckValidator, Checked, TokenChecker};
pub use fence::{
    check_key, check_token, Access, BoxError, Fence, FenceError, Fenced, Marks, Stale, MAX_KEY_LEN, MAX_TOKEN,
};
pub use file::FileFence;
pub use memory::MemoryFence;
#[cfg(feature = "postgres")]
pub use pg::PgFence;
#[cfg(feature = "redis")]
pub use redis::{RedisFence, RedisWrite};
