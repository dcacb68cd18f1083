//! Multi mode (atomic multi-locks, INV-18): M1 on multi grants, and C3/C4
//! judged per lock and its object.

use super::*;
use crate::checker::Status;

use AuditOutcome::Accepted;

/// A multi run of 2 locks, `chaos-m0` and `chaos-m1`, guarding `obj-m0` and `obj-m1`.
fn multi_info() -> RunInfo {
    RunInfo { scenario: "K1".into(), multi: 2, lock: "chaos".into(), ..info() }
}

fn names(locks: &[&str]) -> Option<Vec<String>> {
    Some(locks.iter().map(|l| format!("chaos-{l}")).collect())
}

impl H {
    /// An ok acquire of `locks` (`m0`, `m1`) recording `tokens`: one token
    /// as a single grant's `token`, several as a multi grant's `tokens`.
    fn grant(&mut self, p: &str, seq: u64, span: (u64, u64), locks: &[&str], tokens: &[u64]) -> &mut Self {
        let tokens = tokens.to_vec();
        self.op(p, Op::Acquire, seq, span, Kind::Ok, |e| {
            e.locks = names(locks);
            e.lease = Some(100);
            match (locks.len(), tokens.as_slice()) {
                (1, [t]) => e.token = Some(*t),
                _ => e.tokens = Some(tokens.clone()),
            }
        })
    }

    /// A read then a write of `key` with `token`, ok, from `t`.
    fn rmw(&mut self, p: &str, seq: u64, t: u64, key: &str, token: u64) -> &mut Self {
        let id = format!("{p}-{seq}");
        self.op(p, Op::Read, seq, (t, t + 1), Kind::Ok, |e| {
            e.token = Some(token);
            e.key = Some(key.into());
        })
        .op(p, Op::Write, seq, (t + 2, t + 3), Kind::Ok, |e| {
            e.token = Some(token);
            e.key = Some(key.into());
            e.append = Some(id.clone());
        })
    }

    fn release_locks(&mut self, p: &str, seq: u64, t: u64, locks: &[&str]) -> &mut Self {
        self.op(p, Op::Release, seq, (t, t + 1), Kind::Ok, |e| {
            e.locks = names(locks);
            e.released = Some(true);
        })
    }
}

/// w0 takes both locks at once in the order m1, m0 with `tokens` and
/// writes both objects; then w1 holds m1 alone (token 7) while w2 holds m0
/// alone (token 8), and w2 writes obj-m0 before w1 writes obj-m1.
fn crossed(tokens: &[u64]) -> H {
    let mut h = H::default();
    h.grant("w0", 1, (0, 1), &["m1", "m0"], tokens)
        .rmw("w0", 1, 2, "obj-m1", tokens[0])
        .rmw("w0", 1, 6, "obj-m0", *tokens.get(1).unwrap_or(&tokens[0]))
        .release_locks("w0", 1, 10, &["m1", "m0"])
        .grant("w1", 1, (20, 21), &["m1"], &[7])
        .grant("w2", 1, (22, 23), &["m0"], &[8])
        .rmw("w2", 1, 24, "obj-m0", 8)
        .rmw("w1", 1, 30, "obj-m1", 7)
        .release_locks("w1", 1, 40, &["m1"])
        .release_locks("w2", 1, 42, &["m0"])
        .final_read_of(5_000, "obj-m0", &["w0-1", "w2-1"])
        .final_read_of(5_000, "obj-m1", &["w0-1", "w1-1"]);
    h
}

/// The audit log of [`crossed`]: every read and write accepted, on its object.
fn crossed_audit(tokens: &[u64]) -> Vec<AuditEntry> {
    let (a, b) = (tokens[0], *tokens.get(1).unwrap_or(&tokens[0]));
    let ops = [("GET", a), ("PUT", a), ("GET", b), ("PUT", b), ("GET", 8), ("PUT", 8), ("GET", 7), ("PUT", 7)];
    let keys = ["obj-m1", "obj-m1", "obj-m0", "obj-m0", "obj-m0", "obj-m0", "obj-m1", "obj-m1"];
    let mut log = audit_ops(&ops.map(|(op, t)| (op, t, Accepted)));
    for (e, key) in log.iter_mut().zip(keys) {
        e.key = key.into();
    }
    log
}

#[test]
fn whole_multi_grants_with_consecutive_tokens_pass() {
    // INV-18: tokens 5, 6 in the order asked (m1, m0); C3/C4 per object:
    // w1's write to obj-m1 with token 7 after w2's to obj-m0 with 8 is no
    // stale accept, since they are different objects.
    let v = run(&multi_info(), &crossed(&[5, 6]), &crossed_audit(&[5, 6]));
    for id in ["M1", "C2", "C3", "C4"] {
        assert_eq!(get(&v, id).status, Status::Pass, "{:?}", get(&v, id));
    }
    assert_eq!((v.stats.multi_grants, v.stats.single_grants), (1, 2));
    assert_eq!(v.stats.audit.accepted, 8);
    // The same history judged as one object: w1's write looks stale to C3.
    let one = RunInfo { multi: 0, ..multi_info() };
    assert_eq!(get(&run(&one, &crossed(&[5, 6]), &[]), "C3").status, Status::Fail);
}

