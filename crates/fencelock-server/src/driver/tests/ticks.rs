//! Time: the engine's next deadline is when the shell must wake the core,
//! which then writes an empty batch (a tick), so expiries are decided by the
//! leader's clock and written to the log.

use super::harness::*;

#[test]
fn the_engines_next_deadline_brings_a_tick() {
    let mut c = ready(64);
    assert_eq!(c.next_wake(), None);
    assert_eq!(c.step(at(20), [request(1, keep(1, 1))]).len(), 2);
    assert_eq!(c.step(at(21), [written(2, vec![kept(1)], vec![], Some(1021))]).len(), 1);
    assert_eq!(c.next_wake(), Some(1021));
    assert_eq!(c.step(at(500), [Event::Timer]), vec![], "too early: nothing");
    assert_eq!(c.step(at(1021), [Event::Timer]), vec![Action::Batched(0), batch(3, 1021, vec![])]);
    assert_eq!(c.next_wake(), None, "until the tick's output names the next one");
}
