//! Leader election over any backend: a candidate [`campaign`](super::LockBackend::campaign)s
//! for a lock and, once granted, holds a [`Leadership`] whose **term** is the
//! grant's fencing token; observers follow the [`Leader`] of a name as a
//! [`LeaderStream`] of [`LeaderEvent`]s.
//!
//! Where it sits: above the [`LockBackend`](super::LockBackend) trait. An
//! election is a lock: candidates wait in the lock's queue (FIFO where the
//! backend has it), the leader is the holder, its value is the value published
//! with the grant, and its term is the grant's token, so a
//! `fencelock-fence` fence given the term accepts the leader's writes and
//! refuses any earlier leader's. What each backend adds is how it shows the
//! holder ([`LockBackend::leader`](super::LockBackend::leader)) and how it
//! follows it ([`LockBackend::observe`](super::LockBackend::observe)); the
//! rule that an observer never sees a term go back is kept here, once, by
//! [`Terms`], whatever the backend's notifications deliver.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{Guard, LockBackend, Outcome};
use crate::error::Error;
use crate::lease::{LeaseLost, LeaseWatch};
use crate::types::LockOptions;
use crate::watch::WatchStream;

/// The leader of an election, as a reader sees it.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(client: fencelock::Client) -> Result<(), fencelock::Error> {
/// match client.election("db-primary").leader().await? {
///     Some(leader) => {
///         let addr = String::from_utf8_lossy(&leader.value);
///         println!("primary at {addr} (term {}, {:?})", leader.term, leader.identity);
///     }
///     None => println!("no primary now"),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    /// The election (lock) name.
    pub name: String,
    /// The leader's term: the fencing token of its grant. Every later leader's
    /// term is greater.
    pub term: u64,
    /// What the leader published ([`LockOptions::value`], or its last
    /// [`Leadership::proclaim`]).
    pub value: Vec<u8>,
    /// The identity its campaign carried, if any.
    pub identity: Option<String>,
}

/// One change an observer sees.
///
/// # Examples
///
/// Keep the address of the current leader from an observer's events. The enum
/// may grow: match the rest with `_`.
///
/// ```no_run
/// use fencelock::LeaderEvent;
///
/// fn primary_addr(event: &LeaderEvent) -> Option<String> {
///     match event {
///         LeaderEvent::Leader(leader) => Some(String::from_utf8_lossy(&leader.value).into_owned()),
///         LeaderEvent::Vacant { .. } => None,
///         _ => None,
///     }
/// }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaderEvent {
    /// A leader: a new one (a term above every term seen before), or the
    /// current one with a new value (same term, after a `proclaim`).
    Leader(Leader),
    /// The leader of `term` is gone (it resigned, or its lease ended), and
    /// nobody leads yet.
    Vacant { term: u64 },
}

impl LeaderEvent {
    /// The term the event is about.
    pub fn term(&self) -> u64 {
        match self {
            LeaderEvent::Leader(l) => l.term,
            LeaderEvent::Vacant { term } => *term,
        }
    }
}

/// The changes of one election, in order, each once, terms never going back.
/// It ends only with an error it cannot get past (a refused permission, a
/// compacted history); dropping it ends the observation.
///
/// # Examples
///
/// Follow an election. The current leader comes first, then every change; the
/// stream never goes back to an older term.
///
/// ```no_run
/// use fencelock::{Client, LeaderEvent};
///
/// # async fn demo(client: Client) -> Result<(), fencelock::Error> {
/// let mut changes = client.election("db-primary").observe().await?;
/// while let Some(change) = changes.next_event().await {
///     match change? {
///         LeaderEvent::Leader(l) => println!("term {}: {}", l.term, String::from_utf8_lossy(&l.value)),
///         LeaderEvent::Vacant { term } => println!("term {term} ended; nobody leads"),
///         _ => {}
///     }
/// }
/// # Ok(()) }
/// ```
pub type LeaderStream = WatchStream<LeaderEvent>;

