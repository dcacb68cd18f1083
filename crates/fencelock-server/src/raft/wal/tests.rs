//! Tests of the segment log: the start-up scan (torn tails cut, corruption
//! refused), segment roll and purge, truncate, and group commit, on real files
//! in temp dirs. The log's fsyncs are counted through the file seam.
//!
//! Also a benchmark (ignored; run it by name): appends per second and fsyncs,
//! redb's log against this one.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::Duration;

use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId};
use prost::Message;

use super::files::{LogFile, LogFiles, RealFiles};
use super::format::{self, Parsed, HEADER_LEN};
use super::segments::segment_name;
use super::{Options, Wal, WalError};
use crate::raft::TypeConfig;
use crate::seams::Seams;

/// Small segments, so that a few entries fill several: four records of a
/// blank entry (a 32-byte record header and about 10 bytes of codec 2) each.
const SMALL: Options = Options { segment_bytes: 224, committed: None, decoded_bytes: super::DECODED_BYTES };
/// Segments that hold every test's entries (and are quick to copy).
const ONE: Options = Options { segment_bytes: 64 * 1024, committed: None, decoded_bytes: super::DECODED_BYTES };

fn entry(term: u64, index: u64) -> Entry<TypeConfig> {
    Entry { log_id: LogId::new(CommittedLeaderId::new(term, 1), index), payload: EntryPayload::Blank }
}

fn open(dir: &Path, opts: Options, last_purged: Option<u64>) -> Result<Wal, WalError> {
    Wal::open(dir, opts, last_purged, &Seams::default())
}

/// Appends `entries` in one call and waits until they are durable.
fn append(wal: &Wal, entries: Vec<Entry<TypeConfig>>) {
    let (tx, rx) = mpsc::channel();
    wal.append(entries, Box::new(move |r| tx.send(r).unwrap())).unwrap();
    rx.recv_timeout(Duration::from_secs(30)).expect("append completed").expect("append succeeded");
}

/// Appends entries `lo..=hi` of `term`, one call each, waiting for each.
fn append_each(wal: &Wal, term: u64, lo: u64, hi: u64) {
    for i in lo..=hi {
        append(wal, vec![entry(term, i)]);
    }
}

fn log_ids(wal: &Wal) -> Vec<(u64, u64)> {
    block_on(wal.entries(0, None)).unwrap().iter().map(|e| (e.log_id.leader_id.term, e.log_id.index)).collect()
}

fn ids(term: u64, lo: u64, hi: u64) -> Vec<(u64, u64)> {
    (lo..=hi).map(|i| (term, i)).collect()
}

fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().unwrap() == "seg")
        .collect();
    v.sort();
    v
}

/// Start offset and length of each record of the segment `bytes`.
fn records(bytes: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut at = HEADER_LEN;
    while let Parsed::Record(_, len) = format::parse_record(&bytes[at..]) {
        out.push((at, len));
        at += len;
    }
    out
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
}

/// A log of entries 1..=5 (one segment), closed; its segment file.
fn five_entries(dir: &Path) -> PathBuf {
    let wal = open(dir, ONE, None).unwrap();
    append_each(&wal, 1, 1, 5);
    drop(wal);
    let segs = segments(dir);
    assert_eq!(segs.len(), 1);
    segs[0].clone()
}

/// Torn write: the last record of the last segment half written (the rest of
/// the preallocated file zeros) is cut at start-up; the prefix survives, and a
/// new append after the cut survives the next start (no stale bytes past the
/// cut are read back).
#[test]
fn a_torn_tail_is_cut_and_the_prefix_survives() {
    let dir = tempfile::tempdir().unwrap();
    let seg = five_entries(dir.path());
    let mut bytes = std::fs::read(&seg).unwrap();
    let (start, len) = *records(&bytes).last().unwrap();
    bytes[start + len / 2..start + len].fill(0);
    std::fs::write(&seg, &bytes).unwrap();

    let wal = open(dir.path(), ONE, None).unwrap();
    assert_eq!(log_ids(&wal), ids(1, 1, 4));
    append(&wal, vec![entry(2, 5)]);
    drop(wal);
    let wal = open(dir.path(), ONE, None).unwrap();
    assert_eq!(log_ids(&wal), [ids(1, 1, 4), ids(2, 5, 5)].concat());
}

/// A bad last record is a torn write only if it was never acknowledged: when
/// the committed index (only synced entries get committed) is at or after it,
/// the log is damaged, not torn. Opening refuses it, naming the committed
/// index, and cuts nothing: the segment's bytes are unchanged.
#[test]
fn a_bad_tail_at_or_before_the_committed_index_is_refused_not_cut() {
    let dir = tempfile::tempdir().unwrap();
    let seg = five_entries(dir.path());
    let mut bytes = std::fs::read(&seg).unwrap();
    let (start, len) = *records(&bytes).last().unwrap();
    bytes[start + len / 2] ^= 0x04;
    std::fs::write(&seg, &bytes).unwrap();
    let committed = Options { committed: Some(5), ..ONE };
    let err = open(dir.path(), committed, None).expect_err("entry 5 was committed").to_string();
    assert!(err.contains("before the committed index 5") && err.contains("nothing was cut"), "{err}");
    assert_eq!(std::fs::read(&seg).unwrap(), bytes, "refused without writing");
    // Committed up to 4 only, the same tail is a torn write: cut, 4 entries kept.
    let wal = open(dir.path(), Options { committed: Some(4), ..ONE }, None).unwrap();
    assert_eq!(log_ids(&wal), ids(1, 1, 4));
}

