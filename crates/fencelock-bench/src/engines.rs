//! The engines under test: each lock service started on free ports of
//! 127.0.0.1 with its data in a temp dir, or reached at a URL given.
//!
//! Where it sits: `main` starts the engines once and runs every workload cell
//! against each of them in turn. Peers come from `fencelock-testkit` (Debian's
//! redis-server, etcd, ZooKeeper, PostgreSQL) in its production profile: as
//! their operators run them, durable (except Redis without AOF), with the
//! timers, garbage collector, memory and logging of a production set-up, not
//! the tests' short timers; each engine's configuration goes into the report
//! in one line. The native server runs as a child process of this
//! binary (`fencelock-bench serve-native`), so that its CPU and memory are its
//! own and it can be killed like any other server. `fencelock-3` is three such
//! children forming one Raft group on this machine; the clients are given all
//! three and follow the leader themselves. Each child takes commands from the
//! bench on its stdin (`serve-native --control`: its Raft state, a snapshot
//! and log purge, which the server offers no outside way to ask for) and ends
//! when the bench's end closes that stdin; `catchup` wipes one member of a
//! group and adds it back empty ([`NativeCluster::wipe`],
//! [`NativeCluster::start_empty`]).

use std::{
    io::{BufRead, BufReader, Write},
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
    time::Duration,
};

use anyhow::{bail, Context};
use fencelock_server::parse_peers;
use fencelock_testkit::{EtcdServer, PgServer, Profile, RedisServer, ZkServer};
use tokio::time::Instant;

use crate::{admin::http_get, model::EngineInfo, procstat, procstat::command_line};

/// Every engine, in the order they are started and measured.
pub const ALL: &[&str] = &[
    "fencelock",
    "fencelock-secure",
    "fencelock-http",
    "fencelock-3",
    "redis",
    "redis-aof",
    "etcd",
    "zookeeper",
    "postgres",
    "pg-advisory",
    "redis-setnx",
    "redis-setnx-aof",
];

/// The engines that run the seeds' Redis recipe in the bench itself (`SET
/// NX PX` and `INCR` of a token in one script, a compare-and-delete release,
/// retried every 100 ms while taken), not through `fencelock::connect`: the
/// lock most Redis users write, on the `redis` and `redis-aof` servers.
pub const SETNX: &[&str] = &["redis-setnx", "redis-setnx-aof"];

/// Whether `id` is one of the [`SETNX`] engines.
pub fn is_setnx(id: &str) -> bool {
    SETNX.contains(&id)
}

/// The native engines: the server this project makes (the peers are the rest).
const NATIVE: &[&str] = &["fencelock", "fencelock-secure", "fencelock-http", "fencelock-3"];

/// How the clients of a cell reach the engine (`--client-mode`).
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientMode {
    /// Each client connects on its own (`fencelock::connect` per client): one
    /// connection each, as separate processes would have.
    PerProcess,
    /// One `Backend` (one connection, or one session) used by every client's task.
    Shared,
    /// Both, as two engines of the report: `ID` and `ID/shared`.
    Both,
}

impl ClientMode {
    /// The modes `id` is measured in (`false`: per process, `true`: shared).
    /// Without `--client-mode`, the native engines are measured both ways and
    /// the peers per process (how their users' processes meet them; asked for
    /// with `--client-mode both`, they are measured shared too).
    pub fn shared_flags(asked: Option<ClientMode>, id: &str) -> &'static [bool] {
        match asked.unwrap_or(if NATIVE.contains(&id) { ClientMode::Both } else { ClientMode::PerProcess }) {
            ClientMode::PerProcess => &[false],
            ClientMode::Shared => &[true],
            ClientMode::Both => &[false, true],
        }
    }
}

/// A started (or given) engine.
#[derive(Clone)]
pub struct Engine {
    pub info: EngineInfo,
    /// The URL `fencelock::connect` takes (for the [`SETNX`] engines, the Redis URL).
    pub url: String,
    /// The processes whose CPU is charged to this engine (every node of a
    /// group); empty for an engine given by URL.
    pub pids: Vec<u32>,
    /// Whether every client of a cell uses one shared `Backend` (see [`ClientMode`]).
    pub shared: bool,
}

impl Engine {
    /// CPU time (user + system, children included) of all its processes so
    /// far; `None` without processes or when one of them cannot be read.
    pub fn cpu_time(&self) -> Option<Duration> {
        if self.pids.is_empty() {
            return None;
        }
        self.pids.iter().map(|&p| procstat::cpu_time(p)).sum()
    }
}

/// Servers kept alive for the run; dropping them stops them.
#[derive(Default)]
pub struct Servers {
    native: Option<NativeServer>,
    native_secure: Option<NativeServer>,
    native_http: Option<NativeServer>,
    native3: Option<NativeCluster>,
    redis: Option<RedisServer>,
    redis_aof: Option<RedisServer>,
    etcd: Option<EtcdServer>,
    zk: Option<ZkServer>,
    pg: Option<PgServer>,
}

/// Starts `id` (or uses `given` as its URL, without CPU figures).
pub async fn start(id: &str, given: Option<&str>, servers: &mut Servers, data: &Path) -> anyhow::Result<Engine> {
    let (url, pids, config) = match given {
        Some(url) => (url.to_string(), Vec::new(), "given by URL: not started here".to_string()),
        None => launch(id, servers, data).await?,
    };
    let mut info = info(id, !pids.is_empty())?;
    info.config = config;
    Ok(Engine { info, url, pids, shared: false })
}

