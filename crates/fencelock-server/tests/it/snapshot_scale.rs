//! The cost of taking a snapshot of a node of many idle leases (issue 19 §4:
//! "state the time and the memory spike of taking one"): a measurement, not a
//! check of a bound; the numbers go in the report and the docs.
//!
//! Where it sits: beside the other server tests, through the public storage
//! API only, with a counting global allocator of its own (this test binary
//! only). It opens a state machine in a temp dir, applies `SNAPSHOT_LEASES`
//! (default 100,000) one-hour leases that each take a lock of their own,
//! 4096 commands per entry as the driver batches them, then takes a snapshot
//! the way openraft's state-machine worker does, on a runtime of ONE worker
//! thread (`fencelock serve --worker-threads 1`):
//! - `get_snapshot_builder` on the state machine's task: an entry committed
//!   meanwhile is applied only after it returns (the apply stall);
//! - `build_snapshot` on a spawned task, while the next grant is applied
//!   (twice: the first snapshot of a node, and the next one);
//! - a task that wakes every millisecond notes the longest gap between its
//!   wake-ups: how long the runtime's one thread was taken from everyone else
//!   (gRPC, heartbeats, replies).
//!
//! Then a fresh state machine installs the snapshot, as a follower does (the
//! bytes copied into the file it receives into, which the install adopts),
//! with the same watch on the runtime. It prints those times and the allocation
//! peaks. Run it with
//! `SNAPSHOT_LEASES=1000000 cargo nextest run -p fencelock-server --release snapshot_scale:: --run-ignored only --no-capture`.
//!
//! Its checks are the state's: the snapshot is at the last entry applied
//! before it (not the grant applied during it), the follower holds every
//! lease of it, and so does the state machine opened again from the data dir.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fencelock_core::{Acquire, Command, Input, LeaseId, Reply, RequestId};
use fencelock_server::raft::{open_storage, StateMachine, TypeConfig};
use openraft::storage::RaftStateMachine;
use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId, RaftSnapshotBuilder, Snapshot};

/// The system allocator, counting the bytes it holds and their peak.
struct Counting;

static HELD: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn add(n: usize) {
    let held = HELD.fetch_add(n, Ordering::Relaxed) + n;
    PEAK.fetch_max(held, Ordering::Relaxed);
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            add(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        HELD.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    /// Counted as the system does it: a large block grows in place (mremap),
    /// not as a second block beside the first.
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            if new_size >= layout.size() {
                add(new_size - layout.size());
            } else {
                HELD.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
            }
        }
        p
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Commands per entry, as the driver puts at most this many in one log entry.
const BATCH: usize = 4096;
const HOUR_MS: u64 = 3_600_000;

/// The one clock of this file: the times are what is measured here, they
/// never reach the engine.
#[allow(clippy::disallowed_methods)]
fn now() -> Instant {
    Instant::now()
}

/// Resets the peak to what is held now; the peak from here on, above it.
fn peak_from_here() -> impl FnOnce() -> usize {
    let base = HELD.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    move || PEAK.load(Ordering::Relaxed) - base
}

fn log_id(index: u64) -> LogId<u64> {
    LogId::new(CommittedLeaderId::new(1, 1), index)
}

/// Applies `cmds` as the entry at `index`; its replies.
async fn apply(sm: &mut StateMachine, index: u64, cmds: Vec<Command>) -> Vec<Reply> {
    let input = Input::Batch { now: index, cmds };
    let entry = Entry::<TypeConfig> { log_id: log_id(index), payload: EntryPayload::Normal(input.into()) };
    sm.apply([entry]).await.expect("apply").pop().expect("one output").replies
}

/// `n` one-hour leases, each holding the lock `w3/<its id>`, applied from
/// index 1 on; the index of the last entry.
async fn fill(sm: &mut StateMachine, n: u64) -> u64 {
    let mut index = 0;
    for chunk in (0..n).collect::<Vec<_>>().chunks(BATCH) {
        index += 1;
        let grants = chunk.iter().map(|&i| Command::GrantLease { req: RequestId(i + 1), ttl_ms: HOUR_MS, id: None });
        let mut leases = Vec::with_capacity(chunk.len());
        for reply in apply(sm, index, grants.collect()).await {
            let Reply::LeaseGranted { lease, .. } = reply else { panic!("grant refused: {reply:?}") };
            leases.push(lease);
        }
        index += 1;
        let acquires = leases
            .iter()
            .map(|&LeaseId(l)| Command::Acquire(Acquire::exclusive(RequestId(1), LeaseId(l), format!("w3/{l}"), 0)));
        for reply in apply(sm, index, acquires.collect()).await {
            assert!(matches!(reply, Reply::Acquired(_)), "every lock is free: {reply:?}");
        }
    }
    index
}

/// A task that wakes every millisecond until `stop`; the longest gap between
/// two of its wake-ups.
fn gap_watch(stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<Duration> {
    tokio::spawn(async move {
        let mut longest = Duration::ZERO;
        let mut last = now();
        while !stop.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(1)).await;
            let t = now();
            longest = longest.max(t - last);
            last = t;
        }
        longest
    })
}

/// What [`gap_watch`] saw while `f` ran, and `f`'s result and seconds.
async fn watched<T>(f: impl std::future::Future<Output = T>) -> (T, f64, Duration) {
    let stop = Arc::new(AtomicBool::new(false));
    let gaps = gap_watch(stop.clone());
    tokio::time::sleep(Duration::from_millis(20)).await;
    let t = now();
    let out = f.await;
    let secs = t.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    (out, secs, gaps.await.expect("gap watch"))
}

