//! Snapshot compatibility across the compact state layout (issue 19 §4): a
//! snapshot written by the engine before lock names were shared, holds and
//! waits were vectors and remembered replies were compact still restores, to
//! an engine equal to the one the same inputs build today; and today's engine
//! writes the same serialized form, so an older peer or data dir reads it.
//!
//! Where it sits: beside the model test, through the public API only. The
//! fixture `snapshot_compat/main-f1a5419.json` is [`scenario`]'s engine as
//! serialized (JSON, as the server's snapshot) by main at f1a5419, generated
//! there by the ignored [`print_fixture`] with this very file.

use fencelock_core::{Acquire, Caller, Command, Engine, Input, LeaseId, Mode, Reply, RequestId, Token};

const FIXTURE: &str = include_str!("snapshot_compat/main-f1a5419.json");

fn step(e: &mut Engine, now: u64, cmds: Vec<Command>) -> Vec<Reply> {
    e.step(&Input::Batch { now, cmds }).replies
}

fn grant(req: u64, ttl_ms: u64) -> Command {
    Command::GrantLease { req: RequestId(req), ttl_ms, id: None }
}

fn acquire(req: u64, lease: u64, lock: &str, wait_ms: u64) -> Acquire {
    Acquire::exclusive(RequestId(req), LeaseId(lease), lock, wait_ms)
}

/// A state that uses every part the layout changed: holds (several on one
/// lease), waits (single and multi), remembered replies of every compact kind
/// and a boxed one (a `Busy`), a timed-out wait, a lock closed by lock-delay, a
/// semaphore, a shared grant, tags, an owner, a revoke, timers of each kind.
fn scenario() -> Engine {
    let mut e = Engine::new();
    e.step(&Input::LeaderStart { now: 1_000, token_floor: 0, cluster_id: None });
    let owner = Caller { name: "alice".into(), admin: false };
    let granted = step(
        &mut e,
        1_000,
        vec![
            grant(1, 60_000),
            grant(2, 60_000),
            grant(3, 500),
            Command::As { caller: owner, cmd: Box::new(grant(4, 60_000)) },
            grant(5, 60_000),
        ],
    );
    assert!(granted.iter().all(|r| matches!(r, Reply::LeaseGranted { .. })), "{granted:?}");
    let tagged = Acquire { identity: "worker-1".into(), value: b"v1".to_vec(), ..acquire(1, 1, "a", 0) };
    let replies = step(
        &mut e,
        1_100,
        vec![
            Command::Acquire(tagged),
            Command::Acquire(acquire(2, 1, "b", 0)),
            Command::Acquire(acquire(1, 2, "a", 30_000)),
            Command::Acquire(acquire(2, 2, "b", 0)),
            Command::Acquire(Acquire { lock_delay_ms: 2_000, ..acquire(1, 3, "c", 0) }),
            Command::Acquire(Acquire { permits: 3, weight: 2, ..acquire(1, 5, "sem", 0) }),
            Command::Acquire(Acquire { mode: Mode::Shared, ..acquire(3, 1, "r", 0) }),
            Command::Acquire(Acquire { also: vec!["m2".into()], ..acquire(3, 2, "a", 30_000) }),
            Command::Acquire(acquire(9, 1, "d", 0)),
            Command::Acquire(acquire(4, 2, "d", 200)),
            Command::KeepAlive { req: RequestId(5), lease: LeaseId(1) },
            Command::Acquire(acquire(6, 1, "e", 0)),
        ],
    );
    assert!(matches!(replies[0], Reply::Acquired(_)), "{replies:?}");
    assert!(matches!(replies[2], Reply::Queued { .. }), "{replies:?}");
    assert!(matches!(replies[3], Reply::Busy(_)), "{replies:?}");
    assert!(matches!(replies[9], Reply::Queued { .. }), "{replies:?}");
    let Reply::Acquired(e_grant) = &replies[11] else { panic!("{replies:?}") };
    let replies = step(
        &mut e,
        1_200,
        vec![
            Command::Release { req: RequestId(7), lease: LeaseId(1), lock: "e".into(), token: e_grant.token },
            Command::SetValue {
                req: RequestId(8),
                lease: LeaseId(1),
                lock: "a".into(),
                token: Token(1),
                value: b"v2".to_vec(),
            },
            Command::Revoke { req: RequestId(1), lease: LeaseId(5) },
        ],
    );
    assert_eq!(replies[..2], [Reply::Released, Reply::ValueSet]);
    // Lease 3 expires (its lock "c" closes for its lock-delay); lease 2's wait on "d" times out.
    step(&mut e, 1_700, vec![]);
    e
}

