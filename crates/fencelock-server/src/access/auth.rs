//! Who is calling and what they may do: the auth file (`--auth-file`), bearer
//! tokens, client-certificate identities and rules on lock-name prefixes.
//!
//! Where it sits: between the connection (its verified client certificate, see
//! [`crate::access::conn_limits::ConnInfo`]) and the API (`api::Ops`). The gRPC
//! service and the admin router call [`Auth::authenticate`] for every request and
//! hand the resulting [`Who`] to the operation, which asks it for the verb it
//! needs ([`Who::require`]) before anything is proposed (a refused call costs no
//! disk) and wraps its commands in the caller ([`Who::wrap`]), so the engine
//! records who owns each lease (INV-13).
//!
//! # The auth file
//! ```toml
//! # Roles: sets of rules on lock-name prefixes ("" is every lock). The verbs:
//! # acquire (acquire, release, keep alive and revoke its own leases), check
//! # (check tokens, for resource servers), read (describe and list locks),
//! # admin (membership, snapshots, revoke anyone's lease; prefix "" only).
//! # The role "admin" is built in: every verb on every lock.
//! [roles.worker]
//! rules = [{ prefix = "jobs/", verbs = ["acquire", "read"] }]
//!
//! [roles.verifier]
//! rules = [{ prefix = "", verbs = ["check"] }]
//!
//! # Bearer tokens, as `fencelock auth add-token` writes them: the token itself
//! # is shown once and stored only as a salted SHA-256 hash.
//! [[tokens]]
//! name = "report-runner"
//! id = "3f9a1c02"
//! hash = "sha256:<salt, 32 hex>:<digest, 64 hex>"
//! roles = ["worker"]
//!
//! # Client certificates (verified by --client-ca or the cluster CA) by their
//! # subject's common name; `name` defaults to the CN.
//! [[certs]]
//! cn = "fencelock client"
//! name = "ops"
//! roles = ["admin"]
//!
//! # An identity may have its own limits (see crate::access::quota; 0 = none):
//! # limits = { leases = 100, locks = 100, waits = 1000, rps = 50 }
//!
//! # /metrics and /healthz answer without credentials unless this is true.
//! protect_metrics = false
//! ```
//!
//! Tokens are 256 random bits, so a fast salted hash is enough: a slow
//! password hash (argon2) defends guessable secrets, and would only give a
//! flood of wrong tokens a way to burn the server's CPU.

use std::{
    collections::{BTreeMap, HashMap},
    fmt,
    path::{Path, PathBuf},
    sync::{Arc, RwLock},
    time::{Duration, SystemTime},
};

use fencelock_core::policy::{parse_token_hash, Credential, IdentityDef, Policy, PolicyChange};
use fencelock_core::{Caller, Command, Engine};

use crate::access::quota::Quota;
use serde::Deserialize;

/// Why the auth file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum AuthFileError {
    #[error("cannot read the auth file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("the auth file {path} is not valid: {why}")]
    Invalid { path: PathBuf, why: String },
}

pub use fencelock_core::policy::{Rule, Verb};

/// A call refused before it did anything.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// No credentials, or credentials that name nobody.
    #[error("not authenticated: {0}")]
    Unauthenticated(String),
    /// The identity has no rule for this verb on this object.
    #[error("permission denied: {identity} may not {verb} {object}")]
    Denied { identity: String, verb: Verb, object: String },
}

/// The gRPC status of a refused call: UNAUTHENTICATED or PERMISSION_DENIED,
/// saying why.
impl From<Refusal> for tonic::Status {
    fn from(r: Refusal) -> tonic::Status {
        match r {
            Refusal::Unauthenticated(_) => tonic::Status::unauthenticated(r.to_string()),
            Refusal::Denied { .. } => tonic::Status::permission_denied(r.to_string()),
        }
    }
}

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub name: String,
    pub rules: Vec<Rule>,
    /// Its own limits (`limits = { leases = 100 }` in the file), else the node's.
    pub quota: Option<Quota>,
    pub source: Source,
}

impl Identity {
    fn may(&self, verb: Verb, name: &str) -> bool {
        self.rules.iter().any(|r| r.verbs.contains(&verb) && name.starts_with(&r.prefix))
    }

    fn may_somewhere(&self, verb: Verb) -> bool {
        self.rules.iter().any(|r| r.verbs.contains(&verb))
    }
}