/// Leadership won by a campaign: a held lock whose token is the [`term`](Self::term).
///
/// Pass the term to every resource the leader writes (a `fencelock-fence`
/// fence refuses writes with an older term), stop when [`lost`](Self::lost)
/// fires, and [`resign`](Self::resign) to hand over at once to the next
/// candidate. Dropping it resigns in the background.
///
/// # Examples
///
/// ```no_run
/// use fencelock::{Client, Error};
///
/// # async fn demo(client: Client) -> Result<(), Error> {
/// let mut leadership = client.election("scheduler").value("host-a:9000").campaign().await?;
/// // Moved to another port: observers see the same term with the new value.
/// match leadership.proclaim("host-a:9001").await {
///     Ok(()) => {}
///     Err(Error::LeaseNotFound(_)) => return Ok(()), // the term has ended: no longer leader
///     Err(e) => return Err(e),
/// }
/// // ... schedule, passing leadership.term() with every write ...
/// leadership.resign().await?; // the next candidate is elected now, not after the TTL
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Leadership {
    guard: Guard,
    term: u64,
    value: Vec<u8>,
}

impl Leadership {
    /// Leadership over `guard`, which published `value`. The guard must carry a
    /// token (elections need [`super::Fencing`] other than `None`).
    pub(crate) fn new(guard: Guard, value: Vec<u8>) -> Result<Leadership, Error> {
        let term = guard.fencing_token()?;
        Ok(Leadership { guard, term, value })
    }

    /// The election name.
    pub fn name(&self) -> &str {
        self.guard.name()
    }

    /// The term: the grant's fencing token, above every earlier leader's.
    pub fn term(&self) -> u64 {
        self.term
    }

    /// The value this leader publishes.
    pub fn value(&self) -> &[u8] {
        &self.value
    }

    /// Publishes `value` as this leader's new value, keeping the term:
    /// observers see the same term with the new value, `leader` shows it.
    /// [`Error::LeaseNotFound`] if the term has ended (nothing changed);
    /// [`Error::Unsupported`] where the backend cannot change a held lock's
    /// value. An error other than these leaves the outcome unknown: proclaim
    /// again.
    pub async fn proclaim(&mut self, value: impl Into<Vec<u8>>) -> Result<(), Error> {
        let value = value.into();
        if self.guard.set_value(value.clone()).await? {
            self.value = value;
            return Ok(());
        }
        Err(Error::LeaseNotFound(format!("{}: term {} has ended", self.name(), self.term)))
    }

    /// Gives the leadership up; the next candidate in line is elected at once.
    /// `Ok(true)`: it was held and is now given up; `Ok(false)`: it had been
    /// lost before. See [`Guard::release`].
    pub async fn resign(self) -> Result<bool, Error> {
        self.guard.release().await
    }

    /// Resolves when the leadership is lost (the lease expired or was revoked,
    /// or could not be renewed before its deadline). Cancel-safe.
    pub async fn lost(&self) -> LeaseLost {
        self.guard.lost().await
    }

    /// True once the leadership is lost.
    pub fn is_lost(&self) -> bool {
        self.guard.is_lost()
    }

    /// Resolves when renewals have failed for a third of the TTL: stop starting
    /// new work as leader. See [`Guard::jeopardy`].
    pub async fn jeopardy(&self) {
        self.guard.jeopardy().await
    }

    /// The last instant until which the leadership is provably held.
    pub fn deadline(&self) -> Instant {
        self.guard.deadline()
    }

    /// A handle on the lease state, to move into another task.
    pub fn lease_watch(&self) -> LeaseWatch {
        self.guard.lease_watch()
    }

    /// The lock guard behind the leadership.
    pub fn guard(&self) -> &Guard {
        &self.guard
    }

