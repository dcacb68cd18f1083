//! W6, election fail-over: three `fencelock elect` candidate processes on one
//! election, an observer in this process; the leader's process is SIGKILLed
//! (a crash) or SIGSTOPped (a freeze: a GC pause, a VM migration), and the
//! figure is the time from the signal until the observer sees a leader of a
//! higher term. Every engine runs the same candidates with the same TTL, so
//! the difference is how each one notices a dead leader and hands over.
//!
//! Where it sits: one workload of `fencelock-bench` (see `main.rs`), run on
//! every engine of the run whose backend declares elections
//! (`Capabilities::election`); the candidates are the real CLI (`fencelock
//! elect`, next to this binary), so the leader's lease lives in a process of
//! its own, as in production. The signal comes at a random instant within one
//! TTL after the leader was seen (a random point of its renewal cycle). The
//! killed or frozen candidate is replaced before the next sample, so three
//! candidates compete in every sample.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use fencelock::{Leader, LeaderEvent, LeaderStream};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::engines::Engine;
use crate::model::{Failover, Fault};

/// The election's name.
const NAME: &str = "w6-election";
/// Candidates competing in every sample.
const CANDIDATES: usize = 3;

/// The signal that takes the leader out by `fault`.
fn signal(fault: Fault) -> Signal {
    match fault {
        Fault::Kill => Signal::SIGKILL,
        Fault::Stop => Signal::SIGSTOP,
    }
}

/// What to measure.
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    pub ttl: Duration,
    /// Samples per fault.
    pub samples: usize,
}

/// W6 on `engine`: `spec.samples` kills, then as many freezes.
pub async fn run(engine: &Engine, spec: Spec) -> anyhow::Result<Vec<Failover>> {
    let backend = fencelock::connect(&engine.url).await.context("connect the observer")?;
    if !backend.capabilities().election {
        bail!("{} has no leader election", engine.info.id);
    }
    let mut observer = backend.observe(NAME).await.context("observe the election")?;
    let mut group = Candidates::new(&engine.url, spec.ttl)?;
    group.fill()?;
    let limit = spec.ttl * 5 + Duration::from_secs(10);
    let mut leader = next_leader(&mut observer, 0, limit).await.context("the first leader")?;
    let mut out = Vec::new();
    for fault in [Fault::Kill, Fault::Stop] {
        let mut samples_ms = Vec::new();
        for _ in 0..spec.samples {
            let slot = group.slot_of(&leader)?;
            // At a random point of the leader's renewal cycle, not right after
            // its election (when its lease was just renewed).
            tokio::time::sleep(spec.ttl.mul_f64(fastrand::f64())).await;
            let signalled = Instant::now();
            group.signal(slot, signal(fault))?;
            let next = next_leader(&mut observer, leader.term, limit)
                .await
                .with_context(|| format!("a leader after {} of term {}", fault.as_str(), leader.term))?;
            samples_ms.push(signalled.elapsed().as_secs_f64() * 1e3);
            group.replace(slot)?;
            leader = next;
        }
        out.push(summary(engine, fault, spec.ttl, samples_ms));
    }
    Ok(out)
}

fn summary(engine: &Engine, fault: Fault, ttl: Duration, samples_ms: Vec<f64>) -> Failover {
    let mut sorted = samples_ms.clone();
    sorted.sort_by(f64::total_cmp);
    let median_ms = sorted.get(sorted.len() / 2).copied().unwrap_or(f64::NAN);
    let max_ms = sorted.last().copied().unwrap_or(f64::NAN);
    Failover { engine: engine.info.id.clone(), fault, ttl_ms: ttl.as_millis() as u64, samples_ms, median_ms, max_ms }
}

