//! Property test: the engine against a naive reference model, through the public
//! API only.
//!
//! Random runs of a few leases and four lock names (plus an invalid one), one
//! of them kept for a semaphore of [`SEM_PERMITS`]: random commands (invalid
//! ones included; shared, weighted and exclusive acquires, now and then one that
//! names the wrong number of permits; downgrades; multi-acquires of two or
//! three names, repeats and the semaphore's included; acquires once per one of
//! two slots, tries and waiters, and slot completions by holders; fences'
//! refusal reports), time jumps of 0 to 3 TTLs,
//! occasional `LeaderStart` on another clock, snapshot round trips, and retries of earlier
//! requests with the same request id. After every input:
//! - the engine's output equals the model's exactly (replies, effects, next
//!   deadline), and so do `stats`, `check`, `lock_info`, `lease_info` and
//!   `completed_slots`, at the engine's clock and ahead of it;
//! - an output-only oracle checks the invariants (ids as in `docs/design.md`):
//!   INV-1 at most one live holder per exclusive grant;
//!   INV-15 never more than N permits of a semaphore, never a writer beside
//!   anyone;
//!   INV-16 nobody is granted at once while someone is queued;
//!   INV-2 tokens strictly increase across all grants, never 0;
//!   INV-3 grants follow queue order among live waiters;
//!   INV-4 no grant to an expired or revoked lease;
//!   INV-5 a release ends only the grant it names;
//!   INV-6 a retried request never yields a second grant or another token;
//!   INV-8 LeaderStart expires nothing;
//!   INV-9 a rejected command changes nothing;
//!   INV-18 never a partial multi-lock: a multi-acquire's grants are made
//!   all in one step, in the order asked, with consecutive tokens;
//!   once per slot (issue 18 §4): no acquire for a slot is granted once that
//!   slot was completed on its lock, and every `SlotDone` (a reply, or a
//!   waiter's end) names the slot's first completion;
//! - a batch gives the same output as its commands applied one by one;
//! - a refusal report (issue 36) changes nothing and makes no effect;
//! - `step` never panics (a panic fails the test).
//!
//! A second property runs the same checks on contended runs of one read-write
//! lock and one semaphore (mostly waiting acquires, releases and downgrades by
//! the holders), where runs of readers and of small weights are granted
//! together, which the broad runs reach only rarely, and multi-acquires of
//! "a" and "b" in crossed orders queue behind each other and behind single
//! waiters.
//!
//! Cases: 1024 per property by default; set `PROPTEST_CASES` for more.

mod oracle;
mod reference;

use fencelock_core::*;
use proptest::prelude::*;

use oracle::Oracle;
use reference::Model;

/// Lock names: three for read-write locks, one for a semaphore ([`SEM`]), and
/// one that is always rejected.
const LOCKS: [&str; 5] = ["a", "b", "c", "s", "bad\u{7}"];

/// The index in [`LOCKS`] of the semaphore's name.
const SEM: usize = 3;

/// The permits the semaphore's acquires name (an odd one names one fewer).
const SEM_PERMITS: u32 = 3;

/// The slots acquires run once per.
const SLOTS: [&str; 2] = ["d1", "d2"];

/// Which lease a command names.
#[derive(Clone, Copy, Debug)]
enum LeasePick {
    /// The n-th lease alive before the batch (modulo their number).
    Live(usize),
    /// A lease that ended, or was never granted.
    Gone,
}

