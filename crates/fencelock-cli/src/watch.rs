//! `fencelock watch [PREFIX] [--json] [--from R]`: prints the lock events of
//! a fencelock group as they are applied, one line each (text, or JSON lines),
//! until interrupted. The client resumes by itself after a failed server, so
//! the lines have no gap and no duplicate; a `--from` older than the server's
//! history ends with the `compacted` error (exit 70).

use std::io::Write as _;
use std::process::ExitCode;

use clap::Args;
use fencelock::{Revision, WatchEvent};
use serde_json::json;

use crate::{client_cmds::connect, exit, ServerArg};

#[derive(Args, Debug)]
pub struct WatchArgs {
    #[command(flatten)]
    server: ServerArg,
    /// Only locks whose names start with this ("" = all).
    #[arg(default_value = "")]
    prefix: String,
    /// Start at this revision (INDEX or INDEX.SEQ, inclusive) instead of now.
    #[arg(long)]
    from: Option<Revision>,
    /// One JSON object per line instead of text.
    #[arg(long)]
    json: bool,
}

pub async fn watch(a: WatchArgs) -> anyhow::Result<ExitCode> {
    let client = connect(&a.server).await?;
    let mut events = client.watch_from(a.prefix, a.from);
    while let Some(item) = events.next_event().await {
        let e = item?;
        let line = if a.json { event_json(&e).to_string() } else { event_text(&e) };
        // A closed stdout (`| head`) ends the watch quietly.
        let mut out = std::io::stdout().lock();
        if writeln!(out, "{line}").and_then(|_| out.flush()).is_err() {
            break;
        }
    }
    Ok(ExitCode::from(exit::OK))
}

/// `{"revision":"12.0","index":12,"seq":0,"kind":"granted","lock":…,"lease_id":…,"token":…,"identity":…,"reason":…,"value_base64":…,"mode":"exclusive","highest_token":0,"resource":""}`
/// (`highest_token` and `resource`: a fence's `write_refused` report).
fn event_json(e: &WatchEvent) -> serde_json::Value {
    json!({
        "revision": e.revision.to_string(),
        "index": e.revision.index,
        "seq": e.revision.seq,
        "kind": e.kind.as_str(),
        "lock": e.lock,
        "lease_id": e.lease_id,
        "token": e.token,
        "identity": e.identity,
        "reason": e.reason,
        "value_base64": fencelock_core::b64::encode(&e.value),
        "mode": if e.mode == fencelock::LockMode::Shared { "shared" } else { "exclusive" },
        "highest_token": e.highest_token,
        "resource": e.resource,
    })
}

/// `12.0 granted jobs/a lease=… token=…`, with `shared` for a reader's
/// grant, `identity=…`, `value=…` and `(reason)` when there are; a fence's
/// report is `12.1 write_refused jobs/a token=5 highest=9 resource=k
/// identity=…` (no lease: it names none).
fn event_text(e: &WatchEvent) -> String {
    if e.kind == fencelock::WatchKind::WriteRefused {
        return refused_text(e);
    }
    let mut line = format!("{} {} {} lease={}", e.revision, e.kind, e.lock, e.lease_id);
    if e.token != 0 {
        line.push_str(&format!(" token={}", e.token));
    }
    if e.mode == fencelock::LockMode::Shared && e.kind == fencelock::WatchKind::Granted {
        line.push_str(" shared");
    }
    if !e.identity.is_empty() {
        line.push_str(&format!(" identity={}", e.identity));
    }
    if !e.value.is_empty() {
        line.push_str(&format!(" value={}", crate::client_cmds::short_value(&e.value)));
    }
    if !e.reason.is_empty() {
        line.push_str(&format!(" ({})", e.reason));
    }
    line
}

/// The text line of a `write_refused` event.
fn refused_text(e: &WatchEvent) -> String {
    let mut line = format!("{} {} {} token={} highest={}", e.revision, e.kind, e.lock, e.token, e.highest_token);
    if !e.resource.is_empty() {
        line.push_str(&format!(" resource={}", e.resource));
    }
    if !e.identity.is_empty() {
        line.push_str(&format!(" identity={}", e.identity));
    }
    line
}
