//! Scenario S5, simulated power loss, end to end, on a node whose Raft log is in
//! redb (`log = "redb"`: every write is the database's).
//!
//! Invariant: a node that loses power (SIGKILL, then every database byte not yet
//! fsynced is dropped and the newest unsynced write is torn) boots again and has lost
//! nothing it acknowledged: every grant it answered is still held by the same lease
//! with the same token, and every token granted after the loss is greater than every
//! token acknowledged before it.
//!
//! The server runs in a child process (this test binary run again with
//! `PL_SERVER_DIR` set) with `FENCELOCK_POWER_LOSS_SHIM=1`, served as
//! `fencelock-chaos serve` serves it (the faults of the environment plugged in). Clients take leases and
//! locks under load; the parent watches the shim's undo file and SIGKILLs the child
//! while it is non-empty (a commit has written but not yet fsynced), calls
//! `power_loss::simulate` with the round's seed, restarts the child on the same data
//! directory and checks. The test fails if no round dropped any unsynced write.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use fencelock_chaos::faults::power_loss::{self, PowerLoss};
use fencelock_proto::v1::{self as pb, acquire_response::Outcome, lock_client::LockClient};
use tonic::transport::Channel;

const TEST: &str = "acknowledged_grants_survive_simulated_power_loss";
const CHILD_ENV: &str = "PL_SERVER_DIR";
const ROUNDS: u64 = 4;
const LOADERS: usize = 3;
const TTL_MS: u64 = 120_000;

/// Every grant the server acknowledged: (lock, lease, token).
type Acked = Arc<Mutex<Vec<(String, u64, u64)>>>;

static REQUEST_ID: AtomicU64 = AtomicU64::new(1);

fn request_id() -> u64 {
    REQUEST_ID.fetch_add(1, Ordering::Relaxed)
}

#[test]
fn acknowledged_grants_survive_simulated_power_loss() {
    if let Ok(dir) = std::env::var(CHILD_ENV) {
        return serve(Path::new(&dir));
    }
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(run(tmp.path(), &data));
}

async fn run(tmp: &Path, data: &Path) {
    let acked: Acked = Arc::default();
    let mut losses: Vec<PowerLoss> = Vec::new();
    for round in 0..=ROUNDS {
        let log = tmp.join(format!("server-{round}.log"));
        let (mut child, addr) = spawn(data, &log);
        let mut client = connect(&addr).await;
        let context = format!("round {round} after losses {}", serde_json::to_string(&losses).unwrap());

        // Nothing acknowledged before the loss was lost.
        let before = acked.lock().unwrap().clone();
        for (lock, lease, token) in &before {
            let holder = describe(&mut client, lock).await;
            assert_eq!(holder, Some((*lease, *token)), "{context}: acknowledged grant of {lock} lost");
        }
        // A grant after the loss gets a token above every acknowledged one.
        let max_before = before.iter().map(|g| g.2).max().unwrap_or(0);
        let probe = grant_and_acquire(&mut client, &format!("probe-{round}")).await.expect("probe grant");
        assert!(probe.2 > max_before, "{context}: token {} after the loss, {max_before} acknowledged", probe.2);
        if round == 0 {
            assert!(power_loss::undo_path(&power_loss::db_path(data)).exists(), "the shim is active");
        }
        acked.lock().unwrap().push(probe);
        if round == ROUNDS {
            child.kill().unwrap();
            child.wait().unwrap();
            break;
        }

        // Load: leases and fresh locks, each acknowledged grant recorded.
        let loaders: Vec<_> = (0..LOADERS)
            .map(|l| {
                let (client, acked) = (client.clone(), acked.clone());
                tokio::spawn(load(client, format!("load-{round}-{l}"), acked))
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(150)).await;
        let undo = power_loss::undo_path(&power_loss::db_path(data));
        let dirty = tokio::task::spawn_blocking(move || {
            let dirty = kill_while_dirty(&mut child, &undo);
            child.wait().unwrap();
            dirty
        })
        .await
        .unwrap();
        for l in loaders {
            l.await.unwrap();
        }

        let loss = power_loss::simulate(data, 0x5eed ^ round).unwrap();
        println!(
            "round {round}: killed {}, {} grants acknowledged so far, loss {}",
            if dirty { "with unsynced writes (undo file non-empty)" } else { "after 3 s, undo file empty" },
            acked.lock().unwrap().len(),
            serde_json::to_string(&loss).unwrap()
        );
        losses.push(loss);
    }
    let acked = acked.lock().unwrap();
    let mut tokens: Vec<u64> = acked.iter().map(|g| g.2).collect();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), acked.len(), "a token was granted twice");
    assert!(
        losses.iter().any(|l| l.undone_writes > 0),
        "no round dropped an unsynced write, the test proved nothing: {losses:?}"
    );
}

