//! The policy in the replicated state (`Command::Policy`).
//!
//! INV-14: the policy changes only by a command from an `admin` caller; a
//! refused change changes nothing, and the policy is part of the state every
//! replica and snapshot holds.

use super::harness::*;
use super::*;
use crate::policy::{Credential, IdentityDef, Rule, Verb};

fn as_caller(name: &str, admin: bool, cmd: Command) -> Command {
    Command::As { caller: Caller { name: name.into(), admin }, cmd: Box::new(cmd) }
}

fn worker_role() -> Command {
    Command::Policy(PolicyChange::PutRole {
        name: "worker".into(),
        rules: vec![Rule { prefix: "jobs/".into(), verbs: vec![Verb::Acquire, Verb::Read] }],
    })
}

fn runner() -> Command {
    let hash = format!("sha256:{}:{}", "ab".repeat(16), "cd".repeat(32));
    let identity = IdentityDef {
        credential: Credential::Token { id: "0123abcd".into(), hash },
        roles: vec!["worker".into()],
        limits: None,
    };
    Command::Policy(PolicyChange::PutIdentity { name: "runner".into(), identity })
}

#[test]
fn inv14_only_an_admin_changes_the_policy() {
    let mut e = Engine::new();
    let before = e.clone();
    let o = batch(&mut e, 0, vec![worker_role(), as_caller("mallory", false, worker_role())]);
    assert_eq!(o.replies, vec![Reply::Rejected(EngineError::NotAdmin); 2]);
    assert_eq!(e, before, "refused changes change nothing");

    let o = batch(&mut e, 0, vec![as_caller("ops", true, worker_role()), as_caller("ops", true, runner())]);
    assert_eq!(
        o.replies,
        vec![Reply::PolicyChanged { version: 1, changed: true }, Reply::PolicyChanged { version: 2, changed: true }]
    );
    assert_eq!(e.policy().identities()["runner"].roles, vec!["worker".to_string()]);
    // A retry is answered again and changes nothing.
    let o = batch(&mut e, 0, vec![as_caller("ops", true, runner())]);
    assert_eq!(o.replies, vec![Reply::PolicyChanged { version: 2, changed: false }]);
}

#[test]
fn inv14_a_change_that_breaks_a_rule_is_rejected_and_leaves_no_trace() {
    let mut e = Engine::new();
    let o = batch(&mut e, 0, vec![as_caller("ops", true, runner())]);
    assert!(
        matches!(&o.replies[0], Reply::Rejected(EngineError::InvalidPolicy(w)) if w.contains("no role \"worker\"")),
        "{o:?}"
    );
    assert_eq!(e, Engine::new());
    assert!(Command::Policy(PolicyChange::DeleteRole { name: "admin".into() }).validate().is_err());
}

#[test]
fn inv14_the_policy_survives_a_snapshot_and_old_snapshots_have_none() {
    let mut e = Engine::new();
    batch(&mut e, 0, vec![as_caller("ops", true, worker_role()), as_caller("ops", true, runner())]);
    let back: Engine = serde_json::from_str(&serde_json::to_string(&e).unwrap()).unwrap();
    assert_eq!(back, e);
    assert_eq!(back.policy().version(), 2);
    let empty = serde_json::to_value(Engine::new()).unwrap();
    assert!(empty.get("policy").is_none(), "an empty policy is not written, so old readers see the same state");
}
