//! `fencelock demo`: the paused-holder scenario of Kleppmann's "How to do
//! distributed locking" (2016), played with real processes.
//!
//! A lock server and a fenced storage server start on free ports with data in a
//! temp dir. Client A (its own `fencelock` process) acquires the lock and reads
//! the object; A is paused with SIGSTOP for longer than its TTL, so its lease
//! expires; client B acquires with a larger token, reads, appends and writes;
//! A resumes and writes what it computed from its old read, with its old token.
//! With fencing the storage rejects A's write and B's write is kept; the same
//! scenario with fencing off shows B's acknowledged write silently lost.
//!
//! A does not look at its lease before writing, on purpose: the pause could have
//! hit right after such a check, which is why only the resource can stop it.

#![allow(clippy::disallowed_methods)] // the demo prints a timeline of its processes by the clock; it decides no expiry

use std::{
    net::SocketAddr,
    path::Path,
    process::{ExitCode, Stdio},
    time::Duration,
};

use anyhow::{bail, Context};
use clap::Args;
use nix::{
    sys::signal::{kill, Signal},
    unistd::Pid,
};
use serde_json::{json, Value};
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines},
    process::{Child, ChildStdout, Command},
    time::Instant,
};

use fencelock_http::{parse_duration, HttpUrl, Scheme};

use crate::{exit, http::request_tls};

const LOCK: &str = "demo-ledger";
const KEY: &str = "ledger";

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Lease TTL of clients A and B.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    ttl: Duration,
    /// How long A stays paused; longer than the TTL.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pause: Duration,
    /// Play only the fenced run.
    #[arg(long)]
    fenced_only: bool,
}

pub async fn demo(a: DemoArgs) -> anyhow::Result<ExitCode> {
    if a.pause <= a.ttl {
        bail!("--pause ({:?}) must be longer than --ttl ({:?}) for A's lease to expire", a.pause, a.ttl);
    }
    let fenced = play(true, &a).await?;
    let unfenced = if a.fenced_only { None } else { Some(play(false, &a).await?) };
    println!("\nresult:");
    println!(
        "  fencing on:  {}",
        if fenced.lost_nothing {
            "nothing lost; A's stale write was rejected"
        } else {
            "AN ACKNOWLEDGED WRITE WAS LOST"
        }
    );
    if let Some(u) = unfenced {
        println!(
            "  fencing off: {}",
            if u.lost_nothing {
                "nothing lost this time (the race did not happen)"
            } else {
                "B's acknowledged write was silently lost"
            }
        );
    }
    Ok(ExitCode::from(if fenced.lost_nothing { exit::OK } else { exit::ERROR }))
}

struct Outcome {
    lost_nothing: bool,
}

/// One run of the scenario, with the storage server enforcing tokens or not.
async fn play(fencing: bool, a: &DemoArgs) -> anyhow::Result<Outcome> {
    let tmp = tempfile::tempdir()?;
    let lock_srv = Servers::start(tmp.path(), fencing).await?;
    let mut tl = Timeline::new();
    println!("\n=== the paused holder, fencing {} ===", if fencing { "ON" } else { "OFF" });
    tl.say(format!(
        "lock server at {}, storage at http://{} ({})",
        lock_srv.lock_url,
        lock_srv.storage,
        if fencing { "rejects stale tokens" } else { "fencing off: accepts every write" }
    ));

    let mut a_proc = DemoClient::spawn("A", &lock_srv, a.ttl, Duration::ZERO, true)?;
    a_proc.events_until(&mut tl, "ready").await?;
    let pid = Pid::from_raw(a_proc.child.id().context("A has no pid")? as i32);
    kill(pid, Signal::SIGSTOP)?;
    let paused_at = Instant::now();
    tl.say(format!(
        "A is paused (SIGSTOP) for {:?}, longer than its {:?} TTL (a GC pause, a VM stall)",
        a.pause, a.ttl
    ));

    let mut b_proc = DemoClient::spawn("B", &lock_srv, a.ttl, Duration::from_secs(30), false)?;
    b_proc.events_until(&mut tl, "exit").await?;
    b_proc.child.wait().await?;

    tokio::time::sleep_until(paused_at + a.pause).await;
    kill(pid, Signal::SIGCONT)?;
    tl.say("A resumes (SIGCONT); it still believes it holds the lock, and writes".into());
    a_proc.proceed().await?;
    a_proc.events_until(&mut tl, "exit").await?;
    a_proc.child.wait().await?;

    let (_, body) = request_tls(None, lock_srv.storage, "GET", &format!("/objects/{KEY}"), &[], b"").await?;
    let final_list: Vec<String> = serde_json::from_str(&body).unwrap_or_default();
    tl.say(format!("final object {KEY:?}: {final_list:?}"));
    print_audit(lock_srv.storage).await?;
    let acked: Vec<String> = a_proc.acked.iter().chain(&b_proc.acked).cloned().collect();
    let lost: Vec<&String> = acked.iter().filter(|e| final_list.iter().filter(|f| f == e).count() != 1).collect();
    for e in &lost {
        println!("  LOST: acknowledged write {e:?} is not in the final object");
    }
    Ok(Outcome { lost_nothing: lost.is_empty() })
}