/// SIGKILLs `child` as soon as the undo file is non-empty (unsynced writes exist), or
/// after about 3 s regardless. Returns whether it was non-empty.
fn kill_while_dirty(child: &mut Child, undo: &Path) -> bool {
    let mut dirty = false;
    for _ in 0..30_000 {
        if std::fs::metadata(undo).is_ok_and(|m| m.len() > 0) {
            dirty = true;
            break;
        }
        std::thread::sleep(Duration::from_micros(100));
    }
    child.kill().unwrap();
    dirty
}

/// Grants leases and acquires fresh locks until the server goes away.
async fn load(mut client: LockClient<Channel>, prefix: String, acked: Acked) {
    for i in 0.. {
        match grant_and_acquire_once(&mut client, &format!("{prefix}-{i}")).await {
            Some(g) => acked.lock().unwrap().push(g),
            None => return,
        }
    }
}

/// One lease and one lock on it, retried while the node has no leader yet.
async fn grant_and_acquire(client: &mut LockClient<Channel>, lock: &str) -> Option<(String, u64, u64)> {
    for _ in 0..100 {
        if let Some(g) = grant_and_acquire_once(client, lock).await {
            return Some(g);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

async fn grant_and_acquire_once(client: &mut LockClient<Channel>, lock: &str) -> Option<(String, u64, u64)> {
    let lease = client
        .grant_lease(pb::GrantLeaseRequest { request_id: request_id(), ttl_ms: TTL_MS })
        .await
        .ok()?
        .into_inner()
        .lease_id;
    let req = pb::AcquireRequest { request_id: request_id(), lease_id: lease, lock: lock.into(), ..Default::default() };
    match client.acquire(req).await.ok()?.into_inner().outcome {
        Some(Outcome::Acquired(a)) => Some((a.lock, a.lease_id, a.token)),
        other => panic!("fresh lock {lock} not granted: {other:?}"),
    }
}

/// The holder of `lock` as (lease, token), retried while the node has no leader yet.
async fn describe(client: &mut LockClient<Channel>, lock: &str) -> Option<(u64, u64)> {
    for _ in 0..100 {
        if let Ok(r) = client.describe_lock(pb::DescribeLockRequest { lock: lock.into() }).await {
            return r.into_inner().lock.and_then(|l| l.holder).map(|h| (h.lease_id, h.token));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("describe {lock}: no answer");
}

async fn connect(addr: &str) -> LockClient<Channel> {
    for _ in 0..100 {
        if let Ok(c) = LockClient::connect(format!("http://{addr}")).await {
            return c;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("cannot connect to {addr}");
}

/// Starts the server child on `data` with the shim; its stderr goes to `log`.
fn spawn(data: &Path, log: &Path) -> (Child, String) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", &fencelock_testkit::test_name(module_path!(), TEST), "--nocapture", "--test-threads", "1"])
        .env(CHILD_ENV, data)
        .env(power_loss::ENV_SHIM, "1")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in out.lines().map_while(Result::ok) {
            // libtest's "test <name> ... " may precede it on the same line.
            if let Some((_, addr)) = line.split_once("PL_ADDR ") {
                let _ = tx.send(addr.trim().to_string());
            }
        }
    });
    match rx.recv_timeout(Duration::from_secs(15)) {
        Ok(addr) => (child, addr),
        Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the server did not boot:\n{}", std::fs::read_to_string(log).unwrap_or_default());
        }
    }
}

/// The child: serve `dir` until killed.
fn serve(dir: &Path) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let armed = fencelock_chaos::faults::Armed::from_env().expect("faults from the environment");
        assert!(armed.lines.iter().any(|l| l.contains("power-loss")), "{:?}", armed.lines);
        let mut config = fencelock_server::Config::for_test(PathBuf::from(dir));
        // The database's power loss: the log in redb, whose writes the undo
        // file this test watches journals (the segment log's power loss is
        // `wal_undo`'s tests' and S5's).
        config.log = fencelock_server::LogEngine::Redb;
        let clock = armed.plug(&mut config);
        let listeners = fencelock_server::Listeners::bind(&config).expect("bind");
        let running = fencelock_server::serve(config, listeners, clock, std::future::pending())
            .await
            .expect("server start after a simulated power loss");
        println!("PL_ADDR {}", running.grpc_addr);
        std::future::pending::<()>().await;
    });
}
