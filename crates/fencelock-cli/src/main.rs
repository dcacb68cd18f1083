//! `fencelock`: the command-line front of fencelock.
//!
//! `serve` runs a node; `cluster` shows and changes a group's members; `run` runs a command under a lock; `elect`
//! runs one while leading an election and `leader` shows the leader; `acquire`, `release`,
//! `locks` and `check` are for scripts and people. Exit codes are documented in
//! [`exit`] and in docs/guide/cli.md; contention is an outcome with its own code.

mod auth;
mod certs;
mod check_data;
mod client_cmds;
mod cluster;
mod demo;
mod elect;
mod exit;
mod http;
mod manual;
mod notify;
mod run;
mod serve;
mod slot;
mod snapshot;
mod storage;
mod top;
mod version;
mod watch;

use std::{process::ExitCode, time::Duration};

use clap::{Args, Parser, Subcommand};

use fencelock_http::parse_duration;

/// A distributed lock service with leases, FIFO queues and fencing tokens.
#[derive(Parser, Debug)]
#[command(name = "fencelock", version = version::long(), about, after_help = exit::HELP)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
#[allow(clippy::large_enum_variant)] // parsed once per process
enum Cmd {
    /// Run a fencelock server node (a Raft group of one by default; `--peers` for 3 or 5).
    Serve(serve::ServeArgs),
    /// Show or change the members of a fencelock group.
    Cluster(cluster::ClusterArgs),
    /// Run a command while holding a lock; stop it if the lease is lost.
    Run(run::RunArgs),
    /// Run a command only while leading an election (FENCELOCK_TERM is its term); stop it if leadership is lost.
    Elect(elect::ElectArgs),
    /// Show an election's leader (exit 1 if none), or follow it with --watch.
    Leader(elect::LeaderArgs),
    /// Acquire a lock on a lease of its own (not kept alive) and print the token.
    Acquire(client_cmds::AcquireArgs),
    /// Release a lock taken with `acquire` (compare-and-delete on lease and token).
    Release(client_cmds::ReleaseArgs),
    /// List held and waited-on locks.
    Locks(client_cmds::LocksArgs),
    /// Is TOKEN the current live grant of NAME? Exit 0 if yes, 1 if not.
    Check(client_cmds::CheckArgs),
    /// Give a semaphore a new number of permits (admin); a larger one grants its waiters at once.
    Resize(client_cmds::ResizeArgs),
    /// Show the slots a `run --once-per` completed on NAME (newest first): who ran each, and how it ended.
    Slots(client_cmds::SlotsArgs),
    /// Print lock events (granted, released, expired, …) as they happen, until interrupted.
    Watch(watch::WatchArgs),
    /// Show live locks, queues and the group's health in the terminal, refreshed as they change (q quits, / filters).
    Top(top::TopArgs),
    /// Run the fenced storage server (HTTP object store that rejects stale tokens).
    Storage(storage::StorageArgs),
    /// Back up a running group's state, or build a new data dir from a backup.
    Snapshot(snapshot::SnapshotArgs),
    /// Make the certificates of a secure group (CA, nodes, a client).
    Certs(certs::CertsArgs),
    /// Who may do what: the group's roles and identities, or a node's auth file.
    Auth(auth::AuthArgs),
    /// Verify a data dir offline: checksums, log order, snapshot, rebuilt state.
    CheckData(check_data::CheckDataArgs),
    /// Play the paused-holder scenario with real processes, with and without fencing.
    Demo(demo::DemoArgs),
    /// Print the shell completion script of SHELL (bash, zsh, fish, elvish, powershell).
    Completions(manual::CompletionsArgs),
    /// Write the man pages of fencelock and of every subcommand into DIR.
    Man(manual::ManArgs),
    /// One client of `demo` (internal).
    #[command(hide = true)]
    DemoClient(demo::DemoClientArgs),
}