    /// The lock guard behind the leadership, to hold it as a lock (releasing
    /// the guard resigns).
    pub fn into_guard(self) -> Guard {
        self.guard
    }
}

/// The filter that keeps an observer's terms from going back: a backend's
/// notifications may repeat a change or deliver one that an earlier read
/// already showed; only news passes.
#[derive(Debug, Default)]
pub(crate) struct Terms {
    /// The highest term seen, and whether its leader is still in office (with
    /// the value last passed on).
    last: Option<(u64, Option<Vec<u8>>)>,
}

impl Terms {
    /// `ev` if it is news: a leader of a higher term, a new value of the
    /// current leader, the end of the current term, or the end of a term
    /// above every term seen (a leader that came and went unseen).
    pub(crate) fn admit(&mut self, ev: LeaderEvent) -> Option<LeaderEvent> {
        let last_term = self.last.as_ref().map(|(t, _)| *t);
        let news = match (&ev, &self.last) {
            (_, None) => true,
            (LeaderEvent::Leader(l), Some((t, current))) => {
                l.term > *t || (l.term == *t && current.as_ref().is_some_and(|v| *v != l.value))
            }
            (LeaderEvent::Vacant { term }, Some((t, current))) => *term > *t || (*term == *t && current.is_some()),
        };
        if !news {
            return None;
        }
        debug_assert!(last_term.is_none_or(|t| ev.term() >= t));
        self.last = Some(match &ev {
            LeaderEvent::Leader(l) => (l.term, Some(l.value.clone())),
            LeaderEvent::Vacant { term } => (*term, None),
        });
        Some(ev)
    }
}

/// Where a backend's observer task hands its changes: through [`Terms`], to
/// the reader of the [`LeaderStream`].
pub(crate) struct LeaderSink {
    tx: mpsc::Sender<Result<LeaderEvent, Error>>,
    terms: Terms,
}

impl LeaderSink {
    /// Hands `ev` on if it is news. `false` once the reader is gone: stop.
    pub(crate) async fn send(&mut self, ev: LeaderEvent) -> bool {
        match self.terms.admit(ev) {
            Some(ev) => self.tx.send(Ok(ev)).await.is_ok(),
            None => !self.tx.is_closed(),
        }
    }

    /// Hands on what a read of the current leader means, for a backend that
    /// reads the leader rather than receiving its changes: the end of the term
    /// last passed on if `current` is none or of a later term, then `current`.
    /// `false` once the reader is gone: stop.
    pub(crate) async fn show(&mut self, current: Option<Leader>) -> bool {
        let in_office = match &self.terms.last {
            Some((term, Some(_))) => Some(*term),
            _ => None,
        };
        if let Some(term) = in_office.filter(|t| current.as_ref().is_none_or(|l| l.term > *t)) {
            if !self.send(LeaderEvent::Vacant { term }).await {
                return false;
            }
        }
        match current {
            Some(leader) => self.send(LeaderEvent::Leader(leader)).await,
            None => !self.tx.is_closed(),
        }
    }

    /// Ends the stream with `error`.
    pub(crate) async fn fail(self, error: Error) {
        let _ = self.tx.send(Err(error)).await;
    }
}

/// How long [`Election::campaign`] waits before it asks again after a `Busy`.
const BUSY_RETRY: Duration = Duration::from_millis(100);

/// Changes an observer buffers before its task waits for the reader.
const BUFFER: usize = 64;

/// A [`LeaderStream`] fed by the task `observe` spawns with its sink.
pub(crate) fn leader_stream<F, Fut>(observe: F) -> LeaderStream
where
    F: FnOnce(LeaderSink) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = mpsc::channel(BUFFER);
    let task = tokio::spawn(observe(LeaderSink { tx, terms: Terms::default() }));
    WatchStream::new(rx, task.abort_handle())
}

