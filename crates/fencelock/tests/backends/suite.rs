//! The conformance suite: the same test bodies for every backend, each run
//! against real servers (one module per backend beside this one). A body checks the backend against
//! the contract of `LockBackend` and against the capabilities the backend
//! declares; where a capability is declared absent, the body checks nothing
//! it does not promise (each such branch says so in a comment or doc).
//!
//! No body asserts a duration. Waits are bounded by [`LIMIT`] so that a broken
//! backend fails the test instead of hanging it.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fencelock::backend::{self, Backend, Fencing};
use fencelock::{Error, LeaderEvent, LeaseLost, LockOptions, Outcome};
use fencelock_testkit::proxy::{Mode, Proxy};

pub const MS: Duration = Duration::from_millis(1);
pub const SECS: Duration = Duration::from_secs(1);

/// Upper bound of every wait; only reached when a test fails.
pub const LIMIT: Duration = Duration::from_secs(30);

/// A real lock service to run the suite against.
pub trait Target: Send + Sync + Sized + 'static {
    /// Starts the service (its servers on free ports of 127.0.0.1).
    fn start() -> impl Future<Output = Self> + Send;
    /// The backend URL that reaches the service directly.
    fn url(&self) -> String;
    /// Puts a fault proxy in front of every server of the service; returns a
    /// URL whose connections all go through them.
    fn via_proxies(&self) -> impl Future<Output = (String, Vec<Proxy>)> + Send;
    /// The TTL for tests that wait for an expiry: short, but at least the
    /// backend's smallest.
    fn short_ttl(&self) -> Duration {
        SECS
    }
    /// How many acquires wait in the queue of lock `lock` now, as the service
    /// itself shows it (its holders not counted); `None` where the target
    /// cannot see the queue (bodies then order their waiters by time, see
    /// [`until_queued`]).
    fn waiters(&self, lock: &str) -> impl Future<Output = Option<usize>> + Send {
        let _ = lock;
        async { None }
    }
}

pub async fn connect(url: &str) -> Backend {
    within("connect", backend::connect(url)).await.unwrap_or_else(|e| panic!("connect {url}: {e}"))
}

pub async fn within<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(LIMIT, f).await.unwrap_or_else(|_| panic!("{what}: no answer within {LIMIT:?}"))
}

/// Waits until at least `n` acquires wait in the queue of `lock` on the
/// service (polled every 10 ms, bounded by [`LIMIT`]), so that a body can
/// order its waiters by their places in the queue. Where the target cannot
/// see the queue ([`Target::waiters`] is `None`), sleeps 300 ms instead: an
/// order by time, which a loaded machine may break.
pub async fn until_queued<T: Target>(t: &T, lock: &str, n: usize) {
    if t.waiters(lock).await.is_none() {
        tokio::time::sleep(300 * MS).await;
        return;
    }
    within(&format!("{n} waiting in the queue of {lock:?}"), async {
        while t.waiters(lock).await.expect("a queue seen once is seen again") < n {
            tokio::time::sleep(10 * MS).await;
        }
    })
    .await;
}

/// Where the target sees the queue of `lock`, it shows exactly `n` waiting
/// (a count that took a holder for a waiter would let [`until_queued`] go on
/// before a waiter queued).
pub async fn assert_waiters<T: Target>(t: &T, lock: &str, n: usize) {
    if let Some(seen) = t.waiters(lock).await {
        assert_eq!(seen, n, "acquires waiting in the queue of {lock:?}");
    }
}

/// Lock options with `ttl` and `wait`, the rest default.
pub fn opts(ttl: Duration, wait: Duration) -> LockOptions {
    LockOptions::default().ttl(ttl).wait(wait)
}

/// `127.0.0.1:port`.
pub fn local(port: u16) -> std::net::SocketAddr {
    std::net::SocketAddr::from(([127, 0, 0, 1], port))
}

/// One fault proxy in front of `127.0.0.1:port`, and the URL
/// `{prefix}{proxy address}{suffix}` that reaches the server through it.
pub async fn through_proxy(prefix: &str, port: u16, suffix: &str) -> (String, Vec<Proxy>) {
    let proxy = Proxy::start(local(port)).await;
    (format!("{prefix}{}{suffix}", proxy.addr()), vec![proxy])
}

/// Invariant (mutual exclusion, the contract of `LockBackend`): 16 clients,
/// each with its own connection, take one lock 5 times each with a wait; no
/// two are ever inside at once. Where the backend declares fencing, the tokens
/// in grant order strictly increase.
pub async fn mutual_exclusion<T: Target>(t: &T) {
    const CLIENTS: usize = 16;
    const ROUNDS: usize = 5;
    let inside = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let b = connect(&t.url()).await;
        let (inside, tokens) = (inside.clone(), tokens.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let guard = b.acquire("mutex", &opts(10 * SECS, 25 * SECS)).await.unwrap().acquired().unwrap();
                assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders at once");
                tokens.lock().unwrap().push(guard.token());
                tokio::task::yield_now().await;
                tokio::time::sleep(MS).await;
                assert!(!guard.is_lost(), "lost while holding");
                inside.fetch_sub(1, Ordering::SeqCst);
                assert!(guard.release().await.unwrap(), "release of a held lock");
            }
        }));
    }
    for task in tasks {
        within("16 clients", task).await.unwrap();
    }
    let tokens = tokens.lock().unwrap().clone();
    assert_eq!(tokens.len(), CLIENTS * ROUNDS);
    let fencing = connect(&t.url()).await.capabilities().fencing;
    if fencing == Fencing::None {
        assert!(tokens.iter().all(Option::is_none), "a backend without fencing must give no token");
    } else {
        let tokens: Vec<u64> = tokens.into_iter().map(|t| t.expect("a fenced backend gives a token")).collect();
        assert!(tokens.windows(2).all(|w| w[0] < w[1]), "tokens in grant order: {tokens:?}");
    }
}

