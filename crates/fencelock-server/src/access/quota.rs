//! Limits on what one identity, and everyone together, may hold: live leases,
//! held locks, queued acquires, and requests per second.
//!
//! Where it sits: in `api::Ops`, after authentication and permissions
//! and before anything is proposed, so a refused request costs no disk. The
//! counts come from the engine ([`fencelock_core::Engine::usage`] for an
//! identity, [`fencelock_core::Engine::stats`] for all), as applied when the
//! request arrives: requests in flight at that moment are not counted yet, so
//! a burst can pass a limit by the number of its requests still in flight
//! (each of which is bounded in size and by the connection limits).
//!
//! What a check costs: a lease is counted in O(1); a lock counts the
//! identity's leases' holds and waits (at most its lease quota), and the global
//! held locks and waiters come from [`Engine::stats`] taken at most every
//! [`STATS_EVERY`] (it walks every lock), so they may lag by that much.
//!
//! Over a limit a request gets RESOURCE_EXHAUSTED naming the limit and its
//! value; `fencelock_limit_refusals_total{limit}` counts refusals per limit.
//! Without authentication only the global limits apply.
//!
//! Fences' refusal reports (`ReportRefusal`, issue 36) have a rate of their
//! own, per node and whoever sends them ([`Quotas::report`]:
//! [`REPORTS_PER_SECOND`], bursts of [`REPORTS_BURST`]), besides the request
//! rate of the identity that sends them: each report is a log entry on every
//! member, so a fence stuck in a loop of stale writes (or a caller with
//! `check` that floods) cannot fill the log and the watch history.

use std::{
    collections::HashMap,
    sync::{atomic::AtomicU64, atomic::Ordering::Relaxed, Mutex},
    time::Instant,
};

use fencelock_core::Engine;

/// What one identity may have at once (0 means no limit); the auth file and
/// the group's policy may give an identity its own values (see [`crate::access::auth`]).
pub use fencelock_core::Quota;

/// What all identities together may have at once; 0 means no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Global {
    pub leases: u64,
    pub locks: u64,
    pub waiters: u64,
}

impl Default for Global {
    /// About 1 GB of memory at the most (a lease holding a lock with a full
    /// retry memory takes a few KB).
    fn default() -> Self {
        Global { leases: 200_000, locks: 200_000, waiters: 200_000 }
    }
}

/// The limits of a node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    /// For each identity that has no values of its own.
    pub per_identity: Quota,
    pub global: Global,
}

/// The limits a request ran into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("limit reached: {limit} = {value}")]
pub struct Exhausted {
    pub limit: &'static str,
    pub value: u64,
}

/// Every limit, in the order of the refusal counters.
const LIMITS: [&str; 8] = [
    "leases_per_identity",
    "locks_per_identity",
    "waits_per_identity",
    "requests_per_second_per_identity",
    "leases",
    "locks",
    "waiters",
    "refusal_reports_per_second",
];

/// Refusal reports a node takes per second, on average, from everyone
/// together ([`Quotas::report`]).
pub const REPORTS_PER_SECOND: u64 = 50;
/// Refusal reports a node takes at once after a quiet time (the bucket's
/// size): a burst of stale writes refused together is reported whole.
pub const REPORTS_BURST: u64 = 100;

/// What a request would add.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Adds {
    Lease,
    /// An acquire; `waits`: it may queue; `locks`: how many locks it takes
    /// (several for a multi-lock, all counted against the lock limits; it
    /// waits as one request, in as many queues).
    Lock {
        waits: bool,
        locks: u64,
    },
}

/// How often the global held-lock and waiter counts are taken again.
pub const STATS_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

/// The limits of a node, with the request rates of its identities.
pub struct Quotas {
    limits: Limits,
    /// The engine's gauges and when they were taken (see [`STATS_EVERY`]).
    stats: Mutex<Option<(Instant, fencelock_core::Stats)>>,
    /// Tokens left and when they were last counted, by identity.
    buckets: Mutex<HashMap<String, (f64, Instant)>>,
    /// The node's bucket of refusal reports (see [`Quotas::report`]).
    reports: Mutex<Option<(f64, Instant)>>,
    refusals: [AtomicU64; LIMITS.len()],
}