/// `--server` (and its TLS files and auth token) for every client command.
#[derive(Args, Debug, Clone)]
pub struct ServerArg {
    /// Lock service URL: fencelock://host:port (or http://) for a fencelock
    /// server, fencelock+tls://host:port (or https://) with TLS, a group as
    /// fencelock://a:7070,b:7070,c:7070 (or http://a:7070,http://b:7070):
    /// every member is tried, one that is down is passed over (docs/guide/cli.md,
    /// "Server URLs"); `run` and `check` also take
    /// redis://host:port (rediss:// with TLS), redlock://h1:p1,h2:p2,h3:p3,
    /// etcd://host:port (etcd+tls://), zk://host:port and
    /// postgres://user@host/db[?mode=advisory&sslmode=verify-full].
    #[arg(long, env = "FENCELOCK_SERVER", default_value = "http://127.0.0.1:7070")]
    pub server: String,
    /// The CA (PEM) that signed the servers' certificates; turns TLS on
    /// (fencelock:// becomes fencelock+tls://). The URL's ca= does the same.
    #[arg(long, env = "FENCELOCK_TLS_CA")]
    pub tls_ca: Option<std::path::PathBuf>,
    /// A client certificate (PEM) to present, for servers that ask for one.
    #[arg(long, env = "FENCELOCK_TLS_CERT", requires_all = ["tls_key", "tls_ca"])]
    pub tls_cert: Option<std::path::PathBuf>,
    /// The key of --tls-cert (PEM).
    #[arg(long, env = "FENCELOCK_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<std::path::PathBuf>,
    /// Bearer token for a fencelock server that requires one (the URL's
    /// token= does the same). Never printed. Prefer the environment variable:
    /// a flag is visible to other users in the process list.
    #[arg(long, env = "FENCELOCK_AUTH_TOKEN", hide_env_values = true, value_name = "TOKEN")]
    pub auth_token: Option<AuthToken>,
}

/// An auth token from the command line or the environment. Opaque; its
/// `Debug` hides it, so no `{:?}` of the arguments shows it. Checked where it
/// is used (by the client library, or [`http::AdminTlsArgs::auth_header`]),
/// not by clap, whose error would quote it.
#[derive(Clone)]
pub struct AuthToken(String);

impl AuthToken {
    /// The token itself: only to send it.
    pub fn secret(&self) -> &str {
        &self.0
    }

    /// The token as a URL query value: percent-encoded but for the unreserved
    /// characters (the tokens a server issues need no encoding).
    fn url_encoded(&self) -> String {
        let mut out = String::with_capacity(self.0.len());
        for b in self.0.bytes() {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                out.push(b as char);
            } else {
                out.push_str(&format!("%{b:02X}"));
            }
        }
        out
    }
}

impl std::str::FromStr for AuthToken {
    type Err = std::convert::Infallible;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(AuthToken(s.to_string()))
    }
}

impl std::fmt::Debug for AuthToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AuthToken(***)")
    }
}

impl ServerArg {
    /// The URL with the TLS flags and the auth token folded in: a fencelock
    /// URL gets the TLS scheme, and every URL the flags as `ca=`, `cert=`,
    /// `key=` (a backend without TLS then says so) and the token as `token=`
    /// (a backend other than fencelock then says so). A `ca=` or `token=` the
    /// URL has itself comes first, and wins. It holds the token: never print
    /// it (print [`shown`](Self::shown)).
    pub fn url(&self) -> String {
        if self.tls_ca.is_none() && self.auth_token.is_none() {
            return self.server.clone();
        }
        let mut url = self.server.trim().to_string();
        let mut params = Vec::new();
        if let Some(ca) = &self.tls_ca {
            for plain in ["fencelock://", "http://"] {
                if let Some(rest) = url.strip_prefix(plain) {
                    url = format!("fencelock+tls://{rest}");
                }
            }
            params.push(format!("ca={}", ca.display()));
            if let (Some(c), Some(k)) = (&self.tls_cert, &self.tls_key) {
                params.push(format!("cert={}", c.display()));
                params.push(format!("key={}", k.display()));
            }
        }
        if let Some(token) = &self.auth_token {
            params.push(format!("token={}", token.url_encoded()));
        }
        let sep = if url.contains('?') { '&' } else { '?' };
        format!("{url}{sep}{}", params.join("&"))
    }

    /// The URL as it may be shown: its password and token hidden.
    pub fn shown(&self) -> String {
        fencelock::backend::BackendUrl::parse(&self.server)
            .map_or_else(|_| "(a malformed URL)".into(), |u| u.to_string())
    }
}