#[test]
fn tokens_with_a_gap_fail() {
    // INV-18: another grant between the two locks' (taken one by one).
    let v = run(&multi_info(), &crossed(&[5, 7]), &[]);
    let c = get(&v, "M1");
    assert_eq!((c.status, c.violations), (Status::Fail, 1), "{c:?}");
    assert!(c.examples[0].contains("not consecutive"), "{c:?}");
}

#[test]
fn tokens_out_of_the_order_asked_fail() {
    // INV-18: consecutive, but m0's below m1's though m1 was asked first.
    let c = get(&run(&multi_info(), &crossed(&[6, 5]), &[]), "M1").clone();
    assert_eq!((c.status, c.violations), (Status::Fail, 1), "{c:?}");
}

#[test]
fn a_partial_multi_grant_fails() {
    // INV-18: one token recorded for two locks.
    let c = get(&run(&multi_info(), &crossed(&[5]), &[]), "M1").clone();
    assert_eq!((c.status, c.violations), (Status::Fail, 1), "{c:?}");
    assert!(c.examples[0].contains("partial"), "{c:?}");
}

#[test]
fn a_multi_holders_stale_write_is_fenced_against_a_single_holders() {
    // C3 per object: w0's read and write of obj-m0 with its multi grant's
    // token 6 succeed after w2's write there with 7 completed.
    let mut h = H::default();
    h.grant("w0", 1, (0, 1), &["m1", "m0"], &[5, 6])
        .rmw("w0", 1, 2, "obj-m1", 5)
        .grant("w2", 1, (6, 7), &["m0"], &[7])
        .rmw("w2", 1, 8, "obj-m0", 7)
        .rmw("w0", 1, 20, "obj-m0", 6)
        .final_read_of(5_000, "obj-m0", &["w2-1", "w0-1"])
        .final_read_of(5_000, "obj-m1", &["w0-1"]);
    let v = run(&multi_info(), &h, &[]);
    let c = get(&v, "C3");
    assert_eq!((c.status, c.violations), (Status::Fail, 2), "{c:?}");
    assert!(c.examples[0].contains("w0 write #1 token 6"), "{c:?}");
    assert!(c.examples[1].contains("w0 read #1 token 6"), "{c:?}");
    assert_eq!(get(&v, "M1").status, Status::Pass);
}

#[test]
fn no_multi_grant_is_inconclusive() {
    // Progress: single grants only prove nothing about multi grants.
    let mut h = H::default();
    h.grant("w1", 1, (0, 1), &["m1"], &[3]).rmw("w1", 1, 2, "obj-m1", 3).final_read_of(5_000, "obj-m1", &["w1-1"]);
    let c = get(&run(&multi_info(), &h, &[]), "M1").clone();
    assert_eq!(c.status, Status::Inconclusive, "{c:?}");
    assert!(c.examples[0].contains("0 multi grants, 1 single grants"), "{c:?}");
}

/// w0 holds both locks (tokens 5, 6, lease 100) when the server is killed;
/// the holders read back per lock: m0's with token 5, m1's with `m1_token`.
fn killed_multi_holder(m1_token: Option<u64>) -> H {
    let mut h = H::default();
    h.grant("w0", 1, (0, 1), &["m0", "m1"], &[5, 6]).rmw("w0", 1, 2, "obj-m0", 5).fault(10, "start").restart(10, 20);
    for (lock, token) in [("chaos-m0", Some(5)), ("chaos-m1", m1_token)] {
        h.note(21, Op::Holder, |e| {
            e.detail = json!({ "killed_at": 10 * MS });
            e.target = Some(lock.into());
            (e.token, e.lease) = (token, token.map(|_| 100));
        });
    }
    h.evidence(22, "restarted", 1)
        .fault(23, "end")
        .rmw("w0", 1, 24, "obj-m1", 6)
        .release_locks("w0", 1, 30, &["m0", "m1"])
        .final_read_of(5_000, "obj-m0", &["w0-1"])
        .final_read_of(5_000, "obj-m1", &["w0-1"]);
    h
}

#[test]
fn a_multi_grant_survives_a_restart_on_every_lock() {
    // C6 per lock (INV-18's grants are durable, each lock's as any grant):
    // both locks read back with the multi grant's lease and their tokens.
    let v = run(&RunInfo { scenario: "K4".into(), ..multi_info() }, &killed_multi_holder(Some(6)), &[]);
    assert_eq!(get(&v, "C6").status, Status::Pass, "{:?}", get(&v, "C6"));
}

#[test]
fn a_multi_grant_lost_on_one_lock_fails() {
    // C6 per lock: m1 read back with nobody holding it.
    let v = run(&RunInfo { scenario: "K4".into(), ..multi_info() }, &killed_multi_holder(None), &[]);
    let c = get(&v, "C6");
    assert_eq!((c.status, c.violations), (Status::Fail, 1), "{c:?}");
}
