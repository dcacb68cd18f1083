//! The Raft log as an append-only segment log with group commit (`log =
//! "segment"`, the default engine; see [`super::log_store::LogEngine`]).
//!
//! Where it sits: under [`super::log_store::LogStore`] (through its segment
//! engine), which keeps the vote, the committed and the last purged log ids,
//! the snapshot and the state machine in redb and, with this engine, the log
//! entries here, in `<data dir>/wal/`. With the redb engine (`"redb"`) this
//! module is unused. A data dir whose log is in redb moves it here, once, on
//! its first start with this engine ([`super::log_store::migrate`]); there is
//! no way back. Nothing here knows of redb.
//!
//! On disk: segment files `<index of their first record, 20 digits>.seg`,
//! each preallocated ([`Options::segment_bytes`]) and starting with a header
//! holding a format version; then checksummed records, one per entry (see
//! [`mod@format`] for the bytes). In memory: the log id of every entry not
//! purged and the newest entries decoded (`mem.rs`); a read of older ones (a
//! follower far behind, the log applied again after a start) is read back
//! from the segments by the log thread, in its turn.
//!
//! Writes: the files are written only under the writer's lock (`thread.rs`).
//! An append puts its entries in memory (readable at once, as openraft
//! expects) and, under the memory's lock (so a read that finds an entry no
//! longer decoded queues its read back after the append that wrote it),
//! either takes the writer and writes them at once, when nothing is queued or
//! being written, or queues them for the log thread. Written at once, the
//! append returns durable, its `LogFlushed` callback called: a lone write
//! wakes no thread on its way to the disk and back. The thread writes
//! everything queued with one `write`, makes it durable with one
//! `fdatasync`, then calls each append's callback in order: so appends made
//! while a sync is under way share the next one. Truncations, purges and
//! reads of older entries always go through the thread's queue, in order.
//!
//! Start-up ([`segments::Segments::open`]): the segments are scanned; the log
//! is the longest valid prefix. A record that does not read (short, zeroed,
//! bad checksum) at the end of the last segment with no valid record after it
//! is a torn write, never acknowledged (it was not synced): it is cut and a
//! line is logged. A power loss during a batch's `fdatasync` may also persist
//! any subset of that batch's pages: a hole followed only by valid records of
//! the batch the hole is in (each record names its batch) is a torn batch,
//! none of it acknowledged: the log is cut at the batch's first record and a
//! line says how many entries were dropped. Unless the cut would end the log
//! before the committed index ([`Options::committed`], from redb): only synced
//! entries get committed, so such a tail was acknowledged and is damaged, not
//! torn (a changed byte reads the same way); it is corruption, refused before
//! anything is cut. A bad record followed by a valid
//! one of another batch, a bad record in a segment that is not the last, a gap
//! in the indexes, an entry that does not decode or an unknown format version
//! is corruption: opening fails with an error naming the file and the offset,
//! and the node does not start (fails closed, as for a bad record in redb, see
//! `raft/record.rs`).
//!
//! Faults: the file IO goes through [`files::LogFiles`], which a harness can
//! replace ([`crate::seams::Seams::log_files`]); the crash points
//! [`crate::seams::CrashPoint::LogBeforeFsync`] and `LogAfterFsync` are around
//! each batch's `fdatasync`.
//!
//! Measured on the project's VM (2 cores shared with other builders, load
//! 3.6–7, ext4 on a virtual disk whose fdatasync took ~0.13 ms that day, a
//! debug build), 2,000 appends of one grant entry each, three runs:
//! `FENCELOCK_BENCH_DIR=/work/… cargo test -p fencelock-server --lib --
//! --ignored --nocapture bench_log_appends`
//!
//! | how | appends/s | fsyncs |
//! |---|---|---|
//! | redb `LogStore`, each append waited for | 3,600–4,400 | 2,000 commits |
//! | segment `LogStore`, each append waited for | 6,400–9,500 | 2,000 |
//! | segment log, 64 appends in flight | 98,000–124,000 | 65–71 |
//! | segment log, all 2,000 queued at once | 112,000–157,000 | 37–91 |
//!
//! One at a time, the segment log does about 1.7× redb's appends (one write
//! and one fdatasync instead of a B-tree commit); the gain that matters is the
//! batching: with appends in flight, one fsync covers ~30 of them. On a disk
//! whose flush costs milliseconds the ratio grows with the flush cost.
//!
//! Through a whole node it does not show yet: `cargo test -p fencelock-server
//! segment_log:: -- --ignored --nocapture` (32 clients × 100 grants, debug
//! build, same VM) gave 1,250–1,400 grants/s on either log, ~15 grants per
//! entry. The driver keeps one write in flight, so openraft hands the log one
//! entry at a time (~12 ms each, mostly CPU), and the log's share is ~0.2 ms:
//! the group commit pays once the driver pipelines its writes (issue 19 §3).

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::thread::JoinHandle;

