//! The group's policy as the access rules see it: which changes a node
//! takes (`command`, [`admit_handed_over`]), what a change answers
//! ([`Changed`], [`PolicyError`]) and what `GET /v1/auth` shows ([`view`]).
//! The group's policy ([`fencelock_core::policy`]) is part of the replicated
//! state, and a change is a log entry like a grant (durable on a majority
//! before it is acknowledged, then in force on each node as it applies it).
//!
//! Where it sits: `policy_change` proposes a change through the
//! driver, or hands it to the leader, checked by the rules here; the admin
//! endpoint (`admin`) shows [`view`].
//!
//! What a node may not do: create a group identity with the name of one its
//! own auth file defines (the file's identities, the bootstrap admin among
//! them, always win on the node that has them; see [`crate::access::auth::Table::build`]).

use fencelock_core::policy::{Credential, PolicyChange, Quota, Rule};
use fencelock_core::{Command, EngineError};
use serde::{Deserialize, Serialize};

use crate::access::auth::{Auth, AuthFile, Who};

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

/// The command to propose: `change`, checked, from `who`'s caller.
pub(crate) fn command(auth: &Auth, who: &Who, change: PolicyChange) -> Result<Command, PolicyError> {
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

pub(crate) fn invalid(e: EngineError) -> PolicyError {
    match e {
        EngineError::InvalidPolicy(why) => PolicyError::Invalid(why),
        other => PolicyError::Invalid(other.to_string()),
    }
}

/// On the leader, before a change a follower handed over is proposed: only
/// a policy change by an `admin` caller is taken (the follower authenticated
/// the caller; the peer service has checked that the sender is a member),
/// and only if the caller is an admin here too: a follower that has not
/// applied an identity's removal yet cannot make changes for it.
pub fn admit_handed_over(auth: &Auth, cmd: &Command) -> Result<(), PolicyError> {
    match cmd {
        Command::As { caller, cmd: inner } if caller.admin && matches!(**inner, Command::Policy(_)) => {
            if !auth.is_admin_named(&caller.name) {
                return Err(PolicyError::Invalid(format!("{:?} is not an admin identity of the leader", caller.name)));
            }
            Ok(())
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
