//! E1, one leader per term and older terms fenced.

use super::*;
use crate::checker::Status;

#[test]
fn e1_leaderships_in_term_order_pass() {
    // E1: each term won once, no older term's write accepted after a newer wrote.
    let v = run(&election_info(), &elections(), &[]);
    assert_eq!(get(&v, "E1").status, Status::Pass, "{:?}", get(&v, "E1"));
    assert_eq!((v.stats.campaigns.ok, v.stats.releases.ok, v.stats.leader_events), (2, 2, 3));
    // A campaign is a grant: C2 judges the terms as tokens.
    assert_eq!(get(&v, "C2").status, Status::Pass);
}

#[test]
fn e1_a_term_won_twice_fails() {
    // E1: at most one leader per term.
    let mut h = elections();
    h.campaign("w2", 1, (30, 31), 6);
    let c = get(&run(&election_info(), &h, &[]), "E1").clone();
    assert_eq!((c.status, c.violations), (Status::Fail, 1));
    assert!(c.examples[0].contains("term 6 won twice"), "{:?}", c.examples);
}

#[test]
fn e1_an_older_leaders_write_accepted_after_a_newer_one_wrote_fails() {
    // E1 (C3's rule on leaderships): w0, paused as leader of term 5, writes
    // after w1 (term 6) wrote; the fence must have refused it.
    let mut h = elections();
    h.campaign("w0", 2, (40, 41), 7).write("w0", 2, (42, 43), 7, Kind::Ok);
    h.campaign("w3", 1, (44, 45), 8).write("w3", 1, (46, 47), 8, Kind::Ok);
    h.write("w0", 2, (50, 51), 7, Kind::Ok);
    let c = get(&run(&election_info(), &h, &[]), "E1").clone();
    assert_eq!((c.status, c.violations), (Status::Fail, 1), "{:?}", c.examples);
    assert!(c.examples[0].contains("stale write accepted"), "{:?}", c.examples);
}

#[test]
fn e_checks_only_in_election_runs() {
    // E1–E3 judge election runs only; in one without any campaign E1 is not applicable.
    let v = run(&info(), &clean(), &[]);
    assert!(v.checks.iter().all(|c| !c.id.starts_with('E')), "{:?}", v.checks);
    let v = run(&election_info(), &clean(), &[]);
    assert_eq!(get(&v, "E1").status, Status::NotApplicable);
    assert_eq!(get(&v, "E2").status, Status::NotApplicable);
    // Campaigns that never elected anyone: nothing was shown.
    let mut h = H::default();
    h.op("w0", Op::Campaign, 1, (0, 5_000), Kind::Unknown, |_| {});
    assert_eq!(get(&run(&election_info(), &h, &[]), "E1").status, Status::Inconclusive);
}

#[test]
fn e1_an_older_term_carried_out_by_the_fence_fails() {
    // E1 (C3's audit rule): the fence carried out term 5 after term 6, as a
    // storage with fencing off does with a paused leader's late write, whose
    // invoke in the history precedes the newer leader's write.
    let log = audit(&[(5, AuditOutcome::Accepted), (6, AuditOutcome::Accepted), (5, AuditOutcome::Unfenced)]);
    let c = get(&run(&election_info(), &elections(), &log), "E1").clone();
    assert_eq!((c.status, c.violations), (Status::Fail, 1), "{:?}", c.examples);
    assert!(c.examples[0].contains("audit #2"), "{:?}", c.examples);
    // Refused by the fence: as it must be.
    let log = audit(&[(5, AuditOutcome::Accepted), (6, AuditOutcome::Accepted), (5, AuditOutcome::Stale)]);
    assert_eq!(get(&run(&election_info(), &elections(), &log), "E1").status, Status::Pass);
}
