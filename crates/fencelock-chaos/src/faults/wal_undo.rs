//! Scenario S5 ("simulated power loss") on the segment log (`--log segment`,
//! the default engine).
//!
//! With `FENCELOCK_POWER_LOSS_SHIM=1`, `fencelock-chaos serve` plugs
//! [`UndoLogFiles`] into the server's `Seams::log_files`: every segment file
//! of `<data dir>/wal/` is read and written through it, and before each write,
//! cut (`set_len`) or preallocation made since the file's last `sync_data` it
//! appends an undo record to `<segment>.undo`, in the format of
//! [`super::power_loss`] (the same journal the redb database gets; the
//! database keeps its own shim: the vote, the committed and purge points and
//! the state machine stay in redb). `sync_data` fsyncs the segment, then
//! empties its undo file. Removing a segment removes its undo file.
//!
//! While the server is dead, [`simulate`] rolls every segment back to its last
//! sync, tearing its newest unsynced write (one batch's records: the log
//! thread writes each batch with one write) by the seed: either a
//! sector-aligned prefix stays, as for the database, or a subset of its
//! sectors stays, in no order (a disk that persisted some of the batch's
//! pages during the interrupted `fdatasync`), which leaves a hole followed by
//! records of the same batch: a torn batch, which the log must cut, not refuse.
//!
//! The mutant `wal-no-sync` (`FENCELOCK_MUTANT`, read by the harness's serve
//! command only): `sync_data` does nothing, so acknowledged entries are not
//! durable and a power loss drops them; C2 or C6 must go red.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use fencelock_server::raft::wal::{LogFile, LogFiles, RealFiles, WAL_DIR};

use super::power_loss::{
    record, roll_back, splitmix64, undo_path, PowerLoss, Tear, Undo, KIND_SET_LEN, KIND_WRITE, TEAR_SECTOR, UNDO_SUFFIX,
};

/// The segment log's file seam recording unsynced writes (see the module docs).
#[derive(Debug, Clone, Copy, Default)]
pub struct UndoLogFiles {
    /// The `wal-no-sync` mutant: `sync_data` does nothing.
    pub no_sync: bool,
}

