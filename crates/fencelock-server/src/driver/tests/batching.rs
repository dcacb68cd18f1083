//! Group commit: everything that arrives while one entry is written goes into
//! the next single entry, in arrival order; replies come only once the entry
//! holding them is written (persist, then reply).

use super::harness::*;
use crate::driver::core::{approx_bytes, batch_len, MAX_BATCH_BYTES};

#[test]
fn requests_of_one_step_make_one_entry_and_are_answered_after_it_is_written() {
    let mut c = ready(64);
    let a = c.step(at(20), [request(1, keep(1, 1)), request(2, keep(2, 1))]);
    assert_eq!(a, vec![Action::Batched(2), batch(2, 20, vec![keep(1, 1), keep(2, 1)])]);
    let a = c.step(at(25), [written(2, vec![kept(1), kept(2)], vec![], None)]);
    assert_eq!(a, vec![Action::Reply(1, Ok(kept(1))), Action::Reply(2, Ok(kept(2)))]);
}

#[test]
fn what_arrives_during_a_write_waits_for_it_then_goes_out_together() {
    let mut c = ready(64);
    assert_eq!(c.step(at(20), [request(1, keep(1, 1))]), vec![Action::Batched(1), batch(2, 20, vec![keep(1, 1)])]);
    assert_eq!(c.step(at(21), [request(2, keep(2, 1))]), vec![], "one write in flight at a time");
    assert_eq!(c.step(at(22), [request(3, keep(3, 1))]), vec![]);
    let a = c.step(at(30), [written(2, vec![kept(1)], vec![], None)]);
    assert_eq!(
        a,
        vec![Action::Reply(1, Ok(kept(1))), Action::Batched(2), batch(3, 30, vec![keep(2, 1), keep(3, 1)])],
        "the first reply, then one entry for both that waited"
    );
}

#[test]
fn an_entry_holds_at_most_max_batch_commands() {
    let mut c = ready(2);
    let a = c.step(at(20), (1..=3).map(|i| request(i, keep(i as u64, 1))));
    assert_eq!(a, vec![Action::Batched(2), batch(2, 20, vec![keep(1, 1), keep(2, 1)])]);
    let a = c.step(at(30), [written(2, vec![kept(1), kept(2)], vec![], None)]);
    assert_eq!(a[2..], [Action::Batched(1), batch(3, 30, vec![keep(3, 1)])]);
}

fn msg(name_len: usize) -> Msg<u32, u32> {
    Msg { cmd: acquire_cmd(1, 1, &"x".repeat(name_len)), reply: None, waiter: None, gen: None }
}

/// Small commands fill a batch up to `max_batch`.
#[test]
fn batch_len_is_capped_by_count() {
    let pending: Vec<_> = (0..10).map(|_| msg(8)).collect();
    assert_eq!(batch_len(&pending, 4), 4);
    assert_eq!(batch_len(&pending, 100), 10);
}

/// Large commands close a batch at `MAX_BATCH_BYTES`, whatever the count.
#[test]
fn batch_len_is_capped_by_bytes() {
    let each = approx_bytes(&msg(512).cmd);
    let pending: Vec<_> = (0..4096).map(|_| msg(512)).collect();
    let n = batch_len(&pending, 4096);
    assert_eq!(n, MAX_BATCH_BYTES / each);
    assert!(n * each <= MAX_BATCH_BYTES && (n + 1) * each > MAX_BATCH_BYTES);
}

/// One command larger than the cap still goes out alone (it cannot be split).
#[test]
fn batch_len_takes_at_least_one() {
    let pending = vec![msg(MAX_BATCH_BYTES), msg(8)];
    assert_eq!(batch_len(&pending, 4096), 1);
    assert_eq!(batch_len::<u32, u32>(&[], 4096), 0);
}
