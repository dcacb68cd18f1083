//! Changing who may do what in a running group: the group's policy
//! ([`fencelock_core::policy`]) is part of the replicated state, and a change
//! is a log entry like a grant (durable on a majority before it is
//! acknowledged, then in force on each node as it applies it).
//!
//! Where it sits: the admin endpoint ([`crate::admin`], `GET /v1/auth` and
//! `POST /v1/auth`) calls [`change`] for a caller it authenticated as an
//! `admin`. The leader proposes the change through the driver; a follower
//! hands it, with the caller, to the leader's peer service
//! ([`crate::raft::RaftService`]'s `ChangePolicy`), which takes only
//! policy changes by an `admin` caller from a member ([`from_peer`]).
//!
//! What a node may not do: create a group identity with the name of one its
//! own auth file defines (the file's identities, the bootstrap admin among
//! them, always win on the node that has them; see [`crate::auth::Table::build`]).

use std::time::Duration;

use fencelock_core::policy::{Credential, PolicyChange, Quota, Rule};
use fencelock_core::{Command, EngineError, Reply};
use serde::{Deserialize, Serialize};

use crate::auth::{Auth, AuthFile, Who};
use crate::driver::{DriverError, DriverHandle};
use crate::raft::Raft;
use crate::tls::ServerTls;

/// A change made (or found already made).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Changed {
    /// The policy's version after the change.
    pub version: u64,
    /// Whether it changed anything (a retry does not).
    pub changed: bool,
}

/// Why a policy change was not made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum PolicyError {
    /// The change breaks a rule, or this node cannot take it (400).
    #[error("{0}")]
    Invalid(String),
    /// No leader could be reached, or the outcome is unknown (503); every
    /// change is idempotent, so sending it again is safe.
    #[error("{0}")]
    Unavailable(String),
}

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

/// The command to propose: `change`, checked, from `who`'s caller.
fn command(auth: &Auth, who: &Who, change: PolicyChange) -> Result<Command, PolicyError> {
    change.validate().map_err(invalid)?;
    let Some(caller) = who.caller().filter(|_| auth.is_on()) else {
        return Err(PolicyError::Invalid(
            "authentication is off on this node (no --auth-file), so it has no policy to change".into(),
        ));
    };
    if let PolicyChange::PutIdentity { name, .. } | PolicyChange::DeleteIdentity { name } = &change {
        if auth.file().defines(name) {
            return Err(PolicyError::Invalid(format!(
                "identity {name:?} is defined in this node's auth file; edit the file, or choose another name"
            )));
        }
    }
    Ok(Command::As { caller, cmd: Box::new(Command::Policy(change)) })
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

fn invalid(e: EngineError) -> PolicyError {
    match e {
        EngineError::InvalidPolicy(why) => PolicyError::Invalid(why),
        other => PolicyError::Invalid(other.to_string()),
    }
}

/// Hands `cmd` to the leader's peer service at `addr`.
async fn forward(addr: &str, cmd: &Command, tls: Option<&ServerTls>) -> Result<Changed, PolicyError> {
    use fencelock_proto::raft::{raft_client::RaftClient, RaftPayload};
    let unreachable = |e: String| PolicyError::Unavailable(format!("cannot reach the leader at {addr}: {e}"));
    let endpoint = crate::raft::network::peer_endpoint(addr, tls.map(|t| t.peer_client().0))
        .map_err(|e| unreachable(e.to_string()))?
        .connect_timeout(Duration::from_secs(3));
    let channel = endpoint.connect().await.map_err(|e| unreachable(e.to_string()))?;
    let json = serde_json::to_vec(cmd).map_err(|e| unreachable(e.to_string()))?;
    let mut req = tonic::Request::new(RaftPayload { json });
    req.set_timeout(Duration::from_secs(10));
    let answer = RaftClient::new(channel).change_policy(req).await.map_err(|s| unreachable(s.message().to_string()))?;
    serde_json::from_slice::<Result<Changed, PolicyError>>(&answer.into_inner().json)
        .map_err(|e| PolicyError::Unavailable(format!("malformed answer from the leader: {e}")))?
}

/// On the leader: a change a follower handed over. Only a policy change by an
/// `admin` caller is taken (the follower authenticated the caller; the peer
/// service has checked that the sender is a member), and only if the caller
/// is an admin here too: a follower that has not applied an identity's
/// removal yet cannot make changes for it.
pub async fn from_peer(driver: &DriverHandle, auth: &Auth, cmd: Command) -> Result<Changed, PolicyError> {
    match &cmd {
        Command::As { caller, cmd: inner } if caller.admin && matches!(**inner, Command::Policy(_)) => {
            if !auth.is_admin_named(&caller.name) {
                return Err(PolicyError::Invalid(format!("{:?} is not an admin identity of the leader", caller.name)));
            }
            answer(driver.submit(cmd).await)
        }
        _ => Err(PolicyError::Invalid("only a policy change by an admin may be handed over".into())),
    }
}

/// The policy as `GET /v1/auth` shows it: roles and identities, with where
/// each is defined; never a hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct View {
    /// The group policy's version on this node.
    pub version: u64,
    pub roles: Vec<RoleView>,
    pub identities: Vec<IdentityView>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoleView {
    pub name: String,
    /// `group` or `file`.
    pub source: String,
    pub rules: Vec<Rule>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdentityView {
    pub name: String,
    /// `group` or `file` (a group identity a file shadows is not listed).
    pub source: String,
    /// `token <id>` or `certificate CN "<cn>"`.
    pub credential: String,
    pub roles: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<Quota>,
}

/// What this node knows: its file's roles and identities, and the group's.
pub fn view(file: &AuthFile, group: &fencelock_core::Policy) -> View {
    let mut roles = Vec::new();
    let mut identities = Vec::new();
    for (policy, source) in [(&file.policy, "file"), (group, "group")] {
        for (name, rules) in policy.roles() {
            roles.push(RoleView { name: name.clone(), source: source.into(), rules: rules.clone() });
        }
        for (name, def) in policy.identities() {
            if source == "group" && file.defines(name) {
                continue;
            }
            let credential = match &def.credential {
                Credential::Token { id, .. } => format!("token {id}"),
                Credential::Cert { cn } => format!("certificate CN {cn:?}"),
            };
            identities.push(IdentityView {
                name: name.clone(),
                source: source.into(),
                credential,
                roles: def.roles.clone(),
                limits: def.limits,
            });
        }
    }
    roles.sort_by(|a, b| a.name.cmp(&b.name).then(a.source.cmp(&b.source)));
    identities.sort_by(|a, b| a.name.cmp(&b.name));
    View { version: group.version(), roles, identities }
}