/// An election being joined: `backend.election(name)`, options, then
/// [`campaign`](Election::campaign), or read with [`leader`](Election::leader)
/// and [`observe`](Election::observe).
///
/// # Examples
///
/// Campaign, then serve while elected. The term is the fencing token of the
/// leadership: pass it with every write, so that a deposed leader's late
/// writes are refused.
///
/// ```no_run
/// use std::time::Duration;
/// use fencelock::Client;
///
/// # async fn demo(client: Client) -> Result<(), fencelock::Error> {
/// let leadership = client
///     .election("db-primary")
///     .ttl(Duration::from_secs(10))
///     .value("10.0.0.7:5432")
///     .campaign() // waits in line until elected; drop the future to withdraw
///     .await?;
/// tokio::select! {
///     _ = serve_as_primary(leadership.term()) => {}
///     reason = leadership.lost() => eprintln!("no longer primary ({reason})"),
/// }
/// leadership.resign().await?;
/// # Ok(()) }
/// # async fn serve_as_primary(_term: u64) {}
/// ```
#[derive(Clone)]
#[must_use = "an election does nothing until `.campaign().await`"]
pub struct Election {
    backend: Arc<dyn LockBackend>,
    name: String,
    opts: LockOptions,
}

impl Election {
    pub(crate) fn new(backend: Arc<dyn LockBackend>, name: String) -> Election {
        Election { backend, name, opts: LockOptions::default() }
    }

    /// The candidate's lease TTL (default 15 s): a leader that stops renewing
    /// is replaced within it.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.opts = self.opts.ttl(ttl);
        self
    }

    /// What the leader publishes (≤ 4096 bytes; an address, say).
    pub fn value(mut self, value: impl Into<Vec<u8>>) -> Self {
        self.opts = self.opts.value(value);
        self
    }

    /// Who campaigns, shown with the leader (≤ 256 bytes).
    pub fn identity(mut self, identity: impl Into<String>) -> Self {
        self.opts = self.opts.identity(identity);
        self
    }

    /// Waits in line until elected, however long that takes (drop the future
    /// to withdraw; wrap it in a timeout to bound it). Fails at once, with
    /// [`Error::LeaseNotFound`], if the candidate's own lease is lost while it
    /// waits: a candidate whose lease ended is never elected.
    pub async fn campaign(self) -> Result<Leadership, Error> {
        // The longest wait a backend takes; a candidate still waiting after
        // it queues again (behind those who came meanwhile).
        let opts = self.opts.wait(super::MAX_WAIT);
        loop {
            match self.backend.campaign(&self.name, &opts).await? {
                Outcome::Acquired(leadership) => return Ok(leadership),
                Outcome::TimedOut => continue,
                // Not an answer to a wait; should a backend give it, do not
                // spin on it.
                Outcome::Busy { .. } => tokio::time::sleep(BUSY_RETRY).await,
            }
        }
    }

    /// Becomes leader only if nobody leads now: `Outcome::Busy` otherwise.
    pub async fn try_campaign(self) -> Result<Outcome<Leadership>, Error> {
        self.backend.campaign(&self.name, &self.opts.wait(Duration::ZERO)).await
    }

    /// The current leader, if any (a linearizable read where the backend has one).
    pub async fn leader(&self) -> Result<Option<Leader>, Error> {
        self.backend.leader(&self.name).await
    }

    /// The changes of this election from now on, starting with the current
    /// leader if there is one.
    pub async fn observe(&self) -> Result<LeaderStream, Error> {
        self.backend.observe(&self.name).await
    }
}

impl fmt::Debug for Election {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Election")
            .field("backend", &self.backend.kind())
            .field("name", &self.name)
            .field("opts", &self.opts)
            .finish()
    }
}

impl dyn LockBackend {
    /// The election `name` on this backend: `backend.election("db-primary")
    /// .value(addr).campaign()`.
    pub fn election(self: &Arc<Self>, name: impl Into<String>) -> Election {
        Election::new(self.clone(), name.into())
    }
}

