//! The watch hub of one node: a bounded history (ring) of recent events and a
//! broadcast of live ones, and subscriptions that read both without a gap or a
//! duplicate.
//!
//! Gap-free: [`Hub::subscribe`] subscribes to the live broadcast and reads the
//! ring under the same mutex that [`Hub::publish`] holds while it appends and
//! broadcasts, so every event is either in what was read or still to come live.
//! A subscription remembers the next revision it wants and drops anything
//! older (live events it already replayed). Bounded: the ring holds at most
//! `capacity` events and the broadcast at most [`LIVE_BUFFER`] entries; a
//! subscriber that falls further behind the broadcast reads the ring again
//! from its next revision, and when the ring no longer holds it, it ends with
//! [`Compacted`] naming the oldest revision still available.
//!
//! It also counts the watches that follow one lock by name ([`Hub::follow`]):
//! how an election's candidates and observers follow it, shown as a lock's
//! `watchers` by the admin API and the dashboard.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::broadcast;

use super::events::{Event, Rev};

/// Default number of events a node keeps for watchers that resume.
pub const DEFAULT_HISTORY: usize = 100_000;
/// Entries (each with its events) the live broadcast buffers per subscriber
/// before a slow subscriber falls back to the ring.
pub const LIVE_BUFFER: usize = 1024;
/// Most watches one node serves at once.
pub const MAX_WATCHERS: usize = 10_000;

/// The requested revision is older than the oldest this node still holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("compacted: oldest available revision is {oldest}")]
pub struct Compacted {
    pub oldest: Rev,
}

/// Why a watch cannot start or go on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WatchError {
    #[error(transparent)]
    Compacted(#[from] Compacted),
    #[error("this node already serves {MAX_WATCHERS} watches")]
    TooManyWatchers,
}

/// What the live broadcast carries.
#[derive(Debug, Clone)]
enum Live {
    /// The events of one entry.
    Events(Arc<[Arc<Event>]>),
    /// History restarts at this revision (a snapshot was installed): what lies
    /// before it was never seen here.
    Reset(Rev),
}

#[derive(Debug)]
struct Ring {
    events: VecDeque<Arc<Event>>,
    capacity: usize,
    /// Every event at or after this revision is in `events` or still to come.
    floor: Rev,
    /// The revision after the last applied entry.
    next: Rev,
}

impl Ring {
    /// Appends `e`, evicting the oldest events beyond the capacity; the floor
    /// is then the oldest event still held.
    fn push(&mut self, e: Arc<Event>) {
        let mut evicted = false;
        while self.events.len() >= self.capacity.max(1) && self.events.pop_front().is_some() {
            evicted = true;
        }
        self.events.push_back(e);
        if evicted {
            self.floor = self.events.front().map_or(self.floor, |e| e.rev);
        }
    }

    /// The held events at or after `from`, or [`Compacted`].
    fn since(&self, from: Rev) -> Result<Vec<Arc<Event>>, Compacted> {
        if from < self.floor {
            return Err(Compacted { oldest: self.floor });
        }
        let start = self.events.partition_point(|e| e.rev < from);
        Ok(self.events.range(start..).cloned().collect())
    }
}

/// One node's watch hub; shared by the state machine (which publishes) and
/// the servers (which subscribe).
#[derive(Debug)]
pub struct Hub {
    ring: Mutex<Ring>,
    live: broadcast::Sender<Live>,
    watchers: AtomicUsize,
    max_watchers: usize,
    /// Watches of one lock by name, by lock (no entry: none).
    following: Mutex<HashMap<String, u32>>,
    /// Given every batch as it is published (see [`Hub::tap`]).
    tap: TapSlot,
}

/// A reader of every published batch, called on the applying thread.
pub type Tap = Box<dyn Fn(&[Arc<Event>]) + Send + Sync>;

#[derive(Default)]
struct TapSlot(OnceLock<Tap>);

impl std::fmt::Debug for TapSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.get().is_some() { "TapSlot(set)" } else { "TapSlot(none)" })
    }
}

impl Hub {
    /// A hub keeping `capacity` events, whose history starts at the entry
    /// `first_index` (the one after the state machine's snapshot).
    pub fn new(capacity: usize, first_index: u64) -> Arc<Hub> {
        Self::with_limits(capacity, first_index, LIVE_BUFFER, MAX_WATCHERS)
    }

