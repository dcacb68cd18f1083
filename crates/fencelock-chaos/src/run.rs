//! One run: start the lock service, the fenced storage server, the proxies and
//! the workers; let the nemesis inject the scenario's faults for the duration;
//! heal everything; read the final object and the storage's audit log; check.
//!
//! Layout of `spec.out`: `history/*.jsonl` (one file per worker, `harness.jsonl`
//! for the nemesis's notes), `lock-server.log` (a group: `node1.log`…),
//! `storage.log`, `workers.log`, `verdict.json`; under TLS and auth, the
//! service's audit logs `lock-audit.log` (`node1-audit.log`…) and the
//! certificates and auth file in the run's temp dir.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use fencelock::backend::Capabilities;
use fencelock_testkit::proxy::{Mode, Proxy};

use crate::checker::{self, RunInfo, Verdict};
use crate::ctx::{lock_url, Ctx};
use crate::faketime;
use crate::history::{self, Event, Op, Writer};
use crate::http;
use crate::nemesis;
use crate::observers::{HolderPolls, Observers};
use crate::procs::{free_addr, storage_server};
use crate::scenario::{multi_name, non_default_log, Mutant, RunSpec, Scenario, LOCK};
use crate::secure::Secure;
use crate::targets::{Clients, Target};
use crate::worker_control::{Program, Workers};
use crate::worker_process::{entries, WorkerArgs};

/// Election mode: how many observers follow the election.
const OBSERVERS: usize = 2;
pub const KEY: &str = "chaos-object";

/// Runs `spec` and returns its verdict (also written to `verdict.json`).
pub async fn run(spec: RunSpec) -> anyhow::Result<Verdict> {
    if let Some(why) = spec.scenario.unsupported(&spec.backend) {
        anyhow::bail!("{} against {}: not applicable: {why}", spec.scenario, spec.backend);
    }
    let hist_dir = spec.out.join("history");
    // Histories are appended to (a restarted worker goes on in its file): a
    // run again into the same directory starts from none, or the checks
    // would judge both runs as one (tokens "repeat" from the first).
    if hist_dir.exists() {
        std::fs::remove_dir_all(&hist_dir).with_context(|| format!("clear {}", hist_dir.display()))?;
    }
    std::fs::create_dir_all(&hist_dir).with_context(|| format!("create {}", hist_dir.display()))?;
    let data = tempfile::Builder::new().prefix("fencelock-chaos-").tempdir()?;
    if spec.tls {
        if let Some(why) = spec.scenario.unsupported_with_tls(&spec.backend) {
            anyhow::bail!("{} against {} with --tls: not applicable: {why}", spec.scenario, spec.backend);
        }
    }
    let secure = match spec.tls || spec.scenario.needs_tls() {
        true => Some(Secure::create(&data.path().join("tls"))?),
        false => None,
    };
    let serve_args = ["--log".to_string(), spec.log.to_string()];
    let target =
        Target::start(&spec.backend, &spec.out, server_env(&spec, data.path())?, &serve_args, secure.as_ref()).await?;
    let caps = capabilities(&lock_url(&target, secure.as_ref(), None)).await?;
    if spec.shared && !caps.shared {
        anyhow::bail!("{} does not declare read-write locks (Capabilities::shared): no shared mode", spec.backend);
    }
    if spec.permits > 0 && !caps.semaphores {
        anyhow::bail!("{} does not declare semaphores (Capabilities::semaphores): no semaphore mode", spec.backend);
    }
    if spec.multi > 0 && !caps.multi_lock {
        anyhow::bail!("{} does not declare atomic multi-locks (Capabilities::multi_lock): no multi mode", spec.backend);
    }
    let ttl = spec.ttl.max(caps.min_ttl);
    let storage_addr = free_addr();
    let unfenced = spec.mutant == Some(Mutant::FencingOff);
    let mut storage =
        storage_server(&data.path().join("storage"), storage_addr, unfenced, spec.out.join("storage.log"));
    storage.start().await?;
    let (lock_proxies, storage_proxies, args) =
        wire_workers(&spec, &target, secure.as_ref(), storage_addr, ttl, &hist_dir).await;
    let program = worker_program(&spec, &target)?;
    let workers = Workers::start(&program, args, &worker_envs(&spec)?, &spec.out.join("workers.log")).await?;
    let observers = match spec.election {
        true => Some(Observers::start(OBSERVERS, &lock_url(&target, secure.as_ref(), None), LOCK, &hist_dir)?),
        false => None,
    };
    let holder_polls = match polls_holders(&spec, &target) {
        true => Some(HolderPolls::start(&lock_url(&target, secure.as_ref(), None), LOCK, &hist_dir)?),
        false => None,
    };
    let notes = Writer::create(&hist_dir.join("harness.jsonl"))?;
    let rng = fastrand::Rng::with_seed(spec.seed);
    let end = tokio::time::Instant::now() + spec.duration;
    let mut info = run_info(&spec, &caps, ttl);
    info.polls_holders = holder_polls.is_some();
    let mut ctx = Ctx {
        spec,
        rng,
        ttl,
        target,
        storage,
        storage_addr,
        workers,
        observers,
        holder_polls,
        lock_proxies,
        storage_proxies,
        notes,
        data,
        secure,
        end,
    };
    tracing::info!(scenario = %ctx.spec.scenario, backend = %ctx.spec.backend, seed = ctx.spec.seed, "run started");
    nemesis::run(&mut ctx).await?;
    finish(&mut ctx, &info).await
}

