//! `catchup` (issue 38): a group of 3 native nodes holding N idle leases, one
//! follower wiped and added back empty, catching up by a snapshot (the
//! leader's log purged behind it) while grants go on; how long it takes, how
//! the grants fare meanwhile, and each node's memory.
//!
//! Where it sits: a subcommand of `main` of its own, not a workload cell. It
//! starts its group ([`NativeCluster`], real `serve-native` processes),
//! creates the leases with W3's creator ([`scale::create_idle`], through the
//! leader), changes the membership through the nodes' admin HTTP API
//! (`DELETE` and `POST /v1/cluster/members`, as `fencelock cluster remove/add`
//! does), asks the leader for a snapshot and a log purge over the bench's
//! control channel ([`Control::Snapshot`]: the server has no outside way to
//! ask for either), reads applied indexes from `/healthz`, the state's size
//! from `/metrics`, memory from `/proc` ([`procstat`]), and writes
//! `catchup.md` and `catchup.json`.
//!
//! The run, in order: create the leases (in rounds, until the leader holds
//! N locks: creates the server answered "not the leader" are made again);
//! wait until every node applied them; start the grant clients (acquire →
//! release, each on a lock of its own, through the group's URL); kill a
//! follower (one left behind, if any: the group's quorum must not rest on
//! it), delete its data dir and remove it from the group; reset the
//! survivors' peak memory; snapshot and purge on the leader; start the wiped
//! node empty (`--join`) on its old ports; add it back (the server makes it a
//! learner, waits until it caught up, then a voter); poll until its applied
//! index reaches the survivors', then until it votes; stop the grants and
//! compare its state with the leader's. With `--kill-leader`, before the
//! grants stop: kill the leader, time until another node leads and serves
//! and until a grant client is served again, then start the killed node on
//! its data and time until it caught up. Every wait is bounded. A catch-up
//! that does not finish within `--catchup-limit` is written down as such,
//! then the run fails; any other error ends it at once. On any end, SIGINT
//! and SIGTERM included, the nodes are killed and the temp dir removed.