/// Invariant (global fencing): where declared global, tokens increase across
/// different locks too.
pub async fn tokens_across_locks<T: Target>(t: &T) {
    let b = connect(&t.url()).await;
    if b.capabilities().fencing != Fencing::Global {
        return;
    }
    let mut last = 0;
    for name in ["a", "b", "a", "c", "b"] {
        let g = b.acquire(name, &opts(10 * SECS, Duration::ZERO)).await.unwrap().acquired().unwrap();
        let token = g.token().unwrap();
        assert!(token > last, "{name}: token {token} after {last}");
        last = token;
        assert!(g.release().await.unwrap());
    }
}

/// Contention is an outcome: a try on a held lock is `Busy`, a wait that runs
/// out is `TimedOut`; neither is an error, and neither disturbs the holder.
pub async fn contention_is_an_outcome<T: Target>(t: &T) {
    let (a, b) = (connect(&t.url()).await, connect(&t.url()).await);
    let held = a.acquire("busy", &opts(10 * SECS, Duration::ZERO)).await.unwrap().acquired().unwrap();
    match b.acquire("busy", &opts(10 * SECS, Duration::ZERO)).await.unwrap() {
        Outcome::Busy { .. } => {}
        other => panic!("a try on a held lock: {other:?}"),
    }
    match b.acquire("busy", &opts(10 * SECS, 300 * MS)).await.unwrap() {
        Outcome::TimedOut => {}
        other => panic!("a wait on a held lock: {other:?}"),
    }
    assert!(!held.is_lost());
    assert!(held.release().await.unwrap());
    let again = b.acquire("busy", &opts(10 * SECS, Duration::ZERO)).await.unwrap().acquired().unwrap();
    assert!(again.release().await.unwrap());
}

/// A released lock goes to a waiter; a dropped guard releases too (the waiter
/// would time out otherwise: the TTL is longer than its wait).
pub async fn release_and_drop_free_the_lock<T: Target>(t: &T) {
    let (a, b) = (connect(&t.url()).await, connect(&t.url()).await);
    let g = a.acquire("handoff", &opts(60 * SECS, Duration::ZERO)).await.unwrap().acquired().unwrap();
    let waiter = tokio::spawn(async move {
        let got = b.acquire("handoff", &opts(60 * SECS, 20 * SECS)).await.unwrap().acquired().unwrap();
        (b, got)
    });
    tokio::time::sleep(200 * MS).await;
    drop(g);
    let (_b, got) = within("waiter after a dropped guard", waiter).await.unwrap();
    assert!(!got.is_lost());
    assert!(got.release().await.unwrap());
}

/// Invariant (lease expiry and compare-and-delete release): a holder that stops
/// renewing (its connections held by a proxy) sees `lost()` fire; then the lock
/// goes to another client with a larger token (if fenced); the old holder's
/// release, once it can talk again, releases nothing; the new holder keeps
/// the lock.
///
/// A backend without a server-side TTL keeps the lock while the silent
/// holder's connection stays open: there, the body checks that `lost()` still
/// fires, and that the lock is freed once the holder can talk again.
pub async fn expiry_and_release_by_a_non_holder<T: Target>(t: &T) {
    let (proxied, proxies) = t.via_proxies().await;
    let old = connect(&proxied).await;
    let new = connect(&t.url()).await;
    let server_ttl = new.capabilities().server_ttl;
    let ttl = t.short_ttl();
    let stale = old.acquire("expiry", &opts(ttl, Duration::ZERO)).await.unwrap().acquired().unwrap();
    for p in &proxies {
        p.set_mode(Mode::Hold);
    }
    let reason = within("lost() of a holder cut off", stale.lost()).await;
    assert!(matches!(reason, LeaseLost::Expired | LeaseLost::NotFound), "{reason:?}");
    if !server_ttl {
        for p in &proxies {
            p.set_mode(Mode::Pass);
        }
        assert!(!within("release after the loss", stale.release()).await.unwrap(), "a lost guard released");
        let fresh = within("grant after the release", new.acquire("expiry", &opts(30 * SECS, 20 * SECS))).await;
        assert!(fresh.unwrap().acquired().unwrap().release().await.unwrap());
        return;
    }
    let fresh = within("grant after the expiry", new.acquire("expiry", &opts(30 * SECS, 20 * SECS)))
        .await
        .unwrap()
        .acquired()
        .unwrap();
    if let (Some(old_token), Some(new_token)) = (stale.token(), fresh.token()) {
        assert!(new_token > old_token, "token after an expiry: {new_token} after {old_token}");
    }
    for p in &proxies {
        p.set_mode(Mode::Pass);
    }
    assert!(!within("release by a non-holder", stale.release()).await.unwrap(), "a stale guard released");
    let third = connect(&t.url()).await;
    match third.acquire("expiry", &opts(10 * SECS, Duration::ZERO)).await.unwrap() {
        Outcome::Busy { .. } => {}
        other => panic!("the new holder lost its lock to a stale release: {other:?}"),
    }
    assert!(!fresh.is_lost());
    assert!(fresh.release().await.unwrap());
}