async fn print_audit(storage: SocketAddr) -> anyhow::Result<()> {
    let (_, log) = request_tls(None, storage, "GET", "/log", &[], b"").await?;
    println!("  storage audit log:");
    for line in log.lines().filter(|l| !l.is_empty()) {
        let e: Value = serde_json::from_str(line)?;
        println!(
            "    {:<6} {:<6} token {:<4} -> {}{}",
            e["op"].as_str().unwrap_or("?"),
            e["key"].as_str().unwrap_or("?"),
            e["token"].as_u64().unwrap_or(0),
            e["outcome"].as_str().unwrap_or("?"),
            if e["outcome"] == "accepted" { String::new() } else { format!(" (highest seen {})", e["highest"]) }
        );
    }
    Ok(())
}

/// Prints events with the time since the run started.
struct Timeline {
    start: Instant,
}

impl Timeline {
    fn new() -> Self {
        Self { start: Instant::now() }
    }

    fn say(&mut self, what: String) {
        println!("  t={:>5} ms  {what}", self.start.elapsed().as_millis());
    }
}

/// The lock server and the storage server of one run, as child processes.
struct Servers {
    lock_url: String,
    storage: SocketAddr,
    _children: Vec<Child>,
}

impl Servers {
    async fn start(dir: &Path, fencing: bool) -> anyhow::Result<Self> {
        let (grpc, http, storage) = (free_addr()?, free_addr()?, free_addr()?);
        let exe = std::env::current_exe()?;
        let mut lock = Command::new(&exe);
        lock.arg("serve").arg("--data-dir").arg(dir.join("lock")).args([
            "--listen",
            &grpc.to_string(),
            "--http",
            &http.to_string(),
        ]);
        let mut store = Command::new(&exe);
        store.arg("storage").arg("--data-dir").arg(dir.join("storage")).args(["--listen", &storage.to_string()]);
        if !fencing {
            store.arg("--unfenced");
        }
        let mut children = Vec::new();
        for c in [&mut lock, &mut store] {
            children.push(c.stdout(Stdio::null()).stderr(Stdio::null()).kill_on_drop(true).spawn()?);
        }
        wait_healthy(http).await?;
        wait_healthy(storage).await?;
        Ok(Self { lock_url: format!("http://{grpc}"), storage, _children: children })
    }
}

fn free_addr() -> anyhow::Result<SocketAddr> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