/// The form today's engine writes for [`scenario`]: the fixture's, but for
/// lease 1's keep-alive (request 5), which a lease now remembers apart from
/// its other outcomes, under `kept`.
fn todays_form() -> serde_json::Value {
    let mut v: serde_json::Value = serde_json::from_str(FIXTURE).unwrap();
    let lease = &mut v["leases"]["1"];
    let dedup = lease["dedup"].as_array_mut().unwrap();
    let at = dedup.iter().position(|e| e[0] == 5).expect("the fixture remembers keep-alive 5 with the rest");
    assert_eq!(dedup.remove(at)[1], serde_json::json!({"Replied": {"LeaseKept": {"lease": 1, "ttl_ms": 60000}}}));
    lease.as_object_mut().unwrap().insert("kept".into(), serde_json::json!([5]));
    v
}

/// A snapshot written by main before the compact layout restores to the
/// engine the same inputs build today, but for where lease 1 remembers its
/// keep-alive: it writes back exactly what it read, and it answers retries as
/// the engine built today does (INV-6), a retried keep-alive included, which
/// moves no deadline in either.
#[test]
fn an_old_layout_snapshot_restores_to_an_equal_engine() {
    let mut restored: Engine = serde_json::from_str(FIXTURE).expect("the old snapshot reads");
    let mut built = scenario();
    assert_eq!(serde_json::to_value(&restored).unwrap(), serde_json::from_str::<serde_json::Value>(FIXTURE).unwrap());
    let retry = vec![
        Command::Acquire(acquire(1, 1, "a", 0)),
        Command::Acquire(acquire(2, 2, "b", 0)),
        Command::KeepAlive { req: RequestId(5), lease: LeaseId(1) },
    ];
    let (from_old, from_new) = (step(&mut restored, 1_800, retry.clone()), step(&mut built, 1_800, retry));
    assert_eq!(from_old, from_new);
    let deadline = |e: &Engine| serde_json::to_value(e).unwrap()["leases"]["1"]["deadline"].clone();
    assert_eq!((deadline(&restored), deadline(&built)), (61_100.into(), 61_100.into()), "the retry moved no deadline");
}

/// Today's engine writes the form main wrote but for the keep-alives apart
/// (`kept`, a field an older peer or data dir ignores: it then applies a
/// retried keep-alive again, which moves the deadline from now); and it reads
/// back its own.
#[test]
fn the_new_layout_writes_the_old_form_and_round_trips() {
    let built = scenario();
    let written = serde_json::to_value(&built).unwrap();
    assert_eq!(written, todays_form());
    let back: Engine = serde_json::from_slice(&serde_json::to_vec(&built).unwrap()).unwrap();
    assert!(back == built, "a snapshot reads back to an equal engine");
}

/// Prints the fixture: run on the commit it is named after, with
/// `cargo nextest run -p fencelock-core snapshot_compat:: --run-ignored only --no-capture`.
#[test]
#[ignore = "generates the fixture; run it on main"]
fn print_fixture() {
    let json = serde_json::to_string_pretty(&scenario()).unwrap();
    assert!(json.contains("\"leases\""));
    println!("{json}");
}