/// Whether the run polls its lock's holders (R2): shared or semaphore mode against
/// fencelock's own server, whose `describe` lists every holder.
fn polls_holders(spec: &RunSpec, target: &Target) -> bool {
    (spec.shared || spec.permits > 0) && matches!(target, Target::Native { .. } | Target::Cluster(_))
}

/// Environment of the native server for this run's faults and mutant.
fn server_env(spec: &RunSpec, data: &Path) -> anyhow::Result<Vec<(String, String)>> {
    let mut env = vec![("RUST_LOG".to_string(), "warn".to_string())];
    match spec.mutant {
        Some(Mutant::MemoryToken) => env.push(("FENCELOCK_MUTANT".into(), "memory-token".into())),
        Some(Mutant::DeadWaiter) => env.push(("FENCELOCK_MUTANT".into(), "dead-waiter".into())),
        Some(Mutant::WalNoSync) => env.push(("FENCELOCK_MUTANT".into(), "wal-no-sync".into())),
        _ => {}
    }
    match spec.scenario {
        Scenario::K3 => {
            let file = data.join("clock");
            let _ = std::fs::write(&file, "rate=1 jump_ms=0\n");
            env.push(("FENCELOCK_FAULT_CLOCK".into(), file.display().to_string()));
            env.extend(faketime::wall_jumps(&data.join(nemesis::WALL_OFFSET_FILE))?);
        }
        Scenario::S5 => env.push(("FENCELOCK_POWER_LOSS_SHIM".into(), "1".into())),
        _ => {}
    }
    Ok(env)
}

/// Extra environment per worker: under K3, one client whose clocks run slow
/// and one whose clocks run fast (libfaketime).
fn worker_envs(spec: &RunSpec) -> anyhow::Result<Vec<Vec<(String, String)>>> {
    let mut envs = vec![Vec::new(); spec.workers as usize];
    if spec.scenario == Scenario::K3 {
        for (w, rate) in [(nemesis::SLOW_WORKER, nemesis::SLOW_RATE), (nemesis::FAST_WORKER, nemesis::FAST_RATE)] {
            if let Some(env) = envs.get_mut(w) {
                *env = faketime::rate(rate)?;
            }
        }
    }
    Ok(envs)
}

/// What the workers run: the Python worker against `fencelock-py` (plain
/// locks only: its script takes no mode), else the harness's own.
fn worker_program(spec: &RunSpec, target: &Target) -> anyhow::Result<Program> {
    let Target::Native { clients: Clients::Python, .. } = target else { return Ok(Program::Native) };
    if spec.election || spec.shared || spec.permits > 0 || spec.multi > 0 || spec.mutant.is_some() {
        anyhow::bail!("the Python workers take plain locks: no election, shared, semaphore, multi or mutant mode");
    }
    Ok(Program::Python(spec.python.clone()))
}