use std::{
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use anyhow::{bail, Context};
use fencelock::{LockOptions, Outcome};
use serde::Serialize;
use std::fmt::Write as _;

use crate::{
    admin::http_get,
    engines::{Control, NativeCluster},
    model::Machine,
    procstat,
    report::thousands,
    scale::{self, ServerCounters},
};

/// `catchup`'s options.
#[derive(clap::Args, Debug)]
pub struct CatchupArgs {
    /// Idle leases to create, each holding a lock of its own (1 h TTL, never renewed).
    #[arg(long)]
    pub leases: u64,
    /// Directory for catchup.md and catchup.json
    /// [default: bench/results/YYYY-MM-DD-catchup (UTC)].
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Where the nodes keep their data (DIR/catchup-group, which must not
    /// exist; kept afterwards) [default: a temp dir, deleted at the end].
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Clients doing acquire → release cycles, each on a lock of its own,
    /// from before the wipe until the wiped node votes again.
    #[arg(long, default_value_t = 4)]
    pub grant_clients: usize,
    /// How long the wiped node may take, from being added back, to reach the
    /// survivors' applied index and vote again; longer ends the run with an error.
    #[arg(long, default_value = "20m", value_parser = fencelock_http::parse_duration)]
    pub catchup_limit: Duration,
    /// Sessions that create the leases, 256 creates in flight on each (W3's
    /// 16 by default; fewer put less on the group at once).
    #[arg(long, default_value_t = scale::SESSIONS)]
    pub create_sessions: usize,
    /// How long creating the leases (and every node applying them) may take.
    #[arg(long, default_value = "1h", value_parser = fencelock_http::parse_duration)]
    pub create_limit: Duration,
    /// After the catch-up, kill the leader (SIGKILL) while the grants go on,
    /// and measure until another node leads and serves, until the grant
    /// clients are served again, and until the killed node, started again
    /// on its data, has caught up.
    #[arg(long)]
    pub kill_leader: bool,
}

/// A grant client's lease TTL (it renews itself while it holds; it never holds long).
const GRANT_TTL: Duration = Duration::from_secs(10);
/// A grant cycle that takes longer than this counts as an error.
const CYCLE_LIMIT: Duration = Duration::from_secs(30);
/// How often the applied indexes are polled while the wiped node catches up.
const POLL_EVERY: Duration = Duration::from_millis(100);
/// How long, once the creates are done, the followers may take to apply them
/// before one that has not is taken for stuck (and is the one wiped)...
const APPLY_LIMIT: Duration = Duration::from_secs(300);
/// ...or how long no node's applied index may stand still meanwhile.
const APPLY_STALL: Duration = Duration::from_secs(20);
/// Rounds of creates at most (see [`CreateFigures::rounds`]).
const CREATE_ROUNDS: usize = 3;
/// How long removing the wiped node from the group may take.
const REMOVE_LIMIT: Duration = Duration::from_secs(180);
/// How long the group may take to settle (every node at one applied index,
/// the same state) once the grants stopped.
const SETTLE_LIMIT: Duration = Duration::from_secs(60);

/// Everything `catchup` measured: `catchup.json`.
#[derive(Debug, Serialize)]
struct CatchupReport {
    /// UTC start of the run.
    started: String,
    command: String,
    machine: Machine,
    /// The nodes' configuration, in one line.
    config: String,
    leases: u64,
    create: CreateFigures,
    /// Node ids: the leader that took the snapshot, and the follower that was wiped.
    leader: u64,
    wiped: u64,
    /// How long `DELETE /v1/cluster/members/ID` took to answer 200.
    remove_seconds: f64,
    terms: Terms,
    snapshot: SnapshotFigures,
    catch_up: CatchUpFigures,
    grant_clients: usize,
    grants: Vec<GrantPhase>,
    nodes: Vec<NodeMemory>,
    /// `None` when the wiped node did not catch up.
    state: Option<StateCheck>,
    /// With `--kill-leader` (and a catch-up that finished).
    leader_change: Option<LeaderChange>,
}

/// The leader killed after the catch-up, with every lease still live.
#[derive(Debug, Serialize)]
struct LeaderChange {
    killed: u64,
    new_leader: u64,
    term_before: u64,
    term_after: u64,
    /// From the SIGKILL until another node answered `/healthz` 200: it leads,
    /// and its first entry (`LeaderStart`, which gives every lease a fresh
    /// TTL) is applied, so it serves.
    serving_seconds: f64,
    /// From the SIGKILL until a grant client's next cycle was acknowledged.
    first_grant_seconds: f64,
    /// From the killed node's start on its own data (reading its snapshot and
    /// log included) until its applied index reached the others' (it comes
    /// back by log or by snapshot).
    rejoin_seconds: f64,
    rejoined: bool,
}

/// The Raft term at four points: a term that grew means an election (the
/// leader's heartbeats were late on a loaded machine, or it lost its majority).
#[derive(Debug, Default, Serialize)]
struct Terms {
    at_start: u64,
    after_create: u64,
    after_remove: u64,
    at_end: u64,
}

#[derive(Debug, Serialize)]
struct CreateFigures {
    /// The rounds of creates: the first asks for every lease, each next one
    /// for the held locks still missing (creates that failed), up to
    /// [`CREATE_ROUNDS`].
    rounds: Vec<CreateRound>,
    /// Sessions, [`scale::WINDOW`] creates in flight on each.
    sessions: usize,
    /// The rounds' creating time, summed (W3's measure, round by round).
    seconds: f64,
    creates_per_sec: f64,
    /// Until every node had applied them; `None`: one had not (within
    /// [`APPLY_LIMIT`], or it stopped moving for [`APPLY_STALL`]; it is the
    /// one wiped).
    applied_everywhere_seconds: Option<f64>,
    /// Each node's applied index then (node id `i + 1` at `i`).
    applied: Vec<u64>,
    /// The leader's `fencelock_active_leases` and `fencelock_held_locks` then.
    active_leases: u64,
    held_locks: u64,
}

/// One round of creates, through the node that led when it began.
#[derive(Debug, Serialize)]
struct CreateRound {
    leader: u64,
    leases: u64,
    /// From the first create sent to the last acknowledged.
    seconds: f64,
    failures: u64,
    first_error: Option<String>,
    /// Leases not asked for: the round gave up after failures in a row.
    not_asked: u64,
}

#[derive(Debug, Serialize)]
struct SnapshotFigures {
    /// The leader's applied index when asked, the snapshot's last index, and
    /// how far its log was purged.
    applied_when_asked: Option<u64>,
    index: u64,
    purged: Option<u64>,
    build_seconds: f64,
    purge_seconds: f64,
    /// The leader's `snap/` directory after it.
    bytes: u64,
    files: usize,
}

#[derive(Debug, Serialize)]
struct CatchUpFigures {
    /// Whether it caught up within `--catchup-limit`.
    finished: bool,
    /// From the add (`POST /v1/cluster/members`) until the wiped node's applied
    /// index reached the survivors' highest one read just before (or the limit).
    seconds: f64,
    /// From the add until the node was a voter again (the add answered 200).
    voter_seconds: Option<f64>,
    /// Adds it took (the server gives up waiting for a learner after 60 s;
    /// the node is then added again once it caught up).
    add_tries: u32,
    /// The first add's answer, when it was not 200.
    first_add_answer: Option<String>,
    /// The survivors' applied index it had to reach, and what it had applied
    /// then (at the limit, if it did not get there).
    target_index: u64,
    applied_at_catch_up: Option<u64>,
    /// Snapshot streams it began receiving (one when the first one goes
    /// through; more when the leader gave one up and sent it again).
    snapshot_streams: u64,
    /// Its Raft state at the end: the snapshot it installed, its log's start.
    installed_snapshot: Option<u64>,
    purged: Option<u64>,
    /// Its `snap/` directory at the end.
    snapshot_bytes: u64,
}

/// The grant clients' figures over one phase of the run.
#[derive(Debug, Clone, Serialize, PartialEq)]
struct GrantPhase {
    phase: String,
    seconds: f64,
    cycles: u64,
    errors: u64,
    /// The longest time no client had a grant acknowledged, within the phase
    /// (a gap open at its end counts up to its end; one that spans phases
    /// counts whole in the later one).
    longest_gap_ms: f64,
    first_error: Option<String>,
}

/// One node's resident memory (bytes).
#[derive(Debug, Serialize)]
struct NodeMemory {
    id: u64,
    role: String,
    /// Once every node applied the leases, and its peak (`VmHWM`) until then.
    rss_after_create: u64,
    peak_through_create: u64,
    /// Just before the snapshot (a survivor, whose peak is reset then), or
    /// just after it started empty (the wiped node, a new process).
    rss_before: u64,
    /// At the end, and the peak since `rss_before` (`None`: the peak could
    /// not be reset; the peak since it started is in `peak_since_start`).
    rss_after: u64,
    peak_during: Option<u64>,
    peak_since_start: u64,
}

/// The wiped node's state against the leader's (another node's, when the
/// wiped one leads; see [`compared_with`]), once both applied the same index.
#[derive(Debug, Serialize)]
struct StateCheck {
    applied: u64,
    /// The node compared with (see [`compared_with`]); its figures are `leader`.
    node: u64,
    leader: EngineState,
    wiped: EngineState,
    /// Leases, held locks and token counter all equal (INV-2: the token
    /// counter must never go back on a node).
    equal: bool,
}

/// A node's engine, as [`Control::State`] reads it.
#[derive(Debug, Serialize)]
struct EngineState {
    /// The index the figures are of (`None`: one was applied while they were read).
    applied: Option<u64>,
    leases: u64,
    held_locks: u64,
    token_counter: u64,
}

/// `catchup`: the run described in the module's documentation.
pub async fn run(a: CatchupArgs) -> anyhow::Result<()> {
    if a.leases == 0 || a.grant_clients == 0 || a.create_sessions == 0 {
        bail!("--leases, --grant-clients and --create-sessions must be at least 1");
    }
    let started = procstat::command_line("date", &["-u", "+%Y-%m-%dT%H:%M:%SZ"]).unwrap_or_default();
    let out = a
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("bench/results/{}-catchup", started.get(..10).unwrap_or("undated"))));
    let temp = tempfile::Builder::new().prefix("fencelock-catchup").tempdir()?;
    let base = a.data_dir.clone().unwrap_or_else(|| temp.path().to_path_buf());
    let dir = base.join("catchup-group");
    if dir.exists() {
        bail!("{} exists: give a --data-dir without a catchup-group in it", dir.display());
    }
    std::fs::create_dir_all(&base).with_context(|| format!("create {}", base.display()))?;
    let machine = procstat::machine(&base);
    eprintln!(
        "catchup: machine: {} cores, {}, {} GiB, Linux {}, data on {}",
        machine.cores, machine.cpu, machine.memory_gib, machine.kernel, machine.data_fs
    );
    let mut cluster = NativeCluster::start(&dir, 3).await?;
    // Interrupted, it returns: the nodes are killed and the temp dir removed.
    let report = tokio::select! {
        r = measure(&a, &mut cluster, started, machine) => r?,
        s = interrupted() => bail!("interrupted by {s}"),
    };
    drop(cluster);
    write(&report, &out)?;
    if !report.catch_up.finished {
        bail!(
            "node {} did not catch up within {:?} (it began receiving a snapshot {} time(s)); what was measured \
             is in {}",
            report.wiped,
            a.catchup_limit,
            report.catch_up.snapshot_streams,
            out.display()
        );
    }
    Ok(())
}

/// Resolves on SIGINT or SIGTERM (never, if they cannot be watched): its name.
async fn interrupted() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    match (signal(SignalKind::interrupt()), signal(SignalKind::terminate())) {
        (Ok(mut int), Ok(mut term)) => tokio::select! {
            _ = int.recv() => "SIGINT",
            _ = term.recv() => "SIGTERM",
        },
        _ => std::future::pending().await,
    }
}

