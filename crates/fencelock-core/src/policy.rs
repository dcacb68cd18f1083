//! Who may do what: roles (rules on lock-name prefixes) and the identities that
//! have them, as part of the replicated state.
//!
//! Where it sits: the engine keeps one [`Policy`] and changes it only through
//! [`crate::Command::Policy`], sent by an `admin` caller, so every node of a
//! group holds the same rules at the same point of the log (linearizable, like
//! a grant). The server reads it to authenticate requests, merged with the
//! node's own auth file (which defines the bootstrap admin), and checks each
//! request's verb before anything is proposed. The rules a role, an identity or
//! a change must meet live here, once: the auth file's parser applies the same
//! [`PolicyChange`]s to an empty policy.
//!
//! The policy never holds a secret: a token identity keeps the token's id and a
//! salted hash of it, made by whoever created the token.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::{EngineError, MAX_LOCK_NAME_BYTES};

/// Longest identity name, in bytes.
pub const MAX_CALLER_NAME: usize = 128;

/// The role every group has: every verb on every lock. It cannot be redefined
/// or deleted.
pub const ADMIN_ROLE: &str = "admin";
/// Most roles one policy holds.
pub const MAX_ROLES: usize = 1_000;
/// Most identities one policy holds.
pub const MAX_IDENTITIES: usize = 10_000;
/// Most rules in one role.
pub const MAX_RULES: usize = 64;
/// Most roles one identity has.
pub const MAX_ROLES_PER_IDENTITY: usize = 32;
/// Longest certificate common name, in bytes (X.520's upper bound).
pub const MAX_CN_BYTES: usize = 64;

/// What an identity may do, on a lock-name prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verb {
    /// Acquire, release, keep alive and revoke its own leases.
    Acquire,
    /// Check tokens (for resource servers).
    Check,
    /// Describe and list locks.
    Read,
    /// Membership, snapshots, the policy, revoking anyone's lease; prefix `""` only.
    Admin,
}

impl Verb {
    pub const ALL: [Verb; 4] = [Verb::Acquire, Verb::Check, Verb::Read, Verb::Admin];

    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Acquire => "acquire",
            Verb::Check => "check",
            Verb::Read => "read",
            Verb::Admin => "admin",
        }
    }
}

impl fmt::Display for Verb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Verb {
    type Err = String;
    fn from_str(s: &str) -> Result<Verb, String> {
        Verb::ALL
            .into_iter()
            .find(|v| v.as_str() == s)
            .ok_or_else(|| format!("unknown verb {s:?} (the verbs: acquire, check, read, admin)"))
    }
}

/// One rule: `verbs` on every lock whose name starts with `prefix`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    pub prefix: String,
    pub verbs: Vec<Verb>,
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verbs: Vec<&str> = self.verbs.iter().map(|v| v.as_str()).collect();
        write!(f, "{} on {:?}", verbs.join(","), self.prefix)
    }
}

/// What one identity may have at once; 0 means no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Quota {
    /// Live leases.
    #[serde(default)]
    pub leases: u64,
    /// Locks held.
    #[serde(default)]
    pub locks: u64,
    /// Acquires waiting in queues.
    #[serde(default)]
    pub waits: u64,
    /// Requests per second (any request: a keep-alive counts too).
    #[serde(default)]
    pub rps: u64,
}

impl Default for Quota {
    /// What a node gives an identity that has no values of its own, unless its
    /// operator says otherwise.
    fn default() -> Self {
        Quota { leases: 10_000, locks: 10_000, waits: 10_000, rps: 0 }
    }
}

/// How an identity proves who it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Credential {
    /// A bearer token `flt_<id>_<secret>`: its id (8 hex digits) and
    /// `sha256:<salt, 32 hex>:<digest of salt and secret, 64 hex>`.
    Token { id: String, hash: String },
    /// A client certificate, verified by the TLS handshake, by its subject's
    /// common name.
    Cert { cn: String },
}

/// One identity: its credential, its roles and its own limits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdentityDef {
    pub credential: Credential,
    pub roles: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<Quota>,
}

/// A change of the policy, the payload of [`crate::Command::Policy`]. Every
/// change is idempotent (a put replaces, a delete of something absent changes
/// nothing), so a retried change needs no memory of the first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum PolicyChange {
    /// Define or replace role `name`.
    PutRole { name: String, rules: Vec<Rule> },
    /// Delete role `name`; refused while an identity has it.
    DeleteRole { name: String },
    /// Define or replace identity `name` (a replaced token stops working).
    PutIdentity { name: String, identity: IdentityDef },
    /// Delete identity `name`. Its leases stay its own until they end.
    DeleteIdentity { name: String },
}

