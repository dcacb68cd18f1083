//! The screen of `fencelock top`, drawn from a [`View`] and the terminal's
//! size: a header (the terminal shows it in reverse video), the group line,
//! the filter line, then the lock table in contention order. Pure: the same
//! view and size give the same lines, each at most `width` characters, at
//! most `height` of them (80×24 is the smallest size it is laid out for).

use std::time::Duration;

use fencelock::LockInfo;
use fencelock_server::cluster::Status;

use super::state::{Conn, Group, View};

/// What the terminal shows: its lines from the top (the first in reverse
/// video) and, while a filter is typed, where the cursor stands (row,
/// column, from 0).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub lines: Vec<String>,
    pub cursor: Option<(usize, usize)>,
}

/// Lines above the table's rows: header, group, filter, column names.
const TOP_LINES: usize = 4;
/// A TTL left under this is marked with [`URGENT`].
const URGENT_BELOW: Duration = Duration::from_secs(1);
const URGENT: &str = "!";
/// Widths of the fixed columns.
const HELD_W: usize = 6;
const TTL_W: usize = 6;
const WAIT_W: usize = 4;
/// The narrowest the waiters column is made to give the lock names room.
const WAITERS_MIN: usize = 12;
/// The token column's widest: whole tokens (u64) on a wide terminal, the
/// last digits on a narrow one.
const TOKEN_WIDE: usize = 20;
const TOKEN_NARROW: usize = 9;
/// A terminal at least this wide shows whole tokens.
const WIDE_FROM: usize = 100;

/// The screen for `v` on a `width`×`height` terminal.
pub fn render(v: &View, width: usize, height: usize) -> Frame {
    let (filter, cursor_col) = filter_line(v);
    let mut lines = vec![header(v, width), fit(&group_line(&v.group), width), fit(&filter, width)];
    let refusals = refusal_line(v, width);
    let above = TOP_LINES - 1 + usize::from(refusals.is_some());
    lines.extend(refusals.map(|r| fit(&r, width)));
    lines.extend(table(v, width, height.saturating_sub(above)));
    lines.truncate(height);
    let cursor = cursor_col.filter(|_| height > 2).map(|c| (2, c.min(width.saturating_sub(1))));
    Frame { lines, cursor }
}

/// `fencelock top — SERVER — N locks, H held, W waiting — live`, padded to
/// the width; the server's URL is cut first when it does not fit.
fn header(v: &View, width: usize) -> String {
    let held = v.locks.iter().filter(|l| !l.holders.is_empty()).count();
    let waiting: usize = v.locks.iter().map(|l| l.waiters.len()).sum();
    let state = match v.conn {
        Conn::Connecting => "connecting",
        Conn::Live => "live",
        Conn::Reconnecting => "reconnecting",
    };
    let counts = format!("{} lock{}, {held} held, {waiting} waiting", v.locks.len(), plural(v.locks.len()));
    let head = "fencelock top — ";
    let tail = format!(" — {counts} — {state}");
    let room = width.saturating_sub(chars(head) + chars(&tail)).max(8);
    let line = fit(&format!("{head}{}{tail}", fit(&v.server, room)), width);
    format!("{line:<width$}")
}

/// The group line.
fn group_line(g: &Group) -> String {
    match g {
        Group::NoAdmin => "group: --admin HOST:PORT (a member's admin address) adds the group's health".into(),
        Group::Asking => "group: asking the admin port…".into(),
        Group::Cluster(s) => cluster_line(s),
        Group::Health { node_id, leader, term, last_applied, why } => {
            let leader = leader.map_or_else(|| "no leader".to_string(), |l| format!("leader node {l}"));
            let applied = last_applied.map_or_else(|| "-".to_string(), |a| a.to_string());
            format!("node {node_id}: term {term}, {leader}, applied {applied} ({why})")
        }
        Group::Failed(why) => format!("group: {why}"),
    }
}

