//! The nemesis: injects the run's faults on a schedule drawn from the seed,
//! and writes what it did (`fault` start/end) and what it saw (`evidence`,
//! `restart`, `holder`, `s1-trial`) into the harness history.
//!
//! Every wait is bounded; every fault is healed before the next one, and
//! [`heal_all`] heals whatever is left at the end.

use std::time::Duration;

use fencelock_chaos::faults::power_loss as shim;
use fencelock_chaos::faults::wal_undo as wal_shim;
use fencelock_testkit::proxy::{Mode, Proxy};
use nix::sys::signal::Signal;
use serde_json::json;

use crate::ctx::{evidence, fault, pause_between_faults, Ctx};
use crate::history::{mono_ns, Event, Op};
use crate::http;
use crate::metrics::metrics_text;
use crate::procs::{proc_state, signal};
use crate::scenario::{multi_name, LogEngine, Scenario, LOCK};
use crate::targets::Target;
use fencelock_http::prometheus;

/// The server's crash points the K4 nemesis arms through `FAILPOINTS`
/// (see `fencelock_chaos::faults`): a crash right there.
const FAILPOINTS: &[&str] = &["log-before-fsync", "log-after-fsync", "reply-before-send", "sm-before-apply"];

/// Injects `ctx.spec.scenario`'s faults until `ctx.end`.
pub async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    match ctx.spec.scenario {
        Scenario::K1 => k1_pauses(ctx).await,
        Scenario::K2 => k2_held_network(ctx).await,
        Scenario::K3 => k3_clock(ctx).await,
        Scenario::K4 | Scenario::S5 if ctx.spec.backend == "fencelock" => k4_native_kills(ctx).await,
        Scenario::K4 => k4_peer_kills(ctx).await,
        Scenario::S1 => s1_dead_waiters(ctx).await,
        Scenario::S4 => s4_resets(ctx).await,
        Scenario::S5 => anyhow::bail!("S5 needs the native server"),
        Scenario::L1 => crate::cluster_faults::l1_leader_kills(ctx).await,
        Scenario::L2 => crate::cluster_faults::l2_leader_isolation(ctx).await,
        Scenario::L3 => crate::cluster_faults::l3_partitions(ctx).await,
        Scenario::P1 => crate::peer_input::p1_peer_input(ctx).await,
        Scenario::P2 => crate::peer_tls::p2_forged_peer(ctx).await,
    }
}

/// How long the nemesis waits for one worker to reach its write before it
/// picks another (4 × TTL, within 2–10 s): a worker of an unfair lock
/// (Redlock's retry loop) can go without the lock for many seconds while the
/// others take turns, and a run must not spend its whole length waiting on
/// that one (K1 against Redlock once ended a 10-s run with no pause at all).
fn arm_wait(ttl: Duration) -> Duration {
    (ttl * 4).clamp(Duration::from_secs(2), Duration::from_secs(10))
}

/// Sends worker `w` the control line `cmd` and waits up to [`arm_wait`] for
/// its report starting with `report`: true if it came. On a timeout the
/// command is cancelled, and a report that crossed the cancel still counts
/// (the worker had already acted on it).
async fn arm(ctx: &mut Ctx, w: usize, cmd: &str, report: &str) -> bool {
    ctx.workers.send(w, cmd);
    if ctx.workers.wait_line(w, report, arm_wait(ctx.ttl)).await.is_some() {
        return true;
    }
    ctx.workers.send(w, "cancel");
    ctx.workers.wait_line(w, report, Duration::from_millis(300)).await.is_some()
}

/// K1: a worker stops itself with SIGSTOP at its next write, after its last
/// check; it stays stopped for 1.5–5 × TTL, then gets SIGCONT.
async fn k1_pauses(ctx: &mut Ctx) -> anyhow::Result<()> {
    while !ctx.over() {
        pause_between_faults(ctx, 200, 800).await;
        let w = ctx.rng.usize(..ctx.workers.len());
        if !arm(ctx, w, "pause-next", "pausing").await {
            continue;
        }
        let pid = ctx.workers.pid(w);
        let pause = ctx.between(ctx.ttl, 1.5, 5.0);
        let target = format!("w{w}");
        fault(ctx, "start", &target, json!({ "pause_ms": pause.as_millis() as u64, "pid": pid }));
        if wait_state(pid, 'T', Duration::from_secs(2)).await {
            evidence(ctx, "stopped", 1, &target, json!({ "pid": pid }));
        }
        tokio::time::sleep(pause).await;
        signal(pid, Signal::SIGCONT);
        fault(ctx, "end", &target, serde_json::Value::Null);
    }
    Ok(())
}

