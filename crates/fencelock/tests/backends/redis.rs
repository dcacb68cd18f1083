//! Redis (one server) as a conformance target, without persistence and in
//! `durable=true` mode on a server with `appendfsync always`, and the tests
//! of what only the Redis backend does: the durable-mode check, what a
//! restart does to the tokens, and the FIFO ticket queue (only the next
//! waiter is woken, dead and dropped waiters are skipped, a try never
//! overtakes a waiter), and the election (the holder key, a candidate that
//! lost its place, an expiry seen by an observer). The queue tests read the
//! backend's keys (`fencelock:queue:{name}`, `fencelock:waiter:{ticket}`,
//! `fencelock:holder:{name}`) directly.

use std::time::Duration;

use fencelock::backend::{self, Capabilities, Fencing};
use fencelock::{Backend, Error, Leader, LeaderEvent, LeaseLost, Outcome};
use fencelock_testkit::proxy::{Mode, Proxy};
use fencelock_testkit::RedisServer;
use redis::aio::MultiplexedConnection;
use tokio::sync::{mpsc, oneshot};

use crate::suite::{self, opts, within, Target, MS, SECS};

/// A Redis server without persistence (Redis as a cache).
pub struct Volatile {
    server: RedisServer,
}

impl Target for Volatile {
    async fn start() -> Volatile {
        Volatile { server: start_server(false).await }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.server.port())
    }

    async fn via_proxies(&self) -> (String, Vec<Proxy>) {
        suite::through_proxy("redis://", self.server.port(), "").await
    }

    fn short_ttl(&self) -> Duration {
        500 * MS
    }

    async fn waiters(&self, lock: &str) -> Option<usize> {
        Some(queue_len(&mut inspect(&self.server).await, lock).await)
    }
}

crate::conformance!(Volatile);

/// The suite again in `durable=true` mode, on a server with AOF and
/// `appendfsync always`.
mod durable {
    use super::*;

    pub struct Durable {
        server: RedisServer,
    }

    impl Target for Durable {
        async fn start() -> Durable {
            Durable { server: start_server(true).await }
        }

        fn url(&self) -> String {
            format!("redis://127.0.0.1:{}?durable=true", self.server.port())
        }

        async fn via_proxies(&self) -> (String, Vec<Proxy>) {
            suite::through_proxy("redis://", self.server.port(), "?durable=true").await
        }

        fn short_ttl(&self) -> Duration {
            500 * MS
        }

        async fn waiters(&self, lock: &str) -> Option<usize> {
            Some(queue_len(&mut inspect(&self.server).await, lock).await)
        }
    }

    crate::conformance!(Durable);
}

/// Starts a durable (AOF, `appendfsync always`) or volatile server.
async fn start_server(durable: bool) -> RedisServer {
    let start = if durable { RedisServer::start } else { RedisServer::start_volatile };
    tokio::task::spawn_blocking(start).await.unwrap()
}

fn url(server: &RedisServer) -> String {
    format!("redis://127.0.0.1:{}", server.port())
}

/// A connection of the test's own, to look at the backend's keys.
async fn inspect(server: &RedisServer) -> MultiplexedConnection {
    let client = redis::Client::open(url(server).as_str()).unwrap();
    within("inspect connection", client.get_multiplexed_async_connection()).await.unwrap()
}

/// The tickets in the queue of lock `name` (`fencelock:queue:{name}`): the
/// acquire script appends the ticket of a wait it does not grant, and takes
/// it off when it grants it (or a withdrawal does), so the holders are not
/// in it. A dead waiter's ticket counts until an acquire drops it.
pub async fn queue_len(conn: &mut MultiplexedConnection, name: &str) -> usize {
    redis::cmd("LLEN").arg(format!("fencelock:queue:{name}")).query_async(conn).await.unwrap()
}

/// Waits (bounded) until the queue of `name` holds `n` tickets.
async fn until_queued(conn: &mut MultiplexedConnection, name: &str, n: usize) {
    within(&format!("{n} queued on {name}"), async {
        while queue_len(conn, name).await != n {
            tokio::time::sleep(5 * MS).await;
        }
    })
    .await;
}

