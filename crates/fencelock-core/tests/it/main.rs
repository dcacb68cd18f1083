//! The engine's integration tests, one binary (each former test file is a module):
//! the reference model, snapshot compatibility and the ignored measurements.

mod footprint;
mod model;
mod per_command;
mod snapshot_compat;
