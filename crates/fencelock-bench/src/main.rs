//! `fencelock-bench`: the same lock workloads against fencelock and every peer
//! engine, in one run, engines interleaved; a markdown table, a JSON file and
//! charts out.
//!
//! Workloads (see docs/guide/performance.md):
//! - **W1** uncontended cycles: C clients, each on its own lock, acquire →
//!   release; cycles/s, acquire latency, engine CPU per cycle.
//! - **W2** contended handoff: 16 clients on one lock, hold 0; cycles/s,
//!   handoff latency, fairness, self re-grants.
//! - **W3** scale (native): many live leases each holding a lock; memory per
//!   lease, creation time, CPU while some renew.
//! - **W4** durability (native): fsyncs per acknowledged operation, and a
//!   SIGKILL + restart that must find every acknowledged grant.
//! - **W5** shared and counted locks: 16 clients on 4 read-write locks, 90 %
//!   shared, 10 % exclusive (`W5-rw`); 16 clients on a semaphore of 4 permits
//!   (`W5-sem`); cycles/s and handoff, on every engine that declares them.
//! - **W6** election fail-over: three `fencelock elect` candidates, the
//!   leader SIGKILLed or SIGSTOPped; time until an observer sees the next
//!   leader, on every engine with elections (see `failover.rs`).
//!
//! Each engine is started here on free ports of 127.0.0.1 with its data in a
//! temp dir (or reached at `--url id=URL`); `fencelock-3` is a 3-node group of
//! native servers on this machine, measured in W1 and W2 next to the single
//! node (W3 and W4 stay single-node); `fencelock-secure` is the single node
//! with TLS and a bearer token on every call (certificates from
//! `fencelock_server::certs`), for the cost of both. Every cell runs `--runs` times;
//! within a run the engines take turns in a rotated order, so drift on a
//! shared machine hits all of them alike. `--quick` runs every cell briefly:
//! it checks that everything runs, and its figures mean little.
//!
//! `--client-mode` picks how the clients reach an engine: each with its own
//! connection (`per-process`, the id alone), all through one (`shared`, the
//! id `ID/shared`), or `both`; by default the native engines are measured
//! both ways and the peers per process. `--profile-server DIR` adds, after
//! the counted runs of W1 at its largest client count and of W2, one uncounted
//! run on each native single node with `perf` sampling the server: flamegraphs
//! in DIR (see `profile.rs`). `profile-pid` samples any running process the
//! same way (another build's server, measured with `--url`).
//!
//! `catchup --leases N` (issue 38, see `catchup.rs`) is a measurement of its
//! own, outside the workload cells: a 3-node group holding N idle leases, a
//! follower wiped and added back, catching up by snapshot while grants go on;
//! the time, the grants meanwhile and each node's peak memory.
#![allow(clippy::disallowed_methods)] // a benchmark measures time: it reads the clock on purpose

mod admin;
mod catchup;
mod chart;
mod durability;
mod engines;
mod failover;
mod model;
mod procstat;
mod profile;
mod report;
mod scale;
mod stats;
mod workload;

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};

use crate::{
    engines::{Engine, Servers},
    model::{Cell, Report, Settings},
    workload::{RunSpec, Workload},
};

