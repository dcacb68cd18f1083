//! `fencelock elect NAME -- CMD…` runs a command only while this process
//! leads the election `NAME`; `fencelock leader NAME [--watch]` shows its
//! leader (and follows it).
//!
//! Works with every backend that declares elections (`--server` takes any
//! backend URL; one without them refuses with a clear error). `elect` waits in
//! line as a candidate, then runs CMD exactly as `run` does (see [`crate::run`]):
//! the child gets `FENCELOCK_TERM` (the leader's term, also its fencing token)
//! next to `run`'s `FENCELOCK_*` variables, is stopped if the leadership is
//! lost (exit [`exit::LEASE_LOST`]), and dies with this process. When CMD
//! exits, `elect` resigns, which elects the next candidate at once.

use std::io::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use fencelock::{Backend, Leader, LeaderEvent};
use serde_json::json;

use fencelock_http::parse_duration;

use crate::{client_cmds::short_value, exit, run, ServerArg};

#[derive(Args, Debug)]
pub struct ElectArgs {
    #[command(flatten)]
    server: ServerArg,
    /// Election name (a lock name).
    name: String,
    /// What the leader publishes (`fencelock leader` shows it), e.g. its address.
    #[arg(long, default_value = "")]
    value: String,
    /// Who campaigns (default: hostname:pid).
    #[arg(long)]
    identity: Option<String>,
    /// The candidate's lease TTL: a leader that stops renewing is replaced within it.
    #[arg(long, default_value = "15s", value_parser = parse_duration, env = "FENCELOCK_TTL")]
    ttl: Duration,
    /// Give up (exit 74) if not elected within this long (default: wait until elected).
    #[arg(long, value_parser = parse_duration)]
    wait: Option<Duration>,
    /// After SIGTERM, how long the child has to exit before SIGKILL.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    kill_grace: Duration,
    /// The command to run while leader, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    cmd: Vec<String>,
}

#[derive(Args, Debug)]
pub struct LeaderArgs {
    #[command(flatten)]
    server: ServerArg,
    /// Election name.
    name: String,
    /// Follow the election: one line per change (new leader, new value,
    /// vacancy) until interrupted.
    #[arg(long)]
    watch: bool,
    /// One JSON object per line instead of text.
    #[arg(long)]
    json: bool,
}

async fn backend(s: &ServerArg) -> anyhow::Result<Backend> {
    fencelock::connect(&s.url()).await.with_context(|| format!("connecting to {}", s.shown()))
}

pub async fn elect(a: ElectArgs) -> anyhow::Result<ExitCode> {
    let backend = backend(&a.server).await?;
    let result = lead_and_run(&backend, a).await;
    // As `run`: the lease this process campaigned on ends with it.
    backend.close().await;
    result
}

async fn lead_and_run(backend: &Backend, a: ElectArgs) -> anyhow::Result<ExitCode> {
    let identity = a.identity.clone().unwrap_or_else(crate::default_identity);
    let election = backend.election(&a.name).ttl(a.ttl).value(a.value.as_bytes()).identity(identity);
    let campaign = election.campaign();
    let leadership = match a.wait {
        None => campaign.await?,
        Some(wait) => match tokio::time::timeout(wait, campaign).await {
            Ok(elected) => elected?,
            Err(_) => {
                eprintln!("fencelock: not elected {:?} within {wait:?}", a.name);
                return Ok(ExitCode::from(exit::TIMED_OUT));
            }
        },
    };
    eprintln!("fencelock: elected {:?} with term {}", a.name, leadership.term());
    let term = leadership.term().to_string();
    let guard = leadership.into_guard();
    let mut child = match run::spawn(&a.cmd, &guard, &[("FENCELOCK_TERM", term.as_str())]) {
        Ok(c) => c,
        Err(e) => {
            let _ = guard.release().await; // resign now: the next candidate takes over
            return Err(anyhow::Error::new(e).context(format!("starting {:?}", a.cmd[0])));
        }
    };
    let pgid = child.id().map(|id| nix::unistd::Pid::from_raw(-(id as i32)));
    run::supervise(&mut child, pgid, run::Holding::One(guard), a.kill_grace, None).await
}

pub async fn leader(a: LeaderArgs) -> anyhow::Result<ExitCode> {
    let backend = backend(&a.server).await?;
    let election = backend.election(&a.name);
    if !a.watch {
        let current = election.leader().await?;
        print_line(&leader_line(&a.name, current.as_ref(), a.json));
        return Ok(ExitCode::from(if current.is_some() { exit::OK } else { exit::NO }));
    }
    let mut changes = election.observe().await?;
    while let Some(change) = changes.next_event().await {
        let line = match change? {
            LeaderEvent::Leader(l) => leader_line(&a.name, Some(&l), a.json),
            LeaderEvent::Vacant { term } => vacant_line(&a.name, term, a.json),
            other => format!("{other:?}"),
        };
        // A closed stdout (`| head`) ends the watch quietly.
        if !print_line(&line) {
            break;
        }
    }
    Ok(ExitCode::from(exit::OK))
}

/// Writes `line` to stdout; false if stdout is closed.
fn print_line(line: &str) -> bool {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").and_then(|_| out.flush()).is_ok()
}

/// `leader NAME term=T value=V identity=I`, `no leader NAME`, or its JSON.
fn leader_line(name: &str, l: Option<&Leader>, as_json: bool) -> String {
    match (l, as_json) {
        (Some(l), true) => json!({
            "event": "leader", "name": name, "term": l.term, "identity": l.identity,
            "value": String::from_utf8_lossy(&l.value), "value_base64": fencelock_core::b64::encode(&l.value),
        })
        .to_string(),
        (Some(l), false) => {
            let identity = l.identity.as_deref().unwrap_or("-");
            format!("leader {name} term={} value={} identity={identity}", l.term, short_value(&l.value))
        }
        (None, true) => json!({ "event": "none", "name": name }).to_string(),
        (None, false) => format!("no leader {name}"),
    }
}

/// `vacant NAME term=T` (the term that ended), or its JSON.
fn vacant_line(name: &str, term: u64, as_json: bool) -> String {
    if as_json {
        json!({ "event": "vacant", "name": name, "term": term }).to_string()
    } else {
        format!("vacant {name} term={term}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The line formats scripts read.
    #[test]
    fn leader_lines() {
        let l = Leader { name: "db".into(), term: 7, value: b"10.0.0.1:5432".to_vec(), identity: Some("h:1".into()) };
        assert_eq!(leader_line("db", Some(&l), false), "leader db term=7 value=10.0.0.1:5432 identity=h:1");
        let v: serde_json::Value = serde_json::from_str(&leader_line("db", Some(&l), true)).unwrap();
        assert_eq!(v["term"], 7);
        assert_eq!(v["value"], "10.0.0.1:5432");
        assert_eq!(v["identity"], "h:1");
        assert_eq!(leader_line("db", None, false), "no leader db");
        assert_eq!(vacant_line("db", 7, false), "vacant db term=7");
        assert_eq!(vacant_line("db", 7, true), r#"{"event":"vacant","name":"db","term":7}"#);
    }
}
