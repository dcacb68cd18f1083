//! INV-HEAL: after every fault ends, a new grant and an accepted act (a read,
//! a write or a permit use) happen
//! within 2 × TTL plus the restart slack (`SimConfig::heal_bound_ms`); and in
//! quiet time (no fault active, none ended within the bound) grants and accepted
//! acts never stop for longer than that bound, so a stall is reported where
//! it starts.
//!
//! Per lock too: in quiet time no lock may go longer than the bound with an
//! acquire queued on it and no grant on it, or a stall of one lock (a
//! multi-acquire stuck, a lost wake-up, a grant nobody learned of) would hide
//! behind the grants on the others. Who waits is the engine's own queue,
//! stepped through the durable log (a queued wait is listed until it is
//! granted, times out, is cancelled or its lease ends). Holders are not
//! excused: a holder keeps a lock for its think time and a few round trips,
//! far below the bound, unless a fault (a pause, a partition) stretches it,
//! and faults are not quiet time; a grant held by a live lease whose client
//! never learned of it is exactly the stall to report.
//!
//! Conclusive only if at least one fault happened.

use std::collections::BTreeMap;

use fencelock_core::{Effect, Engine, Millis};

use super::Verdict;
use crate::{event::EventKind, report::Report};

pub fn check(r: &Report) -> Verdict {
    let mut v = Verdict::new("INV-HEAL");
    let bound = r.config.heal_bound_ms();
    let grants = instants(r, |k| matches!(k, EventKind::Granted { .. }));
    let writes = instants(r, |k| matches!(k, EventKind::Acted { accepted: true, .. }));
    let mut worst = 0;
    for f in &r.faults {
        let g = first_after(&grants, f.end);
        let w = first_after(&writes, f.end);
        let took = g.max(w).map_or(Millis::MAX, |t| t - f.end);
        worst = worst.max(took.min(r.end_ms()));
        if took > bound {
            let show = |t: Option<Millis>| t.map_or("none".to_string(), |t| format!("{t} ms"));
            v.violate(format!(
                "after `{}` ended at {} ms: first grant {}, first accepted act {} (bound {bound} ms)",
                f.what,
                f.end,
                show(g),
                show(w)
            ));
        }
    }
    for (what, at) in [("grant", &grants), ("accepted act", &writes)] {
        for (from, to) in quiet_stalls(r, at) {
            v.violate(format!("no {what} from {from} ms to {to} ms, with no fault active (bound {bound} ms)"));
        }
    }
    let (locks_waited_on, slowest_wait) = check_locks(r, &mut v);
    v.evidence = vec![
        ("faults", r.faults.len() as u64),
        ("slowest_heal_ms", worst),
        ("locks_waited_on", locks_waited_on),
        ("slowest_quiet_lock_wait_ms", slowest_wait),
    ];
    v.require(!r.faults.is_empty(), "no fault happened");
    v
}

/// The per-lock part: every quiet stretch of a lock waited on without a
/// grant must stay within the bound. Returns how many locks were waited on
/// and the longest such quiet stretch.
fn check_locks(r: &Report, v: &mut Verdict) -> (u64, Millis) {
    let bound = r.config.heal_bound_ms();
    let waits = waited_stretches(r);
    let mut slowest = 0;
    for (lock, stretches) in &waits {
        for (from, to) in quiet_parts(r, stretches) {
            slowest = slowest.max(to - from);
            if to - from > bound {
                v.violate(format!(
                    "lock `{lock}`: acquires queued and no grant on it from {from} ms to {to} ms, with no fault active (bound {bound} ms)"
                ));
            }
        }
    }
    (waits.len() as u64, slowest)
}

fn instants(r: &Report, pick: impl Fn(&EventKind) -> bool) -> Vec<Millis> {
    let mut at: Vec<Millis> = r.events.iter().filter(|e| pick(&e.kind)).map(|e| e.at_ms).collect();
    at.sort_unstable();
    at
}

/// The first instant strictly after `t`.
fn first_after(sorted: &[Millis], t: Millis) -> Option<Millis> {
    let i = sorted.partition_point(|x| *x <= t);
    sorted.get(i).copied()
}

