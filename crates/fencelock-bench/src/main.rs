//! `fencelock-bench cycles`: how many acquire+release cycles per second N
//! concurrent clients get over the session stream, each client on its own
//! connection, session and lease.
//!
//! By default it starts a server in this process on a temp dir (same machine,
//! same cores: the figure includes the server's work and its fsyncs); `--server`
//! points it at a running one instead. It prints the machine, every run, and the
//! median; the server's batching (commands per log entry) is read from its
//! metrics when it runs in-process.

use std::{
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use anyhow::{bail, Context};
use clap::Parser;
use fencelock::{Acquire, Client};
use tokio::time::Instant;

#[derive(Parser, Debug)]
#[command(about = "acquire+release cycles/s for concurrent clients over session streams")]
struct Args {
    /// Concurrent clients (each its own connection, session and lease).
    #[arg(long, default_value_t = 64)]
    clients: usize,
    /// Distinct locks the clients cycle on (client i uses lock i % locks).
    /// Equal to --clients: no contention; 1: every client contends for one lock.
    #[arg(long)]
    locks: Option<usize>,
    /// Measured seconds per run (after a 1 s warm-up).
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Number of runs.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Use this server instead of starting one in-process.
    #[arg(long)]
    server: Option<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let locks = args.locks.unwrap_or(args.clients).max(1);
    let tmp = tempfile::tempdir()?;
    let (url, running) = match &args.server {
        Some(u) => (u.clone(), None),
        None => {
            let r = fencelock_server::start(fencelock_server::Config::for_test(tmp.path())).await?;
            (format!("http://{}", r.grpc_addr), Some(r))
        }
    };
    wait_ready(&url).await?;
    println!("machine: {}", machine());
    println!(
        "workload: {} clients over session streams, {} lock(s), {} s per run, {} runs, server {}",
        args.clients,
        locks,
        args.seconds,
        args.runs,
        if running.is_some() { "in-process (redb in a temp dir)" } else { url.as_str() }
    );
    let mut rates = Vec::new();
    for run in 1..=args.runs {
        let before = match running.as_ref() {
            Some(r) => Some(server_batching(r.http_addr).await?),
            None => None,
        };
        let (cycles, secs, lat) = one_run(&url, args.clients, locks, args.seconds).await?;
        let rate = cycles as f64 / secs;
        let batching = match (before, running.as_ref()) {
            (Some((e1, c1)), Some(r)) => {
                let (e2, c2) = server_batching(r.http_addr).await?;
                format!(", {:.1} commands per log entry", (c2 - c1) as f64 / (e2 - e1).max(1) as f64)
            }
            _ => String::new(),
        };
        println!(
            "run {run}: {cycles} cycles in {secs:.2} s = {rate:.0} cycles/s; cycle latency p50 {:.2} ms, p99 {:.2} ms{batching}",
            lat.0, lat.1
        );
        rates.push(rate);
    }
    rates.sort_by(|a, b| a.total_cmp(b));
    println!("median: {:.0} acquire+release cycles/s ({} runs)", rates[rates.len() / 2], rates.len());
    if let Some(r) = running {
        r.shutdown().await;
    }
    Ok(())
}

async fn wait_ready(url: &str) -> anyhow::Result<()> {
    let start = Instant::now();
    loop {
        if let Ok(c) = Client::connect(url).await {
            if c.list("", 1).await.is_ok() {
                return Ok(());
            }
        }
        if start.elapsed() > Duration::from_secs(20) {
            bail!("server at {url} not ready after 20 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One measured run: (cycles, seconds, (p50 ms, p99 ms)).
async fn one_run(url: &str, clients: usize, locks: usize, seconds: u64) -> anyhow::Result<(u64, f64, (f64, f64))> {
    let measuring = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for i in 0..clients {
        let client = Client::connect(url).await.context("connect")?;
        let session = client.session().await.context("open session")?;
        let lease = session.grant_lease(Duration::from_secs(30)).await?;
        let lock = format!("bench/{}", i % locks);
        let (measuring, stop, count) = (measuring.clone(), stop.clone(), count.clone());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                let a = session.acquire(&lock, lease, Duration::from_secs(10), Duration::ZERO).await?;
                let Acquire::Acquired(g) = a else { bail!("not acquired: {a:?}") };
                if !session.release(&lock, lease, g.token).await? {
                    bail!("release of {lock} token {} failed", g.token);
                }
                if measuring.load(Ordering::Relaxed) {
                    count.fetch_add(1, Ordering::Relaxed);
                    lat.push(t.elapsed().as_secs_f64() * 1000.0);
                }
            }
            let _ = session.revoke_lease(lease).await;
            anyhow::Ok(lat)
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    measuring.store(true, Ordering::Relaxed);
    let start = Instant::now();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    measuring.store(false, Ordering::Relaxed);
    let secs = start.elapsed().as_secs_f64();
    let cycles = count.load(Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await??);
    }
    lat.sort_by(|a, b| a.total_cmp(b));
    let pct = |p: f64| lat.get(((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1))).copied().unwrap_or(0.0);
    Ok((cycles, secs, (pct(0.5), pct(0.99))))
}

/// (log entries, commands) written by the server's driver so far, from /metrics.
async fn server_batching(http: std::net::SocketAddr) -> anyhow::Result<(u64, u64)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(http).await?;
    s.write_all(format!("GET /metrics HTTP/1.1\r\nHost: {http}\r\nConnection: close\r\n\r\n").as_bytes()).await?;
    let mut body = String::new();
    s.read_to_string(&mut body).await?;
    let get = |name: &str| {
        body.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse::<u64>().ok()))
            .unwrap_or(0)
    };
    Ok((get("fencelock_log_entries_total "), get("fencelock_log_commands_total ")))
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| c.lines().find(|l| l.starts_with("model name")).map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string()))
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!("{cores} cores, {cpu}, Linux {}", kernel.trim())
}
