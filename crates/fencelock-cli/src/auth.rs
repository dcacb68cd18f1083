//! `fencelock auth`: who may do what, in two places.
//! - The auth file a node reads with `--auth-file` (`add-token --file`,
//!   `check --file`; the format is in `fencelock_server::auth`): it defines
//!   the bootstrap admin, and a running node re-reads it when it changes.
//! - The group's policy, replicated like the locks (`add-token`, `add-cert`,
//!   `role`, `remove`, `remove-role`, `list` against `--admin`, as an admin
//!   identity): the same on every node, in force as soon as it is
//!   acknowledged (see `fencelock_server::policy`).

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use fencelock_core::policy::{Credential, IdentityDef, PolicyChange, Quota, Rule, Verb};
use fencelock_server::policy::{Changed, View};

use crate::{exit, http};

#[derive(Args, Debug)]
pub struct AuthArgs {
    #[command(subcommand)]
    cmd: AuthCmd,
}

#[derive(Subcommand, Debug)]
enum AuthCmd {
    /// Make a bearer token for an identity and print it, once: only its hash
    /// is stored. Adds it to the group (--admin), or with --file to an auth file.
    AddToken(AddTokenArgs),
    /// Let a client certificate's common name be an identity of the group.
    AddCert(AddCertArgs),
    /// Define or replace a role of the group: rules PREFIX=VERB[,VERB…].
    Role(RoleArgs),
    /// Remove an identity from the group (its token or certificate stops working).
    Remove(NameArgs),
    /// Remove a role from the group (refused while an identity has it).
    RemoveRole(NameArgs),
    /// List the roles and identities the group's node knows (file and group).
    List(ListArgs),
    /// Check an auth file and list its identities.
    Check(CheckArgs),
}

/// Where the group is, and how to reach it as an admin.
#[derive(Args, Debug)]
struct GroupArgs {
    /// HTTP admin address of a member; several, comma-separated, are tried in
    /// order until one answers (a follower hands changes to the leader).
    #[arg(long, env = "FENCELOCK_ADMIN", default_value = "127.0.0.1:7071", value_delimiter = ',')]
    admin: Vec<SocketAddr>,
    #[command(flatten)]
    tls: http::AdminTlsArgs,
}

/// An identity's own limits (0 = none); without any, the node's defaults apply.
#[derive(Args, Debug)]
struct LimitArgs {
    /// Most live leases.
    #[arg(long)]
    max_leases: Option<u64>,
    /// Most held locks.
    #[arg(long)]
    max_locks: Option<u64>,
    /// Most queued acquires.
    #[arg(long)]
    max_waits: Option<u64>,
    /// Most requests per second.
    #[arg(long)]
    max_rps: Option<u64>,
}

impl LimitArgs {
    fn quota(&self) -> Option<Quota> {
        let all = [self.max_leases, self.max_locks, self.max_waits, self.max_rps];
        all.iter().any(Option::is_some).then(|| Quota {
            leases: self.max_leases.unwrap_or(0),
            locks: self.max_locks.unwrap_or(0),
            waits: self.max_waits.unwrap_or(0),
            rps: self.max_rps.unwrap_or(0),
        })
    }
}

#[derive(Args, Debug)]
struct AddTokenArgs {
    /// The identity's name (visible ASCII, no spaces): shown as the holder of
    /// its locks. Adding a token to an existing group identity replaces it.
    name: String,
    /// A role for the identity (repeat for several): `admin` (built in), or
    /// one defined in the same place (the file's [roles.NAME], or `auth role`).
    #[arg(long = "role", required = true)]
    roles: Vec<String>,
    /// Add it to this auth file (created if missing) instead of the group.
    #[arg(long, env = "FENCELOCK_AUTH_FILE")]
    file: Option<PathBuf>,
    #[command(flatten)]
    limits: LimitArgs,
    #[command(flatten)]
    group: GroupArgs,
}

#[derive(Args, Debug)]
struct AddCertArgs {
    /// The certificate subject's common name.
    cn: String,
    /// The identity's name (defaults to the CN; visible ASCII, no spaces).
    #[arg(long)]
    name: Option<String>,
    /// A role for the identity (repeat for several).
    #[arg(long = "role", required = true)]
    roles: Vec<String>,
    #[command(flatten)]
    limits: LimitArgs,
    #[command(flatten)]
    group: GroupArgs,
}

