//! The token floor and the cluster id carried by `LeaderStart` (INV-2 across
//! groups: a new group's tokens start above an earlier group's; see
//! `docs/design.md`, "Tokens across groups").

use super::harness::*;
use super::*;

fn leader_start(now: Millis, token_floor: u64, cluster_id: Option<u128>) -> Input {
    Input::LeaderStart { now, token_floor, cluster_id: cluster_id.map(ClusterId) }
}

#[test]
fn inv2_a_token_floor_above_the_counter_raises_the_next_token_to_it() {
    let mut e = setup(1);
    // The floor changes no lease and emits nothing: only the counter moves.
    assert_eq!(e.step(&leader_start(0, 5_000, None)), out(vec![], vec![], Some(1000)));
    assert_eq!(e.stats().token_counter, 4_999);
    let (reply, _) = one(&mut e, 0, acq(1, 1, "a", 0, 0));
    assert_eq!(reply, Reply::Acquired(grant("a", 1, 5_000)));
    let (reply, _) = one(&mut e, 0, acq(2, 1, "b", 0, 0));
    assert_eq!(reply, Reply::Acquired(grant("b", 1, 5_001)));
    let s = e.stats();
    assert_eq!((s.tokens_issued, s.token_counter), (2, 5_001), "a count, and the counter");
}

#[test]
fn inv2_a_token_floor_at_or_below_the_counter_changes_nothing() {
    let mut e = setup(1);
    one(&mut e, 0, acq(1, 1, "a", 0, 0));
    one(&mut e, 0, acq(2, 1, "b", 0, 0));
    for floor in [0, 1, 3] {
        e.step(&leader_start(0, floor, None));
    }
    let (reply, _) = one(&mut e, 0, acq(3, 1, "c", 0, 0));
    assert_eq!(reply, Reply::Acquired(grant("c", 1, 3)), "never lowered, never skipped");
}

#[test]
fn the_first_leader_start_with_a_cluster_id_sets_it_for_good() {
    let mut e = Engine::new();
    assert_eq!(e.cluster_id(), None);
    e.step(&leader_start(0, 0, None));
    assert_eq!(e.cluster_id(), None);
    e.step(&leader_start(0, 0, Some(7)));
    e.step(&leader_start(0, 0, Some(9)));
    e.step(&leader_start(0, 0, None));
    assert_eq!(e.cluster_id(), Some(ClusterId(7)), "the first proposal wins, whatever follows");
    let back: Engine = serde_json::from_str(&serde_json::to_string(&e).unwrap()).unwrap();
    assert_eq!(back.cluster_id(), Some(ClusterId(7)), "the snapshot carries it");
}

/// Log entries and snapshots written before the floor and the cluster id
/// existed still decode, as "no floor" and "no id yet".
#[test]
fn entries_and_snapshots_without_the_new_fields_still_decode() {
    let old: Input = serde_json::from_str(r#"{"LeaderStart":{"now":5}}"#).unwrap();
    assert_eq!(old, Input::leader_start(5));
    let mut e = setup(1);
    one(&mut e, 0, acq(1, 1, "a", 0, 0));
    let mut json: serde_json::Value = serde_json::to_value(&e).unwrap();
    let fields = json.as_object_mut().unwrap();
    assert!(fields.remove("tokens_issued").is_some() && fields.remove("cluster_id").is_some());
    let back: Engine = serde_json::from_value(json).unwrap();
    assert_eq!((back.cluster_id(), back.stats().token_counter), (None, 1));
}

#[test]
fn token_floor_is_the_wall_clock_seconds_shifted_by_31_and_fits_the_fences() {
    assert_eq!(token_floor(0), 0);
    assert_eq!(token_floor(1), 1 << 31);
    assert_eq!(token_floor(1_700_000_000), 1_700_000_000u64 << 31);
    // One second later is 2^31 tokens higher: the room a group has per second.
    assert_eq!(token_floor(1_700_000_001) - token_floor(1_700_000_000), 1 << 31);
    // The fences take tokens up to 2^63 - 1; the floor saturates below that.
    for s in [u64::from(u32::MAX), u64::from(u32::MAX) + 1, u64::MAX] {
        assert_eq!(token_floor(s), u64::from(u32::MAX) << 31);
        assert!(token_floor(s) < i64::MAX as u64);
    }
}