/// Roles and identities. Every collection is ordered, so it serializes the
/// same on every replica.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policy {
    /// Bumped by every change that changed something.
    #[serde(default)]
    version: u64,
    /// Defined roles (the built-in [`ADMIN_ROLE`] is not stored).
    #[serde(default)]
    roles: BTreeMap<String, Vec<Rule>>,
    #[serde(default)]
    identities: BTreeMap<String, IdentityDef>,
}

impl Policy {
    /// Counts the changes applied; a reader can tell that it changed.
    pub fn version(&self) -> u64 {
        self.version
    }

    pub fn is_empty(&self) -> bool {
        self.roles.is_empty() && self.identities.is_empty()
    }

    pub fn roles(&self) -> &BTreeMap<String, Vec<Rule>> {
        &self.roles
    }

    pub fn identities(&self) -> &BTreeMap<String, IdentityDef> {
        &self.identities
    }

    /// The rules of role `name` (the built-in admin's too).
    pub fn role(&self, name: &str) -> Option<Vec<Rule>> {
        if name == ADMIN_ROLE {
            return Some(vec![Rule { prefix: String::new(), verbs: Verb::ALL.to_vec() }]);
        }
        self.roles.get(name).cloned()
    }

    /// Every rule identity `def` has, its roles' in order.
    pub fn rules_of(&self, def: &IdentityDef) -> Vec<Rule> {
        def.roles.iter().filter_map(|r| self.role(r)).flatten().collect()
    }

    /// Applies `change` after checking it against every rule (stateless ones
    /// first, see [`PolicyChange::validate`]); returns whether it changed
    /// anything. A refused change changes nothing.
    pub fn apply(&mut self, change: &PolicyChange) -> Result<bool, EngineError> {
        change.validate()?;
        let changed = match change {
            PolicyChange::PutRole { name, rules } => self.put_role(name, rules)?,
            PolicyChange::DeleteRole { name } => self.delete_role(name)?,
            PolicyChange::PutIdentity { name, identity } => self.put_identity(name, identity)?,
            PolicyChange::DeleteIdentity { name } => self.identities.remove(name).is_some(),
        };
        if changed {
            self.version = self.version.saturating_add(1);
        }
        Ok(changed)
    }

    fn put_role(&mut self, name: &str, rules: &[Rule]) -> Result<bool, EngineError> {
        if self.roles.get(name).is_some_and(|r| r == rules) {
            return Ok(false);
        }
        if !self.roles.contains_key(name) && self.roles.len() >= MAX_ROLES {
            return Err(invalid(format!("the policy already has {MAX_ROLES} roles, the most it may")));
        }
        self.roles.insert(name.to_string(), rules.to_vec());
        Ok(true)
    }

    fn delete_role(&mut self, name: &str) -> Result<bool, EngineError> {
        if let Some((who, _)) = self.identities.iter().find(|(_, d)| d.roles.iter().any(|r| r == name)) {
            return Err(invalid(format!("role {name:?} is in use (identity {who:?} has it)")));
        }
        Ok(self.roles.remove(name).is_some())
    }

    fn put_identity(&mut self, name: &str, def: &IdentityDef) -> Result<bool, EngineError> {
        if self.identities.get(name) == Some(def) {
            return Ok(false);
        }
        if let Some(r) = def.roles.iter().find(|r| self.role(r).is_none()) {
            return Err(invalid(format!("identity {name:?}: no role {r:?}")));
        }
        let clash = self
            .identities
            .iter()
            .find(|(other, d)| other.as_str() != name && same_credential(&d.credential, &def.credential));
        if let Some((other, _)) = clash {
            return Err(invalid(format!(
                "identity {name:?}: identity {other:?} already has this token id or certificate CN"
            )));
        }
        if !self.identities.contains_key(name) && self.identities.len() >= MAX_IDENTITIES {
            return Err(invalid(format!("the policy already has {MAX_IDENTITIES} identities, the most it may")));
        }
        self.identities.insert(name.to_string(), def.clone());
        Ok(true)
    }
}

/// Two credentials that would authenticate the same request.
fn same_credential(a: &Credential, b: &Credential) -> bool {
    match (a, b) {
        (Credential::Token { id: x, .. }, Credential::Token { id: y, .. }) => x == y,
        (Credential::Cert { cn: x }, Credential::Cert { cn: y }) => x == y,
        _ => false,
    }
}

fn invalid(why: String) -> EngineError {
    EngineError::InvalidPolicy(why)
}