use openraft::{Entry, LogId};
use tokio::sync::oneshot;

use super::{NodeId, TypeConfig};
use crate::seams::Seams;

pub mod files;
pub mod format;
mod mem;
pub mod segments;
mod thread;

#[cfg(test)]
mod tests;

pub use files::{LogFile, LogFiles, RealFiles};
pub use segments::IoCounts;
pub use thread::Done;

/// Name of the log's directory inside the data directory.
pub const WAL_DIR: &str = "wal";

/// Settings of the segment log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// Bytes preallocated per segment; a new segment starts when the next
    /// record would not fit.
    pub segment_bytes: u64,
    /// The committed index (from redb) the log must reach: a torn tail whose
    /// cut would end the log before it is refused, not cut.
    pub committed: Option<u64>,
    /// The most encoded bytes of the newest entries kept decoded in memory
    /// (the last entry appended always is); older ones are read back from
    /// the segments. Default [`DECODED_BYTES`].
    pub decoded_bytes: usize,
}

pub use mem::DECODED_BYTES;

impl Default for Options {
    fn default() -> Self {
        Options { segment_bytes: 64 * 1024 * 1024, committed: None, decoded_bytes: DECODED_BYTES }
    }
}

/// Any failure of the segment log.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WalError {
    #[error("{what} {}: {source}", path.display())]
    Io { what: &'static str, path: std::path::PathBuf, source: std::io::Error },
    /// Bytes on disk that are not a valid log: the node must not start from it.
    #[error("corrupt Raft log segment {} at offset {offset}: {why}; run fencelock check-data on the data dir", path.display())]
    Corrupt { path: std::path::PathBuf, offset: u64, why: String },
    #[error(
        "Raft log segment {} has format version {version}, this build reads version {}",
        path.display(),
        format::FORMAT_VERSION
    )]
    Version { path: std::path::PathBuf, version: u32 },
    #[error("cannot encode a log entry: {0}")]
    Encode(String),
    /// A record read back from its segment does not decode to its entry
    /// (it did at start-up, or was written by this process).
    #[error("a log entry read back from its segment does not decode: {0}")]
    Decode(String),
    #[error("log entries out of order: {0}")]
    Order(String),
    #[error("the Raft log stopped after an error: {0}")]
    Stopped(String),
}

/// An open segment log: the entries in memory and the log thread.
///
/// Dropping it lets the thread finish what is queued and joins it.
#[derive(Debug)]
pub struct Wal {
    tx: Option<mpsc::Sender<thread::Op>>,
    thread: Option<JoinHandle<()>>,
    writer: thread::Shared,
    /// Requests handed to the writer and not done yet.
    pending: Arc<thread::Pending>,
    mem: RwLock<mem::Mem>,
    /// One past the index of the last durable entry (or of the purge point):
    /// what the writer has synced.
    durable_end: Arc<AtomicU64>,
}

