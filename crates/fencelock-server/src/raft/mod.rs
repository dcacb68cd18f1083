//! The Raft group: openraft's type configuration, the log store (its entries
//! in the append-only segment log of [`wal`] by default, or in redb; the vote
//! and committed log id in redb), the redb-backed state machine, and the gRPC
//! network between members.
//!
//! A single node is a group of one; nothing here assumes one node. The replicated
//! state machine is the [`fencelock_core::Engine`]: each log entry's payload is one
//! engine [`fencelock_core::Input`] (a batch of commands, or a `LeaderStart`), kept
//! with its encoded bytes as a [`LogInput`], and applying it yields
//! the engine's [`Output`], which openraft hands back to the leader's driver.
//! A snapshot's data is a file of the data dir from end to end: built into
//! it, sent from it in chunks, received into one and adopted by rename
//! ([`snapshot_data::SnapshotData`]).

use fencelock_core::Output;
pub use log_input::LogInput;

pub mod check;
pub(crate) mod codec;
pub mod db;
pub mod db_error;
pub mod identity;
pub mod log_input;
pub mod log_store;
pub mod network;
pub(crate) mod record;
pub mod snapshot_data;
pub(crate) mod snapshot_file;
pub(crate) mod snapshot_payload;
pub mod snapshot_policy;
pub mod snapshot_rx;
pub(crate) mod snapshot_store;
pub mod state_machine;
pub mod wal;

pub use db::DB_FILE;
pub use log_store::{open as open_storage, open_with as open_storage_with, LogStore};
pub use network::{Network, RaftService};
pub use state_machine::{SharedEngine, StateMachine};

/// The codec this binary writes Raft log entries in (see `codec.rs`; it
/// reads the older ones too). `fencelock --version` names it.
pub const LOG_ENTRY_CODEC: u8 = codec::CODEC_CURRENT;

#[cfg(test)]
mod snapshot_stream_tests;
#[cfg(test)]
mod tests;

/// A member of the group as the membership records it: the address clients
/// use (its gRPC client port, named in leader hints) and, when the node serves
/// Raft on a port of its own (`--peer-listen`), the address peers use. Stored
/// as `{"addr": …}` like openraft's `BasicNode`, which memberships written
/// before the peer address existed hold.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Member {
    pub addr: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_addr: Option<String>,
}

impl Member {
    /// A member that serves peers on its client port.
    pub fn new(addr: impl Into<String>) -> Self {
        Member { addr: addr.into(), peer_addr: None }
    }

    /// A member with its own peer port at `peer_addr` (if given).
    pub fn with_peer(addr: impl Into<String>, peer_addr: Option<String>) -> Self {
        Member { addr: addr.into(), peer_addr }
    }

    /// Where peers send Raft messages.
    pub fn peer(&self) -> &str {
        self.peer_addr.as_deref().unwrap_or(&self.addr)
    }
}

impl std::fmt::Display for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.peer_addr {
            Some(p) => write!(f, "{} (peers: {p})", self.addr),
            None => f.write_str(&self.addr),
        }
    }
}

/// How a node whose data dir is empty comes into a group. A node with data
/// ignores it: its membership is in its log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bootstrap {
    /// A new group of one (the default).
    Single,
    /// A new group of these voters, node id → gRPC address, or
    /// `CLIENT/PEER` for a node with its own peer port (see [`crate::config::peer_entry`]);
    /// this node must be one of them. Start every listed node with the same
    /// list.
    Peers(std::collections::BTreeMap<NodeId, String>),
    /// No group of its own: wait to be added to an existing group (`fencelock
    /// cluster add`).
    Join,
}

openraft::declare_raft_types!(
    /// openraft types of fencelock.
    pub TypeConfig:
        D = LogInput,
        R = Output,
        NodeId = u64,
        Node = Member,
        SnapshotData = snapshot_data::SnapshotData,
);

/// The running Raft handle.
pub type Raft = openraft::Raft<TypeConfig>;
/// Node id of a group member.
pub type NodeId = u64;