/// `lost()` fires when the backend connection is cut (every connection reset,
/// and every reconnect too), at the latest at the deadline; loss is never
/// silent.
pub async fn lost_fires_when_the_connection_is_cut<T: Target>(t: &T) {
    let (proxied, proxies) = t.via_proxies().await;
    let b = connect(&proxied).await;
    let g = b.acquire("cut", &opts(t.short_ttl(), Duration::ZERO)).await.unwrap().acquired().unwrap();
    for p in &proxies {
        p.set_mode(Mode::Reset);
    }
    let reason = within("lost() after the cut", g.lost()).await;
    assert!(matches!(reason, LeaseLost::Expired | LeaseLost::NotFound), "{reason:?}");
    assert!(g.is_lost());
    for p in &proxies {
        p.set_mode(Mode::Pass);
    }
    drop(g);
}

/// Invariant (FIFO), where declared: five waiters queued one after the other
/// are granted in that order when the holder releases. Each waiter starts
/// once the one before it is in the queue on the service ([`until_queued`]).
pub async fn fifo_where_declared<T: Target>(t: &T) {
    let holder = connect(&t.url()).await;
    if !holder.capabilities().fifo {
        return;
    }
    let g = holder.acquire("fifo", &opts(30 * SECS, Duration::ZERO)).await.unwrap().acquired().unwrap();
    assert_waiters(t, "fifo", 0).await;
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..5 {
        let b = connect(&t.url()).await;
        let order = order.clone();
        tasks.push(tokio::spawn(async move {
            let got = b.acquire("fifo", &opts(30 * SECS, 25 * SECS)).await.unwrap().acquired().unwrap();
            order.lock().unwrap().push(i);
            assert!(got.release().await.unwrap());
        }));
        // This waiter is in the queue before the next one starts.
        until_queued(t, "fifo", i + 1).await;
    }
    assert_waiters(t, "fifo", 5).await;
    assert!(g.release().await.unwrap());
    for task in tasks {
        within("waiters", task).await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3, 4], "grant order");
}

/// Bad input gets a clear error and changes nothing: bad names, TTLs, waits,
/// fencing asked of a backend without it, a malformed URL, an unreachable
/// server.
pub async fn bad_input<T: Target>(t: &T) {
    let b = connect(&t.url()).await;
    let long = "x".repeat(513);
    for name in ["", "a\u{7}b", long.as_str()] {
        let got = b.acquire(name, &opts(10 * SECS, Duration::ZERO)).await;
        assert!(matches!(got, Err(Error::InvalidArgument(_))), "name {name:?}: {got:?}");
    }
    for ttl in [Duration::ZERO, 99 * MS, 3601 * SECS] {
        let got = b.acquire("bad", &opts(ttl, Duration::ZERO)).await;
        assert!(matches!(got, Err(Error::InvalidArgument(_))), "ttl {ttl:?}: {got:?}");
    }
    let got = b.acquire("bad", &opts(10 * SECS, 3601 * SECS)).await;
    assert!(matches!(got, Err(Error::InvalidArgument(_))), "wait: {got:?}");
    let fenced = opts(10 * SECS, Duration::ZERO).require_fencing(true);
    let got = b.acquire("bad", &fenced).await;
    if b.capabilities().fencing == Fencing::None {
        assert!(matches!(got, Err(Error::Unsupported(_))), "fencing required of {}: {got:?}", b.kind());
    } else {
        assert!(got.unwrap().acquired().unwrap().release().await.unwrap());
    }
    // Nothing was left behind by the refused requests.
    let g = b.acquire("bad", &opts(10 * SECS, Duration::ZERO)).await.unwrap().acquired().unwrap();
    assert!(g.release().await.unwrap());
    let scheme = t.url().split("://").next().unwrap().to_string();
    let got = backend::connect(&format!("{scheme}://127.0.0.1:notaport")).await;
    assert!(matches!(got, Err(Error::InvalidArgument(_))), "malformed url: {got:?}");
    let closed = fencelock_testkit::free_port();
    let unreachable = format!("{scheme}://127.0.0.1:{closed}");
    let got = within("connect to a closed port", backend::connect(&unreachable)).await;
    assert!(matches!(got, Err(Error::Connect { .. })), "unreachable {unreachable}: {got:?}");
}