impl Quotas {
    pub fn new(limits: Limits) -> Self {
        let (stats, buckets, reports) = (Mutex::default(), Mutex::default(), Mutex::default());
        Quotas { limits, stats, buckets, reports, refusals: Default::default() }
    }

    /// Whether `identity` (`None`: authentication off) may add `adds` to the
    /// state `engine` has `now`. `own`: the identity's own quota, if it has one.
    pub fn admit(
        &self,
        engine: &Engine,
        identity: Option<(&str, Option<&Quota>)>,
        adds: Adds,
        now: Instant,
    ) -> Result<(), Exhausted> {
        let g = self.limits.global;
        // (limit, its value, in use, what the request adds)
        let mut checks = Vec::with_capacity(4);
        match adds {
            Adds::Lease => checks.push(("leases", g.leases, engine.lease_count(), 1)),
            Adds::Lock { waits, locks } if g.locks > 0 || (waits && g.waiters > 0) => {
                let stats = self.stats(engine, now);
                checks.push(("locks", g.locks, stats.held_locks, locks));
                if waits {
                    checks.push(("waiters", g.waiters, stats.waiters, locks));
                }
            }
            Adds::Lock { .. } => {}
        }
        if let Some((name, own)) = identity {
            let q = own.unwrap_or(&self.limits.per_identity);
            match adds {
                Adds::Lease => checks.push(("leases_per_identity", q.leases, engine.owned_lease_count(name), 1)),
                Adds::Lock { waits, locks } if q.locks > 0 || (waits && q.waits > 0) => {
                    let u = engine.usage(name);
                    checks.push(("locks_per_identity", q.locks, u.holds, locks));
                    if waits {
                        checks.push(("waits_per_identity", q.waits, u.waits, 1));
                    }
                }
                Adds::Lock { .. } => {}
            }
        }
        match checks.into_iter().find(|(_, max, used, adds)| *max > 0 && used.saturating_add(*adds) > *max) {
            Some((limit, value, _, _)) => Err(self.refused(limit, value)),
            None => Ok(()),
        }
    }

    /// The engine's gauges, taken again when older than [`STATS_EVERY`].
    fn stats(&self, engine: &Engine, now: Instant) -> fencelock_core::Stats {
        let mut cached = self.stats.lock().unwrap_or_else(|p| p.into_inner());
        match *cached {
            Some((at, stats)) if now.saturating_duration_since(at) < STATS_EVERY => stats,
            _ => {
                let stats = engine.stats();
                *cached = Some((now, stats));
                stats
            }
        }
    }

    /// Whether any limit applies to `adds` from a caller with (`true`) or
    /// without an identity: if not, the engine need not be read at all.
    pub fn applies(&self, identified: bool, adds: Adds) -> bool {
        let g = self.limits.global;
        let global = match adds {
            Adds::Lease => g.leases > 0,
            Adds::Lock { waits, .. } => g.locks > 0 || (waits && g.waiters > 0),
        };
        // An identity's own quota may differ from the defaults: always count.
        global || identified
    }

    /// One request of `identity`, at `now`: refused when its requests per
    /// second are used up (a token bucket holding one second's worth).
    pub fn rate(&self, identity: &str, own: Option<&Quota>, now: Instant) -> Result<(), Exhausted> {
        let rps = own.unwrap_or(&self.limits.per_identity).rps;
        if rps == 0 {
            return Ok(());
        }
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let bucket = buckets.entry(identity.to_string()).or_insert((rps as f64, now));
        if !take(bucket, rps, rps, now) {
            drop(buckets);
            return Err(self.refused("requests_per_second_per_identity", rps));
        }
        Ok(())
    }