    /// [`Hub::new`] with its live buffer and watcher bound chosen (tests).
    pub fn with_limits(capacity: usize, first_index: u64, live: usize, max_watchers: usize) -> Arc<Hub> {
        let floor = Rev::entry(first_index);
        let ring = Ring { events: VecDeque::new(), capacity, floor, next: floor };
        Arc::new(Hub {
            ring: Mutex::new(ring),
            live: broadcast::channel(live.max(1)).0,
            watchers: AtomicUsize::new(0),
            max_watchers,
            following: Mutex::new(HashMap::new()),
            tap: TapSlot::default(),
        })
    }

    fn ring(&self) -> std::sync::MutexGuard<'_, Ring> {
        // The ring stays consistent whatever panicked while holding it.
        self.ring.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records that the entry at `index` was applied with `events` (whose
    /// revisions are at `index`); called for every applied entry, in order.
    pub fn publish(&self, index: u64, events: Vec<Event>) {
        let mut ring = self.ring();
        ring.next = ring.next.max(Rev::entry(index.saturating_add(1)));
        if events.is_empty() {
            return;
        }
        let events: Arc<[Arc<Event>]> = events.into_iter().map(Arc::new).collect();
        for e in events.iter() {
            ring.push(e.clone());
        }
        let _ = self.live.send(Live::Events(events.clone()));
        drop(ring);
        if let Some(tap) = self.tap.0.get() {
            tap(&events);
        }
    }

    /// Gives `tap` every batch of events published from now on, as it is
    /// published, on the thread that applies the entry: unlike a
    /// [`Subscription`] it takes no watcher's slot, wakes no task and never
    /// falls behind, so it must be quick and must not block. A hub has one
    /// tap; a second is refused (false).
    #[must_use = "a refused tap sees nothing"]
    pub fn tap(&self, tap: Tap) -> bool {
        self.tap.0.set(tap).is_ok()
    }

    /// The state jumped to the snapshot ending at `last_index`: the events
    /// before it are unknown here. Watchers that still needed them end with
    /// [`Compacted`].
    pub fn reset(&self, last_index: u64) {
        let mut ring = self.ring();
        let floor = Rev::entry(last_index.saturating_add(1));
        ring.events.clear();
        (ring.floor, ring.next) = (floor, floor);
        let _ = self.live.send(Live::Reset(floor));
    }

    /// The oldest revision a watch may start from.
    pub fn oldest(&self) -> Rev {
        self.ring().floor
    }

    /// The revision the next applied entry will start at.
    pub fn next(&self) -> Rev {
        self.ring().next
    }

    /// A subscription from `from` (inclusive), or from the next applied entry.
    pub fn subscribe(self: &Arc<Self>, from: Option<Rev>) -> Result<Subscription, WatchError> {
        let slot = WatcherSlot::take(self)?;
        let ring = self.ring();
        let rx = self.live.subscribe();
        let next = from.unwrap_or(ring.next);
        let replay = ring.since(next)?;
        drop(ring);
        Ok(Subscription { hub: self.clone(), rx, next, replay: Some(replay), _slot: slot })
    }
}

impl Hub {
    fn following(&self) -> std::sync::MutexGuard<'_, HashMap<String, u32>> {
        self.following.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts a watch of the one lock `name` for as long as the returned
    /// guard lives.
    pub fn follow(self: &Arc<Self>, name: &str) -> Following {
        *self.following().entry(name.to_string()).or_default() += 1;
        Following { hub: self.clone(), name: name.to_string() }
    }

    /// Watches of the one lock `name` open on this node now.
    pub fn followers(&self, name: &str) -> u32 {
        self.following().get(name).copied().unwrap_or(0)
    }

    /// [`Hub::followers`] of each of `names`, in order, read under one lock
    /// (a list of up to 10,000 locks takes it once, not once per lock).
    pub fn followers_of<'a>(&self, names: impl IntoIterator<Item = &'a str>) -> Vec<u32> {
        let following = self.following();
        names.into_iter().map(|n| following.get(n).copied().unwrap_or(0)).collect()
    }
}

/// One watch of a lock by name, counted until dropped ([`Hub::follow`]).
#[derive(Debug)]
pub struct Following {
    hub: Arc<Hub>,
    name: String,
}