#[derive(Clone, Debug)]
enum Cmd {
    Grant {
        ttl: u64,
    },
    Keep {
        lease: LeasePick,
    },
    Revoke {
        lease: LeasePick,
    },
    Acquire {
        lease: LeasePick,
        lock: usize,
        wait: u64,
        delay: u64,
        /// Hold-at-least.
        hold: u64,
        shape: Shape,
        /// Once per this slot of [`SLOTS`].
        slot: Option<usize>,
    },
    /// A multi-acquire of `locks` (repeats and the semaphore's or the bad
    /// name included; `many`: 17 names instead, refused).
    AcquireAll {
        lease: LeasePick,
        locks: Vec<usize>,
        wait: u64,
        /// Lock-delay and hold-at-least, for every lock.
        closing: (u64, u64),
        shared: bool,
        many: bool,
    },
    /// A downgrade by the holder of `lock`, with its token, as the oracle
    /// knows it.
    DowngradeHeld {
        lock: usize,
    },
    /// Release by the holder of `lock`, with its token, as the oracle knows it.
    ReleaseHeld {
        lock: usize,
    },
    /// The holder of `lock` (as the oracle knows it) completes a slot of
    /// [`SLOTS`] with `exit_code`.
    CompleteHeld {
        lock: usize,
        slot: usize,
        exit_code: i32,
    },
    /// A new value from the holder of `lock`, with its token, as the oracle
    /// knows it (`len` bytes; over the limit is refused).
    SetValueHeld {
        lock: usize,
        len: usize,
    },
    /// A new value with an arbitrary lease and token (mostly wrong).
    SetValue {
        lease: LeasePick,
        lock: usize,
        token: u64,
    },
    /// Release with an arbitrary lease and token (mostly wrong).
    Release {
        lease: LeasePick,
        lock: usize,
        token: u64,
    },
    /// A fence's refusal report on `lock`: the refused token `refused`, the
    /// highest `refused + above` (`above` 0: not below it, refused), and a
    /// resource of `resource` bytes (over the limit is refused).
    Report {
        lock: usize,
        refused: u64,
        above: u64,
        resource: usize,
    },
    /// Cancel one of the last 8 acquires.
    Cancel {
        pick: usize,
    },
    /// Re-issue one of the last 12 commands verbatim.
    Retry {
        pick: usize,
    },
}

/// How an acquire shares its lock: `shared` (ignored on the semaphore), the
/// weight (over the permits is refused; above 1 is refused on a read-write
/// lock), and `odd`: the wrong permit count for the name (the semaphore's
/// minus one, or the semaphore's on a read-write name, which makes it a
/// semaphore if it is unused).
#[derive(Clone, Copy, Debug)]
struct Shape {
    shared: bool,
    weight: u32,
    odd: bool,
}

#[derive(Clone, Debug)]
enum Op {
    Tick(u64),
    /// A new leader at this instant, with a token floor relative to the
    /// counter (`Some(d)`: counter − 1 + d, so below, at and above it; or a jump
    /// of 2^31, a second of the wall clock) and maybe a cluster id.
    Leader(u64, Option<u64>, Option<u128>),
    Batch(u64, Vec<(Cmd, bool)>),
    Snapshot,
}

/// Token floors of a `LeaderStart`, relative to the counter (see [`Op::Leader`]).
fn floor() -> impl Strategy<Value = Option<u64>> {
    prop_oneof![3 => Just(None), 2 => (0..4u64).prop_map(Some), 1 => Just(Some(1u64 << 31))]
}

/// Time jumps: mostly small, sometimes up to 3 TTLs.
fn jump() -> impl Strategy<Value = u64> {
    prop_oneof![10 => 0..50u64, 4 => 0..300u64, 1 => 0..3000u64]
}

fn ttl() -> impl Strategy<Value = u64> {
    prop_oneof![4 => Just(1000u64), 2 => Just(300), 1 => Just(100), 1 => prop_oneof![Just(99), Just(MAX_TTL_MS + 1)]]
}

fn wait() -> impl Strategy<Value = u64> {
    let invalid = Just(MAX_WAIT_MS + 1);
    prop_oneof![8 => Just(0u64), 4 => Just(100), 6 => Just(500), 5 => Just(2000), 1 => invalid]
}

/// Hold-at-least: mostly none, sometimes shorter or longer than the grants
/// last, rarely one over the limit.
fn hold() -> impl Strategy<Value = u64> {
    let invalid = Just(MAX_HOLD_AT_LEAST_MS + 1);
    prop_oneof![10 => Just(0u64), 2 => Just(300), 2 => Just(1200), 1 => invalid]
}