/// Every length the last record could have been cut at (a crash mid-write,
/// zeros after it) opens to the first four entries.
#[test]
fn every_cut_of_the_last_record_opens_to_the_prefix() {
    let base = tempfile::tempdir().unwrap();
    let seg = five_entries(base.path());
    let bytes = std::fs::read(&seg).unwrap();
    let (start, len) = *records(&bytes).last().unwrap();
    for cut in 0..len {
        let dir = tempfile::tempdir().unwrap();
        let mut torn = bytes.clone();
        torn[start + cut..start + len].fill(0);
        std::fs::write(dir.path().join(seg.file_name().unwrap()), &torn).unwrap();
        let wal = open(dir.path(), ONE, None).unwrap_or_else(|e| panic!("cut at {cut}: {e}"));
        // Zeroing bytes that were zero already (the end of an entry's
        // encoding may be) leaves the record whole.
        let whole = cut >= format::RECORD_HEADER_LEN + payload_len(&bytes[start..])
            || bytes[start + cut..start + len].iter().all(|b| *b == 0);
        let expected = if whole { 5 } else { 4 };
        assert_eq!(log_ids(&wal), ids(1, 1, expected), "cut at {cut}");
    }
}

/// The payload length of the record at the start of `bytes`.
fn payload_len(bytes: &[u8]) -> usize {
    u32::from_le_bytes(bytes[..4].try_into().unwrap()) as usize
}

/// A flipped byte in a record with valid records after it is corruption, not
/// a torn tail: opening fails (the node does not start), naming the file and
/// the offset of the bad record.
#[test]
fn a_flipped_byte_in_the_middle_is_corruption_naming_file_and_offset() {
    let dir = tempfile::tempdir().unwrap();
    let seg = five_entries(dir.path());
    let mut bytes = std::fs::read(&seg).unwrap();
    let (start, _) = records(&bytes)[1];
    bytes[start + format::RECORD_HEADER_LEN + 3] ^= 0x01;
    std::fs::write(&seg, &bytes).unwrap();

    let err = open(dir.path(), ONE, None).expect_err("a corrupt log must not open");
    match &err {
        WalError::Corrupt { path, offset, .. } => {
            assert_eq!(path, &seg);
            assert_eq!(*offset, start as u64);
        }
        other => panic!("expected corruption, got {other}"),
    }
    let text = err.to_string();
    assert!(text.contains(&segment_name(1)) && text.contains(&format!("offset {start}")), "{text}");
}

/// A bad record at the end of a segment that is not the last is corruption
/// (every segment but the last is synced in full before the next is written).
#[test]
fn a_bad_record_in_an_earlier_segment_is_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let wal = open(dir.path(), SMALL, None).unwrap();
    append_each(&wal, 1, 1, 12);
    drop(wal);
    let first = segments(dir.path())[0].clone();
    let mut bytes = std::fs::read(&first).unwrap();
    let (start, len) = *records(&bytes).last().unwrap();
    bytes[start + len - 9] ^= 0xFF;
    std::fs::write(&first, &bytes).unwrap();
    let err = open(dir.path(), SMALL, None).expect_err("must not open");
    assert!(matches!(&err, WalError::Corrupt { path, .. } if path == &first), "{err}");
}

/// A segment of a format version this build does not know is refused, naming
/// the file and the version.
#[test]
fn an_unknown_format_version_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let seg = five_entries(dir.path());
    let mut bytes = std::fs::read(&seg).unwrap();
    bytes[8] = 2;
    std::fs::write(&seg, &bytes).unwrap();
    let err = open(dir.path(), ONE, None).expect_err("must not open");
    assert!(matches!(&err, WalError::Version { path, version: 2 } if path == &seg), "{err}");
    assert!(err.to_string().contains(&segment_name(1)), "{err}");
}

/// A gap in the indexes between segments (a segment missing) is corruption.
#[test]
fn a_missing_segment_is_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let wal = open(dir.path(), SMALL, None).unwrap();
    append_each(&wal, 1, 1, 20);
    drop(wal);
    let segs = segments(dir.path());
    assert!(segs.len() >= 3, "{segs:?}");
    std::fs::remove_file(&segs[1]).unwrap();
    let err = open(dir.path(), SMALL, None).expect_err("must not open");
    assert!(matches!(&err, WalError::Corrupt { path, .. } if path == &segs[2]), "{err}");
}

/// Entries fill several small segments, named by their first index, and read
/// back after a restart; a purge deletes exactly the segments holding only
/// purged entries, and the log opens from the purge point.
#[test]
fn segments_roll_and_purge_deletes_whole_segments() {
    let dir = tempfile::tempdir().unwrap();
    let wal = open(dir.path(), SMALL, None).unwrap();
    append_each(&wal, 1, 1, 30);
    let before = segments(dir.path());
    assert!(before.len() >= 4, "{before:?}");
    assert_eq!(before[0].file_name().unwrap().to_str().unwrap(), segment_name(1));
    let firsts: Vec<u64> = before.iter().map(|p| p.file_stem().unwrap().to_str().unwrap().parse().unwrap()).collect();

    block_on(wal.purge(15)).unwrap();
    // Kept: the segment holding 16 and every one after it.
    let keep_from = firsts.iter().rposition(|f| *f <= 16).unwrap();
    assert_eq!(segments(dir.path()), before[keep_from..].to_vec());
    assert_eq!(log_ids(&wal), ids(1, 16, 30));
    drop(wal);

    let wal = open(dir.path(), SMALL, Some(15)).unwrap();
    assert_eq!(log_ids(&wal), ids(1, 16, 30));
    // Past the end: every segment goes; the log goes on after the purge point.
    block_on(wal.purge(40)).unwrap();
    assert_eq!(segments(dir.path()), Vec::<PathBuf>::new());
    append_each(&wal, 2, 41, 43);
    drop(wal);
    let wal = open(dir.path(), SMALL, Some(40)).unwrap();
    assert_eq!(log_ids(&wal), ids(2, 41, 43));
}

