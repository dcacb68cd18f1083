//! INV-2, INV-8 and INV-10 under SIGKILL: with clients holding and waiting, the
//! server is killed and restarted 20 times. A lease held before a kill is still
//! held after it, with a fresh TTL counted from the restart; no token is issued
//! twice or goes down.

use crate::support;

use std::{
    collections::HashSet,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use fencelock::{Client, LockOptions, Outcome};
use support::Server;

const RESTARTS: usize = 20;
const WORKERS: usize = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_leases_and_tokens_survive_sigkill_restarts() {
    let tmp = tempfile::tempdir().unwrap();
    let mut server = Server::start(tmp.path());
    let client = Client::connect(&server.url()).await.unwrap();

    // A holder kept alive by the watchdog through every restart.
    let held = match client.lock("crash-held").ttl(Duration::from_secs(10)).acquire().await.unwrap() {
        Outcome::Acquired(g) => g,
        other => panic!("expected a grant, got {other:?}"),
    };

    // A lease nobody renews: after a restart its TTL counts again from the restart.
    let opts = LockOptions::default().ttl(Duration::from_secs(4));
    let detached = match client.acquire_detached("crash-detached", opts).await.unwrap() {
        Outcome::Acquired(a) => a,
        other => panic!("expected a grant, got {other:?}"),
    };
    tokio::time::sleep(Duration::from_millis(2500)).await;

    // Workers contend on another lock through all restarts and record their tokens.
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Vec::<(usize, u64)>::new()));
    let workers: Vec<_> =
        (0..WORKERS).map(|w| tokio::spawn(worker(w, client.clone(), stop.clone(), seen.clone()))).collect();

    for i in 0..RESTARTS {
        // Every restart comes after a grant since the one before (bounded at
        // 10 s), so tokens are compared across each kill whatever the load.
        let granted = seen.lock().unwrap().len();
        for _ in 0..200 {
            if seen.lock().unwrap().len() > granted {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
        tokio::task::block_in_place(|| server.restart());
        let info = client.describe("crash-held").await.expect("describe after restart");
        let h = info.holder.unwrap_or_else(|| panic!("restart {i}: held lock was lost:\n{}", server.log_text()));
        assert_eq!((h.lease_id, h.token), (held.lease_id(), held.token().unwrap()), "restart {i}: same holder");
        assert!(!held.is_lost(), "restart {i}: the holder's guard was told it lost the lease");
        if i == 0 {
            // 2.5 s of its 4 s TTL had passed before the kill; after the restart the
            // lease got a fresh full TTL from the restart (INV-8).
            let d = client.describe("crash-detached").await.unwrap();
            let h = d.holder.expect("detached lease still held after restart");
            assert_eq!(h.token, detached.token);
            assert!(h.ttl_left > Duration::from_millis(2000), "TTL counted from the restart, got {:?}", h.ttl_left);
        }
    }
    stop.store(true, Ordering::SeqCst);
    for w in workers {
        w.await.unwrap();
    }

    let seen = seen.lock().unwrap().clone();
    assert!(seen.len() >= RESTARTS, "workers made progress through restarts: {} grants", seen.len());
    let unique: HashSet<u64> = seen.iter().map(|(_, t)| *t).collect();
    assert_eq!(unique.len(), seen.len(), "a token was issued twice");
    for w in 0..WORKERS {
        let mine: Vec<u64> = seen.iter().filter(|(x, _)| *x == w).map(|(_, t)| *t).collect();
        assert!(mine.windows(2).all(|p| p[1] > p[0]), "worker {w}: tokens went down: {mine:?}");
    }
    assert!(seen.iter().all(|(_, t)| *t > held.token().unwrap()), "later grants have larger tokens");
    let last = match client.lock("crash-final").acquire().await.unwrap() {
        Outcome::Acquired(g) => g.token().unwrap(),
        other => panic!("{other:?}"),
    };
    assert!(unique.iter().all(|t| *t < last), "a fresh grant is above every token seen");
    assert!(held.release().await.unwrap(), "the holder still held its lock at the end");
}

/// Acquire (waiting), hold briefly, release; record every acknowledged token.
async fn worker(w: usize, client: Client, stop: Arc<AtomicBool>, seen: Arc<Mutex<Vec<(usize, u64)>>>) {
    while !stop.load(Ordering::SeqCst) {
        let req = client.lock("crash-busy").ttl(Duration::from_secs(5)).wait(Duration::from_secs(5));
        match req.acquire().await {
            Ok(Outcome::Acquired(g)) => {
                seen.lock().unwrap().push((w, g.token().unwrap()));
                tokio::time::sleep(Duration::from_millis(5)).await;
                let _ = g.release().await;
            }
            Ok(_) => {}
            // The server is down for a moment during each restart.
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}