/// `engine` as measured in each client mode asked for: itself (per process)
/// and/or `ID/shared`, the same server with one connection for all clients.
pub fn in_modes(engine: Engine, asked: Option<ClientMode>) -> Vec<Engine> {
    let flags = ClientMode::shared_flags(asked, &engine.info.id);
    flags
        .iter()
        .map(|&shared| {
            let mut e = engine.clone();
            if shared {
                e.shared = true;
                e.info.id = format!("{}/shared", e.info.id);
                e.info.label = format!("{}; all clients share one connection", e.info.label);
                e.info.shared_connection = true;
            }
            e
        })
        .collect()
}

/// The native server's configuration, in one line.
pub fn native_config(what: &str) -> String {
    let threads = std::env::var("FENCELOCK_BENCH_SERVER_THREADS")
        .map(|n| format!("{n} runtime worker threads"))
        .unwrap_or_else(|_| "one runtime worker thread per core".into());
    let log = std::env::var(SERVER_LOG_ENV)
        .unwrap_or_else(|_| format!("{} (the default)", fencelock_server::LogEngine::default().name()));
    let mut tuned = format!("; Raft log: {log}");
    if let Ok(v) = std::env::var(SERVER_RAFT_ENV) {
        tuned.push_str(&format!("; Raft heartbeat and election timeout {v} ms"));
    }
    if let Ok(n) = std::env::var(SERVER_INFLIGHT_ENV) {
        tuned.push_str(&format!("; {n} log writes in flight"));
    }
    format!("{what}: fencelock-server's defaults (Config::new) on 127.0.0.1, quotas off; {threads}{tuned}")
}

/// `serve-native`'s log engine instead of the default (`segment`; or `redb`).
pub const SERVER_LOG_ENV: &str = "FENCELOCK_BENCH_SERVER_LOG";
/// `serve-native`'s `--max-inflight-writes` instead of the default.
pub const SERVER_INFLIGHT_ENV: &str = "FENCELOCK_BENCH_SERVER_INFLIGHT";

/// A tracing filter (`warn,openraft=info`): `serve-native` then writes its
/// logs to `DATA_DIR.log` beside its data directory (by default it logs
/// nothing: the bench measures the server, not its logging).
pub const SERVER_TRACE_ENV: &str = "FENCELOCK_BENCH_SERVER_TRACE";

/// With [`SERVER_TRACE_ENV`] set, logs to `DATA_DIR.log`, appending (a wiped
/// member's data directory goes, its log stays).
fn trace_from_env(data_dir: &Path) -> anyhow::Result<()> {
    let Ok(filter) = std::env::var(SERVER_TRACE_ENV) else { return Ok(()) };
    let filter = tracing_subscriber::EnvFilter::try_new(&filter).context(SERVER_TRACE_ENV)?;
    let path = data_dir.with_extension("log");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .with_context(|| format!("{}", path.display()))?;
    tracing_subscriber::fmt().with_env_filter(filter).with_ansi(false).with_writer(std::sync::Mutex::new(file)).init();
    Ok(())
}

/// `HEARTBEAT_MS,ELECTION_MS`: `serve-native`'s Raft heartbeat and election
/// timeout instead of the server's defaults (50 and 150 ms), as an operator
/// sets `heartbeat` and `election_timeout` in `fencelock serve`'s config.
pub const SERVER_RAFT_ENV: &str = "FENCELOCK_BENCH_SERVER_RAFT";

/// The server settings the environment asks for (see [`SERVER_LOG_ENV`],
/// [`SERVER_RAFT_ENV`] and [`SERVER_INFLIGHT_ENV`]), onto `config`.
fn tune_from_env(config: &mut fencelock_server::Config) -> anyhow::Result<()> {
    if let Ok(log) = std::env::var(SERVER_LOG_ENV) {
        config.log = log.parse().map_err(|e| anyhow::anyhow!("{SERVER_LOG_ENV}: {e}"))?;
    }
    if let Ok(v) = std::env::var(SERVER_RAFT_ENV) {
        let ms = |x: Option<&str>| x.and_then(|x| x.trim().parse::<u64>().ok()).map(Duration::from_millis);
        let mut parts = v.split(',');
        let (Some(heartbeat), Some(election), None) = (ms(parts.next()), ms(parts.next()), parts.next()) else {
            anyhow::bail!("{SERVER_RAFT_ENV}={v}: expected HEARTBEAT_MS,ELECTION_MS");
        };
        (config.heartbeat, config.election_timeout) = (heartbeat, election);
    }
    if let Ok(n) = std::env::var(SERVER_INFLIGHT_ENV) {
        config.max_inflight_writes = n.parse().with_context(|| format!("{SERVER_INFLIGHT_ENV}={n}"))?;
    }
    Ok(())
}