async fn capabilities(url: &str) -> anyhow::Result<Capabilities> {
    let b = fencelock::backend::connect(url).await.with_context(|| format!("connect to {url}"))?;
    Ok(b.capabilities())
}

/// One proxy to the lock service (where it has one address) and one to the
/// storage per worker, and each worker's arguments.
async fn wire_workers(
    spec: &RunSpec,
    target: &Target,
    secure: Option<&Secure>,
    storage: std::net::SocketAddr,
    ttl: Duration,
    hist: &Path,
) -> (Vec<Proxy>, Vec<Proxy>, Vec<WorkerArgs>) {
    let (mut lock_proxies, mut storage_proxies, mut args) = (Vec::new(), Vec::new(), Vec::new());
    for id in 0..spec.workers {
        let lock_url = match target.upstream() {
            Some(up) => {
                let p = Proxy::start(up).await;
                let url = lock_url(target, secure, Some(p.addr()));
                lock_proxies.push(p);
                url
            }
            None => lock_url(target, secure, None),
        };
        let sp = Proxy::start(storage).await;
        args.push(WorkerArgs {
            id,
            lock_url,
            storage: sp.addr(),
            lock: LOCK.into(),
            key: object_key(spec, id),
            ttl_ms: ttl.as_millis() as u64,
            wait_ms: (ttl * 10).as_millis() as u64,
            history: hist.join(format!("w{id}.jsonl")),
            hold_ms: 20,
            election: spec.election,
            shared: spec.shared,
            unfenced_reads: spec.mutant == Some(Mutant::ReadsUnfenced),
            permits: spec.permits,
            multi: spec.multi,
            seed: spec.seed,
            multi_one_by_one: spec.mutant == Some(Mutant::MultiOneByOne),
        });
        storage_proxies.push(sp);
    }
    (lock_proxies, storage_proxies, args)
}

/// Worker `id`'s object: the run's one object, or in semaphore mode its own
/// (in multi mode, the base of its locks' objects' names).
fn object_key(spec: &RunSpec, id: u32) -> String {
    match spec.permits {
        0 => KEY.into(),
        _ => format!("{KEY}-w{id}"),
    }
}

/// Every object of the run, read at the end: the workers' (multi mode: the locks').
fn object_keys(spec: &RunSpec) -> std::collections::BTreeSet<String> {
    match spec.multi {
        0 => (0..spec.workers).map(|id| object_key(spec, id)).collect(),
        k => (0..k).map(|i| multi_name(KEY, i)).collect(),
    }
}

fn run_info(spec: &RunSpec, caps: &Capabilities, ttl: Duration) -> RunInfo {
    let ttl_ms = ttl.as_millis() as u64;
    // S6: a new grant and write within 2 × TTL of the fault's end; clients
    // that lost their connection to a restarted server also need their
    // reconnect back-off (up to 1 s) and the new leader's start.
    // In a group: an election (150–300 ms once a follower notices), the new
    // leader's first entry, and clients finding it (a cut-off old leader
    // tells them after four election timeouts).
    let allowance = match spec.scenario {
        Scenario::L1 | Scenario::L2 | Scenario::L3 => 3_000,
        s if s.restarts() => 1_500,
        _ => 500,
    };
    RunInfo {
        scenario: spec.scenario.to_string(),
        backend: backend_label(spec),
        mutant: spec.mutant.map(|m| m.name().to_string()),
        seed: spec.seed,
        duration_ms: spec.duration.as_millis() as u64,
        workers: spec.workers,
        fencing: caps.fencing != fencelock::backend::Fencing::None,
        durable_tokens: caps.durable_tokens,
        ttl_ms,
        heal_bound_ms: 2 * ttl_ms + allowance,
        heal_slack_ms: spec.heal_slack.as_millis() as u64,
        // In semaphore mode each worker owns its object: a paused holder's
        // late write follows its own earlier writes, and the fence rightly
        // takes it; what the faults test there is that permits return (S6, R2).
        min_stale_rejects: if spec.permits > 0 { 0 } else { spec.scenario.min_stale_rejects() },
        required_evidence: spec.scenario.required_evidence(),
        object_key: KEY.into(),
        election: spec.election,
        shared: spec.shared,
        permits: spec.permits,
        polls_holders: false,
        multi: spec.multi,
        lock: LOCK.into(),
    }
}

