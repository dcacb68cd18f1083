//! The Raft group: openraft's type configuration, the redb-backed log store and
//! state machine, and the gRPC network between members.
//!
//! A single node is a group of one; nothing here assumes one node. The replicated
//! state machine is the [`fencelock_core::Engine`]: each log entry's payload is one
//! engine [`Input`] (a batch of commands, or a `LeaderStart`), and applying it yields
//! the engine's [`Output`], which openraft hands back to the leader's driver.

use std::io::Cursor;

use fencelock_core::{Input, Output};

pub mod check;
pub mod identity;
pub mod log_store;
pub mod network;
pub(crate) mod record;
pub mod snapshot_rx;
#[cfg(feature = "power-loss")]
pub mod power_loss;
pub mod state_machine;

pub use log_store::{open as open_storage, LogStore, DB_FILE};
pub use network::{Network, RaftService};
pub use state_machine::{SharedEngine, StateMachine};

#[cfg(test)]
mod tests;

openraft::declare_raft_types!(
    /// openraft types of fencelock.
    pub TypeConfig:
        D = Input,
        R = Output,
        NodeId = u64,
        Node = openraft::BasicNode,
        SnapshotData = Cursor<Vec<u8>>,
);

/// The running Raft handle.
pub type Raft = openraft::Raft<TypeConfig>;
/// Node id of a group member.
pub type NodeId = u64;
