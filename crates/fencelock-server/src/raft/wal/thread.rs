//! The log's writer and its thread: the segment files are written only by
//! whoever holds the [`Writer`]'s lock.
//!
//! Where it sits: [`super::Wal`] hands it appends, truncations and purges in
//! the order openraft issued them. An append that finds nothing queued or
//! being written is written and synced at once, on the caller's thread
//! ([`Writer::append_now`]): a lone write then wakes no other thread on its
//! way to the disk and back (issue 38 §1; see `docs/design.md`, "Where a
//! request's time goes"). Everything else goes over a channel to the log
//! thread, which takes everything queued, writes the appends together (one
//! `write` per segment touched), syncs once (one `fdatasync` for the whole
//! batch: group commit), then tells each append's callback, in order; so
//! appends made while a sync is under way share the next one. Truncations,
//! purges and reads of older entries are done in their turn between batches
//! (so a read sees every append queued before it). After an IO error the
//! writer fails every later request with that error: the node stops (fails
//! closed) rather than go on from a log whose state on disk is unknown.

use std::io;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::oneshot;

use super::segments::{IoCounts, Rec, Segments, Stored};
use super::WalError;
use crate::seams::{CrashPoint, Seams};

/// Called once an append is durable (`Ok`) or failed.
pub type Done = Box<dyn FnOnce(io::Result<()>) + Send>;

/// A request to the log thread.
pub enum Op {
    Append {
        recs: Vec<Rec>,
        done: Done,
    },
    Truncate {
        since: u64,
        reply: oneshot::Sender<Result<(), WalError>>,
    },
    Purge {
        upto: u64,
        reply: oneshot::Sender<Result<(), WalError>>,
    },
    /// The records of entries `lo..hi`, read back from the segments.
    Read {
        lo: u64,
        hi: u64,
        reply: oneshot::Sender<Result<Vec<Stored>, WalError>>,
    },
    Counts {
        reply: oneshot::Sender<IoCounts>,
    },
}

impl std::fmt::Debug for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Op::Append { recs, .. } => write!(f, "Append({} entries)", recs.len()),
            Op::Truncate { since, .. } => write!(f, "Truncate({since})"),
            Op::Purge { upto, .. } => write!(f, "Purge({upto})"),
            Op::Read { lo, hi, .. } => write!(f, "Read({lo}..{hi})"),
            Op::Counts { .. } => f.write_str("Counts"),
        }
    }
}

/// The appends taken but not yet written.
#[derive(Default)]
struct Batch {
    recs: Vec<Rec>,
    done: Vec<Done>,
}

/// The segment files and what was made durable: whoever holds it writes.
pub struct Writer {
    segs: Segments,
    seams: Seams,
    /// One past the last durable entry (see [`super::Wal::is_durable`]).
    durable_end: Arc<AtomicU64>,
    /// Why the log stopped, after an IO error.
    failed: Option<String>,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer").field("failed", &self.failed).finish_non_exhaustive()
    }
}

/// The [`Writer`] behind its lock, shared by the log and its thread.
pub type Shared = Arc<Mutex<Writer>>;

/// Takes the writer's lock, poisoned or not. A panic while it was held ends
/// the node's writes anyway (it unwinds openraft's core, or ends the log
/// thread, whose channel then refuses every later request), and what it
/// left half-written was never acknowledged: a batch counts as durable only
/// once synced.
pub fn lock(writer: &Shared) -> MutexGuard<'_, Writer> {
    writer.lock().unwrap_or_else(PoisonError::into_inner)
}

/// How many requests were handed to the writer and are not done yet, queued
/// for its thread or being written on a caller's: an append is written at
/// once only when there are none, so that it never passes one.
#[derive(Debug, Default)]
pub struct Pending(AtomicUsize);

impl Pending {
    pub fn none(&self) -> bool {
        self.0.load(Ordering::SeqCst) == 0
    }

    pub fn add(&self, n: usize) {
        self.0.fetch_add(n, Ordering::SeqCst);
    }