/// Starts the server(s) of `id`: its URL, processes and configuration.
async fn launch(id: &str, s: &mut Servers, data: &Path) -> anyhow::Result<(String, Vec<u32>, String)> {
    let prod = Profile::Production;
    Ok(match id {
        "fencelock" => {
            let n = s.native.insert(NativeServer::start(&data.join("fencelock"))?);
            (n.url(), vec![n.pid()], native_config("1 node"))
        }
        "fencelock-secure" => {
            let (args, query) = secure_setup(&data.join("fencelock-secure-files"))?;
            let n = s.native_secure.insert(NativeServer::spawn(&data.join("fencelock-secure"), args)?);
            (format!("fencelock+tls://{}?{query}", n.grpc), vec![n.pid()], native_config("1 node, TLS and a token"))
        }
        "fencelock-http" => {
            let n = s.native_http.insert(NativeServer::start(&data.join("fencelock-http"))?);
            (format!("fencelock+json://{}", n.http), vec![n.pid()], native_config("1 node, its HTTP/JSON API"))
        }
        "fencelock-3" => {
            let c = s.native3.insert(NativeCluster::start(&data.join("fencelock-3"), 3).await?);
            (c.url(), c.pids(), native_config("each of 3 nodes"))
        }
        "redis" | "redis-setnx" => {
            let r = s.redis.get_or_insert_with(RedisServer::start_volatile);
            (r.url(), vec![r.pid()], r.describe())
        }
        "redis-aof" => {
            let r = s.redis_aof.get_or_insert_with(RedisServer::start);
            (format!("{}?durable=true", r.url()), vec![r.pid()], r.describe())
        }
        "redis-setnx-aof" => {
            let r = s.redis_aof.get_or_insert_with(RedisServer::start);
            (r.url(), vec![r.pid()], r.describe())
        }
        "etcd" => {
            let e = s.etcd.get_or_insert_with(|| EtcdServer::start_profile(prod));
            (e.url(), vec![e.pid()], e.describe())
        }
        "zookeeper" => {
            let z = s.zk.get_or_insert_with(|| ZkServer::start_profile(prod));
            (z.url(), vec![z.pid()], z.describe())
        }
        "postgres" | "pg-advisory" => {
            let p = s.pg.get_or_insert_with(|| PgServer::start_profile(prod));
            let url = if id == "postgres" { p.url() } else { format!("{}?mode=advisory", p.url()) };
            (url, vec![p.pid()], p.describe())
        }
        other => bail!("unknown engine {other:?}; known: {}", ALL.join(", ")),
    })
}

/// Label, version and declared guarantees of `id`.
fn info(id: &str, cpu_measured: bool) -> anyhow::Result<EngineInfo> {
    let redis = || {
        command_line("redis-server", &["--version"])
            .and_then(|v| v.split_whitespace().nth(2).map(|s| s.trim_start_matches("v=").to_string()))
    };
    let pg = || {
        command_line(&pg_bin("postgres"), &["--version"]).and_then(|v| v.split_whitespace().nth(2).map(String::from))
    };
    let (label, version, durable, fencing, fifo) = match id {
        "fencelock" => {
            ("fencelock (1 node, fsync per batch)", Some(env!("CARGO_PKG_VERSION").to_string()), true, "global", true)
        }
        "fencelock-secure" => (
            "fencelock (1 node as above, with TLS and a bearer token on every call)",
            Some(env!("CARGO_PKG_VERSION").to_string()),
            true,
            "global",
            true,
        ),
        "fencelock-http" => (
            "fencelock (1 node as above) through its HTTP/JSON API: one call per acquire (a lease made for it, a \
             long-poll in the queue), keep-alives every TTL/3, release by ending the lease; HTTP/1.1 keep-alive \
             connections",
            Some(env!("CARGO_PKG_VERSION").to_string()),
            true,
            "global",
            true,
        ),
        "fencelock-3" => (
            "fencelock, 3-node Raft group (3 processes on this machine, each fsync per batch)",
            Some(env!("CARGO_PKG_VERSION").to_string()),
            true,
            "global",
            true,
        ),
        "redis" => ("Redis, no AOF (fencelock's FIFO recipe)", redis(), false, "global", true),
        "redis-aof" => ("Redis, AOF appendfsync always (FIFO recipe)", redis(), true, "global", true),
        "redis-setnx" => (
            "Redis, no AOF, the seeds' recipe: SET NX PX + INCR token in one script, compare-and-delete release, \
             retried every 100 ms while taken",
            redis(),
            false,
            "per lock",
            false,
        ),
        "redis-setnx-aof" => {
            ("Redis, AOF appendfsync always, the seeds' recipe as above", redis(), true, "per lock", false)
        }
        "etcd" => (
            "etcd (concurrency-style recipe)",
            command_line("etcd", &["--version"]).and_then(|v| v.split_whitespace().last().map(String::from)),
            true,
            "per lock",
            true,
        ),
        "zookeeper" => (
            "ZooKeeper (Curator-style recipe)",
            command_line("dpkg-query", &["-W", "-f", "${Version}", "zookeeper"]),
            true,
            "per lock",
            true,
        ),
        "postgres" => ("PostgreSQL lease table", pg(), true, "global", true),
        "pg-advisory" => ("PostgreSQL advisory locks", pg(), true, "none", false),
        other => bail!("unknown engine {other:?}"),
    };
    Ok(EngineInfo {
        id: id.to_string(),
        label: label.to_string(),
        version: version.unwrap_or_else(|| "unknown".into()),
        durable,
        fencing: fencing.to_string(),
        fifo,
        cpu_measured,
        config: String::new(),
        shared_connection: false,
    })
}

