//! FileFence durability: reopen, torn tail, and SIGKILL of a process that is
//! admitting in a loop.

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;

use fencelock_fence::{Access, Fence, FenceError, Fenced, FileFence, Marks, Stale};

use crate::support::ChildGuard;

#[tokio::test]
async fn marks_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let fence = FileFence::open(dir.path()).await.unwrap();
        for (key, token) in [("a", 3), ("b", 10), ("a", 7), ("c", 1), ("b", 10)] {
            assert!(fence.admit(key, token).await.unwrap().is_admitted());
        }
        assert!(!fence.admit("a", 6).await.unwrap().is_admitted());
    }
    let fence = FileFence::open(dir.path()).await.unwrap();
    for (key, mark) in [("a", Some(7)), ("b", Some(10)), ("c", Some(1)), ("d", None)] {
        assert_eq!(fence.highest(key).await.unwrap(), mark, "key {key}");
    }
    assert_eq!(fence.admit("a", 6).await.unwrap(), Fenced::Stale(Stale { access: Access::Write, highest: 7, got: 6 }));
    assert!(fence.admit("a", 8).await.unwrap().is_admitted());
}

/// Both marks survive a reopen: a read raised `seen` above the last write,
/// and after the reopen the read rule and the write rule still tell them
/// apart.
#[tokio::test]
async fn read_marks_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let fence = FileFence::open(dir.path()).await.unwrap();
        assert!(fence.admit("a", 5).await.unwrap().is_admitted());
        assert!(fence.admit_read("a", 9).await.unwrap().is_admitted());
        assert!(fence.admit_read("a", 7).await.unwrap().is_admitted());
        assert!(fence.admit_read("r", 4).await.unwrap().is_admitted());
    }
    let fence = FileFence::open(dir.path()).await.unwrap();
    assert_eq!(fence.marks("a").await.unwrap(), Some(Marks { write: 5, seen: 9 }));
    assert_eq!(fence.marks("r").await.unwrap(), Some(Marks { write: 0, seen: 4 }));
    assert!(fence.admit_read("a", 6).await.unwrap().is_admitted(), "a reader at or above the last write");
    assert_eq!(fence.admit("a", 8).await.unwrap(), Fenced::Stale(Stale { access: Access::Write, highest: 9, got: 8 }));
    assert_eq!(
        fence.admit_read("a", 4).await.unwrap(),
        Fenced::Stale(Stale { access: Access::Read, highest: 5, got: 4 })
    );
}

#[tokio::test]
async fn a_torn_last_record_is_dropped_and_the_log_stays_usable() {
    let dir = tempfile::tempdir().unwrap();
    {
        let fence = FileFence::open(dir.path()).await.unwrap();
        assert!(fence.admit("a", 3).await.unwrap().is_admitted());
    }
    // A record cut after its header and two bytes of its token.
    let log = dir.path().join("fence.log");
    let mut f = OpenOptions::new().append(true).open(&log).unwrap();
    f.write_all(&[9, 0, 0, 0, 0xAA, 0xBB, 0xCC, 0xDD, 50, 0]).unwrap();
    drop(f);
    {
        let fence = FileFence::open(dir.path()).await.unwrap();
        assert_eq!(fence.highest("a").await.unwrap(), Some(3));
        assert!(fence.admit("a", 4).await.unwrap().is_admitted());
    }
    let fence = FileFence::open(dir.path()).await.unwrap();
    assert_eq!(fence.highest("a").await.unwrap(), Some(4));
}

#[tokio::test]
async fn a_corrupt_record_before_the_end_fails_closed() {
    let dir = tempfile::tempdir().unwrap();
    {
        let fence = FileFence::open(dir.path()).await.unwrap();
        assert!(fence.admit("a", 3).await.unwrap().is_admitted());
        assert!(fence.admit("a", 5).await.unwrap().is_admitted());
    }
    let log = dir.path().join("fence.log");
    let mut bytes = std::fs::read(&log).unwrap();
    bytes[8 + 8] ^= 0x01; // the first record's token
    std::fs::write(&log, bytes).unwrap();
    assert!(matches!(FileFence::open(dir.path()).await, Err(FenceError::Corrupt(_))));
}

