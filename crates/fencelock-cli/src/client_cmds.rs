//! `fencelock acquire | release | locks | check | resize | slots`: one request each, for scripts
//! (`--json`) and people (plain text).

use std::{process::ExitCode, time::Duration};

use anyhow::Context;
use clap::Args;
use fencelock::backend::{BackendUrl, Scheme};
use fencelock::{Client, Outcome};
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

#[derive(Args, Debug)]
pub struct ResizeArgs {
    #[command(flatten)]
    server: ServerArg,
    /// Semaphore name.
    name: String,
    /// Its new number of permits (at least 1, and at least what its holders
    /// use and what one queued acquire asks for).
    permits: u32,
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
pub struct SlotsArgs {
    #[command(flatten)]
    server: ServerArg,
    /// Lock name (the NAME of `fencelock run NAME --once-per SLOT`).
    name: String,
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
    let opts = l.options(true);
    let (code, v, text) = match l.all.as_slice() {
        [] => outcome(l, client.acquire_detached(l.name(), opts).await?.map(|g| vec![g])),
        all => {
            let names: Vec<&str> = all.iter().map(String::as_str).collect();
            outcome(l, client.acquire_all_detached(&names, opts).await?)
        }
    };
    emit(a.json, &v, &text, code == exit::OK);
    Ok(ExitCode::from(code))
}

/// The exit code, JSON and text of an acquire of one lock or of `--all`
/// (then the JSON lists every lock with its token under `locks`).
fn outcome(l: &LockArgs, got: Outcome<Vec<fencelock::Grant>>) -> (u8, serde_json::Value, String) {
    let name = match l.all.is_empty() {
        true => l.name().to_string(),
        false => l.all.join(","),
    };
    match got {
        Outcome::Acquired(gs) if l.all.is_empty() && gs.len() == 1 => acquired_one(l, &gs[0]),
        Outcome::Acquired(gs) => acquired_all(l, &gs),
        Outcome::Busy { holder_lease, holder_token, reopens_in, waiters } => (
            exit::BUSY,
            json!({"outcome": "busy", "lock": name, "holder_lease": holder_lease, "holder_token": holder_token,
                   "reopens_in_ms": reopens_in.map(|d| d.as_millis() as u64), "waiters": waiters}),
            format!("lock {name:?} is busy{}", busy_detail(holder_lease, holder_token, reopens_in)),
        ),
        Outcome::TimedOut => (
            exit::TIMED_OUT,
            json!({"outcome": "timed_out", "lock": name}),
            format!("timed out after {:?} waiting for lock {name:?}", l.wait),
        ),
    }
}

fn acquired_one(l: &LockArgs, g: &fencelock::Grant) -> (u8, serde_json::Value, String) {
    let v = json!({"outcome": "acquired", "lock": g.lock, "lease_id": g.lease_id, "token": g.token,
                   "ttl_ms": l.ttl.as_millis() as u64, "waited_ms": g.waited.as_millis() as u64});
    let text =
        format!("acquired {:?}: token {} lease {} (expires in {:?}; not renewed)", g.lock, g.token, g.lease_id, l.ttl);
    (exit::OK, v, text)
}

/// A multi-lock: every lock with its token, on one lease.
fn acquired_all(l: &LockArgs, gs: &[fencelock::Grant]) -> (u8, serde_json::Value, String) {
    let (lease, waited) = gs.first().map_or((0, 0), |g| (g.lease_id, g.waited.as_millis() as u64));
    let locks: Vec<_> = gs.iter().map(|g| json!({"lock": g.lock, "token": g.token})).collect();
    let each: Vec<String> = gs.iter().map(|g| format!("{:?} token {}", g.lock, g.token)).collect();
    let v = json!({"outcome": "acquired", "locks": locks, "lease_id": lease,
                   "ttl_ms": l.ttl.as_millis() as u64, "waited_ms": waited});
    let text = format!("acquired {}: lease {lease} (expires in {:?}; not renewed)", each.join(", "), l.ttl);
    (exit::OK, v, text)
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
        "{:<32} {:<16} {:<24} {:>19} {:>20} {:>10} {:>8}  VALUE",
        "LOCK", "OWNER", "IDENTITY", "HOLDER-LEASE", "TOKEN", "TTL-LEFT", "WAITERS"
    );
    for l in &locks {
        print_lock(l);
    }
    Ok(ExitCode::from(exit::OK))
}

