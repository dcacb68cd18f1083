//! C2, tokens.

use super::*;
use crate::checker::Status;

#[test]
fn c2_token_inversion_across_a_restart_fails() {
    // C2: a grant completed before another was invoked has the smaller token.
    let mut h = H::default();
    h.cycle("w0", 1, 0, 7).restart(10, 20).cycle("w1", 1, 30, 3);
    let v = run(&info(), &h, &[]);
    let c = get(&v, "C2");
    assert_eq!(c.status, Status::Fail);
    assert_eq!(c.violations, 1);
    assert!(c.examples[0].contains("inversion") && c.examples[0].contains("restart"), "{:?}", c.examples);
    assert!(!v.passed);
}

#[test]
fn c2_overlapping_grants_in_either_order_pass() {
    // C2 orders only grants that do not overlap in real time.
    let mut h = H::default();
    h.acquire("w0", 1, (0, 10), 5).acquire("w1", 1, (1, 9), 4).acquire("w0", 2, (20, 21), 6);
    assert_eq!(get(&run(&info(), &h, &[]), "C2").status, Status::Pass);
}

#[test]
fn c2_duplicate_token_fails() {
    // C2: tokens of ok grants are unique.
    let mut h = H::default();
    h.acquire("w0", 1, (0, 10), 5).acquire("w1", 1, (1, 9), 5);
    let c = get(&run(&info(), &h, &[]), "C2").clone();
    assert_eq!((c.status, c.violations), (Status::Fail, 1));
    assert!(c.examples[0].contains("duplicate token 5"));
}

#[test]
fn c2_inversion_without_durable_tokens_is_a_finding() {
    // A backend that declares no durable tokens may go back across a restart.
    let mut i = info();
    i.durable_tokens = false;
    let mut h = H::default();
    h.cycle("w0", 1, 0, 7).restart(10, 20).cycle("w1", 1, 30, 3);
    assert_eq!(get(&run(&i, &h, &[]), "C2").status, Status::Finding);
    // ... but not without a restart between.
    let mut h = H::default();
    h.cycle("w0", 1, 0, 7).cycle("w1", 1, 30, 3);
    assert_eq!(get(&run(&i, &h, &[]), "C2").status, Status::Fail);
}

#[test]
fn c2_grant_asked_before_the_kill_and_answered_after_counts_as_across() {
    // A peer engine without durable tokens: w1 asks before the kill, is granted
    // by the restarted server with a reset counter: a finding, not a failure.
    let mut i = info();
    i.durable_tokens = false;
    let mut h = H::default();
    h.acquire("w0", 1, (0, 1), 7).release("w0", 1, (2, 3)).acquire("w1", 1, (4, 30), 1);
    h.fault(5, "start").evidence(20, "restarted", 1).fault(21, "end");
    let v = run(&i, &h, &[]);
    assert_eq!(get(&v, "C2").status, Status::Finding, "{:?}", get(&v, "C2").examples);
}

#[test]
fn c2_without_tokens_is_not_applicable() {
    let mut i = info();
    i.fencing = false;
    assert_eq!(get(&run(&i, &clean(), &[]), "C2").status, Status::NotApplicable);
}