/// `group: term 3, leader node 1; members 1 lag 0, 2 lag 0, 3 lag 4` from
/// the leader; a follower's view says whose it is and has no lag (only the
/// leader knows how far each member has replicated).
fn cluster_line(s: &Status) -> String {
    let leader = s.leader.map_or_else(|| "no leader".to_string(), |l| format!("leader node {l}"));
    let leads = s.state == "leader";
    let last = s.last_log_index.unwrap_or(0);
    let members: Vec<String> = s
        .members
        .iter()
        .map(|m| {
            let learner = if m.voter { "" } else { " (learner)" };
            match (leads, m.matched) {
                (true, Some(matched)) => format!("{}{learner} lag {}", m.id, last.saturating_sub(matched)),
                (true, None) => format!("{}{learner} lag ?", m.id),
                (false, _) => format!("{}{learner}", m.id),
            }
        })
        .collect();
    let whose = if leads { String::new() } else { format!(" (node {}, {})", s.node_id, s.state) };
    format!("group{whose}: term {}, {leader}; members {}", s.term, members.join(", "))
}

/// `refused: N stale writes — last: LOCK token T < H (RESOURCE)`, once a
/// fence's report arrived while `top` runs; tokens cut to their last digits
/// as in the table on a narrow terminal.
fn refusal_line(v: &View, width: usize) -> Option<String> {
    let last = v.fence_refusals.last()?;
    let n = v.refusals_seen;
    let token_width = if width >= WIDE_FROM { TOKEN_WIDE } else { TOKEN_NARROW };
    let token = |t: u64| cut_left(&t.to_string(), token_width);
    let resource = if last.resource.is_empty() { String::new() } else { format!(" ({})", last.resource) };
    Some(format!(
        "refused: {n} stale write{} — last: {} token {} < {}{resource}",
        plural(n as usize),
        last.lock,
        token(last.token),
        token(last.highest_token)
    ))
}

/// The filter line and, while a filter is typed, the cursor's column.
fn filter_line(v: &View) -> (String, Option<usize>) {
    if let Some(text) = &v.editing {
        let typed = format!("filter: {text}");
        let col = chars(&typed);
        return (format!("{typed}  (Enter applies, Esc cancels)"), Some(col));
    }
    let shown = if v.prefix.is_empty() { "(all)" } else { v.prefix.as_str() };
    let line = match (&v.problem, v.prefix.is_empty()) {
        (Some(why), _) => format!("filter: {shown} — {why}"),
        (None, true) => "/ to filter, r to refresh, q to quit".to_string(),
        (None, false) => format!("filter: {shown} — / to change, r to refresh, q to quit"),
    };
    (line, None)
}

/// Column widths of the table.
struct Widths {
    lock: usize,
    holder: usize,
    token: usize,
}

/// The column names, then one row per lock that fits in `rows` lines (the
/// last of them `… and N more` when not all do).
fn table(v: &View, width: usize, rows: usize) -> Vec<String> {
    if rows == 0 {
        return Vec::new();
    }
    let w = widths(v, width);
    let names = row(&w, ["LOCK", "HOLDER", "TOKEN", "HELD", "TTL", "WAIT", "WAITERS"]);
    let mut out = vec![fit(&names, width)];
    let room = rows - 1;
    if v.locks.is_empty() {
        out.push(fit(&empty_note(v), width));
        return out;
    }
    let shown = if v.locks.len() > room { room.saturating_sub(1) } else { v.locks.len() };
    for l in &v.locks[..shown] {
        out.push(fit(&lock_row(&w, l, v.age), width));
    }
    if shown < v.locks.len() && room > 0 {
        out.push(format!("… and {} more", v.locks.len() - shown));
    }
    out
}

/// What an empty table says.
fn empty_note(v: &View) -> String {
    match (v.loaded, v.problem.is_some(), v.prefix.is_empty()) {
        (false, _, _) => "(loading…)".into(),
        (true, true, _) => "(nothing shown)".into(),
        (true, false, true) => "(no lock is held or waited on)".into(),
        (true, false, false) => format!("(no lock under {:?} is held or waited on)", v.prefix),
    }
}

