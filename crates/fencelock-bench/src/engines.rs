//! The engines under test: each lock service started on free ports of
//! 127.0.0.1 with its data in a temp dir, or reached at a URL given.
//!
//! Where it sits: `main` starts the engines once and runs every workload cell
//! against each of them in turn. Peers come from `fencelock-testkit` (Debian's
//! redis-server, etcd, ZooKeeper, PostgreSQL, each in its durable default
//! except Redis without AOF); the native server runs as a child process of this
//! binary (`fencelock-bench serve-native`), so that its CPU and memory are its
//! own and it can be killed like any other server. `fencelock-3` is three such
//! children forming one Raft group on this machine; the clients are given all
//! three and follow the leader themselves.

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader},
    net::{SocketAddr, TcpListener},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use anyhow::{bail, Context};
use fencelock_testkit::{EtcdServer, PgServer, RedisServer, ZkServer};
use tokio::time::Instant;

use crate::{model::EngineInfo, procstat, procstat::command_line, scale::http_get};

/// Every engine, in the order they are started and measured.
pub const ALL: &[&str] = &["fencelock", "fencelock-3", "redis", "redis-aof", "etcd", "zookeeper", "postgres", "pg-advisory", "redis-poll"];

/// A started (or given) engine.
pub struct Engine {
    pub info: EngineInfo,
    /// The URL `fencelock::connect` takes (for `redis-poll`, the Redis URL).
    pub url: String,
    /// The processes whose CPU is charged to this engine (every node of a
    /// group); empty for an engine given by URL.
    pub pids: Vec<u32>,
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
    native3: Option<NativeCluster>,
    redis: Option<RedisServer>,
    redis_aof: Option<RedisServer>,
    etcd: Option<EtcdServer>,
    zk: Option<ZkServer>,
    pg: Option<PgServer>,
}

/// Starts `id` (or uses `given` as its URL, without CPU figures).
pub async fn start(id: &str, given: Option<&str>, servers: &mut Servers, data: &Path) -> anyhow::Result<Engine> {
    let (url, pids) = match given {
        Some(url) => (url.to_string(), Vec::new()),
        None => launch(id, servers, data).await?,
    };
    let info = info(id, !pids.is_empty())?;
    Ok(Engine { info, url, pids })
}

async fn launch(id: &str, s: &mut Servers, data: &Path) -> anyhow::Result<(String, Vec<u32>)> {
    Ok(match id {
        "fencelock" => {
            let n = s.native.insert(NativeServer::start(&data.join("fencelock"))?);
            (n.url(), vec![n.pid()])
        }
        "fencelock-3" => {
            let c = s.native3.insert(NativeCluster::start(&data.join("fencelock-3"), 3).await?);
            (c.url(), c.pids())
        }
        "redis" | "redis-poll" => {
            let r = s.redis.get_or_insert_with(RedisServer::start_volatile);
            (r.url(), vec![r.pid()])
        }
        "redis-aof" => {
            let r = s.redis_aof.get_or_insert_with(RedisServer::start);
            (format!("{}?durable=true", r.url()), vec![r.pid()])
        }
        "etcd" => {
            let e = s.etcd.get_or_insert_with(EtcdServer::start);
            (e.url(), vec![e.pid()])
        }
        "zookeeper" => {
            let z = s.zk.get_or_insert_with(ZkServer::start);
            (z.url(), vec![z.pid()])
        }
        "postgres" | "pg-advisory" => {
            let p = s.pg.get_or_insert_with(PgServer::start);
            let url = if id == "postgres" { p.url() } else { format!("{}?mode=advisory", p.url()) };
            (url, vec![p.pid()])
        }
        other => bail!("unknown engine {other:?}; known: {}", ALL.join(", ")),
    })
}

/// Label, version and declared guarantees of `id`.
fn info(id: &str, cpu_measured: bool) -> anyhow::Result<EngineInfo> {
    let redis = || command_line("redis-server", &["--version"]).and_then(|v| v.split_whitespace().nth(2).map(|s| s.trim_start_matches("v=").to_string()));
    let pg = || command_line(&pg_bin("postgres"), &["--version"]).and_then(|v| v.split_whitespace().nth(2).map(String::from));
    let (label, version, durable, fencing, fifo) = match id {
        "fencelock" => ("fencelock (1 node, redb, fsync per batch)", Some(env!("CARGO_PKG_VERSION").to_string()), true, "global", true),
        "fencelock-3" => (
            "fencelock, 3-node Raft group (3 processes on this machine, each redb, fsync per batch)",
            Some(env!("CARGO_PKG_VERSION").to_string()),
            true,
            "global",
            true,
        ),
        "redis" => ("Redis, no AOF (fencelock's FIFO recipe)", redis(), false, "global", true),
        "redis-aof" => ("Redis, AOF appendfsync always (FIFO recipe)", redis(), true, "global", true),
        "redis-poll" => ("Redis, no AOF, SET NX + 100 ms polling (redis-py's Lock)", redis(), false, "none", false),
        "etcd" => ("etcd (concurrency-style recipe)", command_line("etcd", &["--version"]).and_then(|v| v.split_whitespace().last().map(String::from)), true, "per lock", true),
        "zookeeper" => ("ZooKeeper (Curator-style recipe)", command_line("dpkg-query", &["-W", "-f", "${Version}", "zookeeper"]), true, "per lock", true),
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
/// with its data in `dir`.
pub struct NativeServer {
    child: Child,
    dir: PathBuf,
    grpc: String,
    http: String,
}

impl NativeServer {
    /// Starts it on free ports; returns once it listens.
    pub fn start(dir: &Path) -> anyhow::Result<NativeServer> {
        std::fs::create_dir_all(dir)?;
        let mut child = Command::new(std::env::current_exe()?)
            .arg("serve-native")
            .arg("--data-dir")
            .arg(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("start the native server")?;
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line)?;
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
            (Some(grpc), Some(http)) => Ok(NativeServer { child, dir: dir.to_path_buf(), grpc, http }),
            _ => {
                let _ = child.kill();
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

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL it (nothing more is written), then start a new one on the same data
    /// (new ports: call [`url`](Self::url) again).
    pub fn kill_and_restart(&mut self) -> anyhow::Result<()> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        *self = NativeServer::start(&self.dir.clone())?;
        Ok(())
    }
}

impl Drop for NativeServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `serve-native`: run a node in this process until killed, after printing
/// `grpc=ADDR http=ADDR` on one line of stdout.
pub async fn serve_native(data_dir: PathBuf) -> anyhow::Result<()> {
    let running = fencelock_server::start(fencelock_server::Config::for_test(data_dir)).await?;
    println!("grpc={} http={}", running.grpc_addr, running.http_addr);
    tokio::signal::ctrl_c().await?;
    running.shutdown().await;
    Ok(())
}