/// Waits (bounded) until `n` clients are blocked (in BLPOP) on the server.
async fn until_blocked(conn: &mut MultiplexedConnection, n: usize) {
    within(&format!("{n} blocked clients"), async {
        loop {
            let info: String = redis::cmd("INFO").arg("clients").query_async(conn).await.unwrap();
            let blocked = info.lines().find_map(|l| l.strip_prefix("blocked_clients:")?.trim().parse::<usize>().ok());
            if blocked == Some(n) {
                return;
            }
            tokio::time::sleep(5 * MS).await;
        }
    })
    .await;
}

/// How many scripts the server has run (EVALSHA and EVAL calls).
async fn script_runs(conn: &mut MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO").arg("commandstats").query_async(conn).await.unwrap();
    info.lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| l.split("calls=").nth(1)?.split(',').next()?.parse::<u64>().ok())
        .sum()
}

/// Acquires `name` once (no wait) and releases it; the grant's token.
async fn token_of_a_grant(b: &Backend, name: &str) -> u64 {
    let g = within("grant", b.acquire(name, &opts(10 * SECS, Duration::ZERO))).await.unwrap().acquired().unwrap();
    let token = g.token().unwrap();
    assert!(g.release().await.unwrap());
    token
}

/// Kills the server with SIGKILL and starts it again on the same port and data.
async fn kill_and_restart(mut server: RedisServer) -> RedisServer {
    tokio::task::spawn_blocking(move || {
        server.kill_and_restart();
        server
    })
    .await
    .unwrap()
}

/// The declaration: global tokens, FIFO with push wake-ups, server-side TTL,
/// the holder's identity and value, leader election, read-write locks and
/// semaphores, no fail-over, no lock-delay; durable tokens only in durable
/// mode.
#[tokio::test]
async fn declares_its_capabilities() {
    let (volatile, durable) = (start_server(false).await, start_server(true).await);
    let mut want = Capabilities::new(Fencing::Global)
        .with_durable_tokens(false)
        .with_fifo(true)
        .with_push_wakeup(true)
        .with_server_ttl(true)
        .with_survives_failover(false)
        .with_lock_delay(false)
        .with_holder_identity(true)
        .with_election(true)
        .with_shared(true)
        .with_semaphores(true)
        .with_min_ttl(100 * MS);
    let b = suite::connect(&url(&volatile)).await;
    assert_eq!((b.kind(), b.capabilities()), ("redis", want));
    want.durable_tokens = true;
    let d = suite::connect(&format!("{}?durable=true", url(&durable))).await;
    assert_eq!(d.capabilities(), want);
}

/// Weighted permits are whole and in order (the suite's body); an
/// exclusive acquire of a semaphore's name is refused naming both counts,
/// and a released semaphore forgets its N.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weighted_permits_are_whole_and_a_semaphore_is_no_lock() {
    let t = Volatile::start().await;
    suite::weighted_permits_are_whole_and_in_order(&t).await;
    let b = suite::connect(&t.url()).await;
    let permit = b.acquire("sem-or-lock", &opts(30 * SECS, Duration::ZERO).permits(2)).await.unwrap();
    let permit = permit.acquired().unwrap();
    let got = b.acquire("sem-or-lock", &opts(30 * SECS, Duration::ZERO)).await;
    assert!(
        matches!(&got, Err(Error::InvalidArgument(m)) if m.contains("has 2 permits") && m.contains("asked for 0")),
        "{got:?}"
    );
    assert!(permit.release().await.unwrap());
    let lock = b.acquire("sem-or-lock", &opts(30 * SECS, Duration::ZERO)).await.unwrap().acquired().unwrap();
    assert!(lock.release().await.unwrap());
}