/// Options shared by `run` and `acquire`.
#[derive(Args, Debug, Clone)]
pub struct LockArgs {
    /// Lock name (1–512 bytes of UTF-8, no control characters); left out
    /// with `--all`.
    #[arg(required_unless_present = "all")]
    pub name: Option<String>,
    /// Take every lock of this comma-separated list at once instead of NAME:
    /// an atomic multi-lock (2 to 16 names), all or none, each with its own
    /// fencing token. A waiting one queues on every lock at once, so runs that
    /// name the same locks in other orders never deadlock. With `--shared`,
    /// a read of each. Not with `--permits` or `--once-per`. Only the
    /// fencelock backend.
    #[arg(long, value_name = "A,B,…", value_delimiter = ',', conflicts_with_all = ["name", "permits"])]
    pub all: Vec<String>,
    /// Lease TTL: the lock is lost this long after the holder stops renewing.
    #[arg(long, default_value = "15s", value_parser = parse_duration, env = "FENCELOCK_TTL")]
    pub ttl: Duration,
    /// How long to wait in the queue if the lock is held (0s: fail at once).
    #[arg(long, default_value = "0s", value_parser = parse_duration, env = "FENCELOCK_WAIT")]
    pub wait: Duration,
    /// After an unclean loss (lease expiry), keep the lock closed this long.
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    pub lock_delay: Duration,
    /// Keep the lock closed to everyone until this long after the grant,
    /// however it ends (CMD exits, the lease is lost): a job that ends early
    /// still keeps a second run out until then, timed by the server's
    /// monotonic clock (≤ 24 h). Only the fencelock backend.
    #[arg(long, value_name = "D", default_value = "0s", value_parser = parse_duration)]
    pub hold_at_least: Duration,
    /// Who takes the lock, as `fencelock locks` shows it (≤ 256 bytes, no
    /// control characters). Default: `hostname:pid` on a backend that keeps
    /// holder identities (fencelock), none on the others.
    #[arg(long)]
    pub identity: Option<String>,
    /// A value published with the grant (≤ 4096 bytes, e.g. a leader's
    /// address); only the fencelock backend keeps one.
    #[arg(long)]
    pub value: Option<String>,
    /// Take the lock as a reader: any number of `--shared` holders at once,
    /// or one without (a writer). Strict FIFO: a queued writer holds back
    /// the readers after it. Only the fencelock backend.
    #[arg(long, conflicts_with = "permits")]
    pub shared: bool,
    /// Take a permit of a semaphore of N permits (N holders at once, each on
    /// its own lease; the first acquirer sets N). Only the fencelock backend.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub permits: Option<u32>,
    /// Take this many of the semaphore's permits at once, all or nothing.
    #[arg(long, value_name = "K", requires = "permits", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub weight: u32,
}

impl LockArgs {
    /// NAME, or the first lock of `--all` (for messages).
    pub fn name(&self) -> &str {
        self.name.as_deref().or(self.all.first().map(String::as_str)).unwrap_or_default()
    }

    /// The lock options these flags ask for. `keeps_identity`: the backend
    /// keeps holder identities, so the identity defaults to `hostname:pid`.
    pub fn options(&self, keeps_identity: bool) -> fencelock::LockOptions {
        let opts = fencelock::LockOptions::default().ttl(self.ttl).wait(self.wait).lock_delay(self.lock_delay);
        let opts = opts.hold_at_least(self.hold_at_least);
        let opts = match self.identity.clone().or_else(|| keeps_identity.then(default_identity)) {
            Some(identity) => opts.identity(identity),
            None => opts,
        };
        let opts = match &self.value {
            Some(value) => opts.value(value.as_bytes()),
            None => opts,
        };
        let opts = if self.shared { opts.shared() } else { opts };
        match self.permits {
            Some(n) => opts.permits(n).weight(self.weight),
            None => opts,
        }
    }
}

/// `hostname:pid` of this process (the hostname as the kernel has it, else
/// `localhost`), with any control character dropped so that it is a valid
/// identity.
pub fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    let host = if host.is_empty() { "localhost".to_string() } else { host };
    let host: String = host.chars().filter(|c| !c.is_control()).take(200).collect();
    format!("{host}:{}", std::process::id())
}

