//! What `fencelock top` shows, as data: the last lock table fetched (in
//! contention order), how old it is, the connection's state, the group line's
//! source, the filter (applied, or being typed) and what refused it. Keys
//! change it here ([`View::on_key`]) and say what the loop must do; no IO,
//! no clock: the loop hands in the table's age.

use std::cmp::Ordering;
use std::time::Duration;

use fencelock::LockInfo;
use fencelock_server::cluster::Status;

/// Everything the screen is drawn from.
#[derive(Debug, Clone)]
pub struct View {
    /// The server as it may be shown (no token).
    pub server: String,
    /// The last table fetched, in contention order ([`contention`]).
    pub locks: Vec<LockInfo>,
    /// Time since `locks` was fetched: countdowns and "held for" move by it.
    pub age: Duration,
    /// Whether a table has come for the current filter.
    pub loaded: bool,
    pub conn: Conn,
    pub group: Group,
    /// The applied filter: the prefix listed and watched ("" = every lock).
    pub prefix: String,
    /// The filter being typed after `/`, until Enter or Esc.
    pub editing: Option<String>,
    /// Why the server would not list the prefix (a refusal, a bad prefix):
    /// shown on the filter line.
    pub problem: Option<String>,
    /// Writes that fences refused as stale, as their reports reach the
    /// watch (`write_refused`) while `top` runs, the newest last; at most
    /// [`REFUSALS_KEPT`].
    pub fence_refusals: Vec<FenceRefusal>,
    /// How many refusals `top` has seen in all.
    pub refusals_seen: u64,
}

/// The refusals [`View::fence_refusals`] keeps.
pub const REFUSALS_KEPT: usize = 20;

/// A write a fence refused because its token was stale (see
/// [`View::fence_refusals`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FenceRefusal {
    pub lock: String,
    /// The stale token the write carried.
    pub token: u64,
    /// The fence's mark that refused it: the highest token it had admitted.
    pub highest_token: u64,
    /// What the fence protects (a storage key), "" when unnamed.
    pub resource: String,
}

/// The connection as the last fetch found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Conn {
    /// No answer yet.
    Connecting,
    /// The last list was answered.
    Live,
    /// The last list could not reach a server: the table shown is the last
    /// one fetched, and the client keeps trying.
    Reconnecting,
}

/// The source of the group line.
#[derive(Debug, Clone, PartialEq)]
pub enum Group {
    /// No `--admin`: the client knows only the server's URL.
    NoAdmin,
    /// `--admin` given, no answer yet.
    Asking,
    /// A member's `GET /v1/cluster` (the leader's, when it answered).
    Cluster(Status),
    /// `GET /healthz` of a member that refused `/v1/cluster` (or has none):
    /// `why` says which.
    Health { node_id: u64, leader: Option<u64>, term: u64, last_applied: Option<u64>, why: String },
    /// No member answered, or all refused: what went wrong.
    Failed(String),
}

/// A key, as [`super::term::decode_keys`] reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    Char(char),
    Enter,
    Backspace,
    Esc,
    CtrlC,
}

/// What the loop does after a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Nothing changed.
    Nothing,
    /// Draw again (the filter line changed).
    Redraw,
    /// Fetch the table now.
    Refresh,
    /// The filter changed: list and watch the new prefix.
    Apply,
    Quit,
}

impl View {
    /// A fence's report of a refused write arrived.
    pub fn refused(&mut self, r: FenceRefusal) {
        self.refusals_seen += 1;
        self.fence_refusals.push(r);
        if self.fence_refusals.len() > REFUSALS_KEPT {
            self.fence_refusals.remove(0);
        }
    }

    /// A view of `server` filtering on `prefix`, before any answer.
    pub fn new(server: String, prefix: String, group: Group) -> View {
        View {
            server,
            locks: Vec::new(),
            age: Duration::ZERO,
            loaded: false,
            conn: Conn::Connecting,
            group,
            prefix,
            editing: None,
            problem: None,
            fence_refusals: Vec::new(),
            refusals_seen: 0,
        }
    }

    /// `q` or Ctrl-C quits, `r` refreshes, `/` starts a filter; while one is
    /// typed, characters add to it, Backspace deletes, Enter applies it and
    /// Esc drops it (Ctrl-C still quits).
    pub fn on_key(&mut self, key: Key) -> Action {
        let Some(text) = &mut self.editing else {
            return match key {
                Key::Char('q') | Key::CtrlC => Action::Quit,
                Key::Char('r') => Action::Refresh,
                Key::Char('/') => {
                    self.editing = Some(String::new());
                    Action::Redraw
                }
                _ => Action::Nothing,
            };
        };
        match key {
            Key::CtrlC => Action::Quit,
            Key::Char(c) if !c.is_control() => {
                text.push(c);
                Action::Redraw
            }
            Key::Char(_) => Action::Nothing,
            Key::Backspace => {
                text.pop();
                Action::Redraw
            }
            Key::Esc => {
                self.editing = None;
                Action::Redraw
            }
            Key::Enter => {
                self.prefix = self.editing.take().unwrap_or_default();
                self.locks.clear();
                self.loaded = false;
                self.problem = None;
                Action::Apply
            }
        }
    }

    /// A fetched table: sorted, its age zero, the connection live.
    pub fn set_locks(&mut self, mut locks: Vec<LockInfo>) {
        locks.sort_by(contention);
        self.locks = locks;
        self.age = Duration::ZERO;
        self.loaded = true;
        self.conn = Conn::Live;
        self.problem = None;
    }

    /// The server refused the prefix (or the request): nothing of it is
    /// shown, and the filter line says why.
    pub fn set_problem(&mut self, why: String) {
        self.locks.clear();
        self.loaded = true;
        self.conn = Conn::Live;
        self.problem = Some(why);
    }

