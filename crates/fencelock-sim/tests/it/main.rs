//! The simulator's invariant checks, one binary (each former test file is a module).
//! Reproduce one seed: `FENCELOCK_SIM_SEED=N cargo nextest run -p fencelock-sim MODULE::`.

mod inv_dead_waiter;
mod inv_determinism;
mod inv_exclusive;
mod inv_fence;
mod inv_heal;
mod inv_multi;
mod inv_tokens;
mod many_clients;
