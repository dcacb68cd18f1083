//! Holder identity and value (issue 17): carried by acquires, kept by holders
//! and waiters, shown by queries, validated before anything changes.

use super::harness::*;
use super::*;

/// Acquire with an identity and a value.
fn acq_as(req: u64, lease: u64, lock: &str, wait_ms: u64, identity: &str, value: &[u8]) -> Command {
    let (lock, identity, value) = (lock.to_string(), identity.to_string(), value.to_vec());
    let (mode, weight, permits) = (Mode::Exclusive, 1, 0);
    let (req, lease) = (r(req), l(lease));
    Command::Acquire(Acquire {
        req,
        lease,
        lock,
        wait_ms,
        lock_delay_ms: 0,
        identity,
        value,
        mode,
        weight,
        permits,
        hold_at_least_ms: 0,
        once_per: String::new(),
        also: Vec::new(),
    })
}

/// The holder info of a lease made by [`setup`] (deadline [`TTL`]), at `now`.
fn holder(lease: u64, token: u64, now: u64, held_ms: u64, identity: &str, value: &[u8]) -> HolderInfo {
    let (identity, value) = (identity.to_string(), value.to_vec());
    let ttl_left_ms = TTL - now;
    HolderInfo {
        lease: l(lease),
        owner: None,
        token: t(token),
        held_ms,
        ttl_left_ms,
        lock_delay_ms: 0,
        mode: Mode::Exclusive,
        weight: 1,
        identity,
        value,
    }
}

fn waiter(lease: u64, req: u64, waited_ms: u64, wait_left_ms: u64, identity: &str) -> WaiterInfo {
    WaiterInfo { lease: l(lease), req: r(req), waited_ms, wait_left_ms, identity: identity.to_string() }
}

#[test]
fn the_holder_shows_the_identity_and_value_of_its_acquire_and_waiters_their_identity() {
    let mut e = setup(3);
    assert_eq!(one(&mut e, 0, acq_as(1, 1, "a", 0, "host-a:1", b"10.0.0.1:7000")).0, Reply::Acquired(grant("a", 1, 1)));
    assert_eq!(
        one(&mut e, 100, acq_as(2, 2, "a", 500, "host-b:2", b"ignored until granted")).0,
        Reply::Queued { position: 0 }
    );
    assert_eq!(one(&mut e, 100, acq(3, 3, "a", 500, 0)).0, Reply::Queued { position: 1 });
    let waiters = vec![waiter(2, 2, 100, 400, "host-b:2"), waiter(3, 3, 100, 400, "")];
    let holder = holder(1, 1, 200, 200, "host-a:1", b"10.0.0.1:7000");
    let info = LockInfo {
        name: name("a"),
        holder: Some(holder.clone()),
        holders: vec![holder],
        permits: 0,
        reopens_in_ms: None,
        waiters,
    };
    assert_eq!(e.lock_info(200, "a"), Some(info.clone()));
    assert_eq!(e.locks(200, "", 10), vec![info]);
}

#[test]
fn a_granted_waiter_becomes_holder_with_its_own_identity_and_value() {
    let mut e = setup(2);
    one(&mut e, 0, acq_as(1, 1, "a", 0, "host-a:1", b"A"));
    one(&mut e, 0, acq_as(2, 2, "a", 900, "host-b:2", b"B"));
    let (reply, fx) = one(&mut e, 100, rel(3, 1, "a", 1));
    assert_eq!(reply, Reply::Released);
    // The effects carry what each grant published, for watchers.
    let (tag_a, tag_b) = (Tag::new("host-a:1", b"A"), Tag::new("host-b:2", b"B"));
    let released =
        Effect::Released { grant: grant("a", 1, 1), held_ms: 100, cause: ReleaseCause::Released, tag: tag_a };
    let granted = Effect::Granted {
        grant: grant("a", 2, 2),
        req: r(2),
        queued: true,
        waited_ms: 100,
        tag: tag_b,
        mode: Mode::Exclusive,
    };
    assert_eq!(fx, vec![released, granted]);
    let holder = holder(2, 2, 100, 0, "host-b:2", b"B");
    let info = LockInfo {
        name: name("a"),
        holder: Some(holder.clone()),
        holders: vec![holder],
        permits: 0,
        reopens_in_ms: None,
        waiters: vec![],
    };
    assert_eq!(e.lock_info(100, "a"), Some(info));
}