#[derive(Parser, Debug)]
#[command(about = "Lock workloads against fencelock and its peers: a table, JSON and charts")]
struct Args {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    /// A few seconds per cell: checks that every cell runs (for CI), no real figures.
    #[arg(long)]
    quick: bool,
    /// Directory for results.md, results.json and the charts
    /// [default: bench/results/YYYY-MM-DD (UTC), or target/bench-quick with --quick].
    #[arg(long)]
    out: Option<PathBuf>,
    /// Engines to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = engines::ALL.iter().map(|s| s.to_string()))]
    engines: Vec<String>,
    /// Workloads to run, comma-separated (W1, W2, W3, W4, W5, W6).
    #[arg(long, value_delimiter = ',', default_values_t = ["W1", "W2", "W3", "W4", "W5", "W6"].map(String::from))]
    workloads: Vec<String>,
    /// Use a running engine instead of starting one: `--url redis=redis://10.0.0.5:6379`
    /// (no CPU figures for it). Repeatable.
    #[arg(long = "url", value_name = "ID=URL")]
    urls: Vec<String>,
    /// Measured seconds per run of a cell [default: 5, quick 1].
    #[arg(long)]
    seconds: Option<f64>,
    /// Runs per cell [default: 3, quick 1].
    #[arg(long)]
    runs: Option<usize>,
    /// Client counts of W1.
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 16, 64])]
    clients: Vec<usize>,
    /// Clients contending in W2 and in each W5 cell.
    #[arg(long, default_value_t = 16)]
    contenders: usize,
    /// Lease TTL asked of every engine, ms.
    #[arg(long, default_value_t = 10_000)]
    ttl_ms: u64,
    /// W3: live leases to create [default: 1000000, quick 20000].
    #[arg(long)]
    leases: Option<u64>,
    /// W3: leases renewing at TTL/3 while the server's CPU is measured [default: 10000, quick 1000].
    #[arg(long)]
    renewing: Option<u64>,
    /// W6: the candidates' lease TTL, ms, the same for every engine (etcd
    /// rounds a TTL up to whole seconds, with a floor of about 2 s).
    #[arg(long, default_value_t = 2_000)]
    election_ttl_ms: u64,
    /// W6: samples per engine and fault [default: 5, quick 1].
    #[arg(long)]
    election_samples: Option<usize>,
    /// How clients connect: `per-process` (one connection each), `shared`
    /// (one for all, as engine `ID/shared`) or `both` [default: both for the
    /// native engines, per-process for the peers].
    #[arg(long, value_enum)]
    client_mode: Option<engines::ClientMode>,
    /// Profile the native single node with perf during one extra, uncounted
    /// run of W1 (largest client count) and of W2; folded stacks and
    /// flamegraph SVGs go into this directory.
    #[arg(long, value_name = "DIR")]
    profile_server: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// (internal) Run a native server in this process, alone or as a member of
    /// a group; prints its addresses. `FENCELOCK_BENCH_SERVER_THREADS=N` gives
    /// its runtime N worker threads (default: one per core).
    #[command(hide = true)]
    ServeNative(engines::ServeArgs),
    /// Sample a running process (any server, e.g. another build's `fencelock
    /// serve` measured with `--url`) with perf for a while, and write its
    /// folded stacks and flamegraph as `--profile-server` does.
    ProfilePid(ProfilePidArgs),
    /// Issue 38: a 3-node group with N idle leases; a follower is wiped and
    /// added back empty, and catches up by snapshot while grants go on. Prints
    /// the time, the grants meanwhile and each node's memory, and writes
    /// catchup.md and catchup.json.
    Catchup(catchup::CatchupArgs),
}

#[derive(clap::Args, Debug)]
struct ProfilePidArgs {
    /// The process to sample.
    #[arg(long)]
    pid: u32,
    /// How long to sample.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Where the files go (`DIR/NAME.folded`, `DIR/NAME.svg`).
    #[arg(long)]
    dir: PathBuf,
    #[arg(long)]
    name: String,
    /// The flamegraph's title.
    #[arg(long)]
    title: String,
}

/// `profile-pid`: samples `a.pid` for `a.seconds`, then folds and draws.
fn profile_pid(a: ProfilePidArgs) -> anyhow::Result<()> {
    let recording = profile::Recording::start(a.pid, &a.dir, &a.name, &a.title)?;
    std::thread::sleep(std::time::Duration::from_secs_f64(a.seconds));
    recording.stop()?;
    println!("profile: {}", recording.finish()?.display());
    Ok(())
}