/// Everything from the group up to the report (the group is dropped by the caller).
async fn measure(
    a: &CatchupArgs,
    cluster: &mut NativeCluster,
    started: String,
    machine: Machine,
) -> anyhow::Result<CatchupReport> {
    let first_leader = cluster.leader(Duration::from_secs(30)).await?;
    let mut terms = Terms { at_start: term(cluster, first_leader).await?, ..Terms::default() };
    let create = create(cluster, a.leases, a.create_sessions, a.create_limit).await?;
    let mut memory = memory_after_create(cluster)?;
    // Leadership may have moved while the leases were created.
    let leader = cluster.leader(Duration::from_secs(30)).await?;
    terms.after_create = term(cluster, leader).await?;

    let grants = GrantLoad::start(&cluster.url(), a.grant_clients).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let applied: Vec<u64> = match all_equal(&create.applied) {
        true => create.applied.clone(),
        false => applied_everywhere(cluster, Duration::ZERO).await?,
    };
    let wiped = pick_wiped(leader, &applied)?;
    let remove_seconds = remove_and_wipe(cluster, leader, wiped).await?;
    let reset = reset_peaks(cluster, wiped, &mut memory);
    // The survivors may have elected another leader meanwhile: the one now takes the snapshot.
    let leader = cluster.leader(Duration::from_secs(30)).await?;
    terms.after_remove = term(cluster, leader).await?;
    let snapshot = snapshot(cluster, leader).await?;
    cluster.start_empty(wiped)?;
    memory[wiped as usize - 1].rss_before = memory_of(cluster.node_mut(wiped)?.pid())?.0;
    let mut phases = vec![grants.phase("kill, wipe, remove, snapshot, restart empty")];

    let mut catch_up = catch_up(cluster, leader, wiped, a.catchup_limit, &grants, &mut phases).await?;
    let leader_change = match a.kill_leader && catch_up.finished {
        true => Some(kill_leader(cluster, a.catchup_limit, &grants, &mut phases).await?),
        false => None,
    };
    grants.stop().await;
    let end_leader = cluster.leader(Duration::from_secs(30)).await?;
    terms.at_end = term(cluster, end_leader).await?;
    let state = match catch_up.finished {
        true => Some(settle_and_compare(cluster, compared_with(end_leader, wiped), wiped).await?),
        false => None,
    };
    installed(cluster, wiped, &mut catch_up)?;
    memory_at_end(cluster, wiped, &reset, &mut memory)?;
    for m in &mut memory {
        m.role = match m.id {
            id if id == wiped => "wiped, added back".into(),
            id if id == end_leader => "leader".into(),
            _ => "follower".into(),
        };
    }
    Ok(CatchupReport {
        started,
        command: fencelock_testkit::cmdline::this_command(),
        machine,
        config: crate::engines::native_config("each of 3 nodes"),
        leases: a.leases,
        create,
        leader,
        wiped,
        remove_seconds,
        terms,
        snapshot,
        catch_up,
        grant_clients: a.grant_clients,
        grants: phases,
        nodes: memory,
        state,
        leader_change,
    })
}