impl LogFiles for UndoLogFiles {
    fn open(&self, path: &Path, create: bool) -> io::Result<Box<dyn LogFile>> {
        let file = OpenOptions::new().read(true).write(true).create(create).truncate(false).open(path)?;
        Ok(Box::new(UndoLogFile { file, undo: Undo::open(path)?, no_sync: self.no_sync }))
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        RealFiles.remove(path)?;
        match std::fs::remove_file(undo_path(path)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}

/// One segment of [`UndoLogFiles`] and its undo file.
#[derive(Debug)]
struct UndoLogFile {
    file: File,
    undo: Undo,
    no_sync: bool,
}

impl UndoLogFile {
    /// The bytes `offset..offset + len` held, short where that runs past the
    /// end; for a cut (`trim`), without the zeros at their end (the roll-back
    /// grows the file back with zeros before writing them).
    fn saved(&self, offset: u64, len: u64, trim: bool) -> io::Result<Vec<u8>> {
        let end = offset.saturating_add(len).min(self.file.metadata()?.len());
        let mut saved = vec![0; end.saturating_sub(offset) as usize];
        self.file.read_exact_at(&mut saved, offset)?;
        if trim {
            let kept = saved.iter().rposition(|b| *b != 0).map_or(0, |i| i + 1);
            saved.truncate(kept);
        }
        Ok(saved)
    }

    fn journal_len(&mut self, len: u64) -> io::Result<()> {
        let prev_len = self.file.metadata()?.len();
        let saved = self.saved(len, prev_len.saturating_sub(len), true)?;
        self.undo.append(&record(KIND_SET_LEN, len, len, prev_len, &saved))
    }
}

impl LogFile for UndoLogFile {
    fn read_at(&mut self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.file.read_at(buf, offset)
    }

    fn write_at(&mut self, buf: &[u8], offset: u64) -> io::Result<()> {
        let prev_len = self.file.metadata()?.len();
        let saved = self.saved(offset, buf.len() as u64, false)?;
        self.undo.append(&record(KIND_WRITE, offset, buf.len() as u64, prev_len, &saved))?;
        self.file.write_all_at(buf, offset)
    }

    fn sync_data(&mut self) -> io::Result<()> {
        if self.no_sync {
            return Ok(());
        }
        self.file.sync_data()?;
        self.undo.synced()
    }

    fn set_len(&mut self, len: u64) -> io::Result<()> {
        self.journal_len(len)?;
        self.file.set_len(len)
    }

    /// A sparse extension (zeros), where the server preallocates.
    fn allocate(&mut self, len: u64) -> io::Result<()> {
        if self.file.metadata()?.len() >= len {
            return Ok(());
        }
        self.journal_len(len)?;
        self.file.set_len(len)
    }

    fn size(&mut self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }
}

/// Whether a segment of the segment log in `data_dir` has writes not synced
/// yet (a non-empty undo file): the moment S5 waits for to kill.
pub fn unsynced(data_dir: &Path) -> bool {
    let Ok(listed) = std::fs::read_dir(data_dir.join(WAL_DIR)) else { return false };
    listed.filter_map(Result::ok).any(|e| {
        e.file_name().to_str().is_some_and(|n| n.ends_with(UNDO_SUFFIX)) && e.metadata().is_ok_and(|m| m.len() > 0)
    })
}

/// Simulates a power loss on the segment log of the data directory
/// `data_dir` (nothing if it has none); call it only while the server is
/// dead. Each segment with an undo file is rolled back to its last sync
/// ([`roll_back`]); the newest unsynced write keeps a sector-aligned prefix
/// (even `seed`) or a subset of its sectors (odd `seed`), drawn from the seed.
/// Undo files whose segment is gone are removed. The counts are summed.
pub fn simulate(data_dir: &Path, seed: u64) -> io::Result<PowerLoss> {
    let dir = data_dir.join(WAL_DIR);
    let mut total = PowerLoss::default();
    let listed = match std::fs::read_dir(&dir) {
        Ok(l) => l,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(total),
        Err(e) => return Err(e),
    };
    let mut segments: Vec<PathBuf> = Vec::new();
    for e in listed {
        let path = e?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else { continue };
        if let Some(segment) = name.strip_suffix(UNDO_SUFFIX).filter(|s| s.ends_with(".seg")) {
            segments.push(dir.join(segment));
        }
    }
    segments.sort();
    let tear = match seed % 2 {
        0 => Tear::Prefix(TEAR_SECTOR),
        _ => Tear::Sectors(TEAR_SECTOR),
    };
    for (i, segment) in segments.iter().enumerate() {
        if !segment.exists() {
            std::fs::remove_file(undo_path(segment))?;
            continue;
        }
        let loss = roll_back(segment, splitmix64(seed ^ i as u64), tear)?;
        total.undone_writes += loss.undone_writes;
        total.undone_bytes += loss.undone_bytes;
        total.torn_bytes_kept += loss.torn_bytes_kept;
        total.truncated_to = loss.truncated_to.or(total.truncated_to);
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{mpsc, Arc};
    use std::time::Duration;

    use fencelock_server::raft::wal::{Done, Options, Wal};
    use fencelock_server::raft::TypeConfig;
    use fencelock_server::seams::{CrashPoint, Hooks, Seams};
    use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId};

    use super::*;

    /// A segment file of `wal/` in a temp data dir: 32 synced bytes of 1, then
    /// `len` unsynced bytes of 7 at offset 200; the data dir and the file.
    fn one_unsynced_write(len: usize) -> (tempfile::TempDir, PathBuf) {
        let data = tempfile::tempdir().unwrap();
        std::fs::create_dir(data.path().join(WAL_DIR)).unwrap();
        let path = data.path().join(WAL_DIR).join("00000000000000000001.seg");
        let mut f = UndoLogFiles::default().open(&path, true).unwrap();
        f.allocate(8192).unwrap();
        f.write_at(&[1; 32], 0).unwrap();
        f.sync_data().unwrap();
        f.write_at(&vec![7; len], 200).unwrap();
        (data, path)
    }

    /// Invariant (S5 on the segment log): synced bytes stay; the newest unsynced
    /// write keeps, by the seed, a sector-aligned prefix (even seeds) or a
    /// subset of its sectors, never all (odd seeds), and loses the rest; the
    /// undo file ends empty. Over a few seeds some subsets leave a hole before
    /// a kept sector (what a torn batch looks like).
    #[test]
    fn a_segment_rolls_back_to_its_sync_with_the_newest_write_torn() {
        const LEN: usize = 5 * TEAR_SECTOR as usize;
        let mut hole_before_kept = false;
        for seed in 0..16u64 {
            let (data, path) = one_unsynced_write(LEN);
            let loss = simulate(data.path(), seed).unwrap();
            let bytes = std::fs::read(&path).unwrap();
            assert!(bytes[..32].iter().all(|b| *b == 1), "seed {seed}: synced bytes stay");
            let written = &bytes[200..200 + LEN];
            let kept = written.iter().filter(|b| **b == 7).count();
            assert_eq!(kept as u64, loss.torn_bytes_kept, "seed {seed}");
            assert!(kept < LEN, "seed {seed}: the torn write always loses something");
            assert!(written.iter().all(|b| *b == 7 || *b == 0), "seed {seed}");
            assert_eq!(std::fs::metadata(undo_path(&path)).unwrap().len(), 0);
            if seed % 2 == 0 {
                assert!(written[..kept].iter().all(|b| *b == 7), "seed {seed}: a prefix");
                continue;
            }
            // Sectors end at the file's sector boundaries: 512, 1024, ...
            let sector_of = |i: usize| (200 + i) / TEAR_SECTOR as usize;
            for i in 1..LEN {
                if sector_of(i) == sector_of(i - 1) {
                    assert_eq!(written[i], written[i - 1], "seed {seed}: a sector is kept or lost whole");
                }
            }
            hole_before_kept |= written.iter().position(|b| *b == 0) < written.iter().rposition(|b| *b == 7);
        }
        assert!(hole_before_kept, "no seed left a hole before a kept sector");
    }

    /// The log's writer dies at its `at`-th batch's `log-before-fsync` (that
    /// batch is written, not synced, never acknowledged): a panic on whichever
    /// thread writes it, the caller's or the log thread's.
    #[derive(Debug)]
    struct DieAt {
        at: u64,
        seen: AtomicU64,
    }

    impl Hooks for DieAt {
        fn crash_point(&self, point: CrashPoint) {
            if point == CrashPoint::LogBeforeFsync && self.seen.fetch_add(1, Ordering::SeqCst) == self.at {
                panic!("killed at log-before-fsync (test)");
            }
        }
    }

    fn entry(index: u64) -> Entry<TypeConfig> {
        Entry { log_id: LogId::new(CommittedLeaderId::new(1, 1), index), payload: EntryPayload::Blank }
    }

    /// Invariant (S5 on the segment log, end to end): the writer dies
    /// while a batch of six entries is written but not synced, power is lost
    /// (every seed of [`simulate`], prefix and sector-subset tears), and the
    /// segment log then opens, never as corruption, to every acknowledged
    /// entry and at most a prefix of the lost batch, in order.
    #[test]
    fn the_segment_log_keeps_every_acknowledged_entry_through_a_power_loss() {
        const BATCH: u64 = 6;
        for (at, seed) in (0..3u64).flat_map(|at| (0..8u64).map(move |s| (at, s))) {
            let data = tempfile::tempdir().unwrap();
            let dir = data.path().join(WAL_DIR);
            let hooks = Arc::new(DieAt { at, seen: AtomicU64::new(0) });
            let seams =
                Seams { log_files: Some(Arc::new(UndoLogFiles::default())), hooks: Some(hooks), ..Seams::default() };
            let wal = Wal::open(&dir, Options::default(), None, &seams).unwrap();
            let mut acked = 0;
            for b in 0..4u64 {
                let (tx, rx) = mpsc::channel();
                let batch = (b * BATCH + 1..=(b + 1) * BATCH).map(entry).collect();
                let done: Done = Box::new(move |r| {
                    let _ = tx.send(r.is_ok());
                });
                // A lone append is written on this thread: the writer's death
                // is then this call's panic.
                let appended = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| wal.append(batch, done)));
                if !matches!(appended, Ok(Ok(()))) {
                    break;
                }
                match rx.recv_timeout(Duration::from_secs(30)) {
                    Ok(true) => acked = (b + 1) * BATCH,
                    _ => break,
                }
            }
            drop(wal);
            let case = format!("writer killed at batch {at}, power loss with seed {seed}");
            assert_eq!(acked, at * BATCH, "{case}");
            let loss = simulate(data.path(), seed).unwrap();
            assert!(loss.undone_writes > 0, "{case}: the lost batch was unsynced");
            let wal =
                Wal::open(&dir, Options::default(), None, &Seams::default()).unwrap_or_else(|e| panic!("{case}: {e}"));
            let read = tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(wal.entries(0, None));
            let got: Vec<u64> = read.unwrap().iter().map(|e| e.log_id.index).collect();
            assert!(got.len() as u64 >= acked && got.len() as u64 <= acked + BATCH, "{case}: {got:?}");
            assert_eq!(got, (1..=got.len() as u64).collect::<Vec<_>>(), "{case}");
        }
    }
}