/// The `fencelock` binary's allocator (see its `main.rs`): `serve-native`
/// measures the server as it ships. The bench's clients use it too, for
/// every engine alike.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let (Some(Cmd::ServeNative(_)), Ok(n)) = (&args.cmd, std::env::var("FENCELOCK_BENCH_SERVER_THREADS")) {
        builder.worker_threads(n.parse()?);
    }
    let rt = builder.enable_all().build()?;
    match args.cmd {
        Some(Cmd::ServeNative(a)) => rt.block_on(engines::serve_native(a)),
        Some(Cmd::ProfilePid(a)) => profile_pid(a),
        Some(Cmd::Catchup(a)) => rt.block_on(catchup::run(a)),
        None => rt.block_on(bench(args)),
    }
}

async fn bench(args: Args) -> anyhow::Result<()> {
    let settings = Settings {
        seconds: args.seconds.unwrap_or(if args.quick { 1.0 } else { 5.0 }),
        warmup: if args.quick { 0.3 } else { 1.0 },
        runs: args.runs.unwrap_or(if args.quick { 1 } else { 3 }).max(1),
        ttl_ms: args.ttl_ms,
    };
    let started = procstat::command_line("date", &["-u", "+%Y-%m-%dT%H:%M:%SZ"]).unwrap_or_default();
    let out = args.out.clone().unwrap_or_else(|| match args.quick {
        true => PathBuf::from("target/bench-quick"),
        false => PathBuf::from(format!("bench/results/{}", started.get(..10).unwrap_or("undated"))),
    });
    let workloads: Vec<String> = args.workloads.iter().map(|w| w.to_uppercase()).collect();
    if workloads.iter().any(|w| w == "W6") {
        failover::elect_cli().context("before anything runs")?;
    }
    let given = given_urls(&args.urls)?;
    let data = tempfile::Builder::new().prefix("fencelock-bench").tempdir()?;
    let machine = procstat::machine(data.path());
    eprintln!(
        "machine: {} cores, {}, {} GiB, Linux {}, data on {}",
        machine.cores, machine.cpu, machine.memory_gib, machine.kernel, machine.data_fs
    );

    let mut servers = Servers::default();
    let mut engines = Vec::new();
    for id in &args.engines {
        eprintln!("starting {id}");
        let e = engines::start(id, given.get(id.as_str()).map(String::as_str), &mut servers, data.path()).await?;
        wait_ready(&e).await.with_context(|| format!("engine {id} at {}", e.url))?;
        engines.extend(engines::in_modes(e, args.client_mode));
    }

    let w1 = workloads.iter().any(|w| w == "W1");
    let w2 = workloads.iter().any(|w| w == "W2");
    let w3 = workloads.iter().any(|w| w == "W3");
    let w4 = workloads.iter().any(|w| w == "W4");
    let mut plan: Vec<(Workload, usize)> = Vec::new();
    if w1 {
        plan.extend(args.clients.iter().map(|&c| (Workload::Uncontended, c)));
    }
    if w2 {
        plan.push((Workload::Contended, args.contenders));
    }
    if workloads.iter().any(|w| w == "W5") {
        plan.extend([(Workload::ReadMostly, args.contenders), (Workload::Semaphore, args.contenders)]);
    }
    let mut able = Vec::new();
    for &(workload, _) in &plan {
        able.push(able_engines(&engines, workload).await);
    }
    let w6 = workloads.iter().any(|w| w == "W6");
    let electing: Vec<&Engine> = if w6 { electing(&engines).await } else { Vec::new() };
    let cell_runs: usize = able.iter().map(Vec::len).sum();
    let steps = cell_runs * settings.runs + usize::from(w3) * settings.runs + usize::from(w4) + electing.len();
    let bar = ProgressBar::new(steps as u64);
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}")?.progress_chars("=> "),
    );

    let mut cells = Vec::new();
    let mut run_no = 0;
    for (&(workload, clients), engines) in plan.iter().zip(&able) {
        let mut runs: Vec<Vec<model::RunResult>> = vec![Vec::new(); engines.len()];
        for run in 0..settings.runs {
            for k in 0..engines.len() {
                let i = (k + run) % engines.len(); // rotate the order every run
                let e = engines[i];
                bar.set_message(format!(
                    "{} C={clients} {} (run {}/{})",
                    workload.id(),
                    e.info.id,
                    run + 1,
                    settings.runs
                ));
                run_no += 1;
                let spec = run_spec(&settings, workload, clients, run_no);
                let r = workload::run(e, spec, None)
                    .await
                    .with_context(|| format!("{} with {clients} clients on {}", workload.id(), e.info.id))?;
                runs[i].push(r);
                bar.inc(1);
            }
        }
        if let Some(dir) = &args.profile_server {
            let largest = args.clients.iter().max().copied();
            if workload == Workload::Contended || Some(clients) == largest && workload == Workload::Uncontended {
                // A run number of its own: the counted runs' locks are not reused.
                let spec = run_spec(&settings, workload, clients, 1_000_000 + run_no);
                profile_cell(engines, spec, dir).await?;
            }
        }
        for (e, runs) in engines.iter().zip(runs) {
            let median = stats::median_run(&runs);
            cells.push(Cell {
                workload: workload.id().into(),
                engine: e.info.id.clone(),
                clients,
                locks: workload.locks(clients),
                runs,
                median,
            });
        }
    }

    let scale = if w3 {
        bar.set_message("W3 scale (native)");
        let leases = args.leases.unwrap_or(if args.quick { 20_000 } else { 1_000_000 });
        let renewing = args.renewing.unwrap_or(if args.quick { 1_000 } else { 10_000 });
        let secs = if args.quick { 2.0 } else { settings.seconds.max(10.0) };
        // Each run on a fresh server; the create time varies by a fifth from
        // run to run on a shared 2-core machine.
        let mut runs = Vec::with_capacity(settings.runs);
        for run in 0..settings.runs {
            let mut native = engines::NativeServer::start(&data.path().join(format!("w3-{run}")))?;
            runs.push(scale::run(&mut native, leases, renewing, Duration::from_secs_f64(secs)).await.context("W3")?);
            bar.inc(1);
        }
        stats::median_scale(runs)
    } else {
        None
    };
    let durability = if w4 {
        bar.set_message("W4 durability (native)");
        let mut native = engines::NativeServer::start(&data.path().join("w4"))?;
        let secs = if args.quick { 1.0 } else { settings.seconds };
        let d = durability::run(&mut native, 16, Duration::from_secs_f64(secs)).await.context("W4")?;
        bar.inc(1);
        Some(d)
    } else {
        None
    };
    let mut elections = Vec::new();
    let spec = failover::Spec {
        ttl: Duration::from_millis(args.election_ttl_ms),
        samples: args.election_samples.unwrap_or(if args.quick { 1 } else { 5 }).max(1),
    };
    for e in electing {
        bar.set_message(format!("W6 election fail-over {}", e.info.id));
        elections.extend(failover::run(e, spec).await.with_context(|| format!("W6 on {}", e.info.id))?);
        bar.inc(1);
    }
    bar.finish_with_message("done");
    drop(servers);

    let mut report = Report {
        started,
        mode: if args.quick { "quick" } else { "full" }.into(),
        command: fencelock_testkit::cmdline::this_command(),
        machine,
        settings,
        engines: engines.iter().map(|e| e.info.clone()).collect(),
        cells,
        scale,
        durability,
        elections,
        targets: Vec::new(),
    };
    report.targets = report::targets(&report);
    write(&report, &out)
}