impl Drop for Following {
    fn drop(&mut self) {
        let mut following = self.hub.following();
        if let Some(n) = following.get_mut(&self.name) {
            *n -= 1;
            if *n == 0 {
                following.remove(&self.name);
            }
        }
    }
}

/// Counts a watcher for as long as it lives.
#[derive(Debug)]
struct WatcherSlot(Arc<Hub>);

impl WatcherSlot {
    fn take(hub: &Arc<Hub>) -> Result<WatcherSlot, WatchError> {
        let taken =
            hub.watchers.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < hub.max_watchers).then_some(n + 1));
        taken.map(|_| WatcherSlot(hub.clone())).map_err(|_| WatchError::TooManyWatchers)
    }
}

impl Drop for WatcherSlot {
    fn drop(&mut self) {
        self.0.watchers.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One watcher's position in the hub's events.
#[derive(Debug)]
pub struct Subscription {
    hub: Arc<Hub>,
    rx: broadcast::Receiver<Live>,
    /// The next revision this watcher wants: everything before it was delivered.
    next: Rev,
    /// Events read from the ring, not delivered yet.
    replay: Option<Vec<Arc<Event>>>,
    _slot: WatcherSlot,
}

impl Subscription {
    /// The next revision this subscription will deliver.
    pub fn position(&self) -> Rev {
        self.next
    }

    /// The next events in revision order (at least one), `Ok(None)` when the
    /// hub is gone (the node stops), or [`Compacted`] when this subscriber fell
    /// behind the history.
    pub async fn recv(&mut self) -> Result<Option<Vec<Arc<Event>>>, Compacted> {
        loop {
            if let Some(replay) = self.replay.take() {
                if let Some(batch) = self.take_new(replay.iter()) {
                    return Ok(Some(batch));
                }
            }
            match self.rx.recv().await {
                Ok(Live::Events(events)) => {
                    if let Some(batch) = self.take_new(events.iter()) {
                        return Ok(Some(batch));
                    }
                }
                Ok(Live::Reset(floor)) if self.next < floor => return Err(Compacted { oldest: floor }),
                Ok(Live::Reset(_)) => {}
                Err(broadcast::error::RecvError::Lagged(_)) => self.replay = Some(self.hub.ring().since(self.next)?),
                Err(broadcast::error::RecvError::Closed) => return Ok(None),
            }
        }
    }

    /// The events of `events` at or after the next wanted revision; moves it on.
    fn take_new<'a>(&mut self, events: impl Iterator<Item = &'a Arc<Event>>) -> Option<Vec<Arc<Event>>> {
        let batch: Vec<_> = events.filter(|e| e.rev >= self.next).cloned().collect();
        let last = batch.last()?;
        self.next = last.rev.next();
        Some(batch)
    }
}

#[cfg(test)]
mod tests {
    use super::super::events::Kind;
    use super::*;

    /// A lock's followers are the watches of it by name open now: counted
    /// while their guards live, per lock, and forgotten at zero.
    #[test]
    fn followers_count_the_open_watches_of_one_lock() {
        let hub = Hub::new(16, 1);
        let a1 = hub.follow("db-primary");
        let a2 = hub.follow("db-primary");
        let b = hub.follow("other");
        assert_eq!((hub.followers("db-primary"), hub.followers("other"), hub.followers("none")), (2, 1, 0));
        assert_eq!(hub.followers_of(["none", "other", "db-primary"]), vec![0, 1, 2], "a list, in its order");
        drop(a1);
        assert_eq!(hub.followers("db-primary"), 1);
        drop((a2, b));
        assert_eq!((hub.followers("db-primary"), hub.followers("other")), (0, 0));
        assert!(hub.following().is_empty(), "no entry kept for a lock nobody follows");
    }

    fn ev(index: u64, seq: u32) -> Event {
        let lock = format!("l{index}");
        Event {
            rev: Rev { index, seq },
            kind: Kind::Granted,
            lock,
            lease: 1,
            token: index,
            identity: String::new(),
            reason: "",
            value: Vec::new(),
            shared: false,
            highest: 0,
            resource: String::new(),
        }
    }

    /// Publishes entries `indexes`, each with `per` events.
    fn publish(hub: &Hub, indexes: std::ops::RangeInclusive<u64>, per: u32) {
        for i in indexes {
            hub.publish(i, (0..per).map(|s| ev(i, s)).collect());
        }
    }