/// Waits up to `within` for `/proc/<pid>/stat` to show `state`.
async fn wait_state(pid: u32, state: char, within: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    while tokio::time::Instant::now() < deadline {
        if proc_state(pid) == Some(state) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    false
}

/// K2: a worker about to write gets its whole network held (its keep-alives
/// and its write) for 1.5–5 × TTL; then everything held flows on, late.
async fn k2_held_network(ctx: &mut Ctx) -> anyhow::Result<()> {
    while !ctx.over() {
        pause_between_faults(ctx, 200, 800).await;
        let w = ctx.rng.usize(..ctx.workers.len());
        if !arm(ctx, w, "hold-next", "at-write").await {
            continue;
        }
        let hold = ctx.between(ctx.ttl, 1.5, 5.0);
        let target = format!("w{w}");
        let held_before = ctx.storage_proxies[w].held_bytes();
        set_worker_network(ctx, w, Mode::Hold);
        fault(ctx, "start", &target, json!({ "hold_ms": hold.as_millis() as u64 }));
        ctx.workers.send(w, "go");
        tokio::time::sleep(hold).await;
        let held = ctx.storage_proxies[w].held_bytes() - held_before;
        if held > 0 {
            evidence(ctx, "held-bytes", held, &target, serde_json::Value::Null);
        }
        set_worker_network(ctx, w, Mode::Pass);
        fault(ctx, "end", &target, serde_json::Value::Null);
    }
    Ok(())
}

fn set_worker_network(ctx: &Ctx, w: usize, mode: Mode) {
    if let Some(p) = ctx.lock_proxies.get(w) {
        p.set_mode(mode);
    }
    ctx.storage_proxies[w].set_mode(mode);
}

/// K3's slow client: worker `SLOW_WORKER`'s clocks (monotonic too) run at
/// `SLOW_RATE` × real time for the whole run, `FAST_WORKER`'s at `FAST_RATE`
/// (libfaketime, see [`crate::faketime`]).
pub const SLOW_WORKER: usize = 0;
pub const SLOW_RATE: f64 = 0.25;
pub const FAST_WORKER: usize = 1;
pub const FAST_RATE: f64 = 2.0;
/// The file (in the run's data dir) with the server's wall-clock offset.
pub const WALL_OFFSET_FILE: &str = "wall-offset";

/// The clock faults of K3, drawn in seeded rounds that hold each once.
#[derive(Debug, Clone, Copy)]
enum ClockFault {
    ServerJump,
    ServerRate,
    WallJump,
    SlowClient,
}

/// K3, one fault at a time: the server's injected monotonic clock jumps
/// forward by 1–3 × TTL or runs at 0.5–5× real time for 2–6 × TTL; the
/// server's wall clock jumps by an hour to 400 days, forward or back (it must
/// not care); the slow client dawdles before its last check with its
/// keep-alives held, so that its own clock, not the server, says whether its
/// lease still holds.
async fn k3_clock(ctx: &mut Ctx) -> anyhow::Result<()> {
    let (mut jump_ms, mut wall_s) = (0u64, 0i64);
    let mut round: Vec<ClockFault> = Vec::new();
    while !ctx.over() {
        pause_between_faults(ctx, 300, 1000).await;
        if ctx.over() {
            break;
        }
        if round.is_empty() {
            round = vec![ClockFault::ServerJump, ClockFault::ServerRate, ClockFault::WallJump, ClockFault::SlowClient];
            ctx.rng.shuffle(&mut round);
        }
        match round.pop().expect("refilled") {
            ClockFault::ServerJump => server_clock_jump(ctx, &mut jump_ms).await?,
            ClockFault::ServerRate => server_clock_rate(ctx, jump_ms).await?,
            ClockFault::WallJump => server_wall_jump(ctx, &mut wall_s).await?,
            ClockFault::SlowClient => slow_client(ctx).await,
        }
    }
    Ok(())
}

async fn server_clock_jump(ctx: &mut Ctx, jump_ms: &mut u64) -> anyhow::Result<()> {
    let file = ctx.data.path().join("clock");
    *jump_ms += ctx.between(ctx.ttl, 1.0, 3.0).as_millis() as u64;
    std::fs::write(&file, format!("rate=1 jump_ms={jump_ms}\n"))?;
    fault(ctx, "start", "server", json!({ "jump_total_ms": *jump_ms }));
    evidence(ctx, "clock", 1, "server", json!({ "jump_total_ms": *jump_ms }));
    // The server re-reads the file every 20 ms.
    tokio::time::sleep(Duration::from_millis(50)).await;
    fault(ctx, "end", "server", serde_json::Value::Null);
    Ok(())
}

async fn server_clock_rate(ctx: &mut Ctx, jump_ms: u64) -> anyhow::Result<()> {
    let file = ctx.data.path().join("clock");
    let rate = [0.5, 2.0, 3.0, 5.0][ctx.rng.usize(..4)];
    let spell = ctx.between(ctx.ttl, 2.0, 6.0);
    std::fs::write(&file, format!("rate={rate} jump_ms={jump_ms}\n"))?;
    fault(ctx, "start", "server", json!({ "rate": rate, "ms": spell.as_millis() as u64 }));
    evidence(ctx, "clock", 1, "server", json!({ "rate": rate }));
    tokio::time::sleep(spell).await;
    std::fs::write(&file, format!("rate=1 jump_ms={jump_ms}\n"))?;
    tokio::time::sleep(Duration::from_millis(50)).await;
    fault(ctx, "end", "server", serde_json::Value::Null);
    Ok(())
}

/// The server's wall clock jumps to a new offset; the evidence is its own
/// `Date` header, read back after libfaketime has re-read the file (seen
/// for the first jump, which goes forward; see below).
async fn server_wall_jump(ctx: &mut Ctx, wall_s: &mut i64) -> anyhow::Result<()> {
    let sign = if ctx.rng.bool() { 1 } else { -1 };
    // The first jump of a run goes forward: hyper caches the `Date` header
    // until the server's clock passes the next second it computed, so after
    // a jump back the header stays where it was and cannot show the jump (a
    // forward jump to a new maximum always shows). Later jumps go either way.
    let sign = if *wall_s == 0 { 1 } else { sign };
    let to = sign * ctx.rng.i64(3_600..=400 * 86_400);
    std::fs::write(ctx.data.path().join(WALL_OFFSET_FILE), crate::faketime::offset(to))?;
    fault(ctx, "start", "server", json!({ "wall_offset_s": to, "from_s": *wall_s }));
    *wall_s = to;
    // libfaketime re-reads the file at most once a second and `Date` has a
    // 1 s grain; on a loaded machine the re-read can come later: look a few
    // times, for up to about 4 s.
    tokio::time::sleep(Duration::from_millis(1300)).await;
    for _ in 0..10 {
        if let Some(seen) = server_wall_offset(ctx).await {
            if (seen - to).abs() <= 3 {
                evidence(ctx, "wall-clock", 1, "server", json!({ "offset_s": to, "seen_s": seen }));
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    fault(ctx, "end", "server", serde_json::Value::Null);
    Ok(())
}

/// How far the server's wall clock (its admin `Date` header) is from ours.
async fn server_wall_offset(ctx: &Ctx) -> Option<i64> {
    let admin = ctx.target.admin()?;
    let r = http::request(admin, "GET", "/healthz", &[], b"", Duration::from_secs(2))
        .await
        .inspect_err(|e| tracing::warn!(error = %e, "K3: no answer from the server's admin port"))
        .ok()?;
    let theirs = httpdate::parse_http_date(r.date.as_deref()?).ok()?;
    let ours = std::time::SystemTime::now();
    Some(match theirs.duration_since(ours) {
        Ok(ahead) => ahead.as_secs_f64().round() as i64,
        Err(behind) => -(behind.duration().as_secs_f64().round() as i64),
    })
}

/// The slow client takes 0.6 × TTL by its own clock (2.4 × TTL of real time)
/// between its read and its last check, while its keep-alives are held: its
/// clock tells it the lease still holds, the server let it expire long ago,
/// and only the fence stands between its write and the object.
async fn slow_client(ctx: &mut Ctx) {
    let w = SLOW_WORKER;
    if w >= ctx.workers.len() {
        return;
    }
    let own_ms = ctx.ttl.mul_f64(0.6).as_millis() as u64;
    ctx.workers.send(w, &format!("slow-next {own_ms}"));
    if ctx.workers.wait_line(w, "slowing", Duration::from_secs(10)).await.is_none() {
        ctx.workers.send(w, "cancel");
        return;
    }
    let target = format!("w{w}");
    if let Some(p) = ctx.lock_proxies.get(w) {
        p.set_mode(Mode::Hold);
    }
    fault(ctx, "start", &target, json!({ "own_ms": own_ms, "rate": SLOW_RATE }));
    let slowed = ctx.workers.wait_line(w, "slowed", Duration::from_secs(30)).await;
    if let Some((own, real)) = slowed.as_deref().and_then(parse_slowed) {
        // Evidence only if its clock really ran slow: under half of real time.
        if own > 0 && own * 2 < real {
            evidence(ctx, "client-clock", 1, &target, json!({ "own_ms": own, "real_ms": real }));
        }
    }
    // Its write, if it makes one, goes to the storage (not held) now.
    tokio::time::sleep(Duration::from_millis(100)).await;
    if let Some(p) = ctx.lock_proxies.get(w) {
        p.set_mode(Mode::Pass);
    }
    fault(ctx, "end", &target, serde_json::Value::Null);
}

/// `slowed <seq> <own ms> <real ms>` → `(own, real)`.
fn parse_slowed(line: &str) -> Option<(u64, u64)> {
    let mut f = line.split_whitespace().skip(2).map(|x| x.parse::<u64>().ok());
    Some((f.next()??, f.next()??))
}

/// K4 (and S5) against the native server: every 0.5–2.5 s the server dies,
/// by SIGKILL or at an armed failpoint (S5: then loses its unsynced bytes),
/// and is started again on the same data; right after, before any client can
/// reach it (their proxies hold), the lock's holder is read back (C6 compares
/// it with the history).
async fn k4_native_kills(ctx: &mut Ctx) -> anyhow::Result<()> {
    let mut armed: Option<String> = None;
    while !ctx.over() {
        let window = Duration::from_millis(ctx.rng.u64(500..=2500));
        let old_pid = ctx.target.pid();
        let cause = wait_for_death(ctx, window, armed.as_deref()).await;
        let Target::Native { server, .. } = &mut ctx.target else { unreachable!("native") };
        let status = if cause == "sigkill" { server.kill().map(|_| "killed".to_string()) } else { Some(cause.clone()) };
        // After the death (SIGKILL reaped, or the exit seen): every answer the
        // server ever sent left before this instant.
        let killed_at = mono_ns();
        // No client reaches the service again until its holder is read back:
        // the read-back shows exactly what the restarted server recovered.
        for p in &ctx.lock_proxies {
            p.set_mode(Mode::Hold);
        }
        fault(ctx, "start", "server", json!({ "cause": cause, "pid": old_pid, "status": status }));
        if cause.starts_with("failpoint") {
            evidence(ctx, "failpoint", 1, "server", json!({ "armed": armed }));
        }
        if ctx.spec.scenario == Scenario::S5 {
            power_loss(ctx)?;
        }
        armed = next_failpoint(ctx);
        // The first instant the restarted server could serve time from: a
        // lease cannot have used more of its TTL by the read-back than has
        // passed since (C6).
        let started_at = mono_ns();
        let new_pid = match restart_native(ctx, armed.as_deref()).await {
            Ok(pid) => pid,
            Err(e) if ctx.spec.scenario == Scenario::S5 => return refused_start(ctx, old_pid, killed_at, &e).await,
            Err(e) => return Err(e),
        };
        evidence(ctx, "restarted", 1, "server", json!({ "old_pid": old_pid, "new_pid": new_pid }));
        let restart = json!({
            "old_pid": old_pid, "new_pid": new_pid, "cause": cause, "killed_at": killed_at, "started_at": started_at,
        });
        ctx.note(Event { detail: restart, ..Event::note("nemesis", Op::Restart) });
        note_holder(ctx, json!({ "killed_at": killed_at })).await;
        for p in &ctx.lock_proxies {
            p.set_mode(Mode::Pass);
        }
        fault(ctx, "end", "server", serde_json::Value::Null);
    }
    if armed.is_some() {
        // Never leave a failpoint armed into the end of the run.
        restart_clean(ctx).await?;
    }
    Ok(())
}

/// S5: the node refused to start on what the power loss left (e.g. a log
/// behind its committed index: acknowledged entries lost). That is the run's
/// outcome, not the harness's failure: the restart is noted with no new
/// process, the holder read back from the dead node is none (C6 judges the
/// grant live at the kill lost), the fault ends, and the faults stop (S6
/// finds no write after it).
async fn refused_start(ctx: &mut Ctx, old_pid: Option<u32>, killed_at: u64, e: &anyhow::Error) -> anyhow::Result<()> {
    tracing::warn!(error = %format!("{e:#}"), "S5: the node refused to start after a power loss");
    let detail = json!({ "old_pid": old_pid, "new_pid": null, "refused": format!("{e:#}"), "killed_at": killed_at });
    ctx.note(Event { detail, ..Event::note("nemesis", Op::Restart) });
    note_holder(ctx, json!({ "killed_at": killed_at, "refused_start": true })).await;
    for p in &ctx.lock_proxies {
        p.set_mode(Mode::Pass);
    }
    fault(ctx, "end", "server", json!({ "refused_start": true }));
    Ok(())
}

/// Waits `window` (an armed failpoint may end the server earlier) and says
/// how the server is to die: `failpoint …` if it already died by itself,
/// `sigkill` otherwise.
async fn wait_for_death(ctx: &mut Ctx, window: Duration, armed: Option<&str>) -> String {
    let deadline = tokio::time::Instant::now() + window;
    // S5 kills, after the window, at the first moment the server has written
    // bytes it has not synced yet (an undo journal is not empty: the
    // database's, or on the segment log a segment's), so that the power loss
    // has something to drop; at most 5 s later regardless.
    let data = ctx.spec.out.join("lock-data");
    let undo = (ctx.spec.scenario == Scenario::S5).then(|| shim::undo_path(&shim::db_path(&data)));
    let segment_log = ctx.spec.log == LogEngine::Segment;
    let last = deadline + Duration::from_secs(5);
    loop {
        let now = tokio::time::Instant::now();
        let Target::Native { server, .. } = &mut ctx.target else { unreachable!("native") };
        if let Some(status) = server.exited() {
            return format!("failpoint {} ({status})", armed.unwrap_or("none"));
        }
        let unsynced = || {
            undo.as_ref().is_none_or(|u| {
                std::fs::metadata(u).is_ok_and(|m| m.len() > 0) || (segment_log && wal_shim::unsynced(&data))
            })
        };
        if now >= last || (now >= deadline && unsynced()) {
            return "sigkill".into();
        }
        tokio::time::sleep(Duration::from_millis(if now >= deadline { 1 } else { 10 })).await;
    }
}

/// Half of the restarts arm a failpoint that crashes the next server after a
/// seeded number of passes.
fn next_failpoint(ctx: &mut Ctx) -> Option<String> {
    if ctx.rng.bool() {
        return None;
    }
    let name = FAILPOINTS[ctx.rng.usize(..FAILPOINTS.len())];
    Some(format!("{name}={}*off->return", ctx.rng.u64(1..=60)))
}

/// Starts the native server again. An armed failpoint may fire during the
/// start itself (replaying the log applies entries, and the new term's first
/// entry is written and fsynced): that is a crash during recovery, and the
/// server is then started once more without it.
async fn restart_native(ctx: &mut Ctx, failpoints: Option<&str>) -> anyhow::Result<u32> {
    let Target::Native { server, .. } = &mut ctx.target else { unreachable!("native") };
    match failpoints {
        Some(fp) => server.env.insert("FAILPOINTS".into(), fp.into()),
        None => server.env.remove("FAILPOINTS"),
    };
    let first = server.start().await;
    match (first, failpoints) {
        (Ok(pid), _) => Ok(pid),
        (Err(e), Some(fp)) => {
            server.kill();
            server.env.remove("FAILPOINTS");
            let pid = server.start().await?;
            evidence(
                ctx,
                "failpoint",
                1,
                "server",
                json!({ "armed": fp, "during": "recovery", "error": e.to_string() }),
            );
            Ok(pid)
        }
        (Err(e), None) => Err(e),
    }
}

async fn restart_clean(ctx: &mut Ctx) -> anyhow::Result<()> {
    let Target::Native { server, .. } = &mut ctx.target else { return Ok(()) };
    server.kill();
    server.env.remove("FAILPOINTS");
    server.start().await?;
    Ok(())
}

/// S5: the server is dead; drop what it had not synced and tear its last write.
fn power_loss(ctx: &mut Ctx) -> anyhow::Result<()> {
    let seed = ctx.rng.u64(..);
    let dir = ctx.spec.out.join("lock-data");
    let loss = shim::simulate(&dir, seed)?;
    let wal = wal_shim::simulate(&dir, seed)?;
    let mut detail = serde_json::to_value(loss)?;
    detail["wal"] = serde_json::to_value(wal)?;
    evidence(ctx, "rolled-back", loss.undone_writes + wal.undone_writes, "server", detail);
    Ok(())
}

/// Writes the lock's holder as the native server's admin API shows it (its
/// first holder as `lease` and `token`; every holder, readers in shared
/// mode, as `detail.holders`); in multi mode, one note per lock, its name
/// as `target`.
async fn note_holder(ctx: &mut Ctx, detail: serde_json::Value) {
    match ctx.spec.multi {
        0 => note_holder_of(ctx, LOCK, None, detail).await,
        k => {
            for i in 0..k {
                let lock = multi_name(LOCK, i);
                note_holder_of(ctx, &lock, Some(lock.clone()), detail.clone()).await;
            }
        }
    }
}

async fn note_holder_of(ctx: &mut Ctx, lock: &str, target: Option<String>, mut detail: serde_json::Value) {
    let Some(admin) = ctx.target.admin() else { return };
    let v = match describe_until_answered(admin, lock).await {
        Ok(v) => v,
        Err(e) => {
            // Not an empty holder: C6 must not take a failed read for a lost grant.
            detail["read_error"] = json!(format!("{e:#}"));
            ctx.note(Event { detail, target, ..Event::note("nemesis", Op::Holder) });
            return;
        }
    };
    let h = &v["holder"];
    let (lease, token) = (id(&h["lease_id"]), id(&h["token"]));
    let all: Vec<serde_json::Value> = v["holders"]
        .as_array()
        .map(|hs| hs.iter().map(|h| json!({ "lease": id(&h["lease_id"]), "token": id(&h["token"]) })).collect())
        .unwrap_or_default();
    detail["holders"] = serde_json::Value::Array(all);
    ctx.note(Event { lease, token, detail, target, ..Event::note("nemesis", Op::Holder) });
}

/// [`describe`], asked again every 50 ms while it fails (a node that has just
/// started may not lead yet; a loaded machine may be slow to answer), for up
/// to 5 s; then the last error.
async fn describe_until_answered(admin: std::net::SocketAddr, lock: &str) -> anyhow::Result<serde_json::Value> {
    let end = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        match describe(admin, lock).await {
            Err(e) if tokio::time::Instant::now() < end => {
                tracing::debug!(error = %format!("{e:#}"), "holder read-back failed; asking again");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            done => return done,
        }
    }
}

async fn describe(admin: std::net::SocketAddr, lock: &str) -> anyhow::Result<serde_json::Value> {
    let r = http::request(admin, "GET", &format!("/v1/locks/{lock}"), &[], b"", Duration::from_secs(5)).await?;
    match r.status {
        200 => Ok(serde_json::from_slice(&r.body)?),
        404 => Ok(serde_json::Value::Null),
        s => anyhow::bail!("describe {lock}: {s} {}", r.text()),
    }
}

/// K4 against a peer engine: SIGKILL (PostgreSQL: immediate shutdown) and
/// restart every 1–4 s; Redlock loses one node at a time.
async fn k4_peer_kills(ctx: &mut Ctx) -> anyhow::Result<()> {
    let mut n = 0;
    while !ctx.over() {
        pause_between_faults(ctx, 1000, 4000).await;
        if ctx.over() {
            break;
        }
        let old_pid = ctx.target.pid();
        fault(ctx, "start", "server", json!({ "cause": "sigkill", "pid": old_pid }));
        ctx.target.kill_and_restart_peer(n).await?;
        n += 1;
        let new_pid = ctx.target.pid();
        evidence(ctx, "restarted", 1, "server", json!({ "old_pid": old_pid, "new_pid": new_pid }));
        fault(ctx, "end", "server", serde_json::Value::Null);
    }
    Ok(())
}

/// An id or token of the admin port's JSON: a decimal string (a number
/// from a node of before the HTTP API).
fn id(v: &serde_json::Value) -> Option<u64> {
    v.as_str().and_then(|s| s.parse().ok()).or_else(|| v.as_u64())
}

/// A client of the native server at `url` (TLS and its token if it has them).
async fn native_client(url: &str) -> anyhow::Result<fencelock::Client> {
    Ok(fencelock::Client::connect(url).await?)
}

/// S1 trials, on locks of their own beside the workers' load: a holder takes
/// the lock; a waiter (through a proxy) queues behind it; the waiter's
/// network is held until its lease has expired at the server; the holder
/// releases. The lock must not go to the dead waiter.
async fn s1_dead_waiters(ctx: &mut Ctx) -> anyhow::Result<()> {
    let upstream = ctx.target.upstream().expect("native has one address");
    let admin = ctx.target.admin().expect("native has an admin port");
    let holder = native_client(&ctx.lock_url(None)).await?;
    let mut trial = 0u64;
    while !ctx.over() {
        trial += 1;
        let proxy = Proxy::start(upstream).await;
        let r = s1_trial(ctx, &holder, &proxy, admin, trial).await;
        if let Err(e) = r {
            tracing::warn!(trial, error = %e, "S1 trial could not be set up");
            // Not in a loop as fast as it can fail (thousands of refused
            // calls a second under a misconfigured auth file).
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(())
}

async fn s1_trial(
    ctx: &mut Ctx,
    holder: &fencelock::Client,
    proxy: &Proxy,
    admin: std::net::SocketAddr,
    trial: u64,
) -> anyhow::Result<()> {
    // Under the workers' prefix: under TLS and auth the trial clients use their identity.
    let lock = format!("{LOCK}-s1-{trial}");
    let ttl = ctx.ttl;
    let g = holder.lock(&lock).ttl(ttl).acquire().await?.acquired().map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let waiter = native_client(&ctx.lock_url(Some(proxy.addr()))).await?;
    let wlock = lock.clone();
    let wait = tokio::spawn(async move { waiter.lock(&wlock).ttl(ttl).wait(ttl * 20).acquire().await });
    let Some(dead_lease) = queued_waiter(admin, &lock, &wait).await else {
        wait.abort();
        // A holder that lost its lease (a loaded machine) lets the waiter in
        // at once: no trial; the next one starts.
        anyhow::bail!("the waiter never showed in the queue");
    };
    let held_before = proxy.held_bytes();
    proxy.set_mode(Mode::Hold);
    fault(ctx, "start", "waiter", json!({ "lock": lock, "dead_lease": dead_lease }));
    // Past the waiter's TTL at the server, with its keep-alives held.
    tokio::time::sleep(ttl.mul_f64(1.5) + Duration::from_millis(100)).await;
    let released = g.release().await;
    let holder_after = id(&describe(admin, &lock).await?["holder"]["lease_id"]);
    // Nobody else waits: a live client must get the lock at once.
    let probe = match holder.lock(&lock).ttl(ttl).wait(ttl * 2).acquire().await {
        Ok(fencelock::Outcome::Acquired(p)) => {
            let _ = p.release().await;
            "acquired".to_string()
        }
        Ok(other) => format!("not acquired: {other:?}"),
        Err(e) => format!("error: {e}"),
    };
    let held = proxy.held_bytes() - held_before;
    proxy.reset_then_pass();
    fault(ctx, "end", "waiter", serde_json::Value::Null);
    let outcome = match tokio::time::timeout(ttl * 4, wait).await {
        Ok(Ok(Ok(fencelock::Outcome::Acquired(g)))) => {
            let lease = g.lease_id();
            let _ = g.release().await;
            if lease == dead_lease {
                "acquired".to_string()
            } else {
                format!("acquired with a new lease {lease}")
            }
        }
        Ok(Ok(Ok(other))) => format!("not-acquired: {other:?}"),
        Ok(Ok(Err(e))) => format!("error: {e}"),
        Ok(Err(e)) => format!("error: {e}"),
        Err(_) => "error: no answer".to_string(),
    };
    if held > 0 && released.is_ok() {
        evidence(ctx, "trial", 1, "waiter", json!({ "held_bytes": held }));
    }
    let detail = json!({
        "lock": lock, "dead_lease": dead_lease, "holder_after": holder_after, "probe": probe, "waiter_outcome": outcome
    });
    ctx.note(Event { detail, ..Event::note("nemesis", Op::S1Trial) });
    Ok(())
}

/// Polls the lock's queue (up to 5 s, or until the waiter's acquire ends)
/// until one waiter shows; its lease.
async fn queued_waiter<T>(admin: std::net::SocketAddr, lock: &str, wait: &tokio::task::JoinHandle<T>) -> Option<u64> {
    for _ in 0..500 {
        if wait.is_finished() {
            return None;
        }
        if let Ok(v) = describe(admin, lock).await {
            if let Some(lease) = id(&v["waiters"][0]["lease_id"]) {
                return Some(lease);
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}

/// S4: a worker's connection to the lock server loses every answer for
/// 50–300 ms, then is reset; its client retries with the same request ids.
async fn s4_resets(ctx: &mut Ctx) -> anyhow::Result<()> {
    while !ctx.over() {
        pause_between_faults(ctx, 200, 700).await;
        let w = ctx.rng.usize(..ctx.workers.len());
        let lose = Duration::from_millis(ctx.rng.u64(50..=300));
        let target = format!("w{w}");
        let dropped_before = ctx.lock_proxies[w].dropped_bytes();
        ctx.lock_proxies[w].set_mode(Mode::DropReplies);
        fault(ctx, "start", &target, json!({ "drop_ms": lose.as_millis() as u64 }));
        tokio::time::sleep(lose).await;
        ctx.lock_proxies[w].reset_then_pass();
        let dropped = ctx.lock_proxies[w].dropped_bytes() - dropped_before;
        if dropped > 0 {
            evidence(ctx, "reset", dropped, &target, serde_json::Value::Null);
        }
        fault(ctx, "end", &target, serde_json::Value::Null);
    }
    Ok(())
}

/// The end of the run: every proxy passes, every worker runs, the native
/// server is up without failpoints; S4 runs record the server's counters.
pub async fn heal_all(ctx: &mut Ctx) -> anyhow::Result<()> {
    for p in ctx.lock_proxies.iter().chain(&ctx.storage_proxies) {
        p.set_mode(Mode::Pass);
    }
    for w in 0..ctx.workers.len() {
        signal(ctx.workers.pid(w), Signal::SIGCONT);
    }
    let s5 = ctx.spec.scenario == Scenario::S5;
    if let Target::Native { server, .. } = &mut ctx.target {
        if server.exited().is_some() || server.pid().is_none() {
            server.env.remove("FAILPOINTS");
            match server.start().await {
                // A node that refused its data after a power loss (see
                // `refused_start`) refuses it again: the checks judge that.
                Err(e) if s5 => tracing::warn!(error = %format!("{e:#}"), "S5: the node still refuses to start"),
                other => {
                    other?;
                }
            }
        }
    }
    if let Target::Cluster(c) = &mut ctx.target {
        c.heal().await?;
    }
    if ctx.spec.scenario == Scenario::K3 {
        let file = ctx.data.path().join("clock");
        let keep = std::fs::read_to_string(&file).unwrap_or_default();
        let jump = keep.split_whitespace().find_map(|kv| kv.strip_prefix("jump_ms=")).unwrap_or("0").to_string();
        std::fs::write(&file, format!("rate=1 jump_ms={jump}\n"))?;
    }
    Ok(())
}

/// The server's count of tokens issued, of grants it released undelivered
/// (their caller had gone), of grants ended by their lease's expiry, and
/// `revoked` (from [`revoked_grants`] before the workers stopped), from
/// `/metrics` (S4's check).
pub async fn note_server_stats(ctx: &mut Ctx, revoked: Option<u64>) {
    let Some(admin) = ctx.target.admin() else { return };
    let Some(text) = metrics_text(admin).await else { return };
    let (issued, cancelled) = (
        prometheus::value(&text, "fencelock_tokens_issued"),
        prometheus::value(&text, "fencelock_releases_cancelled_total"),
    );
    if let (Some(issued), Some(cancelled), Some(expired), Some(revoked)) =
        (issued, cancelled, prometheus::value(&text, "fencelock_releases_expired_total"), revoked)
    {
        let detail = json!({
            "tokens_issued": issued, "grants_cancelled": cancelled, "grants_expired": expired, "grants_revoked": revoked
        });
        ctx.note(Event { detail, ..Event::note("harness", Op::ServerStats) });
    }
}

/// Grants released because their lease was revoked so far (native server).
pub async fn revoked_grants(ctx: &Ctx) -> Option<u64> {
    prometheus::value(&metrics_text(ctx.target.admin()?).await?, "fencelock_releases_revoked_total")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The slow client's report gives its own and the real milliseconds.
    #[test]
    fn parses_the_slow_clients_report() {
        assert_eq!(parse_slowed("slowed 17 300 1204"), Some((300, 1204)));
        assert_eq!(parse_slowed("slowed 17 300"), None);
        assert_eq!(parse_slowed("slowed 17 x 1204"), None);
    }
}