/// Path of a PostgreSQL server binary (Debian keeps them out of PATH).
fn pg_bin(name: &str) -> String {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path().join("bin"))).collect())
        .unwrap_or_default();
    dirs.sort();
    dirs.last().map(|d| d.join(name).display().to_string()).unwrap_or_else(|| name.to_string())
}

/// The native server as a child process of this binary (`serve-native`),
/// with its data in `dir`: a group of one, or one member of a group.
pub struct NativeServer {
    child: Child,
    /// Its `--control` channel: commands in, one line of JSON out per command.
    commands: ChildStdin,
    answers: BufReader<ChildStdout>,
    dir: PathBuf,
    /// `serve-native` arguments after `--data-dir DIR` (a member's id, peers and ports).
    args: Vec<String>,
    grpc: String,
    http: String,
}

/// How long a starting node may take to print its addresses. A start reads
/// the data dir's snapshot and replays its log first: minutes at 10M leases
/// (`catchup`), well under a second on the data the workloads leave.
const START_LIMIT: Duration = Duration::from_secs(600);

/// The first line `from` prints, within `limit`; an error after it (the
/// reader's thread is then left blocked until its writer ends, which the
/// caller makes happen by killing the child), or if `from` ends first.
fn first_line<R: BufRead + Send + 'static>(mut from: R, limit: Duration) -> anyhow::Result<(R, String)> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let read = from.read_line(&mut line).map(|_| line);
        let _ = tx.send(read.map(|line| (from, line)));
    });
    match rx.recv_timeout(limit) {
        Ok(read) => Ok(read?),
        Err(_) => bail!("printed nothing in {limit:?}"),
    }
}

impl NativeServer {
    /// Starts a group of one on free ports; returns once it listens.
    pub fn start(dir: &Path) -> anyhow::Result<NativeServer> {
        NativeServer::spawn(dir, Vec::new())
    }

    /// Starts `serve-native --data-dir DIR ARGS…`; returns once it listens
    /// (a group member may not serve yet: it has to find its leader).
    fn spawn(dir: &Path, args: Vec<String>) -> anyhow::Result<NativeServer> {
        // Only the parent: the server refuses an existing empty data dir.
        if let Some(parent) = dir.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let mut child = Command::new(std::env::current_exe()?)
            .arg("serve-native")
            .arg("--control")
            .arg("--data-dir")
            .arg(dir)
            .args(&args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("start the native server")?;
        let (Some(commands), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            bail!("the native server's stdin and stdout were not piped");
        };
        let (answers, line) = match first_line(BufReader::new(stdout), START_LIMIT) {
            Ok(read) => read,
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(e.context(format!("start the native server on {}", dir.display())));
            }
        };
        let mut grpc = None;
        let mut http = None;
        for part in line.split_whitespace() {
            if let Some(a) = part.strip_prefix("grpc=") {
                grpc = Some(a.to_string());
            } else if let Some(a) = part.strip_prefix("http=") {
                http = Some(a.to_string());
            }
        }
        match (grpc, http) {
            (Some(grpc), Some(http)) => {
                Ok(NativeServer { child, commands, answers, dir: dir.to_path_buf(), args, grpc, http })
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                bail!("the native server did not start (it printed {line:?})")
            }
        }
    }

    /// `http://127.0.0.1:PORT` of its gRPC API.
    pub fn url(&self) -> String {
        format!("http://{}", self.grpc)
    }

    /// Its HTTP admin address (`127.0.0.1:PORT`).
    pub fn http_addr(&self) -> &str {
        &self.http
    }

    /// Its gRPC address (`127.0.0.1:PORT`), the one the group's membership names.
    pub fn grpc_addr(&self) -> &str {
        &self.grpc
    }

    /// Its data directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Sends `command` (see [`Control`]) and returns its JSON answer; an
    /// answer `{"error": …}` is an error. Blocks until the node answers
    /// (a snapshot takes as long as it takes, within the node's own bound):
    /// in a task, call it inside `tokio::task::block_in_place`.
    pub fn control(&mut self, command: Control) -> anyhow::Result<serde_json::Value> {
        let pid = self.pid();
        writeln!(self.commands, "{}", command.word())
            .and_then(|()| self.commands.flush())
            .with_context(|| format!("send {:?} to node process {pid}", command.word()))?;
        let mut line = String::new();
        if self.answers.read_line(&mut line)? == 0 {
            bail!("node process {pid} ended without answering {:?}", command.word());
        }
        let answer: serde_json::Value =
            serde_json::from_str(&line).with_context(|| format!("node process {pid} answered {line:?}"))?;
        if let Some(e) = answer.get("error") {
            bail!("node process {pid} could not {}: {e}", command.word());
        }
        Ok(answer)
    }

    /// SIGKILL it (nothing more is written) and wait for it to end.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL it (nothing more is written), then start a new one on the same data
    /// (a group of one gets new ports: call [`url`](Self::url) again).
    pub fn kill_and_restart(&mut self) -> anyhow::Result<()> {
        self.kill();
        *self = NativeServer::spawn(&self.dir.clone(), self.args.clone())?;
        Ok(())
    }
}