    fn revs(events: &[Arc<Event>]) -> Vec<(u64, u32)> {
        events.iter().map(|e| (e.rev.index, e.rev.seq)).collect()
    }

    /// Everything `sub` delivers until nothing is ready right now.
    async fn drain(sub: &mut Subscription) -> Result<Vec<(u64, u32)>, Compacted> {
        let mut out = Vec::new();
        loop {
            // A zero timeout polls once: what is ready now, nothing more.
            match tokio::time::timeout(std::time::Duration::ZERO, sub.recv()).await {
                Ok(Ok(Some(b))) => out.extend(revs(&b)),
                Ok(Ok(None)) | Err(_) => return Ok(out),
                Ok(Err(c)) => return Err(c),
            }
        }
    }

    fn all(indexes: std::ops::RangeInclusive<u64>, per: u32) -> Vec<(u64, u32)> {
        indexes.flat_map(|i| (0..per).map(move |s| (i, s))).collect()
    }

    /// Rule: a tap is given every non-empty batch as it is published, in
    /// order, and only one tap is taken per hub.
    #[test]
    fn a_tap_sees_every_published_batch_in_order() {
        let hub = Hub::new(16, 1);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let into = seen.clone();
        let tap: Tap = Box::new(move |batch| into.lock().unwrap().push(revs(batch)));
        assert!(hub.tap(tap));
        assert!(!hub.tap(Box::new(|_| {})), "a second tap is refused");
        publish(&hub, 1..=2, 2);
        hub.publish(3, Vec::new());
        publish(&hub, 4..=4, 1);
        let batches = vec![vec![(1, 0), (1, 1)], vec![(2, 0), (2, 1)], vec![(4, 0)]];
        assert_eq!(*seen.lock().unwrap(), batches);
    }

    /// Rule: the ring holds at most `capacity` events; the floor moves past
    /// each evicted one.
    #[test]
    fn the_ring_keeps_at_most_its_capacity() {
        let hub = Hub::new(5, 1);
        publish(&hub, 1..=4, 2);
        let ring = hub.ring();
        assert_eq!(ring.events.len(), 5);
        assert_eq!(ring.floor, Rev { index: 2, seq: 1 });
        assert_eq!(ring.events.front().map(|e| e.rev), Some(ring.floor));
        assert_eq!(ring.next, Rev::entry(5));
    }

    /// Rule: resuming from any revision still held gives exactly the events
    /// from it on (inclusive), for every boundary: entry starts, positions
    /// inside an entry, the floor, the next revision, and past the end.
    #[tokio::test]
    async fn resume_from_every_boundary_has_no_gap_and_no_duplicate() {
        let hub = Hub::new(100, 1);
        publish(&hub, 1..=5, 3);
        let everything = all(1..=5, 3);
        for (i, from) in everything.iter().copied().chain([(6, 0), (3, 7)]).enumerate() {
            let mut sub = hub.subscribe(Some(Rev { index: from.0, seq: from.1 })).unwrap();
            let want: Vec<_> = everything.iter().copied().filter(|r| *r >= from).collect();
            assert_eq!(drain(&mut sub).await.unwrap(), want, "from {from:?} (case {i})");
        }
    }

    /// Rule: no gap and no duplicate between the replayed history and the
    /// live events that follow (subscribe first, then replay, skip replayed).
    #[tokio::test]
    async fn replay_then_live_has_no_gap_and_no_duplicate() {
        let hub = Hub::new(100, 1);
        publish(&hub, 1..=3, 2);
        let mut sub = hub.subscribe(Some(Rev { index: 2, seq: 1 })).unwrap();
        publish(&hub, 4..=6, 2);
        let mut want = vec![(2, 1)];
        want.extend(all(3..=6, 2));
        assert_eq!(drain(&mut sub).await.unwrap(), want);
        publish(&hub, 7..=7, 1);
        assert_eq!(drain(&mut sub).await.unwrap(), vec![(7, 0)]);
    }

    /// Rule: a watch without `from` gets only what is applied after it starts.
    #[tokio::test]
    async fn without_from_only_new_events() {
        let hub = Hub::new(100, 1);
        publish(&hub, 1..=3, 1);
        let mut sub = hub.subscribe(None).unwrap();
        publish(&hub, 4..=5, 1);
        assert_eq!(drain(&mut sub).await.unwrap(), vec![(4, 0), (5, 0)]);
    }

