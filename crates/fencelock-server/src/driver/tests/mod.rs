//! Tests of [`super::core::DriverCore`] alone: events in, the exact actions
//! out. One file per concern; `harness` builds the events and the engine
//! outputs they need.

mod harness;

mod batching;
mod failures;
mod leadership;
mod linger;
mod pipelining;
mod ticks;
mod waiters;