/// Segments left behind by a crash between recording the purge point and
/// deleting them are deleted at the next start.
#[test]
fn segments_left_by_a_purge_are_removed_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let wal = open(dir.path(), SMALL, None).unwrap();
    append_each(&wal, 1, 1, 30);
    drop(wal);
    let before = segments(dir.path());
    // A leftover is not even read: garbage in the first one does not matter.
    std::fs::write(&before[0], b"garbage").unwrap();
    let wal = open(dir.path(), SMALL, Some(25)).unwrap();
    assert_eq!(log_ids(&wal), ids(1, 26, 30));
    let after = segments(dir.path());
    assert!(after.len() < before.len() && !after.contains(&before[0]), "{after:?}");
}

/// Truncate (into an earlier segment), append with a new term, reopen: exactly
/// the kept prefix and the new entries, nothing of the truncated ones.
#[test]
fn truncate_then_append_then_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let wal = open(dir.path(), SMALL, None).unwrap();
    append_each(&wal, 1, 1, 20);
    block_on(wal.truncate(8)).unwrap();
    assert_eq!(log_ids(&wal), ids(1, 1, 7));
    append(&wal, (8..=10).map(|i| entry(2, i)).collect());
    drop(wal);
    let wal = open(dir.path(), SMALL, None).unwrap();
    assert_eq!(log_ids(&wal), [ids(1, 1, 7), ids(2, 8, 10)].concat());
    // And truncating everything leaves an empty log that appends again.
    block_on(wal.truncate(1)).unwrap();
    append(&wal, vec![entry(3, 1)]);
    drop(wal);
    let wal = open(dir.path(), SMALL, None).unwrap();
    assert_eq!(log_ids(&wal), ids(3, 1, 1));
}

/// An append that does not follow on from the last entry (no truncate first)
/// fails, and the log fails closed: later requests fail too.
#[test]
fn an_append_over_the_log_fails_closed() {
    let dir = tempfile::tempdir().unwrap();
    let wal = open(dir.path(), ONE, None).unwrap();
    append_each(&wal, 1, 1, 3);
    let (tx, rx) = mpsc::channel();
    let tx2 = tx.clone();
    wal.append(vec![entry(1, 2)], Box::new(move |r| tx.send(r).unwrap())).unwrap();
    assert!(rx.recv_timeout(Duration::from_secs(30)).unwrap().is_err());
    wal.append(vec![entry(1, 4)], Box::new(move |r| tx2.send(r).unwrap())).unwrap();
    let later = rx.recv_timeout(Duration::from_secs(30)).unwrap().expect_err("the log stopped");
    assert!(later.to_string().contains("stopped"), "{later}");
}

/// Real files whose `sync_data` calls are counted, and held until
/// [`Gate::open`] (so that appends queue up behind a sync, deterministically).
#[derive(Debug, Default)]
struct Gate {
    syncs: AtomicU64,
    /// Syncs waiting for the gate to open.
    held: AtomicU64,
    /// Every `sync_data` and crash point, in order.
    events: Mutex<Vec<&'static str>>,
    open: Mutex<bool>,
    opened: Condvar,
}