/// The next leader the observer reports with a term above `above`.
async fn next_leader(observer: &mut LeaderStream, above: u64, limit: Duration) -> anyhow::Result<Leader> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let ev = tokio::time::timeout_at(deadline, observer.next_event())
            .await
            .with_context(|| format!("no leader above term {above} within {limit:?}"))?;
        match ev {
            Some(Ok(LeaderEvent::Leader(l))) if l.term > above => return Ok(l),
            Some(Ok(_)) => {}
            Some(Err(e)) => return Err(e).context("the observer failed"),
            None => bail!("the observer ended"),
        }
    }
}

/// The candidate processes, one per slot; a candidate's identity names its
/// slot and generation (`w6-SLOT-GEN`), so the leader's identity says which
/// process to signal.
struct Candidates {
    cli: PathBuf,
    url: String,
    ttl: Duration,
    slots: Vec<Option<Child>>,
    generation: usize,
}

/// The `fencelock` binary W6's candidates run (`fencelock elect`), beside this
/// one; an error saying how to build it if it is not there. `main` asks before
/// anything runs, so a long bench does not stop at W6 with its results unwritten.
pub fn elect_cli() -> anyhow::Result<PathBuf> {
    let cli = std::env::current_exe()?.with_file_name("fencelock");
    if !cli.exists() {
        bail!(
            "W6 runs `fencelock elect`: build it first (cargo build [--release] -p fencelock-cli, the same profile as \
             the bench), expected at {}",
            cli.display()
        );
    }
    Ok(cli)
}

impl Candidates {
    fn new(url: &str, ttl: Duration) -> anyhow::Result<Candidates> {
        let cli = elect_cli()?;
        let slots = (0..CANDIDATES).map(|_| None).collect();
        Ok(Candidates { cli, url: url.to_string(), ttl, slots, generation: 0 })
    }

    fn fill(&mut self) -> anyhow::Result<()> {
        for slot in 0..self.slots.len() {
            if self.slots[slot].is_none() {
                self.spawn(slot)?;
            }
        }
        Ok(())
    }

    fn spawn(&mut self, slot: usize) -> anyhow::Result<()> {
        self.generation += 1;
        let ttl = format!("{}ms", self.ttl.as_millis());
        let identity = format!("w6-{slot}-{}", self.generation);
        let child = Command::new(&self.cli)
            .args(["elect", "--server", &self.url, "--ttl", &ttl, "--identity", &identity, NAME, "--", "sleep", "3600"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("start {}", self.cli.display()))?;
        self.slots[slot] = Some(child);
        Ok(())
    }

    /// The slot of the process that leads as `leader`.
    fn slot_of(&self, leader: &Leader) -> anyhow::Result<usize> {
        let identity = leader.identity.as_deref().unwrap_or("");
        let slot = identity.strip_prefix("w6-").and_then(|rest| rest.split('-').next()).and_then(|s| s.parse().ok());
        match slot {
            Some(s) if s < self.slots.len() => Ok(s),
            _ => bail!("a leader that is none of the candidates: {leader:?}"),
        }
    }

    fn signal(&self, slot: usize, signal: Signal) -> anyhow::Result<()> {
        let child = self.slots[slot].as_ref().context("an empty slot")?;
        kill(Pid::from_raw(child.id() as i32), signal).with_context(|| format!("{signal} the leader"))
    }

    /// Kills the candidate in `slot` (frozen or not) and starts another.
    fn replace(&mut self, slot: usize) -> anyhow::Result<()> {
        if let Some(mut child) = self.slots[slot].take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.spawn(slot)
    }
}

impl Drop for Candidates {
    fn drop(&mut self) {
        for child in self.slots.iter_mut().flatten() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Clear errors: without the `fencelock` binary beside the bench (a test
    /// binary has none beside it, in `deps/`), W6's check says what to build
    /// and where it looked, before anything runs.
    #[test]
    fn a_missing_elect_binary_says_what_to_build() {
        let err = elect_cli().expect_err("no fencelock binary beside a test binary").to_string();
        assert!(err.contains("cargo build [--release] -p fencelock-cli"), "{err}");
        assert!(err.contains("fencelock"), "{err}");
    }
}