const CHILD_DIR_ENV: &str = "FENCELOCK_FENCE_TEST_SIGKILL_DIR";
const CHILD_KEYS: [&str; 4] = ["k0", "k1", "k2", "k3"];

/// Runs only as the child of `marks_survive_sigkill`: admit rising tokens on
/// four keys, four tasks at once, printing each admit after it returned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_child_admits_in_a_loop() {
    let Ok(dir) = std::env::var(CHILD_DIR_ENV) else {
        return;
    };
    let fence = FileFence::open(&dir).await.unwrap();
    let mut tasks = Vec::new();
    for key in CHILD_KEYS {
        let fence = fence.clone();
        tasks.push(tokio::spawn(async move {
            let mut token = fence.highest(key).await.unwrap().unwrap_or(0);
            loop {
                token += 1;
                assert!(fence.admit(key, token).await.unwrap().is_admitted());
                let mut out = std::io::stdout().lock();
                writeln!(out, "ADMITTED {key} {token}").unwrap();
                out.flush().unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
}

/// Start the child on `dir`, let it report `admits` admits, SIGKILL it, and
/// return the highest token it reported per key.
fn run_child_and_kill(dir: &Path, admits: usize) -> HashMap<String, u64> {
    let mut child = ChildGuard::spawn_test("file_fence::sigkill_child_admits_in_a_loop", CHILD_DIR_ENV, dir);
    let mut reported = HashMap::new();
    let mut lines = BufReader::new(child.0.stdout.take().unwrap()).lines();
    let mut seen = 0;
    for line in lines.by_ref() {
        if record(&mut reported, &line.unwrap()) {
            seen += 1;
            if seen == admits {
                let _ = child.0.kill(); // SIGKILL
                break;
            }
        }
    }
    for line in lines {
        // What the child printed before the signal landed counts as reported.
        let Ok(line) = line else { break };
        record(&mut reported, &line);
    }
    let status = child.kill();
    assert_eq!(status.signal(), Some(9), "the child must die of SIGKILL, not {status}");
    reported
}

fn record(reported: &mut HashMap<String, u64>, line: &str) -> bool {
    // libtest may print "test … " on the same line before the first report.
    let Some((_, rest)) = line.split_once("ADMITTED ") else {
        return false;
    };
    let (key, token) = rest.split_once(' ').unwrap();
    let token: u64 = token.parse().unwrap();
    let mark = reported.entry(key.to_owned()).or_insert(0);
    *mark = (*mark).max(token);
    true
}

/// A real SIGKILL of a process admitting in a loop, three times over: after
/// each, every reported admit is durable (mark ≥ reported) and at most the
/// one admit in flight per key went unreported (mark ≤ reported + 1).
#[tokio::test]
async fn marks_survive_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let mut last: HashMap<String, u64> = HashMap::new();
    for round in 1..=3 {
        let reported = tokio::task::spawn_blocking({
            let dir = dir.path().to_owned();
            move || run_child_and_kill(&dir, 200)
        })
        .await
        .unwrap();
        let fence = FileFence::open(dir.path()).await.unwrap();
        for key in CHILD_KEYS {
            let mark = fence.highest(key).await.unwrap().unwrap_or(0);
            let was = last.get(key).copied().unwrap_or(0);
            let told = reported.get(key).copied().unwrap_or(was);
            assert!(mark >= told, "round {round}, {key}: mark {mark} below reported admit {told}");
            assert!(mark <= told + 1, "round {round}, {key}: mark {mark} beyond reported {told} + 1 in flight");
            if mark > 1 {
                assert_eq!(
                    fence.admit(key, mark - 1).await.unwrap(),
                    Fenced::Stale(Stale { access: Access::Write, highest: mark, got: mark - 1 })
                );
            }
            last.insert(key.to_owned(), mark);
        }
        assert!(reported.values().sum::<u64>() > 0, "round {round}: the child admitted nothing");
    }
}