#[test]
fn inv6_a_retry_with_other_identity_and_value_gets_the_first_grant_unchanged() {
    let mut e = setup(1);
    assert_eq!(one(&mut e, 0, acq_as(1, 1, "a", 0, "first:1", b"one")).0, Reply::Acquired(grant("a", 1, 1)));
    let (reply, fx) = one(&mut e, 10, acq_as(1, 1, "a", 0, "second:2", b"two"));
    assert_eq!((reply, fx), (Reply::Acquired(grant("a", 1, 1)), vec![]));
    assert_eq!(e.lock_info(10, "a").unwrap().holder, Some(holder(1, 1, 10, 10, "first:1", b"one")));
}

#[test]
fn inv9_an_identity_or_value_over_its_limit_is_rejected_and_changes_nothing() {
    let mut e = setup(1);
    let long = "x".repeat(MAX_IDENTITY_BYTES + 1);
    let err =
        EngineError::InvalidIdentity(format!("{} bytes (must be at most 256 bytes of UTF-8)", MAX_IDENTITY_BYTES + 1));
    assert_rejected(&mut e, 0, acq_as(1, 1, "a", 0, &long, b""), err);
    let err = EngineError::InvalidIdentity("must not contain control characters".into());
    assert_rejected(&mut e, 0, acq_as(2, 1, "a", 0, "host\n:1", b""), err);
    let big = vec![7u8; MAX_VALUE_BYTES + 1];
    let err = EngineError::InvalidValue { got_bytes: MAX_VALUE_BYTES + 1, max_bytes: MAX_VALUE_BYTES };
    assert_rejected(&mut e, 0, acq_as(3, 1, "a", 0, "", &big), err.clone());
    assert_eq!(err.to_string(), "invalid value: 4097 bytes (must be at most 4096 bytes)");
}

#[test]
fn an_identity_and_value_at_their_limits_are_accepted() {
    let mut e = setup(1);
    // 128 two-byte characters: 256 bytes of UTF-8.
    let identity = "é".repeat(MAX_IDENTITY_BYTES / 2);
    let value = vec![0u8; MAX_VALUE_BYTES];
    assert_eq!(one(&mut e, 0, acq_as(1, 1, "a", 0, &identity, &value)).0, Reply::Acquired(grant("a", 1, 1)));
    assert_eq!(e.lock_info(0, "a").unwrap().holder, Some(holder(1, 1, 0, 0, &identity, &value)));
}

#[test]
fn state_written_before_identity_and_value_existed_still_loads_without_them() {
    let mut e = setup(2);
    one(&mut e, 0, acq(1, 1, "a", 0, 0));
    one(&mut e, 0, acq(2, 2, "a", 900, 0));
    // A plain acquire writes neither field, so this JSON is also what a version
    // without them wrote.
    let json = serde_json::to_string(&e).unwrap();
    assert!(!json.contains("tag") && !json.contains("identity") && !json.contains("value"), "{json}");
    let back: Engine = serde_json::from_str(&json).unwrap();
    assert_eq!(back, e);
    let entry = r#"{"Acquire":{"req":5,"lease":1,"lock":"b","wait_ms":0,"lock_delay_ms":0}}"#;
    let cmd: Command = serde_json::from_str(entry).unwrap();
    assert_eq!(cmd, acq(5, 1, "b", 0, 0));
}