/// The log's file IO: `seams.log_files` if plugged, else the real file system.
pub(crate) fn files_of(seams: &Seams) -> Arc<dyn LogFiles> {
    seams.log_files.clone().unwrap_or_else(|| Arc::new(RealFiles))
}

impl Wal {
    /// Opens (creating if needed) the log in `dir`, skipping the entries at or
    /// before `last_purged`, and starts its thread. File IO goes through
    /// `seams.log_files` if plugged, else [`RealFiles`].
    pub fn open(dir: &Path, opts: Options, last_purged: Option<u64>, seams: &Seams) -> Result<Wal, WalError> {
        let (segs, loaded) =
            segments::Segments::open(dir, files_of(seams), opts.segment_bytes, last_purged, opts.committed)?;
        let end = loaded.entries.last().map(|e| e.log_id.index + 1).or(last_purged.map(|p| p + 1)).unwrap_or(0);
        let durable_end = Arc::new(AtomicU64::new(end));
        let mem = mem::Mem::read_back(loaded, opts.decoded_bytes);
        let (tx, rx) = mpsc::channel();
        let writer = Arc::new(Mutex::new(thread::Writer::new(segs, seams.clone(), durable_end.clone())));
        let pending = Arc::new(thread::Pending::default());
        let (w, p) = (writer.clone(), pending.clone());
        let thread = std::thread::Builder::new()
            .name("fencelock-log".into())
            .spawn(move || thread::run(w, p, rx))
            .map_err(|source| WalError::Io { what: "cannot start the log thread for", path: dir.into(), source })?;
        Ok(Wal { tx: Some(tx), thread: Some(thread), writer, pending, mem: RwLock::new(mem), durable_end })
    }

    /// Puts `entries` in memory and writes them, at once or through the log
    /// thread (see the module docs); `done` is called once they are durable
    /// (or failed), before this returns if they were written at once. `done`
    /// is called with the error if this returns one.
    pub fn append(&self, mut entries: Vec<Entry<TypeConfig>>, done: Done) -> Result<(), WalError> {
        let recs: Result<Vec<_>, _> = entries.iter_mut().map(segments::Rec::encode).collect();
        let recs = match recs {
            Ok(r) => r,
            Err(e) => {
                done(Err(std::io::Error::other(e.to_string())));
                return Err(e);
            }
        };
        let mut mem = self.mem.write().unwrap_or_else(PoisonError::into_inner);
        mem.extend(entries, &recs);
        if self.pending.none() {
            self.pending.add(1);
            let mut writer = thread::lock(&self.writer);
            drop(mem);
            blocking(|| writer.append_now(recs, done));
            drop(writer);
            self.pending.done(1);
            return Ok(());
        }
        self.send(thread::Op::Append { recs, done }).map_err(|op| {
            let why = "the log thread has stopped".to_string();
            if let thread::Op::Append { done, .. } = op {
                done(Err(std::io::Error::other(why.clone())));
            }
            WalError::Stopped(why)
        })
    }

    /// Deletes the entries at `since` and after; durable when it returns.
    pub async fn truncate(&self, since: u64) -> Result<(), WalError> {
        let (reply, rx) = oneshot::channel();
        self.change(|mem| mem.truncate(since), thread::Op::Truncate { since, reply })?;
        answer(rx).await?
    }

    /// Forgets the entries up to `upto` and deletes the segments that hold
    /// only such entries. Call once `upto` is durable as the last purged id.
    pub async fn purge(&self, upto: u64) -> Result<(), WalError> {
        let (reply, rx) = oneshot::channel();
        self.change(|mem| mem.purge(upto), thread::Op::Purge { upto, reply })?;
        answer(rx).await?
    }

    /// Changes the memory and queues `op` under one hold of its lock: a read
    /// that sees the change is queued after `op`, and one that does not,
    /// before it.
    fn change(&self, f: impl FnOnce(&mut mem::Mem), op: thread::Op) -> Result<(), WalError> {
        let mut mem = self.mem.write().unwrap_or_else(PoisonError::into_inner);
        f(&mut mem);
        self.send(op).map_err(|_| stopped())
    }