/// Lock names with characters some backends treat specially (path
/// separators, spaces, non-ASCII) are distinct locks, and work.
pub async fn names_are_opaque<T: Target>(t: &T) {
    let b = connect(&t.url()).await;
    let names = ["jobs/nightly", "jobs", "jobs/nightly/x", "a b", "ключ", "..", "%2F", "/"];
    let mut guards = Vec::new();
    for name in names {
        let got = b.acquire(name, &opts(10 * SECS, Duration::ZERO)).await.unwrap();
        guards.push(got.acquired().unwrap_or_else(|e| panic!("{name:?}: {e}")));
    }
    for g in guards {
        assert!(g.release().await.unwrap());
    }
}

/// `with_lock` runs the closure under the lock and releases it.
pub async fn with_lock_runs_and_releases<T: Target>(t: &T) {
    let b = connect(&t.url()).await;
    let token =
        backend::with_lock(b.as_ref(), "with", opts(10 * SECS, Duration::ZERO), async |g: &fencelock::Guard| g.token())
            .await
            .unwrap();
    if b.capabilities().fencing != Fencing::None {
        assert!(token.is_some());
    }
    let g = b.acquire("with", &opts(10 * SECS, Duration::ZERO)).await.unwrap().acquired().unwrap();
    assert!(g.release().await.unwrap());
}

/// Invariants of leader election (issue 17), where declared: at most one
/// leader per term and terms strictly increasing in election order; a
/// candidate that resigns hands over at once to the next in line (who waits
/// with a TTL far longer than the test, so only the resignation can elect
/// it); a try while someone leads is `Busy`; `leader` shows the current
/// leader with its term, value and identity, or none; an observer sees every
/// leader, terms strictly increasing, and the vacancies between them. A backend that declares no election refuses all
/// three calls with `Unsupported`, before anything is sent.
///
/// Each leader resigns only once the observer has shown it: an observer that
/// reads the leader on a notification (PostgreSQL's, ZooKeeper's) may skip a
/// term that begins and ends between two of its reads (it then shows the
/// vacancy and the next leader), and on a loaded machine a term of a few
/// milliseconds sometimes did (a CI run waited 30 s for the sixth event).
pub async fn election_where_declared<T: Target>(t: &T) {
    let b = connect(&t.url()).await;
    if !b.capabilities().election {
        let got = b.campaign("e", &opts(10 * SECS, Duration::ZERO)).await;
        assert!(matches!(got, Err(Error::Unsupported(_))), "campaign: {got:?}");
        assert!(matches!(b.leader("e").await, Err(Error::Unsupported(_))));
        assert!(matches!(b.observe("e").await, Err(Error::Unsupported(_))));
        return;
    }
    assert_eq!(within("leader", b.leader("election")).await.unwrap(), None, "nobody leads yet");
    let mut observer = within("observe", b.observe("election")).await.unwrap();
    let mut terms = Vec::new();
    let mut pending = Vec::new();
    for i in 0..3 {
        let c = connect(&t.url()).await;
        let value = format!("candidate-{i}").into_bytes();
        let candidate = tokio::spawn(async move {
            let election = c.election("election").ttl(60 * SECS).value(value).identity(format!("id-{i}"));
            let elected = election.campaign().await;
            (c, elected)
        });
        pending.push(candidate);
    }
    let (mut order, mut leaders, mut seen) = (Vec::new(), Vec::new(), Vec::new());
    while !pending.is_empty() {
        // Exactly one candidate is elected at a time: the others still wait.
        let (done, rest) = within("an election", first_finished(pending)).await;
        pending = rest;
        let (_c, elected) = done.unwrap();
        let leadership = elected.unwrap();
        let term = leadership.term();
        assert!(terms.last().is_none_or(|&t| t < term), "terms in election order: {terms:?} then {term}");
        terms.push(term);
        for p in &pending {
            assert!(!p.is_finished(), "two leaders at once (term {term})");
        }
        let shown = within("leader", b.leader("election")).await.unwrap().expect("a leader");
        let value = String::from_utf8(leadership.value().to_vec()).unwrap();
        let identity = value.replace("candidate-", "id-");
        assert_eq!((shown.term, shown.value.as_slice()), (term, leadership.value()));
        assert_eq!(shown.identity.as_deref(), Some(identity.as_str()));
        match within("try", b.election("election").ttl(10 * SECS).try_campaign()).await.unwrap() {
            Outcome::Busy { .. } => {}
            other => panic!("a try while term {term} leads: {other:?}"),
        }
        leaders.push((term, value.clone(), identity));
        order.push(value);
        // The previous term's vacancy (after the first), then this leader.
        while seen.len() < 2 * terms.len() - 1 {
            let ev = within("observed change", observer.next_event()).await.expect("the observer goes on").unwrap();
            seen.push(ev);
        }
        assert!(within("resign", leadership.resign()).await.unwrap(), "resign of a held leadership");
    }
    assert_eq!(within("leader", b.leader("election")).await.unwrap(), None, "all resigned");
    order.sort();
    assert_eq!(order, ["candidate-0", "candidate-1", "candidate-2"], "each candidate led once");
    // The observer saw each leader with its value and identity, then its
    // vacancy, in term order.
    while seen.len() < 2 * terms.len() {
        let ev = within("observed change", observer.next_event()).await.expect("the observer goes on").unwrap();
        seen.push(ev);
    }
    for (i, (term, value, identity)) in leaders.iter().enumerate() {
        let shown = match &seen[2 * i] {
            LeaderEvent::Leader(l) => (l.term, l.value.as_slice(), l.identity.as_deref()),
            other => panic!("a leader expected, got {other:?} in {seen:?}"),
        };
        assert_eq!(shown, (*term, value.as_bytes(), Some(identity.as_str())), "{seen:?}");
        assert_eq!(seen[2 * i + 1], LeaderEvent::Vacant { term: *term }, "{seen:?}");
    }
}