/// Issue 16: a Redis error reaches the caller as itself. The token counter
/// is made a string, so the acquire script's `INCR` fails on the server: the
/// error is `Error::Backend` whose `source()` is the `redis::RedisError` of
/// that reply, not only its text.
#[tokio::test]
async fn a_redis_error_keeps_its_source() {
    let server = start_server(false).await;
    let mut raw = inspect(&server).await;
    redis::cmd("SET").arg("fencelock:token").arg("not a number").query_async::<()>(&mut raw).await.unwrap();
    let b = suite::connect(&url(&server)).await;
    let err = b.acquire("a", &opts(10 * SECS, Duration::ZERO)).await.unwrap_err();
    assert!(matches!(&err, Error::Backend { backend: "redis", .. }), "{err:?}");
    let source = std::error::Error::source(&err).expect("the driver's error is kept");
    let cause = source.downcast_ref::<fencelock::Cause>().expect("a Cause");
    let redis_err = cause.get().downcast_ref::<redis::RedisError>().expect("a redis::RedisError");
    assert!(redis_err.to_string().contains("not an integer"), "{redis_err}");
}

/// Durable mode is refused, with what to set, by a server that does not
/// fsync every write; and malformed parameters are refused before anything.
#[tokio::test]
async fn durable_mode_needs_a_server_that_fsyncs_every_write() {
    let server = start_server(false).await;
    let got = within("connect", backend::connect(&format!("{}?durable=true", url(&server)))).await;
    match got {
        Err(Error::Unsupported(m)) => {
            assert!(m.contains("appendonly yes") && m.contains("appendfsync always"), "{m}");
            assert!(m.contains("appendonly=no"), "says what the server has: {m}");
        }
        other => panic!("durable mode on a volatile server: {other:?}"),
    }
    for bad in ["?durable=maybe", "?durabel=true", "?prefix=", "/notadb"] {
        let got = within("connect", backend::connect(&format!("{}{bad}", url(&server).trim_end_matches('/')))).await;
        assert!(matches!(got, Err(Error::InvalidArgument(_))), "{bad}: {got:?}");
    }
    let got = within("connect", backend::connect(&format!("redis://127.0.0.1:{0},127.0.0.1:{0}", server.port()))).await;
    assert!(matches!(got, Err(Error::InvalidArgument(_))), "two hosts: {got:?}");
}

/// Durable tokens (the declared `durable_tokens: true`): after a SIGKILL and
/// restart of a server with `appendfsync always`, tokens go on increasing.
#[tokio::test]
async fn durable_tokens_increase_across_a_kill_and_restart() {
    let server = start_server(true).await;
    let b = suite::connect(&format!("{}?durable=true", url(&server))).await;
    let mut before = 0;
    for name in ["a", "b", "c"] {
        before = token_of_a_grant(&b, name).await;
    }
    let _server = kill_and_restart(server).await;
    // The backend's connection broke with the server: it reconnects by itself.
    let after = token_of_a_grant(&b, "a").await;
    assert!(after > before, "token {after} after a restart, {before} before");
}

/// The documented weakness (the declared `durable_tokens: false`): without
/// persistence the counter starts over after a restart, and tokens go
/// backwards. This asserts the finding, it does not endorse it.
#[tokio::test]
async fn volatile_tokens_start_over_after_a_restart() {
    let server = start_server(false).await;
    let b = suite::connect(&url(&server)).await;
    let mut before = 0;
    for name in ["a", "b", "c"] {
        before = token_of_a_grant(&b, name).await;
    }
    assert!(before >= 3);
    let _server = kill_and_restart(server).await;
    let after = token_of_a_grant(&b, "a").await;
    assert!(after <= before, "the counter survived a restart without persistence? {after} after {before}");
}

