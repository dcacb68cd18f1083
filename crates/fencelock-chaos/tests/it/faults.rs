//! The faults of `fencelock_chaos::faults`, end to end: a real server in this
//! process, served as `fencelock-chaos serve` serves it (the faults of the
//! environment plugged into its seams), on a temp dir, and the raw gRPC client.
//!
//! Each mutant test proves that the mutant breaks the invariant it names, and the
//! control tests that the same steps keep it without the env var (so the faults
//! are inert unless asked for). Env vars are set at a test's start: nextest runs
//! each test in its own process.
//!
//! - INV-2 tokens strictly increase across all grants, never reused (restarts
//!   included).
//! - INV-4 no grant to an expired lease.

use std::time::Duration;

use fencelock_chaos::faults::{self, Armed};
use fencelock_proto::v1::{self as pb, acquire_response::Outcome, lock_client::LockClient};
use fencelock_server::{Config, Running};

type Client = LockClient<tonic::transport::Channel>;

fn request_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// The faults armed by the environment, as `fencelock-chaos serve` reads them;
/// their lines.
fn arm() -> Result<(Armed, Vec<String>), String> {
    let armed = Armed::from_env()?;
    let lines = armed.lines.clone();
    Ok((armed, lines))
}

/// Serve `dir/data` with the faults of the environment plugged in. Right after
/// an in-process shutdown the database may still be held for a moment, so
/// "already in use" is retried for a while.
async fn start(dir: &std::path::Path) -> (Running, Client) {
    let (armed, _) = arm().expect("faults from the environment");
    let mut tries = 0;
    let running = loop {
        let mut config = Config::for_test(dir.join("data"));
        let clock = armed.plug(&mut config);
        let listeners = fencelock_server::Listeners::bind(&config).expect("bind");
        match fencelock_server::serve(config, listeners, clock, std::future::pending()).await {
            Ok(r) => break r,
            Err(e) if tries < 100 && still_held(&e) => tries += 1,
            Err(e) => panic!("server start: {e:?}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let client = LockClient::connect(format!("http://{}", running.grpc_addr)).await.expect("connect");
    (running, client)
}

/// A new lease, retried while the node is not serving yet.
async fn lease(c: &mut Client, ttl_ms: u64) -> u64 {
    for _ in 0..200 {
        let req = pb::GrantLeaseRequest { request_id: request_id(), ttl_ms };
        if let Ok(r) = c.grant_lease(req).await {
            return r.into_inner().lease_id;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("no lease: the server did not become ready");
}

async fn acquire(c: &mut Client, lease_id: u64, lock: &str, wait_ms: u64) -> Result<Option<Outcome>, tonic::Status> {
    let req = pb::AcquireRequest {
        request_id: request_id(),
        lease_id,
        lock: lock.into(),
        wait_ms,
        lock_delay_ms: 0,
        ..Default::default()
    };
    Ok(c.acquire(req).await?.into_inner().outcome)
}

/// The token of a grant of a free lock.
async fn token(c: &mut Client, lease_id: u64, lock: &str) -> u64 {
    match acquire(c, lease_id, lock, 0).await {
        Ok(Some(Outcome::Acquired(a))) => a.token,
        other => panic!("acquire of the free lock {lock}: {other:?}"),
    }
}

/// Tokens of three grants, then of the first grant after a restart on the same
/// data directory.
async fn tokens_across_a_restart() -> (Vec<u64>, u64) {
    let dir = tempfile::tempdir().unwrap();
    let (running, mut c) = start(dir.path()).await;
    let l = lease(&mut c, 60_000).await;
    let mut before = Vec::new();
    for lock in ["a", "b", "c"] {
        before.push(token(&mut c, l, lock).await);
    }
    running.shutdown().await;
    let (running, mut c) = start(dir.path()).await;
    let l = lease(&mut c, 60_000).await;
    let after = token(&mut c, l, "d").await;
    running.shutdown().await;
    (before, after)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inv2_holds_without_a_mutant_tokens_keep_increasing_across_a_restart() {
    std::env::remove_var(faults::ENV_MUTANT);
    assert_eq!(arm().map(|a| a.1), Ok(vec![]), "nothing is active without the env vars");
    let (before, after) = tokens_across_a_restart().await;
    assert!(before.windows(2).all(|w| w[1] == w[0] + 1), "one token per grant: {before:?}");
    assert!(after > before[2], "INV-2: token {after} after the restart, {} before", before[2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inv2_broken_by_memory_token_mutant_the_first_token_after_a_restart_is_lower() {
    std::env::set_var(faults::ENV_MUTANT, "memory-token");
    assert_eq!(arm().map(|a| a.1), Ok(vec!["mutant memory-token".to_string()]));
    let (before, after) = tokens_across_a_restart().await;
    assert!(before.windows(2).all(|w| w[1] == w[0] + 1), "the mutant changes nothing before a restart: {before:?}");
    assert!(
        after < before[2],
        "the mutant must make the token go back: {after} after the restart, {} before",
        before[2]
    );
}

#[test]
fn an_unknown_mutant_is_an_error() {
    std::env::set_var(faults::ENV_MUTANT, "memory-token,no-such-bug");
    let err = arm().unwrap_err();
    assert!(err.contains("no-such-bug"), "{err}");
}

/// Lease 1 holds "x"; lease 2 (TTL 300 ms, never kept alive) queues for it; once
/// lease 2 has expired, lease 1 releases. Returns the outcome of lease 2's acquire.
async fn release_to_an_expired_waiter() -> Result<Option<Outcome>, tonic::Status> {
    let dir = tempfile::tempdir().unwrap();
    let (running, mut c) = start(dir.path()).await;
    let holder = lease(&mut c, 60_000).await;
    let t = token(&mut c, holder, "x").await;
    let waiter = lease(&mut c, 300).await;
    let mut wc = c.clone();
    let waiting = tokio::spawn(async move { acquire(&mut wc, waiter, "x", 10_000).await });
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let req = pb::ReleaseRequest { request_id: request_id(), lease_id: holder, lock: "x".into(), token: t };
    assert!(c.release(req).await.unwrap().into_inner().released);
    let outcome = tokio::time::timeout(Duration::from_secs(5), waiting).await.expect("the waiter is answered");
    running.shutdown().await;
    outcome.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inv4_holds_without_a_mutant_an_expired_waiter_is_not_granted() {
    std::env::remove_var(faults::ENV_MUTANT);
    arm().unwrap();
    let status = release_to_an_expired_waiter().await.expect_err("the waiter's lease ended");
    assert_eq!(status.code(), tonic::Code::NotFound, "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inv4_broken_by_dead_waiter_mutant_an_expired_waiter_is_granted() {
    std::env::set_var(faults::ENV_MUTANT, "dead-waiter");
    assert_eq!(arm().map(|a| a.1), Ok(vec!["mutant dead-waiter".to_string()]));
    match release_to_an_expired_waiter().await {
        // The expired lease got the lock (its token: the next after the holder's).
        Ok(Some(Outcome::Acquired(_))) => {}
        other => panic!("the mutant must grant the lock to the expired waiter: {other:?}"),
    }
}

/// The lock's holder's TTL left, as the server sees it.
async fn ttl_left(c: &mut Client, lock: &str) -> u64 {
    let r = c.describe_lock(pb::DescribeLockRequest { lock: lock.into() }).await.unwrap().into_inner();
    r.lock.and_then(|l| l.holder).map(|h| h.ttl_left_ms).expect("held")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_clock_jump_moves_the_servers_time_forward() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("clock");
    std::fs::write(&file, "rate=1 jump_ms=0\n").unwrap();
    std::env::set_var(faults::ENV_FAULT_CLOCK, &file);
    let active = arm().unwrap().1;
    assert_eq!(active, vec![format!("fault-clock {}", file.display())]);
    let (running, mut c) = start(&dir.path().join("data")).await;
    let l = lease(&mut c, 60_000).await;
    token(&mut c, l, "x").await;
    let before = ttl_left(&mut c, "x").await;
    assert!(before > 55_000, "{before}");
    let tmp = dir.path().join("clock.tmp");
    std::fs::write(&tmp, "rate=1 jump_ms=30000\n").unwrap();
    std::fs::rename(&tmp, &file).unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let after = ttl_left(&mut c, "x").await;
    assert!(after <= before - 30_000 && after > 20_000, "a 30 s jump: {before} ms left before, {after} after");
    running.shutdown().await;
}

/// Set in the child process of [`a_failpoint_that_returns_aborts_the_process`]:
/// its data directory.
const CHILD_DIR: &str = "FAULTS_TEST_CHILD_DIR";

/// Each crash point, set to `return`, aborts a server process at its first pass
/// (all four are passed while a new node initializes and takes the lead), and the
/// data directory it leaves behind starts and serves again.
#[test]
fn a_failpoint_that_returns_aborts_the_process() {
    use std::os::unix::process::ExitStatusExt;
    use std::process::{Command, Stdio};
    const TEST: &str = "a_failpoint_that_returns_aborts_the_process";
    if let Ok(dir) = std::env::var(CHILD_DIR) {
        return serve_until_crash(std::path::Path::new(&dir));
    }
    let tmp = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    for point in fencelock_server::seams::CrashPoint::ALL.map(|p| p.name()) {
        let dir = tmp.path().join(point);
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                &fencelock_testkit::test_name(module_path!(), TEST),
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env(CHILD_DIR, &dir)
            .env(faults::ENV_FAILPOINTS, format!("{point}=return"))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let out = wait_with_timeout(&mut child, Duration::from_secs(20));
        let stderr = std::io::read_to_string(child.stderr.take().unwrap()).unwrap_or_default();
        assert_eq!(out.signal(), Some(6), "{point}: the child must abort (SIGABRT), got {out:?}; stderr:\n{stderr}");
        assert!(stderr.contains(&format!("failpoint {point} fired")), "{point}: stderr:\n{stderr}");
        // The crash leaves a data directory that starts and serves.
        rt.block_on(async {
            let (running, mut c) = start(&dir).await;
            let l = lease(&mut c, 60_000).await;
            token(&mut c, l, "after-crash").await;
            running.shutdown().await;
        });
    }
}

fn wait_with_timeout(child: &mut std::process::Child, limit: Duration) -> std::process::ExitStatus {
    for _ in 0..limit.as_millis() / 20 {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    panic!("the child did not crash within {limit:?}");
}

/// The child: configure the failpoints, start, and serve a grant; it should abort
/// on the way.
fn serve_until_crash(dir: &std::path::Path) {
    let active = arm().unwrap().1;
    assert_eq!(active.len(), 1, "{active:?}");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let (_running, mut c) = start(dir).await;
        let l = lease(&mut c, 60_000).await;
        token(&mut c, l, "x").await;
        tokio::time::sleep(Duration::from_secs(5)).await;
    });
    panic!("the failpoint did not fire");
}

/// Whether the database of a start that failed is still held (by the server
/// just shut down in this process): said by the error or one of its sources.
fn still_held(e: &fencelock_server::ServerError) -> bool {
    let mut next: Option<&dyn std::error::Error> = Some(e);
    while let Some(err) = next {
        if err.to_string().contains("already in use") {
            return true;
        }
        next = err.source();
    }
    false
}