fn run_spec(settings: &Settings, workload: Workload, clients: usize, run_no: usize) -> RunSpec {
    RunSpec {
        workload,
        clients,
        warmup: Duration::from_secs_f64(settings.warmup),
        measure: Duration::from_secs_f64(settings.seconds),
        ttl: Duration::from_millis(settings.ttl_ms),
        run_no,
    }
}

/// One uncounted run of `spec` on each native single node among `engines`
/// (per process and shared), with perf sampling the server (see `profile.rs`).
async fn profile_cell(engines: &[&Engine], spec: RunSpec, dir: &Path) -> anyhow::Result<()> {
    for e in engines.iter().filter(|e| e.info.id.split('/').next() == Some("fencelock")) {
        let target = profile::Target {
            dir: dir.to_path_buf(),
            name: profile::name(spec.workload.id(), spec.clients, &e.info.id),
            title: format!(
                "fencelock server, {} with {} clients, engine {}",
                spec.workload.id(),
                spec.clients,
                e.info.id
            ),
        };
        workload::run(e, spec, Some(&target)).await.with_context(|| format!("profile {}", target.name))?;
    }
    Ok(())
}

/// The results, as markdown (also printed), JSON and charts in `out`.
fn write(report: &Report, out: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("create {}", out.display()))?;
    let md = report::markdown(report);
    println!("{md}");
    std::fs::write(out.join("results.md"), &md)?;
    std::fs::write(out.join("results.json"), serde_json::to_string_pretty(report)?)?;
    let charts = chart::draw(report, out)?;
    eprintln!("wrote {} ({} charts)", out.display(), charts.len());
    Ok(())
}

