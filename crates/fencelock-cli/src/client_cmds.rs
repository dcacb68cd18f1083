//! `fencelock acquire | release | locks | check`: one request each, for scripts
//! (`--json`) and people (plain text).

use std::{process::ExitCode, time::Duration};

use anyhow::Context;
use clap::Args;
use fencelock::backend::{BackendUrl, Scheme};
use fencelock::{Acquire, Client, LockOptions};
use serde_json::json;

use crate::{exit, run::busy_detail, LockArgs, ServerArg};

#[derive(Args, Debug)]
pub struct AcquireArgs {
    #[command(flatten)]
    server: ServerArg,
    #[command(flatten)]
    lock: LockArgs,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
pub struct ReleaseArgs {
    #[command(flatten)]
    server: ServerArg,
    /// Lock name.
    name: String,
    /// The lease id printed by `acquire`.
    #[arg(long)]
    lease: u64,
    /// The fencing token printed by `acquire`.
    #[arg(long)]
    token: u64,
    /// Keep the lease (by default `release` also revokes it, as `acquire` made it).
    #[arg(long)]
    keep_lease: bool,
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
pub struct LocksArgs {
    #[command(flatten)]
    server: ServerArg,
    /// Only locks whose names start with this.
    #[arg(long, default_value = "")]
    prefix: String,
    /// At most this many.
    #[arg(long, default_value_t = 1000)]
    limit: u32,
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
pub struct CheckArgs {
    #[command(flatten)]
    server: ServerArg,
    /// Lock name.
    name: String,
    /// Fencing token to check.
    token: u64,
    #[arg(long)]
    json: bool,
}

/// The native client: `acquire`, `release` and `locks` hand a lease between
/// processes and list the server's queues, which only the fencelock server
/// does. Any other backend URL is a clear error.
pub(crate) async fn connect(s: &ServerArg) -> anyhow::Result<Client> {
    let url = BackendUrl::parse(&s.url())?;
    if url.scheme != Scheme::Native {
        anyhow::bail!(
            "{} needs a fencelock server (fencelock://host:port); the {} backend cannot hand a lock to another \
             process or list its queues. `fencelock run --server {}` works with every backend",
            std::env::args().nth(1).unwrap_or_default(),
            url.scheme,
            url
        );
    }
    // Every member of the list: the client moves past one that is down, and
    // follows the leader a follower names.
    fencelock::Client::connect(url.raw.clone()).await.with_context(|| format!("connecting to {url}"))
}

pub async fn acquire(a: AcquireArgs) -> anyhow::Result<ExitCode> {
    let client = connect(&a.server).await?;
    let l = &a.lock;
    let opts = LockOptions::default().ttl(l.ttl).wait(l.wait).lock_delay(l.lock_delay);
    let (code, v, text) = match client.acquire_detached(&l.name, opts).await? {
        Acquire::Acquired(g) => (
            exit::OK,
            json!({"outcome": "acquired", "lock": g.lock, "lease_id": g.lease_id, "token": g.token,
                   "ttl_ms": l.ttl.as_millis() as u64, "waited_ms": g.waited.as_millis() as u64}),
            format!(
                "acquired {:?}: token {} lease {} (expires in {:?}; not renewed)",
                g.lock, g.token, g.lease_id, l.ttl
            ),
        ),
        Acquire::Busy { holder_lease, holder_token, reopens_in, waiters } => (
            exit::BUSY,
            json!({"outcome": "busy", "lock": l.name, "holder_lease": holder_lease, "holder_token": holder_token,
                   "reopens_in_ms": reopens_in.map(|d| d.as_millis() as u64), "waiters": waiters}),
            format!("lock {:?} is busy{}", l.name, busy_detail(holder_lease, holder_token, reopens_in)),
        ),
        Acquire::TimedOut => (
            exit::TIMED_OUT,
            json!({"outcome": "timed_out", "lock": l.name}),
            format!("timed out after {:?} waiting for lock {:?}", l.wait, l.name),
        ),
    };
    emit(a.json, &v, &text, code == exit::OK);
    Ok(ExitCode::from(code))
}

pub async fn release(a: ReleaseArgs) -> anyhow::Result<ExitCode> {
    let client = connect(&a.server).await?;
    let released = client.release_raw(&a.name, a.lease, a.token).await?;
    if released && !a.keep_lease {
        // Best effort: the lease ends by itself at its TTL anyway.
        if let Err(e) = client.revoke_lease(a.lease).await {
            eprintln!("fencelock: note: lease {} not revoked: {e}", a.lease);
        }
    }
    let v = json!({"lock": a.name, "lease_id": a.lease, "token": a.token, "released": released});
    let text = if released {
        format!("released {:?} (token {})", a.name, a.token)
    } else {
        format!("not the holder of {:?} with lease {} and token {}: nothing released", a.name, a.lease, a.token)
    };
    emit(a.json, &v, &text, released);
    Ok(ExitCode::from(if released { exit::OK } else { exit::NO }))
}

pub async fn locks(a: LocksArgs) -> anyhow::Result<ExitCode> {
    let client = connect(&a.server).await?;
    let locks = client.list(&a.prefix, a.limit).await?;
    if a.json {
        let v: Vec<_> = locks.iter().map(lock_json).collect();
        println!("{}", json!({ "locks": v }));
        return Ok(ExitCode::from(exit::OK));
    }
    println!(
        "{:<32} {:<16} {:>19} {:>20} {:>10} {:>8}",
        "LOCK", "OWNER", "HOLDER-LEASE", "TOKEN", "TTL-LEFT", "WAITERS"
    );
    for l in &locks {
        let dash = || "-".to_string();
        let (owner, lease, token, ttl) = match &l.holder {
            Some(h) => {
                let owner = h.owner.clone().unwrap_or_else(dash);
                (owner, h.lease_id.to_string(), h.token.to_string(), fmt_dur(h.ttl_left))
            }
            None if l.reopens_in.is_some() => {
                (dash(), dash(), dash(), format!("delay {}", fmt_dur(l.reopens_in.unwrap_or_default())))
            }
            None => (dash(), dash(), dash(), dash()),
        };
        println!("{:<32} {:<16} {:>19} {:>20} {:>10} {:>8}", l.name, owner, lease, token, ttl, l.waiters.len());
    }
    Ok(ExitCode::from(exit::OK))
}

pub async fn check(a: CheckArgs) -> anyhow::Result<ExitCode> {
    let backend =
        fencelock::connect(&a.server.url()).await.with_context(|| format!("connecting to {}", a.server.shown()))?;
    let r = backend.check(&a.name, a.token).await?;
    let v = json!({"lock": a.name, "token": a.token, "current": r.current, "current_token": r.current_token});
    let text = match (r.current, r.current_token) {
        (true, _) => format!("token {} is the current grant of {:?}", a.token, a.name),
        (false, Some(t)) => format!("token {} is stale: {:?} is held under token {t}", a.token, a.name),
        (false, None) => format!("token {} is stale: {:?} is not held", a.token, a.name),
    };
    emit(a.json, &v, &text, r.current);
    Ok(ExitCode::from(if r.current { exit::OK } else { exit::NO }))
}

fn lock_json(l: &fencelock::LockInfo) -> serde_json::Value {
    json!({
        "name": l.name,
        "holder": l.holder.as_ref().map(|h| json!({"lease_id": h.lease_id, "owner": h.owner, "token": h.token,
            "held_ms": h.held.as_millis() as u64, "ttl_left_ms": h.ttl_left.as_millis() as u64})),
        "reopens_in_ms": l.reopens_in.map(|d| d.as_millis() as u64),
        "waiters": l.waiters.len(),
    })
}

fn fmt_dur(d: Duration) -> String {
    if d.as_secs() >= 1 {
        format!("{:.1}s", d.as_secs_f64())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// Print to stdout (success) or stderr (other outcomes) as text, or JSON on stdout.
fn emit(as_json: bool, v: &serde_json::Value, text: &str, ok: bool) {
    if as_json {
        println!("{v}");
    } else if ok {
        println!("{text}");
    } else {
        eprintln!("fencelock: {text}");
    }
}
