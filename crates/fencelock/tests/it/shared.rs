//! Read-write locks and semaphores on the native server (issue 18), through
//! the public client: the engine's rules (INV-15 many readers or one writer,
//! never more than N permits; INV-16 strict FIFO across modes and weights;
//! INV-2 every grant its own increasing token) as a user sees them, over
//! gRPC, with `describe` showing every holder.

use crate::support;

use fencelock::{Client, Error, Guard, LockMode, Outcome, WatchKind};
use support::{acquired, eventually, waiters, within, Server, SECS};
use tokio::task::JoinHandle;

/// A request of `client` for `name` that waits, as a task.
fn queued(client: &Client, name: &'static str, shared: bool) -> JoinHandle<Result<Outcome<Guard>, Error>> {
    let client = client.clone();
    tokio::spawn(async move {
        let req = client.lock(name).ttl(30 * SECS).wait(20 * SECS);
        if shared { req.shared() } else { req }.acquire().await
    })
}

async fn granted(task: JoinHandle<Result<Outcome<Guard>, Error>>) -> Guard {
    acquired(within("a grant", task).await.unwrap().unwrap())
}

/// INV-15, INV-16 and downgrade: two readers share; a writer waits for them,
/// and a reader that comes after the writer waits behind it (no barging);
/// the writer's token is above both readers'; its downgrade admits the
/// reader queued behind it, beside it, with the writer's token unchanged.
#[tokio::test]
async fn readers_share_a_writer_waits_and_readers_never_pass_a_queued_writer() {
    let server = Server::start().await;
    let c = server.client().await;
    let r1 = acquired(c.lock("rw").shared().acquire().await.unwrap());
    let r2 = acquired(c.lock("rw").shared().acquire().await.unwrap());
    let info = c.describe("rw").await.unwrap();
    assert_eq!(
        info.holders.iter().map(|h| (h.token, h.mode)).collect::<Vec<_>>(),
        [(r1.token().unwrap(), LockMode::Shared), (r2.token().unwrap(), LockMode::Shared)]
    );
    let writer = queued(&c, "rw", false);
    eventually("the writer waits", || async { waiters(&c, "rw").await == 1 }).await;
    let late_reader = queued(&c, "rw", true);
    eventually("the late reader waits behind it", || async { waiters(&c, "rw").await == 2 }).await;
    match c.lock("rw").shared().acquire().await.unwrap() {
        Outcome::Busy { .. } => {}
        other => panic!("a try-reader passed a queued writer: {other:?}"),
    }
    let reader_tokens = (r1.token().unwrap(), r2.token().unwrap());
    assert!(r1.release().await.unwrap());
    assert!(!writer.is_finished(), "the writer was granted beside a reader");
    assert!(r2.release().await.unwrap());
    let w = granted(writer).await;
    assert!(w.token().unwrap() > reader_tokens.0.max(reader_tokens.1));
    assert!(!late_reader.is_finished(), "a reader was granted beside the writer");
    assert!(w.downgrade().await.unwrap());
    let reader = granted(late_reader).await;
    let info = c.describe("rw").await.unwrap();
    let shown: Vec<_> = info.holders.iter().map(|h| (h.token, h.mode)).collect();
    assert_eq!(shown, [(w.token().unwrap(), LockMode::Shared), (reader.token().unwrap(), LockMode::Shared)]);
    assert!(!w.downgrade().await.unwrap(), "a shared grant has nothing to downgrade");
    assert!(w.release().await.unwrap() && reader.release().await.unwrap());
}