/// Kills the leader while the grants go on; measures until another node
/// serves, until a grant client is served, and until the killed node,
/// started again on its data, caught up with the others (within `limit`).
async fn kill_leader(
    cluster: &mut NativeCluster,
    limit: Duration,
    grants: &GrantLoad,
    phases: &mut Vec<GrantPhase>,
) -> anyhow::Result<LeaderChange> {
    let killed = cluster.leader(Duration::from_secs(30)).await?;
    let term_before = term(cluster, killed).await?;
    let cycles = grants.shared.cycles.load(Ordering::Relaxed);
    phases.push(grants.phase("voter again until the leader was killed"));
    cluster.node_mut(killed)?.kill();
    let from = Instant::now();
    eprintln!("catchup: leader {killed} killed (SIGKILL)");
    let new_leader = cluster.leader(limit).await?;
    let serving_seconds = from.elapsed().as_secs_f64();
    let term_after = term(cluster, new_leader).await?;
    while grants.shared.cycles.load(Ordering::Relaxed) == cycles {
        if from.elapsed() > limit {
            bail!("no grant within {limit:?} of killing leader {killed} (node {new_leader} leads)");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let first_grant_seconds = from.elapsed().as_secs_f64();
    phases.push(grants.phase("leader killed until another served a grant"));
    eprintln!(
        "catchup: node {new_leader} leads and serves {serving_seconds:.2} s after the kill; the first grant after \
         {first_grant_seconds:.2} s"
    );
    // From before the start: a node returns from its start only once it has
    // read its state (tens of seconds at millions of leases).
    let restarted = Instant::now();
    let node = cluster.node_mut(killed)?;
    // Off the runtime's thread: the grant clients go on meanwhile.
    tokio::task::block_in_place(|| node.kill_and_restart())?;
    let others: Vec<String> = cluster
        .nodes()
        .iter()
        .enumerate()
        .filter(|(i, _)| *i as u64 + 1 != killed)
        .map(|(_, n)| n.http_addr().to_string())
        .collect();
    let http = cluster.node_mut(killed)?.http_addr().to_string();
    let mut streams = Streams::new(cluster.node_mut(killed)?.dir().join("snap"));
    let progress = wait_caught_up(&others, &http, restarted, limit, &mut streams).await?;
    let rejoin_seconds = restarted.elapsed().as_secs_f64();
    phases.push(grants.phase("the killed node started again until it caught up"));
    eprintln!("catchup: node {killed}, started again, caught up after {rejoin_seconds:.1} s: {}", progress.caught);
    Ok(LeaderChange {
        killed,
        new_leader,
        term_before,
        term_after,
        serving_seconds,
        first_grant_seconds,
        rejoin_seconds,
        rejoined: progress.caught,
    })
}

/// Each node's memory once the leases are created (the rest is filled in later).
fn memory_after_create(cluster: &NativeCluster) -> anyhow::Result<Vec<NodeMemory>> {
    let mut memory = Vec::new();
    for (i, n) in cluster.nodes().iter().enumerate() {
        let (rss, peak) = memory_of(n.pid())?;
        memory.push(NodeMemory {
            id: i as u64 + 1,
            role: String::new(),
            rss_after_create: rss,
            peak_through_create: peak,
            rss_before: 0,
            rss_after: 0,
            peak_during: None,
            peak_since_start: 0,
        });
    }
    Ok(memory)
}

/// Each node's memory at the end: a peak counts as the snapshot's and
/// catch-up's if it was reset before them, or is the wiped node's new process's.
fn memory_at_end(cluster: &NativeCluster, wiped: u64, reset: &[bool], memory: &mut [NodeMemory]) -> anyhow::Result<()> {
    for (i, n) in cluster.nodes().iter().enumerate() {
        let (rss, peak) = memory_of(n.pid())?;
        let m = &mut memory[i];
        m.rss_after = rss;
        m.peak_since_start = peak;
        m.peak_during = (reset[i] || m.id == wiped).then_some(peak);
    }
    Ok(())
}

/// Kills follower `wiped`, deletes its data dir, and takes it out of the
/// group through the leader's admin API (`DELETE /v1/cluster/members/ID`);
/// the seconds the removal took. Killed first, as when its machine is lost:
/// a follower stuck behind (see [`pick_wiped`]) keeps the leader busy
/// re-sending it the log, which can hold the membership change up.
async fn remove_and_wipe(cluster: &mut NativeCluster, leader: u64, wiped: u64) -> anyhow::Result<f64> {
    cluster.wipe(wiped)?;
    let leader_http = cluster.node_mut(leader)?.http_addr().to_string();
    let path = format!("/v1/cluster/members/{wiped}");
    let from = Instant::now();
    let (status, text) = admin_call(&leader_http, "DELETE", &path, "", REMOVE_LIMIT).await?;
    if status != 200 {
        bail!("removing node {wiped} answered {status}: {}", text.trim());
    }
    let seconds = from.elapsed().as_secs_f64();
    eprintln!("catchup: node {wiped} killed, its data dir deleted, removed from the group in {seconds:.1} s");
    Ok(seconds)
}

/// What the wiped node installed, from its Raft state and its `snap/` directory.
fn installed(cluster: &mut NativeCluster, wiped: u64, catch_up: &mut CatchUpFigures) -> anyhow::Result<()> {
    let node = cluster.node_mut(wiped)?;
    let raft = tokio::task::block_in_place(|| node.control(Control::Raft))?;
    catch_up.installed_snapshot = raft.get("snapshot").and_then(serde_json::Value::as_u64);
    catch_up.purged = raft.get("purged").and_then(serde_json::Value::as_u64);
    catch_up.snapshot_bytes = dir_files(&node.dir().join("snap")).0;
    // A small snapshot can come in between two looks at its file.
    if catch_up.installed_snapshot.is_some() {
        catch_up.snapshot_streams = catch_up.snapshot_streams.max(1);
    }
    Ok(())
}

/// The Raft term node `id` reports.
async fn term(cluster: &NativeCluster, id: u64) -> anyhow::Result<u64> {
    let http = cluster.nodes().get(id as usize - 1).context("no such node")?.http_addr();
    Ok(health(http).await?.term)
}

/// Creates the leases through the leader, round by round until the leader
/// holds as many locks (see [`CreateFigures::rounds`]), and waits until every
/// node applied them.
async fn create(
    cluster: &NativeCluster,
    leases: u64,
    sessions: usize,
    limit: Duration,
) -> anyhow::Result<CreateFigures> {
    let from = Instant::now();
    let (mut rounds, mut next, mut counters) = (Vec::new(), 0, ServerCounters::default());
    while rounds.len() < CREATE_ROUNDS && counters.held_locks < leases {
        let want = leases - counters.held_locks;
        let leader = cluster.leader(Duration::from_secs(30)).await?;
        let left = limit.saturating_sub(from.elapsed());
        rounds.push(create_round(cluster, leader, sessions, next..next + want, left).await?);
        next += want;
        // What failed may still be applying.
        tokio::time::sleep(Duration::from_secs(1)).await;
        counters = ServerCounters::read(cluster.nodes()[leader as usize - 1].http_addr()).await?;
    }
    let left = limit.saturating_sub(from.elapsed()).min(APPLY_LIMIT);
    let applied = applied_everywhere(cluster, left).await?;
    let everywhere = all_equal(&applied).then(|| from.elapsed().as_secs_f64());
    eprintln!(
        "catchup: applied indexes {applied:?} after {:.1} s; the leader holds {} leases, {} locks",
        from.elapsed().as_secs_f64(),
        thousands(counters.active_leases),
        thousands(counters.held_locks)
    );
    let seconds: f64 = rounds.iter().map(|r| r.seconds).sum();
    Ok(CreateFigures {
        rounds,
        sessions,
        seconds,
        creates_per_sec: if seconds > 0.0 { counters.held_locks as f64 / seconds } else { 0.0 },
        applied_everywhere_seconds: everywhere,
        applied,
        active_leases: counters.active_leases,
        held_locks: counters.held_locks,
    })
}

/// One round of creates through `leader`, within `limit`: leases `numbers`.
async fn create_round(
    cluster: &NativeCluster,
    leader: u64,
    sessions: usize,
    numbers: std::ops::Range<u64>,
    limit: Duration,
) -> anyhow::Result<CreateRound> {
    let want = numbers.end - numbers.start;
    let sessions = scale::open_sessions(&cluster.nodes()[leader as usize - 1].url(), sessions).await?;
    eprintln!("catchup: creating {} idle leases through node {leader}, the leader", thousands(want));
    let created = tokio::time::timeout(limit, scale::create_idle(&sessions, numbers))
        .await
        .with_context(|| format!("creating {want} leases took longer than {limit:?}"))??;
    eprintln!("catchup: created in {:.1} s, {} failed", created.seconds, created.failures);
    if created.not_asked > 0 {
        eprintln!("catchup: gave up after failures in a row; {} not asked for", thousands(created.not_asked));
    }
    if let Some(e) = &created.first_error {
        eprintln!("catchup: the first failure: {e}");
    }
    Ok(CreateRound {
        leader,
        leases: want,
        seconds: created.seconds,
        failures: created.failures,
        first_error: created.first_error,
        not_asked: created.not_asked,
    })
}

/// Polls until every node applied as much as the one ahead, for at most
/// `limit`, or until no node's applied index moved for [`APPLY_STALL`]: each
/// node's applied index then (all equal if they got there).
async fn applied_everywhere(cluster: &NativeCluster, limit: Duration) -> anyhow::Result<Vec<u64>> {
    let start = Instant::now();
    let (mut seen, mut moved) = (Vec::new(), start);
    loop {
        let mut all = Vec::new();
        for n in cluster.nodes() {
            all.push(applied(n.http_addr()).await?.unwrap_or(0));
        }
        if all != seen {
            (seen, moved) = (all.clone(), Instant::now());
        }
        if all_equal(&all) || start.elapsed() > limit || moved.elapsed() > APPLY_STALL {
            return Ok(all);
        }
        tokio::time::sleep(POLL_EVERY).await;
    }
}

fn all_equal(v: &[u64]) -> bool {
    v.windows(2).all(|w| w[0] == w[1])
}

/// The follower to wipe, given each node's applied index (node id `i + 1`
/// at `i`): one that lags the others (it is stuck: the group's quorum must
/// not depend on it once the other follower is out), else the first follower.
/// Both followers lagging is an error: the group would have no quorum left.
fn pick_wiped(leader: u64, applied: &[u64]) -> anyhow::Result<u64> {
    let top = applied.iter().copied().max().unwrap_or(0);
    let followers: Vec<u64> = (1..=applied.len() as u64).filter(|&id| id != leader).collect();
    let lagging: Vec<u64> = followers.iter().copied().filter(|&id| applied[id as usize - 1] < top).collect();
    match lagging.as_slice() {
        [] => followers.first().copied().context("a group of one has no follower"),
        [one] => Ok(*one),
        _ => bail!(
            "followers {lagging:?} have not applied the leases (applied: {applied:?}): no quorum is left to wipe one"
        ),
    }
}

/// Resets the peak memory of every node but `wiped` (recording its RSS
/// then); whether each node's was reset.
fn reset_peaks(cluster: &NativeCluster, wiped: u64, memory: &mut [NodeMemory]) -> Vec<bool> {
    let mut reset = Vec::new();
    for (i, n) in cluster.nodes().iter().enumerate() {
        if i as u64 + 1 == wiped {
            reset.push(false);
            continue;
        }
        let done = procstat::reset_peak(n.pid());
        if let Err(e) = &done {
            eprintln!(
                "catchup: cannot reset node {}'s peak memory ({e}); its peak since it started is reported",
                i + 1
            );
        }
        memory[i].rss_before = procstat::rss_bytes(n.pid()).unwrap_or(0);
        reset.push(done.is_ok());
    }
    reset
}

/// Has the leader take a snapshot and purge its log behind it.
async fn snapshot(cluster: &mut NativeCluster, leader: u64) -> anyhow::Result<SnapshotFigures> {
    eprintln!("catchup: node {leader} (the leader) takes a snapshot and purges its log");
    let node = cluster.node_mut(leader)?;
    let answer = tokio::task::block_in_place(|| node.control(Control::Snapshot))?;
    let num = |k: &str| answer.get(k).and_then(serde_json::Value::as_u64);
    let secs = |k: &str| answer.get(k).and_then(serde_json::Value::as_f64).unwrap_or(0.0);
    let (bytes, files) = dir_files(&node.dir().join("snap"));
    let figures = SnapshotFigures {
        applied_when_asked: num("applied"),
        index: num("snapshot").context("the snapshot's answer has no index")?,
        purged: num("purged"),
        build_seconds: secs("snapshot_seconds"),
        purge_seconds: secs("purge_seconds"),
        bytes,
        files,
    };
    eprintln!(
        "catchup: snapshot at index {} in {:.1} s, {}; log purged to {}",
        figures.index,
        figures.build_seconds,
        mib(figures.bytes),
        opt(figures.purged)
    );
    if figures.purged.is_none() {
        eprintln!("catchup: the leader's log was not purged: the wiped node may catch up by the log, not the snapshot");
    }
    Ok(figures)
}

/// Adds `wiped` back and waits (within `limit`) until it caught up and votes.
/// A node that has not caught up by then is reported so (`finished` false),
/// not as an error: the caller writes what was measured, then fails.
async fn catch_up(
    cluster: &NativeCluster,
    leader: u64,
    wiped: u64,
    limit: Duration,
    grants: &GrantLoad,
    phases: &mut Vec<GrantPhase>,
) -> anyhow::Result<CatchUpFigures> {
    let nodes = cluster.nodes();
    let leader_http = nodes[leader as usize - 1].http_addr().to_string();
    let node = &nodes[wiped as usize - 1];
    let body = serde_json::json!({ "id": wiped, "addr": node.grpc_addr() }).to_string();
    let survivors: Vec<String> =
        nodes.iter().filter(|n| n.pid() != node.pid()).map(|n| n.http_addr().to_string()).collect();
    eprintln!("catchup: adding node {wiped} back, empty, at {}", node.grpc_addr());
    let from = Instant::now();
    let add = |http: String, body: String| {
        tokio::spawn(async move {
            admin_call(&http, "POST", "/v1/cluster/members", &body, limit + Duration::from_secs(60)).await
        })
    };
    let adding = add(leader_http.clone(), body.clone());
    let mut streams = Streams::new(node.dir().join("snap"));
    let progress = wait_caught_up(&survivors, node.http_addr(), from, limit, &mut streams).await?;
    let seconds = from.elapsed().as_secs_f64();
    let mut figures = CatchUpFigures {
        finished: progress.caught,
        seconds,
        voter_seconds: None,
        add_tries: 1,
        first_add_answer: None,
        target_index: progress.target,
        applied_at_catch_up: progress.mine,
        snapshot_streams: streams.begun(),
        installed_snapshot: None,
        purged: None,
        snapshot_bytes: 0,
    };
    if !progress.caught {
        adding.abort();
        phases.push(grants.phase("catch-up: added back, not caught up when the limit passed"));
        eprintln!(
            "catchup: node {wiped} has not caught up after {seconds:.1} s; it began receiving a snapshot {} time(s)",
            figures.snapshot_streams
        );
        return Ok(figures);
    }
    let target = progress.target;
    phases.push(grants.phase("catch-up: added back until its applied index reached the survivors'"));
    eprintln!("catchup: node {wiped} reached index {target} after {seconds:.1} s");
    let (tries, first_answer) = until_voter(adding, add, (leader_http, body), from, limit, wiped).await?;
    let voter_seconds = from.elapsed().as_secs_f64();
    (figures.voter_seconds, figures.add_tries, figures.first_add_answer) = (Some(voter_seconds), tries, first_answer);
    phases.push(grants.phase("caught up until a voter again"));
    eprintln!("catchup: node {wiped} votes again after {voter_seconds:.1} s ({tries} add(s))");
    Ok(figures)
}

/// Waits for the add in flight (`adding`) to answer 200: the node is a voter.
/// The server waits 60 s at most for a learner to catch up, then answers 503;
/// the node stays a learner, and an add once it caught up makes it a voter,
/// so a 503 is followed by another add (`add(http, body)`), up to 5 in all.
/// (adds made, the first answer if it was not 200).
async fn until_voter(
    mut adding: tokio::task::JoinHandle<anyhow::Result<(u16, String)>>,
    add: impl Fn(String, String) -> tokio::task::JoinHandle<anyhow::Result<(u16, String)>>,
    (http, body): (String, String),
    from: Instant,
    limit: Duration,
    wiped: u64,
) -> anyhow::Result<(u32, Option<String>)> {
    let (mut tries, mut first_answer) = (1, None);
    loop {
        let left = limit.saturating_sub(from.elapsed());
        let (status, text) = tokio::time::timeout(left, &mut adding)
            .await
            .with_context(|| format!("node {wiped} is not a voter again within {limit:?}"))??
            .with_context(|| format!("add node {wiped}"))?;
        if status == 200 {
            return Ok((tries, first_answer));
        }
        first_answer.get_or_insert_with(|| format!("{status} {}", text.trim()));
        if status == 400 || tries >= 5 {
            bail!("adding node {wiped} back answered {status}: {}", text.trim());
        }
        eprintln!("catchup: the add answered {status} ({}); adding it again", text.trim());
        tries += 1;
        adding = add(http.clone(), body.clone());
    }
}

/// How far a node catching up got: the survivors' highest applied index,
/// read just before its own; whether it reached it.
#[derive(Debug, Clone, Copy)]
struct Progress {
    target: u64,
    mine: Option<u64>,
    caught: bool,
}

/// Polls until the node at `http` has applied at least the highest applied
/// index of `survivors`, read just before it, or until `limit` has passed
/// since `from`. Meanwhile counts the snapshot streams the node begins
/// (`streams`).
async fn wait_caught_up(
    survivors: &[String],
    http: &str,
    from: Instant,
    limit: Duration,
    streams: &mut Streams,
) -> anyhow::Result<Progress> {
    loop {
        streams.look();
        let mut target = 0;
        for s in survivors {
            // A survivor that does not answer (it is busy) is read next time.
            target = target.max(applied(s).await.ok().flatten().unwrap_or(0));
        }
        let mine = applied(http).await.ok().flatten();
        if mine.is_some_and(|m| target > 0 && m >= target) {
            return Ok(Progress { target, mine, caught: true });
        }
        if from.elapsed() > limit {
            eprintln!("catchup: after {limit:?} the wiped node applied {mine:?}, the survivors {target}");
            return Ok(Progress { target, mine, caught: false });
        }
        tokio::time::sleep(POLL_EVERY).await;
    }
}

/// The snapshot streams a node began receiving, from the files it receives
/// them into: `snap/incoming-PID-SEQ.snap.incoming`, SEQ counting from 0 in
/// each process (the server's naming, `raft::snapshot_file`). A stream the
/// leader gives up and starts again is a new file.
struct Streams {
    dir: PathBuf,
    highest: Option<u64>,
}

impl Streams {
    fn new(dir: PathBuf) -> Streams {
        Streams { dir, highest: None }
    }

    /// Reads the directory once.
    fn look(&mut self) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return };
        for e in entries.filter_map(Result::ok) {
            let seq = e.file_name().to_str().and_then(incoming_seq);
            self.highest = self.highest.max(seq);
        }
    }

    /// Streams begun, as far as seen.
    fn begun(&self) -> u64 {
        self.highest.map_or(0, |h| h + 1)
    }
}

