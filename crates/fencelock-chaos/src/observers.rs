//! Election mode's observers: tasks of the harness that follow the run's
//! election (`backend.election(LOCK).observe()`) and write every
//! `LeaderEvent` they receive, with its receive time, into their own history
//! file (`o0.jsonl`, …) for E2 and E3. Shared mode's holder observer
//! ([`HolderPolls`]): a task that polls the lock's holders as the server
//! reports them (`describe`) every [`POLL_EVERY`] into `d0.jsonl`, for R2.
//!
//! Where it sits: started by `run` beside the workers, stopped before the
//! histories are read. An observer connects straight to the lock service (no
//! proxy: the nemesis's faults are the workers' and the servers'), and
//! subscribes again whenever its stream ends (a node killed under it, say),
//! noting each subscription (`subscribed`) so the checks know where a new
//! stream begins.

use std::path::Path;
use std::time::Duration;

use fencelock::{Backend, LeaderEvent, LockInfo, LockMode};
use tokio::task::JoinHandle;

use crate::history::{Event, Op, Writer};

/// How long an observer waits before it connects or subscribes again.
const RETRY: Duration = Duration::from_millis(100);
/// How often the holder observer asks for the lock's holders.
pub const POLL_EVERY: Duration = Duration::from_millis(50);

/// The running observers.
pub struct Observers {
    tasks: Vec<JoinHandle<()>>,
}

impl Observers {
    /// Starts `n` observers of the election `name` on the service at `url`,
    /// writing into `hist/o<i>.jsonl`.
    pub fn start(n: usize, url: &str, name: &str, hist: &Path) -> anyhow::Result<Observers> {
        let mut tasks = Vec::new();
        for i in 0..n {
            let out = Writer::create(&hist.join(format!("o{i}.jsonl")))?;
            let o = Observer { p: format!("o{i}"), out, url: url.to_string(), name: name.to_string() };
            tasks.push(tokio::spawn(o.run()));
        }
        Ok(Observers { tasks })
    }

    /// Stops every observer (their files hold every event written so far).
    pub async fn stop(self) {
        for t in self.tasks {
            t.abort();
            let _ = t.await;
        }
    }
}

struct Observer {
    p: String,
    out: Writer,
    url: String,
    name: String,
}

impl Observer {
    /// Connects and follows the election until aborted.
    async fn run(mut self) {
        let mut ended: Option<String> = None;
        loop {
            let backend = match fencelock::backend::connect(&self.url).await {
                Ok(b) => b,
                Err(e) => {
                    ended = Some(format!("connect: {e}"));
                    tokio::time::sleep(RETRY).await;
                    continue;
                }
            };
            ended = Some(self.follow(&backend, ended.take()).await);
            tokio::time::sleep(RETRY).await;
        }
    }

    /// Subscribes once and records the stream's events; why it ended.
    async fn follow(&mut self, backend: &Backend, ended: Option<String>) -> String {
        let mut stream = match backend.election(&self.name).observe().await {
            Ok(s) => s,
            Err(e) => return format!("observe: {e}"),
        };
        self.write(Event { error: ended, ..Event::note(self.p.clone(), Op::Subscribed) });
        loop {
            match stream.next_event().await {
                Some(Ok(ev)) => self.write(observed(&self.p, &ev)),
                Some(Err(e)) => return format!("stream: {e}"),
                None => return "stream ended".into(),
            }
        }
    }

    fn write(&mut self, e: Event) {
        if let Err(err) = self.out.write(&e) {
            tracing::error!(error = %err, observer = %self.p, "cannot write the observer's history");
        }
    }
}

/// The `observed` note of `ev`, received now.
fn observed(p: &str, ev: &LeaderEvent) -> Event {
    let mut e = Event { token: Some(ev.term()), ..Event::note(p, Op::Observed) };
    match ev {
        LeaderEvent::Leader(l) => {
            e.what = Some("leader".into());
            e.value = Some(vec![String::from_utf8_lossy(&l.value).into_owned()]);
            e.detail = serde_json::json!({ "identity": l.identity });
        }
        LeaderEvent::Vacant { .. } => e.what = Some("vacant".into()),
        // A kind of event this harness does not know: E2 reports it as malformed.
        _ => e.what = Some(format!("{ev:?}")),
    }
    e
}

/// Shared mode's holder observer: polls `describe` of the run's lock on
/// fencelock's own server (a node or the group: the client follows the
/// leader) and writes each answer as a `holders` note (`p` = `d0`). A failed
/// poll (a node killed under it, a timeout) is not written: R2 judges what
/// the server said, never a guess.
pub struct HolderPolls {
    task: JoinHandle<()>,
}

impl HolderPolls {
    /// Starts polling the lock `name` on the server at `url`, writing into `hist/d0.jsonl`.
    pub fn start(url: &str, name: &str, hist: &Path) -> anyhow::Result<HolderPolls> {
        let out = Writer::create(&hist.join("d0.jsonl"))?;
        let task = tokio::spawn(poll_holders(url.to_string(), name.to_string(), out));
        Ok(HolderPolls { task })
    }

    /// Stops polling (the file holds every poll written so far).
    pub async fn stop(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

/// Connects (retrying), then polls until aborted.
async fn poll_holders(url: String, name: String, mut out: Writer) {
    let client = loop {
        match fencelock::Client::connect(url.as_str()).await {
            Ok(c) => break c,
            Err(_) => tokio::time::sleep(RETRY).await,
        }
    };
    loop {
        if let Ok(info) = client.describe(&name).await {
            if let Err(err) = out.write(&holders_note(&info)) {
                tracing::error!(error = %err, "cannot write the holder observer's history");
            }
        }
        tokio::time::sleep(POLL_EVERY).await;
    }
}

/// The `holders` note of one `describe` answer, received now.
pub fn holders_note(info: &LockInfo) -> Event {
    let holders: Vec<serde_json::Value> = info
        .holders
        .iter()
        .map(|h| {
            serde_json::json!({
                "mode": mode_name(h.mode),
                "token": h.token,
                "lease": h.lease_id,
                "ttl_left_ms": h.ttl_left.as_millis() as u64,
                "weight": h.weight,
            })
        })
        .collect();
    let detail = serde_json::json!({ "holders": holders, "permits": info.permits });
    Event { detail, ..Event::note("d0", Op::Holders) }
}

/// A holder's mode as the `holders` note names it.
pub fn mode_name(m: LockMode) -> &'static str {
    match m {
        LockMode::Shared => "shared",
        LockMode::Exclusive => "exclusive",
    }
}
