//! Test-only fault injection, for the fault-injection harness (`fencelock-chaos`):
//! crash points, a faulty clock and re-introduced bugs ("mutants").
//!
//! Each kind sits behind its own cargo feature and stays inert unless its env var
//! is set: a workspace build unifies features, so the production `fencelock`
//! binary may carry this code, and it then behaves exactly as without it (it never
//! calls [`init_from_env`], and its clock only looks at `FENCELOCK_FAULT_CLOCK`).
//!
//! | feature | env var | effect |
//! |---|---|---|
//! | `failpoints` | `FAILPOINTS` | the crash points below ([`init_from_env`]) |
//! | `fault-clock` | `FENCELOCK_FAULT_CLOCK=<file>` | the clock's rate and jumps ([`crate::clock`]) |
//! | `mutants` | `FENCELOCK_MUTANT=<list>` | known bugs switched back on ([`init_from_env`]) |
//! | `power-loss` | `FENCELOCK_POWER_LOSS_SHIM=1` | simulated power loss of the storage |
//! | `peer-routes` | `FENCELOCK_PEER_ROUTES=2=host:port,…` | this node reaches peer 2 through `host:port` (a proxy that can cut that one direction) |
//!
//! The harness calls [`init_from_env`] once, before [`crate::start`].
//!
//! # Crash points (`failpoints`)
//! `FAILPOINTS` uses the syntax of the `fail` crate: `name=actions;name2=actions`,
//! e.g. `log-before-fsync=40*off->return` (pass 40 times, then fire). When a point
//! fires with the action `return`, the process aborts on the spot
//! ([`std::process::abort`]): a crash at exactly that point. The other actions
//! (`off`, `sleep(ms)`, `delay(ms)`, `pause`, `yield`, `print`, `panic`) do what
//! the `fail` crate says; in the driver a `sleep` or `pause` blocks a tokio worker.
//!
//! | name | where | what a crash there means |
//! |---|---|---|
//! | `log-before-fsync` | `LogStore::append`, before `commit()` | entries never durable: lost, none acknowledged |
//! | `log-after-fsync` | `LogStore::append`, after `commit()` | durable but not acknowledged: outcome unknown |
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
//! # Mutants (`mutants`)
//! `FENCELOCK_MUTANT` is a comma list of:
//! - `memory-token`: the token counter behaves as if kept only in memory. Right
//!   before the state machine applies the first entry that was not in the log when
//!   the storage was opened (normally the new term's first entry after a restart),
//!   it calls `fencelock_core::Engine::mutant_forget_tokens`: after a restart,
//!   tokens start again from 1 (INV-2 broken).
//! - `dead-waiter`: the engine loses its dead-waiter protection (etcd#11456): a
//!   release can hand the lock to a queued waiter whose lease has expired (INV-4
//!   broken); see `fencelock_core::mutants`.
//!
//! Every active mutant is logged with a loud `WARN`.

/// The crash-point configuration (syntax of the `fail` crate).
pub const ENV_FAILPOINTS: &str = "FAILPOINTS";
/// The comma list of mutants to turn on.
pub const ENV_MUTANT: &str = "FENCELOCK_MUTANT";
/// The fault clock's setting file (see [`crate::clock`]).
pub const ENV_FAULT_CLOCK: &str = "FENCELOCK_FAULT_CLOCK";
/// Per peer id, the address this node's Raft traffic to it goes through.
pub const ENV_PEER_ROUTES: &str = "FENCELOCK_PEER_ROUTES";

/// The routes of [`ENV_PEER_ROUTES`], once [`init_from_env`] has read them.
static PEER_ROUTES: std::sync::OnceLock<std::collections::BTreeMap<u64, String>> = std::sync::OnceLock::new();

/// The address through which this node reaches peer `id`, if a route was set
/// (feature `peer-routes` and [`ENV_PEER_ROUTES`]); `None`: its own address.
pub fn peer_route(id: u64) -> Option<String> {
    PEER_ROUTES.get()?.get(&id).cloned()
}

/// `2=127.0.0.1:5001,3=127.0.0.1:5002` → id → address.
fn parse_routes(list: &str) -> Result<std::collections::BTreeMap<u64, String>, String> {
    let mut routes = std::collections::BTreeMap::new();
    for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (id, addr) =
            part.split_once('=').ok_or_else(|| format!("{ENV_PEER_ROUTES}: {part:?} is not id=host:port"))?;
        let id = id.trim().parse::<u64>().map_err(|_| format!("{ENV_PEER_ROUTES}: bad node id in {part:?}"))?;
        routes.insert(id, addr.trim().to_string());
    }
    Ok(routes)
}