impl Gate {
    fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.opened.notify_all();
    }

    /// Returns once a sync waits for the gate.
    fn wait_for_a_held_sync(&self) {
        for _ in 0..3_000 {
            if self.held.load(Ordering::SeqCst) > 0 {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("no sync came to the gate within 30 s");
    }
}

#[derive(Debug)]
struct GatedFiles(Arc<Gate>);

#[derive(Debug)]
struct GatedFile(Box<dyn LogFile>, Arc<Gate>);

impl LogFiles for GatedFiles {
    fn open(&self, path: &Path, create: bool) -> std::io::Result<Box<dyn LogFile>> {
        Ok(Box::new(GatedFile(RealFiles.open(path, create)?, self.0.clone())))
    }
}

impl LogFile for GatedFile {
    fn read_at(&mut self, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
        self.0.read_at(buf, offset)
    }
    fn write_at(&mut self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.0.write_at(buf, offset)
    }
    fn sync_data(&mut self) -> std::io::Result<()> {
        let open = self.1.open.lock().unwrap();
        self.1.held.fetch_add(1, Ordering::SeqCst);
        drop(self.1.opened.wait_while(open, |o| !*o).unwrap());
        self.1.syncs.fetch_add(1, Ordering::SeqCst);
        self.1.events.lock().unwrap().push("sync");
        self.0.sync_data()
    }
    fn set_len(&mut self, len: u64) -> std::io::Result<()> {
        self.0.set_len(len)
    }
    fn allocate(&mut self, len: u64) -> std::io::Result<()> {
        self.0.allocate(len)
    }
    fn size(&mut self) -> std::io::Result<u64> {
        self.0.size()
    }
}

/// Group commit: appends made while a sync is under way share the next
/// fsync. The first of 200 appends of one entry finds nothing queued and is
/// written at once, on a thread of its own, where its sync is held; the
/// other 199, issued meanwhile without waiting (as openraft hands over the
/// next append before the previous is flushed), find it pending and queue for
/// the log thread. They end in at most a few fsyncs (counted through the file
/// seam), and every callback is told, in order.
#[test]
fn queued_appends_share_one_fsync() {
    const N: u64 = 200;
    let dir = tempfile::tempdir().unwrap();
    let gate = Arc::new(Gate::default());
    let seams = Seams { log_files: Some(Arc::new(GatedFiles(gate.clone()))), ..Seams::default() };
    let wal = Arc::new(Wal::open(dir.path(), ONE, None, &seams).unwrap());
    let (tx, rx) = mpsc::channel();
    let first = {
        let (wal, tx) = (wal.clone(), tx.clone());
        std::thread::spawn(move || wal.append(vec![entry(1, 1)], Box::new(move |r| tx.send((1, r.is_ok())).unwrap())))
    };
    gate.wait_for_a_held_sync();
    for i in 2..=N {
        let tx = tx.clone();
        wal.append(vec![entry(1, i)], Box::new(move |r| tx.send((i, r.is_ok())).unwrap())).unwrap();
    }
    gate.open();
    first.join().unwrap().unwrap();
    let told: Vec<(u64, bool)> = (0..N).map(|_| rx.recv_timeout(Duration::from_secs(30)).unwrap()).collect();
    assert_eq!(told, (1..=N).map(|i| (i, true)).collect::<Vec<_>>(), "every append told, in order");
    let syncs = gate.syncs.load(Ordering::SeqCst);
    // One for the new segment's header, one for the first append, one for the rest.
    assert!(syncs <= 3, "{syncs} fsyncs for {N} appends");
    let counts = block_on(wal.counts()).unwrap();
    assert!(counts.syncs <= 2 && counts.writes <= 2, "{counts:?}");
    drop(Arc::into_inner(wal));
    let wal = open(dir.path(), ONE, None).unwrap();
    assert_eq!(log_ids(&wal), ids(1, 1, N));
}

/// A lone append (nothing queued or being written) is written and synced on
/// the caller's thread: it returns durable, its callback already called, and
/// the log thread has done nothing. So a write with nothing ahead of it wakes
/// no other thread (issue 38 §1); what it acknowledges is on disk all the
/// same (read back after a reopen).
#[test]
fn a_lone_append_returns_durable() {
    let dir = tempfile::tempdir().unwrap();
    let wal = open(dir.path(), ONE, None).unwrap();
    for i in 1..=3 {
        let told = Arc::new(Mutex::new(None));
        let t = told.clone();
        wal.append(vec![entry(1, i)], Box::new(move |r| *t.lock().unwrap() = Some(r.is_ok()))).unwrap();
        assert_eq!(*told.lock().unwrap(), Some(true), "append {i}: told before it returned");
        assert!(wal.is_durable(i), "append {i}: durable when it returned");
    }
    let counts = block_on(wal.counts()).unwrap();
    assert_eq!((counts.writes, counts.syncs), (3, 3), "one write and one sync each: {counts:?}");
    drop(wal);
    let wal = open(dir.path(), ONE, None).unwrap();
    assert_eq!(log_ids(&wal), ids(1, 1, 3));
}

/// On a runtime's only worker the append hands the worker's tasks over
/// before it waits for the disk (`block_in_place`), so that a slow disk
/// stalls only the writes; the append still returns durable, and a task
/// spawned before it runs while it syncs (here: before its callback is told).
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn an_append_on_the_only_worker_lets_its_other_tasks_run() {
    let dir = tempfile::tempdir().unwrap();
    let gate = Arc::new(Gate::default());
    let seams = Seams { log_files: Some(Arc::new(GatedFiles(gate.clone()))), ..Seams::default() };
    let wal = Wal::open(dir.path(), ONE, None, &seams).unwrap();
    let opener = {
        let gate = gate.clone();
        tokio::spawn(async move {
            while gate.held.load(Ordering::SeqCst) == 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            gate.open();
        })
    };
    let told = Arc::new(Mutex::new(None));
    let t = told.clone();
    wal.append(vec![entry(1, 1)], Box::new(move |r| *t.lock().unwrap() = Some(r.is_ok()))).unwrap();
    assert_eq!(*told.lock().unwrap(), Some(true));
    assert!(wal.is_durable(1));
    opener.await.unwrap();
}

/// Entry `index` as the driver writes it: one batch with one grant.
fn grant_entry(index: u64) -> Entry<TypeConfig> {
    use fencelock_core::{Command, Input, RequestId};
    let cmd = Command::GrantLease { req: RequestId(index), ttl_ms: 10_000, id: None };
    let input = Input::Batch { now: 1_000 + index, cmds: vec![cmd] };
    Entry { log_id: LogId::new(CommittedLeaderId::new(1, 1), index), payload: EntryPayload::Normal(input.into()) }
}

/// Benchmark, not a test (ignored; timings are printed, not asserted):
/// `FENCELOCK_BENCH_DIR=/some/ext4/dir cargo test -p fencelock-server --lib
/// -- --ignored --nocapture bench_log_appends`. Appends of one entry each:
/// redb's log through the `LogStore` API (each append commits before the next,
/// as openraft must wait for it), the segment log through the same API (each
/// waited for), and the segment log with every append queued at once (as
/// openraft hands over appends while the previous fsync runs), or 64 in flight
/// (64 clients, each waiting for its grant). Asserts only
/// that every entry is there afterwards.
#[test]
#[ignore]
#[allow(clippy::disallowed_methods)] // a benchmark reads the wall clock
fn bench_log_appends() {
    use openraft::storage::RaftLogStorageExt;
    use openraft::RaftLogReader;
    use std::time::Instant;
    const N: u64 = 2_000;
    let base = std::env::var_os("FENCELOCK_BENCH_DIR").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
    let report = |what: &str, secs: f64, syncs: Option<u64>| {
        let syncs = syncs.map_or("-".to_string(), |s| s.to_string());
        println!("{what:<40} {N} appends in {secs:.3} s: {:>8.0} appends/s, fsyncs {syncs}", N as f64 / secs);
    };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();

    for engine in [crate::raft::log_store::LogEngine::Redb, crate::raft::log_store::LogEngine::Segment] {
        let dir = tempfile::tempdir_in(&base).unwrap();
        let (mut log, _sm) = crate::raft::log_store::open_engine(dir.path(), &Seams::default(), engine).unwrap();
        let t = Instant::now();
        rt.block_on(async {
            for i in 1..=N {
                log.blocking_append([grant_entry(i)]).await.unwrap();
            }
        });
        report(&format!("LogStore {engine}, one at a time"), t.elapsed().as_secs_f64(), None);
        assert_eq!(rt.block_on(log.try_get_log_entries(..)).unwrap().len() as u64, N);
    }

    let dir = tempfile::tempdir_in(&base).unwrap();
    let wal = Wal::open(dir.path(), Options::default(), None, &Seams::default()).unwrap();
    let t = Instant::now();
    for i in 1..=N {
        append(&wal, vec![grant_entry(i)]);
    }
    let counts = block_on(wal.counts()).unwrap();
    report("segment log, one at a time", t.elapsed().as_secs_f64(), Some(counts.syncs));

    // 64 appends in flight: the next one queued as soon as one is durable
    // (64 clients, each waiting for its own grant).
    let dir = tempfile::tempdir_in(&base).unwrap();
    let wal = Wal::open(dir.path(), Options::default(), None, &Seams::default()).unwrap();
    let (tx, rx) = mpsc::channel();
    let t = Instant::now();
    let queue = |i: u64| {
        let tx = tx.clone();
        wal.append(vec![grant_entry(i)], Box::new(move |r| tx.send(r.is_ok()).unwrap())).unwrap();
    };
    (1..=64).for_each(queue);
    for next in 65..=N + 64 {
        assert!(rx.recv_timeout(Duration::from_secs(60)).unwrap(), "durable");
        if next <= N {
            queue(next);
        }
    }
    let counts = block_on(wal.counts()).unwrap();
    report("segment log, 64 in flight", t.elapsed().as_secs_f64(), Some(counts.syncs));
    assert_eq!(block_on(wal.entries(0, None)).unwrap().len() as u64, N);

    let dir = tempfile::tempdir_in(&base).unwrap();
    let wal = Wal::open(dir.path(), Options::default(), None, &Seams::default()).unwrap();
    let (tx, rx) = mpsc::channel();
    let t = Instant::now();
    for i in 1..=N {
        let tx = tx.clone();
        wal.append(vec![grant_entry(i)], Box::new(move |r| tx.send(r.is_ok()).unwrap())).unwrap();
    }
    assert!((0..N).all(|_| rx.recv_timeout(Duration::from_secs(60)).unwrap()), "every append durable");
    let counts = block_on(wal.counts()).unwrap();
    report("segment log, all queued at once", t.elapsed().as_secs_f64(), Some(counts.syncs));
    assert!(counts.syncs <= N);
    assert_eq!(block_on(wal.entries(0, None)).unwrap().len() as u64, N);
}

impl crate::seams::Hooks for Gate {
    fn crash_point(&self, point: crate::seams::CrashPoint) {
        self.events.lock().unwrap().push(point.name());
    }
}

/// The crash points of the chaos suite's K4 failpoints are around each
/// batch's fdatasync: `log-before-fsync` after the write and before the sync,
/// `log-after-fsync` after it and before the callbacks.
#[test]
fn the_crash_points_are_around_each_batch_fsync() {
    let dir = tempfile::tempdir().unwrap();
    let gate = Arc::new(Gate::default());
    gate.open();
    let seams =
        Seams { log_files: Some(Arc::new(GatedFiles(gate.clone()))), hooks: Some(gate.clone()), ..Seams::default() };
    let wal = Wal::open(dir.path(), ONE, None, &seams).unwrap();
    append(&wal, vec![entry(1, 1)]);
    let at_first_callback = gate.events.lock().unwrap().clone();
    append(&wal, vec![entry(1, 2), entry(1, 3)]);
    let events = gate.events.lock().unwrap().clone();
    // The new segment's header is synced first; then one sync per batch.
    let batch = ["log-before-fsync", "sync", "log-after-fsync"];
    assert_eq!(at_first_callback, [&["sync"][..], &batch[..]].concat());
    assert_eq!(events, [&["sync"][..], &batch[..], &batch[..]].concat());
}

/// An entry counts as durable only once its batch is synced (or it is purged
/// behind a snapshot), and no longer once truncated: the log store persists a
/// committed log id only for a durable entry, so the committed id on disk
/// never points past the log on disk.
#[test]
fn entries_are_durable_once_synced() {
    let dir = tempfile::tempdir().unwrap();
    let gate = Arc::new(Gate::default());
    let seams = Seams { log_files: Some(Arc::new(GatedFiles(gate.clone()))), ..Seams::default() };
    let wal = Arc::new(Wal::open(dir.path(), ONE, None, &seams).unwrap());
    let (tx, rx) = mpsc::channel();
    let appending = {
        let wal = wal.clone();
        std::thread::spawn(move || {
            wal.append(vec![entry(1, 1), entry(1, 2)], Box::new(move |r| tx.send(r.is_ok()).unwrap()))
        })
    };
    gate.wait_for_a_held_sync();
    assert!(!wal.is_durable(1), "written, not synced");
    gate.open();
    appending.join().unwrap().unwrap();
    assert!(rx.recv_timeout(Duration::from_secs(30)).unwrap());
    assert!(wal.is_durable(2) && !wal.is_durable(3));
    block_on(wal.truncate(2)).unwrap();
    assert!(wal.is_durable(1) && !wal.is_durable(2));
    block_on(wal.purge(10)).unwrap();
    assert!(wal.is_durable(10) && !wal.is_durable(11));
}

/// What [`UndoFiles`] remembers: the writes not synced yet, oldest first, as
/// (file, offset, the bytes before, the bytes written).
#[derive(Debug, Default)]
struct Unsynced {
    writes: Vec<(PathBuf, u64, Vec<u8>, Vec<u8>)>,
    /// The power is off: every IO fails.
    off: bool,
}

/// Real files that remember every write not synced yet, so that a power loss
/// can be played: [`power_loss`] puts back what was there before each
/// unsynced write, except a prefix of the newest one (a torn write), as the
/// chaos suite's power-loss scenario does to redb.
#[derive(Debug, Default, Clone)]
struct UndoFiles(Arc<Mutex<Unsynced>>);

#[derive(Debug)]
struct UndoFile(Box<dyn LogFile>, PathBuf, Arc<Mutex<Unsynced>>);

fn power_off() -> std::io::Error {
    std::io::Error::other("the power is off")
}

impl LogFiles for UndoFiles {
    fn open(&self, path: &Path, create: bool) -> std::io::Result<Box<dyn LogFile>> {
        Ok(Box::new(UndoFile(RealFiles.open(path, create)?, path.to_path_buf(), self.0.clone())))
    }
}

impl LogFile for UndoFile {
    fn read_at(&mut self, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
        self.0.read_at(buf, offset)
    }
    fn write_at(&mut self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        let mut state = self.2.lock().unwrap();
        if state.off {
            return Err(power_off());
        }
        let mut before = vec![0u8; buf.len()];
        let n = self.0.read_at(&mut before, offset)?;
        before[n..].fill(0);
        state.writes.push((self.1.clone(), offset, before, buf.to_vec()));
        self.0.write_at(buf, offset)
    }
    fn sync_data(&mut self) -> std::io::Result<()> {
        let mut state = self.2.lock().unwrap();
        if state.off {
            return Err(power_off());
        }
        state.writes.retain(|(p, ..)| p != &self.1);
        self.0.sync_data()
    }
    // Cuts and preallocations are synced right after, before anything else.
    fn set_len(&mut self, len: u64) -> std::io::Result<()> {
        self.0.set_len(len)
    }
    fn allocate(&mut self, len: u64) -> std::io::Result<()> {
        self.0.allocate(len)
    }
    fn size(&mut self) -> std::io::Result<u64> {
        self.0.size()
    }
}

/// Turns the power off at the `at`-th batch's `log-before-fsync` (0-based).
#[derive(Debug)]
struct OffAt {
    at: usize,
    seen: AtomicU64,
    files: UndoFiles,
}

impl crate::seams::Hooks for OffAt {
    fn crash_point(&self, point: crate::seams::CrashPoint) {
        if point == crate::seams::CrashPoint::LogBeforeFsync
            && self.seen.fetch_add(1, Ordering::SeqCst) == self.at as u64
        {
            self.files.0.lock().unwrap().off = true;
        }
    }
}

/// Plays the power loss: every unsynced write undone, newest first, but the
/// newest keeps its first `keep(len)` bytes.
fn power_loss(files: &UndoFiles, keep: impl Fn(usize) -> usize) {
    let writes = std::mem::take(&mut files.0.lock().unwrap().writes);
    let newest = writes.len().saturating_sub(1);
    for (i, (path, offset, before, written)) in writes.into_iter().enumerate().rev() {
        let kept = if i == newest { keep(written.len()).min(written.len()) } else { 0 };
        let mut file = RealFiles.open(&path, false).unwrap();
        file.write_at(&before[kept..], offset + kept as u64).unwrap();
        file.sync_data().unwrap();
    }
}

/// A power loss during a batch's fsync, the batch's write torn anywhere (from
/// nothing of it on disk to all of it): the log opens to every acknowledged
/// entry, in order, plus at most a prefix of the lost batch (never
/// acknowledged, outcome unknown), never a gap and never an error.
#[test]
fn a_power_loss_keeps_every_acknowledged_entry() {
    const BATCH: u64 = 3;
    for at in [0usize, 1, 3] {
        for (num, den, minus) in [(0, 1, 0), (1, 4, 0), (1, 2, 0), (3, 4, 0), (1, 1, 1), (1, 1, 0)] {
            let keep = |len: usize| (len * num / den).saturating_sub(minus);
            let dir = tempfile::tempdir().unwrap();
            let files = UndoFiles::default();
            let hooks = Arc::new(OffAt { at, seen: AtomicU64::new(0), files: files.clone() });
            let seams = Seams { log_files: Some(Arc::new(files.clone())), hooks: Some(hooks), ..Seams::default() };
            let wal = Wal::open(dir.path(), ONE, None, &seams).unwrap();
            let mut acked = 0;
            for b in 0..5u64 {
                let (tx, rx) = mpsc::channel();
                let batch = (b * BATCH + 1..=(b + 1) * BATCH).map(|i| entry(1, i)).collect();
                wal.append(batch, Box::new(move |r| tx.send(r.is_ok()).unwrap())).unwrap();
                match rx.recv_timeout(Duration::from_secs(30)).unwrap() {
                    true => acked = (b + 1) * BATCH,
                    false => break,
                }
            }
            drop(wal);
            power_loss(&files, keep);

            let case = format!("power off at batch {at}, {num}/{den} of its write kept (minus {minus})");
            let wal = open(dir.path(), ONE, None).unwrap_or_else(|e| panic!("{case}: {e}"));
            let got = log_ids(&wal);
            assert_eq!(acked, at as u64 * BATCH, "{case}: the batches before were acknowledged");
            assert!(got.len() as u64 >= acked && got.len() as u64 <= acked + BATCH, "{case}: {got:?}");
            assert_eq!(got, ids(1, 1, got.len() as u64), "{case}: a prefix, in order");
        }
    }
}

/// One batch that fills several segments: each full segment is synced before
/// the next is written (so only the last can hold a torn write), one write
/// per segment, and it all reads back after a restart.
#[test]
fn a_batch_spanning_segments_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let wal = open(dir.path(), SMALL, None).unwrap();
    append(&wal, (1..=20).map(|i| entry(1, i)).collect());
    let segs = segments(dir.path()).len() as u64;
    assert!(segs >= 4, "{segs} segments");
    let counts = block_on(wal.counts()).unwrap();
    assert_eq!(counts.writes, segs, "one write per segment");
    assert_eq!(counts.syncs, segs, "each full segment synced, then the last one");
    drop(wal);
    let wal = open(dir.path(), SMALL, None).unwrap();
    assert_eq!(log_ids(&wal), ids(1, 1, 20));
}