/// Invariants of `proclaim` (issue 17), where elections are declared: a
/// leader's new value keeps its term; `leader` shows the last value with the
/// campaign's identity; an observer started before the campaign sees the term
/// with each value, in order, each once; a leadership whose term has ended
/// cannot proclaim (`LeaseNotFound`) and changes nothing that `leader` shows.
/// Every backend that elects can proclaim (`Unsupported` fails the test).
///
/// Each proclaim waits until the observer showed the value before it: an
/// observer that reads the leader on a notification (ZooKeeper's one-shot
/// watches) may show only the last of values set faster than it reads.
pub async fn proclaim_where_declared<T: Target>(t: &T) {
    let b = connect(&t.url()).await;
    if !b.capabilities().election {
        return; // `election_where_declared` checks the refusal.
    }
    let mut observer = within("observe", b.observe("proclaim")).await.unwrap();
    let c = connect(&t.url()).await;
    let election = c.election("proclaim").ttl(60 * SECS).value(&b"v1"[..]).identity("node-a");
    let mut leadership = within("campaign", election.campaign()).await.unwrap();
    let term = leadership.term();
    let shown = |l: fencelock::Leader| (l.term, l.value, l.identity);
    let at = |value: &[u8]| (term, value.to_vec(), Some("node-a".to_string()));
    assert_eq!(shown(next_leader(&mut observer).await), at(b"v1"));
    for value in [&b"v2"[..], b"v3"] {
        let got = within("proclaim", leadership.proclaim(value)).await;
        got.unwrap_or_else(|e| panic!("proclaim of a held leadership on {}: {e}", c.kind()));
        assert_eq!(leadership.value(), value);
        assert_eq!(shown(next_leader(&mut observer).await), at(value), "the observer after a proclaim");
    }
    let now = within("leader", b.leader("proclaim")).await.unwrap().expect("a leader");
    assert_eq!(shown(now), at(b"v3"));
    assert!(within("resign", leadership.into_guard().release()).await.unwrap(), "release of the leader's guard");
    assert_eq!(within("vacancy", observer.next_event()).await.unwrap().unwrap(), LeaderEvent::Vacant { term });

    // A leader cut off from the backend until its term ended.
    let (proxied, proxies) = t.via_proxies().await;
    let cut = connect(&proxied).await;
    let election = cut.election("proclaim").ttl(t.short_ttl()).value(&b"w1"[..]);
    let mut stale = within("campaign", election.campaign()).await.unwrap();
    for p in &proxies {
        p.set_mode(Mode::Hold);
    }
    within("lost() of a leader cut off", stale.lost()).await;
    for p in &proxies {
        p.set_mode(Mode::Pass);
    }
    let got = within("proclaim of an ended term", stale.proclaim(&b"late"[..])).await;
    assert!(matches!(&got, Err(Error::LeaseNotFound(_))), "{got:?}");
    assert_eq!(stale.value(), b"w1", "a refused proclaim kept its value");
    let now = within("leader", b.leader("proclaim")).await.unwrap();
    assert!(now.is_none_or(|l| l.value != b"late"), "the ended term's proclaim was published");
}

/// The next leader `observer` shows (a vacancy or an end fails the test).
async fn next_leader(observer: &mut fencelock::LeaderStream) -> fencelock::Leader {
    match within("observed change", observer.next_event()).await {
        Some(Ok(LeaderEvent::Leader(l))) => l,
        other => panic!("a leader expected: {other:?}"),
    }
}

/// Read-write locks and semaphores (issue 18), where declared: two readers
/// hold at once and a writer is busy meanwhile (INV-15); a semaphore of two
/// admits two holders and refuses a third. A backend that declares neither
/// refuses both kinds of acquire with `Unsupported`, before anything is sent.
pub async fn sharing_where_declared<T: Target>(t: &T) {
    let b = connect(&t.url()).await;
    let caps = b.capabilities();
    let shared = opts(10 * SECS, Duration::ZERO).shared();
    if caps.shared {
        let r1 = within("reader", b.acquire("rw", &shared)).await.unwrap().acquired().unwrap();
        let r2 = within("reader", b.acquire("rw", &shared)).await.unwrap().acquired().unwrap();
        let writer = within("writer", b.acquire("rw", &opts(10 * SECS, Duration::ZERO))).await.unwrap();
        assert!(matches!(writer, Outcome::Busy { .. }), "a writer beside two readers: {writer:?}");
        assert!(r1.release().await.unwrap() && r2.release().await.unwrap());
    } else {
        let got = b.acquire("rw", &shared).await;
        assert!(matches!(got, Err(Error::Unsupported(_))), "shared: {got:?}");
    }
    let permit = opts(10 * SECS, Duration::ZERO).permits(2);
    if caps.semaphores {
        let p1 = within("permit", b.acquire("sem", &permit)).await.unwrap().acquired().unwrap();
        let p2 = within("permit", b.acquire("sem", &permit)).await.unwrap().acquired().unwrap();
        let third = within("permit", b.acquire("sem", &permit)).await.unwrap();
        assert!(matches!(third, Outcome::Busy { .. }), "a third permit of two: {third:?}");
        assert!(p1.release().await.unwrap() && p2.release().await.unwrap());
    } else {
        let got = b.acquire("sem", &permit).await;
        assert!(matches!(got, Err(Error::Unsupported(_))), "permits: {got:?}");
    }
}

