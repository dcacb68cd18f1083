//! The server's integration tests, one binary (each former test file is a module):
//! real nodes on free ports of 127.0.0.1, started through `support`.

mod support;

mod auth_matrix;
mod cancel_race;
mod data_flips;
mod flood;
mod framed;
mod fuzz_decoders;
mod http_api;
mod http_openapi;
mod log_migration;
mod multi_lock;
mod observability;
mod once_per_wait;
mod peer_input;
mod refusals;
mod rejected_requests;
mod segment_log;
mod session_ops;
mod snapshot_scale;