/// A log of entries 1..=3 (one batch each) and 4..=9 (one batch), closed; its
/// segment file and the start offset of the last batch.
fn a_last_batch_of_six(dir: &Path) -> (PathBuf, usize) {
    let wal = open(dir, ONE, None).unwrap();
    append_each(&wal, 1, 1, 3);
    append(&wal, (4..=9).map(|i| entry(1, i)).collect());
    drop(wal);
    let seg = segments(dir)[0].clone();
    let start = records(&std::fs::read(&seg).unwrap())[3].0;
    (seg, start)
}

/// Torn batch (format.rs, "batch"): a power loss during the last batch's
/// fdatasync persisted its later pages but not a middle one. The hole is
/// followed by valid records of that same batch, none of which was
/// acknowledged: the log opens cut at the batch's first record, not refused as
/// corruption, and a new append there survives the next start.
#[test]
fn a_hole_inside_the_last_batch_is_cut_at_the_batch_start() {
    let dir = tempfile::tempdir().unwrap();
    let (seg, _) = a_last_batch_of_six(dir.path());
    let mut bytes = std::fs::read(&seg).unwrap();
    let (start, len) = records(&bytes)[5];
    bytes[start..start + len].fill(0);
    std::fs::write(&seg, &bytes).unwrap();

    let wal = open(dir.path(), ONE, None).unwrap();
    assert_eq!(log_ids(&wal), ids(1, 1, 3), "the whole torn batch is cut");
    append(&wal, vec![entry(2, 4)]);
    drop(wal);
    let wal = open(dir.path(), ONE, None).unwrap();
    assert_eq!(log_ids(&wal), [ids(1, 1, 3), ids(2, 4, 4)].concat());
}