/// The lock and holder columns get what their longest entry needs, the
/// holder up to a quarter of the room and the lock up to what leaves the
/// waiters column what its longest entry needs (at most [`WAITERS_MIN`]);
/// the waiters column gets the rest.
fn widths(v: &View, width: usize) -> Widths {
    let longest =
        |f: &dyn Fn(&LockInfo) -> String, min: usize| v.locks.iter().map(|l| chars(&f(l))).max().unwrap_or(0).max(min);
    let token_max = if width >= WIDE_FROM { TOKEN_WIDE } else { TOKEN_NARROW };
    let token = longest(&|l| l.holder.as_ref().map_or(String::new(), |h| h.token.to_string()), 5).min(token_max);
    // Separators: one space between columns, two before the waiters.
    let flex = width.saturating_sub(token + HELD_W + TTL_W + WAIT_W + 7);
    let waiters_need = longest(&|l| waiters_cell(l), "WAITERS".len());
    let holder_need = longest(&|l| holder_cell(l, v.age), 6);
    let holder = holder_need.min((flex / 4).max(6));
    let lock = longest(&|l| l.name.clone(), 4).min(flex.saturating_sub(holder + waiters_need.min(WAITERS_MIN)).max(4));
    Widths { lock, holder, token }
}

/// One line of cells in the columns' widths: text left, numbers right.
fn row(w: &Widths, c: [&str; 7]) -> String {
    let [lock, holder, token, held, ttl, wait, waiters] = c;
    let (lw, hw, tw) = (w.lock, w.holder, w.token);
    let line = format!(
        "{:<lw$} {:<hw$} {:>tw$} {:>HELD_W$} {:>TTL_W$} {:>WAIT_W$}  {waiters}",
        fit(lock, lw),
        fit(holder, hw),
        cut_left(token, tw),
        held,
        ttl,
        wait,
    );
    line.trim_end().to_string()
}

/// A lock's row, its times moved on by `age`.
fn lock_row(w: &Widths, l: &LockInfo, age: Duration) -> String {
    let h = l.holder.as_ref();
    let token = h.map_or("-".to_string(), |h| h.token.to_string());
    let held = h.map_or("-".to_string(), |h| dur(h.held + age));
    let ttl = h.map_or("-".to_string(), |h| {
        let left = h.ttl_left.saturating_sub(age);
        format!("{}{}", dur(left), if left < URGENT_BELOW { URGENT } else { "" })
    });
    let holder = holder_cell(l, age);
    row(w, [&l.name, &holder, &token, &held, &ttl, &l.waiters.len().to_string(), &waiters_cell(l)])
}

/// The waiters' identities (else their leases), first in line first.
fn waiters_cell(l: &LockInfo) -> String {
    let names: Vec<String> =
        l.waiters.iter().map(|w| w.identity.clone().unwrap_or_else(|| format!("lease {}", w.lease_id))).collect();
    names.join(", ")
}

/// The holder's identity (else its lease), `+N` for the other holders of
/// a shared lock or a semaphore; the lock-delay left when it is closed;
/// `-` when free.
fn holder_cell(l: &LockInfo, age: Duration) -> String {
    let Some(h) = l.holders.first() else {
        return l.reopens_in.map_or("-".into(), |d| format!("(delay {})", dur(d.saturating_sub(age))));
    };
    let who = h.identity.clone().unwrap_or_else(|| format!("lease {}", h.lease_id));
    match l.holders.len() {
        1 => who,
        n => format!("{who} +{}", n - 1),
    }
}

/// `0.4s`, `9.9s`, `42s`, `4m05s`, `3h04m`: at most 6 characters under 100 h.
fn dur(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..10 => format!("{:.1}s", (d.as_millis() / 100) as f64 / 10.0),
        10..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
    }
}

