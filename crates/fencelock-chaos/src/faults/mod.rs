//! The faults `fencelock-chaos serve` plugs into a lock server, each read from
//! an environment variable the harness sets on that child process.
//!
//! Where it sits: the server has no fault code and reads none of these
//! variables; it offers seams (a time source, a storage backend, hooks at crash
//! points and before each apply, peer routes: `fencelock_server::seams`,
//! `fencelock_server::clock`) and [`Armed::plug`] fills them. The `fencelock`
//! binary never does, however it is built.
//!
//! | env var | effect | module |
//! |---|---|---|
//! | `FAILPOINTS=name=plan;…` | crash (abort) at a crash point | [`failpoints`] |
//! | `FENCELOCK_FAULT_CLOCK=<file>` | the server's clock runs at a rate and jumps, as the file says | [`clock`] |
//! | `FENCELOCK_MUTANT=<list>` | known bugs switched back on (`memory-token`, `dead-waiter`, `wal-no-sync`) | [`mutants`] |
//! | `FENCELOCK_POWER_LOSS_SHIM=1` | the database on a backend that journals unsynced writes, for simulated power loss; the segment log's files too | [`power_loss`], [`wal_undo`] |
//! | `FENCELOCK_PEER_ROUTES=2=host:port,…` | this node reaches peer 2 through `host:port` (a proxy that can cut that one direction) | [`parse_routes`] |
//!
//! # Crash points
//! | name | where | what a crash there means |
//! |---|---|---|
//! | `log-before-fsync` | `LogStore::append`, before `commit()` (segment log: its writer, before a batch's `fdatasync`) | entries never durable: lost, none acknowledged |
//! | `log-after-fsync` | `LogStore::append`, after `commit()` (segment log: after the `fdatasync`, before the callbacks) | durable but not acknowledged: outcome unknown |
//! | `reply-before-send` | driver, before replies and wake-ups | applied and durable, but nobody was told |
//! | `sm-before-apply` | state machine, before each entry | committed but not applied: replayed at restart |
//!
//! In detail: `log-before-fsync` fires once the entries of an append are written
//! into the redb transaction, before it commits (fsync); `log-after-fsync` after
//! the commit returned, before openraft is told (after a restart the entries are in
//! the log and get committed and applied); `reply-before-send` after every written
//! batch's output is applied (commands, ticks and `LeaderStart` alike), before the
//! replies and wake-ups go out (a client retry with the same request id must get
//! the same outcome, INV-6); `sm-before-apply` before the state machine applies
//! each entry, the replay at startup included.
//!
//! Every armed fault is logged with a loud `WARN` and listed on stderr.

pub mod clock;
pub mod failpoints;
pub mod mutants;
pub mod power_loss;
pub mod wal_undo;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use fencelock_core::Engine;
use fencelock_server::clock::Clock;
use fencelock_server::seams::{Applying, CrashPoint, Hooks};
use fencelock_server::Config;

/// The crash-point configuration (see [`failpoints`]).
pub const ENV_FAILPOINTS: &str = "FAILPOINTS";
/// The comma list of mutants to turn on (see [`mutants`]).
pub const ENV_MUTANT: &str = "FENCELOCK_MUTANT";
/// The fault clock's setting file (see [`clock`]).
pub const ENV_FAULT_CLOCK: &str = "FENCELOCK_FAULT_CLOCK";
/// Per peer id, the address this node's Raft traffic to it goes through.
pub const ENV_PEER_ROUTES: &str = "FENCELOCK_PEER_ROUTES";
/// `1`: the power-loss storage shim (see [`power_loss`]).
pub const ENV_POWER_LOSS: &str = power_loss::ENV_SHIM;

/// The faults read from the environment, ready to plug into a node.
#[derive(Debug, Default)]
pub struct Armed {
    /// What is armed, one line each, for the harness to print.
    pub lines: Vec<String>,
    clock: Option<Arc<clock::FaultClock>>,
    hooks: Option<Arc<ChaosHooks>>,
    power_loss: bool,
    /// The `wal-no-sync` mutant (with the power-loss shim).
    wal_no_sync: bool,
    peer_routes: BTreeMap<u64, String>,
}

/// The server hooks of the armed crash points and `memory-token` mutant.
#[derive(Debug, Default)]
struct ChaosHooks {
    failpoints: failpoints::Failpoints,
    memory_token: Option<mutants::MemoryToken>,
}

