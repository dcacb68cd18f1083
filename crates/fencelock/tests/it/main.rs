//! The client's integration tests against a real node, one binary (each former
//! test file is a module). The backends' conformance suite is the `backends` binary.

mod support;

mod client;
mod election;
mod faults;
mod push;
mod shared;
mod stream;
mod watch;