/// Who sent a request: anyone (authentication is off) or an identity, and
/// from where (for the audit log).
#[derive(Debug, Clone, Default)]
pub struct Who {
    id: Option<Arc<Identity>>,
    remote: Option<std::net::SocketAddr>,
}

impl Who {
    /// Anyone: authentication is off.
    pub fn anyone() -> Who {
        Who::default()
    }

    fn identity(id: Arc<Identity>) -> Who {
        Who { id: Some(id), remote: None }
    }

    /// The same caller, whose connection comes from `remote`.
    pub fn at(self, remote: Option<std::net::SocketAddr>) -> Who {
        Who { remote, ..self }
    }

    /// Where the request came from, if known.
    pub fn remote(&self) -> Option<std::net::SocketAddr> {
        self.remote
    }

    /// `verb` on the lock `name`.
    pub fn require(&self, verb: Verb, name: &str) -> Result<(), Refusal> {
        self.check(verb, |id| id.may(verb, name), || format!("lock {name:?}"))
    }

    /// `verb` on every lock whose name starts with `prefix` (a listing).
    pub fn require_prefix(&self, verb: Verb, prefix: &str) -> Result<(), Refusal> {
        let covered = |id: &Identity| id.may(verb, prefix);
        self.check(verb, covered, || format!("locks under {prefix:?}"))
    }

    /// `verb` on some lock (taking a lease needs `acquire` somewhere).
    pub fn require_somewhere(&self, verb: Verb) -> Result<(), Refusal> {
        self.check(verb, |id| id.may_somewhere(verb), || "any lock".into())
    }

    /// `admin` (on the whole group).
    pub fn require_admin(&self) -> Result<(), Refusal> {
        self.check(Verb::Admin, |id| id.may(Verb::Admin, ""), || "the cluster".into())
    }

    fn check(&self, verb: Verb, ok: impl Fn(&Identity) -> bool, object: impl Fn() -> String) -> Result<(), Refusal> {
        match &self.id {
            None => Ok(()),
            Some(id) if ok(id) => Ok(()),
            Some(id) => Err(Refusal::Denied { identity: id.name.clone(), verb, object: object() }),
        }
    }

    /// `cmd` as the engine gets it: with the caller when there is one.
    pub fn wrap(&self, cmd: Command) -> Command {
        match self.caller() {
            Some(caller) => Command::As { caller, cmd: Box::new(cmd) },
            None => cmd,
        }
    }

    /// The caller the engine records (`None` when authentication is off).
    pub fn caller(&self) -> Option<Caller> {
        self.id.as_ref().map(|id| Caller { name: id.name.clone(), admin: id.may(Verb::Admin, "") })
    }

    /// The identity's name and own quota, for [`crate::access::quota`] (`None` when
    /// authentication is off).
    pub fn for_quota(&self) -> Option<(&str, Option<&Quota>)> {
        self.id.as_ref().map(|id| (id.name.as_str(), id.quota.as_ref()))
    }

    /// The identity's name, for logs (`-` when authentication is off).
    pub fn name(&self) -> &str {
        self.id.as_ref().map_or("-", |id| &id.name)
    }
}

/// The prefix of every token `fencelock auth add-token` makes.
pub const TOKEN_PREFIX: &str = "flt_";

/// The identities a node knows, ready to answer requests: its auth file's
/// and the group's policy's, merged (see [`Table::build`]).
#[derive(Debug, Default)]
pub struct Table {
    /// By token id.
    tokens: HashMap<String, TokenEntry>,
    /// By certificate common name.
    certs: HashMap<String, Arc<Identity>>,
    pub protect_metrics: bool,
}

/// A token the table knows: (salt, digest of salt and secret, identity).
type TokenEntry = (Vec<u8>, Vec<u8>, Arc<Identity>);