/// What a restart without persistence does (the documented weakness): every
/// lock is gone, so a waiter is granted at once (it reconnects by itself),
/// with a token no larger than the old holder's; the old holder learns at its
/// next renewal that the lock is no longer its own (`lost()` fires).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_without_persistence_frees_the_lock() {
    let server = start_server(false).await;
    let mut redis = inspect(&server).await;
    let (holder, waiter) = (suite::connect(&url(&server)).await, suite::connect(&url(&server)).await);
    let held = holder.acquire("restart", &opts(3 * SECS, Duration::ZERO)).await.unwrap().acquired().unwrap();
    let waiting = tokio::spawn(async move { waiter.acquire("restart", &opts(60 * SECS, 20 * SECS)).await });
    until_queued(&mut redis, "restart", 1).await;
    let _server = kill_and_restart(server).await;
    let got = within("the waiter after a restart", waiting).await.unwrap().unwrap().acquired().unwrap();
    let (old, new) = (held.token().unwrap(), got.token().unwrap());
    assert!(new <= old, "token {new} after the restart, {old} before");
    assert_eq!(within("the old holder's loss", held.lost()).await, LeaseLost::NotFound);
    assert!(got.release().await.unwrap());
}

/// Push wake-up (the declared `push_wakeup`): with three waiters queued, each
/// release wakes exactly the next one. The others stay queued, and no waiter
/// runs the acquire script before its turn (counted by the server: one script
/// per release and one per grant, nothing more).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_next_waiter_is_woken() {
    let server = start_server(false).await;
    let mut redis = inspect(&server).await;
    let long = opts(60 * SECS, 30 * SECS); // no waiter refresh or renewal during the test
    let holder = suite::connect(&url(&server)).await;
    // Load the acquire and release scripts, so that each later call is one EVALSHA.
    token_of_a_grant(&holder, "warm-up").await;
    let held = holder.acquire("next", &long).await.unwrap().acquired().unwrap();
    let (granted_tx, mut granted) = mpsc::unbounded_channel();
    let mut releases = Vec::new();
    let mut waiters = Vec::new();
    for i in 0..3 {
        let b = suite::connect(&url(&server)).await;
        let (release_tx, release) = oneshot::channel::<()>();
        releases.push(release_tx);
        let (granted_tx, long) = (granted_tx.clone(), long.clone());
        waiters.push(tokio::spawn(async move {
            let g = b.acquire("next", &long).await.unwrap().acquired().unwrap();
            granted_tx.send(i).unwrap();
            release.await.unwrap();
            assert!(g.release().await.unwrap());
        }));
        until_queued(&mut redis, "next", i + 1).await;
    }
    let runs_before = script_runs(&mut redis).await;
    assert!(held.release().await.unwrap());
    for (i, release) in releases.into_iter().enumerate() {
        assert_eq!(within("the next grant", granted.recv()).await, Some(i), "grant order");
        assert_eq!(queue_len(&mut redis, "next").await, 2 - i, "the others stay queued");
        assert!(waiters[i + 1..].iter().all(|w| !w.is_finished()));
        release.send(()).unwrap();
    }
    for w in waiters {
        within("waiter", w).await.unwrap();
    }
    // The holder's release, then a grant and a release per waiter: 7. A
    // waiter woken before its turn would have run its script once more, and
    // it would have done so before its own grant (one connection, in order).
    let runs = script_runs(&mut redis).await - runs_before;
    assert_eq!(runs, 1 + 3 * 2, "script runs after the holder's release");
}

/// A dead waiter is skipped (FIFO without blocking on the dead): a ticket
/// whose waiter key is gone (its process crashed, the key expired) is dropped
/// from the head of the queue, and the release wakes the live one behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_waiter_is_skipped() {
    let server = start_server(false).await;
    let mut redis = inspect(&server).await;
    let (holder, waiter) = (suite::connect(&url(&server)).await, suite::connect(&url(&server)).await);
    let held = holder.acquire("dead", &opts(60 * SECS, Duration::ZERO)).await.unwrap().acquired().unwrap();
    // A waiter that queued, then died.
    let dead = "deadbeefdeadbeefdeadbeefdeadbeef";
    let _: () = redis::pipe()
        .cmd("RPUSH")
        .arg("fencelock:queue:dead")
        .arg(dead)
        .cmd("SET")
        .arg(format!("fencelock:waiter:{dead}"))
        .arg(60_000)
        .arg("PX")
        .arg(60_000)
        .query_async(&mut redis)
        .await
        .unwrap();
    let live = tokio::spawn(async move { waiter.acquire("dead", &opts(60 * SECS, 30 * SECS)).await });
    until_queued(&mut redis, "dead", 2).await;
    // Its liveness key expires.
    let _: () = redis::cmd("DEL").arg(format!("fencelock:waiter:{dead}")).query_async(&mut redis).await.unwrap();
    assert!(held.release().await.unwrap());
    let got = within("the live waiter after the dead one", live).await.unwrap().unwrap().acquired().unwrap();
    assert_eq!(queue_len(&mut redis, "dead").await, 0, "the dead ticket was dropped");
    assert!(got.release().await.unwrap());
}

