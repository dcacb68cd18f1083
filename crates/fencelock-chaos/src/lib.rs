//! The library half of `fencelock-chaos`: the faults its `serve` subcommand
//! plugs into a lock server ([`faults`]), shared with its integration tests.
//! The harness itself (nemesis, workers, checkers, report) is the binary.

pub mod faults;
