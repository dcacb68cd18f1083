//! `fencelock-sim`: a deterministic simulation of fencelock under faults, on
//! [turmoil](https://docs.rs/turmoil) (virtual time, simulated TCP, seeded
//! partitions and held messages).
//!
//! # What is simulated
//! - **The real engine.** The "server" host owns a real [`fencelock_core::Engine`].
//! - **The real driver core.** Requests arrive over turmoil TCP (JSON lines,
//!   [`wire`]) and go to `fencelock_server::driver_core::DriverCore`, the
//!   server's own decisions (group commit, persist then reply, `LeaderStart`
//!   first, ticks at the engine's deadlines, waiters and the cancels of callers
//!   that went away), behind a simulated shell: a write goes to a simulated
//!   durable log (an in-memory `Vec` that survives crashes) *before* the engine
//!   applies it and before anything is answered, with `now` taken from the
//!   virtual monotonic clock. A crash loses everything but the log; the restart
//!   replays the log and the core writes `LeaderStart`, as the real single-node
//!   server does.
//! - **Clients** (`client-N` hosts): a lease kept alive every TTL/3 with a
//!   conservative deadline (from the send time of the acknowledged request), a
//!   FIFO acquire with a wait, an act at the resource with the fencing token,
//!   a release. A client can be paused between its last deadline check and its
//!   act, for 1.5–5 TTLs (Kleppmann's case).
//! - **The workload** ([`config::Workload`], `--workload`): `exclusive`, every
//!   client takes the lock exclusively and writes; or `mixed` (issue 18), each
//!   round a reader (shared, reads), a writer (exclusive, writes, and half the
//!   time downgrades and reads again with its token), a holder of 1–2 of
//!   the 3 permits of a semaphore (uses them) or a multi-acquirer: two or
//!   three of [`config::MULTI_LOCKS`] in one acquire (its `also`), in a
//!   rotated and maybe reversed order so that clients cross ({a,b} and
//!   {b,a}), then a write of each lock's own register with that lock's token
//!   and a release of each. The test seeds run `mixed` on
//!   every third seed ([`config::Workload::for_seed`]), so the short run in CI
//!   covers shared modes and multi-locks with no extra runs.
//! - **A fenced resource** (a register per lock): decides reads and writes by
//!   the fence's own rule
//!   (`fencelock_fence::Marks::admit`: a write only at or above every accepted
//!   token, a read only at or above the last accepted write's), accepts every
//!   permit use, and records every decision.
//! - **The nemesis** ([`nemesis`]): client pauses, server crash-restarts (inside a
//!   write window), partitions and held messages, one episode at a time.
//!
//! NOT simulated: openraft, redb, tonic/gRPC, the driver's tokio shell, real
//! clocks and processes. Those are
//! covered by the process-level chaos suite (`fencelock-chaos`).
//!
//! All randomness comes from the seed: turmoil's own RNG, the nemesis, the
//! clients and the simulated disk each get a generator derived from it, and the
//! server's collections are ordered, so the same seed gives the same trace.
//!
//! # Invariants
//! One module in [`check`] and one test file in `tests/` each: INV-FENCE (with
//! reads: the fence's rule at the resource), INV-TOKENS, INV-EXCL (generalized
//! to the design's INV-15: never a writer beside anyone, never more permits in
//! use than the semaphore has, one holder per multi-lock), INV-DEAD-WAITER,
//! INV-HEAL (a multi-acquire deadlocked with another would stop the grants),
//! INV-MULTI (the design's INV-18: a client holds all of a multi-acquire's
//! locks from one grant, one step at the server, never a strict subset), plus
//! determinism and mutants that must turn a checker red
//! ([`Mutant::PartialMultiPush`] for INV-MULTI). There is no FIFO checker (INV-3,
//! INV-16): the engine's tests and its model test check the queue order.
//!
//! # Found here, fixed in the server: a `CancelWait` raced a retry of the same acquire
//! `fencelock-server`'s driver used to write a `CancelWait(lease, req)` when the caller
//! of a queued acquire goes away, even if a retry of that acquire (same lease and
//! request id) had arrived since, and it registered waiters only from the `Queued`
//! reply. With the cancel and the retry in one batch:
//! - cancel first: the cancel's `WaitEnded{Cancelled}` wakes the retry, whose
//!   caller is told `TimedOut` while its acquire is queued again; the grant it
//!   gets later is held by nobody for as long as its lease is kept alive (the
//!   lock is stuck: INV-HEAL failed, at seed 4 of the simulator's former model
//!   of the driver);
//! - retry first: the retry is answered `Acquired(grant)`, then the cancel
//!   releases that grant and the lock goes to the next waiter while the retrying
//!   client believes it holds it (INV-EXCL fails, `--seed 48 --mutant
//!   racy-cancel`; the fence still rejects its stale writes).
//!
//! The driver now avoids both (a retry supersedes an unwritten cancel and owns
//! the wait from its arrival; a cancel from an older call is dropped;
//! `fencelock-server/tests/it/cancel_race.rs` and the driver core's own tests);
//! [`Mutant::RacyCancel`] brings the old behaviour back in the simulated shell,
//! and INV-EXCL catches it (seed 20 of the test seeds, among others).
//!
//! # Reproducing a seed
//! ```text
//! FENCELOCK_SIM_SEED=7 cargo nextest run -p fencelock-sim      # the tests, seed 7 only
//! cargo run -p fencelock-sim -- --seed 7 --trace                # one run, its trace and verdicts
//! cargo run -p fencelock-sim -- --seed 7 --workload mixed       # seed 7 with shared locks and permits
//! ```
//!
//! ```no_run
//! let report = fencelock_sim::run(&fencelock_sim::SimConfig::new(7));
//! for verdict in fencelock_sim::check::ALL.map(|c| fencelock_sim::check::run(c, &report)) {
//!     println!("{}", verdict.summary());
//! }
//! ```

pub mod check;
mod client;
mod clock;
pub mod config;
pub mod event;
pub mod harness;
pub mod nemesis;
pub mod report;
mod resource;
mod server;
mod sim;
pub mod wire;

pub use config::{Mutant, SimConfig};
pub use report::Report;
pub use sim::run;