/// An auth file, parsed and checked: its roles and identities as a
/// [`Policy`] (checked by the same rules as the group's), and its switches.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct AuthFile {
    pub policy: Policy,
    pub protect_metrics: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    roles: BTreeMap<String, RoleDef>,
    #[serde(default)]
    tokens: Vec<TokenDef>,
    #[serde(default)]
    certs: Vec<CertDef>,
    #[serde(default)]
    protect_metrics: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RoleDef {
    rules: Vec<Rule>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenDef {
    name: String,
    id: String,
    hash: String,
    roles: Vec<String>,
    limits: Option<Quota>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CertDef {
    cn: String,
    name: Option<String>,
    roles: Vec<String>,
    limits: Option<Quota>,
}

impl AuthFile {
    /// Parses and checks an auth file's text: every role a token or
    /// certificate names exists, names and ids are unique and valid, `admin`
    /// rules cover the whole group ([`fencelock_core::policy`]'s rules).
    pub fn parse(text: &str) -> Result<AuthFile, String> {
        let file: File = toml::from_str(text).map_err(|e| e.to_string())?;
        let mut policy = Policy::default();
        let apply = |policy: &mut Policy, change: PolicyChange| match policy.apply(&change) {
            Ok(_) => Ok(()),
            Err(fencelock_core::EngineError::InvalidPolicy(why)) => Err(why),
            Err(e) => Err(e.to_string()),
        };
        for (name, def) in file.roles {
            apply(&mut policy, PolicyChange::PutRole { name, rules: def.rules })?;
        }
        let tokens =
            file.tokens.into_iter().map(|t| (t.name, Credential::Token { id: t.id, hash: t.hash }, t.roles, t.limits));
        let certs = file
            .certs
            .into_iter()
            .map(|c| (c.name.unwrap_or_else(|| c.cn.clone()), Credential::Cert { cn: c.cn }, c.roles, c.limits));
        for (name, credential, roles, limits) in tokens.chain(certs) {
            if policy.identities().contains_key(&name) {
                return Err(format!("identity {name:?} is defined twice"));
            }
            apply(
                &mut policy,
                PolicyChange::PutIdentity { name, identity: IdentityDef { credential, roles, limits } },
            )?;
        }
        Ok(AuthFile { policy, protect_metrics: file.protect_metrics })
    }

    /// Whether the file defines identity `name`.
    pub fn defines(&self, name: &str) -> bool {
        self.policy.identities().contains_key(name)
    }
}

/// Where an identity is defined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The node's auth file.
    File,
    /// The group's policy, changed with `fencelock auth` against the group.
    Group,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Source::File => "file",
            Source::Group => "group",
        })
    }
}

impl Table {
    /// Parses an auth file alone (see [`AuthFile::parse`]).
    pub fn parse(text: &str) -> Result<Table, String> {
        Ok(Table::build(&AuthFile::parse(text)?, &Policy::default()))
    }

    /// The identities of `file` and of the group's `policy`. The file's win: a
    /// group identity whose name, token id or certificate CN the file already
    /// uses is left out on this node (the admin endpoint refuses to create
    /// one whose name a node's file has), so a group change can never take
    /// the bootstrap admin away.
    pub fn build(file: &AuthFile, policy: &Policy) -> Table {
        let mut table = Table { protect_metrics: file.protect_metrics, ..Table::default() };
        table.add(&file.policy, Source::File, |_| false);
        table.add(policy, Source::Group, |name| file.defines(name));
        table
    }

    fn add(&mut self, policy: &Policy, source: Source, skip: impl Fn(&str) -> bool) {
        for (name, def) in policy.identities() {
            if skip(name) {
                continue;
            }
            let identity =
                Arc::new(Identity { name: name.clone(), rules: policy.rules_of(def), quota: def.limits, source });
            match &def.credential {
                Credential::Token { id, hash } => {
                    let Some((salt, digest)) = parse_token_hash(hash) else { continue };
                    self.tokens.entry(id.clone()).or_insert((salt, digest, identity));
                }
                Credential::Cert { cn } => {
                    self.certs.entry(cn.clone()).or_insert(identity);
                }
            }
        }
    }

    /// Every identity, sorted by name, with how it authenticates and its rules
    /// (for `fencelock auth check` and `auth list`).
    pub fn identities(&self) -> Vec<(String, String)> {
        let rules = |id: &Identity| {
            let r: Vec<String> = id.rules.iter().map(Rule::to_string).collect();
            if r.is_empty() {
                "no permissions".to_string()
            } else {
                r.join("; ")
            }
        };
        let tokens = self
            .tokens
            .iter()
            .map(|(tid, (_, _, id))| (id.name.clone(), format!("token {tid} ({}): {}", id.source, rules(id))));
        let certs = self
            .certs
            .iter()
            .map(|(cn, id)| (id.name.clone(), format!("certificate CN {cn:?} ({}): {}", id.source, rules(id))));
        let mut all: Vec<_> = tokens.chain(certs).collect();
        all.sort();
        all
    }