impl PolicyChange {
    /// Checks every rule that does not depend on the policy: names, rules,
    /// credentials, sizes.
    pub fn validate(&self) -> Result<(), EngineError> {
        match self {
            PolicyChange::PutRole { name, rules } => {
                check_role_name(name)?;
                check_rules(name, rules)
            }
            PolicyChange::DeleteRole { name } => check_role_name(name),
            PolicyChange::PutIdentity { name, identity } => {
                check_identity_name(name)?;
                check_identity(name, identity)
            }
            PolicyChange::DeleteIdentity { name } => check_identity_name(name),
        }
    }
}

/// A name of an identity or a role: 1 to [`MAX_CALLER_NAME`] bytes of visible
/// ASCII.
fn check_name(what: &str, name: &str) -> Result<(), EngineError> {
    if name.is_empty() || name.len() > MAX_CALLER_NAME || !name.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(invalid(format!(
            "{what} {name:?}: a name is 1 to {MAX_CALLER_NAME} bytes of visible ASCII (no spaces)"
        )));
    }
    Ok(())
}

pub(crate) fn check_identity_name(name: &str) -> Result<(), EngineError> {
    check_name("identity", name)
}

fn check_role_name(name: &str) -> Result<(), EngineError> {
    check_name("role", name)?;
    if name == ADMIN_ROLE {
        return Err(invalid(format!("the role {ADMIN_ROLE:?} is built in and cannot be changed")));
    }
    Ok(())
}

fn check_rules(role: &str, rules: &[Rule]) -> Result<(), EngineError> {
    if rules.len() > MAX_RULES {
        return Err(invalid(format!("role {role:?}: {} rules, at most {MAX_RULES}", rules.len())));
    }
    for r in rules {
        if r.verbs.is_empty() {
            return Err(invalid(format!("role {role:?}: a rule on {:?} has no verbs", r.prefix)));
        }
        if r.prefix.len() > MAX_LOCK_NAME_BYTES {
            return Err(invalid(format!("role {role:?}: a prefix is at most {MAX_LOCK_NAME_BYTES} bytes")));
        }
        if r.verbs.contains(&Verb::Admin) && !r.prefix.is_empty() {
            return Err(invalid(format!(
                "role {role:?}: admin applies to the whole group, so its prefix must be \"\" (got {:?})",
                r.prefix
            )));
        }
    }
    Ok(())
}

fn check_identity(name: &str, def: &IdentityDef) -> Result<(), EngineError> {
    if def.roles.len() > MAX_ROLES_PER_IDENTITY {
        return Err(invalid(format!("identity {name:?}: {} roles, at most {MAX_ROLES_PER_IDENTITY}", def.roles.len())));
    }
    for r in &def.roles {
        check_name("role", r)?;
    }
    match &def.credential {
        Credential::Token { id, hash } => {
            if !is_token_id(id) {
                return Err(invalid(format!("identity {name:?}: token id {id:?} is not 8 hex digits")));
            }
            if parse_token_hash(hash).is_none() {
                return Err(invalid(format!("identity {name:?}: hash is not sha256:<32 hex>:<64 hex>")));
            }
        }
        Credential::Cert { cn } => {
            if cn.is_empty() || cn.len() > MAX_CN_BYTES || cn.chars().any(char::is_control) {
                return Err(invalid(format!(
                    "identity {name:?}: a certificate CN is 1 to {MAX_CN_BYTES} bytes without control characters"
                )));
            }
        }
    }
    Ok(())
}

/// A token id: 8 hex digits.
pub fn is_token_id(id: &str) -> bool {
    id.len() == 8 && id.bytes().all(|b| b.is_ascii_hexdigit())
}

/// `sha256:<salt>:<digest>` as (salt, 16 bytes; digest, 32 bytes).
pub fn parse_token_hash(h: &str) -> Option<(Vec<u8>, Vec<u8>)> {
    let mut parts = h.split(':');
    let (algo, salt, digest) = (parts.next()?, parts.next()?, parts.next()?);
    if algo != "sha256" || parts.next().is_some() {
        return None;
    }
    let (salt, digest) = (from_hex(salt)?, from_hex(digest)?);
    (salt.len() == 16 && digest.len() == 32).then_some((salt, digest))
}