fn delay() -> impl Strategy<Value = u64> {
    let invalid = Just(MAX_LOCK_DELAY_MS + 1);
    prop_oneof![10 => Just(0u64), 4 => Just(100), 5 => Just(400), 3 => Just(1500), 1 => invalid]
}

/// Lock picks: mostly "a" and the semaphore, so that requests contend and
/// queues grow (runs of readers, weights that do not fit).
fn lock() -> impl Strategy<Value = usize> {
    prop_oneof![8 => Just(0usize), 3 => Just(1usize), 2 => Just(2usize), 7 => Just(SEM), 1 => Just(4usize)]
}

fn shape() -> impl Strategy<Value = Shape> {
    let weight = prop_oneof![8 => Just(1u32), 3 => Just(2), 2 => Just(3), 1 => Just(0), 1 => Just(4)];
    (prop::bool::weighted(0.5), weight, prop::bool::weighted(0.05)).prop_map(|(shared, weight, odd)| Shape {
        shared,
        weight,
        odd,
    })
}

/// Value lengths: mostly small, sometimes empty or one byte over the limit.
fn value_len() -> impl Strategy<Value = usize> {
    prop_oneof![6 => 1..8usize, 2 => Just(0usize), 1 => Just(MAX_VALUE_BYTES + 1)]
}

fn lease() -> impl Strategy<Value = LeasePick> {
    prop_oneof![12 => (0..6usize).prop_map(LeasePick::Live), 1 => Just(LeasePick::Gone)]
}

fn cmd() -> impl Strategy<Value = Cmd> {
    prop_oneof![
        3 => ttl().prop_map(|ttl| Cmd::Grant { ttl }),
        5 => lease().prop_map(|lease| Cmd::Keep { lease }),
        1 => lease().prop_map(|lease| Cmd::Revoke { lease }),
        10 => (lease(), lock(), wait(), delay(), hold(), shape(), slot()).prop_map(
            |(lease, lock, wait, delay, hold, shape, slot)| Cmd::Acquire { lease, lock, wait, delay, hold, shape, slot }
        ),
        2 => complete_held(lock()),
        3 => acquire_all(lock(), wait(), (delay(), hold())),
        2 => lock().prop_map(|lock| Cmd::DowngradeHeld { lock }),
        4 => lock().prop_map(|lock| Cmd::ReleaseHeld { lock }),
        1 => (lease(), lock(), 0..8u64).prop_map(|(lease, lock, token)| Cmd::Release { lease, lock, token }),
        2 => (lock(), value_len()).prop_map(|(lock, len)| Cmd::SetValueHeld { lock, len }),
        1 => (lease(), lock(), 0..8u64).prop_map(|(lease, lock, token)| Cmd::SetValue { lease, lock, token }),
        2 => (0..8usize).prop_map(|pick| Cmd::Cancel { pick }),
        3 => (0..12usize).prop_map(|pick| Cmd::Retry { pick }),
        1 => report(),
    ]
}

/// Refusal reports: mostly valid, now and then a token 0, a refused token
/// not below the highest, or a resource one byte too long.
fn report() -> impl Strategy<Value = Cmd> {
    let resource = prop_oneof![6 => 0..16usize, 1 => Just(MAX_RESOURCE_BYTES + 1)];
    (lock(), prop_oneof![8 => 1..8u64, 1 => Just(0u64)], prop_oneof![8 => 1..4u64, 1 => Just(0u64)], resource)
        .prop_map(|(lock, refused, above, resource)| Cmd::Report { lock, refused, above, resource })
}

/// Mostly no slot; now and then one of [`SLOTS`].
fn slot() -> impl Strategy<Value = Option<usize>> {
    prop_oneof![5 => Just(None), 2 => (0..SLOTS.len()).prop_map(Some)]
}