/// FIFO (the declared `fifo`): a try never overtakes a live waiter, even on
/// a free lock; once the waiter is dead, the try goes through.
#[tokio::test]
async fn a_try_never_overtakes_a_live_waiter() {
    let server = start_server(false).await;
    let mut redis = inspect(&server).await;
    let b = suite::connect(&url(&server)).await;
    let ticket = "0123456789abcdef0123456789abcdef";
    let waiter = format!("fencelock:waiter:{ticket}");
    let _: () = redis::pipe()
        .cmd("RPUSH")
        .arg("fencelock:queue:line")
        .arg(ticket)
        .cmd("SET")
        .arg(&waiter)
        .arg(60_000)
        .arg("PX")
        .arg(60_000)
        .query_async(&mut redis)
        .await
        .unwrap();
    match b.acquire("line", &opts(10 * SECS, Duration::ZERO)).await.unwrap() {
        Outcome::Busy { holder_token: None, waiters: 1, .. } => {}
        other => panic!("a try past a live waiter: {other:?}"),
    }
    let _: () = redis::cmd("DEL").arg(&waiter).query_async(&mut redis).await.unwrap();
    let g = b.acquire("line", &opts(10 * SECS, Duration::ZERO)).await.unwrap().acquired().unwrap();
    assert!(g.release().await.unwrap());
}

/// Dropping a waiting acquire withdraws it (the contract of `acquire`): its
/// ticket leaves the queue, its blocking connection is closed, and the next
/// release goes to the waiter behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_waiter_leaves_the_queue() {
    let server = start_server(false).await;
    let mut redis = inspect(&server).await;
    let holder = suite::connect(&url(&server)).await;
    let held = holder.acquire("drop", &opts(60 * SECS, Duration::ZERO)).await.unwrap().acquired().unwrap();
    let mut tasks = Vec::new();
    for i in 0..2 {
        let b = suite::connect(&url(&server)).await;
        tasks.push(tokio::spawn(async move { b.acquire("drop", &opts(60 * SECS, 30 * SECS)).await }));
        until_queued(&mut redis, "drop", i + 1).await;
    }
    let second = tasks.pop().unwrap();
    let first = tasks.pop().unwrap();
    until_blocked(&mut redis, 2).await;
    first.abort();
    until_queued(&mut redis, "drop", 1).await;
    // Its BLPOP connection was closed with it.
    until_blocked(&mut redis, 1).await;
    assert!(held.release().await.unwrap());
    let got = within("the waiter behind the dropped one", second).await.unwrap().unwrap().acquired().unwrap();
    assert!(got.release().await.unwrap());
    let waiters: Vec<String> = redis::cmd("KEYS").arg("fencelock:waiter:*").query_async(&mut redis).await.unwrap();
    assert_eq!(waiters, Vec::<String>::new(), "no waiter key left behind");
}

