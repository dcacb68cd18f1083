//! One identity floods a node (issue 15, quotas): for 15 s it creates leases
//! and queued acquires as fast as 64 concurrent callers can. Its quota stops
//! it (RESOURCE_EXHAUSTED naming the limit), the node's state and memory stay
//! bounded, and another identity keeps acquiring and releasing all along.
//!
//! The bound: the flooding identity's quota is 2,000 leases, 2,000 held
//! locks and 2,000 queued acquires. Its state stays within the quota plus
//! the requests it has in flight (64 callers), and the process (node and
//! clients together) grows by less than 256 MiB. Before quotas, 210k leases
//! each holding a lock took 1.29 GB.
#![allow(clippy::disallowed_methods)] // the flood runs for a stated time

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fencelock_proto::v1::{self as pb, lock_client::LockClient};
use fencelock_server::{quota, Config};
use tonic::Code;

use crate::support;
use support::{add_token, request_id, Authed, Bearer};

const FLOOD: Duration = Duration::from_secs(15);
const CALLERS: usize = 64;
const QUOTA: u64 = 2_000;

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<u64>().ok());
    kb.unwrap_or(0) * 1024
}

async fn client(addr: std::net::SocketAddr, token: &str) -> Authed {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap().connect().await.unwrap();
    LockClient::with_interceptor(channel, Bearer(Some(token.to_string())))
}

async fn grant(c: &mut Authed) -> Result<u64, tonic::Status> {
    let r = c.grant_lease(pb::GrantLeaseRequest { request_id: request_id(), ttl_ms: 60_000 }).await?;
    Ok(r.into_inner().lease_id)
}

fn acquire(lease: u64, lock: &str, wait_ms: u64) -> pb::AcquireRequest {
    pb::AcquireRequest {
        request_id: request_id(),
        lease_id: lease,
        lock: lock.into(),
        wait_ms,
        lock_delay_ms: 0,
        ..Default::default()
    }
}

/// One flooding caller until `end`: a lease, a try on a lock of its own and
/// a queued acquire of a lock that is always held, again and again; counts
/// what the quota refused.
async fn flood(mut c: Authed, n: usize, end: Instant, refused: Arc<AtomicU64>) {
    let mut i = 0u64;
    while Instant::now() < end {
        i += 1;
        let lease = match grant(&mut c).await {
            Ok(l) => l,
            Err(s) => {
                assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
                refused.fetch_add(1, Relaxed);
                continue;
            }
        };
        if let Err(s) = c.acquire(acquire(lease, &format!("flood/{n}/{i}"), 0)).await {
            assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
            refused.fetch_add(1, Relaxed);
        }
        // A queued acquire holds its call until it ends: send it and move on
        // (it ends when the flood is over and the node stops).
        let mut queued = c.clone();
        let r = acquire(lease, "flood/hot", 60_000);
        let counter = refused.clone();
        tokio::spawn(async move {
            if let Err(s) = queued.acquire(r).await {
                if s.code() == Code::ResourceExhausted {
                    counter.fetch_add(1, Relaxed);
                }
            }
        });
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooding_identity_is_held_to_its_quota_and_others_keep_acquiring() {
    let dir = tempfile::tempdir().unwrap();
    let mut text = String::from("[roles.worker]\nrules = [{ prefix = \"\", verbs = [\"acquire\", \"read\"] }]\n");
    let flooder = add_token(&mut text, "flooder", "worker");
    let steady = add_token(&mut text, "steady", "worker");
    std::fs::write(dir.path().join("auth.toml"), text).unwrap();
    let mut config = Config::for_test(dir.path().join("data"));
    config.auth_file = Some(dir.path().join("auth.toml"));
    config.limits.per_identity = quota::Quota { leases: QUOTA, locks: QUOTA, waits: QUOTA, rps: 0 };
    let running = fencelock_server::start(config).await.expect("start");
    let addr = running.grpc_addr;

    // The hot lock is held for the whole flood, so every queued acquire waits.
    let mut s = client(addr, &steady).await;
    let holder = loop {
        match grant(&mut s).await {
            Ok(l) => break l,
            Err(_) => tokio::time::sleep(Duration::from_millis(25)).await,
        }
    };
    s.acquire(acquire(holder, "flood/hot", 0)).await.expect("the hot lock");
    let rss_before = rss_bytes();

    let end = Instant::now() + FLOOD;
    let refused = Arc::new(AtomicU64::new(0));
    let mut flooders = Vec::new();
    for n in 0..CALLERS {
        flooders.push(tokio::spawn(flood(client(addr, &flooder).await, n, end, refused.clone())));
    }

    // Meanwhile the other identity takes and gives back a lock, again and
    // again (pausing 100 ms), and the peak state and memory are sampled.
    let (mut ok, mut tries, mut peak_rss) = (0, 0, 0);
    let mut peak = fencelock_core::Stats::default();
    while Instant::now() < end {
        tries += 1;
        let lease = grant(&mut s).await;
        if let Ok(lease) = lease {
            let got = s.acquire(acquire(lease, "steady/x", 0)).await.map(|r| r.into_inner().outcome);
            if let Ok(Some(pb::acquire_response::Outcome::Acquired(a))) = got {
                let rel = pb::ReleaseRequest {
                    request_id: request_id(),
                    lease_id: lease,
                    lock: "steady/x".into(),
                    token: a.token,
                };
                ok += usize::from(s.release(rel).await.is_ok_and(|r| r.into_inner().released));
            }
            let _ = s.revoke_lease(pb::RevokeLeaseRequest { request_id: request_id(), lease_id: lease }).await;
        }
        peak_rss = peak_rss.max(rss_bytes());
        let now = running.stats();
        peak.leases = peak.leases.max(now.leases);
        peak.waiters = peak.waiters.max(now.waiters);
        peak.held_locks = peak.held_locks.max(now.held_locks);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for f in flooders {
        f.await.expect("a flooding caller panicked");
    }
    let refused = refused.load(Relaxed);
    let grown = peak_rss.saturating_sub(rss_before);
    println!(
        "flood of {}s by {CALLERS} callers: {refused} requests refused by the quota; peak state {} leases, {} held, {} queued; RSS grew {} MiB; the other identity: {ok}/{tries} acquire+release",
        FLOOD.as_secs(),
        peak.leases,
        peak.held_locks,
        peak.waiters,
        grown >> 20
    );
    assert!(refused > 0, "the flood never reached its quota");
    let slack = CALLERS as u64;
    assert!(peak.leases <= QUOTA + 2 + slack, "leases {} over the quota", peak.leases);
    assert!(peak.waiters <= QUOTA + slack, "queued acquires {} over the quota", peak.waiters);
    assert!(peak.held_locks <= QUOTA + 1 + slack, "held locks {} over the quota", peak.held_locks);
    assert!(grown < 256 << 20, "memory grew by {} MiB", grown >> 20);
    assert!(ok * 10 >= tries * 9, "the other identity was held up: {ok} of {tries}");
    running.shutdown().await;
}
