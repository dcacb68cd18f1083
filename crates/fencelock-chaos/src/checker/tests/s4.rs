//! S4, exactly-once grants.

use serde_json::json;

use super::*;
use crate::checker::Status;

#[test]
fn s4_more_tokens_than_acquires_fails() {
    // S4: a retried acquire granted twice issues more tokens than acquires.
    let stats = |n: u64| move |e: &mut Event| e.detail = json!({ "tokens_issued": n });
    let mut h = clean();
    h.note(6_000, Op::ServerStats, stats(2));
    assert_eq!(get(&run(&info(), &h, &[]), "S4").status, Status::Pass);
    let mut h = clean();
    h.note(6_000, Op::ServerStats, stats(4));
    let v = run(&info(), &h, &[]);
    assert_eq!((get(&v, "S4").status, get(&v, "S4").violations), (Status::Fail, 2));
}

#[test]
fn s4_a_grant_released_undelivered_is_not_a_second_grant() {
    // S4: a grant whose answer was lost and which the server released when
    // the call ended used a token no acquire returned; only tokens beyond
    // those are double grants.
    let stats = |n: u64, c: u64| move |e: &mut Event| e.detail = json!({ "tokens_issued": n, "grants_cancelled": c });
    let mut h = clean();
    h.note(6_000, Op::ServerStats, stats(3, 1));
    assert_eq!(get(&run(&info(), &h, &[]), "S4").status, Status::Pass);
    let mut h = clean();
    h.note(6_000, Op::ServerStats, |e: &mut Event| e.detail = json!({ "tokens_issued": 3, "grants_revoked": 1 }));
    assert_eq!(get(&run(&info(), &h, &[]), "S4").status, Status::Pass, "ended with a lease given up");
    let mut h = clean();
    h.note(6_000, Op::ServerStats, stats(4, 1));
    assert_eq!(get(&run(&info(), &h, &[]), "S4").status, Status::Fail);
}