/// A completion by the holder of one of `lock`'s picks, mostly of the first slot.
fn complete_held(lock: impl Strategy<Value = usize>) -> impl Strategy<Value = Cmd> {
    let slot = prop_oneof![3 => Just(0usize), 1 => Just(1usize)];
    (lock, slot, -1..3i32).prop_map(|(lock, slot, exit_code)| Cmd::CompleteHeld { lock, slot, exit_code })
}

/// Multi-acquires of 2 or 3 of `lock`'s picks (INV-18).
fn acquire_all(
    lock: impl Strategy<Value = usize>,
    wait: impl Strategy<Value = u64>,
    closing: impl Strategy<Value = (u64, u64)>,
) -> impl Strategy<Value = Cmd> {
    let locks = prop::collection::vec(lock, 2..4);
    (lease(), locks, wait, closing, prop::bool::weighted(0.3), prop::bool::weighted(0.03)).prop_map(
        |(lease, locks, wait, closing, shared, many)| Cmd::AcquireAll { lease, locks, wait, closing, shared, many },
    )
}

fn op() -> impl Strategy<Value = Op> {
    let cmds = prop::collection::vec((cmd(), prop::bool::weighted(0.02)), 1..4);
    prop_oneof![
        3 => jump().prop_map(Op::Tick),
        1 => (0..20_000u64, floor(), prop::option::of(0..3u128)).prop_map(|(n, f, c)| Op::Leader(n, f, c)),
        10 => (jump(), cmds).prop_map(|(j, c)| Op::Batch(j, c)),
        1 => Just(Op::Snapshot),
    ]
}

/// Commands of the contended runs: valid acquires of "a" and the semaphore,
/// mostly waiting, with releases and downgrades by their holders, so that
/// queues of readers, writers and weights form and drain.
fn contended_cmd() -> impl Strategy<Value = Cmd> {
    let lock = prop_oneof![Just(0usize), Just(SEM)];
    let wait = prop_oneof![1 => Just(0u64), 4 => Just(500), 2 => Just(2000)];
    let weight = prop_oneof![3 => Just(1u32), 2 => Just(2), 1 => Just(3)];
    let shape = (prop::bool::ANY, weight).prop_map(|(shared, weight)| Shape { shared, weight, odd: false });
    let hold = prop_oneof![8 => Just(0u64), 1 => Just(300)];
    let acquire = (lease(), lock.clone(), wait.clone(), hold, shape, slot()).prop_map(
        |(lease, lock, wait, hold, shape, slot)| Cmd::Acquire { lease, lock, wait, delay: 0, hold, shape, slot },
    );
    // Multi-acquires of "a" and "b" in either order (crossed orders, INV-18).
    let pair = prop_oneof![Just(vec![0usize, 1]), Just(vec![1usize, 0])];
    let closing = prop_oneof![8 => Just((0u64, 0u64)), 1 => Just((0, 300))];
    let all =
        (lease(), pair, wait, closing, prop::bool::weighted(0.3)).prop_map(|(lease, locks, wait, closing, shared)| {
            Cmd::AcquireAll { lease, locks, wait, closing, shared, many: false }
        });
    prop_oneof![
        1 => Just(Cmd::Grant { ttl: 1000 }),
        3 => lease().prop_map(|lease| Cmd::Keep { lease }),
        8 => acquire,
        3 => all,
        2 => Just(Cmd::ReleaseHeld { lock: 1 }),
        4 => lock.clone().prop_map(|lock| Cmd::ReleaseHeld { lock }),
        2 => complete_held(lock.clone()),
        2 => lock.prop_map(|lock| Cmd::DowngradeHeld { lock }),
        1 => (0..8usize).prop_map(|pick| Cmd::Cancel { pick }),
        1 => (0..12usize).prop_map(|pick| Cmd::Retry { pick }),
    ]
}

fn contended_op() -> impl Strategy<Value = Op> {
    let cmds = prop::collection::vec((contended_cmd(), Just(false)), 1..4);
    prop_oneof![1 => (0..100u64).prop_map(Op::Tick), 6 => (0..50u64, cmds).prop_map(|(j, c)| Op::Batch(j, c))]
}