    /// The identity of a bearer token, if the table knows it.
    fn by_token(&self, token: &str) -> Option<Arc<Identity>> {
        let rest = token.strip_prefix(TOKEN_PREFIX)?;
        let (id, secret) = rest.split_once('_')?;
        let (salt, digest, identity) = self.tokens.get(id)?;
        same(&salted_digest(salt, secret.as_bytes()), digest).then(|| identity.clone())
    }
}

fn salted_digest(salt: &[u8], secret: &[u8]) -> Vec<u8> {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    ctx.update(salt);
    ctx.update(secret);
    ctx.finish().as_ref().to_vec()
}

/// Equal, in time that does not depend on where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A new token: what the user is shown once, and the file entry's id and hash.
pub struct NewToken {
    pub token: String,
    pub id: String,
    pub hash: String,
}

/// Makes a new random token (256 bits from the OS's generator).
pub fn new_token() -> Result<NewToken, String> {
    use ring::rand::SecureRandom;
    let rng = ring::rand::SystemRandom::new();
    let (mut id, mut salt, mut secret) = ([0u8; 4], [0u8; 16], [0u8; 32]);
    for buf in [&mut id[..], &mut salt[..], &mut secret[..]] {
        rng.fill(buf).map_err(|_| "the operating system's random source failed".to_string())?;
    }
    let (id, secret) = (hex(&id), hex(&secret));
    let hash = format!("sha256:{}:{}", hex(&salt), hex(&salted_digest(&salt, secret.as_bytes())));
    Ok(NewToken { token: format!("{TOKEN_PREFIX}{id}_{secret}"), id, hash })
}

/// Lease ids drawn from the OS's generator at once: one `getrandom` call per
/// this many grants, not one per grant (2 % of the server's CPU while W3
/// created its leases, issue 38).
const LEASE_IDS_PER_DRAW: usize = 32;

