//! Per-lock metrics: where the contention is, and who holds on too long.
//!
//! The node's global counters say how much; these say where. For the `k`
//! busiest locks (`serve --lock-metrics-top`, default [`DEFAULT_TOP_K`]) the
//! node reports, over the last minute ([`WINDOW_MS`]): grants per second,
//! p50 and p99 of the wait in the queue and of the hold, and the queue depth
//! now; every other lock is summed into `fencelock_locks_other_*`. So the
//! number of series stays bounded whatever the number of locks. "Busiest" is
//! the most grants, waits and holds in the window plus the waiters now, so a
//! lock whose queue is stuck behind one holder ranks even with no grant.
//! Every value is a gauge over the window (a lock that enters or leaves the
//! top `k` breaks no counter).
//!
//! A **stuck holder** is a grant held for at least `serve --stuck-after`
//! (default [`DEFAULT_STUCK_AFTER`]) by a lease still live, that is still
//! renewed: `fencelock_stuck_holders` counts them, and
//! `fencelock_lock_held_seconds{lock}` names the `k` held longest. **Lease
//! losses** are counted by reason: `expired` (nobody renewed it within its
//! TTL: the owner died, paused or was cut off; the server cannot tell which,
//! which is why a TTL exists) and `revoked` (ended while it held locks).
//!
//! Fed by the driver with each applied effect and the time it applied it
//! (leader time, from the node's clock; the waits and holds themselves are
//! the engine's, in the group's clock); rendered from the engine's state at a
//! scrape. Nothing here reads a clock.
//!
//! Where it sits: beside [`crate::metrics`], which owns it and renders it
//! after the node's global metrics.

use std::collections::{HashMap, VecDeque};
use std::fmt::Write as _;
use std::sync::Mutex;

use fencelock_core::{Effect, Engine, LockName, Millis, ReleaseCause};

/// Locks reported one by one unless the node is told otherwise.
pub const DEFAULT_TOP_K: usize = 100;
/// How long a grant must be held by a live lease to count as stuck, unless
/// the node is told otherwise.
pub const DEFAULT_STUCK_AFTER: std::time::Duration = std::time::Duration::from_secs(3600);
/// The window the rates and percentiles cover.
pub const WINDOW_MS: u64 = 60_000;
/// The most recent waits (and holds) kept per lock for the percentiles.
const SAMPLES: usize = 256;
/// The most locks tracked at once; beyond it the least recently active go.
const MAX_TRACKED: usize = 10_000;

/// Recent activity of one lock.
#[derive(Debug, Default)]
struct Activity {
    /// When each recent grant was applied (at most [`SAMPLES`]).
    grants: VecDeque<Millis>,
    /// (applied at, ms waited) of recent grants after a wait.
    waits: VecDeque<(Millis, u64)>,
    /// (applied at, ms held) of recent releases.
    holds: VecDeque<(Millis, u64)>,
    /// When each recent stale write a fence refused was reported.
    refused: VecDeque<Millis>,
    last: Millis,
}

impl Activity {
    fn forget_before(&mut self, since: Millis) {
        while self.grants.front().is_some_and(|&t| t < since) {
            self.grants.pop_front();
        }
        while self.waits.front().is_some_and(|&(t, _)| t < since) {
            self.waits.pop_front();
        }
        while self.holds.front().is_some_and(|&(t, _)| t < since) {
            self.holds.pop_front();
        }
        while self.refused.front().is_some_and(|&t| t < since) {
            self.refused.pop_front();
        }
    }

    fn events(&self) -> u64 {
        (self.grants.len() + self.waits.len() + self.holds.len() + self.refused.len()) as u64
    }
}

fn push<T>(q: &mut VecDeque<T>, v: T) {
    if q.len() == SAMPLES {
        q.pop_front();
    }
    q.push_back(v);
}