/// `Busy` names the holder's token and lease, and `check` tells the current grant from
/// an old one (Chubby's CheckSequencer).
#[tokio::test]
async fn busy_names_the_holder_and_check_knows_the_current_grant() {
    let server = start_server(false).await;
    let (a, b) = (suite::connect(&url(&server)).await, suite::connect(&url(&server)).await);
    let old = token_of_a_grant(&a, "who").await;
    let g = a.acquire("who", &opts(10 * SECS, Duration::ZERO)).await.unwrap().acquired().unwrap();
    let token = g.token().unwrap();
    match b.acquire("who", &opts(10 * SECS, Duration::ZERO)).await.unwrap() {
        Outcome::Busy { holder_token: Some(t), holder_lease: Some(lease), waiters: 0, .. } => {
            assert_eq!((t, lease), (token, g.lease_id()));
        }
        other => panic!("{other:?}"),
    }
    let now = b.check("who", token).await.unwrap();
    assert!(now.current && now.current_token == Some(token), "{now:?}");
    let stale = b.check("who", old).await.unwrap();
    assert!(!stale.current && stale.current_token == Some(token), "{stale:?}");
    assert!(g.release().await.unwrap());
    let free = b.check("who", token).await.unwrap();
    assert!(!free.current && free.current_token.is_none(), "{free:?}");
}

/// Issue 17 (a grant stores its candidate beside the lock): the leader is the
/// holder, its term the token, its identity and value the holder key's
/// (`"{token}:"`, two bytes of identity length, the identity, the value),
/// which goes with the release.
#[tokio::test]
async fn the_leader_is_the_holder_with_its_identity_and_value() {
    let server = start_server(false).await;
    let mut redis = inspect(&server).await;
    let b = suite::connect(&url(&server)).await;
    let election = b.election("vote").identity("pod-7").value(&b"10.0.0.1:80"[..]).ttl(10 * SECS);
    let leadership = within("campaign", election.campaign()).await.unwrap();
    let term = leadership.term();
    let stored: Vec<u8> = redis::cmd("GET").arg("fencelock:holder:vote").query_async(&mut redis).await.unwrap();
    assert_eq!(stored, [format!("{term}:").as_bytes(), b"\0\x05pod-710.0.0.1:80"].concat());
    let want = Leader { name: "vote".into(), term, value: b"10.0.0.1:80".to_vec(), identity: Some("pod-7".into()) };
    assert_eq!(b.leader("vote").await.unwrap(), Some(want));
    assert!(leadership.resign().await.unwrap());
    assert_eq!(b.leader("vote").await.unwrap(), None);
    let left: i64 = redis::cmd("EXISTS").arg("fencelock:holder:vote").query_async(&mut redis).await.unwrap();
    assert_eq!(left, 0, "the holder key outlived the release");
}

/// Issue 17 (a campaign whose lease is lost while it waits ends, rather than
/// being queued again): a candidate's waiter key expires (deleted here) and
/// a try drops its ticket from the head of the queue; the candidate's next
/// attempt ends its campaign with `LeaseNotFound`, and the leader keeps
/// leading. (A lock acquire would queue again, at the back.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_campaign_whose_ticket_is_dropped_ends() {
    let server = start_server(false).await;
    let mut redis = inspect(&server).await;
    let (b, c) = (suite::connect(&url(&server)).await, suite::connect(&url(&server)).await);
    let leader = within("campaign", b.election("vote").ttl(60 * SECS).campaign()).await.unwrap();
    // A TTL of 3 s: the candidate runs its script again within a second.
    let candidate = tokio::spawn(async move { c.election("vote").ttl(3 * SECS).campaign().await });
    until_queued(&mut redis, "vote", 1).await;
    let ticket: String = redis::cmd("LINDEX").arg("fencelock:queue:vote").arg(0).query_async(&mut redis).await.unwrap();
    let _: () = redis::cmd("DEL").arg(format!("fencelock:waiter:{ticket}")).query_async(&mut redis).await.unwrap();
    assert!(matches!(b.acquire("vote", &opts(SECS, Duration::ZERO)).await.unwrap(), Outcome::Busy { .. }));
    assert_eq!(queue_len(&mut redis, "vote").await, 0, "the try dropped the dead ticket");
    match within("the campaign of a dropped candidate", candidate).await.unwrap() {
        Err(Error::LeaseNotFound(message)) => assert!(message.contains("redis"), "{message}"),
        other => panic!("a campaign whose ticket was dropped: {other:?}"),
    }
    assert_eq!(b.leader("vote").await.unwrap().map(|l| l.term), Some(leader.term()));
    assert!(leader.resign().await.unwrap());
}

