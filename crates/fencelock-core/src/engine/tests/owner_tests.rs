//! Lease ownership (`Command::As`) and proposed lease ids.
//!
//! INV-13: a lease granted by an identity takes commands only from that
//! identity (and a revoke from an admin); a refused command changes nothing.

use super::harness::*;
use super::*;

fn caller(name: &str) -> Caller {
    Caller { name: name.into(), admin: false }
}

fn by(name: &str, cmd: Command) -> Command {
    Command::As { caller: caller(name), cmd: Box::new(cmd) }
}

fn admin(name: &str, cmd: Command) -> Command {
    Command::As { caller: Caller { name: name.into(), admin: true }, cmd: Box::new(cmd) }
}

fn lease_granted(lease: u64) -> Reply {
    Reply::LeaseGranted { lease: l(lease), ttl_ms: TTL }
}

fn not_owner(lease: u64) -> Reply {
    Reply::Rejected(EngineError::NotOwner { lease: l(lease) })
}

/// An engine where alice owns lease 1, which holds "a" with token 1.
fn alice_holds_a() -> Engine {
    let mut e = Engine::new();
    let o = batch(&mut e, 0, vec![by("alice", new_lease(1, TTL)), by("alice", acq(2, 1, "a", 0, 0))]);
    assert_eq!(o.replies, vec![lease_granted(1), Reply::Acquired(grant("a", 1, 1))]);
    e
}

#[test]
fn inv13_another_identity_cannot_use_or_end_a_lease() {
    let mut e = alice_holds_a();
    let before = e.clone();
    let cmds = vec![
        by("mallory", keep(3, 1)),
        by("mallory", revoke(4, 1)),
        by("mallory", rel(5, 1, "a", 1)),
        by("mallory", acq(6, 1, "b", 0, 0)),
        by("mallory", cancel(2, 1, "a")),
    ];
    let o = batch(&mut e, 0, cmds);
    assert_eq!(o.replies, vec![not_owner(1); 5]);
    assert_eq!(o.effects, vec![]);
    assert_eq!(e, before, "refused commands change nothing");
}

#[test]
fn inv13_the_owner_uses_its_lease_and_the_holder_shows_its_identity() {
    let mut e = alice_holds_a();
    let o = batch(&mut e, 10, vec![by("alice", keep(3, 1))]);
    assert_eq!(o.replies, vec![Reply::LeaseKept { lease: l(1), ttl_ms: TTL }]);
    let holder = e.lock_info(10, "a").unwrap().holder.unwrap();
    assert_eq!(holder.owner.as_deref(), Some("alice"));
    assert_eq!(e.lease_info(10, l(1)).unwrap().owner.as_deref(), Some("alice"));
    let o = batch(&mut e, 20, vec![by("alice", rel(4, 1, "a", 1))]);
    assert_eq!(o.replies, vec![Reply::Released]);
}

#[test]
fn inv13_an_admin_may_revoke_but_not_use_anothers_lease() {
    let mut e = alice_holds_a();
    let o = batch(&mut e, 0, vec![admin("root", keep(3, 1)), admin("root", revoke(4, 1))]);
    assert_eq!(o.replies, vec![not_owner(1), Reply::LeaseRevoked { lease: l(1) }]);
    assert!(e.lease_info(0, l(1)).is_none());
}

#[test]
fn inv13_a_lease_granted_without_a_caller_takes_commands_from_anyone() {
    let mut e = Engine::new();
    batch(&mut e, 0, vec![new_lease(1, TTL)]);
    let o = batch(&mut e, 0, vec![by("bob", keep(2, 1)), keep(3, 1)]);
    assert_eq!(o.replies, vec![Reply::LeaseKept { lease: l(1), ttl_ms: TTL }; 2]);
}

#[test]
fn inv13_plain_commands_on_an_owned_lease_are_not_checked() {
    // A server with authentication off sends commands without a caller; the
    // engine then applies them as before (the server is where identities are).
    let mut e = alice_holds_a();
    let o = batch(&mut e, 0, vec![keep(3, 1)]);
    assert_eq!(o.replies, vec![Reply::LeaseKept { lease: l(1), ttl_ms: TTL }]);
}

