//! Crash points armed from `FAILPOINTS`: the server calls
//! [`fencelock_server::seams::Hooks::crash_point`] at each [`CrashPoint`], and a
//! point whose plan says `return` aborts the process there
//! ([`std::process::abort`]): a crash at exactly that point.
//!
//! `FAILPOINTS` is `name=plan;name2=plan`, each name a [`CrashPoint::name`]. A
//! plan is tasks joined by `->`, each `[N*]action`, `action` one of `off` (pass)
//! and `return` (crash); a task with a count runs that many passes, then the
//! next one takes over; a task without one runs for ever; after the last task
//! the point is off. `return` crashes at the first pass; `40*off->return`
//! passes 40 times, then crashes. (The syntax of the `fail` crate, with only
//! the actions the harness uses.)

use std::sync::Mutex;

use fencelock_server::seams::CrashPoint;

/// What a task does at a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Off,
    Return,
}

/// One point's plan and how far it has run.
#[derive(Debug)]
struct Plan {
    tasks: Vec<(Option<u64>, Action)>,
    /// (current task, passes it has run).
    at: Mutex<(usize, u64)>,
}

impl Plan {
    /// `[N*]action->…`.
    fn parse(spec: &str) -> Result<Plan, String> {
        let mut tasks = Vec::new();
        for task in spec.split("->").map(str::trim) {
            let (count, action) = match task.split_once('*') {
                Some((n, a)) => (Some(n.trim().parse::<u64>().map_err(|_| format!("bad count in {task:?}"))?), a),
                None => (None, task),
            };
            let action = match action.trim() {
                "off" => Action::Off,
                "return" => Action::Return,
                other => return Err(format!("unknown action {other:?} (off, return)")),
            };
            tasks.push((count, action));
        }
        Ok(Plan { tasks, at: Mutex::new((0, 0)) })
    }

    /// One pass: whether it crashes.
    fn pass(&self) -> bool {
        let mut at = self.at.lock().unwrap_or_else(|p| p.into_inner());
        while let Some((count, action)) = self.tasks.get(at.0) {
            if count.is_some_and(|n| at.1 >= n) {
                *at = (at.0 + 1, 0);
                continue;
            }
            at.1 += 1;
            return *action == Action::Return;
        }
        false
    }
}

/// The armed crash points.
#[derive(Debug, Default)]
pub struct Failpoints {
    plans: Vec<(CrashPoint, Plan)>,
}

impl Failpoints {
    /// Parses a `FAILPOINTS` value (see the module docs).
    pub fn parse(spec: &str) -> Result<Failpoints, String> {
        let mut plans = Vec::new();
        for entry in spec.split(';').map(str::trim).filter(|e| !e.is_empty()) {
            let Some((name, plan)) = entry.split_once('=') else {
                return Err(format!("{entry:?} is not `name=actions`"));
            };
            let name = name.trim();
            let Some(point) = CrashPoint::ALL.into_iter().find(|p| p.name() == name) else {
                let known: Vec<&str> = CrashPoint::ALL.iter().map(|p| p.name()).collect();
                return Err(format!("unknown failpoint {name:?} (known: {})", known.join(", ")));
            };
            let plan = Plan::parse(plan).map_err(|e| format!("failpoint {name}: {e}"))?;
            plans.push((point, plan));
        }
        Ok(Failpoints { plans })
    }

    /// Whether no point is armed.
    pub fn is_empty(&self) -> bool {
        self.plans.is_empty()
    }

    /// Whether `point` crashes at this pass.
    pub fn fires(&self, point: CrashPoint) -> bool {
        self.plans.iter().filter(|(p, _)| *p == point).any(|(_, plan)| plan.pass())
    }

    /// The server reached `point`: abort the process here if its plan says so.
    pub fn reached(&self, point: CrashPoint) {
        if self.fires(point) {
            eprintln!(
                "fencelock-chaos serve: failpoint {} fired: aborting the process (simulated crash)",
                point.name()
            );
            std::process::abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn passes(spec: &str, point: CrashPoint, n: usize) -> Vec<bool> {
        let f = Failpoints::parse(spec).unwrap();
        (0..n).map(|_| f.fires(point)).collect()
    }

    #[test]
    fn return_fires_at_once_and_counts_pass_first() {
        assert_eq!(passes("log-before-fsync=return", CrashPoint::LogBeforeFsync, 2), [true, true]);
        assert_eq!(passes("log-before-fsync=return", CrashPoint::LogAfterFsync, 2), [false, false]);
        let want = [false, false, false, true, true];
        assert_eq!(passes(" sm-before-apply = 3*off->return ;", CrashPoint::SmBeforeApply, 5), want);
        assert_eq!(passes("reply-before-send=1*return->off", CrashPoint::ReplyBeforeSend, 3), [true, false, false]);
        assert_eq!(passes("reply-before-send=2*off", CrashPoint::ReplyBeforeSend, 3), [false, false, false]);
    }

    #[test]
    fn bad_specs_say_why() {
        let err = |s: &str| Failpoints::parse(s).unwrap_err();
        assert!(err("log-before-fsync").contains("name=actions"));
        assert!(err("log-befor-fsync=return").contains("unknown failpoint"));
        assert!(err("log-before-fsync=panic").contains("unknown action"));
        assert!(err("log-before-fsync=x*off->return").contains("bad count"));
    }
}