fn from_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || !s.is_ascii() {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const HASH: &str =
        "sha256:00112233445566778899aabbccddeeff:0011223344556677889900112233445566778899001122334455667788990011";

    fn token(id: &str, roles: &[&str]) -> IdentityDef {
        IdentityDef {
            credential: Credential::Token { id: id.into(), hash: HASH.into() },
            roles: roles.iter().map(|r| r.to_string()).collect(),
            limits: None,
        }
    }

    fn role(name: &str, prefix: &str, verbs: &[Verb]) -> PolicyChange {
        PolicyChange::PutRole { name: name.into(), rules: vec![Rule { prefix: prefix.into(), verbs: verbs.to_vec() }] }
    }

    fn put(name: &str, identity: IdentityDef) -> PolicyChange {
        PolicyChange::PutIdentity { name: name.into(), identity }
    }

    fn why(r: Result<bool, EngineError>) -> String {
        match r {
            Err(EngineError::InvalidPolicy(w)) => w,
            other => panic!("expected InvalidPolicy, got {other:?}"),
        }
    }

    #[test]
    fn changes_apply_once_and_count_in_the_version() {
        let mut p = Policy::default();
        assert_eq!(p.apply(&role("worker", "jobs/", &[Verb::Acquire])), Ok(true));
        assert_eq!(p.apply(&put("runner", token("0000000a", &["worker"]))), Ok(true));
        assert_eq!(p.version(), 2);
        // The same change again (a retry) changes nothing.
        assert_eq!(p.apply(&role("worker", "jobs/", &[Verb::Acquire])), Ok(false));
        assert_eq!(p.apply(&put("runner", token("0000000a", &["worker"]))), Ok(false));
        assert_eq!(p.apply(&PolicyChange::DeleteIdentity { name: "nobody".into() }), Ok(false));
        assert_eq!(p.version(), 2);
        let rules = p.rules_of(&p.identities()["runner"]);
        assert_eq!(rules, vec![Rule { prefix: "jobs/".into(), verbs: vec![Verb::Acquire] }]);
    }

    #[test]
    fn a_refused_change_changes_nothing() {
        let mut p = Policy::default();
        p.apply(&role("worker", "jobs/", &[Verb::Acquire])).unwrap();
        p.apply(&put("runner", token("0000000a", &["worker"]))).unwrap();
        let before = p.clone();
        let cases = [
            (put("x", token("0000000b", &["nope"])), "no role \"nope\""),
            (put("other", token("0000000a", &[])), "already has this token id"),
            (PolicyChange::DeleteRole { name: "worker".into() }, "in use"),
            (role("admin", "", &[Verb::Read]), "built in"),
            (role("r", "a/", &[Verb::Admin]), "whole group"),
            (role("r", "a/", &[]), "no verbs"),
            (put("has space", token("0000000b", &[])), "visible ASCII"),
            (put("y", token("0000000g", &[])), "8 hex digits"),
            (
                put(
                    "y",
                    IdentityDef {
                        credential: Credential::Token { id: "0000000b".into(), hash: "sha256:00:00".into() },
                        roles: vec![],
                        limits: None,
                    },
                ),
                "hash",
            ),
            (
                put(
                    "y",
                    IdentityDef { credential: Credential::Cert { cn: "a\nb".into() }, roles: vec![], limits: None },
                ),
                "control",
            ),
        ];
        for (change, expected) in cases {
            let w = why(p.apply(&change));
            assert!(w.contains(expected), "{change:?}: {w}");
            assert_eq!(p, before, "{change:?} changed the policy");
        }
    }

    #[test]
    fn the_built_in_admin_role_has_every_verb_on_every_lock() {
        let mut p = Policy::default();
        p.apply(&put(
            "ops",
            IdentityDef {
                credential: Credential::Cert { cn: "ops".into() },
                roles: vec![ADMIN_ROLE.into()],
                limits: None,
            },
        ))
        .unwrap();
        let rules = p.rules_of(&p.identities()["ops"]);
        assert_eq!(rules, vec![Rule { prefix: String::new(), verbs: Verb::ALL.to_vec() }]);
    }

    #[test]
    fn sizes_are_bounded() {
        let mut p = Policy::default();
        for i in 0..MAX_ROLES {
            p.apply(&role(&format!("r{i}"), "", &[Verb::Read])).unwrap();
        }
        assert!(why(p.apply(&role("one-more", "", &[Verb::Read]))).contains("1000 roles"));
        let rules = vec![Rule { prefix: String::new(), verbs: vec![Verb::Read] }; MAX_RULES + 1];
        assert!(why(p.apply(&PolicyChange::PutRole { name: "big".into(), rules })).contains("at most 64"));
    }

    #[test]
    fn verbs_parse_from_their_names() {
        for v in Verb::ALL {
            assert_eq!(v.as_str().parse::<Verb>(), Ok(v));
        }
        assert!("write".parse::<Verb>().unwrap_err().contains("unknown verb"));
    }
}