/// The generic campaign of a backend whose acquire never starts over on a
/// fresh lease: the acquire, its grant as a [`Leadership`].
pub(crate) async fn campaign_by_acquire<B: LockBackend + ?Sized>(
    backend: &B,
    name: &str,
    opts: &LockOptions,
) -> Result<Outcome<Leadership>, Error> {
    leadership_of(backend.acquire(name, opts).await?, &opts.value)
}

/// A campaign's answer from its acquire's: the grant, which published
/// `value`, as a [`Leadership`].
pub(crate) fn leadership_of(acquired: Outcome<Guard>, value: &[u8]) -> Result<Outcome<Leadership>, Error> {
    match acquired {
        Outcome::Acquired(guard) => Ok(Outcome::Acquired(Leadership::new(guard, value.to_vec())?)),
        other => Ok(other.map(|_| unreachable!("the grant is matched above"))),
    }
}

/// The holder's identity and value as one byte string, for a backend that
/// keeps them in one stored value (an etcd key's value, a ZooKeeper node's
/// data, a column): the identity's length in two bytes (big-endian), the
/// identity (UTF-8, empty for none), then the value. No identity and no value
/// is the empty string, so a key written before values were stored reads as
/// exactly that.
pub(crate) fn encode_holder(opts: &LockOptions) -> Vec<u8> {
    encode_holder_parts(opts.identity.as_deref(), &opts.value)
}

/// [`encode_holder`] of `identity` and `value`: what a grant stores when it
/// replaces its value (`set_value`), keeping the identity of its request.
pub(crate) fn encode_holder_parts(identity: Option<&str>, value: &[u8]) -> Vec<u8> {
    let identity = identity.unwrap_or("").as_bytes();
    if identity.is_empty() && value.is_empty() {
        return Vec::new();
    }
    // check_identity keeps it far below 64 KiB.
    let len = u16::try_from(identity.len()).unwrap_or(u16::MAX);
    let mut out = Vec::with_capacity(2 + identity.len() + value.len());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&identity[..usize::from(len)]);
    out.extend_from_slice(value);
    out
}

/// The leader `name` of `term` from what [`encode_holder`] stored.
/// [`Error::Protocol`] for bytes it cannot have written (something else wrote
/// under the backend's keys).
pub(crate) fn decode_holder(name: &str, term: u64, stored: &[u8]) -> Result<Leader, Error> {
    let leader = |identity: Option<String>, value: &[u8]| Leader {
        name: name.to_string(),
        term,
        value: value.to_vec(),
        identity,
    };
    let Some((len, rest)) = stored.split_first_chunk::<2>() else {
        return match stored {
            [] => Ok(leader(None, &[])),
            _ => Err(malformed(name, "shorter than its length prefix")),
        };
    };
    let len = usize::from(u16::from_be_bytes(*len));
    if rest.len() < len {
        return Err(malformed(name, "an identity longer than the data"));
    }
    let (identity, value) = rest.split_at(len);
    let identity =
        String::from_utf8(identity.to_vec()).map_err(|_| malformed(name, "an identity that is not UTF-8"))?;
    Ok(leader((!identity.is_empty()).then_some(identity), value))
}

fn malformed(name: &str, why: &str) -> Error {
    Error::Protocol(format!("the holder data of {name:?} was not written by fencelock: {why}"))
}