/// INV-15 and INV-16 for semaphores: weights are all or nothing, a small
/// request never passes a larger one queued before it, a holder whose lease
/// ends gives its permits back, and another permit count is refused with a
/// message naming both.
#[tokio::test]
async fn a_semaphore_counts_weights_in_fifo_order_and_gets_permits_back_from_a_dead_lease() {
    let server = Server::start().await;
    // Each on a client (and so a lease) of its own.
    let (ca, c, cbig, other) =
        (server.client().await, server.client().await, server.client().await, server.client().await);
    let sem = |w: u32| c.lock("sem").permits(3).weight(w).ttl(30 * SECS);
    let a = acquired(ca.lock("sem").permits(3).weight(2).ttl(30 * SECS).acquire().await.unwrap());
    let b = acquired(sem(1).acquire().await.unwrap());
    assert!(a.token() < b.token());
    let big =
        tokio::spawn(
            async move { cbig.lock("sem").permits(3).weight(2).ttl(30 * SECS).wait(20 * SECS).acquire().await },
        );
    eventually("two permits asked for", || async { waiters(&c, "sem").await == 1 }).await;
    assert!(b.release().await.unwrap());
    // One permit is free, but the request before it wants two: no barging.
    match sem(1).acquire().await.unwrap() {
        Outcome::Busy { .. } => {}
        other => panic!("one permit passed a queued request for two: {other:?}"),
    }
    match c.lock("sem").permits(4).acquire().await {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("has 3 permits") && m.contains("asked for 4"), "{m}"),
        other => panic!("another permit count: {other:?}"),
    }
    // a's lease is revoked by someone else: its two permits come back.
    other.revoke_lease(a.lease_id()).await.unwrap();
    let big = granted(big).await;
    let info = c.describe("sem").await.unwrap();
    assert_eq!((info.permits, info.holders.iter().map(|h| h.weight).sum::<u32>()), (3, 2));
    assert!(big.release().await.unwrap());
}

/// Resize (issue 18 §2): a semaphore of one held by one client; a second
/// waits; a resize to two grants it at once (INV-15 with the new number,
/// INV-16 from the head of the queue). A resize below what is in use, or of
/// a lock that is not a semaphore, is refused with a message that says why,
/// and changes nothing; later acquires must name the new number.
#[tokio::test]
async fn a_resize_up_grants_the_waiter_and_a_resize_below_use_is_refused() {
    let server = Server::start().await;
    let c = server.client().await;
    let first = acquired(c.lock("pool").permits(1).acquire().await.unwrap());
    let waiter = {
        let c = c.clone();
        tokio::spawn(async move { c.lock("pool").permits(1).ttl(30 * SECS).wait(20 * SECS).acquire().await })
    };
    eventually("the second waits", || async { waiters(&c, "pool").await == 1 }).await;
    assert_eq!(c.resize("pool", 2).await.unwrap(), 1);
    let second = granted(waiter).await;
    assert!(second.token().unwrap() > first.token().unwrap());
    let err = c.resize("pool", 1).await.unwrap_err();
    assert!(
        matches!(&err, Error::InvalidArgument(m) if m.contains("cannot resize to 1 permits: 2 are needed")),
        "{err}"
    );
    assert_eq!(c.describe("pool").await.unwrap().permits, 2, "a refused resize changed the number");
    let stale = c.lock("pool").permits(1).acquire().await.unwrap_err();
    assert!(matches!(&stale, Error::InvalidArgument(m) if m.contains("the lock has 2 permits")), "{stale}");
    let _rw = acquired(c.lock("rw").acquire().await.unwrap());
    let err = c.resize("rw", 3).await.unwrap_err();
    assert!(
        matches!(&err, Error::InvalidArgument(m) if m.contains("\"rw\" is not a semaphore now") || m.contains("rw is not a semaphore now")),
        "{err}"
    );
}

/// Watchers of a read-write lock (issue 18): a writer's grant is exclusive, a
/// reader's shared, and a downgrade is its own event (same token, shared)
/// before the grant of the reader it lets in; so an observer never sees a
/// writer and a reader at once.
#[tokio::test]
async fn a_watch_tells_readers_from_writers_and_shows_a_downgrade() {
    let server = Server::start().await;
    let c = server.client().await;
    // From the start of the history: nothing the test does can come before it.
    let mut w = c.watch_from("rw-watched", Some(fencelock::Revision { index: 0, seq: 0 }));
    let writer = acquired(c.lock("rw-watched").acquire().await.unwrap());
    let reader = queued(&c, "rw-watched", true);
    eventually("the reader waits", || async { waiters(&c, "rw-watched").await == 1 }).await;
    assert!(writer.downgrade().await.unwrap());
    let reader = granted(reader).await;
    let mut seen = Vec::new();
    while seen.len() < 4 {
        let e = within("a watch event", w.next_event()).await.unwrap().unwrap();
        seen.push((e.kind, e.token, e.mode));
    }
    let (wt, rt) = (writer.token().unwrap(), reader.token().unwrap());
    assert_eq!(
        seen,
        [
            (WatchKind::Granted, wt, LockMode::Exclusive),
            (WatchKind::Queued, 0, LockMode::Exclusive),
            (WatchKind::Downgraded, wt, LockMode::Shared),
            (WatchKind::Granted, rt, LockMode::Shared),
        ]
    );
}