/// Crash point: entries in the transaction, before the commit (fsync).
pub const LOG_BEFORE_FSYNC: &str = "log-before-fsync";
/// Crash point: after the commit (fsync) returned, before openraft is told.
pub const LOG_AFTER_FSYNC: &str = "log-after-fsync";
/// Crash point: a batch's output applied, before replies and wake-ups go out.
pub const REPLY_BEFORE_SEND: &str = "reply-before-send";
/// Crash point: before the state machine applies an entry.
pub const SM_BEFORE_APPLY: &str = "sm-before-apply";
/// Every crash point; `FAILPOINTS` may name only these.
pub const CRASH_POINTS: [&str; 4] = [LOG_BEFORE_FSYNC, LOG_AFTER_FSYNC, REPLY_BEFORE_SEND, SM_BEFORE_APPLY];

/// The mutant names `FENCELOCK_MUTANT` accepts.
pub const MUTANTS: [&str; 2] = ["memory-token", "dead-waiter"];

/// Configure the test-only faults from the environment: crash points from
/// `FAILPOINTS`, mutants from `FENCELOCK_MUTANT` (and report the fault clock of
/// `FENCELOCK_FAULT_CLOCK`, which the clock reads itself). Call once, before
/// [`crate::start`]. Returns what was activated, one line each, for the harness to
/// print. An unknown name, a bad action, or a variable set for a feature this
/// build lacks, is an error (and then nothing more is configured).
pub fn init_from_env() -> Result<Vec<String>, String> {
    let mutants = match env_var(ENV_MUTANT)? {
        Some(list) => Some(parse_mutants(&list)?),
        None => None,
    };
    let mut active = failpoints_from_env()?;
    if let Some(list) = mutants {
        active.extend(set_mutants(&list)?);
    }
    if let Some(list) = env_var(ENV_PEER_ROUTES)? {
        if !cfg!(feature = "peer-routes") {
            return Err(lacks(ENV_PEER_ROUTES, "peer-routes"));
        }
        let routes = parse_routes(&list)?;
        active.push(format!("peer-routes {list}"));
        let _ = PEER_ROUTES.set(routes);
    }
    if let Some(path) = env_var(ENV_FAULT_CLOCK)? {
        if !cfg!(feature = "fault-clock") {
            return Err(lacks(ENV_FAULT_CLOCK, "fault-clock"));
        }
        active.push(format!("fault-clock {path}"));
    }
    Ok(active)
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

fn lacks(var: &str, feature: &str) -> String {
    format!("{var} is set, but this build of fencelock-server lacks the `{feature}` feature")
}

/// The names of a `FENCELOCK_MUTANT` list, each checked against [`MUTANTS`].
fn parse_mutants(list: &str) -> Result<Vec<&'static str>, String> {
    let mut out = Vec::new();
    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let Some(known) = MUTANTS.iter().find(|m| **m == name) else {
            return Err(format!("{ENV_MUTANT}: unknown mutant {name:?} (known: {})", MUTANTS.join(", ")));
        };
        if !out.contains(known) {
            out.push(*known);
        }
    }
    Ok(out)
}

/// `name=actions` entries of a `FAILPOINTS` value, each name checked against
/// [`CRASH_POINTS`].
#[cfg(any(test, feature = "failpoints"))]
fn parse_failpoints(spec: &str) -> Result<Vec<(&str, &str)>, String> {
    let mut out = Vec::new();
    for entry in spec.split(';').map(str::trim).filter(|e| !e.is_empty()) {
        let Some((name, actions)) = entry.split_once('=') else {
            return Err(format!("{ENV_FAILPOINTS}: {entry:?} is not `name=actions`"));
        };
        let name = name.trim();
        if !CRASH_POINTS.contains(&name) {
            let known = CRASH_POINTS.join(", ");
            return Err(format!("{ENV_FAILPOINTS}: unknown failpoint {name:?} (known: {known})"));
        }
        out.push((name, actions.trim()));
    }
    Ok(out)
}