/// The refusal of a backend without elections.
pub(crate) fn unsupported(kind: &str) -> Error {
    Error::Unsupported(format!(
        "{kind} has no leader election; use a backend that has one (fencelock, etcd, zk, redis, postgres in lease mode)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leader(term: u64, value: &str) -> LeaderEvent {
        LeaderEvent::Leader(Leader { name: "e".into(), term, value: value.into(), identity: None })
    }

    /// Rule (issue 17): an observer never sees a term go back, and sees each
    /// change once: repeats, stale leaders and stale vacancies are dropped; a
    /// new value of the current term and the end of the current term pass.
    #[test]
    fn terms_never_go_back_and_changes_pass_once() {
        let mut t = Terms::default();
        let mut admit = |ev: LeaderEvent| t.admit(ev);
        assert_eq!(admit(leader(5, "a")), Some(leader(5, "a")));
        assert_eq!(admit(leader(5, "a")), None, "a repeat");
        assert_eq!(admit(leader(4, "z")), None, "an older term");
        assert_eq!(admit(leader(5, "b")), Some(leader(5, "b")), "a proclaim");
        assert_eq!(admit(LeaderEvent::Vacant { term: 4 }), None, "an older vacancy");
        assert_eq!(admit(LeaderEvent::Vacant { term: 5 }), Some(LeaderEvent::Vacant { term: 5 }));
        assert_eq!(admit(LeaderEvent::Vacant { term: 5 }), None, "a repeated vacancy");
        assert_eq!(admit(leader(5, "c")), None, "the ended term's value");
        assert_eq!(admit(LeaderEvent::Vacant { term: 7 }), Some(LeaderEvent::Vacant { term: 7 }), "an unseen term");
        assert_eq!(admit(leader(7, "x")), None, "the leader of an ended term");
        assert_eq!(admit(leader(9, "d")), Some(leader(9, "d")));
    }

    /// Rule: identity and value stored by one backend read back the same,
    /// empty data is "no identity, no value", and bytes fencelock cannot
    /// have written are refused, not guessed at.
    #[test]
    fn holder_data_round_trips_and_foreign_data_is_refused() {
        let cases =
            [(None, &b""[..]), (Some("pod-7"), &b""[..]), (None, &b"10.0.0.1:80"[..]), (Some("h"), &[0, 1, 255][..])];
        for (identity, value) in cases {
            let mut opts = LockOptions::default().value(value);
            opts.identity = identity.map(String::from);
            let got = decode_holder("e", 7, &encode_holder(&opts)).unwrap();
            assert_eq!((got.term, got.identity.as_deref(), got.value.as_slice()), (7, identity, value));
        }
        assert_eq!(encode_holder(&LockOptions::default()), b"");
        assert_eq!(encode_holder(&LockOptions::default().identity("ab").value(&b"v"[..])), b"\0\x02abv");
        for foreign in [&b"x"[..], b"\0\x05ab", b"\0\x01\xff"] {
            assert!(matches!(decode_holder("e", 1, foreign), Err(Error::Protocol(_))), "{foreign:?}");
        }
    }

    /// Rule (issue 17): a backend that reads the leader shows each read as the
    /// changes since the last one: a new term ends the one shown before it,
    /// a read of nobody ends the term in office, a repeat or an older term
    /// shows nothing.
    #[tokio::test]
    async fn a_read_leader_shows_as_the_changes_since_the_last_read() {
        let (tx, mut rx) = mpsc::channel(16);
        let mut sink = LeaderSink { tx, terms: Terms::default() };
        let at = |term, value: &str| match leader(term, value) {
            LeaderEvent::Leader(l) => Some(l),
            _ => unreachable!(),
        };
        for read in [None, at(5, "a"), at(5, "a"), at(7, "b"), at(6, "z"), None, None, at(9, "c")] {
            assert!(sink.show(read).await);
        }
        drop(sink);
        let mut seen = Vec::new();
        while let Some(ev) = rx.recv().await {
            seen.push(ev.unwrap());
        }
        let vacant = |term| LeaderEvent::Vacant { term };
        assert_eq!(seen, [leader(5, "a"), vacant(5), leader(7, "b"), vacant(7), leader(9, "c")]);
    }

    #[test]
    fn the_first_change_always_passes() {
        assert_eq!(Terms::default().admit(LeaderEvent::Vacant { term: 3 }), Some(LeaderEvent::Vacant { term: 3 }));
    }
}