/// Run `ops` after a first batch of grants `first`; the first failure.
fn run_all(first: Vec<(Cmd, bool)>, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut run = Run::new();
    let first = Op::Batch(0, first);
    for (i, op) in std::iter::once(&first).chain(ops).enumerate() {
        if let Err(msg) = run.op(op) {
            return Err(TestCaseError::fail(format!("op {i} {op:?}: {msg}")));
        }
    }
    Ok(())
}

/// One run: the engine, the model, the oracle, and what was issued so far.
struct Run {
    engine: Engine,
    model: Model,
    oracle: Oracle,
    now: u64,
    next_req: u64,
    newest_lease: u64,
    issued: Vec<Command>,
    acquires: Vec<(RequestId, LeaseId, String)>,
}

impl Run {
    fn new() -> Self {
        let (engine, model, oracle) = (Engine::new(), Model::default(), Oracle::default());
        let (issued, acquires) = (vec![], vec![]);
        Run { engine, model, oracle, now: 0, next_req: 1, newest_lease: 0, issued, acquires }
    }

    fn op(&mut self, op: &Op) -> Result<(), String> {
        match op {
            Op::Tick(j) => self.batch(*j, vec![]),
            Op::Batch(j, cmds) => {
                // Resolve at the batch's instant, so that "live" means live then.
                self.now += j;
                let cmds = cmds.iter().map(|(c, zero)| self.resolve(c, *zero)).collect();
                self.batch(0, cmds)
            }
            Op::Leader(now, floor, cluster) => {
                let counter = self.engine.stats().token_counter;
                let floor = floor.map_or(0, |d| (counter + d).saturating_sub(1));
                self.leader_start(*now, floor, cluster.map(ClusterId))
            }
            Op::Snapshot => self.snapshot(),
        }
    }

    fn req(&mut self, zero: bool) -> RequestId {
        if zero {
            return RequestId(0);
        }
        self.next_req += 1;
        RequestId(self.next_req)
    }

    fn lease(&self, pick: LeasePick) -> LeaseId {
        let ids = 1..=self.newest_lease;
        let live: Vec<u64> =
            ids.clone().filter(|id| self.engine.lease_info(self.now, LeaseId(*id)).is_some()).collect();
        let gone = ids.rev().find(|id| !live.contains(id)).unwrap_or(self.newest_lease + 1);
        match pick {
            LeasePick::Live(n) if !live.is_empty() => LeaseId(live[n % live.len()]),
            _ => LeaseId(gone),
        }
    }

    /// The `n`-th of the last `window` items of `v`.
    fn recent<T: Clone>(v: &[T], n: usize, window: usize) -> Option<T> {
        let start = v.len().saturating_sub(window);
        let tail = &v[start..];
        (!tail.is_empty()).then(|| tail[n % tail.len()].clone())
    }

    /// The first holder of lock `lock` with its token, as the oracle knows it;
    /// else any holder; else a guess.
    fn held(&self, lock: usize) -> (String, LeaseId, Token) {
        let lock = LOCKS[lock].to_string();
        let held: Vec<_> = self.oracle.holders().map(|(name, h)| (name.to_string(), h)).collect();
        let this = held.iter().find(|(name, _)| *name == lock).or(held.first()).cloned();
        let (lock, (lease, token)) = this.unwrap_or((lock, (LeaseId(1), Token(1))));
        (lock, lease, token)
    }