#[derive(Debug, Default)]
struct Table {
    locks: HashMap<LockName, Activity>,
    /// Stale writes the fences reported refusing, since the node started.
    refused: u64,
    /// Leases lost, by reason.
    expired: u64,
    revoked: u64,
    /// The lease of the last revoked release seen: one loss per lease, not
    /// per lock it held (its releases come one after the other).
    last_revoked: Option<u64>,
}

/// The per-lock metrics of one node (see the module docs).
#[derive(Debug)]
pub struct LockMetrics {
    table: Mutex<Table>,
    top_k: usize,
    stuck_after_ms: u64,
}

impl Default for LockMetrics {
    fn default() -> Self {
        LockMetrics::new(DEFAULT_TOP_K, DEFAULT_STUCK_AFTER)
    }
}

/// What one scrape reports of one lock.
#[derive(Debug, Default, Clone, PartialEq)]
struct Row {
    grants_per_s: f64,
    wait_p50: Option<f64>,
    wait_p99: Option<f64>,
    hold_p50: Option<f64>,
    hold_p99: Option<f64>,
    depth: u64,
    refused: u64,
    score: u64,
}

impl LockMetrics {
    pub fn new(top_k: usize, stuck_after: std::time::Duration) -> LockMetrics {
        let stuck_after_ms = u64::try_from(stuck_after.as_millis()).unwrap_or(u64::MAX);
        LockMetrics { table: Mutex::default(), top_k, stuck_after_ms }
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One effect the node applied at `now` (its clock).
    pub fn effect(&self, now: Millis, e: &Effect) {
        let mut t = self.table();
        match e {
            Effect::Granted { grant, queued, waited_ms, .. } => {
                let a = t.activity(&grant.lock, now);
                push(&mut a.grants, now);
                if *queued {
                    push(&mut a.waits, (now, *waited_ms));
                }
            }
            Effect::Released { grant, held_ms, cause, .. } => {
                push(&mut t.activity(&grant.lock, now).holds, (now, *held_ms));
                if *cause == ReleaseCause::Revoked && t.last_revoked != Some(grant.lease.0) {
                    t.revoked += 1;
                    t.last_revoked = Some(grant.lease.0);
                }
            }
            Effect::LeaseExpired { .. } => t.expired += 1,
            Effect::WaitEnded { .. } | Effect::ValueChanged { .. } | Effect::Downgraded { .. } => {}
        }
    }

    /// A fence reported a stale write to `lock` it refused; this node
    /// applied the report at `now`.
    pub fn refused(&self, now: Millis, lock: &LockName) {
        let mut t = self.table();
        t.refused += 1;
        push(&mut t.activity(lock, now).refused, now);
    }

    /// Appends the per-lock families to `out`: activity up to `now` (the
    /// node's clock), queues and holds from `engine` at `engine_now` (the
    /// group's clock).
    pub fn render(&self, out: &mut String, engine: &Engine, now: Millis, engine_now: Millis) {
        let (stuck, long) = engine.long_holds(engine_now, self.stuck_after_ms, self.top_k);
        let deepest = engine.deepest_queues(self.top_k);
        let (rows, other, tracked, (expired, revoked, refused)) = {
            let mut t = self.table();
            t.forget_before(now.saturating_sub(WINDOW_MS));
            let (rows, other) = t.rows(&deepest, engine.stats().waiters, self.top_k);
            (rows, other, t.locks.len(), (t.expired, t.revoked, t.refused))
        };
        render_rows(out, &rows, &other);
        let _ = writeln!(
            out,
            "# HELP fencelock_writes_refused_total Stale writes the fences reported refusing (write_refused events this node applied since it started).\n\
             # TYPE fencelock_writes_refused_total counter\nfencelock_writes_refused_total {refused}"
        );
        let _ = writeln!(
            out,
            "# HELP fencelock_locks_tracked Locks with activity in the window (at most {MAX_TRACKED}).\n\
             # TYPE fencelock_locks_tracked gauge\nfencelock_locks_tracked {tracked}"
        );
        let threshold = self.stuck_after_ms as f64 / 1000.0;
        let _ = writeln!(
            out,
            "# HELP fencelock_stuck_holders Grants held at least fencelock_stuck_threshold_seconds by a lease still renewed.\n\
             # TYPE fencelock_stuck_holders gauge\nfencelock_stuck_holders {stuck}\n\
             # HELP fencelock_stuck_threshold_seconds How long a grant is held before it counts as stuck (serve --stuck-after).\n\
             # TYPE fencelock_stuck_threshold_seconds gauge\nfencelock_stuck_threshold_seconds {threshold}\n\
             # HELP fencelock_lock_held_seconds How long each stuck grant has been held (the longest, at most the top-k).\n\
             # TYPE fencelock_lock_held_seconds gauge"
        );
        for h in &long {
            let _ = writeln!(
                out,
                "fencelock_lock_held_seconds{{lock=\"{}\",token=\"{}\",identity=\"{}\"}} {}",
                label(h.lock.as_str()),
                h.token.0,
                label(&h.identity),
                h.held_ms as f64 / 1000.0
            );
        }
        let _ = writeln!(
            out,
            "# HELP fencelock_lease_losses_total Leases that ended without their owner's revoke: expired (not renewed within the TTL) or revoked (by another, while holding locks).\n\
             # TYPE fencelock_lease_losses_total counter\n\
             fencelock_lease_losses_total{{reason=\"expired\"}} {expired}\n\
             fencelock_lease_losses_total{{reason=\"revoked\"}} {revoked}"
        );
    }
}

impl Table {
    fn activity(&mut self, lock: &LockName, now: Millis) -> &mut Activity {
        if !self.locks.contains_key(lock) && self.locks.len() >= MAX_TRACKED {
            self.evict();
        }
        let a = self.locks.entry(lock.clone()).or_default();
        a.last = now;
        a
    }