    /// No server could be reached: keep the last table, say so.
    pub fn set_unreachable(&mut self) {
        self.conn = Conn::Reconnecting;
    }
}

/// Contention order: most waiters first, then the lock held longest, then
/// by name.
pub fn contention(a: &LockInfo, b: &LockInfo) -> Ordering {
    let held = |l: &LockInfo| l.holders.iter().map(|h| h.held).max().unwrap_or_default();
    b.waiters.len().cmp(&a.waiters.len()).then_with(|| held(b).cmp(&held(a))).then_with(|| a.name.cmp(&b.name))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use fencelock::{Holder, LockMode, Waiter};

    /// A holder of a test lock: `identity` (if any), `token`, held and TTL left in ms.
    pub fn holder(identity: Option<&str>, token: u64, held_ms: u64, ttl_ms: u64) -> Holder {
        Holder {
            lease_id: 1000 + token,
            owner: None,
            token,
            held: Duration::from_millis(held_ms),
            ttl_left: Duration::from_millis(ttl_ms),
            lock_delay: Duration::ZERO,
            identity: identity.map(str::to_string),
            value: Vec::new(),
            mode: LockMode::Exclusive,
            weight: 1,
        }
    }

    /// A waiter of a test lock.
    pub fn waiter(identity: Option<&str>, lease_id: u64) -> Waiter {
        Waiter {
            lease_id,
            waited: Duration::from_secs(1),
            wait_left: Duration::from_secs(60),
            identity: identity.map(str::to_string),
        }
    }

    /// A lock with these holders and waiters.
    pub fn lock(name: &str, holders: Vec<Holder>, waiters: Vec<Waiter>) -> LockInfo {
        LockInfo { name: name.into(), holder: holders.first().cloned(), holders, permits: 0, reopens_in: None, waiters }
    }

    fn view() -> View {
        View::new("http://127.0.0.1:7070".into(), String::new(), Group::NoAdmin)
    }

    /// Rule: the table is in contention order: more waiters first; among
    /// equals, the lock held longest; then by name (a free lock counts as
    /// held for no time).
    #[test]
    fn locks_sort_by_waiters_then_time_held_then_name() {
        let mut v = view();
        v.set_locks(vec![
            lock("a/free-but-queued", vec![], vec![waiter(None, 1)]),
            lock("b/old", vec![holder(None, 1, 90_000, 5_000)], vec![]),
            lock("c/two", vec![holder(None, 2, 10, 5_000)], vec![waiter(None, 2), waiter(None, 3)]),
            lock("d/young", vec![holder(None, 3, 1_000, 5_000)], vec![]),
            lock("a/young", vec![holder(None, 4, 1_000, 5_000)], vec![]),
            lock("e/one", vec![holder(None, 5, 5, 5_000)], vec![waiter(None, 4)]),
        ]);
        let names: Vec<&str> = v.locks.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names, ["c/two", "e/one", "a/free-but-queued", "b/old", "a/young", "d/young"]);
        assert_eq!(v.conn, Conn::Live);
    }

    /// Rule: `q` and Ctrl-C quit, `r` refreshes; `/` opens an empty filter
    /// in which `q`, `r` and `/` are text, Backspace deletes, Enter applies
    /// (the old table goes until the new one comes) and Esc leaves the
    /// applied filter as it was.
    #[test]
    fn keys_quit_refresh_and_edit_the_filter() {
        let mut v = view();
        assert_eq!(v.on_key(Key::Char('r')), Action::Refresh);
        assert_eq!(v.on_key(Key::Char('x')), Action::Nothing);
        assert_eq!(v.on_key(Key::Char('/')), Action::Redraw);
        for c in "jobs/qr/x".chars() {
            assert_eq!(v.on_key(Key::Char(c)), Action::Redraw);
        }
        assert_eq!(v.on_key(Key::Backspace), Action::Redraw);
        assert_eq!(v.editing.as_deref(), Some("jobs/qr/"));
        assert_eq!(v.prefix, "", "nothing applies before Enter");
        v.set_locks(vec![lock("other", vec![holder(None, 1, 1, 1)], vec![])]);
        assert_eq!(v.on_key(Key::Enter), Action::Apply);
        assert_eq!((v.prefix.as_str(), v.editing.as_deref(), v.locks.len(), v.loaded), ("jobs/qr/", None, 0, false));

        assert_eq!(v.on_key(Key::Char('/')), Action::Redraw);
        assert_eq!(v.on_key(Key::Char('z')), Action::Redraw);
        assert_eq!(v.on_key(Key::Esc), Action::Redraw);
        assert_eq!((v.prefix.as_str(), v.editing.as_deref()), ("jobs/qr/", None), "Esc cancels");

        assert_eq!(v.on_key(Key::Char('/')), Action::Redraw);
        assert_eq!(v.on_key(Key::CtrlC), Action::Quit, "Ctrl-C quits while typing too");
        assert_eq!(view().on_key(Key::Char('q')), Action::Quit);
        assert_eq!(view().on_key(Key::CtrlC), Action::Quit);
    }

    /// Rule: a lost connection keeps the last table and says so; a refusal
    /// clears it and is kept until the next table.
    #[test]
    fn unreachable_keeps_the_table_and_a_refusal_clears_it() {
        let mut v = view();
        v.set_locks(vec![lock("jobs/a", vec![holder(None, 1, 1, 1)], vec![])]);
        v.set_unreachable();
        assert_eq!((v.conn, v.locks.len()), (Conn::Reconnecting, 1));
        v.set_problem("permission denied: no read on \"\"".into());
        assert_eq!((v.conn, v.locks.len(), v.problem.is_some()), (Conn::Live, 0, true));
        v.set_locks(vec![]);
        assert_eq!(v.problem, None);
    }
}