#[test]
fn inv6_a_grant_retried_by_another_identity_does_not_get_the_lease() {
    let mut e = alice_holds_a();
    let o = batch(&mut e, 0, vec![by("mallory", new_lease(1, TTL)), by("alice", new_lease(1, TTL))]);
    assert_eq!(o.replies, vec![not_owner(1), lease_granted(1)]);
}

#[test]
fn inv9_a_bad_caller_is_rejected_and_changes_nothing() {
    let mut e = Engine::new();
    let before = e.clone();
    let long = "x".repeat(MAX_CALLER_NAME + 1);
    let nested = by("alice", by("bob", new_lease(1, TTL)));
    let o = batch(
        &mut e,
        0,
        vec![by("", new_lease(1, TTL)), by("a b", new_lease(2, TTL)), by(&long, new_lease(3, TTL)), nested],
    );
    assert!(o.replies.iter().all(|r| matches!(r, Reply::Rejected(EngineError::InvalidCaller(_)))), "{o:?}");
    assert_eq!(e, before);
}

#[test]
fn a_proposed_lease_id_is_used_and_a_taken_one_refused() {
    let mut e = Engine::new();
    let with_id = |req, id| Command::GrantLease { req: r(req), ttl_ms: TTL, id: Some(l(id)) };
    let o = batch(
        &mut e,
        0,
        vec![with_id(1, 0x5eed_0000_0001), with_id(2, 0x5eed_0000_0001), with_id(3, 0), new_lease(4, TTL)],
    );
    assert_eq!(
        o.replies,
        vec![
            lease_granted(0x5eed_0000_0001),
            Reply::Rejected(EngineError::LeaseIdTaken(l(0x5eed_0000_0001))),
            Reply::Rejected(EngineError::LeaseIdTaken(l(0))),
            lease_granted(1),
        ]
    );
}

/// INV-9: a grant refused for a taken id changes nothing, the lease that has
/// the id included (the one search that finds it taken inserts nothing).
#[test]
fn a_grant_refused_for_a_taken_id_changes_nothing() {
    let mut e = Engine::new();
    let with_id = |req, id| Command::GrantLease { req: r(req), ttl_ms: TTL, id: Some(l(id)) };
    batch(&mut e, 0, vec![with_id(1, 0x5eed_0000_0001)]);
    let before = e.clone();
    let o = batch(&mut e, 0, vec![with_id(2, 0x5eed_0000_0001)]);
    assert_eq!(o.replies, vec![Reply::Rejected(EngineError::LeaseIdTaken(l(0x5eed_0000_0001)))]);
    assert_eq!(e, before);
}

#[test]
fn the_counter_skips_an_id_a_proposal_took() {
    let mut e = Engine::new();
    let o = batch(&mut e, 0, vec![Command::GrantLease { req: r(1), ttl_ms: TTL, id: Some(l(1)) }, new_lease(2, TTL)]);
    assert_eq!(o.replies, vec![lease_granted(1), lease_granted(2)]);
}

#[test]
fn usage_counts_an_owners_leases_holds_and_waits_until_they_end() {
    let mut e = alice_holds_a();
    batch(&mut e, 0, vec![by("bob", new_lease(3, TTL)), by("bob", acq(4, 2, "a", 500, 0))]);
    assert_eq!(e.usage("alice"), Usage { leases: 1, holds: 1, waits: 0 });
    assert_eq!(e.usage("bob"), Usage { leases: 1, holds: 0, waits: 1 });
    assert_eq!(e.check_consistency(), Ok(()));
    batch(&mut e, 0, vec![by("alice", revoke(5, 1))]);
    assert_eq!(e.usage("alice"), Usage::default());
    assert_eq!(e.usage("bob"), Usage { leases: 1, holds: 1, waits: 0 }, "bob's wait became a hold");
    batch(&mut e, 2 * TTL, vec![]);
    assert_eq!(e.usage("bob"), Usage::default(), "an expired lease leaves its owner's count");
    assert_eq!(e.check_consistency(), Ok(()));
}

#[test]
fn a_state_whose_owner_index_disagrees_with_its_leases_is_refused() {
    let e = alice_holds_a();
    let json = serde_json::to_string(&e).unwrap().replace("\"owned\":{\"alice\"", "\"owned\":{\"mallory\"");
    let bad: Engine = serde_json::from_str(&json).unwrap();
    assert!(bad.check_consistency().unwrap_err().contains("owner"));
}