    /// The IO the log thread did so far (after everything queued before).
    pub async fn counts(&self) -> Result<IoCounts, WalError> {
        let (reply, rx) = oneshot::channel();
        self.send(thread::Op::Counts { reply }).map_err(|_| stopped())?;
        answer(rx).await
    }

    /// The entries with indexes in `lo..hi` (`hi`: `None` for no end): the
    /// newest from memory, older ones read back from the segments by the log
    /// thread (after every write queued before this call) and decoded here.
    pub async fn entries(&self, lo: u64, hi: Option<u64>) -> Result<Vec<Entry<TypeConfig>>, WalError> {
        self.entries_within(lo, hi, usize::MAX).await
    }

    /// [`Wal::entries`], only as many from `lo` as fit in `max_bytes` of
    /// records (at least one, if `lo..hi` holds any): what one message to a
    /// follower carries.
    pub async fn entries_within(
        &self,
        lo: u64,
        hi: Option<u64>,
        max_bytes: usize,
    ) -> Result<Vec<Entry<TypeConfig>>, WalError> {
        let (found, rx) = {
            let mem = self.mem.read().unwrap_or_else(PoisonError::into_inner);
            let found = mem.entries(lo, hi, max_bytes);
            if found.on_disk.is_empty() {
                return Ok(found.decoded);
            }
            let (reply, rx) = oneshot::channel();
            let (lo, hi) = (found.on_disk.start, found.on_disk.end);
            self.send(thread::Op::Read { lo, hi, reply }).map_err(|_| stopped())?;
            (found, rx)
        };
        let stored = answer(rx).await??;
        let mut entries = stored.iter().map(segments::Stored::decode).collect::<Result<Vec<_>, _>>()?;
        entries.extend(found.decoded);
        Ok(entries)
    }

    /// Whether the entry at `index` is durable (synced, or purged behind a
    /// snapshot). The committed log id is persisted only once it is, so that a
    /// persisted committed id never points past the log on disk.
    pub fn is_durable(&self, index: u64) -> bool {
        index < self.durable_end.load(Ordering::SeqCst)
    }

    /// The log id of the last entry, if any.
    pub fn last_log_id(&self) -> Option<LogId<NodeId>> {
        self.mem.read().unwrap_or_else(PoisonError::into_inner).last_log_id()
    }

    /// Queues `op` for the log thread.
    fn send(&self, op: thread::Op) -> Result<(), thread::Op> {
        self.pending.add(1);
        let sent = match &self.tx {
            Some(tx) => tx.send(op).map_err(|e| e.0),
            None => Err(op),
        };
        if sent.is_err() {
            self.pending.done(1);
        }
        sent
    }
}

/// Runs `f`, which waits for the disk, on this thread. A worker of a
/// multi-thread runtime with others beside it just blocks: the others go on
/// serving the node's connections, and handing this worker's tasks over first
/// (`block_in_place`) cost back most of what the write at once saves (W1 with
/// one client and W2 no faster than through the log thread). A runtime's only
/// worker does hand them over, so that a slow disk stalls the node's writes
/// but not its reads, its metrics or its health check. Elsewhere (a
/// current-thread runtime, a plain thread) `f` just runs.
fn blocking<R>(f: impl FnOnce() -> R) -> R {
    let Ok(rt) = tokio::runtime::Handle::try_current() else { return f() };
    match rt.runtime_flavor() {
        tokio::runtime::RuntimeFlavor::MultiThread if rt.metrics().num_workers() == 1 => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// The log thread's answer on `rx`.
async fn answer<T>(rx: oneshot::Receiver<T>) -> Result<T, WalError> {
    rx.await.map_err(|_| stopped())
}

fn stopped() -> WalError {
    WalError::Stopped("the log thread has stopped".into())
}

impl Drop for Wal {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
