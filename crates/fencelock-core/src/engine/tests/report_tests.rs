//! Refusal reports ([`Command::ReportRefusal`], issue 36): a fence tells the
//! group that it refused a stale token. A report is a log entry only so that
//! every member's watch shows it at the same revision; the engine answers it
//! and changes nothing.
//!
//! Invariants: INV-2 (a report spends no token: the counter stays where it
//! was), INV-9 (an invalid report is refused with its error, by `validate`
//! before it is proposed as by the engine, and changes nothing).

use super::harness::*;
use super::*;

fn report(lock: &str, refused: u64, highest: u64, resource: &str) -> Command {
    Command::ReportRefusal { lock: lock.into(), refused: t(refused), highest: t(highest), resource: resource.into() }
}

fn by(name: &str, admin: bool, cmd: Command) -> Command {
    Command::As { caller: Caller { name: name.into(), admin }, cmd: Box::new(cmd) }
}

/// Lease 1 holds "a" (token 1), lease 2 waits for it, at instant 10.
fn busy_engine() -> Engine {
    let mut e = setup(2);
    assert_eq!(one(&mut e, 0, acq(1, 1, "a", 0, 0)).0, Reply::Acquired(grant("a", 1, 1)));
    assert_eq!(one(&mut e, 0, acq(2, 2, "a", 500, 0)).0, Reply::Queued { position: 0 });
    tick(&mut e, 10);
    e
}

/// Rule: a report changes no state (the engine after equals the engine
/// before: leases, holders, queues, the token counter) and yields exactly
/// one reply, `Reported`, and no effect; sent by an identity (inside `As`)
/// too, and about a lock nobody holds.
#[test]
fn inv2_a_report_changes_nothing_and_is_answered_reported() {
    let mut e = busy_engine();
    let counter = e.stats().token_counter;
    for cmd in [
        report("a", 1, 2, "orders-42"),
        by("storage-1", false, report("a", 5, 9, "")),
        by("ops", true, report("nobody-holds-this", 1, u64::MAX, &"k".repeat(MAX_RESOURCE_BYTES))),
    ] {
        let before = e.clone();
        let out = batch(&mut e, 10, vec![cmd.clone()]);
        assert_eq!(out, Output { replies: vec![Reply::Reported], effects: vec![], next_deadline: e.next_deadline() });
        assert_eq!(e, before, "a report changed the engine: {cmd:?}");
        assert_eq!(e.stats().token_counter, counter);
    }
    // The next grant gets the next token: no report spent one.
    assert_eq!(one(&mut e, 10, rel(3, 1, "a", 1)).1[1], granted(grant("a", 2, 2), 2, true, 10));
}

/// Rule: a report in a batch between other commands leaves their outcomes
/// what they would be without it.
#[test]
fn a_report_in_a_batch_leaves_the_other_commands_alone() {
    let cmds = vec![acq(1, 1, "a", 0, 0), acq(2, 2, "a", 500, 0), rel(3, 1, "a", 1)];
    let mut plain = setup(2);
    let without = batch(&mut plain, 5, cmds.clone());
    let mut with = setup(2);
    let mut mixed = cmds;
    mixed.insert(1, report("a", 1, 7, "x"));
    let out = batch(&mut with, 5, mixed);
    let mut replies = without.replies.clone();
    replies.insert(1, Reply::Reported);
    assert_eq!((out.replies, out.effects), (replies, without.effects));
    assert_eq!(with, plain);
}

/// Rule: an invalid report is refused with its exact error, by `validate`
/// (so the server never proposes it) as by the engine, and changes nothing
/// (INV-9): a bad lock name, a token 0, a refused token not below the
/// highest (a fence admits an equal token: `Marks::admit`), a resource over
/// 256 bytes or with a control character. Inside `As` the same.
#[test]
fn inv9_an_invalid_report_is_refused_with_its_error() {
    let mut e = busy_engine();
    let not_below = |r: u64, h: u64| {
        EngineError::InvalidReport(format!(
            "refused token {r} is not below the highest token {h} (a fence refuses only tokens below its mark)"
        ))
    };
    let long = "k".repeat(MAX_RESOURCE_BYTES + 1);
    let cases = [
        (report("", 1, 2, ""), EngineError::InvalidName(NameError::Empty)),
        (report("a\u{7}", 1, 2, ""), EngineError::InvalidName(NameError::ControlChar { at: 1 })),
        (report("a", 0, 2, ""), EngineError::InvalidToken),
        (report("a", 1, 0, ""), EngineError::InvalidToken),
        (report("a", 7, 7, ""), not_below(7, 7)),
        (report("a", 9, 7, ""), not_below(9, 7)),
        (
            report("a", 1, 2, &long),
            EngineError::InvalidReport("resource is 257 bytes (must be at most 256 bytes of UTF-8)".into()),
        ),
        (
            report("a", 1, 2, "orders\n42"),
            EngineError::InvalidReport("resource must not contain control characters".into()),
        ),
        (by("storage-1", false, report("a", 3, 2, "")), not_below(3, 2)),
    ];
    for (cmd, err) in cases {
        assert_rejected(&mut e, 10, cmd, err);
    }
}