    /// Rule: a follower that has not applied `from` yet waits for it; it
    /// skips nothing at or after `from`.
    #[tokio::test]
    async fn a_from_ahead_of_the_node_waits_for_it() {
        let hub = Hub::new(100, 1);
        publish(&hub, 1..=2, 1);
        let mut sub = hub.subscribe(Some(Rev::entry(5))).unwrap();
        assert_eq!(drain(&mut sub).await.unwrap(), Vec::<(u64, u32)>::new());
        publish(&hub, 3..=6, 1);
        assert_eq!(drain(&mut sub).await.unwrap(), vec![(5, 0), (6, 0)]);
    }

    /// Rule: a revision older than the ring's oldest is refused with
    /// `compacted` naming the oldest revision available; the oldest itself is
    /// accepted.
    #[tokio::test]
    async fn too_old_is_compacted_with_the_oldest_revision() {
        let hub = Hub::new(4, 1);
        publish(&hub, 1..=4, 2);
        let oldest = Rev { index: 3, seq: 0 };
        assert_eq!(hub.oldest(), oldest);
        let err = hub.subscribe(Some(Rev { index: 2, seq: 1 })).unwrap_err();
        assert_eq!(err, WatchError::Compacted(Compacted { oldest }));
        assert_eq!(err.to_string(), "compacted: oldest available revision is 3.0");
        let mut sub = hub.subscribe(Some(oldest)).unwrap();
        assert_eq!(drain(&mut sub).await.unwrap(), all(3..=4, 2));
    }

    /// Rule: a receiver that lags the live buffer reads the ring again and
    /// still gets every event once, in order.
    #[tokio::test]
    async fn a_lagging_receiver_catches_up_from_the_ring() {
        let hub = Hub::with_limits(1000, 1, 2, 10);
        let mut sub = hub.subscribe(None).unwrap();
        publish(&hub, 1..=20, 2);
        assert_eq!(drain(&mut sub).await.unwrap(), all(1..=20, 2));
    }

    /// Rule: a receiver that lags past what the ring still holds ends with
    /// `compacted` (the server's memory does not grow for it).
    #[tokio::test]
    async fn a_receiver_behind_the_ring_ends_compacted() {
        let hub = Hub::with_limits(6, 1, 2, 10);
        let mut sub = hub.subscribe(None).unwrap();
        publish(&hub, 1..=20, 2);
        assert_eq!(drain(&mut sub).await, Err(Compacted { oldest: Rev::entry(18) }));
    }

    /// Rule: a snapshot install restarts the history; a watcher that still
    /// needed events before it ends with `compacted`.
    #[tokio::test]
    async fn a_reset_ends_watchers_that_needed_what_it_skipped() {
        let hub = Hub::new(100, 1);
        publish(&hub, 1..=2, 1);
        let mut sub = hub.subscribe(None).unwrap();
        hub.reset(10);
        assert_eq!(drain(&mut sub).await, Err(Compacted { oldest: Rev::entry(11) }));
        assert_eq!(
            hub.subscribe(Some(Rev::entry(2))).unwrap_err(),
            WatchError::Compacted(Compacted { oldest: Rev::entry(11) })
        );
    }

    /// Rule: a node serves at most its bound of watches; a finished one frees
    /// its place.
    #[test]
    fn watchers_are_bounded() {
        let hub = Hub::with_limits(10, 1, 4, 2);
        let a = hub.subscribe(None).unwrap();
        let _b = hub.subscribe(None).unwrap();
        assert_eq!(hub.subscribe(None).unwrap_err(), WatchError::TooManyWatchers);
        drop(a);
        assert!(hub.subscribe(None).is_ok());
    }

    #[test]
    fn revisions_parse_and_print() {
        assert_eq!("12.3".parse::<Rev>().unwrap(), Rev { index: 12, seq: 3 });
        assert_eq!("12".parse::<Rev>().unwrap(), Rev::entry(12));
        assert!("x".parse::<Rev>().is_err());
        assert_eq!(Rev { index: 7, seq: u32::MAX }.next(), Rev::entry(8));
        assert_eq!(Rev { index: 7, seq: 1 }.to_string(), "7.1");
    }
}