fn given_urls(urls: &[String]) -> anyhow::Result<HashMap<&str, String>> {
    urls.iter()
        .map(|u| match u.split_once('=') {
            Some((id, url)) if engines::ALL.contains(&id) => Ok((id, url.to_string())),
            _ => bail!("--url wants ID=URL with ID one of {}; got {u:?}", engines::ALL.join(", ")),
        })
        .collect()
}

/// The engines that can run `workload` (W5 needs shared locks or
/// semaphores; the seeds' Redis recipe, `engines::SETNX`, has neither).
async fn able_engines(engines: &[Engine], workload: Workload) -> Vec<&Engine> {
    let mut out = Vec::new();
    for e in engines {
        if matches!(workload, Workload::Uncontended | Workload::Contended) {
            out.push(e);
            continue;
        }
        if engines::is_setnx(&e.info.id) {
            continue;
        }
        match fencelock::connect(&e.url).await {
            Ok(b) if workload.runs_on(&b.capabilities()) => out.push(e),
            Ok(_) => eprintln!("{}: {} does not declare it; skipped", workload.id(), e.info.id),
            Err(err) => eprintln!("{}: {} cannot be reached ({err}); skipped", workload.id(), e.info.id),
        }
    }
    out
}

/// The engines whose backend declares leader election (W6 runs on those),
/// each server once (the seeds' Redis recipe, `engines::SETNX`, is not a
/// backend: it elects nothing).
async fn electing(engines: &[Engine]) -> Vec<&Engine> {
    let mut out: Vec<&Engine> = Vec::new();
    for e in engines {
        if out.iter().any(|o| o.url == e.url) || engines::is_setnx(&e.info.id) {
            continue;
        }
        match fencelock::connect(&e.url).await {
            Ok(b) if b.capabilities().election => out.push(e),
            Ok(_) => eprintln!("W6: {} has no leader election; skipped", e.info.id),
            Err(err) => eprintln!("W6: {} cannot be reached ({err}); skipped", e.info.id),
        }
    }
    out
}

/// Waits (up to 30 s) until one acquire + release goes through.
async fn wait_ready(e: &Engine) -> anyhow::Result<()> {
    let spec = RunSpec {
        workload: Workload::Uncontended,
        clients: 1,
        warmup: Duration::ZERO,
        measure: Duration::from_millis(200),
        ttl: Duration::from_secs(10),
        run_no: 0,
    };
    let mut last = None;
    for _ in 0..60 {
        match workload::run(e, spec, None).await {
            Ok(r) if r.cycles > 0 => return Ok(()),
            Ok(_) => last = Some(anyhow::anyhow!("no cycle completed")),
            Err(err) => last = Some(err),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Err(last.unwrap_or_else(|| anyhow::anyhow!("not ready")))
}