/// Stretches of quiet time longer than the bound without an instant of `at`.
fn quiet_stalls(r: &Report, at: &[Millis]) -> Vec<(Millis, Millis)> {
    let bound = r.config.heal_bound_ms();
    let mut stalls = Vec::new();
    for (q0, q1) in quiet_time(r) {
        let inside = at.iter().copied().filter(|t| (q0..q1).contains(t));
        let points: Vec<Millis> = std::iter::once(q0).chain(inside).chain(std::iter::once(q1)).collect();
        let long = points.windows(2).filter(|w| w[1] - w[0] > bound);
        stalls.extend(long.map(|w| (w[0], w[1])));
    }
    stalls
}

/// The intervals with no fault active and none ended within the bound before.
fn quiet_time(r: &Report) -> Vec<(Millis, Millis)> {
    let bound = r.config.heal_bound_ms();
    let mut quiet = Vec::new();
    let mut from = 0;
    for f in &r.faults {
        if f.start > from {
            quiet.push((from, f.start));
        }
        from = from.max(f.end + bound);
    }
    if r.end_ms() > from {
        quiet.push((from, r.end_ms()));
    }
    quiet
}

/// Each lock's waited stretches: the intervals during which at least one
/// acquire was queued on it and no grant on it was made (a grant ends one
/// and, if acquires still wait, starts the next). The queue is the engine's,
/// replayed from the durable log; a stretch still open at the end of the run
/// ends there.
fn waited_stretches(r: &Report) -> BTreeMap<String, Vec<(Millis, Millis)>> {
    let mut engine = Engine::new();
    let mut open: BTreeMap<String, Millis> = BTreeMap::new();
    let mut done: BTreeMap<String, Vec<(Millis, Millis)>> = BTreeMap::new();
    for input in &r.log {
        let out = engine.step(input);
        let now = engine.now();
        let granted: Vec<&str> = out.effects.iter().filter_map(granted_lock).collect();
        let waited = engine.locks(now, "", usize::MAX).into_iter().filter(|l| !l.waiters.is_empty());
        let waited: Vec<String> = waited.map(|l| l.name.to_string()).collect();
        open.retain(|lock, from| {
            let goes_on = waited.contains(lock) && !granted.contains(&lock.as_str());
            if !goes_on {
                done.entry(lock.clone()).or_default().push((*from, now));
            }
            goes_on
        });
        for lock in waited {
            open.entry(lock).or_insert(now);
        }
    }
    for (lock, from) in open {
        done.entry(lock).or_default().push((from, r.end_ms().max(from)));
    }
    done
}

fn granted_lock(e: &Effect) -> Option<&str> {
    match e {
        Effect::Granted { grant, .. } => Some(grant.lock.as_str()),
        _ => None,
    }
}

/// The parts of `stretches` inside quiet time.
fn quiet_parts(r: &Report, stretches: &[(Millis, Millis)]) -> Vec<(Millis, Millis)> {
    let quiet = quiet_time(r);
    let inside = |&(a, b): &(Millis, Millis)| quiet.iter().map(move |&(q0, q1)| (a.max(q0), b.min(q1)));
    stretches.iter().flat_map(inside).filter(|(a, b)| a < b).collect()
}

#[cfg(test)]
mod tests {
    use fencelock_core::{Acquire, Command, Input, LeaseId, Reply, RequestId, Token};

    use super::*;
    use crate::{
        config::{SimConfig, Workload},
        event::Event,
        nemesis::{FaultKind, FaultWindow},
        wire::Act,
    };

    /// A run written by hand: the log is stepped through an engine as it is
    /// written (to learn tokens), and the events say what clients saw.
    struct Run {
        engine: Engine,
        log: Vec<Input>,
        events: Vec<Event>,
        req: u64,
    }

    impl Run {
        /// Three leases (1, 2, 3) that outlive the run.
        fn new() -> Self {
            let mut run = Run { engine: Engine::new(), log: Vec::new(), events: Vec::new(), req: 0 };
            run.step(Input::leader_start(0));
            let leases = (1..=3).map(|req| Command::GrantLease { req: RequestId(req), ttl_ms: 60_000, id: None });
            run.batch(1, leases.collect());
            run.req = 10;
            run
        }