/// `s` in at most `w` characters: cut with `…` at the end when longer.
fn fit(s: &str, w: usize) -> String {
    if chars(s) <= w {
        return s.to_string();
    }
    match w {
        0 => String::new(),
        _ => s.chars().take(w - 1).chain(['…']).collect(),
    }
}

/// `s` in at most `w` characters, keeping its end (a token's last digits).
fn cut_left(s: &str, w: usize) -> String {
    let n = chars(s);
    if n <= w {
        return s.to_string();
    }
    match w {
        0 => String::new(),
        _ => ['…'].into_iter().chain(s.chars().skip(n - (w - 1))).collect(),
    }
}

fn chars(s: &str) -> usize {
    s.chars().count()
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

#[cfg(test)]
mod tests {
    use super::super::state::tests::{holder, lock, waiter};
    use super::super::state::Key;
    use super::*;
    use fencelock_server::cluster::Member;

    fn view(locks: Vec<LockInfo>) -> View {
        let mut v = View::new("http://127.0.0.1:7070".into(), String::new(), Group::NoAdmin);
        v.set_locks(locks);
        v
    }

    /// A server's tokens are large (19 digits): they differ in the last.
    const T: u64 = 3_856_727_992_965_267_456;

    /// Three locks: `jobs/b` with two waiters, `jobs/a` with one, `db/x` free
    /// of waiters and near its TTL, held by a lease without identity.
    fn three() -> Vec<LockInfo> {
        vec![
            lock("jobs/a", vec![holder(Some("holder-a"), T + 3, 62_000, 9_100)], vec![waiter(Some("waiter-a"), 7)]),
            lock(
                "jobs/b",
                vec![holder(Some("holder-b"), T + 5, 12_400, 14_800)],
                vec![waiter(Some("waiter-b1"), 8), waiter(None, 9)],
            ),
            lock("db/x", vec![holder(None, T, 4_200_000, 400)], vec![]),
        ]
    }

    /// Rule: at 80×24 the screen reads: header with the counts and the
    /// connection, the group line, the filter hint, the column names and
    /// one row per lock in contention order, the TTL under 1 s marked `!`,
    /// a long token cut to its last digits, a waiter without identity named
    /// by its lease; no line is wider than 80.
    #[test]
    fn an_80_by_24_screen_with_three_locks() {
        let f = render(&view(three()), 80, 24);
        let expected = [
            "fencelock top — http://127.0.0.1:7070 — 3 locks, 3 held, 3 waiting — live       ",
            "group: --admin HOST:PORT (a member's admin address) adds the group's health",
            "/ to filter, r to refresh, q to quit",
            "LOCK   HOLDER           TOKEN   HELD    TTL WAIT  WAITERS",
            "jobs/b holder-b     …65267461    12s    14s    2  waiter-b1, lease 9",
            "jobs/a holder-a     …65267459  1m02s   9.1s    1  waiter-a",
            "db/x   lease 38567… …65267456  1h10m  0.4s!    0",
        ];
        assert_eq!(f.lines, expected);
        assert_eq!(f.cursor, None);
    }

    /// Rule: countdowns move by the table's age: TTL left goes down (to 0,
    /// marked), time held goes up.
    /// Rule: once a fence reports a refused write, a line under the filter
    /// counts them and names the last (lock, stale token, the fence's
    /// highest, the resource), and the table moves down by one line.
    #[test]
    fn a_refused_write_gets_a_line_above_the_table() {
        let mut v = view(three());
        for token in [10, 11] {
            let resource = "reports/a.csv".to_string();
            v.refused(crate::top::state::FenceRefusal { lock: "jobs/a".into(), token, highest_token: 12, resource });
        }
        let f = render(&v, 80, 24);
        assert_eq!(f.lines[3], "refused: 2 stale writes — last: jobs/a token 11 < 12 (reports/a.csv)");
        assert_eq!(f.lines[4], "LOCK   HOLDER           TOKEN   HELD    TTL WAIT  WAITERS");
        assert_eq!(render(&v, 80, 6).lines.len(), 6, "it never grows past the terminal");
    }

    #[test]
    fn countdowns_move_by_the_tables_age() {
        let mut v = view(three());
        v.age = Duration::from_millis(8_250);
        let f = render(&v, 80, 24);
        assert_eq!(f.lines[4], "jobs/b holder-b     …65267461    20s   6.5s    2  waiter-b1, lease 9");
        assert_eq!(f.lines[5], "jobs/a holder-a     …65267459  1m10s  0.8s!    1  waiter-a");
        assert_eq!(f.lines[6], "db/x   lease 38567… …65267456  1h10m  0.0s!    0");
    }

    /// Rule: a wider terminal gives the names and the whole token room;
    /// at 80 columns a long name is cut with `…` and the token is its last
    /// 8 digits.
    #[test]
    fn a_wide_terminal_shows_whole_names_and_tokens() {
        let mut locks = three();
        locks[2].name = "databases/primary/schema-migrations".into();
        locks[2].holders[0].identity = Some("migrator@db-7".into());
        locks[2].holder = locks[2].holders.first().cloned();
        let wide = render(&view(locks.clone()), 120, 24);
        assert_eq!(
            wide.lines[6],
            "databases/primary/schema-migrations migrator@db-7 3856727992965267456  1h10m  0.4s!    0"
        );
        let narrow = render(&view(locks), 80, 24);
        assert_eq!(narrow.lines[6], "databases/primary/schem… migrator@db… …65267456  1h10m  0.4s!    0");
        assert_eq!(
            (wide.lines[0].chars().count(), narrow.lines[0].chars().count()),
            (120, 80),
            "the header spans the width"
        );
    }

    /// Rule: rows that do not fit are counted on the last line; the screen
    /// never has more lines than the terminal.
    #[test]
    fn rows_that_do_not_fit_are_counted() {
        let locks: Vec<LockInfo> = (0..30)
            .map(|i| lock(&format!("jobs/{i:02}"), vec![holder(Some("h"), i + 1, 1_000, 5_000)], vec![]))
            .collect();
        let f = render(&view(locks), 80, 24);
        assert_eq!(f.lines.len(), 24);
        assert_eq!(f.lines[4], "jobs/00 h          1   1.0s   5.0s    0");
        assert_eq!(f.lines[22], "jobs/18 h         19   1.0s   5.0s    0");
        assert_eq!(f.lines[23], "… and 11 more");
        let f = render(&view(three()), 80, 6);
        assert_eq!(
            &f.lines[4..],
            ["jobs/b holder-b     …65267461    12s    14s    2  waiter-b1, lease 9", "… and 2 more"]
        );
    }

    /// Rule: while a filter is typed the filter line shows it with the keys
    /// and the cursor stands after it; an applied filter is named, and a
    /// refusal of it is said on that line with nothing in the table.
    #[test]
    fn the_filter_line_while_typing_applied_and_refused() {
        let mut v = view(three());
        v.on_key(Key::Char('/'));
        for c in "jobs/b".chars() {
            v.on_key(Key::Char(c));
        }
        let f = render(&v, 80, 24);
        assert_eq!(f.lines[2], "filter: jobs/b  (Enter applies, Esc cancels)");
        assert_eq!(f.cursor, Some((2, 14)));
        v.on_key(Key::Enter);
        let f = render(&v, 80, 24);
        assert_eq!(f.lines[2], "filter: jobs/b — / to change, r to refresh, q to quit");
        assert_eq!(f.lines[4], "(loading…)");
        v.set_locks(vec![]);
        assert_eq!(render(&v, 80, 24).lines[4], "(no lock under \"jobs/b\" is held or waited on)");
        v.set_problem("permission denied: no read on \"jobs/b\"".into());
        let f = render(&v, 80, 24);
        assert_eq!(f.lines[2], "filter: jobs/b — permission denied: no read on \"jobs/b\"");
        assert_eq!(f.lines[4], "(nothing shown)");
        assert!(f.lines[0].contains("0 locks, 0 held, 0 waiting — live"), "{}", f.lines[0]);
    }

    /// Rule: a lost connection says `reconnecting` in the header (the URL
    /// is cut to keep it in 80 columns) and keeps the last table.
    #[test]
    fn reconnecting_keeps_the_table_and_fits_the_header() {
        let mut v = view(three());
        v.server = "fencelock://node-a.example.internal:7070,node-b.example.internal:7070".into();
        v.set_unreachable();
        let f = render(&v, 80, 24);
        assert_eq!(f.lines[0], "fencelock top — fencelock://node-a.… — 3 locks, 3 held, 3 waiting — reconnecting");
        assert_eq!(f.lines[4], "jobs/b holder-b     …65267461    12s    14s    2  waiter-b1, lease 9");
    }

    fn member(id: u64, voter: bool, matched: Option<u64>) -> Member {
        Member { id, addr: format!("127.0.0.1:{id}070"), peer_addr: None, voter, matched }
    }

    /// Rule: the group line gives the term, the leader and each member's lag
    /// (last log index − matched) from the leader's view; a follower's view
    /// says whose it is, without lag; `/healthz` (when `/v1/cluster`
    /// is refused) gives the node's own view and why.
    #[test]
    fn the_group_line_from_cluster_status_and_health() {
        let mut s = Status {
            node_id: 1,
            state: "leader".into(),
            leader: Some(1),
            leader_addr: None,
            term: 3,
            last_log_index: Some(40),
            last_applied: Some(40),
            members: vec![member(1, true, Some(40)), member(2, true, Some(36)), member(4, false, None)],
        };
        assert_eq!(
            group_line(&Group::Cluster(s.clone())),
            "group: term 3, leader node 1; members 1 lag 0, 2 lag 4, 4 (learner) lag ?"
        );
        s.state = "follower".into();
        s.node_id = 2;
        assert_eq!(
            group_line(&Group::Cluster(s)),
            "group (node 2, follower): term 3, leader node 1; members 1, 2, 4 (learner)"
        );
        let health = Group::Health {
            node_id: 1,
            leader: Some(1),
            term: 2,
            last_applied: Some(17),
            why: "/v1/cluster: permission denied".into(),
        };
        assert_eq!(group_line(&health), "node 1: term 2, leader node 1, applied 17 (/v1/cluster: permission denied)");
        assert_eq!(
            group_line(&Group::Failed("127.0.0.1:7071: connection refused".into())),
            "group: 127.0.0.1:7071: connection refused"
        );
    }

    /// Rule: shared holders and a lock-delay read in the holder column.
    #[test]
    fn several_holders_and_a_lock_delay() {
        let mut readers =
            lock("cfg", vec![holder(Some("r1"), 7, 2_000, 5_000), holder(Some("r2"), 8, 1_000, 5_000)], vec![]);
        readers.holders[0].mode = fencelock::LockMode::Shared;
        let mut delayed = lock("jobs/crashed", vec![], vec![waiter(Some("next"), 3)]);
        delayed.reopens_in = Some(Duration::from_millis(2_500));
        let f = render(&view(vec![readers, delayed]), 80, 24);
        assert_eq!(f.lines[4], "jobs/crashed (delay 2.5s)     -      -      -    1  next");
        assert_eq!(f.lines[5], "cfg          r1 +1            7   2.0s   5.0s    0");
    }

    /// Rule: durations are short and keep their unit: tenths under 10 s,
    /// then seconds, minutes, hours.
    #[test]
    fn durations_are_short() {
        let ms = Duration::from_millis;
        let cases =
            [(0, "0.0s"), (999, "0.9s"), (9_950, "9.9s"), (42_000, "42s"), (245_000, "4m05s"), (11_040_000, "3h04m")];
        for (d, s) in cases {
            assert_eq!(dur(ms(d)), s);
        }
        assert_eq!(fit("abcdef", 4), "abc…");
        assert_eq!(cut_left("12345678901", 8), "…5678901");
    }
}