/// A hole followed by records of a later batch is corruption (that batch was
/// written after the hole's batch was synced, so the hole is not a torn
/// write): opening fails naming the file and the offset of the hole. Holes in
/// the batch before the last, at its first record, inside it, and covering it.
#[test]
fn a_hole_followed_by_a_later_batch_is_corruption() {
    let base = tempfile::tempdir().unwrap();
    let wal = open(base.path(), ONE, None).unwrap();
    append_each(&wal, 1, 1, 2);
    append(&wal, (3..=5).map(|i| entry(1, i)).collect());
    append(&wal, (6..=8).map(|i| entry(1, i)).collect());
    drop(wal);
    let seg = segments(base.path())[0].clone();
    let bytes = std::fs::read(&seg).unwrap();
    let recs = records(&bytes);
    // Records 2..=4 hold the batch of entries 3..=5.
    for (lo, hi) in [(2, 2), (3, 3), (2, 4), (4, 4)] {
        let dir = tempfile::tempdir().unwrap();
        let mut holed = bytes.clone();
        let (start, end) = (recs[lo].0, recs[hi].0 + recs[hi].1);
        holed[start..end].fill(0);
        let path = dir.path().join(seg.file_name().unwrap());
        std::fs::write(&path, &holed).unwrap();
        let err = open(dir.path(), ONE, None).expect_err("a hole before a later batch must not open");
        match &err {
            WalError::Corrupt { path: p, offset, .. } => assert_eq!((p, *offset), (&path, start as u64), "{err}"),
            other => panic!("records {lo}..={hi} zeroed: expected corruption, got {other}"),
        }
        assert!(err.to_string().contains(&segment_name(1)), "{err}");
    }
}

