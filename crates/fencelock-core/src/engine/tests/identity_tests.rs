//! Holder identity and value (issue 17): carried by acquires, kept by holders
//! and waiters, shown by queries, validated before anything changes.

use super::harness::*;
use super::*;

/// Acquire with an identity and a value.
fn acq_as(req: u64, lease: u64, lock: &str, wait_ms: u64, identity: &str, value: &[u8]) -> Command {
    let (lock, identity, value) = (lock.to_string(), identity.to_string(), value.to_vec());
    Command::Acquire(Acquire { req: r(req), lease: l(lease), lock, wait_ms, lock_delay_ms: 0, identity, value })
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
    let info = LockInfo {
        name: name("a"),
        holder: Some(holder(1, 1, 200, 200, "host-a:1", b"10.0.0.1:7000")),
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
    assert_eq!(
        fx,
        vec![released(grant("a", 1, 1), 100, ReleaseCause::Released), granted(grant("a", 2, 2), 2, true, 100)]
    );
    let info = LockInfo {
        name: name("a"),
        holder: Some(holder(2, 2, 100, 0, "host-b:2", b"B")),
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