    /// Turn a generated command into a concrete one, given the run so far.
    fn resolve(&mut self, c: &Cmd, zero: bool) -> Command {
        let req = self.req(zero);
        match c {
            Cmd::Grant { ttl } => Command::GrantLease { req, ttl_ms: *ttl, id: None },
            Cmd::Keep { lease } => Command::KeepAlive { req, lease: self.lease(*lease) },
            Cmd::Revoke { lease } => Command::Revoke { req, lease: self.lease(*lease) },
            Cmd::Acquire { lease, lock: pick, wait, delay, hold, shape, slot } => {
                let (lease, lock) = (self.lease(*lease), LOCKS[*pick].to_string());
                self.acquires.push((req, lease, lock.clone()));
                // Every acquire names its lease as identity, so the oracle can
                // check that identities follow waiters into grants.
                let identity = reference::identity_of(lease.0);
                let (wait_ms, lock_delay_ms, value) = (*wait, *delay, Vec::new());
                let (mode, weight, permits) = shaped(*pick, *shape);
                let hold_at_least_ms = *hold;
                let acq = Acquire {
                    req,
                    lease,
                    lock,
                    wait_ms,
                    lock_delay_ms,
                    identity,
                    value,
                    mode,
                    weight,
                    permits,
                    hold_at_least_ms,
                    once_per: slot.map_or(String::new(), |s| SLOTS[s].to_string()),
                    also: Vec::new(),
                };
                Command::Acquire(acq)
            }
            Cmd::AcquireAll { lease, locks, wait, closing, shared, many } => {
                let lease = self.lease(*lease);
                let mut names: Vec<String> = locks.iter().map(|i| LOCKS[*i].to_string()).collect();
                if *many {
                    names = (0..=MAX_MULTI_LOCKS).map(|i| format!("m{i}")).collect();
                }
                // A cancel names its last lock (a multi-acquire leaves every
                // queue whichever of its locks the cancel names).
                self.acquires.push((req, lease, names[names.len() - 1].clone()));
                let mut acq = plain_acquire(req, lease, &names[0], *wait);
                acq.also = names[1..].to_vec();
                acq.mode = if *shared { Mode::Shared } else { Mode::Exclusive };
                (acq.lock_delay_ms, acq.hold_at_least_ms) = *closing;
                Command::Acquire(acq)
            }
            Cmd::DowngradeHeld { lock } => {
                let (lock, lease, token) = self.held(*lock);
                Command::Downgrade { req, lease, lock, token }
            }
            Cmd::ReleaseHeld { lock } => {
                let (lock, lease, token) = self.held(*lock);
                Command::Release { req, lease, lock, token }
            }
            Cmd::CompleteHeld { lock, slot, exit_code } => {
                let (lock, lease, token) = self.held(*lock);
                let (slot, exit_code) = (SLOTS[*slot].to_string(), *exit_code);
                Command::CompleteSlot { req, lease, lock, token, slot, exit_code }
            }
            Cmd::SetValueHeld { lock, len } => {
                let (lock, lease, token) = self.held(*lock);
                let value = vec![u8::try_from(req.0 % 256).unwrap_or(0); *len];
                Command::SetValue { req, lease, lock, token, value }
            }
            Cmd::SetValue { lease, lock, token } => {
                let (lease, lock) = (self.lease(*lease), LOCKS[*lock].to_string());
                Command::SetValue { req, lease, lock, token: Token(*token), value: b"v".to_vec() }
            }
            Cmd::Release { lease, lock, token } => {
                let (lease, lock) = (self.lease(*lease), LOCKS[*lock].to_string());
                Command::Release { req, lease, lock, token: Token(*token) }
            }
            Cmd::Report { lock, refused, above, resource } => Command::ReportRefusal {
                lock: LOCKS[*lock].to_string(),
                refused: Token(*refused),
                highest: Token(refused + above),
                resource: "r".repeat(*resource),
            },
            Cmd::Cancel { pick } => match Self::recent(&self.acquires, *pick, 8) {
                Some((req, lease, lock)) => Command::CancelWait { req, lease, lock },
                None => Command::CancelWait { req, lease: self.lease(LeasePick::Live(0)), lock: "a".into() },
            },
            Cmd::Retry { pick } => match Self::recent(&self.issued, *pick, 12) {
                Some(c) => c,
                None => Command::KeepAlive { req, lease: self.lease(LeasePick::Live(0)) },
            },
        }
    }