#[derive(Args, Debug)]
struct RoleArgs {
    /// The role's name.
    name: String,
    /// A rule, PREFIX=VERB[,VERB…] (repeat for several): the verbs acquire,
    /// check, read, admin on every lock whose name starts with PREFIX
    /// (`=read` is every lock; admin needs the empty prefix).
    #[arg(long = "rule", required = true, value_parser = parse_rule)]
    rules: Vec<Rule>,
    #[command(flatten)]
    group: GroupArgs,
}

#[derive(Args, Debug)]
struct NameArgs {
    name: String,
    #[command(flatten)]
    group: GroupArgs,
}

#[derive(Args, Debug)]
struct ListArgs {
    /// Print the JSON the node answers instead of a table.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    group: GroupArgs,
}

#[derive(Args, Debug)]
struct CheckArgs {
    /// The auth file.
    #[arg(long, env = "FENCELOCK_AUTH_FILE")]
    file: PathBuf,
}

pub async fn auth(a: AuthArgs) -> anyhow::Result<std::process::ExitCode> {
    match a.cmd {
        AuthCmd::AddToken(a) => match a.file.clone() {
            Some(file) => add_token_to_file(a, &file),
            None => add_token(a).await,
        },
        AuthCmd::AddCert(a) => {
            let identity = IdentityDef {
                credential: Credential::Cert { cn: a.cn.clone() },
                roles: a.roles,
                limits: a.limits.quota(),
            };
            let name = a.name.unwrap_or(a.cn);
            change(&a.group, PolicyChange::PutIdentity { name, identity }).await
        }
        AuthCmd::Role(a) => change(&a.group, PolicyChange::PutRole { name: a.name, rules: a.rules }).await,
        AuthCmd::Remove(a) => change(&a.group, PolicyChange::DeleteIdentity { name: a.name }).await,
        AuthCmd::RemoveRole(a) => change(&a.group, PolicyChange::DeleteRole { name: a.name }).await,
        AuthCmd::List(a) => list(a).await,
        AuthCmd::Check(a) => check(a),
    }
}

/// `PREFIX=VERB[,VERB…]`.
fn parse_rule(s: &str) -> Result<Rule, String> {
    let (prefix, verbs) = s.rsplit_once('=').ok_or_else(|| format!("{s:?} is not PREFIX=VERB[,VERB…]"))?;
    let verbs = verbs.split(',').map(str::parse::<Verb>).collect::<Result<Vec<_>, _>>()?;
    Ok(Rule { prefix: prefix.to_string(), verbs })
}

/// Sends `change` to the group; says what happened.
async fn send(group: &GroupArgs, change: &PolicyChange) -> anyhow::Result<Changed> {
    let body = serde_json::to_vec(change)?;
    let text = http::call_admin(&group.admin, &group.tls, "POST", "/v1/auth", &body).await?;
    serde_json::from_str(&text).with_context(|| format!("unexpected answer: {text}"))
}

async fn change(group: &GroupArgs, change: PolicyChange) -> anyhow::Result<std::process::ExitCode> {
    let done = send(group, &change).await?;
    let what = match &change {
        PolicyChange::PutRole { name, .. } => format!("role {name:?} defined"),
        PolicyChange::DeleteRole { name } => format!("role {name:?} removed"),
        PolicyChange::PutIdentity { name, .. } => format!("identity {name:?} defined"),
        PolicyChange::DeleteIdentity { name } => format!("identity {name:?} removed"),
    };
    let unchanged = if done.changed { "" } else { " (it already was: nothing changed)" };
    eprintln!("fencelock: {what}{unchanged}; the group's policy is at version {}", done.version);
    Ok(std::process::ExitCode::from(exit::OK))
}