/// SEQ of a file named `incoming-PID-SEQ.snap.incoming`.
fn incoming_seq(name: &str) -> Option<u64> {
    let (_pid, seq) = name.strip_prefix("incoming-")?.strip_suffix(".snap.incoming")?.split_once('-')?;
    seq.parse().ok()
}

/// Once the grants stopped: compares the wiped node's engine (leases, held
/// locks, token counter) with the leader's, each read at one applied index
/// ([`Control::State`]), until both are at the same index; then equal or
/// not. Within [`SETTLE_LIMIT`]: writes still going on (expirations) may
/// keep the two a few entries apart for a while.
/// The node whose state the wiped one's is compared with: the leader, or
/// (after `--kill-leader` made the wiped node the leader) the first other node.
fn compared_with(leader: u64, wiped: u64) -> u64 {
    match leader == wiped {
        false => leader,
        true => (1..).find(|&id| id != wiped).unwrap_or(1),
    }
}

async fn settle_and_compare(cluster: &mut NativeCluster, leader: u64, wiped: u64) -> anyhow::Result<StateCheck> {
    let end = Instant::now() + SETTLE_LIMIT;
    let mut state = |id: u64| -> anyhow::Result<EngineState> {
        let node = cluster.node_mut(id)?;
        let v = tokio::task::block_in_place(|| node.control(Control::State))?;
        let num = |k: &str| v.get(k).and_then(serde_json::Value::as_u64);
        Ok(EngineState {
            applied: num("applied"),
            leases: num("leases").unwrap_or(0),
            held_locks: num("held_locks").unwrap_or(0),
            token_counter: num("token_counter").unwrap_or(0),
        })
    };
    loop {
        let (l, w) = (state(leader)?, state(wiped)?);
        let equal = (l.leases, l.held_locks, l.token_counter) == (w.leases, w.held_locks, w.token_counter);
        if let (Some(index), true) = (l.applied, l.applied == w.applied) {
            if equal || Instant::now() > end {
                return Ok(StateCheck { applied: index, node: leader, leader: l, wiped: w, equal });
            }
        }
        if Instant::now() > end {
            bail!("the leader and the wiped node were never at one applied index within {SETTLE_LIMIT:?}");
        }
        tokio::time::sleep(POLL_EVERY).await;
    }
}