impl Hooks for ChaosHooks {
    fn crash_point(&self, point: CrashPoint) {
        self.failpoints.reached(point);
    }

    fn before_apply(&self, entry: Applying, engine: &mut Engine) {
        if let Some(m) = &self.memory_token {
            m.before_apply(entry, engine);
        }
    }
}

impl Armed {
    /// Reads every variable of the table above. An unknown name or a bad value is
    /// an error (and then nothing is armed). Turns the `dead-waiter` mutant's
    /// process-wide switch as listed.
    pub fn from_env() -> Result<Armed, String> {
        let mut armed = Armed::default();
        let mut hooks = ChaosHooks::default();
        if let Some(spec) = env_var(ENV_FAILPOINTS)? {
            hooks.failpoints = failpoints::Failpoints::parse(&spec).map_err(|e| format!("{ENV_FAILPOINTS}: {e}"))?;
            armed.lines.push(format!("failpoints {spec}"));
        }
        let list = env_var(ENV_MUTANT)?.unwrap_or_default();
        let list = mutants::parse(&list).map_err(|e| format!("{ENV_MUTANT}: {e}"))?;
        if list.contains(&"memory-token") {
            hooks.memory_token = Some(mutants::MemoryToken::default());
        }
        armed.wal_no_sync = list.contains(&"wal-no-sync");
        armed.lines.extend(list.iter().map(|m| format!("mutant {m}")));
        if let Some(list) = env_var(ENV_PEER_ROUTES)? {
            armed.peer_routes = parse_routes(&list)?;
            armed.lines.push(format!("peer-routes {list}"));
        }
        if let Some(path) = env_var(ENV_FAULT_CLOCK)? {
            armed.clock = Some(Arc::new(clock::FaultClock::real(PathBuf::from(&path))));
            armed.lines.push(format!("fault-clock {path}"));
        }
        armed.power_loss = env_var(ENV_POWER_LOSS)?.is_some_and(|v| v == "1");
        if armed.power_loss {
            armed.lines.push(format!("power-loss shim ({ENV_POWER_LOSS}=1)"));
        }
        let any_hook = !hooks.failpoints.is_empty() || hooks.memory_token.is_some();
        armed.hooks = any_hook.then(|| Arc::new(hooks));
        mutants::switch_dead_waiter(&list);
        for line in &armed.lines {
            tracing::warn!("TEST-ONLY FAULT ARMED: {line}");
        }
        Ok(armed)
    }

    /// Plugs the armed faults into `config`'s seams and peer routes; the clock
    /// to serve with (the fault clock, if armed).
    pub fn plug(&self, config: &mut Config) -> Clock {
        if let Some(h) = &self.hooks {
            config.seams.hooks = Some(h.clone());
        }
        if self.power_loss {
            config.seams.storage = Some(Arc::new(power_loss::UndoStorage));
            config.seams.log_files = Some(Arc::new(wal_undo::UndoLogFiles { no_sync: self.wal_no_sync }));
        }
        config.peer_routes.extend(self.peer_routes.clone());
        match &self.clock {
            Some(c) => Clock::with_source(c.clone()),
            None => Clock::new(),
        }
    }
}

/// `2=127.0.0.1:5001,3=127.0.0.1:5002` → id → address, in the grammar of a
/// peer list (`fencelock_server::parse_peers`).
pub fn parse_routes(list: &str) -> Result<BTreeMap<u64, String>, String> {
    fencelock_server::parse_peers(list).map_err(|e| format!("{ENV_PEER_ROUTES}: {e}"))
}

/// The value of `name`, or `None` if it is unset or blank.
fn env_var(name: &str) -> Result<Option<String>, String> {
    match std::env::var(name) {
        Ok(v) if v.trim().is_empty() => Ok(None),
        Ok(v) => Ok(Some(v.trim().to_string())),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(e) => Err(format!("{name}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_routes_parse_and_bad_ones_say_why() {
        let r = parse_routes("2=127.0.0.1:5001, 3=127.0.0.1:5002,").unwrap();
        assert_eq!(r.get(&3).map(String::as_str), Some("127.0.0.1:5002"));
        assert!(parse_routes("2").unwrap_err().contains("id=host:port"));
        assert!(parse_routes("x=a:1").unwrap_err().contains("not a number"));
    }
}
