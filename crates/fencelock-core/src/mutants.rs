//! Test-only mutants: known bugs that a fault-injection harness can switch back on,
//! to prove that its checkers catch them ("re-introduce a known bug and watch it go
//! red"). Compiled only with the `mutants` feature, and even then inert: every
//! switch is off until a test (or the fault-injection harness, `fencelock-chaos
//! serve`, from its `FENCELOCK_MUTANT`) turns it on. Nothing else turns one on.
//!
//! - [`set_dead_waiter_check_removed`] re-introduces etcd#11456, a grant to an
//!   expired waiter (INV-4 broken): `end_lease` leaves the ended lease's waits in
//!   the lock queues, and `take_next_live_waiter` takes the first queued waiter
//!   whether its lease is live or not, so a release can hand the lock to a lease
//!   that has expired. A lock granted that way stays held by the dead lease.
//! - [`crate::Engine::mutant_forget_tokens`] makes the token counter behave as if
//!   it were kept only in memory: the next token is 1 again (INV-2 broken). The
//!   harness's server hook calls it once after a restart
//!   (`FENCELOCK_MUTANT=memory-token`).
//!
//! The switches are process-wide: tests that turn one on rely on nextest running
//! each test in its own process.

use std::sync::atomic::{AtomicBool, Ordering};

/// Whether the dead-waiter protection of the engine is removed.
static DEAD_WAITER_CHECK_REMOVED: AtomicBool = AtomicBool::new(false);

/// Remove (`true`) or restore (`false`) the engine's dead-waiter protection, for
/// every engine of the process (see the module docs).
pub fn set_dead_waiter_check_removed(on: bool) {
    DEAD_WAITER_CHECK_REMOVED.store(on, Ordering::Relaxed);
}

/// Whether the dead-waiter protection is removed (see
/// [`set_dead_waiter_check_removed`]).
pub fn dead_waiter_check_removed() -> bool {
    DEAD_WAITER_CHECK_REMOVED.load(Ordering::Relaxed)
}