/// Invariants of read-write locks (issue 18), where declared: readers share
/// and a writer is alone (INV-15), in strict FIFO order across modes (INV-16):
/// with two readers holding and a writer queued, a later reader's try is
/// busy and its wait is not granted while the writer waits or holds; the
/// readers' releases hand the lock to the writer, whose token (where fenced)
/// is above both readers'; the writer's release hands it to the later reader,
/// with a token above the writer's.
pub async fn shared_fifo_where_declared<T: Target>(t: &T) {
    let b = connect(&t.url()).await;
    if !b.capabilities().shared {
        return; // `sharing_where_declared` checks the refusal.
    }
    let shared = |wait| opts(30 * SECS, wait).shared();
    let r1 = within("reader", b.acquire("rw-fifo", &shared(Duration::ZERO))).await.unwrap().acquired().unwrap();
    let r2 = within("reader", b.acquire("rw-fifo", &shared(Duration::ZERO))).await.unwrap().acquired().unwrap();
    let w = connect(&t.url()).await;
    let writer = tokio::spawn(async move {
        let got = w.acquire("rw-fifo", &opts(30 * SECS, 25 * SECS)).await.unwrap().acquired().unwrap();
        (w, got)
    });
    // Once the writer is queued, a later reader's try is busy. Until it is
    // (its connection and its wait may take a while on a loaded machine), a
    // try may be granted: it is released and tried again; tries granted for
    // the whole of LIMIT are a reader barging past a queued writer.
    within("a later reader's try, busy once the writer queued", async {
        loop {
            tokio::time::sleep(300 * MS).await;
            match b.acquire("rw-fifo", &shared(Duration::ZERO)).await.unwrap() {
                Outcome::Busy { .. } => break,
                Outcome::Acquired(early) => assert!(early.release().await.unwrap(), "an early reader's release"),
                other => panic!("a later reader's try: {other:?}"),
            }
        }
    })
    .await;
    let l = connect(&t.url()).await;
    let late = tokio::spawn(async move {
        let got = l.acquire("rw-fifo", &shared(25 * SECS)).await.unwrap().acquired().unwrap();
        (l, got)
    });
    tokio::time::sleep(300 * MS).await;
    assert!(!writer.is_finished(), "a writer granted beside two readers");
    assert!(!late.is_finished(), "a later reader granted past a queued writer");
    let readers = [r1.token(), r2.token()];
    assert!(r1.release().await.unwrap() && r2.release().await.unwrap());
    let (_w, wg) = within("the writer after the readers", writer).await.unwrap();
    assert!(!late.is_finished(), "a reader granted beside a writer");
    let fenced = b.capabilities().fencing != Fencing::None;
    if fenced {
        let wt = wg.token().expect("a fenced backend gives a token");
        assert!(readers.iter().all(|r| r.expect("a reader's token") < wt), "writer {wt} after readers {readers:?}");
    }
    let writer_token = wg.token();
    assert!(wg.release().await.unwrap());
    let (_l, lg) = within("the later reader after the writer", late).await.unwrap();
    if fenced {
        assert!(lg.token() > writer_token, "reader {:?} after writer {writer_token:?}", lg.token());
    }
    assert!(lg.release().await.unwrap());
}

/// Invariant (a permit belongs to its holder's lease, issue 18 §2), where
/// semaphores are declared: the holder of a semaphore's only permit, cut off
/// from the backend (its connections held by a proxy), loses it (`lost()`
/// fires); a waiter is then granted the permit, with a larger token where
/// fenced, and the stale holder's release, once it can talk again, releases
/// nothing. Another N for the same semaphore is refused naming both values.
pub async fn permits_return_with_the_lease_where_declared<T: Target>(t: &T) {
    let b = connect(&t.url()).await;
    if !b.capabilities().semaphores {
        return; // `sharing_where_declared` checks the refusal.
    }
    let (proxied, proxies) = t.via_proxies().await;
    let cut = connect(&proxied).await;
    let one = opts(t.short_ttl(), Duration::ZERO).permits(1);
    let stale = within("permit", cut.acquire("permits", &one)).await.unwrap().acquired().unwrap();
    let other_n = within("another N", b.acquire("permits", &opts(10 * SECS, Duration::ZERO).permits(2))).await;
    assert!(
        matches!(&other_n, Err(Error::InvalidArgument(m)) if m.contains("has 1 permits") && m.contains("asked for 2")),
        "{other_n:?}"
    );
    let w = connect(&t.url()).await;
    let waiter = tokio::spawn(async move {
        let got = w.acquire("permits", &opts(30 * SECS, 25 * SECS).permits(1)).await.unwrap().acquired().unwrap();
        (w, got)
    });
    tokio::time::sleep(300 * MS).await;
    assert!(!waiter.is_finished(), "a second holder of one permit");
    for p in &proxies {
        p.set_mode(Mode::Hold);
    }
    let reason = within("lost() of a permit cut off", stale.lost()).await;
    assert!(matches!(reason, LeaseLost::Expired | LeaseLost::NotFound), "{reason:?}");
    let (_w, fresh) = within("the permit after the lease ended", waiter).await.unwrap();
    if let (Some(old), Some(new)) = (stale.token(), fresh.token()) {
        assert!(new > old, "token after a lost permit: {new} after {old}");
    }
    for p in &proxies {
        p.set_mode(Mode::Pass);
    }
    assert!(!within("release by a non-holder", stale.release()).await.unwrap(), "a stale permit released");
    assert!(!fresh.is_lost());
    assert!(fresh.release().await.unwrap());
}