thread_local! {
    /// Ids drawn and not handed out yet, by this runtime thread.
    static DRAWN_LEASE_IDS: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A random lease id in `1..2^63` (so it stays a positive `int64` for every
/// client), from the OS's generator (drawn 32 at a time);
/// `None` if that fails (the engine's counter then assigns one).
pub fn random_lease_id() -> Option<u64> {
    DRAWN_LEASE_IDS.with_borrow_mut(|drawn| {
        if drawn.is_empty() {
            *drawn = draw_lease_ids()?;
        }
        drawn.pop()
    })
}

/// [`LEASE_IDS_PER_DRAW`] ids from one fill of the OS's generator, without
/// the zeros (one in 2^63); `None` if the generator fails.
fn draw_lease_ids() -> Option<Vec<u64>> {
    use ring::rand::SecureRandom;
    let mut b = [0u8; 8 * LEASE_IDS_PER_DRAW];
    ring::rand::SystemRandom::new().fill(&mut b).ok()?;
    let ids = b.chunks_exact(8).filter_map(|c| c.try_into().ok()).map(|c| u64::from_le_bytes(c) >> 1);
    Some(ids.filter(|&id| id != 0).collect())
}

/// Where an [`Auth`] reads the group's policy. The node passes its state
/// machine's engine, so a change is in force on a node as soon as it applied
/// it; a check of an auth file alone passes an empty [`Policy`].
pub trait GroupPolicy: Send + Sync {
    /// The policy's version; read for every authentication, so it must be cheap.
    fn version(&self) -> u64;
    /// The policy (empty if it cannot be read).
    fn policy(&self) -> Policy;
}

/// The engine's policy, as this node applied it (empty if the engine failed).
impl GroupPolicy for RwLock<Engine> {
    fn version(&self) -> u64 {
        self.read().map(|e| e.policy().version()).unwrap_or(0)
    }

    fn policy(&self) -> Policy {
        self.read().map(|e| e.policy().clone()).unwrap_or_default()
    }
}

/// A fixed policy.
impl GroupPolicy for Policy {
    fn version(&self) -> u64 {
        Policy::version(self)
    }

    fn policy(&self) -> Policy {
        self.clone()
    }
}

/// An auth file as read from disk, not yet merged with a group's policy (see
/// [`Auth::new`]). A node reads it before it opens its storage, so that a bad
/// file stops the node before anything in its data dir changed.
pub struct Loaded {
    path: PathBuf,
    file: AuthFile,
    stamp: Option<SystemTime>,
}

impl Loaded {
    /// Reads `path`; an error names the file and what is wrong.
    pub fn read(path: &Path) -> Result<Loaded, AuthFileError> {
        let (file, stamp) = read_file(path)?;
        Ok(Loaded { path: path.to_path_buf(), file, stamp })
    }
}

/// Authentication of a node: off (everyone is [`Who::anyone`]), or its auth
/// file (re-read when it changes) merged with the group's policy (see
/// [`GroupPolicy`]).
pub struct Auth {
    path: Option<PathBuf>,
    file: RwLock<(Arc<AuthFile>, Option<SystemTime>)>,
    /// Bumped whenever the file is re-read.
    file_gen: std::sync::atomic::AtomicU64,
    /// Where the group's policy is read.
    group: Arc<dyn GroupPolicy>,
    /// The merged table, with the file generation and policy version it is of.
    merged: RwLock<(u64, u64, Arc<Table>)>,
}

impl Auth {
    /// Authentication by `file` (`None`: off) merged with `group`'s policy.
    pub fn new(file: Option<Loaded>, group: Arc<dyn GroupPolicy>) -> Arc<Auth> {
        let (path, file, stamp) = match file {
            Some(l) => (Some(l.path), l.file, l.stamp),
            None => (None, AuthFile::default(), None),
        };
        let table = Arc::new(Table::build(&file, &Policy::default()));
        Arc::new(Auth {
            path,
            file: RwLock::new((Arc::new(file), stamp)),
            file_gen: Default::default(),
            group,
            merged: RwLock::new((0, 0, table)),
        })
    }

    /// Authentication off.
    pub fn off() -> Arc<Auth> {
        Auth::new(None, Arc::new(Policy::default()))
    }

    /// The auth file at `path` alone, with no group policy (what a file lets
    /// its identities do); an error names the file and what is wrong.
    pub fn load(path: &Path) -> Result<Arc<Auth>, AuthFileError> {
        Ok(Auth::new(Some(Loaded::read(path)?), Arc::new(Policy::default())))
    }

    pub fn is_on(&self) -> bool {
        self.path.is_some()
    }

    /// The node's auth file, as last loaded.
    pub fn file(&self) -> Arc<AuthFile> {
        self.file.read().map(|f| f.0.clone()).unwrap_or_default()
    }

    /// The group's policy (see [`GroupPolicy`]).
    pub fn group_policy(&self) -> Policy {
        self.group.policy()
    }

    /// The merged table, rebuilt when the file or the group's policy changed.
    fn table(&self) -> Arc<Table> {
        let gen = self.file_gen.load(std::sync::atomic::Ordering::Acquire);
        let version = self.group.version();
        if let Ok(m) = self.merged.read() {
            if (m.0, m.1) == (gen, version) {
                return m.2.clone();
            }
        }
        let policy = self.group_policy();
        let table = Arc::new(Table::build(&self.file(), &policy));
        if let Ok(mut m) = self.merged.write() {
            *m = (gen, policy.version(), table.clone());
        }
        table
    }

    /// Whether an identity called `name` is known here and may `admin`.
    pub fn is_admin_named(&self, name: &str) -> bool {
        let table = self.table();
        let mut all = table.tokens.values().map(|t| &t.2).chain(table.certs.values());
        all.any(|id| id.name == name && id.may(Verb::Admin, ""))
    }

    /// Every identity this node knows (see [`Table::identities`]).
    pub fn identities(&self) -> Vec<(String, String)> {
        self.table().identities()
    }

    /// Whether `/metrics` and `/healthz` need credentials.
    pub fn protect_metrics(&self) -> bool {
        self.file().protect_metrics
    }

    /// Who sent a request with this `authorization` value and this verified
    /// client certificate's common name. A token, when given, decides (a
    /// wrong token is refused even on a connection with a good certificate).
    pub fn authenticate(&self, authorization: Option<&str>, cert_cn: Option<&str>) -> Result<Who, Refusal> {
        if !self.is_on() {
            return Ok(Who::anyone());
        }
        let table = self.table();
        if let Some(value) = authorization {
            let token = value.strip_prefix("Bearer ").or_else(|| value.strip_prefix("bearer ")).unwrap_or(value).trim();
            return table
                .by_token(token)
                .map(Who::identity)
                .ok_or_else(|| Refusal::Unauthenticated("the token is not valid".into()));
        }
        if let Some(cn) = cert_cn {
            return table.certs.get(cn).cloned().map(Who::identity).ok_or_else(|| {
                Refusal::Unauthenticated(format!("the client certificate's CN {cn:?} names no identity of this group"))
            });
        }
        Err(Refusal::Unauthenticated(
            "this server requires credentials: a bearer token (--auth-token) or a client certificate".into(),
        ))
    }

    /// Reads the file again if it changed since it was last read; a file that
    /// does not load keeps the last good one (and says why).
    pub fn reload_if_changed(&self) -> Result<bool, AuthFileError> {
        let Some(path) = &self.path else { return Ok(false) };
        let stamp = modified(path);
        if self.file.read().map(|t| t.1 == stamp).unwrap_or(false) {
            return Ok(false);
        }
        let (file, stamp) = read_file(path).inspect_err(|_| {
            if let Ok(mut t) = self.file.write() {
                t.1 = modified(path);
            }
        })?;
        if let Ok(mut t) = self.file.write() {
            *t = (Arc::new(file), stamp);
        }
        self.file_gen.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        Ok(true)
    }

    /// Re-reads the file when it changes (checked every second) until `stop`;
    /// each change goes to the audit log.
    pub async fn watch(
        self: Arc<Self>,
        audit: Arc<crate::access::audit::Audit>,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) {
        loop {
            tokio::select! {
                _ = stop.wait_for(|s| *s) => return,
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
            let path = self.path.as_ref().map(|p| p.display().to_string()).unwrap_or_default();
            let (outcome, detail) = match self.reload_if_changed() {
                Ok(true) => {
                    tracing::info!("auth file re-read");
                    ("ok", String::new())
                }
                Ok(false) => continue,
                Err(e) => {
                    tracing::error!(error = %e, "auth file not re-read; the last good one stays in force");
                    ("error", e.to_string())
                }
            };
            let event = crate::access::audit::Event {
                identity: "-",
                remote: None,
                verb: "admin",
                action: "auth.reload",
                object: &path,
                outcome,
                detail: &detail,
            };
            audit.record(&event);
        }
    }
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

fn read_file(path: &Path) -> Result<(AuthFile, Option<SystemTime>), AuthFileError> {
    let stamp = modified(path);
    let text =
        std::fs::read_to_string(path).map_err(|source| AuthFileError::Read { path: path.to_path_buf(), source })?;
    let file = AuthFile::parse(&text).map_err(|why| AuthFileError::Invalid { path: path.to_path_buf(), why })?;
    Ok((file, stamp))
}

/// The first common name (OID 2.5.4.3) of a DER certificate's subject, if it
/// is a UTF8String, PrintableString or IA5String. The certificate was verified
/// by the TLS handshake; this reads it without trusting its lengths.
pub fn subject_common_name(cert: &[u8]) -> Option<String> {
    const SEQ: u8 = 0x30;
    let (_, cert, _) = der(cert, SEQ)?;
    let (_, mut tbs, _) = der(cert, SEQ)?;
    if tbs.first() == Some(&0xA0) {
        tbs = der(tbs, 0xA0)?.2; // version
    }
    let rest = der(tbs, 0x02)?.2; // serial
    let rest = der(rest, SEQ)?.2; // signature algorithm
    let rest = der(rest, SEQ)?.2; // issuer
    let rest = der(rest, SEQ)?.2; // validity
    let (_, mut subject, _) = der(rest, SEQ)?;
    while !subject.is_empty() {
        let (_, set, next) = der(subject, 0x31)?;
        subject = next;
        let (_, attr, _) = der(set, SEQ)?;
        let (_, oid, value) = der(attr, 0x06)?;
        if oid == [0x55, 0x04, 0x03] {
            let tag = *value.first()?;
            if ![0x0C, 0x13, 0x16].contains(&tag) {
                return None;
            }
            return String::from_utf8(der(value, tag)?.1.to_vec()).ok();
        }
    }
    None
}

/// One DER element with tag `tag` at the start of `b`: (tag, contents, rest).
fn der(b: &[u8], tag: u8) -> Option<(u8, &[u8], &[u8])> {
    if *b.first()? != tag {
        return None;
    }
    let first = *b.get(1)?;
    let (len, head) = if first < 0x80 {
        (first as usize, 2)
    } else {
        let n = (first & 0x7F) as usize;
        if n == 0 || n > 4 {
            return None;
        }
        let len = b.get(2..2 + n)?.iter().fold(0usize, |acc, x| (acc << 8) | *x as usize);
        (len, 2 + n)
    };
    let end = head.checked_add(len)?;
    Some((tag, b.get(head..end)?, b.get(end..)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_with(token: &NewToken) -> AuthFile {
        let text = format!(
            r#"
            [roles.worker]
            rules = [{{ prefix = "jobs/", verbs = ["acquire", "read"] }}]
            [roles.verifier]
            rules = [{{ prefix = "", verbs = ["check"] }}]
            [[tokens]]
            name = "runner"
            id = "{}"
            hash = "{}"
            roles = ["worker"]
            [[certs]]
            cn = "fencelock client"
            name = "ops"
            roles = ["admin", "verifier"]
            "#,
            token.id, token.hash
        );
        AuthFile::parse(&text).unwrap()
    }

    fn auth(file: AuthFile) -> Arc<Auth> {
        let loaded = Loaded { path: "x".into(), file, stamp: None };
        Auth::new(Some(loaded), Arc::new(Policy::default()))
    }

    #[test]
    fn a_token_names_its_identity_and_a_changed_one_nobody() {
        let t = new_token().unwrap();
        let a = auth(file_with(&t));
        let who = a.authenticate(Some(&format!("Bearer {}", t.token)), None).unwrap();
        assert_eq!(who.name(), "runner");
        let mut wrong = t.token.clone();
        wrong.pop();
        wrong.push(if t.token.ends_with('0') { '1' } else { '0' });
        for bad in [wrong.as_str(), "flt_00000000_00", "", "Bearer"] {
            assert!(
                matches!(a.authenticate(Some(bad), Some("fencelock client")), Err(Refusal::Unauthenticated(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn no_credentials_or_an_unknown_certificate_is_unauthenticated() {
        let a = auth(file_with(&new_token().unwrap()));
        assert!(matches!(a.authenticate(None, None), Err(Refusal::Unauthenticated(_))));
        assert!(matches!(a.authenticate(None, Some("stranger")), Err(Refusal::Unauthenticated(_))));
        assert_eq!(a.authenticate(None, Some("fencelock client")).unwrap().name(), "ops");
        assert_eq!(Auth::off().authenticate(None, None).unwrap().caller(), None, "anyone, when authentication is off");
    }

    #[test]
    fn rules_allow_their_verbs_on_their_prefix_only() {
        let t = new_token().unwrap();
        let a = auth(file_with(&t));
        let worker = a.authenticate(Some(&t.token), None).unwrap();
        assert_eq!(worker.require(Verb::Acquire, "jobs/nightly"), Ok(()));
        assert_eq!(worker.require_prefix(Verb::Read, "jobs/n"), Ok(()));
        assert!(worker.require(Verb::Acquire, "billing/x").is_err());
        assert!(worker.require_prefix(Verb::Read, "").is_err(), "a listing of every lock needs read on \"\"");
        assert!(worker.require(Verb::Check, "jobs/nightly").is_err());
        let e = worker.require_admin().unwrap_err();
        assert_eq!(e.to_string(), "permission denied: runner may not admin the cluster");
        assert_eq!(worker.caller(), Some(Caller { name: "runner".into(), admin: false }));
        let ops = a.authenticate(None, Some("fencelock client")).unwrap();
        assert_eq!(ops.require_admin(), Ok(()));
        assert_eq!(ops.caller(), Some(Caller { name: "ops".into(), admin: true }));
    }

    #[test]
    fn a_bad_file_is_refused_with_the_reason() {
        let cases = [
            ("[[tokens]]\nname='a'\nid='0000000a'\nhash='sha256:00:00'\nroles=[]", "hash"),
            ("[[tokens]]\nname='a'\nid='0000000g'\nhash='sha256:00:00'\nroles=[]", "8 hex digits"),
            ("[[certs]]\ncn='x'\nroles=['nope']", "no role \"nope\""),
            ("[roles.admin]\nrules=[]", "built in"),
            ("[roles.r]\nrules=[{prefix='a/', verbs=['admin']}]", "whole group"),
            ("[roles.r]\nrules=[{prefix='a/', verbs=['write']}]", "unknown variant"),
            ("[[certs]]\ncn='x'\nname='has space'\nroles=[]", "visible ASCII"),
            ("[[certs]]\ncn='x'\nroles=[]\n[[certs]]\ncn='y'\nname='x'\nroles=[]", "defined twice"),
            ("colour = 'blue'", "unknown field"),
        ];
        for (text, why) in cases {
            let e = AuthFile::parse(text).unwrap_err();
            assert!(e.contains(why), "{text:?}: {e}");
        }
    }

    /// A group policy with one token identity `name` (roles `roles`, which
    /// the policy defines as read on "").
    fn group_with(name: &str, token: &NewToken, role: &str) -> Policy {
        let mut p = Policy::default();
        let read = vec![Rule { prefix: String::new(), verbs: vec![Verb::Read] }];
        p.apply(&PolicyChange::PutRole { name: role.into(), rules: read }).unwrap();
        let credential = Credential::Token { id: token.id.clone(), hash: token.hash.clone() };
        let identity = IdentityDef { credential, roles: vec![role.into()], limits: None };
        p.apply(&PolicyChange::PutIdentity { name: name.into(), identity }).unwrap();
        p
    }

    #[test]
    fn group_identities_authenticate_next_to_the_files() {
        let (file_token, group_token) = (new_token().unwrap(), new_token().unwrap());
        let table = Table::build(&file_with(&file_token), &group_with("reader", &group_token, "reader"));
        let who = table.by_token(&group_token.token).expect("a group token is known");
        assert_eq!((who.name.as_str(), who.source), ("reader", Source::Group));
        assert_eq!(who.rules, vec![Rule { prefix: String::new(), verbs: vec![Verb::Read] }]);
        assert_eq!(table.by_token(&file_token.token).unwrap().source, Source::File);
    }

    #[test]
    fn the_file_wins_over_a_group_identity_of_the_same_name_or_token() {
        let (file_token, group_token) = (new_token().unwrap(), new_token().unwrap());
        let file = file_with(&file_token);
        // A group identity named like the file's: left out on this node.
        let table = Table::build(&file, &group_with("runner", &group_token, "worker"));
        assert!(table.by_token(&group_token.token).is_none());
        assert_eq!(
            table.by_token(&file_token.token).unwrap().rules,
            file.policy.rules_of(&file.policy.identities()["runner"])
        );
        // A group identity with the file's token id: the file's stays.
        let same_id = NewToken { token: String::new(), id: file_token.id.clone(), hash: group_token.hash.clone() };
        let table = Table::build(&file, &group_with("other", &same_id, "reader"));
        assert_eq!(table.by_token(&file_token.token).unwrap().name, "runner");
    }

    #[test]
    fn the_common_name_is_read_from_a_certificate() {
        let ca = crate::access::certs::Ca::new("test CA").unwrap();
        let cert = ca.issue("fencelock client", &[], crate::access::certs::Role::Client).unwrap();
        let der = rustls_pemfile_der(&cert.cert_pem);
        assert_eq!(subject_common_name(&der).as_deref(), Some("fencelock client"));
        for cut in [0, 1, 10, der.len() / 2, der.len() - 1] {
            let _ = subject_common_name(&der[..cut]); // never panics on a truncated certificate
        }
        assert_eq!(subject_common_name(b"\x30\x84\xff\xff\xff\xff"), None);
    }

    fn rustls_pemfile_der(pem: &str) -> Vec<u8> {
        use rustls::pki_types::{pem::PemObject, CertificateDer};
        CertificateDer::from_pem_slice(pem.as_bytes()).unwrap().to_vec()
    }

    /// Ids are positive `int64`s, and never repeat across draws (a repeat
    /// among 300 random 63-bit ids would take a broken generator or a batch
    /// handed out twice).
    #[test]
    fn random_lease_ids_are_positive_int64s_and_distinct_across_draws() {
        let ids: Vec<u64> = (0..10 * LEASE_IDS_PER_DRAW).map(|_| random_lease_id().unwrap()).collect();
        assert!(ids.iter().all(|&id| id > 0 && id < 1 << 63));
        let distinct: std::collections::HashSet<_> = ids.iter().collect();
        assert_eq!(distinct.len(), ids.len(), "an id was handed out twice");
    }
}