/// Issue 17 (an observer sees a leader go even when nothing announces it): a
/// leader cut off from Redis stops renewing and its lock expires, which
/// publishes nothing; the observer still shows the end of its term, then
/// the next leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_sees_an_expiry() {
    let server = start_server(false).await;
    let (proxied, proxies) = suite::through_proxy("redis://", server.port(), "").await;
    let (cut, b) = (suite::connect(&proxied).await, suite::connect(&url(&server)).await);
    let first = within("campaign", cut.election("vote").ttl(SECS).campaign()).await.unwrap();
    let mut observer = within("observe", b.observe("vote")).await.unwrap();
    let ev = within("the first leader", observer.next_event()).await.unwrap().unwrap();
    assert!(matches!(&ev, LeaderEvent::Leader(l) if l.term == first.term()), "{ev:?}");
    proxies[0].set_mode(Mode::Hold);
    let ev = within("the end of the first term", observer.next_event()).await.unwrap().unwrap();
    assert_eq!(ev, LeaderEvent::Vacant { term: first.term() });
    let second = within("campaign", b.election("vote").ttl(10 * SECS).campaign()).await.unwrap();
    let ev = within("the second leader", observer.next_event()).await.unwrap().unwrap();
    assert!(matches!(&ev, LeaderEvent::Leader(l) if l.term == second.term()), "{ev:?}");
    assert!(second.resign().await.unwrap());
    proxies[0].set_mode(Mode::Pass);
}

/// Issue 17 (a new value is a compare-and-set on the grant): a proclaim
/// rewrites the holder key (the term and identity kept, the lock's TTL
/// still on it); once another grant holds the lock (its key replaced behind
/// the old guard's back, as after an unnoticed expiry), the old guard's
/// set-value answers `Ok(false)` and leaves the holder key alone.
#[tokio::test]
async fn a_new_value_is_set_only_by_the_grant_that_holds_the_lock() {
    let server = start_server(false).await;
    let mut redis = inspect(&server).await;
    let b = suite::connect(&url(&server)).await;
    let election = b.election("vote").identity("pod-7").value(&b"a"[..]).ttl(4 * suite::LIMIT);
    let mut leadership = within("campaign", election.campaign()).await.unwrap();
    let term = leadership.term();
    within("proclaim", leadership.proclaim(&b"b"[..])).await.unwrap();
    let stored: Vec<u8> = within("GET", command(&mut redis, &["GET", "fencelock:holder:vote"])).await;
    assert_eq!(stored, [format!("{term}:").as_bytes(), b"\0\x05pod-7b"].concat());
    let ttl: i64 = within("PTTL", command(&mut redis, &["PTTL", "fencelock:holder:vote"])).await;
    assert!(ttl > 0, "the holder key lost its expiry: {ttl}");
    let other = format!("{}:someone-else", term + 1);
    within("SET", command::<()>(&mut redis, &["SET", "fencelock:lock:vote", &other])).await;
    let guard = leadership.into_guard();
    assert!(!within("set_value", guard.set_value(&b"c"[..])).await.unwrap(), "a set-value by a stale grant");
    let now: Vec<u8> = within("GET", command(&mut redis, &["GET", "fencelock:holder:vote"])).await;
    assert_eq!(now, stored, "a stale set-value changed the holder");
    assert!(!within("release", guard.release()).await.unwrap());
}

/// The answer to one command of `args` (a failure fails the test).
async fn command<T: redis::FromRedisValue>(conn: &mut MultiplexedConnection, args: &[&str]) -> T {
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    cmd.query_async(conn).await.unwrap_or_else(|e| panic!("{args:?}: {e}"))
}