async fn wait_healthy(addr: SocketAddr) -> anyhow::Result<()> {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(20) {
        if let Ok((200, _)) = request_tls(None, addr, "GET", "/healthz", &[], b"").await {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    bail!("server at {addr} did not become healthy")
}

/// A demo client process (`fencelock demo-client`) and what it reported.
struct DemoClient {
    name: &'static str,
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
    /// Entries whose write the storage acknowledged (2xx).
    acked: Vec<String>,
}

impl DemoClient {
    fn spawn(name: &'static str, s: &Servers, ttl: Duration, wait: Duration, hold: bool) -> anyhow::Result<Self> {
        let mut c = Command::new(std::env::current_exe()?);
        c.args(["demo-client", "--name", name, "--server", &s.lock_url, "--storage", &s.storage.to_string()])
            .args(["--ttl", &format!("{}ms", ttl.as_millis()), "--wait", &format!("{}ms", wait.as_millis())])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true);
        if hold {
            c.arg("--hold");
        }
        let mut child = c.spawn()?;
        let stdout = child.stdout.take().context("no stdout")?;
        Ok(Self { name, child, lines: BufReader::new(stdout).lines(), acked: Vec::new() })
    }

    /// Tell a `--hold` client to go on and write.
    async fn proceed(&mut self) -> anyhow::Result<()> {
        let stdin = self.child.stdin.as_mut().context("no stdin")?;
        stdin.write_all(b"write\n").await?;
        Ok(())
    }

    /// Print this client's events until `last` (or its exit).
    async fn events_until(&mut self, tl: &mut Timeline, last: &str) -> anyhow::Result<()> {
        while let Some(line) = self.lines.next_line().await? {
            let e: Value = serde_json::from_str(&line).with_context(|| format!("bad event {line:?}"))?;
            let kind = e["event"].as_str().unwrap_or("");
            if let Some(text) = describe(&e) {
                tl.say(format!("{}  {text}", self.name));
            }
            if kind == "write" && e["status"].as_u64().is_some_and(|s| (200..300).contains(&s)) {
                self.acked.push(e["entry"].as_str().unwrap_or_default().to_string());
            }
            if kind == last {
                return Ok(());
            }
        }
        if last == "exit" {
            return Ok(());
        }
        bail!("client {} ended before {last:?}", self.name)
    }
}

fn describe(e: &Value) -> Option<String> {
    let t = &e["token"];
    Some(match e["event"].as_str()? {
        "acquired" => format!("acquired {LOCK:?}: token {t}, lease {}", e["lease"]),
        "read" => format!("read {KEY:?} with token {t}: {}", e["content"]),
        "write" => match e["status"].as_u64() {
            Some(s) if (200..300).contains(&s) => {
                format!("wrote {KEY:?} = {} with token {t}: accepted ({s})", e["content"])
            }
            Some(409) => format!(
                "wrote {KEY:?} = {} with token {t}: REJECTED 409 {}",
                e["content"],
                e["body"].as_str().unwrap_or_default()
            ),
            s => format!("write with token {t} failed: {s:?} {}", e["body"].as_str().unwrap_or_default()),
        },
        "released" => format!("released (token {t})"),
        "lost" => format!(
            "notices its lease was lost ({}): too late, the write already went out",
            e["reason"].as_str().unwrap_or_default()
        ),
        _ => return None,
    })
}

/// `fencelock demo-client`: one side of the demo, reporting JSON lines on stdout.
#[derive(Args, Debug)]
pub struct DemoClientArgs {
    #[arg(long)]
    name: String,
    #[arg(long)]
    server: String,
    /// The storage server: host:port or http://host:port, or
    /// https://host:port with --storage-ca.
    #[arg(long)]
    storage: String,
    /// The CA (PEM) of the storage server's certificate, for https://.
    #[arg(long)]
    storage_ca: Option<std::path::PathBuf>,
    #[arg(long, value_parser = parse_duration)]
    ttl: Duration,
    #[arg(long, value_parser = parse_duration)]
    wait: Duration,
    /// Between the read and the write, wait for a line on stdin.
    #[arg(long)]
    hold: bool,
}

pub async fn demo_client(a: DemoClientArgs) -> anyhow::Result<ExitCode> {
    let storage = StorageUrl::parse(&a.storage, a.storage_ca.as_deref())?;
    // The client library's URL grammar, so `fencelock+tls://…?ca=…` works too.
    let server = fencelock::backend::BackendUrl::parse(&a.server)?;
    let client =
        fencelock::Client::connect(server.raw.clone()).await.with_context(|| format!("connecting to {server}"))?;
    let guard = match client.lock(LOCK).ttl(a.ttl).wait(a.wait).acquire().await? {
        fencelock::Outcome::Acquired(g) => g,
        other => bail!("{} could not acquire: {other:?}", a.name),
    };
    let token = guard.fencing_token()?;
    emit(json!({"event": "acquired", "token": token, "lease": guard.lease_id()}));
    let fencing = [("Fencing-Lock", LOCK.to_string()), ("Fencing-Token", token.to_string())];
    let (status, body) = storage.request("GET", &format!("/objects/{KEY}"), &fencing, b"").await?;
    let mut list: Vec<String> = if status == 200 { serde_json::from_str(&body)? } else { Vec::new() };
    emit(json!({"event": "read", "token": token, "content": list}));
    if a.hold {
        emit(json!({"event": "ready"}));
        let mut line = String::new();
        BufReader::new(tokio::io::stdin()).read_line(&mut line).await?;
    }
    let entry = format!("{} booked seat 7", a.name);
    list.push(entry.clone());
    let bytes = serde_json::to_vec(&list)?;
    let (status, body) = storage.request("PUT", &format!("/objects/{KEY}"), &fencing, &bytes).await?;
    emit(json!({"event": "write", "token": token, "entry": entry, "content": list, "status": status, "body": body}));
    if let Some(reason) = guard.lease_watch().lost_reason() {
        emit(json!({"event": "lost", "token": token, "reason": reason.to_string()}));
    } else if guard.release().await? {
        emit(json!({"event": "released", "token": token}));
    }
    emit(json!({"event": "exit"}));
    Ok(ExitCode::from(exit::OK))
}

fn emit(v: Value) {
    println!("{v}");
}

/// Where a client finds the storage server: an address, and TLS for
/// `https://` (the CA of its certificate, which must name the address).
struct StorageUrl {
    addr: SocketAddr,
    tls: Option<std::sync::Arc<tokio_rustls::rustls::ClientConfig>>,
}

impl StorageUrl {
    /// `host:port`, `http://host:port`, or `https://host:port` with `ca`.
    fn parse(raw: &str, ca: Option<&Path>) -> anyhow::Result<Self> {
        let url = HttpUrl::parse_or_http(raw).map_err(|e| anyhow::anyhow!("--storage {raw:?}: {e}"))?;
        let Some(addr) = url.socket_addr().filter(|_| url.is_base()) else {
            bail!("--storage {raw:?}: expected host:port (an IP address)");
        };
        let tls = match (url.scheme == Scheme::Https, ca) {
            (true, Some(ca)) => {
                use fencelock::backend::tls::{client_config, read_certs, TlsFiles, Verify};
                let files = TlsFiles { ca_pem: read_certs(ca)?, identity: None };
                Some(std::sync::Arc::new(client_config(&files, Verify::Full)?))
            }
            (true, None) => bail!("--storage {raw:?}: https:// needs --storage-ca"),
            (false, Some(_)) => bail!("--storage-ca is for an https:// storage server"),
            (false, None) => None,
        };
        Ok(Self { addr, tls })
    }

    async fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, String)],
        body: &[u8],
    ) -> anyhow::Result<(u16, String)> {
        request_tls(self.tls.as_ref(), self.addr, method, path, headers, body).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rule: the demo client reaches the storage server by `host:port` or
    /// `http://` (plaintext, unchanged) or `https://` with `--storage-ca`;
    /// TLS without a CA, a CA without TLS, or another scheme is an error.
    #[test]
    fn storage_urls() {
        assert!(StorageUrl::parse("127.0.0.1:7072", None).unwrap().tls.is_none());
        assert_eq!(StorageUrl::parse("http://127.0.0.1:7072/", None).unwrap().addr, "127.0.0.1:7072".parse().unwrap());
        let no_ca = StorageUrl::parse("https://127.0.0.1:7072", None).err().unwrap();
        assert!(no_ca.to_string().contains("--storage-ca"), "{no_ca}");
        assert!(StorageUrl::parse("http://127.0.0.1:1", Some(Path::new("/ca.pem"))).is_err());
        assert!(StorageUrl::parse("ftp://127.0.0.1:1", None).is_err());
        let missing = StorageUrl::parse("https://127.0.0.1:1", Some(Path::new("/nonexistent/ca.pem"))).err().unwrap();
        assert!(format!("{missing:#}").contains("/nonexistent/ca.pem"), "{missing:#}");
    }
}