#[cfg(feature = "failpoints")]
fn failpoints_from_env() -> Result<Vec<String>, String> {
    let Some(spec) = env_var(ENV_FAILPOINTS)? else {
        return Ok(Vec::new());
    };
    let mut active = Vec::new();
    for (name, actions) in parse_failpoints(&spec)? {
        // Configured for the life of the process: never torn down.
        fail::cfg(name, actions).map_err(|e| format!("{ENV_FAILPOINTS}: failpoint {name}: {e}"))?;
        tracing::warn!(failpoint = name, actions, "TEST-ONLY FAILPOINT ACTIVE: `return` aborts the process here");
        active.push(format!("failpoint {name}={actions}"));
    }
    Ok(active)
}

#[cfg(not(feature = "failpoints"))]
fn failpoints_from_env() -> Result<Vec<String>, String> {
    match env_var(ENV_FAILPOINTS)? {
        Some(_) => Err(lacks(ENV_FAILPOINTS, "failpoints")),
        None => Ok(Vec::new()),
    }
}

/// Evaluate the crash point `name`: if it fires (action `return`), abort the
/// process right here, as a crash would.
#[cfg(feature = "failpoints")]
pub(crate) fn crash_point(name: &'static str) {
    let fired = || -> bool {
        fail::fail_point!(name, |_| true);
        false
    };
    if fired() {
        eprintln!("fencelock-server: failpoint {name} fired: aborting the process (simulated crash)");
        std::process::abort();
    }
}

#[cfg(feature = "mutants")]
mod mutant_flags {
    use std::sync::atomic::{AtomicBool, Ordering};

    static MEMORY_TOKEN: AtomicBool = AtomicBool::new(false);

    pub fn set_memory_token(on: bool) {
        MEMORY_TOKEN.store(on, Ordering::Relaxed);
    }

    pub fn memory_token() -> bool {
        MEMORY_TOKEN.load(Ordering::Relaxed)
    }
}

/// Whether the `memory-token` mutant is on (read when the storage is opened).
#[cfg(feature = "mutants")]
pub(crate) fn memory_token_mutant() -> bool {
    mutant_flags::memory_token()
}

/// Turn on exactly the mutants of `list` (the others off).
#[cfg(feature = "mutants")]
fn set_mutants(list: &[&'static str]) -> Result<Vec<String>, String> {
    mutant_flags::set_memory_token(list.contains(&"memory-token"));
    fencelock_core::mutants::set_dead_waiter_check_removed(list.contains(&"dead-waiter"));
    for name in list {
        tracing::warn!(mutant = name, "TEST-ONLY MUTANT ACTIVE: this server has a known bug switched back on");
    }
    Ok(list.iter().map(|m| format!("mutant {m}")).collect())
}

#[cfg(not(feature = "mutants"))]
fn set_mutants(list: &[&'static str]) -> Result<Vec<String>, String> {
    match list.is_empty() {
        true => Ok(Vec::new()),
        false => Err(lacks(ENV_MUTANT, "mutants")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mutant_lists_accept_known_names_and_reject_unknown_ones() {
        assert_eq!(parse_mutants(" memory-token, dead-waiter ,memory-token,"), Ok(vec!["memory-token", "dead-waiter"]));
        assert_eq!(parse_mutants(""), Ok(vec![]));
        let err = parse_mutants("memory-token,dead-writer").unwrap_err();
        assert!(err.contains("unknown mutant \"dead-writer\""), "{err}");
    }

    #[test]
    fn peer_routes_parse_and_bad_ones_say_why() {
        let r = parse_routes("2=127.0.0.1:5001, 3=127.0.0.1:5002,").unwrap();
        assert_eq!(r.get(&3).map(String::as_str), Some("127.0.0.1:5002"));
        assert!(parse_routes("2").unwrap_err().contains("id=host:port"));
        assert!(parse_routes("x=a:1").unwrap_err().contains("bad node id"));
    }

    #[test]
    fn failpoint_specs_split_into_known_names_and_actions() {
        let spec = "log-before-fsync=40*off->return; sm-before-apply = return ;";
        let want = vec![("log-before-fsync", "40*off->return"), ("sm-before-apply", "return")];
        assert_eq!(parse_failpoints(spec), Ok(want));
        assert!(parse_failpoints("log-before-fsync").unwrap_err().contains("name=actions"));
        assert!(parse_failpoints("log-befor-fsync=return").unwrap_err().contains("unknown failpoint"));
    }
}
