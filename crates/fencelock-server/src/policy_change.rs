//! Changing who may do what in a running group: a policy change is proposed
//! through the driver on the leader; a follower hands it, with the caller, to
//! the leader's peer service (`ChangePolicy`, see [`crate::handover`]), which
//! takes it through [`from_peer`]. What a change may be, and what it answers,
//! are the access rules' ([`crate::access::policy`]).
//!
//! Where it sits: the admin endpoint ([`crate::admin`], `POST /v1/auth`) calls
//! [`change`] for a caller it authenticated as an `admin`.

use std::time::Duration;

use fencelock_core::policy::PolicyChange;
use fencelock_core::{Command, Reply};

use crate::access::auth::{Auth, Who};
use crate::access::policy::{self, command, invalid, Changed, PolicyError};
use crate::access::tls::ServerTls;
use crate::driver::{DriverError, DriverHandle};
use crate::raft::Raft;

/// Makes `change` for `who` (already allowed `admin` by the caller): on this
/// node if it leads, else on the leader, through its peer port.
pub async fn change(
    driver: &DriverHandle,
    raft: &Raft,
    auth: &Auth,
    who: &Who,
    change: PolicyChange,
    tls: Option<&ServerTls>,
) -> Result<Changed, PolicyError> {
    let cmd = command(auth, who, change)?;
    match driver.submit(cmd.clone()).await {
        Err(DriverError::NotLeader { .. }) => {
            match crate::cluster::leader_within(raft, crate::cluster::LEADER_WAIT).await {
                // This node took over meanwhile: propose here after all.
                Some((id, _)) if id == raft.metrics().borrow().id => answer(driver.submit(cmd).await),
                Some((_, addr)) => forward(&addr, &cmd, tls).await,
                None => Err(PolicyError::Unavailable("no leader is known; try again once the group has one".into())),
            }
        }
        r => answer(r),
    }
}

/// The answer to a proposed policy change.
fn answer(r: Result<Reply, DriverError>) -> Result<Changed, PolicyError> {
    match r {
        Ok(Reply::PolicyChanged { version, changed }) => Ok(Changed { version, changed }),
        Ok(Reply::Rejected(e)) => Err(invalid(e)),
        Ok(other) => Err(PolicyError::Unavailable(format!("unexpected engine reply {other:?}"))),
        Err(e @ DriverError::NotLeader { .. }) => Err(PolicyError::Unavailable(e.to_string())),
        Err(DriverError::Unavailable(why)) => {
            Err(PolicyError::Unavailable(format!("the outcome is unknown ({why}); sending the change again is safe")))
        }
    }
}

/// Hands `cmd` to the leader's peer service at `addr`.
async fn forward(addr: &str, cmd: &Command, tls: Option<&ServerTls>) -> Result<Changed, PolicyError> {
    use fencelock_proto::raft::{raft_client::RaftClient, RaftPayload};
    let unreachable = |e: String| PolicyError::Unavailable(format!("cannot reach the leader at {addr}: {e}"));
    let channel = crate::cluster::dial_leader(addr, tls).await.map_err(unreachable)?;
    let json = serde_json::to_vec(cmd).map_err(|e| unreachable(e.to_string()))?;
    let mut req = tonic::Request::new(RaftPayload { json });
    req.set_timeout(Duration::from_secs(10));
    let answer = RaftClient::new(channel).change_policy(req).await.map_err(|s| unreachable(s.message().to_string()))?;
    serde_json::from_slice::<Result<Changed, PolicyError>>(&answer.into_inner().json)
        .map_err(|e| PolicyError::Unavailable(format!("malformed answer from the leader: {e}")))?
}

/// On the leader: a change a follower handed over, proposed once the access
/// rules admit it ([`policy::admit_handed_over`]).
pub async fn from_peer(driver: &DriverHandle, auth: &Auth, cmd: Command) -> Result<Changed, PolicyError> {
    policy::admit_handed_over(auth, &cmd)?;
    answer(driver.submit(cmd).await)
}