        fn step(&mut self, input: Input) -> fencelock_core::Output {
            let out = self.engine.step(&input);
            self.log.push(input);
            out
        }

        fn batch(&mut self, now: Millis, cmds: Vec<Command>) -> Vec<Reply> {
            self.step(Input::Batch { now, cmds }).replies
        }

        fn acquire(&mut self, now: Millis, lease: u64, lock: &str, wait_ms: u64) -> Reply {
            self.req += 1;
            let a = Acquire::exclusive(RequestId(self.req), LeaseId(lease), lock, wait_ms);
            self.batch(now, vec![Command::Acquire(a)]).remove(0)
        }

        fn release(&mut self, now: Millis, lease: u64, lock: &str, token: Token) {
            self.req += 1;
            let cmd =
                Command::Release { req: RequestId(self.req), lease: LeaseId(lease), lock: lock.to_string(), token };
            self.batch(now, vec![cmd]);
        }

        /// Lease 3 takes `resource`, writes with it and releases it every
        /// 200 ms of `[from, to)`: grants and accepted acts never stop.
        fn churn(&mut self, from: Millis, to: Millis) {
            for at in (from..to).step_by(200) {
                let Reply::Acquired(grant) = self.acquire(at, 3, "resource", 0) else {
                    panic!("`resource` is free at {at} ms");
                };
                let (lease, req, token) = (grant.lease, RequestId(self.req), grant.token);
                self.events.push(Event { at_ms: at, kind: EventKind::Granted { lease, req, token, queued: false } });
                let acted = EventKind::Acted { client: 2, token, act: Act::Write, accepted: true, after_pause: false };
                self.events.push(Event { at_ms: at + 5, kind: acted });
                self.release(at + 10, 3, "resource", token);
            }
        }

        /// The report of a 5 s run with one fault over its first 100 ms.
        fn report(self) -> Report {
            let mut config = SimConfig::new(3).with_workload(Workload::Mixed);
            config.duration_ms = 5_000;
            let fault = FaultWindow { kind: FaultKind::Pause, what: "pause".into(), start: 0, end: 100 };
            Report::new(config, self.events, self.log, vec![fault], None)
        }
    }

    /// Lease 1 holds `multi-b` from 5 ms; lease 2 queues on it at 10 ms.
    fn one_waiter_on_multi_b(run: &mut Run) -> Token {
        let Reply::Acquired(held) = run.acquire(5, 1, "multi-b", 0) else { panic!("`multi-b` is free") };
        assert!(matches!(run.acquire(10, 2, "multi-b", 30_000), Reply::Queued { .. }));
        held.token
    }

    /// INV-HEAL per lock: a waiter granted soon after the holder releases,
    /// while another lock churns, holds.
    #[test]
    fn a_waiter_granted_within_the_bound_holds() {
        let mut run = Run::new();
        let held = one_waiter_on_multi_b(&mut run);
        run.churn(20, 1_000);
        run.release(1_005, 1, "multi-b", held);
        run.churn(1_020, 5_000);
        let v = check(&run.report());
        assert!(v.holds(), "{}", v.summary());
        assert_eq!(v.evidence("locks_waited_on"), 1);
    }

    /// INV-HEAL per lock: `multi-b` never freed while its waiter waits is a
    /// stall, though the grants and acts on `resource` never stop (the global
    /// checks alone pass this run).
    #[test]
    fn one_lock_stalled_behind_another_locks_grants_is_a_violation() {
        let mut run = Run::new();
        one_waiter_on_multi_b(&mut run);
        run.churn(20, 5_000);
        let v = check(&run.report());
        assert_eq!(v.violations.len(), 1, "{}", v.summary());
        let bound = SimConfig::new(3).heal_bound_ms();
        let quiet_from = 100 + bound;
        assert!(
            v.violations[0]
                .contains(&format!("`multi-b`: acquires queued and no grant on it from {quiet_from} ms to 5000 ms")),
            "{}",
            v.summary()
        );
    }
}