    /// One refusal report at `now`, whoever sends it: refused when the
    /// node's reports are used up (a token bucket of [`REPORTS_BURST`],
    /// refilled at [`REPORTS_PER_SECOND`]). Checked after the caller's
    /// permission and request rate, so a report refused for those takes
    /// nothing from the node's.
    pub fn report(&self, now: Instant) -> Result<(), Exhausted> {
        let mut bucket = self.reports.lock().unwrap_or_else(|p| p.into_inner());
        let bucket = bucket.get_or_insert((REPORTS_BURST as f64, now));
        match take(bucket, REPORTS_PER_SECOND, REPORTS_BURST, now) {
            true => Ok(()),
            false => Err(self.refused("refusal_reports_per_second", REPORTS_PER_SECOND)),
        }
    }

    fn refused(&self, limit: &'static str, value: u64) -> Exhausted {
        if let Some(i) = LIMITS.iter().position(|l| *l == limit) {
            self.refusals[i].fetch_add(1, Relaxed);
        }
        Exhausted { limit, value }
    }

    /// `fencelock_limit_refusals_total` and the limits, in the Prometheus text format.
    pub fn render(&self, out: &mut String) {
        use std::fmt::Write;
        let name = "fencelock_limit_refusals_total";
        let _ = writeln!(
            out,
            "# HELP {name} Requests refused because a limit was reached, by limit.\n# TYPE {name} counter"
        );
        for (limit, n) in LIMITS.iter().zip(&self.refusals) {
            let _ = writeln!(out, "{name}{{limit=\"{limit}\"}} {}", n.load(Relaxed));
        }
    }
}