/// Invariant (weighted acquire, INV-16 across weights): with 2 of 3 permits
/// held, a waiter for 2 is not granted, and once it is in the queue
/// ([`until_queued`]) a later try for the one free permit is busy (no
/// barging by a smaller request); the first holder's
/// release grants the waiter its 2 at once, with a larger token where
/// fenced. For backends whose semaphores take weights (called by their
/// modules, not by `conformance!`).
pub async fn weighted_permits_are_whole_and_in_order<T: Target>(t: &T) {
    let b = connect(&t.url()).await;
    let sem = |weight, wait| opts(30 * SECS, wait).permits(3).weight(weight);
    let first = within("two permits", b.acquire("weights", &sem(2, Duration::ZERO))).await.unwrap().acquired().unwrap();
    assert_waiters(t, "weights", 0).await;
    let c = connect(&t.url()).await;
    let waiter = tokio::spawn(async move {
        let got = c.acquire("weights", &sem(2, 25 * SECS)).await.unwrap().acquired().unwrap();
        (c, got)
    });
    until_queued(t, "weights", 1).await;
    match within("a try for one", b.acquire("weights", &sem(1, Duration::ZERO))).await.unwrap() {
        Outcome::Busy { .. } => {}
        other => panic!("a try for one free permit barged past a waiter for two: {other:?}"),
    }
    assert!(!waiter.is_finished(), "four permits of three");
    let old = first.token();
    assert!(first.release().await.unwrap());
    let (_c, second) = within("the waiter for two", waiter).await.unwrap();
    if let (Some(old), Some(new)) = (old, second.token()) {
        assert!(new > old, "token {new} after {old}");
    }
    assert!(second.release().await.unwrap());
}

/// Hold-at-least (issue 18), where declared: a lock released at once after
/// its grant stays closed to a try (busy, with the time until it reopens, at
/// most the hold) and is not held by anyone. A backend that does not declare
/// it refuses such an acquire with `Unsupported`, before anything is sent.
pub async fn hold_at_least_where_declared<T: Target>(t: &T) {
    let b = connect(&t.url()).await;
    let hold = 60 * SECS;
    let held = opts(10 * SECS, Duration::ZERO).hold_at_least(hold);
    if !b.capabilities().hold_at_least {
        let got = b.acquire("job", &held).await;
        assert!(matches!(got, Err(Error::Unsupported(_))), "hold-at-least: {got:?}");
        return;
    }
    let job = within("job", b.acquire("job", &held)).await.unwrap().acquired().unwrap();
    assert!(job.release().await.unwrap());
    let again = within("second run", b.acquire("job", &opts(10 * SECS, Duration::ZERO))).await.unwrap();
    match again {
        Outcome::Busy { holder_lease: None, reopens_in: Some(left), .. } => {
            assert!(left > Duration::ZERO && left <= hold, "reopens in {left:?}")
        }
        other => panic!("a closed lock with no holder expected: {other:?}"),
    }
}

/// Jobs that run once per slot (issue 18), where declared: a holder
/// completes its slot, and a later acquire for that slot fails with
/// `SlotDone` naming the token and exit code, while another slot is granted.
/// An acquire for the slot that waits while the run holds the lock fails
/// with the same `SlotDone` once the run completed the slot and released: it
/// is never granted. A backend that does not declare it refuses such an
/// acquire with `Unsupported`, before anything is sent.
pub async fn once_per_where_declared<T: Target>(t: &T) {
    let b = connect(&t.url()).await;
    let slot = opts(10 * SECS, Duration::ZERO).once_per("2026-11-23");
    if !b.capabilities().once_per {
        let got = b.acquire("cron", &slot).await;
        assert!(matches!(got, Err(Error::Unsupported(_))), "once-per: {got:?}");
        return;
    }
    let run = within("run", b.acquire("cron", &slot)).await.unwrap().acquired().unwrap();
    let token = run.token().unwrap();
    let c = connect(&t.url()).await;
    let waits = opts(10 * SECS, 20 * SECS).once_per("2026-11-23");
    let waiter = tokio::spawn(async move { c.acquire("cron", &waits).await.map(|a| a.acquired().is_ok()) });
    tokio::time::sleep(300 * MS).await;
    assert!(!waiter.is_finished(), "a waiter for a slot not done yet waits");
    assert!(within("complete", run.complete_slot("2026-11-23", 3)).await.unwrap());
    assert!(run.release().await.unwrap());
    let told = within("the waiter", waiter).await.unwrap();
    assert!(matches!(told, Err(Error::SlotDone { token: t, exit_code: 3, .. }) if t == token), "waiter: {told:?}");
    let again = within("again", b.acquire("cron", &slot)).await;
    assert!(
        matches!(again, Err(Error::SlotDone { token: t, exit_code: 3, .. }) if t == token),
        "a done slot: {again:?}"
    );
    let next = opts(10 * SECS, Duration::ZERO).once_per("2026-11-24");
    let other = within("another slot", b.acquire("cron", &next)).await.unwrap().acquired().unwrap();
    assert!(other.release().await.unwrap());
}

