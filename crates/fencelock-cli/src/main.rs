//! `fencelock`: the command-line front of fencelock.
//!
//! `serve` runs a node; `cluster` shows and changes a group's members; `run` runs a command under a lock; `acquire`, `release`,
//! `locks` and `check` are for scripts and people. Exit codes are documented in
//! [`exit`] and in the README; contention is an outcome with its own code.

mod auth;
mod certs;
mod check_data;
mod client_cmds;
mod cluster;
mod demo;
mod duration;
mod exit;
mod http;
mod run;
mod serve;
mod snapshot;
mod storage;

use std::{process::ExitCode, time::Duration};

use clap::{Args, Parser, Subcommand};

use crate::duration::parse_duration;

/// A distributed lock service with leases, FIFO queues and fencing tokens.
#[derive(Parser, Debug)]
#[command(name = "fencelock", version, about, after_help = exit::HELP)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run a fencelock server node (a Raft group of one by default; `--peers` for 3 or 5).
    Serve(serve::ServeArgs),
    /// Show or change the members of a fencelock group.
    Cluster(cluster::ClusterArgs),
    /// Run a command while holding a lock; stop it if the lease is lost.
    Run(run::RunArgs),
    /// Acquire a lock on a lease of its own (not kept alive) and print the token.
    Acquire(client_cmds::AcquireArgs),
    /// Release a lock taken with `acquire` (compare-and-delete on lease and token).
    Release(client_cmds::ReleaseArgs),
    /// List held and waited-on locks.
    Locks(client_cmds::LocksArgs),
    /// Is TOKEN the current live grant of NAME? Exit 0 if yes, 1 if not.
    Check(client_cmds::CheckArgs),
    /// Run the fenced storage server (HTTP object store that rejects stale tokens).
    Storage(storage::StorageArgs),
    /// Back up a running group's state, or build a new data dir from a backup.
    Snapshot(snapshot::SnapshotArgs),
    /// Make the certificates of a secure group (CA, nodes, a client).
    Certs(certs::CertsArgs),
    /// Add tokens to, or check, the auth file a node reads (--auth-file).
    Auth(auth::AuthArgs),
    /// Verify a data dir offline: checksums, log order, snapshot, rebuilt state.
    CheckData(check_data::CheckDataArgs),
    /// Play the paused-holder scenario with real processes, with and without fencing.
    Demo(demo::DemoArgs),
    /// One client of `demo` (internal).
    #[command(hide = true)]
    DemoClient(demo::DemoClientArgs),
}

/// `--server` (and its TLS files) for every client command.
#[derive(Args, Debug, Clone)]
pub struct ServerArg {
    /// Lock service URL: fencelock://host:port (or http://) for a fencelock
    /// server, fencelock+tls://host:port (or https://) with TLS, a group as
    /// fencelock://a:7070,b:7070,c:7070; `run` and `check` also take
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
}

impl ServerArg {
    /// The URL with the TLS flags folded in: a fencelock URL gets the TLS
    /// scheme, and every URL the flags as `ca=`, `cert=`, `key=` (a backend
    /// without TLS then says so).
    pub fn url(&self) -> String {
        let Some(ca) = &self.tls_ca else { return self.server.clone() };
        let mut url = self.server.trim().to_string();
        for plain in ["fencelock://", "http://"] {
            if let Some(rest) = url.strip_prefix(plain) {
                url = format!("fencelock+tls://{rest}");
            }
        }
        let mut params = vec![format!("ca={}", ca.display())];
        if let (Some(c), Some(k)) = (&self.tls_cert, &self.tls_key) {
            params.push(format!("cert={}", c.display()));
            params.push(format!("key={}", k.display()));
        }
        let sep = if url.contains('?') { '&' } else { '?' };
        format!("{url}{sep}{}", params.join("&"))
    }

    /// The URL as it may be shown: its password hidden.
    pub fn shown(&self) -> String {
        fencelock::backend::BackendUrl::parse(&self.server).map_or_else(|_| "(a malformed URL)".into(), |u| u.to_string())
    }
}

/// Options shared by `run` and `acquire`.
#[derive(Args, Debug, Clone)]
pub struct LockArgs {
    /// Lock name (1–512 bytes of UTF-8, no control characters).
    pub name: String,
    /// Lease TTL: the lock is lost this long after the holder stops renewing.
    #[arg(long, default_value = "15s", value_parser = parse_duration, env = "FENCELOCK_TTL")]
    pub ttl: Duration,
    /// How long to wait in the queue if the lock is held (0s: fail at once).
    #[arg(long, default_value = "0s", value_parser = parse_duration, env = "FENCELOCK_WAIT")]
    pub wait: Duration,
    /// After an unclean loss (lease expiry), keep the lock closed this long.
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    pub lock_delay: Duration,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => return exit::error(anyhow::anyhow!("cannot start the runtime: {e}")),
    };
    rt.block_on(async move {
        let res = match cli.cmd {
            Cmd::Serve(a) => serve::serve(a).await,
            Cmd::Cluster(a) => cluster::cluster(a).await,
            Cmd::Run(a) => run::run(a).await,
            Cmd::Acquire(a) => client_cmds::acquire(a).await,
            Cmd::Release(a) => client_cmds::release(a).await,
            Cmd::Locks(a) => client_cmds::locks(a).await,
            Cmd::Check(a) => client_cmds::check(a).await,
            Cmd::Storage(a) => storage::storage(a).await,
            Cmd::Snapshot(a) => snapshot::snapshot(a).await,
            Cmd::CheckData(a) => check_data::check(a),
            Cmd::Certs(a) => certs::certs(a),
            Cmd::Auth(a) => auth::auth(a),
            Cmd::Demo(a) => demo::demo(a).await,
            Cmd::DemoClient(a) => demo::demo_client(a).await,
        };
        res.unwrap_or_else(exit::error)
    })
}