/// Takes one token from `bucket` (tokens left, when last counted) at `now`,
/// after refilling it at `rate` per second up to `size`: whether there was one.
fn take(bucket: &mut (f64, Instant), rate: u64, size: u64, now: Instant) -> bool {
    let (tokens, at) = bucket;
    *tokens = (*tokens + now.saturating_duration_since(*at).as_secs_f64() * rate as f64).min(size as f64);
    *at = now.max(*at);
    if *tokens < 1.0 {
        return false;
    }
    *tokens -= 1.0;
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use fencelock_core::{Acquire, Caller, Command, Input, LeaseId, RequestId};
    use std::time::Duration;

    fn by(name: &str, cmd: Command) -> Command {
        Command::As { caller: Caller { name: name.into(), admin: false }, cmd: Box::new(cmd) }
    }

    /// Any instant: these tests are about counts, or measure from it.
    #[allow(clippy::disallowed_methods)] // a test's own time base
    fn t0() -> Instant {
        Instant::now()
    }

    /// An engine where `name` has `n` leases, each holding one lock.
    fn engine_with(name: &str, n: u64) -> Engine {
        let mut e = Engine::new();
        let mut cmds = vec![];
        for i in 1..=n {
            cmds.push(by(name, Command::GrantLease { req: RequestId(i), ttl_ms: 60_000, id: None }));
            let acq = Acquire::exclusive(RequestId(i), LeaseId(i), format!("l{i}"), 0);
            cmds.push(by(name, Command::Acquire(acq)));
        }
        e.step(&Input::Batch { now: 0, cmds });
        e
    }

    #[test]
    fn an_identity_at_its_quota_is_refused_naming_the_limit_and_others_are_not() {
        let q = Quotas::new(Limits {
            per_identity: Quota { leases: 3, locks: 3, waits: 0, rps: 0 },
            global: Global { leases: 0, locks: 0, waiters: 0 },
        });
        let e = engine_with("flood", 3);
        let err = q.admit(&e, Some(("flood", None)), Adds::Lease, t0()).unwrap_err();
        assert_eq!(err.to_string(), "limit reached: leases_per_identity = 3");
        let err = q.admit(&e, Some(("flood", None)), Adds::Lock { waits: true, locks: 1 }, t0()).unwrap_err();
        assert_eq!(err.limit, "locks_per_identity");
        // A multi-lock counts every lock it takes (issue 18).
        let e = engine_with("multi", 1);
        assert_eq!(q.admit(&e, Some(("multi", None)), Adds::Lock { waits: false, locks: 2 }, t0()), Ok(()));
        let err = q.admit(&e, Some(("multi", None)), Adds::Lock { waits: false, locks: 3 }, t0()).unwrap_err();
        assert_eq!(err.limit, "locks_per_identity", "1 held + 3 > 3");
        let e = engine_with("flood", 3);
        assert_eq!(q.admit(&e, Some(("other", None)), Adds::Lease, t0()), Ok(()));
        let own = Quota { leases: 4, ..Quota::default() };
        assert_eq!(q.admit(&e, Some(("flood", Some(&own))), Adds::Lease, t0()), Ok(()), "an identity's own quota wins");
        let mut text = String::new();
        q.render(&mut text);
        assert!(text.contains("fencelock_limit_refusals_total{limit=\"leases_per_identity\"} 1"), "{text}");
    }

    #[test]
    fn global_limits_apply_to_everyone_and_without_authentication() {
        let q =
            Quotas::new(Limits { per_identity: Quota::default(), global: Global { leases: 2, locks: 0, waiters: 0 } });
        let e = engine_with("a", 2);
        assert_eq!(q.admit(&e, None, Adds::Lease, t0()).unwrap_err().limit, "leases");
        assert_eq!(q.admit(&e, Some(("b", None)), Adds::Lease, t0()).unwrap_err().limit, "leases");
        assert_eq!(q.admit(&e, None, Adds::Lock { waits: true, locks: 1 }, t0()), Ok(()));
        // Without limits for it, a request costs no look at the engine.
        assert!(q.applies(false, Adds::Lease));
        assert!(!q.applies(false, Adds::Lock { waits: true, locks: 1 }));
        assert!(q.applies(true, Adds::Lock { waits: false, locks: 1 }), "an identity is always counted");
    }

    #[test]
    fn the_request_rate_refills_over_time() {
        let q = Quotas::new(Limits { per_identity: Quota { rps: 10, ..Quota::default() }, ..Limits::default() });
        let t0 = t0();
        for _ in 0..10 {
            assert_eq!(q.rate("a", None, t0), Ok(()));
        }
        assert_eq!(q.rate("a", None, t0).unwrap_err().limit, "requests_per_second_per_identity");
        assert_eq!(q.rate("b", None, t0), Ok(()), "each identity has its own bucket");
        assert_eq!(q.rate("a", None, t0 + Duration::from_millis(100)), Ok(()), "one request per 100 ms comes back");
        assert!(q.rate("a", None, t0 + Duration::from_millis(100)).is_err());
    }

    /// Issue 36. Rule: the node takes a burst of `REPORTS_BURST` refusal
    /// reports, then `REPORTS_PER_SECOND` a second, whoever sends them; a
    /// report beyond is refused naming the limit and counted.
    #[test]
    fn refusal_reports_have_a_rate_of_their_own() {
        let q = Quotas::new(Limits::default());
        let t0 = t0();
        for i in 0..REPORTS_BURST {
            assert_eq!(q.report(t0), Ok(()), "report {i} of the burst");
        }
        let err = q.report(t0).unwrap_err();
        assert_eq!(err.to_string(), format!("limit reached: refusal_reports_per_second = {REPORTS_PER_SECOND}"));
        let per = Duration::from_secs(1) / REPORTS_PER_SECOND as u32;
        assert_eq!(q.report(t0 + per), Ok(()), "one report per 1/{REPORTS_PER_SECOND} s comes back");
        assert!(q.report(t0 + per).is_err());
        // After a quiet time the bucket is full again, and no fuller.
        let later = t0 + Duration::from_secs(60);
        assert_eq!((0..REPORTS_BURST + 5).filter(|_| q.report(later).is_ok()).count() as u64, REPORTS_BURST);
        let mut text = String::new();
        q.render(&mut text);
        let line = "fencelock_limit_refusals_total{limit=\"refusal_reports_per_second\"} 7";
        assert!(text.contains(line), "{text}");
    }
}