/// The backend as the report names it: a run under TLS and auth (P2 always
/// is), an election run, a shared run, a semaphore run and a multi run get
/// rows of their own.
fn backend_label(spec: &RunSpec) -> String {
    let mut modes = Vec::new();
    if spec.tls && !spec.scenario.needs_tls() {
        modes.push("TLS, auth".to_string());
    }
    if spec.election {
        modes.push("election".to_string());
    }
    if spec.shared {
        modes.push("shared".to_string());
    }
    if spec.permits > 0 {
        modes.push(format!("semaphore of {}", spec.permits));
    }
    if let Some(log) = non_default_log(spec.log) {
        modes.push(format!("{log} log"));
    }
    if spec.multi > 0 {
        modes.push(format!("multi-lock of {}", spec.multi));
    }
    match modes.is_empty() {
        true => spec.backend.clone(),
        false => format!("{} ({})", spec.backend, modes.join(", ")),
    }
}

/// Heal, let the workers show S6, stop them, read the final state, check.
async fn finish(ctx: &mut Ctx, info: &RunInfo) -> anyhow::Result<Verdict> {
    nemesis::heal_all(ctx).await?;
    tokio::time::sleep(Duration::from_millis(info.heal_bound_ms)).await;
    // Before the workers stop: their leases' revocations at exit are not
    // counted among the grants revoked during the run.
    let revoked = nemesis::revoked_grants(ctx).await;
    let killed = ctx.workers.stop(Duration::from_secs(15)).await;
    if let Some(o) = ctx.observers.take() {
        o.stop().await;
    }
    if let Some(o) = ctx.holder_polls.take() {
        o.stop().await;
    }
    if killed > 0 {
        tracing::warn!(killed, "workers did not stop by themselves");
    }
    if ctx.spec.scenario == Scenario::S4 {
        nemesis::note_server_stats(ctx, revoked).await;
    }
    if ctx.secure.is_some() {
        // The nodes write their audit lines out every second.
        tokio::time::sleep(Duration::from_millis(1_200)).await;
        let note = crate::secure::audit_note(&ctx.spec.out);
        ctx.note(note);
    }
    for key in object_keys(&ctx.spec) {
        let value = final_value(ctx.storage_addr, &key).await?;
        ctx.note(Event { value: Some(value), target: Some(key), ..Event::note("harness", Op::FinalRead) });
    }
    let audit = audit_log(ctx.storage_addr).await?;
    let events = history::read_dir(&ctx.spec.out.join("history"))?;
    let verdict = checker::check(info, &events, &audit);
    let path = ctx.spec.out.join("verdict.json");
    std::fs::write(&path, serde_json::to_vec_pretty(&verdict)?).with_context(|| format!("write {}", path.display()))?;
    for p in ctx.lock_proxies.iter().chain(&ctx.storage_proxies) {
        p.set_mode(Mode::Pass);
    }
    Ok(verdict)
}

async fn final_value(storage: std::net::SocketAddr, key: &str) -> anyhow::Result<Vec<String>> {
    let r = http::request(storage, "GET", &format!("/objects/{key}"), &[], b"", Duration::from_secs(10)).await?;
    match r.status {
        200 => Ok(entries(&r.body)),
        404 => Ok(Vec::new()),
        s => anyhow::bail!("final read: {s} {}", r.text()),
    }
}

async fn audit_log(storage: std::net::SocketAddr) -> anyhow::Result<Vec<fencelock_fence::storage::AuditEntry>> {
    let r = http::request(storage, "GET", "/log", &[], b"", Duration::from_secs(30)).await?;
    anyhow::ensure!(r.status == 200, "audit log: {} {}", r.status, r.text());
    r.text()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).with_context(|| format!("audit line {l:?}")))
        .collect()
}