    /// Drops the least recently active tenth of the table.
    fn evict(&mut self) {
        let mut lasts: Vec<Millis> = self.locks.values().map(|a| a.last).collect();
        let cut = lasts.len() / 10;
        let (_, &mut bound, _) = lasts.select_nth_unstable(cut);
        self.locks.retain(|_, a| a.last > bound);
    }

    fn forget_before(&mut self, since: Millis) {
        for a in self.locks.values_mut() {
            a.forget_before(since);
        }
        self.locks.retain(|_, a| a.events() > 0);
    }

    /// The top `k` locks' rows, busiest first (ties by name), and the sum of
    /// the rest. `deepest`: the locks with the longest queues now;
    /// `waiters`: all waiters now.
    fn rows(&self, deepest: &[(LockName, u64)], waiters: u64, k: usize) -> (Vec<(LockName, Row)>, Row) {
        let mut rows: HashMap<&LockName, Row> = self.locks.iter().map(|(n, a)| (n, row(a))).collect();
        for (name, depth) in deepest {
            rows.entry(name).or_default().depth = *depth;
        }
        let mut rows: Vec<(LockName, Row)> = rows
            .into_iter()
            .map(|(n, mut r)| {
                r.score += r.depth;
                (n.clone(), r)
            })
            .collect();
        rows.sort_by(|(an, a), (bn, b)| b.score.cmp(&a.score).then_with(|| an.cmp(bn)));
        let rest = rows.split_off(rows.len().min(k));
        let shown_depth: u64 = rows.iter().map(|(_, r)| r.depth).sum();
        let other = Row {
            grants_per_s: rest.iter().map(|(_, r)| r.grants_per_s).sum(),
            depth: waiters.saturating_sub(shown_depth),
            score: rest.len() as u64,
            ..Row::default()
        };
        (rows, other)
    }
}

/// A lock's row from its activity in the window.
fn row(a: &Activity) -> Row {
    let waits: Vec<u64> = a.waits.iter().map(|&(_, ms)| ms).collect();
    let holds: Vec<u64> = a.holds.iter().map(|&(_, ms)| ms).collect();
    Row {
        grants_per_s: a.grants.len() as f64 / (WINDOW_MS as f64 / 1000.0),
        wait_p50: quantile(waits.clone(), 0.5),
        wait_p99: quantile(waits, 0.99),
        hold_p50: quantile(holds.clone(), 0.5),
        hold_p99: quantile(holds, 0.99),
        depth: 0,
        refused: a.refused.len() as u64,
        // A refused write outranks any amount of traffic: it is the one thing
        // an operator must see.
        score: a.events() + 1000 * a.refused.len() as u64,
    }
}

/// The `q` quantile of `ms` in seconds (nearest rank), `None` if empty.
fn quantile(mut ms: Vec<u64>, q: f64) -> Option<f64> {
    if ms.is_empty() {
        return None;
    }
    ms.sort_unstable();
    let rank = ((q * ms.len() as f64).ceil() as usize).clamp(1, ms.len());
    Some(ms[rank - 1] as f64 / 1000.0)
}

fn render_rows(out: &mut String, rows: &[(LockName, Row)], other: &Row) {
    type Get = fn(&Row) -> Option<f64>;
    let families: [(&str, &str, Get); 7] = [
        ("fencelock_lock_grants_per_second", "Grants per second over the last minute, per busy lock.", |r| {
            Some(r.grants_per_s)
        }),
        ("fencelock_lock_queue_depth", "Waiters now, per busy lock.", |r| Some(r.depth as f64)),
        (
            "fencelock_lock_writes_refused",
            "Stale writes the fences reported refusing over the last minute, per lock (a lock with one ranks first).",
            |r| Some(r.refused as f64),
        ),
        ("fencelock_lock_wait_p50_seconds", "Median wait in the queue over the last minute, per busy lock.", |r| {
            r.wait_p50
        }),
        ("fencelock_lock_wait_p99_seconds", "99th percentile of the wait over the last minute, per busy lock.", |r| {
            r.wait_p99
        }),
        ("fencelock_lock_hold_p50_seconds", "Median hold over the last minute, per busy lock.", |r| r.hold_p50),
        ("fencelock_lock_hold_p99_seconds", "99th percentile of the hold over the last minute, per busy lock.", |r| {
            r.hold_p99
        }),
    ];
    for (name, help, get) in families {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for (lock, r) in rows {
            if let Some(v) = get(r) {
                let _ = writeln!(out, "{name}{{lock=\"{}\"}} {v}", label(lock.as_str()));
            }
        }
    }
    let _ = writeln!(
        out,
        "# HELP fencelock_locks_other_grants_per_second Grants per second over the last minute of the locks not reported one by one.\n\
         # TYPE fencelock_locks_other_grants_per_second gauge\nfencelock_locks_other_grants_per_second {}\n\
         # HELP fencelock_locks_other_queue_depth Waiters now at the locks not reported one by one.\n\
         # TYPE fencelock_locks_other_queue_depth gauge\nfencelock_locks_other_queue_depth {}\n\
         # HELP fencelock_locks_other Active locks not reported one by one (beyond --lock-metrics-top).\n\
         # TYPE fencelock_locks_other gauge\nfencelock_locks_other {}",
        other.grants_per_s, other.depth, other.score
    );
}

/// `s` as a Prometheus label value: backslash, double quote and newline
/// escaped (lock names and identities have no other control characters).
fn label(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use fencelock_core::{Grant, LeaseId, RequestId, Token};

    fn grant(lock: &str, lease: u64, token: u64) -> Grant {
        Grant { lock: LockName::new(lock).unwrap(), lease: LeaseId(lease), token: Token(token) }
    }

    fn granted(lock: &str, lease: u64, waited_ms: Option<u64>) -> Effect {
        Effect::Granted {
            grant: grant(lock, lease, lease),
            req: RequestId(lease),
            queued: waited_ms.is_some(),
            waited_ms: waited_ms.unwrap_or(0),
            tag: None,
            mode: Default::default(),
        }
    }

    fn released(lock: &str, lease: u64, held_ms: u64, cause: ReleaseCause) -> Effect {
        Effect::Released { grant: grant(lock, lease, lease), held_ms, cause, tag: None }
    }

    fn value(text: &str, series: &str) -> Option<f64> {
        text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    /// Rule: the busiest locks are reported one by one with their rate and
    /// percentiles over the window, the rest summed; a lock only queued on
    /// (no grant) ranks by its queue; what left the window is forgotten.
    #[test]
    fn the_busiest_locks_are_reported_and_the_rest_summed() {
        let m = LockMetrics::new(1, DEFAULT_STUCK_AFTER);
        for i in 0..30 {
            m.effect(1_000, &granted("hot", i, Some(10 * i)));
            m.effect(1_000, &released("hot", i, 100 + i, ReleaseCause::Released));
        }
        m.effect(1_000, &granted("cold", 99, None));
        let engine = Engine::new();
        let mut out = String::new();
        m.render(&mut out, &engine, 2_000, 0);
        assert_eq!(value(&out, "fencelock_lock_grants_per_second{lock=\"hot\"}"), Some(0.5));
        assert_eq!(value(&out, "fencelock_lock_wait_p50_seconds{lock=\"hot\"}"), Some(0.14));
        assert_eq!(value(&out, "fencelock_lock_wait_p99_seconds{lock=\"hot\"}"), Some(0.29));
        assert_eq!(value(&out, "fencelock_lock_hold_p99_seconds{lock=\"hot\"}"), Some(0.129));
        assert!(!out.contains("lock=\"cold\""), "beyond the top 1: {out}");
        assert_eq!(value(&out, "fencelock_locks_other_grants_per_second"), Some(1.0 / 60.0));
        assert_eq!(value(&out, "fencelock_locks_other"), Some(1.0));

        let mut later = String::new();
        m.render(&mut later, &engine, 1_000 + WINDOW_MS + 1, 0);
        assert!(!later.contains("lock=\"hot\""), "the window moved past it: {later}");
        assert_eq!(value(&later, "fencelock_locks_tracked"), Some(0.0));
    }

    /// Rule: a lease lost to a revoke counts once however many locks it
    /// held; expiries count per lease; a release by the holder is no loss.
    #[test]
    fn lease_losses_count_leases_by_reason() {
        let m = LockMetrics::default();
        m.effect(0, &released("a", 7, 5, ReleaseCause::Revoked));
        m.effect(0, &released("b", 7, 5, ReleaseCause::Revoked));
        m.effect(0, &released("c", 8, 5, ReleaseCause::Released));
        m.effect(0, &Effect::LeaseExpired { lease: LeaseId(9) });
        let mut out = String::new();
        m.render(&mut out, &Engine::new(), 0, 0);
        assert_eq!(value(&out, "fencelock_lease_losses_total{reason=\"revoked\"}"), Some(1.0));
        assert_eq!(value(&out, "fencelock_lease_losses_total{reason=\"expired\"}"), Some(1.0));
    }

    /// Rule: a lock with a refused stale write ranks above any busier lock,
    /// and the refusal is counted in the node's total.
    #[test]
    fn a_refused_write_ranks_its_lock_first() {
        let m = LockMetrics::new(1, DEFAULT_STUCK_AFTER);
        for i in 0..50 {
            m.effect(1_000, &granted("busy", i, None));
        }
        m.refused(1_000, &LockName::new("quiet").unwrap());
        let mut out = String::new();
        m.render(&mut out, &Engine::new(), 1_000, 0);
        assert_eq!(value(&out, "fencelock_lock_writes_refused{lock=\"quiet\"}"), Some(1.0));
        assert!(!out.contains("lock=\"busy\""), "{out}");
        assert_eq!(value(&out, "fencelock_writes_refused_total"), Some(1.0));
    }

    /// Rule: label values are escaped (a lock name may hold quotes).
    #[test]
    fn lock_names_are_escaped_in_labels() {
        assert_eq!(label("a\"b\\c"), "a\\\"b\\\\c");
    }
}
