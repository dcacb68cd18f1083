//! `fencelock-chaos`: the fault-injection suite. It starts a lock service, the
//! fenced storage server and worker processes that append to one object under
//! the lock, injects one scenario's faults on a schedule drawn from a seed,
//! and checks the histories: tokens never reused or inverted, no stale write
//! accepted, no acknowledged append lost, acknowledged grants surviving
//! restarts, every fault healed, and proof that the faults really happened.
//!
//! ```text
//! fencelock-chaos run --scenario K1 --seed 42 --duration 60s
//! fencelock-chaos run --scenario K4 --backend etcd --seed 7 --duration 30s
//! fencelock-chaos profile short --report docs/safety.md
//! ```
//! Exit codes: 0 every check passed; 1 a check failed; 2 inconclusive (a
//! fault could not be shown to have happened); 3 the harness itself failed.
#![allow(clippy::disallowed_methods)] // a harness schedules faults by the clock on purpose

mod checker;
mod cluster;
mod cluster_faults;
mod ctx;
mod faketime;
mod history;
mod http;
mod metrics;
mod nemesis;
mod observers;
mod peer_input;
mod peer_tls;
mod procs;
mod profile;
mod report;
mod run;
mod scenario;
mod secure;
mod targets;
mod worker_control;
mod worker_process;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};

use fencelock_http::parse_duration;
use fencelock_server::parse_peers;

use crate::scenario::{non_default_log, LogEngine, Mutant, RunSpec, Scenario};

#[derive(Parser, Debug)]
#[command(
    name = "fencelock-chaos",
    about = "Fault injection against fencelock and its peers, with checkers that can fail"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// One scenario against one backend.
    Run(RunArgs),
    /// A fixed list of runs (short: a few minutes, for CI; long: about an
    /// hour and 20 minutes, K4 alone 15 minutes), then the report.
    Profile(profile::ProfileArgs),
    /// Writes the markdown report from the verdicts under a directory.
    Report(profile::ReportArgs),
    #[command(hide = true)]
    Worker(worker_process::WorkerArgs),
    #[command(hide = true)]
    Serve(ServeArgs),
    #[command(hide = true)]
    Storage(StorageArgs),
}

#[derive(Args, Debug)]
struct RunArgs {
    /// K1, K2, K3, K4, S1, S4, S5, P1, P2; L1, L2 or L3 (against fencelock3).
    #[arg(long)]
    scenario: Scenario,
    /// fencelock, fencelock-json (a node whose workers use its HTTP API; K1
    /// only), fencelock-py (a node whose workers use the Python package; K1
    /// only), fencelock3 (a 3-node group), redis, redlock, etcd, zk or postgres.
    #[arg(long, default_value = "fencelock")]
    backend: String,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// How long faults are injected, e.g. `60s`, `500ms`, `30m`.
    #[arg(long, default_value = "20s", value_parser = parse_duration)]
    duration: Duration,
    #[arg(long, default_value_t = 4)]
    workers: u32,
    /// Lease TTL (raised to the backend's minimum).
    #[arg(long, default_value = "500ms", value_parser = parse_duration)]
    ttl: Duration,
    /// S6's allowance for a loaded machine, on top of its bound (2 × TTL plus
    /// the restart or election allowance); `profile short` uses 3 s.
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    heal_slack: Duration,
    /// The Python interpreter of the fencelock-py backend's workers: one that
    /// imports the fencelock package (`pip install ./python`).
    #[arg(long, default_value = "python3")]
    python: PathBuf,
    /// Run a deliberately broken build: fencing-off, memory-token,
    /// dead-waiter, reads-unfenced (with --shared), multi-one-by-one (with --multi).
    #[arg(long)]
    mutant: Option<Mutant>,
    /// Run fencelock (a node, or the group of fencelock3, whose nodes then
    /// speak Raft on peer ports of their own) with TLS and an auth file: workers
    /// connect with `fencelock+tls://…?ca=…&token=…` as an identity that may
    /// only acquire, check and read the run's locks; admin calls go over TLS
    /// with an admin token.
    #[arg(long)]
    tls: bool,
    /// Election mode: the workers campaign for the lock as a leader election
    /// (campaign → fenced write with the term → resign) and two observers
    /// follow the leader; the checks E1–E3 are added.
    #[arg(long)]
    election: bool,
    /// Shared mode: each cycle a worker is a reader (shared acquire → fenced
    /// read → release) with probability 0.7, else a writer (the exclusive
    /// cycle); an observer polls the lock's holders; the checks R1 and R2 are
    /// added. Needs a backend that declares read-write locks.
    #[arg(long, conflicts_with = "election")]
    shared: bool,
    /// Semaphore mode: the lock is a semaphore of N permits; each worker
    /// takes one and writes an object of its own; an observer polls the
    /// permits in use (R2). Needs a backend that declares semaphores.
    #[arg(long, default_value_t = 0, conflicts_with_all = ["election", "shared"])]
    permits: u32,
    /// Multi mode: K locks, each guarding its own object; each cycle a
    /// worker takes all K at once (`acquire_all`, in a shuffled order) or
    /// one, and writes each held lock's object with that lock's token; the
    /// check M1 is added, and C3, C4 and C6 are judged per lock. Needs a
    /// backend that declares atomic multi-locks.
    #[arg(long, default_value_t = 0, conflicts_with_all = ["election", "shared", "permits"])]
    multi: u32,
    /// The Raft log of fencelock's own servers (a node or the group of
    /// fencelock3): segment (the append-only segment log, the product's
    /// default; under S5 its files are rolled back at each power loss too) or
    /// redb (the log in the database).
    #[arg(long, default_value_t = LogEngine::default())]
    log: LogEngine,
    /// Directory for histories, logs and verdict.json [default: target/chaos/<scenario>-<backend>-<seed>].
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct ServeArgs {
    #[arg(long)]
    data_dir: PathBuf,
    #[arg(long)]
    grpc: SocketAddr,
    #[arg(long)]
    http: SocketAddr,
    /// This node's id in a group (with `--peers`).
    #[arg(long, default_value_t = 1)]
    node_id: u64,
    /// The voters of a new group, `id=host:port,…` (`id=CLIENT/PEER` for
    /// nodes with a peer port of their own).
    #[arg(long)]
    peers: Option<String>,
    /// Serve Raft on a port of its own (the client port then serves clients only).
    #[arg(long)]
    peer_listen: Option<SocketAddr>,
    /// TLS with this node's certificate (`--node-id`) of this `certs::init` directory.
    #[arg(long)]
    tls_dir: Option<PathBuf>,
    /// Authentication: this auth file.
    #[arg(long)]
    auth_file: Option<PathBuf>,
    /// The audit log (refused calls, admin actions).
    #[arg(long)]
    audit_log: Option<PathBuf>,
    /// The Raft log: segment or redb (`Config.log`; the product's default
    /// when not given).
    #[arg(long, default_value_t = LogEngine::default())]
    log: LogEngine,
}

#[derive(Args, Debug)]
struct StorageArgs {
    #[arg(long)]
    data_dir: PathBuf,
    #[arg(long)]
    listen: SocketAddr,
    #[arg(long)]
    unfenced: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into());
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("tokio runtime");
    let res = rt.block_on(async move {
        match cli.cmd {
            Cmd::Run(a) => run_one(a).await,
            Cmd::Profile(a) => profile::profile(a).await,
            Cmd::Report(a) => profile::report(a).map(|_| ExitCode::SUCCESS),
            Cmd::Worker(a) => worker_process::run(a).await.map(|_| ExitCode::SUCCESS),
            Cmd::Serve(a) => serve(a).await.map(|_| ExitCode::SUCCESS),
            Cmd::Storage(a) => storage(a).await.map(|_| ExitCode::SUCCESS),
        }
    });
    // A worker's stdin reader blocks a thread that a normal runtime drop would
    // wait for.
    rt.shutdown_background();
    match res {
        Ok(code) => code,
        Err(e) => {
            eprintln!("fencelock-chaos: {e:#}");
            ExitCode::from(3)
        }
    }
}

