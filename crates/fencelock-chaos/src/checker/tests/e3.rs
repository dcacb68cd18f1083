//! E3, no phantom leader.

use super::*;
use crate::checker::Status;

#[test]
fn e3_leaders_elected_by_their_campaigns_pass() {
    // E3: each reported leader was elected by the campaign its value names,
    // with that term; a campaign the worker gave up on may have been granted.
    let mut h = elections();
    h.op("w2", Op::Campaign, 1, (30, 5_000), Kind::Unknown, |_| {}).seen_leader("o0", 40, 9, "w2-1");
    let c = get(&run(&election_info(), &h, &[]), "E3").clone();
    assert_eq!((c.status, c.violations), (Status::Pass, 0), "{:?}", c.examples);
}

#[test]
fn e3_a_phantom_leader_fails() {
    // E3: no leader that no campaign elected: an unknown value, a term its
    // campaign was not elected with, a report before the campaign began, a
    // campaign that certainly failed.
    let mut h = elections();
    h.op("w3", Op::Campaign, 1, (60, 61), Kind::Fail, |e| e.error = Some("connect".into()))
        .seen_leader("o0", 30, 7, "w9-1")
        .seen_leader("o0", 31, 8, "w1-1")
        .seen_leader("o0", 32, 10, "w2-1")
        .seen_leader("o0", 62, 11, "w3-1");
    h.op("w2", Op::Campaign, 1, (33, 34), Kind::Ok, |e| e.token = Some(10));
    let c = get(&run(&election_info(), &h, &[]), "E3").clone();
    assert_eq!((c.status, c.violations), (Status::Fail, 4), "{:?}", c.examples);
    for (e, why) in c.examples.iter().zip(["no campaign", "elected with term Some(6)", "before its campaign", "failed"])
    {
        assert!(e.contains(why), "{e:?} should say {why:?}");
    }
}

#[test]
fn e3_a_leader_without_its_value_is_judged_by_its_term() {
    // E3 for leaders reported without a value (the native watch carries none):
    // the term must have been won by a campaign invoked before the report.
    let mut h = elections();
    h.seen_leader("o1", 23, 6, "").seen_leader("o1", 24, 7, "");
    let v = run(&election_info(), &h, &[]);
    let c = get(&v, "E3").clone();
    assert_eq!((c.status, c.violations), (Status::Fail, 1), "{:?}", c.examples);
    assert!(c.examples[0].contains("term 7") && c.examples[0].contains("no campaign won"), "{:?}", c.examples);
    assert_eq!(v.stats.leaders_without_value, 2);
    // A campaign the worker gave up on may have won term 7 unrecorded.
    h.op("w2", Op::Campaign, 1, (15, 5_000), Kind::Unknown, |_| {});
    assert_eq!(get(&run(&election_info(), &h, &[]), "E3").status, Status::Pass);
}