impl Drop for NativeServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the bench asks of a node over its `--control` channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    /// Its Raft state: `{"state", "leader", "last_log", "applied",
    /// "snapshot", "purged"}` (indexes, `null` for none).
    Raft,
    /// Its engine's gauges and the index they are of: `{"applied", "leases",
    /// "held_locks", "waiters", "token_counter"}` (`applied` null when an
    /// entry was applied while they were read).
    State,
    /// Take a snapshot of everything applied so far, then purge the log up to
    /// it (a new member can then only come in by that snapshot): `{"applied",
    /// "snapshot", "purged", "snapshot_seconds", "purge_seconds"}`.
    Snapshot,
}

impl Control {
    /// The command's word on the channel.
    fn word(self) -> &'static str {
        match self {
            Control::Raft => "raft",
            Control::State => "state",
            Control::Snapshot => "snapshot",
        }
    }

    fn parse(word: &str) -> Option<Control> {
        [Control::Raft, Control::State, Control::Snapshot].into_iter().find(|c| c.word() == word)
    }
}

/// A new Raft group of native servers, node ids 1..=n, each a child process
/// (`serve-native --peers`) on its own free ports of 127.0.0.1 with its data
/// in `dir/node-ID`. All of them share this machine's cores and disk. Dropping
/// it kills every node.
pub struct NativeCluster {
    /// Node id `i + 1` is `nodes[i]`.
    nodes: Vec<NativeServer>,
}

impl NativeCluster {
    /// Starts `n` nodes and returns once one of them leads and serves
    /// (`/healthz` 200). The ports are picked free and released for the nodes to
    /// bind; should another process take one meanwhile, the group is started
    /// again from empty data on new ports (three tries in all).
    pub async fn start(dir: &Path, n: u64) -> anyhow::Result<NativeCluster> {
        let mut last = None;
        for _ in 0..3 {
            match NativeCluster::try_start(dir, n).await {
                Ok(c) => return Ok(c),
                Err(e) => last = Some(e),
            }
            let _ = std::fs::remove_dir_all(dir);
        }
        Err(last.unwrap_or_else(|| anyhow::anyhow!("no try")).context(format!("start a {n}-node fencelock group")))
    }

    async fn try_start(dir: &Path, n: u64) -> anyhow::Result<NativeCluster> {
        let addrs = free_addrs(2 * n as usize)?;
        let (grpc, http) = addrs.split_at(n as usize);
        let peers = peers_arg(grpc);
        let mut nodes = Vec::new();
        for (i, (g, h)) in grpc.iter().zip(http).enumerate() {
            let id = (i + 1).to_string();
            let args =
                ["--node-id", &id, "--peers", &peers, "--grpc-listen", &g.to_string(), "--http-listen", &h.to_string()];
            nodes.push(NativeServer::spawn(&dir.join(format!("node-{id}")), args.map(String::from).to_vec())?);
        }
        let c = NativeCluster { nodes };
        c.wait_leader(Duration::from_secs(30)).await?;
        Ok(c)
    }