#[test]
fn identity_and_value_survive_a_snapshot_with_the_value_as_base64() {
    let mut e = setup(2);
    one(&mut e, 0, acq_as(1, 1, "a", 0, "host-a:1", b"\x00\xffhi"));
    one(&mut e, 0, acq_as(2, 2, "a", 900, "host-b:2", b""));
    let json = serde_json::to_string(&e).unwrap();
    assert!(json.contains(r#""value":"AP9oaQ==""#), "{json}");
    let back: Engine = serde_json::from_str(&json).unwrap();
    assert_eq!(back, e);
    let cmd = acq_as(3, 1, "b", 0, "h:1", b"v");
    let entry = serde_json::to_string(&cmd).unwrap();
    assert_eq!(
        entry,
        r#"{"Acquire":{"req":3,"lease":1,"lock":"b","wait_ms":0,"lock_delay_ms":0,"identity":"h:1","value":"dg=="}}"#
    );
    assert_eq!(serde_json::from_str::<Command>(&entry).unwrap(), cmd);
}

/// `SetValue` with (lock, lease, token).
fn set(req: u64, lease: u64, lock: &str, token: u64, value: &[u8]) -> Command {
    Command::SetValue { req: r(req), lease: l(lease), lock: lock.to_string(), token: t(token), value: value.to_vec() }
}

#[test]
fn the_holder_sets_a_new_value_and_keeps_its_identity_token_and_queue() {
    let mut e = setup(2);
    one(&mut e, 0, acq_as(1, 1, "a", 0, "host-a:1", b"old"));
    one(&mut e, 0, acq_as(2, 2, "a", 900, "host-b:2", b"B"));
    let (reply, fx) = one(&mut e, 50, set(3, 1, "a", 1, b"new"));
    assert_eq!(reply, Reply::ValueSet);
    assert_eq!(fx, vec![Effect::ValueChanged { grant: grant("a", 1, 1), tag: Tag::new("host-a:1", b"new") }]);
    let info = e.lock_info(50, "a").unwrap();
    assert_eq!(info.holder, Some(holder(1, 1, 50, 50, "host-a:1", b"new")));
    assert_eq!(info.waiters, vec![waiter(2, 2, 50, 850, "host-b:2")]);
    // An empty value clears it; the identity stays.
    assert_eq!(one(&mut e, 60, set(4, 1, "a", 1, b"")).0, Reply::ValueSet);
    assert_eq!(e.lock_info(60, "a").unwrap().holder, Some(holder(1, 1, 60, 60, "host-a:1", b"")));
}

#[test]
fn inv5_a_set_value_by_anyone_but_the_current_grant_changes_nothing() {
    let mut e = setup(2);
    one(&mut e, 0, acq_as(1, 1, "a", 0, "host-a:1", b"A"));
    one(&mut e, 0, acq_as(2, 2, "a", 900, "host-b:2", b"B"));
    let before = e.clone();
    // A waiter, a wrong token, a lock it does not hold, a lease that is gone.
    for cmd in [set(3, 2, "a", 1, b"x"), set(4, 1, "a", 2, b"x"), set(5, 1, "b", 1, b"x"), set(6, 9, "a", 1, b"x")] {
        assert_eq!(one(&mut e, 0, cmd), (Reply::NotHolder, vec![]));
    }
    assert_eq!(e, before, "a refused set-value leaves no trace");
    // The earlier holder, after a handoff: its token is no longer the grant.
    one(&mut e, 10, rel(7, 1, "a", 1));
    assert_eq!(one(&mut e, 10, set(8, 1, "a", 1, b"late")), (Reply::NotHolder, vec![]));
    assert_eq!(e.lock_info(10, "a").unwrap().holder.unwrap().value, b"B".to_vec());
}

#[test]
fn inv6_inv9_a_set_value_retry_is_answered_from_memory_and_bad_ones_are_rejected() {
    let mut e = setup(1);
    one(&mut e, 0, acq_as(1, 1, "a", 0, "", b""));
    assert_eq!(one(&mut e, 0, set(2, 1, "a", 1, b"one")).0, Reply::ValueSet);
    assert_eq!(one(&mut e, 0, set(3, 1, "a", 1, b"two")).0, Reply::ValueSet);
    // A late retry of the first does not bring its value back.
    assert_eq!(one(&mut e, 0, set(2, 1, "a", 1, b"one")), (Reply::ValueSet, vec![]));
    assert_eq!(e.lock_info(0, "a").unwrap().holder.unwrap().value, b"two".to_vec());
    let big = vec![0u8; MAX_VALUE_BYTES + 1];
    let too_big = EngineError::InvalidValue { got_bytes: MAX_VALUE_BYTES + 1, max_bytes: MAX_VALUE_BYTES };
    assert_rejected(&mut e, 0, set(4, 1, "a", 1, &big), too_big);
    assert_rejected(&mut e, 0, set(5, 1, "a", 0, b"x"), EngineError::InvalidToken);
    assert_rejected(&mut e, 0, set(0, 1, "a", 1, b"x"), EngineError::InvalidRequestId);
}
