//! E2, an observer's terms never go back.

use super::*;
use crate::checker::Status;

#[test]
fn e2_terms_going_up_pass() {
    // E2: a higher term, a vacancy of the current term, a vacancy of an unseen
    // higher term, and after a resubscription the current leader again: all
    // allowed.
    let mut h = elections();
    h.seen_vacant("o0", 30, 7)
        .seen_leader("o0", 40, 9, "w2-1")
        .subscribed("o0", 50)
        .seen_leader("o0", 51, 9, "w2-1")
        .subscribed("o1", 0)
        .seen_leader("o1", 42, 9, "w2-1");
    let c = get(&run(&election_info(), &h, &[]), "E2").clone();
    assert_eq!((c.status, c.violations), (Status::Pass, 0), "{:?}", c.examples);
}

#[test]
fn e2_a_term_going_back_fails() {
    // E2: Leader terms strictly increase on one observer.
    let mut h = elections();
    h.seen_leader("o0", 30, 5, "w0-1");
    let c = get(&run(&election_info(), &h, &[]), "E2").clone();
    assert_eq!((c.status, c.violations), (Status::Fail, 1));
    assert!(c.examples[0].starts_with("o0 at"), "{:?}", c.examples);
}

#[test]
fn e2_a_repeat_or_an_ended_terms_leader_fails() {
    // E2: the same term's leader never again (the workers never proclaim,
    // so a new value of it was invented: the native observer's empty value
    // before watch events carried values); a term's leader never after its
    // vacancy; a vacancy of a lower term never.
    for (what, extra) in [
        ("repeat", (6, Some("w1-1"))),
        ("invented value", (6, Some(""))),
        ("after its vacancy", (5, Some("w0-1"))),
        ("older vacancy", (5, None)),
    ] {
        let mut h = elections();
        h.seen_vacant("o1", 1, 4).seen_leader("o1", 12, 5, "w0-1").seen_vacant("o1", 18, 5);
        let (term, value) = extra;
        let p = if what == "repeat" || what == "invented value" { "o0" } else { "o1" };
        match value {
            Some(v) => h.seen_leader(p, 30, term, v),
            None => h.seen_vacant("o0", 30, term),
        };
        let c = get(&run(&election_info(), &h, &[]), "E2").clone();
        assert_eq!((c.status, c.violations), (Status::Fail, 1), "{what}: {:?}", c.examples);
    }
}

#[test]
fn e2_catches_an_observer_without_the_term_filter() {
    // The mutant check of E2: an observer that passes on the native watch's
    // notifications as they come (the client's term filter removed) shows the
    // current leader, read first, and then its grant again from the watch,
    // which starts before the read; then an old vacancy redelivered. E2 must fail.
    let mut h = elections();
    h.subscribed("o1", 19)
        .seen_leader("o1", 20, 5, "w0-1")
        .seen_leader("o1", 21, 5, "w0-1")
        .seen_vacant("o1", 22, 4)
        .seen_vacant("o1", 23, 5);
    let c = get(&run(&election_info(), &h, &[]), "E2").clone();
    assert_eq!((c.status, c.violations), (Status::Fail, 2), "{:?}", c.examples);
    assert!(c.examples.iter().all(|e| e.starts_with("o1")), "{:?}", c.examples);
}

#[test]
fn e2_without_any_leader_event_is_inconclusive() {
    // E2 cannot pass on observers that saw nothing.
    let mut h = H::default();
    h.subscribed("o0", 0).leadership("w0", 1, 10, 5);
    assert_eq!(get(&run(&election_info(), &h, &[]), "E2").status, Status::Inconclusive);
}