/// Atomic multi-locks (issue 18), where declared (INV-18): a try takes every
/// lock or none (a lock held elsewhere makes it busy, and the others stay
/// free); granted, it gives one guard per lock in the order named, each with
/// its own token (global fencing: increasing in that order); a waiting one is
/// granted once every lock is free; names twice is refused before anything is
/// sent. A backend that does not declare it refuses `acquire_all` with
/// `Unsupported`, before anything is sent.
pub async fn multi_lock_where_declared<T: Target>(t: &T) {
    let b = connect(&t.url()).await;
    let try_ = opts(10 * SECS, Duration::ZERO);
    if !b.capabilities().multi_lock {
        let got = b.acquire_all(&["m/a", "m/b"], &try_).await;
        assert!(matches!(got, Err(Error::Unsupported(_))), "multi-lock: {got:?}");
        return;
    }
    let other = connect(&t.url()).await;
    let held = within("m/b", other.acquire("m/b", &try_)).await.unwrap().acquired().unwrap();
    let busy = within("multi try", b.acquire_all(&["m/a", "m/b", "m/c"], &try_)).await.unwrap();
    assert!(matches!(busy, Outcome::Busy { .. }), "m/b is held: {busy:?}");
    let free = within("m/a", other.acquire("m/a", &try_)).await.unwrap().acquired().expect("nothing was taken");
    assert!(free.release().await.unwrap() && held.release().await.unwrap());

    let all = within("multi", b.acquire_all(&["m/c", "m/a", "m/b"], &try_)).await.unwrap().acquired().unwrap();
    let names: Vec<&str> = all.tokens().iter().map(|(n, _)| *n).collect();
    assert_eq!(names, ["m/c", "m/a", "m/b"]);
    let tokens: Vec<u64> = all.tokens().iter().map(|(_, t)| t.expect("a token per lock")).collect();
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "tokens in the order named: {tokens:?}");
    let taken = within("m/a taken", other.acquire("m/a", &try_)).await.unwrap();
    assert!(matches!(taken, Outcome::Busy { .. }), "m/a is held by the multi-lock: {taken:?}");

    let waiting = tokio::spawn(async move {
        let wait = opts(10 * SECS, 20 * SECS);
        other.acquire_all(&["m/b", "m/d"], &wait).await.map(|a| a.acquired().map(|g| g.tokens()[0].1))
    });
    assert!(!all.is_lost());
    assert!(all.release().await.unwrap(), "every lock was held and is released");
    let next = within("the waiting multi-lock", waiting).await.unwrap().unwrap().expect("granted once free").unwrap();
    assert!(next > tokens[2], "INV-2: {next:?} after {tokens:?}");

    let twice = b.acquire_all(&["m/a", "m/a"], &try_).await;
    assert!(matches!(twice, Err(Error::InvalidArgument(_))), "a name twice: {twice:?}");
}

/// The first of `tasks` to finish, and the others.
async fn first_finished<T>(
    mut tasks: Vec<tokio::task::JoinHandle<T>>,
) -> (Result<T, tokio::task::JoinError>, Vec<tokio::task::JoinHandle<T>>) {
    loop {
        if let Some(i) = tasks.iter().position(|t| t.is_finished()) {
            let done = tasks.remove(i);
            return (done.await, tasks);
        }
        tokio::time::sleep(10 * MS).await;
    }
}

/// Runs each body of the suite as its own test for `$target`.
#[macro_export]
macro_rules! conformance {
    ($target:ty) => {
        $crate::conformance!($target:
            mutual_exclusion, tokens_across_locks, contention_is_an_outcome,
            release_and_drop_free_the_lock, expiry_and_release_by_a_non_holder,
            lost_fires_when_the_connection_is_cut, fifo_where_declared, bad_input,
            names_are_opaque, with_lock_runs_and_releases, election_where_declared, sharing_where_declared,
            proclaim_where_declared, hold_at_least_where_declared, once_per_where_declared,
            shared_fifo_where_declared, permits_return_with_the_lease_where_declared,
            multi_lock_where_declared);
    };
    ($target:ty: $($body:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $body() {
                let target = <$target as $crate::suite::Target>::start().await;
                $crate::suite::$body(&target).await;
            }
        )*
    };
}