/// What a node's `/healthz` says (whatever its status: a node that does not
/// lead answers 503 with the same body).
struct Health {
    applied: Option<u64>,
    term: u64,
}

async fn health(http: &str) -> anyhow::Result<Health> {
    let (_, body) = http_get(http, "/healthz").await?;
    let v: serde_json::Value =
        serde_json::from_str(&body).with_context(|| format!("GET http://{http}/healthz answered {body:?}"))?;
    let applied = v.get("last_applied").and_then(serde_json::Value::as_u64);
    Ok(Health { applied, term: v.get("term").and_then(serde_json::Value::as_u64).unwrap_or(0) })
}

/// The applied index a node's `/healthz` reports.
async fn applied(http: &str) -> anyhow::Result<Option<u64>> {
    Ok(health(http).await?.applied)
}

/// `METHOD path` with a JSON `body` on a node's admin port: status and body.
async fn admin_call(
    http: &str,
    method: &str,
    path: &str,
    body: &str,
    timeout: Duration,
) -> anyhow::Result<(u16, String)> {
    let sock: std::net::SocketAddr = http.parse().with_context(|| format!("{http:?} is not an address"))?;
    let headers = [("Content-Type", "application/json".to_string())];
    let req = fencelock_http::Request { method, path, headers: &headers, body: body.as_bytes() };
    let answer = fencelock_http::Client::new(sock).timeout(timeout).send(req).await?;
    Ok((answer.status, answer.text()))
}

/// (resident, peak) bytes of `pid`.
fn memory_of(pid: u32) -> anyhow::Result<(u64, u64)> {
    let rss = procstat::rss_bytes(pid).with_context(|| format!("read process {pid}'s resident memory"))?;
    let peak = procstat::peak_rss_bytes(pid).with_context(|| format!("read process {pid}'s peak memory"))?;
    Ok((rss, peak))
}

/// The total size and number of the regular files directly in `dir` (0 if none).
fn dir_files(dir: &Path) -> (u64, usize) {
    let Ok(entries) = std::fs::read_dir(dir) else { return (0, 0) };
    let sizes: Vec<u64> = entries
        .filter_map(Result::ok)
        .filter_map(|e| e.metadata().ok())
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .collect();
    (sizes.iter().sum(), sizes.len())
}

// ---- the grants that go on meanwhile ---------------------------------------------------------------------------

/// The longest time without a grant, phase by phase: a pure clock fed with
/// the times grants were acknowledged.
#[derive(Debug, Clone, Copy)]
struct GapClock {
    last_grant: Instant,
    longest: Duration,
}

impl GapClock {
    fn new(now: Instant) -> GapClock {
        GapClock { last_grant: now, longest: Duration::ZERO }
    }

    /// A grant acknowledged at `at`.
    fn grant(&mut self, at: Instant) {
        self.longest = self.longest.max(at.saturating_duration_since(self.last_grant));
        self.last_grant = self.last_grant.max(at);
    }

    /// Ends a phase at `at`: its longest gap, the one still open included;
    /// the next phase starts from no gap (but from the same last grant).
    fn close(&mut self, at: Instant) -> Duration {
        let longest = self.longest.max(at.saturating_duration_since(self.last_grant));
        self.longest = Duration::ZERO;
        longest
    }
}

/// Counters of a phase of grants.
struct PhaseStart {
    at: Instant,
    cycles: u64,
    errors: u64,
}

/// Clients doing acquire → release cycles on locks of their own through the
/// group's URL (each its own `fencelock::connect`, following the leader).
struct GrantLoad {
    stop: Arc<AtomicBool>,
    shared: Arc<Shared>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    phase: Mutex<PhaseStart>,
}

#[derive(Debug)]
struct Shared {
    cycles: AtomicU64,
    errors: AtomicU64,
    gaps: Mutex<GapClock>,
    first_error: Mutex<Option<String>>,
}

impl Shared {
    fn granted(&self) {
        if let Ok(mut g) = self.gaps.lock() {
            g.grant(Instant::now());
        }
    }

    fn failed(&self, e: String) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut first) = self.first_error.lock() {
            first.get_or_insert(e);
        }
    }
}

impl GrantLoad {
    async fn start(url: &str, clients: usize) -> anyhow::Result<GrantLoad> {
        let now = Instant::now();
        let shared = Arc::new(Shared {
            cycles: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            gaps: Mutex::new(GapClock::new(now)),
            first_error: Mutex::new(None),
        });
        let stop = Arc::new(AtomicBool::new(false));
        let mut tasks = Vec::new();
        for c in 0..clients {
            let backend =
                fencelock::connect(url).await.with_context(|| format!("grant client {c}: connect to {url}"))?;
            let (stop, shared) = (stop.clone(), shared.clone());
            tasks.push(tokio::spawn(grant_loop(backend, format!("catchup/grants/c{c}"), stop, shared)));
        }
        let phase = Mutex::new(PhaseStart { at: now, cycles: 0, errors: 0 });
        Ok(GrantLoad { stop, shared, tasks, phase })
    }

    /// The figures since the last phase ended (or the start), as phase `name`.
    fn phase(&self, name: &str) -> GrantPhase {
        let now = Instant::now();
        let (cycles, errors) = (self.shared.cycles.load(Ordering::Relaxed), self.shared.errors.load(Ordering::Relaxed));
        let gap = self.shared.gaps.lock().map(|mut g| g.close(now)).unwrap_or_default();
        let first_error = self.shared.first_error.lock().ok().and_then(|mut e| e.take());
        let mut p = match self.phase.lock() {
            Ok(p) => p,
            Err(poisoned) => poisoned.into_inner(),
        };
        let phase = GrantPhase {
            phase: name.to_string(),
            seconds: (now - p.at).as_secs_f64(),
            cycles: cycles - p.cycles,
            errors: errors - p.errors,
            longest_gap_ms: gap.as_secs_f64() * 1000.0,
            first_error,
        };
        *p = PhaseStart { at: now, cycles, errors };
        phase
    }