/// Takes a snapshot of `sm` as openraft does while the grant of entry
/// `next` is committed; prints the costs and returns the snapshot.
async fn take_snapshot(sm: &mut StateMachine, next: u64, req: u64) -> Snapshot<TypeConfig> {
    let peak = peak_from_here();
    let ((built, builder_secs, grant_secs, build_secs), _, longest_gap) = watched(async {
        let t = now();
        let mut builder = sm.get_snapshot_builder().await;
        let builder_secs = t.elapsed().as_secs_f64();
        let build = tokio::spawn(async move {
            let t = now();
            (builder.build_snapshot().await.expect("build"), t.elapsed().as_secs_f64())
        });
        let grant = Command::GrantLease { req: RequestId(req), ttl_ms: HOUR_MS, id: None };
        let granted = apply(sm, next, vec![grant]).await;
        assert!(matches!(granted[..], [Reply::LeaseGranted { .. }]), "the grant during the snapshot: {granted:?}");
        let grant_secs = t.elapsed().as_secs_f64();
        let (snap, build_secs) = build.await.expect("build task");
        (snap, builder_secs, grant_secs, build_secs)
    })
    .await;
    let build_peak = peak();
    let snap = sm.get_current_snapshot().await.expect("read").expect("stored");
    assert_eq!(snap.meta.snapshot_id, built.meta.snapshot_id, "the snapshot built is the one stored");
    let bytes = std::fs::metadata(snap.snapshot.path()).expect("the snapshot's file").len();
    println!("snapshot of {bytes} bytes (stored):");
    println!("  get_snapshot_builder (applies wait):        {builder_secs:.3} s");
    println!("  a grant committed meanwhile, applied after: {grant_secs:.3} s");
    println!("  build_snapshot:                             {build_secs:.3} s");
    println!("  longest stall of the runtime's one thread:  {:.3} s", longest_gap.as_secs_f64());
    println!("  allocation peak above the state:            {:.1} MB", build_peak as f64 / 1e6);
    snap
}

/// Installs `snap` on the fresh state machine `sm`, as a follower does;
/// prints the costs.
async fn install(sm: &mut StateMachine, snap: Snapshot<TypeConfig>) {
    let peak = peak_from_here();
    let ((), secs, longest_gap) = watched(async {
        // The bytes arrive in the file to receive into, as chunks do; the
        // install adopts that file.
        let (meta, mut data) = (snap.meta, snap.snapshot);
        let mut rx = sm.begin_receiving_snapshot().await.expect("begin receiving");
        tokio::io::copy(&mut *data, &mut *rx).await.expect("receive");
        sm.install_snapshot(&meta, rx).await.expect("install");
    })
    .await;
    println!("installed on a follower (install_snapshot):");
    println!("  install_snapshot:                           {secs:.3} s");
    println!("  longest stall of the runtime's one thread:  {:.3} s", longest_gap.as_secs_f64());
    println!("  allocation peak above the state and data:   {:.1} MB", peak() as f64 / 1e6);
}

#[test]
#[ignore = "a measurement: run it in release with --run-ignored only --no-capture"]
fn snapshot_of_many_idle_leases() {
    let n: u64 = std::env::var("SNAPSHOT_LEASES").ok().and_then(|v| v.parse().ok()).unwrap_or(100_000);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    let (leader, follower) = (tempfile::tempdir().expect("tempdir"), tempfile::tempdir().expect("tempdir"));
    let (leader_path, follower_path) = (leader.path().to_owned(), follower.path().to_owned());
    // On tasks: `block_on`'s own future runs on this thread, not on the
    // runtime's one worker, where openraft's state-machine task runs.
    let snap = rt
        .block_on(rt.spawn(async move {
            let (_log, mut sm) = open_storage(&leader_path).expect("open");
            let t = now();
            let last = fill(&mut sm, n).await;
            println!("{n} idle leases with one lock each, applied in {:.1} s", t.elapsed().as_secs_f64());
            let first = take_snapshot(&mut sm, last + 1, n + 1).await;
            assert_eq!(first.meta.last_log_id, Some(log_id(last)), "the snapshot is at the entry applied before it");
            drop(first);
            println!("again, one entry later (a node that has stored a snapshot before):");
            let snap = take_snapshot(&mut sm, last + 2, n + 2).await;
            assert_eq!(snap.meta.last_log_id, Some(log_id(last + 1)), "the snapshot is at the entry before it");
            snap
        }))
        .expect("the leader's task");
    let snapshot_at = snap.meta.last_log_id;
    rt.block_on(rt.spawn(async move {
        let (_log, mut sm) = open_storage(&follower_path).expect("open the follower");
        install(&mut sm, snap).await;
        assert_eq!(sm.last_applied(), snapshot_at, "the follower is at the snapshot");
        assert_eq!(sm.engine().read().expect("engine").stats().leases, n + 1, "the follower has every lease");
    }))
    .expect("the follower's task");

    let (_log, sm) = open_storage(leader.path()).expect("open again");
    assert_eq!(sm.last_applied(), snapshot_at, "the stored snapshot is the one just built");
    assert_eq!(sm.engine().read().expect("engine").stats().leases, n + 1, "every lease of the snapshot is back");
}