    /// Waits until one node's `/healthz` is 200: it leads and serves.
    async fn wait_leader(&self, limit: Duration) -> anyhow::Result<()> {
        let end = Instant::now() + limit;
        loop {
            let mut last = String::new();
            for n in &self.nodes {
                last = match http_get(n.http_addr(), "/healthz").await {
                    Ok((200, _)) => return Ok(()),
                    Ok((status, body)) => format!("{}: {status} {}", n.http_addr(), body.trim()),
                    Err(e) => format!("{e:#}"),
                };
            }
            if Instant::now() > end {
                bail!("no node of the group leads after {limit:?} (last answer: {last})");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `fencelock://127.0.0.1:P1,127.0.0.1:P2,…`: every member; the client
    /// finds the leader itself.
    pub fn url(&self) -> String {
        let hosts: Vec<&str> = self.nodes.iter().map(|n| n.grpc.as_str()).collect();
        format!("fencelock://{}", hosts.join(","))
    }

    /// Every node's process.
    pub fn pids(&self) -> Vec<u32> {
        self.nodes.iter().map(NativeServer::pid).collect()
    }

    /// The nodes, node id `i + 1` at index `i`.
    pub fn nodes(&self) -> &[NativeServer] {
        &self.nodes
    }

    /// Node `id`, to send it commands ([`NativeServer::control`]).
    pub fn node_mut(&mut self, id: u64) -> anyhow::Result<&mut NativeServer> {
        let n = self.nodes.len();
        id.checked_sub(1)
            .and_then(|i| self.nodes.get_mut(i as usize))
            .with_context(|| format!("no node {id} in a group of {n}"))
    }

    /// The id of the node that leads and serves now (`/healthz` 200), waiting
    /// up to `limit` for one; the error says what each node answered last.
    pub async fn leader(&self, limit: Duration) -> anyhow::Result<u64> {
        let end = Instant::now() + limit;
        loop {
            let mut answers = Vec::new();
            for (i, n) in self.nodes.iter().enumerate() {
                match http_get(n.http_addr(), "/healthz").await {
                    Ok((200, _)) => return Ok(i as u64 + 1),
                    Ok((status, body)) => answers.push(format!("node {}: {status} {}", i + 1, body.trim())),
                    Err(e) => answers.push(format!("node {}: {e:#}", i + 1)),
                }
            }
            if Instant::now() > end {
                bail!("no node of the group leads after {limit:?}; /healthz: {}", answers.join("; "));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Kills node `id` (SIGKILL) and deletes its data dir. Take it out of the
    /// membership too (before or after); [`start_empty`](Self::start_empty)
    /// starts it again.
    pub fn wipe(&mut self, id: u64) -> anyhow::Result<()> {
        let node = self.node_mut(id)?;
        node.kill();
        std::fs::remove_dir_all(&node.dir).with_context(|| format!("delete {}", node.dir.display()))
    }

    /// Starts node `id` again with an empty data dir on the ports it had,
    /// waiting to be added to the group (`--join`); returns once it listens.
    pub fn start_empty(&mut self, id: u64) -> anyhow::Result<()> {
        let node = self.node_mut(id)?;
        let args = ["--node-id", &id.to_string(), "--join", "--grpc-listen", &node.grpc, "--http-listen", &node.http]
            .map(String::from)
            .to_vec();
        *node = NativeServer::spawn(&node.dir.clone(), args).with_context(|| format!("start node {id} empty"))?;
        Ok(())
    }
}

/// `n` distinct free addresses on 127.0.0.1 (see `fencelock_testkit::free_port`).
fn free_addrs(n: usize) -> anyhow::Result<Vec<SocketAddr>> {
    Ok((0..n).map(|_| SocketAddr::from(([127, 0, 0, 1], fencelock_testkit::free_port()))).collect())
}

/// `1=ADDR1,2=ADDR2,…`: node ids from 1 in the order given.
fn peers_arg(grpc: &[SocketAddr]) -> String {
    grpc.iter().enumerate().map(|(i, a)| format!("{}={a}", i + 1)).collect::<Vec<_>>().join(",")
}

/// `serve-native`'s options: a group of one on ports of its choosing by
/// default; with `--peers`, a member of a new group on the ports given.
#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// This node's data directory.
    #[arg(long)]
    pub data_dir: PathBuf,
    /// This node's id in the group (≥ 1).
    #[arg(long, default_value_t = 1)]
    pub node_id: u64,
    /// Form a new group of these voters, `ID=HOST:PORT,…` (gRPC addresses, this
    /// node among them; start every member with the same list).
    #[arg(long)]
    pub peers: Option<String>,
    /// Start with an empty data dir and no group of its own: wait to be added
    /// to one (`POST /v1/cluster/members`).
    #[arg(long, conflicts_with = "peers")]
    pub join: bool,
    /// Take commands on stdin, one a line (`raft`, `state`, `snapshot`: see
    /// [`Control`]), each answered with one line of JSON on stdout; the end
    /// of stdin ends the node.
    #[arg(long)]
    pub control: bool,
    /// gRPC listen address (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub grpc_listen: SocketAddr,
    /// HTTP admin listen address (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub http_listen: SocketAddr,
    /// TLS with the files `certs::init` wrote into this directory (node1.pem…).
    #[arg(long)]
    pub tls_dir: Option<PathBuf>,
    /// Authentication with this auth file.
    #[arg(long)]
    pub auth_file: Option<PathBuf>,
}

/// Certificates, an auth file with one token and what `serve-native` and the
/// client URL need for them: (`serve-native` arguments, URL query).
fn secure_setup(dir: &Path) -> anyhow::Result<(Vec<String>, String)> {
    let _ = std::fs::remove_dir_all(dir);
    fencelock_server::certs::init(dir, 1, &["localhost".into(), "127.0.0.1".into()])?;
    let t = fencelock_server::auth::new_token().map_err(anyhow::Error::msg)?;
    let file = dir.join("auth.toml");
    let text = format!(
        "[roles.bench]\nrules = [{{ prefix = \"\", verbs = [\"acquire\", \"check\", \"read\"] }}]\n\
         [[tokens]]\nname = \"bench\"\nid = \"{}\"\nhash = \"{}\"\nroles = [\"bench\"]\nlimits = {{ leases = 0, locks = 0, waits = 0 }}\n",
        t.id, t.hash
    );
    std::fs::write(&file, text)?;
    let args = vec!["--tls-dir".into(), dir.display().to_string(), "--auth-file".into(), file.display().to_string()];
    Ok((args, format!("ca={}&token={}", dir.join("ca.pem").display(), t.token)))
}

/// `serve-native`: run a node in this process until killed, after printing
/// `grpc=ADDR http=ADDR` on one line of stdout.
pub async fn serve_native(a: ServeArgs) -> anyhow::Result<()> {
    trace_from_env(&a.data_dir)?;
    let mut config = fencelock_server::Config::for_test(a.data_dir);
    config.node_id = a.node_id;
    config.grpc_listen = a.grpc_listen;
    config.http_listen = a.http_listen;
    if let Some(p) = &a.peers {
        let peers = parse_peers(p).map_err(|e| anyhow::anyhow!("--peers: {e}"))?;
        config.advertise = peers.get(&a.node_id).cloned();
        config.bootstrap = fencelock_server::Bootstrap::Peers(peers);
    }
    if a.join {
        config.bootstrap = fencelock_server::Bootstrap::Join;
    }
    if let Some(dir) = &a.tls_dir {
        let (cert, key) = fencelock_server::certs::files::node(a.node_id);
        config.tls = Some(fencelock_server::tls::TlsFiles {
            cert: dir.join(cert),
            key: dir.join(key),
            ca: dir.join(fencelock_server::certs::files::CA),
            client_ca: None,
            require_client_cert: false,
        });
    }
    config.auth_file = a.auth_file.clone();
    tune_from_env(&mut config)?;
    // The bench measures the engine, not the default limits (W3 makes 1M leases).
    config.limits.global = fencelock_server::quota::Global { leases: 0, locks: 0, waiters: 0 };
    let running = fencelock_server::start(config).await?;
    println!("grpc={} http={}", running.grpc_addr, running.http_addr);
    if a.control {
        serve_control(&running).await?;
    } else {
        tokio::signal::ctrl_c().await?;
    }
    running.shutdown().await;
    Ok(())
}

/// How long a node waits for a snapshot it was asked for to be built.
const SNAPSHOT_LIMIT: Duration = Duration::from_secs(30 * 60);
/// How long it waits for its log to be purged up to that snapshot (openraft
/// purges only what no replication is reading).
const PURGE_LIMIT: Duration = Duration::from_secs(60);

/// `--control`: answers the commands on stdin (read by a thread of its own)
/// one by one, until stdin ends or SIGINT.
async fn serve_control(running: &fencelock_server::Running) -> anyhow::Result<()> {
    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lines() {
            if line.map(|l| lines_tx.send(l)).is_err() {
                return;
            }
        }
    });
    loop {
        let line = tokio::select! {
            r = tokio::signal::ctrl_c() => return r.context("watch SIGINT"),
            line = lines.recv() => match line {
                Some(line) => line,
                None => return Ok(()),
            },
        };
        let answer = tokio::select! {
            r = tokio::signal::ctrl_c() => return r.context("watch SIGINT"),
            a = answer_control(running, line.trim()) => a,
        };
        let json = answer.unwrap_or_else(|e| serde_json::json!({ "error": format!("{e:#}") }));
        let mut out = std::io::stdout().lock();
        if writeln!(out, "{json}").and_then(|()| out.flush()).is_err() {
            return Ok(());
        }
    }
}

/// The answer to one `--control` command.
async fn answer_control(running: &fencelock_server::Running, command: &str) -> anyhow::Result<serde_json::Value> {
    match Control::parse(command) {
        Some(Control::Raft) => Ok(raft_state(&running.raft)),
        Some(Control::State) => Ok(engine_state(running)),
        Some(Control::Snapshot) => snapshot_and_purge(&running.raft).await,
        None => Err(anyhow::anyhow!("unknown command {command:?}")),
    }
}

/// [`Control::State`]'s answer: the engine's gauges, and the applied index
/// read just before and just after them (equal: the gauges are of that index).
fn engine_state(running: &fencelock_server::Running) -> serde_json::Value {
    let applied = || running.raft.metrics().borrow().last_applied.map(|l| l.index);
    let before = applied();
    let s = running.stats();
    serde_json::json!({
        "applied": before.filter(|&b| applied() == Some(b)),
        "leases": s.leases,
        "held_locks": s.held_locks,
        "waiters": s.waiters,
        "token_counter": s.token_counter,
    })
}

/// [`Control::Raft`]'s answer.
fn raft_state(raft: &fencelock_server::raft::Raft) -> serde_json::Value {
    let m = raft.metrics().borrow().clone();
    serde_json::json!({
        "state": format!("{:?}", m.state).to_lowercase(),
        "leader": m.current_leader,
        "last_log": m.last_log_index,
        "applied": m.last_applied.map(|l| l.index),
        "snapshot": m.snapshot.map(|l| l.index),
        "purged": m.purged.map(|l| l.index),
    })
}

/// [`Control::Snapshot`]: a snapshot of at least what is applied now, then
/// the log purged up to it (waiting at most [`PURGE_LIMIT`] for that; the
/// answer says how far it got).
async fn snapshot_and_purge(raft: &fencelock_server::raft::Raft) -> anyhow::Result<serde_json::Value> {
    let applied = raft.metrics().borrow().last_applied.map(|l| l.index);
    let started = Instant::now();
    // Asked again every few seconds: openraft ignores the ask while it builds
    // one (one its policy started may stop short of `applied`).
    let m = loop {
        raft.trigger().snapshot().await.context("trigger a snapshot")?;
        let waited = raft.wait(Some(Duration::from_secs(5)));
        match waited.metrics(|m| m.snapshot.map(|l| l.index) >= applied, "a snapshot of what is applied").await {
            Ok(m) => break m,
            Err(e) if started.elapsed() > SNAPSHOT_LIMIT => return Err(e.into()),
            Err(_) => {}
        }
    };
    let snapshot_seconds = started.elapsed().as_secs_f64();
    let snapshot = m.snapshot.map(|l| l.index).context("no snapshot")?;
    let purging = Instant::now();
    raft.trigger().purge_log(snapshot).await.context("trigger the purge")?;
    let up_to = Some(snapshot);
    let _ = raft.wait(Some(PURGE_LIMIT)).metrics(|m| m.purged.map(|l| l.index) >= up_to, "the log purged").await;
    let purged = raft.metrics().borrow().purged.map(|l| l.index);
    Ok(serde_json::json!({
        "applied": applied,
        "snapshot": snapshot,
        "purged": purged,
        "snapshot_seconds": snapshot_seconds,
        "purge_seconds": purging.elapsed().as_secs_f64(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the group's members are started with parses back to the same map;
    /// malformed lists say why.
    #[test]
    fn peers_round_trip_and_errors() {
        let addrs: Vec<SocketAddr> =
            ["127.0.0.1:7070", "127.0.0.1:7170", "127.0.0.1:7270"].map(|a| a.parse().unwrap()).to_vec();
        let p = parse_peers(&peers_arg(&addrs)).unwrap();
        assert_eq!(
            p.into_iter().collect::<Vec<_>>(),
            vec![(1, "127.0.0.1:7070".into()), (2, "127.0.0.1:7170".into()), (3, "127.0.0.1:7270".into())]
        );
        for bad in ["", "1", "0=a:1", "x=a:1", "1=a:1,1=b:2", "2="] {
            assert!(parse_peers(bad).is_err(), "{bad:?} accepted");
        }
    }

    /// Free addresses are distinct and on loopback.
    #[test]
    fn free_addrs_distinct() {
        let a = free_addrs(6).unwrap();
        let mut ports: Vec<u16> = a.iter().map(SocketAddr::port).collect();
        ports.sort_unstable();
        ports.dedup();
        assert_eq!(ports.len(), 6);
        assert!(a.iter().all(|a| a.ip().is_loopback()));
    }

    /// Issue 19 §6: without `--client-mode` the native engines are measured
    /// per process and shared, the peers per process; a mode asked for holds
    /// for every engine. `ID/shared` is the same server (URL, processes).
    #[test]
    fn client_modes() {
        let engine = |id: &str| Engine { info: info(id, true).unwrap(), url: "u".into(), pids: vec![7], shared: false };
        let ids = |e: Vec<Engine>| e.iter().map(|e| (e.info.id.clone(), e.shared)).collect::<Vec<_>>();
        assert_eq!(
            ids(in_modes(engine("fencelock"), None)),
            [("fencelock".into(), false), ("fencelock/shared".into(), true)]
        );
        assert_eq!(ids(in_modes(engine("zookeeper"), None)), [("zookeeper".into(), false)]);
        assert_eq!(ids(in_modes(engine("zookeeper"), Some(ClientMode::Both))).len(), 2);
        assert_eq!(ids(in_modes(engine("fencelock"), Some(ClientMode::Shared))), [("fencelock/shared".into(), true)]);
        assert_eq!(ids(in_modes(engine("fencelock-3"), Some(ClientMode::PerProcess))), [("fencelock-3".into(), false)]);
        let shared = in_modes(engine("redis"), Some(ClientMode::Shared)).remove(0);
        assert!(shared.info.shared_connection && shared.url == "u" && shared.pids == [7]);
    }

    /// A starting node that prints nothing does not hold the bench forever:
    /// the first line is awaited for a bounded time, and one printed in time
    /// is read with the reader handed back.
    #[test]
    fn a_silent_child_is_given_up_on() {
        let mut silent = Command::new("sleep").arg("30").stdout(Stdio::piped()).spawn().unwrap();
        let out = BufReader::new(silent.stdout.take().unwrap());
        // Without the bound this would wait out the sleep and read an empty line.
        let err = first_line(out, Duration::from_millis(200)).unwrap_err();
        assert!(err.to_string().contains("printed nothing in 200ms"), "{err}");
        silent.kill().unwrap();
        silent.wait().unwrap();

        let mut talks = Command::new("printf").arg("grpc=a http=b\\nmore\\n").stdout(Stdio::piped()).spawn().unwrap();
        let (mut rest, line) =
            first_line(BufReader::new(talks.stdout.take().unwrap()), Duration::from_secs(30)).unwrap();
        assert_eq!(line, "grpc=a http=b\n");
        let mut next = String::new();
        rest.read_line(&mut next).unwrap();
        assert_eq!(next, "more\n");
        talks.wait().unwrap();
    }

    /// Every control command's word reads back as that command; any other
    /// line is no command.
    #[test]
    fn control_words() {
        for c in [Control::Raft, Control::State, Control::Snapshot] {
            assert_eq!(Control::parse(c.word()), Some(c));
        }
        assert_eq!(Control::parse("snapshot "), None, "the node trims a line before it parses it");
        assert_eq!(Control::parse(""), None);
        assert_eq!(Control::parse("purge"), None);
    }

    /// An engine's CPU is the sum over its processes; none without processes.
    #[test]
    fn engine_cpu_sums_processes() {
        let e = |pids: Vec<u32>| Engine {
            info: info("fencelock-3", true).unwrap(),
            url: String::new(),
            pids,
            shared: false,
        };
        let me = std::process::id();
        assert!(e(Vec::new()).cpu_time().is_none());
        assert!(e(vec![me, u32::MAX]).cpu_time().is_none(), "an unreadable process makes the sum unknown");
        let one = e(vec![me]).cpu_time().unwrap();
        assert!(e(vec![me, me]).cpu_time().unwrap() >= one * 2);
    }
}