    fn batch(&mut self, jump: u64, cmds: Vec<Command>) -> Result<(), String> {
        self.now += jump;
        let input = Input::Batch { now: self.now, cmds: cmds.clone() };
        let before = self.engine.clone();
        let out = self.engine.step(&input);
        let expected = self.model.step(&input);
        if out != expected {
            return Err(format!("engine and model differ on {input:?}\nengine: {out:?}\nmodel:  {expected:?}"));
        }
        self.one_by_one(before, &cmds, &out)?;
        for (c, r) in cmds.iter().zip(&out.replies) {
            self.note(c, r);
        }
        self.compare_queries()
    }

    /// Apply the batch again to `shadow`, one command at a time, feeding the
    /// oracle in the order things happened; the result must be the same.
    fn one_by_one(&mut self, mut shadow: Engine, cmds: &[Command], out: &Output) -> Result<(), String> {
        let mut all = shadow.step(&Input::Batch { now: self.now, cmds: vec![] });
        self.oracle.effects(&all.effects)?;
        for c in cmds {
            let pre = shadow.clone();
            let o = shadow.step(&Input::Batch { now: self.now, cmds: vec![c.clone()] });
            if matches!(o.replies[0], Reply::Rejected(_)) && (shadow != pre || !o.effects.is_empty()) {
                return Err(format!("INV-9: rejected {c:?} changed the engine"));
            }
            if matches!(c, Command::ReportRefusal { .. }) && (shadow != pre || !o.effects.is_empty()) {
                return Err(format!("issue 36: the report {c:?} changed the engine"));
            }
            self.oracle.command(c, &o.effects, &o.replies[0])?;
            all.effects.extend(o.effects);
            all.replies.extend(o.replies);
        }
        all.next_deadline = shadow.next_deadline();
        if all != *out || shadow != self.engine {
            return Err(format!("batch differs from its commands one by one: {all:?} vs {out:?}"));
        }
        Ok(())
    }

    /// Remember what was issued, for retries and lease picks.
    fn note(&mut self, c: &Command, r: &Reply) {
        if let Reply::LeaseGranted { lease, .. } = r {
            self.newest_lease = self.newest_lease.max(lease.0);
        }
        self.issued.push(c.clone());
    }

    fn leader_start(&mut self, now: u64, token_floor: u64, cluster_id: Option<ClusterId>) -> Result<(), String> {
        self.now = now;
        let input = Input::LeaderStart { now, token_floor, cluster_id };
        let out = self.engine.step(&input);
        let expected = self.model.step(&input);
        if out != expected {
            return Err(format!("engine and model differ on {input:?}\nengine: {out:?}\nmodel:  {expected:?}"));
        }
        self.oracle.leader_start(&out)?;
        self.compare_queries()
    }

    fn snapshot(&mut self) -> Result<(), String> {
        let json = serde_json::to_string(&self.engine).map_err(|e| e.to_string())?;
        let back: Engine = serde_json::from_str(&json).map_err(|e| e.to_string())?;
        if back != self.engine {
            return Err("snapshot round trip changed the engine".into());
        }
        // Every state the engine reaches passes the check a received snapshot gets.
        back.check_consistency().map_err(|e| format!("consistency check refused a real state: {e}"))?;
        self.engine = back;
        Ok(())
    }

    /// Tokens worth a `check`: the first ones, each side of the counter and of
    /// every holder's token (the floor makes the tokens sparse).
    fn tokens_to_check(&self) -> Vec<u64> {
        let counter = self.engine.stats().token_counter;
        let held = self.oracle.holders().map(|(_, (_, t))| t.0);
        let around = held.chain([counter]).flat_map(|t| [t.saturating_sub(1), t, t + 1]);
        (0..3).chain(around).collect()
    }