/// A new token, added to the group: made here, so the secret never crosses
/// the network; the group stores its hash.
async fn add_token(a: AddTokenArgs) -> anyhow::Result<std::process::ExitCode> {
    let new = fencelock_server::auth::new_token().map_err(anyhow::Error::msg)?;
    let credential = Credential::Token { id: new.id.clone(), hash: new.hash.clone() };
    let identity = IdentityDef { credential, roles: a.roles.clone(), limits: a.limits.quota() };
    let done = send(&a.group, &PolicyChange::PutIdentity { name: a.name.clone(), identity }).await?;
    println!("{}", new.token);
    eprintln!(
        "fencelock: token for {:?} (roles {}) added to the group (policy version {}); it is shown only this once",
        a.name,
        a.roles.join(", "),
        done.version
    );
    Ok(std::process::ExitCode::from(exit::OK))
}

async fn list(a: ListArgs) -> anyhow::Result<std::process::ExitCode> {
    let text = http::call_admin(&a.group.admin, &a.group.tls, "GET", "/v1/auth", &[]).await?;
    if a.json {
        println!("{text}");
        return Ok(std::process::ExitCode::from(exit::OK));
    }
    let view: View = serde_json::from_str(&text).with_context(|| format!("unexpected answer: {text}"))?;
    print!("{}", render(&view));
    Ok(std::process::ExitCode::from(exit::OK))
}

/// The policy as two short tables.
fn render(v: &View) -> String {
    let mut out = format!("group policy version {}\n{:<20}{:<8}{}\n", v.version, "ROLE", "FROM", "RULES");
    for r in &v.roles {
        let rules: Vec<String> = r.rules.iter().map(Rule::to_string).collect();
        out.push_str(&format!("{:<20}{:<8}{}\n", r.name, r.source, rules.join("; ")));
    }
    out.push_str(&format!("{:<20}{:<8}{:<32}{}\n", "IDENTITY", "FROM", "CREDENTIAL", "ROLES"));
    for i in &v.identities {
        out.push_str(&format!("{:<20}{:<8}{:<32}{}\n", i.name, i.source, i.credential, i.roles.join(",")));
    }
    out
}

fn add_token_to_file(a: AddTokenArgs, file: &Path) -> anyhow::Result<std::process::ExitCode> {
    if a.limits.quota().is_some() {
        bail!("--max-* limits are for the group; in a file, write `limits = {{ leases = … }}` in the identity's entry");
    }
    let old = match std::fs::read_to_string(file) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e).with_context(|| format!("reading {}", file.display())),
    };
    let new = fencelock_server::auth::new_token().map_err(anyhow::Error::msg)?;
    let roles: Vec<String> = a.roles.iter().map(|r| toml_string(r)).collect();
    let entry = format!(
        "\n[[tokens]]\nname = {}\nid = \"{}\"\nhash = \"{}\"\nroles = [{}]\n",
        toml_string(&a.name),
        new.id,
        new.hash,
        roles.join(", ")
    );
    let text = format!("{old}{entry}");
    // The whole new file must load as a node would load it: an unknown role or
    // a name used twice is refused here, before anything is written.
    if let Err(why) = fencelock_server::auth::Table::parse(&text) {
        bail!("not added: {why}");
    }
    write_private(file, &text)?;
    println!("{}", new.token);
    eprintln!(
        "fencelock: token for {:?} (roles {}) added to {}; it is shown only this once",
        a.name,
        a.roles.join(", "),
        file.display()
    );
    Ok(std::process::ExitCode::from(exit::OK))
}

fn check(a: CheckArgs) -> anyhow::Result<std::process::ExitCode> {
    let text = std::fs::read_to_string(&a.file).with_context(|| format!("reading {}", a.file.display()))?;
    let table =
        fencelock_server::auth::Table::parse(&text).map_err(|why| anyhow::anyhow!("{}: {why}", a.file.display()))?;
    for (name, how) in table.identities() {
        println!("{name}\t{how}");
    }
    Ok(std::process::ExitCode::from(exit::OK))
}

/// A TOML basic string.
fn toml_string(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// Replaces `path` with `text` atomically (a temporary file renamed over it),
/// readable by its owner only: the file holds hashes, not tokens, but it
/// decides who may do what.
fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("auth"),
        std::process::id()
    ));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
    f.write_all(text.as_bytes()).and_then(|()| f.sync_all()).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("replacing {}", path.display()))?;
    Ok(())
}