/// Bytes of a page in the page-hole test: small, so that each record (a
/// blank entry: a 32-byte header and about 10 bytes of codec 2) spans two or
/// three pages.
const PAGE: usize = 16;

/// Every single-page hole a power loss can leave in a multi-page last batch
/// (the page not persisted, every other page of the batch persisted): the log
/// opens, never as corruption, to every entry before the batch plus, when no
/// whole record of the batch follows the hole, the batch's records before it
/// (a torn tail); when one does, none of the batch (a torn batch).
#[test]
fn every_single_page_hole_of_the_last_batch_opens_to_a_prefix() {
    let base = tempfile::tempdir().unwrap();
    let (seg, batch_start) = a_last_batch_of_six(base.path());
    let bytes = std::fs::read(&seg).unwrap();
    let recs = records(&bytes);
    let batch_end = recs.last().map(|(s, l)| s + l).unwrap();
    assert!(batch_end - batch_start > 6 * PAGE, "the batch spans many pages");
    for page in batch_start / PAGE..batch_end.div_ceil(PAGE) {
        // Bytes of the page before the batch were synced with the batch before.
        let (lo, hi) = ((page * PAGE).max(batch_start), ((page + 1) * PAGE).min(batch_end));
        let mut holed = bytes.clone();
        holed[lo..hi].fill(0);
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(seg.file_name().unwrap()), &holed).unwrap();
        let case = format!("page {page} (bytes {lo}..{hi}) lost");
        let wal = open(dir.path(), ONE, None).unwrap_or_else(|e| panic!("{case}: {e}"));
        // A record is hit when the hole zeroed a byte of it that was not zero
        // already (the end of an entry's encoding may be).
        let hit = |(s, _): &(usize, usize)| {
            let (a, b) = (lo.max(*s), hi.min(s + format::RECORD_HEADER_LEN + payload_len(&bytes[*s..])));
            a < b && bytes[a..b].iter().any(|x| *x != 0)
        };
        let first_hit = recs.iter().position(hit);
        let expected = match first_hit {
            // Only padding lost: nothing to cut.
            None => 9,
            Some(k) if recs[k + 1..].iter().any(|r| r.0 >= hi) => 3,
            Some(k) => k as u64,
        };
        assert_eq!(log_ids(&wal), ids(1, 1, expected), "{case}");
    }
}

/// Small segments, and only the last entry kept decoded: every other read
/// goes back to the segments.
const ON_DISK: Options = Options { segment_bytes: 224, committed: None, decoded_bytes: 0 };