async fn run_one(a: RunArgs) -> anyhow::Result<ExitCode> {
    let mode = match (a.election, a.shared, a.permits, a.multi) {
        (true, ..) => "-election".to_string(),
        (_, true, ..) => "-shared".to_string(),
        (_, _, 0, 0) => String::new(),
        (_, _, 0, k) => format!("-multi{k}"),
        (_, _, n, _) => format!("-permits{n}"),
    };
    let mode = match non_default_log(a.log) {
        Some(log) => format!("{mode}-{log}"),
        None => mode,
    };
    let out =
        a.out.unwrap_or_else(|| PathBuf::from(format!("target/chaos/{}-{}-{}{mode}", a.scenario, a.backend, a.seed)));
    let spec = RunSpec {
        scenario: a.scenario,
        backend: a.backend,
        seed: a.seed,
        duration: a.duration,
        workers: a.workers,
        ttl: a.ttl,
        mutant: a.mutant,
        tls: a.tls,
        election: a.election,
        shared: a.shared,
        permits: a.permits,
        multi: a.multi,
        log: a.log,
        heal_slack: a.heal_slack,
        python: a.python,
        out: out.clone(),
    };
    let verdict = run::run(spec).await?;
    print!("{}", profile::summary(&verdict));
    println!("details: {}", out.display());
    Ok(profile::exit_code(&verdict))
}

/// A lock server with the faults of its environment plugged in (see
/// [`fencelock_chaos::faults`]), until SIGTERM or SIGINT.
async fn serve(a: ServeArgs) -> anyhow::Result<()> {
    let armed = fencelock_chaos::faults::Armed::from_env().map_err(anyhow::Error::msg)?;
    if !armed.lines.is_empty() {
        eprintln!("fencelock-chaos serve: faults armed: {}", armed.lines.join(", "));
    }
    let mut config = fencelock_server::Config::new(&a.data_dir);
    config.grpc_listen = a.grpc;
    config.http_listen = a.http;
    config.node_id = a.node_id;
    config.peer_listen = a.peer_listen;
    config.audit_log = a.audit_log.clone();
    config.log = a.log;
    if let Some(p) = &a.peers {
        config.bootstrap = fencelock_server::Bootstrap::Peers(parse_peers(p).map_err(anyhow::Error::msg)?);
    }
    if let Some(dir) = &a.tls_dir {
        secure::server_config(&mut config, dir, a.node_id, a.auth_file.as_deref());
    } else {
        config.auth_file = a.auth_file.clone();
    }
    let clock = armed.plug(&mut config);
    let listeners = fencelock_server::Listeners::bind(&config).context("bind the lock server's ports")?;
    let term = async {
        let _ = wait_for_term().await;
    };
    let running = fencelock_server::serve(config, listeners, clock, term).await.context("start the lock server")?;
    running.stopping().await;
    running.shutdown().await;
    Ok(())
}

async fn storage(a: StorageArgs) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(a.listen).await.with_context(|| format!("listen on {}", a.listen))?;
    let mut config = fencelock_fence::storage::Config::new(&a.data_dir);
    config.enforce = !a.unfenced;
    let term = async {
        let _ = wait_for_term().await;
    };
    fencelock_fence::storage::serve_with(listener, config, term).await.context("storage server")?;
    Ok(())
}

async fn wait_for_term() -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}