    /// Queries agree with the model, now and 150 ms ahead (before any tick), and
    /// the engine's holders are the oracle's (INV-1, INV-4).
    fn compare_queries(&self) -> Result<(), String> {
        let (e, m, now) = (&self.engine, &self.model, self.engine.now());
        if e.cluster_id() != m.cluster_id() {
            return Err(format!("cluster id: engine {:?} model {:?}", e.cluster_id(), m.cluster_id()));
        }
        if e.stats() != m.stats() {
            return Err(format!("stats: engine {:?} model {:?}", e.stats(), m.stats()));
        }
        for at in [now, now + 150] {
            for lock in &LOCKS[..4] {
                if e.lock_info(at, lock) != m.lock_info(at, lock) {
                    return Err(format!(
                        "lock_info({at}, {lock}): {:?} vs {:?}",
                        e.lock_info(at, lock),
                        m.lock_info(at, lock)
                    ));
                }
                if e.completed_slots(at, lock) != m.completed_slots(at, lock) {
                    let (got, want) = (e.completed_slots(at, lock), m.completed_slots(at, lock));
                    return Err(format!("completed_slots({at}, {lock}): {got:?} vs {want:?}"));
                }
                for token in self.tokens_to_check() {
                    if e.check(at, lock, Token(token)) != m.check(at, lock, Token(token)) {
                        return Err(format!("check({at}, {lock}, {token}) differs"));
                    }
                }
            }
            for id in 0..=self.newest_lease + 1 {
                if e.lease_info(at, LeaseId(id)) != m.lease_info(at, id) {
                    return Err(format!("lease_info({at}, {id}) differs"));
                }
            }
        }
        for (lock, (_, token)) in self.oracle.holders() {
            if e.check(now, lock.as_str(), token) != Check::Current {
                return Err(format!("INV-1/INV-4: oracle holder {lock}/{token} is not current"));
            }
        }
        Ok(())
    }
}

/// An exclusive acquire of `lock` by `lease` naming its lease as identity.
fn plain_acquire(req: RequestId, lease: LeaseId, lock: &str, wait_ms: u64) -> Acquire {
    Acquire { identity: reference::identity_of(lease.0), ..Acquire::exclusive(req, lease, lock, wait_ms) }
}

/// The mode, weight and permits of an acquire of `LOCKS[pick]` shaped `s`.
fn shaped(pick: usize, s: Shape) -> (Mode, u32, u32) {
    let mode = if s.shared { Mode::Shared } else { Mode::Exclusive };
    match (pick == SEM, s.odd) {
        (true, false) => (mode, s.weight, SEM_PERMITS),
        (true, true) => (mode, s.weight, SEM_PERMITS - 1),
        (false, true) => (mode, s.weight, SEM_PERMITS),
        // A read-write lock: weight 1, or 2 (refused) when 0 or 4 was drawn.
        (false, false) => (mode, if matches!(s.weight, 0 | 4) { 2 } else { 1 }, 0),
    }
}

/// 1024 cases (about 2 s in debug); `PROPTEST_CASES` overrides. A failure is
/// saved to `tests/model.proptest-regressions` and replayed first next time.
fn config() -> ProptestConfig {
    let mut c = ProptestConfig::default();
    if std::env::var("PROPTEST_CASES").is_err() {
        c.cases = 1024;
    }
    let file = prop::test_runner::FileFailurePersistence::WithSource("proptest-regressions");
    c.failure_persistence = Some(Box::new(file));
    c
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn engine_matches_model_and_keeps_invariants(
        first in prop::collection::vec(ttl().prop_map(|ttl| (Cmd::Grant { ttl }, false)), 1..4),
        ops in prop::collection::vec(op(), 1..80),
    ) {
        run_all(first, &ops)?;
    }

    /// The same checks on runs that contend for one read-write lock and one
    /// semaphore (INV-15, INV-16: runs of readers granted together, writers
    /// and large weights holding back those behind them, downgrades).
    #[test]
    fn shared_locks_and_semaphores_under_contention_match_the_model(
        first in prop::collection::vec(Just((Cmd::Grant { ttl: 1000 }, false)), 3..5),
        ops in prop::collection::vec(contended_op(), 1..60),
    ) {
        run_all(first, &ops)?;
    }
}