/// Issue 38 §3: entries no longer kept decoded are read back from their
/// segments equal to what was appended, across segments, after a purge, a
/// truncation (which leaves only entries on disk) and a restart.
#[test]
fn entries_not_kept_decoded_are_read_back_from_the_segments() {
    let dir = tempfile::tempdir().unwrap();
    let wal = open(dir.path(), ON_DISK, None).unwrap();
    let mut all: Vec<_> = (1..=30).map(grant_entry).collect();
    all.iter().for_each(|e| append(&wal, vec![e.clone()]));
    assert!(segments(dir.path()).len() >= 4);
    assert_eq!(block_on(wal.entries(0, None)).unwrap(), all);
    assert_eq!(block_on(wal.entries(5, Some(12))).unwrap(), all[4..11].to_vec());

    block_on(wal.purge(15)).unwrap();
    assert_eq!(block_on(wal.entries(0, None)).unwrap(), all[15..].to_vec());
    block_on(wal.truncate(21)).unwrap();
    assert_eq!(wal.last_log_id(), Some(all[19].log_id));
    assert_eq!(block_on(wal.entries(16, None)).unwrap(), all[15..20].to_vec());
    all.truncate(20);
    let again: Vec<_> = (21..=24).map(|i| entry(2, i)).collect();
    append(&wal, again.clone());
    all.extend(again);
    assert_eq!(block_on(wal.entries(16, None)).unwrap(), all[15..].to_vec());
    drop(wal);

    let wal = open(dir.path(), ON_DISK, Some(15)).unwrap();
    assert_eq!(block_on(wal.entries(0, None)).unwrap(), all[15..].to_vec());
    assert_eq!(wal.last_log_id(), Some(all[23].log_id));
}

/// What the log hands out carries the bytes it wrote for each input, so that
/// the leader sends a follower those bytes instead of encoding the entry
/// again (`codec::encode_entry`; issue 38 §2), whether the entry was kept
/// decoded (the newest) or read back from its segment (the older ones here).
#[test]
fn entries_read_carry_the_bytes_they_were_written_with() {
    let dir = tempfile::tempdir().unwrap();
    let wal = open(dir.path(), ON_DISK, None).unwrap();
    let all: Vec<_> = (1..=12).map(grant_entry).collect();
    append(&wal, all.clone());
    let read = block_on(wal.entries(0, None)).unwrap();
    assert_eq!(read, all);
    for (e, original) in read.iter().zip(&all) {
        let (EntryPayload::Normal(kept), EntryPayload::Normal(bare)) = (&e.payload, &original.payload) else {
            panic!("not a normal entry: {e:?}")
        };
        assert!(bare.encoded().is_none());
        let bytes = kept.encoded().unwrap_or_else(|| panic!("entry {} was read without its bytes", e.log_id));
        assert_eq!(bytes.len(), fencelock_proto::log::Input::decode(bytes.as_ref()).unwrap().encoded_len());
        assert_eq!(crate::raft::codec::encode_entry(e).unwrap(), crate::raft::codec::encode_entry(original).unwrap());
    }
}

/// A read beside appends that are not yet durable sees each entry it is
/// given whole: the read back of an entry no longer decoded is queued after
/// the append that wrote it (here, each append of three entries keeps only
/// its last decoded, so two of them are on disk only as soon as they are in
/// memory). Every read returns a prefix of the log, in order.
#[test]
fn reads_beside_unsynced_appends_read_back_every_entry() {
    let dir = tempfile::tempdir().unwrap();
    let wal = Arc::new(open(dir.path(), ON_DISK, None).unwrap());
    const N: u64 = 300;
    let writer = {
        let wal = wal.clone();
        std::thread::spawn(move || {
            let (tx, rx) = mpsc::channel();
            for i in (1..=N).step_by(3) {
                let tx = tx.clone();
                let three = (i..i + 3).map(grant_entry).collect();
                wal.append(three, Box::new(move |r| tx.send(r.is_ok()).unwrap())).unwrap();
            }
            (0..N / 3).all(|_| rx.recv_timeout(Duration::from_secs(30)).unwrap())
        })
    };
    let mut reads = 0;
    loop {
        let done = writer.is_finished();
        let read = block_on(wal.entries(1, None)).unwrap();
        let expected: Vec<_> = (1..=read.len() as u64).map(grant_entry).collect();
        assert_eq!(read, expected, "read {reads}");
        reads += 1;
        if done {
            break;
        }
    }
    assert!(writer.join().unwrap(), "every append durable");
    assert_eq!(block_on(wal.entries(1, None)).unwrap().len() as u64, N);
}

/// A record that changed on disk after the start fails the read that meets
/// it with an error naming the segment (no panic, nothing else lost): the
/// log still appends and reads the entries after it.
#[test]
fn a_record_changed_after_the_start_fails_its_read_with_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let wal = open(dir.path(), Options { segment_bytes: 64 * 1024, ..ON_DISK }, None).unwrap();
    (1..=5).for_each(|i| append(&wal, vec![grant_entry(i)]));
    let seg = segments(dir.path())[0].clone();
    let mut bytes = std::fs::read(&seg).unwrap();
    let (at, _) = records(&bytes)[2];
    bytes[at + format::RECORD_HEADER_LEN] ^= 0xff;
    std::fs::write(&seg, &bytes).unwrap();

    let err = block_on(wal.entries(1, None)).unwrap_err();
    assert!(matches!(&err, WalError::Corrupt { path, .. } if *path == seg), "{err}");
    assert_eq!(block_on(wal.entries(4, None)).unwrap(), vec![grant_entry(4), grant_entry(5)]);
    append(&wal, vec![grant_entry(6)]);
    assert_eq!(block_on(wal.entries(5, None)).unwrap(), vec![grant_entry(5), grant_entry(6)]);
}
