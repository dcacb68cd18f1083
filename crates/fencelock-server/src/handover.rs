//! The leader's side of what a follower hands over through the peer service:
//! a membership change goes to [`crate::cluster::apply`], a policy change to
//! [`crate::policy_change::from_peer`].
//!
//! Where it sits: the node ([`crate::serve`]) builds [`Owners`] and passes it
//! to its peer service ([`crate::raft::RaftService::with_handover`]), which
//! checks that the sender is a member and knows nothing of either change.

use std::sync::Arc;

use fencelock_core::Command;
use tonic::Status;

use crate::access::auth::Auth;
use crate::driver::DriverHandle;
use crate::raft::network::{decode_payload, encode_payload, Handover};
use crate::raft::Raft;

/// The owners of the changes a follower hands over.
pub struct Owners {
    /// Membership changes are made on it.
    pub raft: Raft,
    /// Policy changes are proposed through it.
    pub driver: DriverHandle,
    /// Whose admins may change the policy.
    pub auth: Arc<Auth>,
}

#[tonic::async_trait]
impl Handover for Owners {
    async fn change_members(&self, payload: &[u8]) -> Result<Vec<u8>, Status> {
        let change: crate::cluster::Change = decode_payload(payload)?;
        encode_payload(&crate::cluster::apply(&self.raft, &change).await)
    }

    async fn change_policy(&self, payload: &[u8]) -> Result<Vec<u8>, Status> {
        let cmd: Command = decode_payload(payload)?;
        encode_payload(&crate::policy_change::from_peer(&self.driver, &self.auth, cmd).await)
    }
}