    pub fn done(&self, n: usize) {
        self.0.fetch_sub(n, Ordering::SeqCst);
    }
}

/// Runs the log thread until every sender is gone: each time everything
/// queued, under the writer's lock.
pub fn run(writer: Shared, pending: Arc<Pending>, rx: Receiver<Op>) {
    while let Ok(first) = rx.recv() {
        // Everything queued by the time the writer is free: while a caller
        // writes at once, what queues behind it gathers into one batch.
        let mut t = lock(&writer);
        let ops: Vec<Op> = std::iter::once(first).chain(rx.try_iter()).collect();
        let taken = ops.len();
        let mut batch = Batch::default();
        for op in ops {
            match op {
                Op::Append { recs, done } => {
                    batch.recs.extend(recs);
                    batch.done.push(done);
                }
                other => {
                    t.commit(std::mem::take(&mut batch));
                    t.handle(other);
                }
            }
        }
        t.commit(batch);
        pending.done(taken);
    }
}

impl Writer {
    pub fn new(segs: Segments, seams: Seams, durable_end: Arc<AtomicU64>) -> Self {
        Writer { segs, seams, durable_end, failed: None }
    }

    /// Writes and syncs `recs` now, on the caller's thread, then calls `done`.
    pub fn append_now(&mut self, recs: Vec<Rec>, done: Done) {
        self.commit(Batch { recs, done: vec![done] });
    }

    /// Writes and syncs `batch`, then calls its callbacks in order.
    fn commit(&mut self, batch: Batch) {
        if batch.done.is_empty() {
            return;
        }
        let res = self.check().and_then(|()| self.write_and_sync(&batch.recs));
        match (&res, batch.recs.last()) {
            (Err(e), _) => self.fail(e),
            (Ok(()), Some(last)) => self.durable_end.store(last.index + 1, Ordering::SeqCst),
            (Ok(()), None) => {}
        }
        for done in batch.done {
            done(res.as_ref().map(|_| ()).map_err(|e| io::Error::other(e.to_string())));
        }
    }

    fn write_and_sync(&mut self, recs: &[Rec]) -> Result<(), WalError> {
        if self.segs.write(recs)? {
            self.seams.crash_point(CrashPoint::LogBeforeFsync);
            self.segs.sync()?;
            self.seams.crash_point(CrashPoint::LogAfterFsync);
        }
        Ok(())
    }

    /// Does `op` (an append alone: `run` batches them).
    fn handle(&mut self, op: Op) {
        match op {
            Op::Append { recs, done } => self.commit(Batch { recs, done: vec![done] }),
            Op::Truncate { since, reply } => {
                self.durable_end.fetch_min(since, Ordering::SeqCst);
                let res = self.check().and_then(|()| self.segs.truncate(since));
                self.reply(reply, res);
            }
            Op::Purge { upto, reply } => {
                self.durable_end.fetch_max(upto + 1, Ordering::SeqCst);
                let res = self.check().and_then(|()| self.segs.purge(upto));
                self.reply(reply, res);
            }
            // A read that fails (an IO error, bytes that no longer parse)
            // fails the reader, not the log's writes.
            Op::Read { lo, hi, reply } => {
                let _ = reply.send(self.check().and_then(|()| self.segs.read(lo, hi)));
            }
            Op::Counts { reply } => {
                let _ = reply.send(self.segs.counts);
            }
        }
    }

    fn reply(&mut self, reply: oneshot::Sender<Result<(), WalError>>, res: Result<(), WalError>) {
        if let Err(e) = &res {
            self.fail(e);
        }
        let _ = reply.send(res);
    }

    /// Fails if an earlier request failed.
    fn check(&self) -> Result<(), WalError> {
        match &self.failed {
            Some(why) => Err(WalError::Stopped(why.clone())),
            None => Ok(()),
        }
    }

    fn fail(&mut self, e: &WalError) {
        if self.failed.is_none() {
            tracing::error!(error = %e, "the Raft log failed; nothing more is written to it");
            self.failed = Some(e.to_string());
        }
    }
}