/// One row of `fencelock locks`, then one indented line per waiter.
fn print_lock(l: &fencelock::LockInfo) {
    let dash = || "-".to_string();
    let (owner, identity, lease, token, ttl, value) = match &l.holder {
        Some(h) => (
            h.owner.clone().unwrap_or_else(dash),
            h.identity.clone().unwrap_or_else(dash),
            h.lease_id.to_string(),
            h.token.to_string(),
            fmt_dur(h.ttl_left),
            short_value(&h.value),
        ),
        None if l.reopens_in.is_some() => {
            let ttl = format!("delay {}", fmt_dur(l.reopens_in.unwrap_or_default()));
            (dash(), dash(), dash(), dash(), ttl, dash())
        }
        None => (dash(), dash(), dash(), dash(), dash(), dash()),
    };
    let waiters = l.waiters.len();
    println!("{:<32} {owner:<16} {identity:<24} {lease:>19} {token:>20} {ttl:>10} {waiters:>8}  {value}", l.name);
    if l.permits > 0 {
        let used: u32 = l.holders.iter().map(|h| h.weight).sum();
        println!("  semaphore: {used} of {} permits in use", l.permits);
    }
    let shared = l.holders.iter().any(|h| h.mode == fencelock::LockMode::Shared);
    if l.holders.len() > 1 || shared || l.permits > 0 {
        for h in &l.holders {
            println!("  holding: {}", holder_line(h, l.permits > 0));
        }
    }
    for w in &l.waiters {
        let identity = w.identity.as_deref().unwrap_or("-");
        println!("  waiting: {identity} (lease {}, waited {})", w.lease_id, fmt_dur(w.waited));
    }
}

/// `IDENTITY (lease L, token T, shared|exclusive|N permits)`.
fn holder_line(h: &fencelock::Holder, semaphore: bool) -> String {
    let how = match (semaphore, h.mode) {
        (true, _) => format!("{} permit{}", h.weight, if h.weight == 1 { "" } else { "s" }),
        (false, fencelock::LockMode::Shared) => "shared".into(),
        (false, fencelock::LockMode::Exclusive) => "exclusive".into(),
    };
    let identity = h.identity.as_deref().unwrap_or("-");
    format!("{identity} (lease {}, token {}, {how})", h.lease_id, h.token)
}

/// A holder in `--json`.
fn holder_json(h: &fencelock::Holder) -> serde_json::Value {
    json!({"lease_id": h.lease_id, "owner": h.owner, "token": h.token,
        "held_ms": h.held.as_millis() as u64, "ttl_left_ms": h.ttl_left.as_millis() as u64,
        "identity": h.identity, "value_base64": fencelock_core::b64::encode(&h.value),
        "mode": match h.mode { fencelock::LockMode::Shared => "shared", fencelock::LockMode::Exclusive => "exclusive" },
        "weight": h.weight})
}

/// Longest value shown in the table, in characters.
const SHOWN_VALUE_CHARS: usize = 32;

/// A value for the table: its text when it is printable UTF-8, else
/// `base64:` and its base64; cut to [`SHOWN_VALUE_CHARS`] with `…`; `-` when
/// empty. (`--json` always gives the whole value, in base64.)
pub(crate) fn short_value(value: &[u8]) -> String {
    if value.is_empty() {
        return "-".into();
    }
    let text = match std::str::from_utf8(value) {
        Ok(t) if !t.chars().any(char::is_control) => t.to_string(),
        _ => format!("base64:{}", fencelock_core::b64::encode(value)),
    };
    if text.chars().count() <= SHOWN_VALUE_CHARS {
        return text;
    }
    let cut: String = text.chars().take(SHOWN_VALUE_CHARS - 1).collect();
    format!("{cut}…")
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

pub async fn resize(a: ResizeArgs) -> anyhow::Result<ExitCode> {
    let client = connect(&a.server).await?;
    let was = client.resize(&a.name, a.permits).await?;
    let v = json!({"lock": a.name, "permits": a.permits, "was": was});
    let text = format!("semaphore {:?} has {} permits (was {was})", a.name, a.permits);
    emit(a.json, &v, &text, true);
    Ok(ExitCode::from(exit::OK))
}

pub async fn slots(a: SlotsArgs) -> anyhow::Result<ExitCode> {
    let client = connect(&a.server).await?;
    let slots = client.completed_slots(&a.name).await?;
    if a.json {
        let v: Vec<_> = slots
            .iter()
            .map(|s| {
                json!({"slot": s.slot, "token": s.token, "identity": s.identity, "exit_code": s.exit_code,
                       "age_ms": s.age.as_millis() as u64})
            })
            .collect();
        println!("{}", json!({"lock": a.name, "slots": v}));
        return Ok(ExitCode::from(exit::OK));
    }
    if slots.is_empty() {
        println!("no slot of {:?} completed in the last 7 days", a.name);
    }
    for s in &slots {
        let who = s.identity.as_deref().unwrap_or("(no identity)");
        println!("{}  ran by {who} (token {}), exit {}, {} ago", s.slot, s.token, s.exit_code, fmt_dur(s.age));
    }
    Ok(ExitCode::from(exit::OK))
}

fn lock_json(l: &fencelock::LockInfo) -> serde_json::Value {
    json!({
        "name": l.name,
        "holder": l.holder.as_ref().map(holder_json),
        "holders": l.holders.iter().map(holder_json).collect::<Vec<_>>(),
        "permits": l.permits,
        "reopens_in_ms": l.reopens_in.map(|d| d.as_millis() as u64),
        "waiters": l.waiters.len(),
        "waiting": l.waiters.iter().map(|w| json!({"lease_id": w.lease_id, "identity": w.identity,
            "waited_ms": w.waited.as_millis() as u64, "wait_left_ms": w.wait_left.as_millis() as u64}))
            .collect::<Vec<_>>(),
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