/// mimalloc, not glibc's malloc: in a 3-node group glibc's allocator
/// (malloc, free and the consolidation of its free lists) was 12 % of the
/// leader's CPU and 15 % of a follower's. With mimalloc the group did 27–35 %
/// more W1-64 cycles per second on 25–29 % less CPU per cycle, a single node
/// created W3's million leases 1.5–1.6× as fast, and an idle lease cost 3–8 %
/// more memory (`bench/results/2026-11-30-mimalloc/`). It reads `MIMALLOC_*`
/// environment variables (its own options, such as `MIMALLOC_SHOW_STATS`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Cmd::Serve(a) = &cli.cmd {
        match serve::worker_threads(a) {
            Ok(Some(n)) => _ = builder.worker_threads(n),
            Ok(None) => {}
            Err(e) => return exit::error(e),
        }
    }
    let rt = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => return exit::error(anyhow::anyhow!("cannot start the runtime: {e}")),
    };
    rt.block_on(async move {
        let res = match cli.cmd {
            Cmd::Serve(a) => serve::serve(a).await,
            Cmd::Cluster(a) => cluster::cluster(a).await,
            Cmd::Run(a) => run::run(a).await,
            Cmd::Elect(a) => elect::elect(a).await,
            Cmd::Leader(a) => elect::leader(a).await,
            Cmd::Acquire(a) => client_cmds::acquire(a).await,
            Cmd::Release(a) => client_cmds::release(a).await,
            Cmd::Locks(a) => client_cmds::locks(a).await,
            Cmd::Check(a) => client_cmds::check(a).await,
            Cmd::Resize(a) => client_cmds::resize(a).await,
            Cmd::Slots(a) => client_cmds::slots(a).await,
            Cmd::Watch(a) => watch::watch(a).await,
            Cmd::Top(a) => top::top(a).await,
            Cmd::Storage(a) => storage::storage(a).await,
            Cmd::Snapshot(a) => snapshot::snapshot(a).await,
            Cmd::CheckData(a) => check_data::check(a),
            Cmd::Certs(a) => certs::certs(a),
            Cmd::Auth(a) => auth::auth(a).await,
            Cmd::Demo(a) => demo::demo(a).await,
            Cmd::Completions(a) => manual::completions(a),
            Cmd::Man(a) => manual::man(a),
            Cmd::DemoClient(a) => demo::demo_client(a).await,
        };
        res.unwrap_or_else(exit::error)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    const SECRET: &str = "flt_0123abcd_c2VrcmV0c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0c2Vj";

    fn server(url: &str, token: Option<&str>) -> ServerArg {
        ServerArg {
            server: url.into(),
            tls_ca: None,
            tls_cert: None,
            tls_key: None,
            auth_token: token.map(|t| t.parse().unwrap()),
        }
    }

    /// Rule: `--auth-token` is folded into `url()` as `token=` (with the TLS
    /// flags, and percent-encoded where needed), and `shown()` never shows it,
    /// nor a `token=` written in the URL; without it the URL is unchanged.
    #[test]
    fn the_auth_token_goes_into_the_url_and_is_never_shown() {
        let s = server("fencelock://a:7070,b:7070", Some(SECRET));
        assert_eq!(s.url(), format!("fencelock://a:7070,b:7070?token={SECRET}"));
        let parsed = fencelock::backend::BackendUrl::parse(&s.url()).unwrap();
        assert_eq!(parsed.auth_token().as_deref(), Some(SECRET));
        assert!(!s.shown().contains(SECRET) && !format!("{s:?}").contains(SECRET), "{s:?}");
        assert!(!parsed.to_string().contains(SECRET), "{parsed}");

        let tls = ServerArg { tls_ca: Some("/ca.pem".into()), ..server("http://h:1", Some(SECRET)) };
        assert_eq!(tls.url(), format!("fencelock+tls://h:1?ca=/ca.pem&token={SECRET}"));

        let odd = server("fencelock://h?x=1", Some("a&b c"));
        assert_eq!(odd.url(), "fencelock://h?x=1&token=a%26b%20c");
        assert_eq!(fencelock::backend::BackendUrl::parse(&odd.url()).unwrap().auth_token().as_deref(), Some("a&b c"));

        let in_url = server(&format!("fencelock://h?token={SECRET}"), None);
        assert_eq!(in_url.url(), in_url.server);
        assert_eq!(in_url.shown(), "fencelock://h?token=***");
        assert_eq!(server("  http://h:1", None).url(), "  http://h:1");
    }

    /// Rule: the token is `--auth-token` / FENCELOCK_AUTH_TOKEN (not
    /// FENCELOCK_TOKEN, the fencing token `run` gives its child), on every
    /// client command and on the admin commands, and clap never prints its
    /// value from the environment.
    #[test]
    fn the_auth_token_flag_and_its_env_var() {
        let mut cli = Cli::command();
        cli.build(); // propagates the admin commands' global flags to their subcommands
        let paths: [&[&str]; 10] = [
            &["run"],
            &["elect"],
            &["leader"],
            &["acquire"],
            &["release"],
            &["locks"],
            &["check"],
            &["cluster"],
            &["cluster", "status"],
            &["snapshot", "save"],
        ];
        for path in paths {
            let mut cmd = &cli;
            for name in path {
                cmd = cmd.find_subcommand(name).unwrap_or_else(|| panic!("{path:?}"));
            }
            let arg = cmd.get_arguments().find(|a| a.get_id() == "auth_token").unwrap_or_else(|| panic!("{path:?}"));
            assert_eq!(arg.get_long(), Some("auth-token"), "{path:?}");
            assert_eq!(arg.get_env().and_then(|e| e.to_str()), Some("FENCELOCK_AUTH_TOKEN"), "{path:?}");
            assert!(arg.is_hide_env_values_set(), "{path:?}");
        }
        let parsed =
            Cli::try_parse_from(["fencelock", "locks", "--server", "http://h:1", "--auth-token", SECRET]).unwrap();
        assert!(!format!("{parsed:?}").contains(SECRET));
        let parsed = Cli::try_parse_from(["fencelock", "cluster", "status", "--auth-token", SECRET]).unwrap();
        assert!(!format!("{parsed:?}").contains(SECRET));
    }
}