    /// Stops the clients (each ends its cycle first).
    async fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

async fn grant_loop(backend: fencelock::Backend, lock: String, stop: Arc<AtomicBool>, shared: Arc<Shared>) {
    let opts = LockOptions::default().ttl(GRANT_TTL).wait(Duration::ZERO);
    while !stop.load(Ordering::Relaxed) {
        match tokio::time::timeout(CYCLE_LIMIT, cycle(&backend, &lock, &opts, &shared)).await {
            Ok(Ok(())) => {
                shared.cycles.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            Ok(Err(e)) => shared.failed(format!("{lock}: {e:#}")),
            Err(_) => shared.failed(format!("{lock}: no grant and release within {CYCLE_LIMIT:?}")),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One acquire → release of `lock` (free: no one else takes it).
async fn cycle(backend: &fencelock::Backend, lock: &str, opts: &LockOptions, shared: &Shared) -> anyhow::Result<()> {
    match backend.acquire(lock, opts).await.context("acquire")? {
        Outcome::Acquired(g) => {
            shared.granted();
            if !g.release().await.context("release")? {
                bail!("the release found the grant gone");
            }
            Ok(())
        }
        Outcome::Busy { .. } | Outcome::TimedOut => bail!("{lock}, taken by no one else, was not granted"),
    }
}

// ---- the report ------------------------------------------------------------------------------------------------

/// Prints the markdown and writes `catchup.md` and `catchup.json` into `out`.
fn write(r: &CatchupReport, out: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("create {}", out.display()))?;
    let md = markdown(r);
    println!("{md}");
    std::fs::write(out.join("catchup.md"), &md)?;
    std::fs::write(out.join("catchup.json"), serde_json::to_string_pretty(r)?)?;
    eprintln!("wrote {}", out.display());
    Ok(())
}

fn markdown(r: &CatchupReport) -> String {
    let mut md = String::new();
    let m = &r.machine;
    let (c, s, k) = (&r.create, &r.snapshot, &r.catch_up);
    let _ = writeln!(md, "# A wiped follower catches up by snapshot (issue 38)\n");
    let _ = writeln!(md, "| | |\n|---|---|");
    let rows = [
        (
            "Machine",
            format!(
                "{} cores ({}), {:.1} GiB, Linux {}, data on {}",
                m.cores, m.cpu, m.memory_gib, m.kernel, m.data_fs
            ),
        ),
        ("fencelock commit", m.commit.clone()),
        ("Group", format!("3 `serve-native` processes on 127.0.0.1; {}", r.config)),
        ("Leases", format!("{} idle leases (1 h TTL), each holding a lock of its own", thousands(r.leases))),
        ("Creation", creation_note(c)),
        (
            "Wiped",
            format!(
                "node {} (a follower): killed, data dir deleted, removed from the group (the removal answered \
                 after {:.1} s), started again empty (`--join`) on its ports; node {} leads",
                r.wiped, r.remove_seconds, r.leader
            ),
        ),
        (
            "Raft term",
            format!(
                "{} at the start, {} after the creation, {} after the removal, {} at the end (each election \
                 raises it)",
                r.terms.at_start, r.terms.after_create, r.terms.after_remove, r.terms.at_end
            ),
        ),
        (
            "Snapshot",
            format!(
                "the leader's, at index {} (applied when asked: {}), built in {:.1} s: {} on disk ({} file(s)); log \
                 purged to {} in {:.1} s more",
                s.index,
                opt(s.applied_when_asked),
                s.build_seconds,
                mib(s.bytes),
                s.files,
                opt(s.purged),
                s.purge_seconds
            ),
        ),
        ("Catch-up", catch_up_note(k)),
        ("Installed", installed_note(k)),
        ("State afterwards", state_note(r.state.as_ref())),
        ("Leader killed", leader_change_note(r.leader_change.as_ref())),
    ];
    for (k, v) in rows {
        let _ = writeln!(md, "| {k} | {v} |");
    }
    grants_table(&mut md, r);
    memory_table(&mut md, r);
    md
}

/// What killing the leader cost, if it was killed.
fn leader_change_note(l: Option<&LeaderChange>) -> String {
    let Some(l) = l else { return "not killed (`--kill-leader` not given, or no catch-up)".into() };
    format!(
        "node {} (SIGKILL), with every lease live: node {} led and served (`LeaderStart` applied) {:.2} s later \
         (term {} → {}), the grant clients had their next grant after {:.2} s; node {}, started again on its data, {} \
         after {:.1} s",
        l.killed,
        l.new_leader,
        l.serving_seconds,
        l.term_before,
        l.term_after,
        l.first_grant_seconds,
        l.killed,
        if l.rejoined { "had caught up" } else { "had not caught up" },
        l.rejoin_seconds
    )
}

/// How the catch-up went.
fn catch_up_note(k: &CatchUpFigures) -> String {
    if !k.finished {
        return format!(
            "**did not finish** within {:.0} s of the add: the node had applied {} (the survivors were at {})",
            k.seconds,
            k.applied_at_catch_up.map_or_else(|| "nothing".into(), |i| format!("up to {i}")),
            k.target_index
        );
    }
    format!(
        "**{:.1} s** from the add until its applied index reached the survivors' ({} ≥ {}); a voter again after {} \
         ({} add(s){})",
        k.seconds,
        opt(k.applied_at_catch_up),
        k.target_index,
        k.voter_seconds.map_or_else(|| "n/a".into(), |s| format!("{s:.1} s")),
        k.add_tries,
        k.first_add_answer.as_ref().map(|a| format!("; the first answered {a}")).unwrap_or_default()
    )
}

/// What the wiped node installed.
fn installed_note(k: &CatchUpFigures) -> String {
    let streams = format!("it began receiving a snapshot {} time(s)", k.snapshot_streams);
    match k.installed_snapshot {
        Some(i) => format!(
            "the wiped node's snapshot at index {i}, then the log after it; {} on disk; {streams}",
            mib(k.snapshot_bytes)
        ),
        None => format!("no snapshot: its snap/ holds {} (a stream under way); {streams}", mib(k.snapshot_bytes)),
    }
}

/// The wiped node's state against the node it was compared with.
fn state_note(s: Option<&StateCheck>) -> String {
    let Some(s) = s else { return "not compared: the wiped node did not catch up".into() };
    let one = |e: &EngineState| {
        format!(
            "{} leases, {} held locks, token counter {}",
            thousands(e.leases),
            thousands(e.held_locks),
            e.token_counter
        )
    };
    format!(
        "at index {}: node {} {}; wiped node {} ({})",
        s.applied,
        s.node,
        one(&s.leader),
        one(&s.wiped),
        if s.equal { "equal" } else { "**differ**" }
    )
}

/// How the leases were created, round by round.
fn creation_note(c: &CreateFigures) -> String {
    let rounds: Vec<String> = c
        .rounds
        .iter()
        .map(|r| {
            let mut failed = match &r.first_error {
                Some(e) => format!(", {} failed, the first: {e}", thousands(r.failures)),
                None => String::new(),
            };
            if r.not_asked > 0 {
                failed += &format!("; gave up with {} not asked for", thousands(r.not_asked));
            }
            format!("{} through node {} in {:.1} s{failed}", thousands(r.leases), r.leader, r.seconds)
        })
        .collect();
    format!(
        "{:.1} s of creates ({}/s; {} sessions, {} creates in flight on each), in {} round(s): {}; {}; the leader \
         then held {} leases and {} locks",
        c.seconds,
        thousands(c.creates_per_sec.round() as u64),
        c.sessions,
        scale::WINDOW,
        c.rounds.len(),
        rounds.join("; "),
        applied_note(c),
        thousands(c.active_leases),
        thousands(c.held_locks)
    )
}

/// When every node had applied the leases, or how far each got.
fn applied_note(c: &CreateFigures) -> String {
    match c.applied_everywhere_seconds {
        Some(s) => format!("every node had applied them after {s:.1} s"),
        None => format!(
            "**not every node applied them** (applied indexes by node: {:?}; the one behind is the one wiped)",
            c.applied
        ),
    }
}

fn grants_table(md: &mut String, r: &CatchupReport) {
    let _ = writeln!(
        md,
        "\n## Grants meanwhile\n\n{} clients, each acquire → release on a lock of its own, through the group's URL \
         (the client follows the leader), from before the wipe until the node votes again.\n",
        r.grant_clients
    );
    let _ = writeln!(md, "| Phase | Seconds | Cycles | Cycles/s | Errors | Longest gap between grants |");
    let _ = writeln!(md, "|---|--:|--:|--:|--:|--:|");
    for p in &r.grants {
        let rate = if p.seconds > 0.0 { p.cycles as f64 / p.seconds } else { 0.0 };
        let _ = writeln!(
            md,
            "| {} | {:.1} | {} | {} | {} | {:.0} ms |",
            p.phase,
            p.seconds,
            thousands(p.cycles),
            thousands(rate.round() as u64),
            p.errors,
            p.longest_gap_ms
        );
    }
    for p in r.grants.iter().filter(|p| p.first_error.is_some()) {
        let _ = writeln!(md, "\nFirst error in \"{}\": {}", p.phase, p.first_error.as_deref().unwrap_or(""));
    }
}

fn memory_table(md: &mut String, r: &CatchupReport) {
    let _ = writeln!(md, "\n## Memory of each node (resident, from /proc)\n");
    let _ = writeln!(
        md,
        "| Node | Role | RSS after creation | Peak through creation | RSS before | RSS after | Peak during snapshot \
         and catch-up |"
    );
    let _ = writeln!(md, "|---|---|--:|--:|--:|--:|--:|");
    for n in &r.nodes {
        let during =
            n.peak_during.map(mib).unwrap_or_else(|| format!("n/a (since start: {})", mib(n.peak_since_start)));
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} |",
            n.id,
            n.role,
            mib(n.rss_after_create),
            mib(n.peak_through_create),
            mib(n.rss_before),
            mib(n.rss_after),
            during
        );
    }
    let _ = writeln!(
        md,
        "\nRSS before: a survivor's just before the snapshot, when its peak (`VmHWM`) was reset (`clear_refs`), so \
         its last column is its peak from the snapshot to the end; the wiped node's just after it started again \
         empty (a new process: its last column is its whole life's peak, the catch-up's). The wiped node's first \
         two columns are its first process's, before it was wiped."
    );
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

fn opt(v: Option<u64>) -> String {
    v.map(|v| v.to_string()).unwrap_or_else(|| "none".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The longest gap is the longest interval without a grant within a
    /// phase, the one still open at its end included; a new phase starts
    /// from no gap.
    #[test]
    fn gaps_between_grants_by_phase() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut g = GapClock::new(t0);
        for ms in [100, 200, 1_200, 1_250] {
            g.grant(at(ms));
        }
        assert_eq!(g.close(at(1_300)), Duration::from_millis(1_000), "between 200 and 1200");
        g.grant(at(1_400));
        assert_eq!(g.close(at(4_400)), Duration::from_millis(3_000), "open since 1400 when the phase ends");
        assert_eq!(g.close(at(4_500)), Duration::from_millis(3_100), "still no grant since 1400");
        g.grant(at(4_600));
        g.grant(at(4_550)); // acknowledged out of order by two clients
        assert_eq!(g.close(at(4_700)), Duration::from_millis(3_200), "1400 to 4600");
        assert_eq!(g.close(at(4_700)), Duration::from_millis(100), "since 4600, not 4550");
    }

    /// The wiped node is compared with the leader, or with another node
    /// when it leads itself (never with itself).
    #[test]
    fn the_wiped_node_is_compared_with_another() {
        assert_eq!(compared_with(2, 1), 2);
        assert_eq!(compared_with(1, 1), 2);
        assert_eq!(compared_with(3, 3), 1);
    }

    /// The leader-change row says what was measured, or why nothing was.
    #[test]
    fn the_leader_change_row() {
        assert!(leader_change_note(None).starts_with("not killed"));
        let l = LeaderChange {
            killed: 2,
            new_leader: 3,
            term_before: 4,
            term_after: 5,
            serving_seconds: 1.234,
            first_grant_seconds: 1.5,
            rejoin_seconds: 12.0,
            rejoined: true,
        };
        assert_eq!(
            leader_change_note(Some(&l)),
            "node 2 (SIGKILL), with every lease live: node 3 led and served (`LeaderStart` applied) 1.23 s later \
             (term 4 → 5), the grant clients had their next grant after 1.50 s; node 2, started again on its data, \
             had caught up after 12.0 s"
        );
    }

    /// The wiped follower is the one behind if one is, else the first
    /// follower; with both behind there is nothing safe to wipe.
    #[test]
    fn which_follower_is_wiped() {
        assert_eq!(pick_wiped(2, &[10, 10, 10]).unwrap(), 1);
        assert_eq!(pick_wiped(1, &[10, 10, 10]).unwrap(), 2);
        assert_eq!(pick_wiped(2, &[10, 10, 4]).unwrap(), 3, "the one behind");
        assert_eq!(pick_wiped(3, &[7, 10, 10]).unwrap(), 1);
        assert!(pick_wiped(2, &[4, 10, 5]).is_err(), "both followers behind");
        assert!(pick_wiped(1, &[10]).is_err(), "a group of one");
    }

    /// The receive files of the server's snapshot streams are told by name.
    #[test]
    fn snapshot_stream_files() {
        assert_eq!(incoming_seq("incoming-8050-134.snap.incoming"), Some(134));
        assert_eq!(incoming_seq("incoming-8050-0.snap.incoming"), Some(0));
        assert_eq!(incoming_seq("00000000000000000169-8050-3.snap"), None, "an adopted snapshot");
        assert_eq!(incoming_seq("incoming-8050-x.snap.incoming"), None);
        let d = tempfile::tempdir().unwrap();
        let mut s = Streams::new(d.path().to_path_buf());
        s.look();
        assert_eq!(s.begun(), 0);
        std::fs::write(d.path().join("incoming-7-2.snap.incoming"), b"").unwrap();
        s.look();
        std::fs::remove_file(d.path().join("incoming-7-2.snap.incoming")).unwrap();
        s.look();
        assert_eq!(s.begun(), 3, "seen once is enough");
    }

    /// Only regular files directly in the directory count; a missing one is empty.
    #[test]
    fn snapshot_dir_size() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("a.snap"), [0u8; 300]).unwrap();
        std::fs::write(d.path().join("b.snap"), [0u8; 12]).unwrap();
        std::fs::create_dir(d.path().join("sub")).unwrap();
        std::fs::write(d.path().join("sub/c"), [0u8; 1000]).unwrap();
        assert_eq!(dir_files(d.path()), (312, 2));
        assert_eq!(dir_files(&d.path().join("missing")), (0, 0));
    }
}
