//! The markdown report (`docs/safety.md`) from a profile's verdicts: how it
//! was produced, one summary row per scenario × backend, a section per
//! scenario with the examples of every check that did not pass, and the
//! mutants (each deliberately broken build must turn at least one check red).
//!
//! [`markdown`] is pure; [`ReportMeta::collect`] is the one place that reads
//! the machine (command line, date, commit, CPU, kernel).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::checker::{Status, Verdict};

/// How the report was produced.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReportMeta {
    /// The command line that produced the verdicts, as a user would type it
    /// (the program by name, paths relative to the checkout).
    pub command: String,
    /// UTC, `YYYY-MM-DD HH:MM`.
    pub date: String,
    /// `git rev-parse --short HEAD`, with `-dirty` for uncommitted changes.
    pub git_commit: String,
    pub cpu_model: String,
    pub cores: u32,
    /// `uname -r`.
    pub kernel: String,
    /// `short`, `long`, `mutants`, or `report` (re-rendered from disk).
    pub profile: String,
    /// Wall time of the whole profile, ms (0 if unknown).
    pub wall_time_ms: u64,
}

impl ReportMeta {
    /// Reads this process's command line and the machine; what cannot be
    /// read stays `unknown`.
    pub fn collect(profile: &str, wall_time: Duration) -> Self {
        let commit = command("git", &["rev-parse", "--short", "HEAD"]);
        let dirty = command("git", &["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
        let cpu_model = std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        });
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").ok().map(|s| s.trim().to_string());
        ReportMeta {
            command: fencelock_testkit::cmdline::this_command(),
            date: command("date", &["-u", "+%Y-%m-%d %H:%M UTC"]).unwrap_or_else(unknown),
            git_commit: commit.map(|c| if dirty { format!("{c}-dirty") } else { c }).unwrap_or_else(unknown),
            cpu_model: cpu_model.unwrap_or_else(unknown),
            cores: std::thread::available_parallelism().map_or(0, |n| n.get() as u32),
            kernel: kernel.unwrap_or_else(unknown),
            profile: profile.to_string(),
            wall_time_ms: wall_time.as_millis() as u64,
        }
    }
}

fn unknown() -> String {
    "unknown".into()
}

/// A command's trimmed stdout, if it ran and succeeded.
fn command(program: &str, args: &[&str]) -> Option<String> {
    let out = std::process::Command::new(program).args(args).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The scenarios, in report order, with what their fault is.
const SCENARIOS: &[(&str, &str, &str)] = &[
    (
        "K1",
        "holder paused past its TTL",
        "A holder is stopped with SIGSTOP after its last lease check and before its write, for 1.5–5 × TTL. \
         Its lease expires, another worker takes the lock, and the paused write arrives late: \
         the fence must refuse it.",
    ),
    (
        "K2",
        "holder's write delayed in the network",
        "A holder's traffic (keep-alives and its write) is held in a TCP proxy for 1.5–5 × TTL, then let through. \
         The held write arrives after the lock has moved on: the fence must refuse it.",
    ),
    (
        "K3",
        "clock jumps and skew",
        "The lock server's clock runs fast or slow (0.5–5×) or jumps forward by 1–3 × TTL. \
         Expiry must be decided by monotonic time only, and no stale write may be accepted.",
    ),
    (
        "K4",
        "lock server killed and restarted",
        "The lock server is SIGKILLed, or crashes at a failpoint around fsync and reply, and is restarted at once. \
         Tokens must keep increasing across every restart, and every acknowledged grant must survive.",
    ),
    (
        "K5",
        "replies held while the client is paused",
        "Replies are held while the client is paused; the client checks its deadline before acting and the fence \
         catches the rest.",
    ),
    (
        "L1",
        "leader of a 3-node group killed",
        "The leader of a 3-node fencelock group is SIGKILLed every 1–3 s and restarted once another node leads. \
         Tokens must keep increasing across every change of leader, and no stale write may be accepted.",
    ),
    (
        "L2",
        "leader cut off from its group",
        "The leader's Raft traffic to and from both peers is held in proxies until a new leader is elected and \
         1–3 s beyond; clients still reach the old leader, which must grant nothing. Then the held bytes flow on.",
    ),
    (
        "L3",
        "one node cut off (minority of one)",
        "A node drawn at random, the leader or a follower, is cut off from the other two for 1–3 s. \
         The majority goes on; the minority grants nothing.",
    ),
    (
        "P1",
        "malformed and forged peer messages",
        "In seeded rounds, Raft payloads that are not JSON, are cut short or mutated (append_entries, vote, \
         install_snapshot), snapshots whose data does not decode, and forged well-formed snapshots from another \
         node of a later term that would send the token counter back are sent to the server's gRPC port. Each \
         must be refused and counted (`fencelock_peer_messages_refused_total`), and the server must keep serving \
         with its tokens increasing. Well-formed AppendEntries or Vote requests of a higher term are not sent here: \
         from a member they move the term; P2 sends them from non-members under TLS.",
    ),
    (
        "P2",
        "forged peer under TLS",
        "The server runs with TLS and an auth file (clients and admin calls with a bearer token). In seeded rounds, \
         well-formed Vote and AppendEntries requests of a term far above the node's and the forged rollback \
         snapshot are sent to its gRPC port from TLS connections without a node certificate: none, or a client \
         certificate of the client CA. Each must be refused UNAUTHENTICATED and counted \
         (`fencelock_peer_messages_refused_total`), the node's term must not move, and it must keep serving.",
    ),
    (
        "S1",
        "grant to a dead waiter",
        "A waiter's keep-alives are blocked past its TTL, then the holder releases (etcd#11456). \
         The lock must go only to a live lease, never to the dead waiter.",
    ),
    (
        "S2",
        "partitions",
        "The leader is isolated, or the cluster is cut by ring and one-way partitions: a minority must grant nothing.",
    ),
    (
        "S3",
        "leader changes",
        "Twenty leader changes at TTL/2 intervals: leases must neither expire early nor live forever.",
    ),
    (
        "S4",
        "connection reset after the request was sent",
        "A client's connection loses the answers and is reset after the request was sent; the client retries. \
         Each request must be granted exactly once.",
    ),
    (
        "S5",
        "power loss",
        "The server is killed, its unsynced bytes are dropped and its last write torn (a simulated power loss), \
         then it restarts. It must boot, keep its tokens increasing and keep every acknowledged grant.",
    ),
    (
        "S6",
        "heal",
        "After every fault heals, a new grant and fenced write must succeed within 2 × TTL plus the restart or \
         election allowance (plus 3 s of slack in the short profile, which CI runs beside other tests). Checked in \
         every run.",
    ),
];

const CHECKS: &[(&str, &str)] = &[
    (
        "C2",
        "Fencing tokens of successful grants are unique, and a grant that completed before another was asked \
            for has the smaller token, across restarts.",
    ),
    (
        "C3",
        "The fenced storage never carries out an operation whose token is below one it carried out before \
            (its audit log), and no write succeeds after a read or write with a higher token completed, nor a \
            read after a write with a higher token (history).",
    ),
    (
        "C4",
        "The object's final value holds every acknowledged append, nothing twice, and nothing whose write \
            certainly failed or never happened.",
    ),
    (
        "C6",
        "After each restart the server reports, as the lock's holder (in shared runs, as one of its holders), \
            the grant that was live at the kill.",
    ),
    (
        "C8",
        "The run proves its faults happened (evidence such as a process in state T, held bytes, a restart, \
            and for K1/K2 stale writes reaching the fence, in shared runs stale reads too); otherwise it is \
            inconclusive, which fails.",
    ),
    ("S1", "No trial hands the lock to a waiter whose lease had expired."),
    ("S4", "The server issued no more tokens than there were acquires that may have succeeded."),
    ("S6", "After each fault ends, a fenced write succeeds within the heal bound."),
    (
        "E1",
        "Election runs: no term is won by two campaigns, and the fence carries out no leader's write of an older \
            term after a newer term's (C3's rules, audit log and history, on the leaders' writes).",
    ),
    (
        "E2",
        "Election runs: every observer's terms never go back (a leader of a higher term, a new value of the \
            current leader, the end of the current term or of an unseen higher one; a resubscription may repeat \
            the last event).",
    ),
    (
        "E3",
        "Election runs: every leader an observer reports was elected: by the campaign its value names, with that \
            term; without a value, by a campaign that won that term (or by a campaign the worker gave up on, \
            which may have been granted).",
    ),
    (
        "R1",
        "Shared runs: every read the fenced storage carried out returned the object as the last write it carried \
            out before it left it (audit log, the history's reads and writes by token).",
    ),
    (
        "R2",
        "Shared and semaphore runs: every poll of the lock's holders (describe, every 50 ms) shows holders \
            that fit: a writer alone or only readers; a semaphore with at most its permits in use.",
    ),
    (
        "M1",
        "Multi runs: every multi grant is whole, one token per lock asked, consecutive in the order asked (the \
            server's one log entry, INV-18); C3, C4 and C6 are judged per lock and its object there, so that a \
            multi-holder's and a single holder's operations on one object are fenced against each other. A run \
            without a multi grant is inconclusive.",
    ),
    (
        "A1",
        "Under TLS and auth: no call of the run was refused for its credentials (the workers' histories and \
            every node's audit log), so no scenario passes because authentication stopped its work.",
    ),
];

const BACKENDS: &[&str] = &["fencelock", "redis", "redlock", "etcd", "zk", "postgres"];

fn rank(list: &[&str], x: &str) -> usize {
    list.iter().position(|y| *y == x).unwrap_or(list.len())
}

fn scenario_rank(s: &str) -> usize {
    SCENARIOS.iter().position(|(id, _, _)| *id == s).unwrap_or(SCENARIOS.len())
}

/// `docs/safety.md` from `verdicts`.
pub fn markdown(verdicts: &[Verdict], meta: &ReportMeta) -> String {
    let (mutants, runs): (Vec<&Verdict>, Vec<&Verdict>) = verdicts.iter().partition(|v| v.info.mutant.is_some());
    let mut out = String::new();
    header(&mut out, meta, &runs, &mutants);
    summary(&mut out, &runs);
    checks_legend(&mut out);
    scenarios(&mut out, &runs);
    mutants_section(&mut out, &mutants);
    out
}

fn header(out: &mut String, meta: &ReportMeta, runs: &[&Verdict], mutants: &[&Verdict]) {
    let passed = runs.iter().filter(|v| v.passed).count();
    let n_caught = mutants.iter().filter(|v| caught(v)).count();
    let _ = writeln!(out, "# Safety under faults\n");
    let _ = writeln!(
        out,
        "Generated by `fencelock-chaos`: worker processes loop acquire → fenced read → append their own id → \
         fenced write → release against one object, while a nemesis injects one scenario's faults. The checkers \
         read the merged histories and the storage's audit log; an operation that timed out counts as unknown, \
         never as a success. Scenario and checker ids are those of [the scenario catalogue](scenarios.md).\n"
    );
    let _ = writeln!(
        out,
        "**{passed} of {} runs passed; {n_caught} of {} mutants were caught.**\n",
        runs.len(),
        mutants.len()
    );
    let _ = writeln!(out, "## How this was produced\n");
    let _ = writeln!(out, "| | |\n|---|---|");
    let rows = [
        ("command", format!("`{}`", cell(&meta.command))),
        ("date", cell(&meta.date)),
        ("commit", format!("`{}`", cell(&meta.git_commit))),
        ("machine", format!("{}, {} cores, Linux {}", cell(&meta.cpu_model), meta.cores, cell(&meta.kernel))),
        ("profile", cell(&meta.profile)),
        ("wall time", wall_time(meta.wall_time_ms)),
    ];
    for (k, v) in rows {
        let _ = writeln!(out, "| {k} | {v} |");
    }
    let _ = writeln!(
        out,
        "\nVerdicts: ✅ every applicable check passed; ❌ a check failed; *inconclusive*: the run could not prove \
         its fault happened, which fails it too; *finding*: a violation the backend's declared capabilities allow \
         (no fencing token, or tokens that do not survive a restart): reported, not failed.\n"
    );
}

/// Runs of one scenario against one backend.
type Groups<'a> = BTreeMap<(usize, String, usize, String), Vec<&'a Verdict>>;

fn groups<'a>(runs: &[&'a Verdict]) -> Groups<'a> {
    let mut g: Groups<'a> = BTreeMap::new();
    for v in runs {
        let (s, b) = (&v.info.scenario, &v.info.backend);
        g.entry((scenario_rank(s), s.clone(), rank(BACKENDS, b), b.clone())).or_default().push(v);
    }
    g
}

fn summary(out: &mut String, runs: &[&Verdict]) {
    let _ = writeln!(out, "## Summary\n");
    if runs.is_empty() {
        let _ = writeln!(out, "No runs.\n");
        return;
    }
    let _ = writeln!(
        out,
        "| scenario | backend | runs | operations | faults injected | evidence | stale writes rejected | \
         stale reads rejected | stale accepts | lost updates | token inversions | lost acknowledged grants | \
         heal max ms | verdict |"
    );
    let _ = writeln!(out, "|---|---|--:|--:|--:|---|--:|--:|--:|--:|--:|--:|--:|---|");
    for ((_, scenario, _, backend), vs) in groups(runs) {
        let sum = |f: &dyn Fn(&Verdict) -> u64| vs.iter().map(|v| f(v)).sum::<u64>();
        let heal = vs.iter().filter_map(|v| v.stats.heal_max_ms).max();
        let _ = writeln!(
            out,
            "| {scenario} | {backend} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            vs.len(),
            thousands(sum(&|v| v.stats.operations)),
            thousands(sum(&|v| v.stats.faults.values().sum())),
            evidence(&vs),
            thousands(sum(&|v| v.stats.stale_rejected)),
            thousands(sum(&|v| v.stats.stale_reads_rejected)),
            violations(&vs, "C3"),
            violations(&vs, "C4"),
            violations(&vs, "C2"),
            violations(&vs, "C6"),
            heal.map_or("–".into(), thousands),
            verdict(&vs),
        );
    }
    out.push('\n');
}

/// Evidence totals by kind, e.g. `restarted 212, rolled-back 30`.
fn evidence(vs: &[&Verdict]) -> String {
    let mut total: BTreeMap<&str, u64> = BTreeMap::new();
    for v in vs {
        for (what, n) in &v.stats.evidence {
            *total.entry(what).or_default() += n;
        }
    }
    if total.is_empty() {
        return "–".into();
    }
    total.iter().map(|(w, n)| format!("{w} {}", thousands(*n))).collect::<Vec<_>>().join(", ")
}

/// The violations of check `id` over the runs; `n/a` where it never applied.
fn violations(vs: &[&Verdict], id: &str) -> String {
    let applied: Vec<_> = vs
        .iter()
        .filter_map(|v| v.checks.iter().find(|c| c.id == id))
        .filter(|c| c.status != Status::NotApplicable)
        .collect();
    if applied.is_empty() {
        return "n/a".into();
    }
    let n: u64 = applied.iter().map(|c| c.violations).sum();
    let finding = applied.iter().any(|c| c.status == Status::Finding);
    if finding {
        format!("{} (finding)", thousands(n))
    } else {
        thousands(n)
    }
}

/// The worst status over the runs: ❌ fail, then inconclusive, then finding, else ✅.
fn verdict(vs: &[&Verdict]) -> &'static str {
    let any = |s: Status| vs.iter().any(|v| v.checks.iter().any(|c| c.status == s));
    if any(Status::Fail) {
        "❌"
    } else if any(Status::Inconclusive) {
        "inconclusive"
    } else if any(Status::Finding) {
        "finding"
    } else {
        "✅"
    }
}

fn checks_legend(out: &mut String) {
    let _ = writeln!(out, "## Checks\n");
    let _ = writeln!(out, "| id | what it checks |\n|---|---|");
    for (id, what) in CHECKS {
        let _ = writeln!(out, "| {id} | {what} |");
    }
    out.push('\n');
}

fn scenarios(out: &mut String, runs: &[&Verdict]) {
    let _ = writeln!(out, "## Scenarios\n");
    let mut ids: Vec<&str> = runs.iter().map(|v| v.info.scenario.as_str()).collect();
    ids.sort_by_key(|s| (scenario_rank(s), s.to_string()));
    ids.dedup();
    for id in ids {
        scenario_heading(out, id);
        let mine: Vec<&Verdict> = runs.iter().copied().filter(|v| v.info.scenario == id).collect();
        problems(out, &mine);
    }
    scenario_heading(out, "S6");
    let _ = writeln!(out, "S6 is checked in every run: its failures are listed under the run's scenario above.\n");
}

fn scenario_heading(out: &mut String, id: &str) {
    match SCENARIOS.iter().find(|(s, _, _)| *s == id) {
        Some((_, title, what)) => {
            let _ = writeln!(out, "### {id} — {title}\n\n{what}\n");
        }
        None => {
            let _ = writeln!(out, "### {id}\n");
        }
    }
}

/// Lists the checks that did not pass (fail, inconclusive, finding), with examples.
fn problems(out: &mut String, vs: &[&Verdict]) {
    let mut any = false;
    for v in vs {
        for c in v.checks.iter().filter(|c| !matches!(c.status, Status::Pass | Status::NotApplicable)) {
            any = true;
            let _ = writeln!(
                out,
                "- **{} seed {} — {} {}: {}** ({})",
                v.info.backend,
                v.info.seed,
                c.id,
                c.name,
                c.status,
                violations_text(c.violations)
            );
            for e in &c.examples {
                let _ = writeln!(out, "  - {}", e.replace('\n', " "));
            }
        }
    }
    if !any {
        let _ = writeln!(out, "Every applicable check passed in every run.");
    }
    out.push('\n');
}

fn mutants_section(out: &mut String, mutants: &[&Verdict]) {
    let _ = writeln!(out, "## Mutants\n");
    let _ = writeln!(
        out,
        "Deliberately broken builds: `fencing-off` (the storage carries out stale writes), `memory-token` (the \
         token counter is kept only in memory), `dead-waiter` (the waiter re-check removed), `reads-unfenced` \
         (shared mode: the workers' reads leave without their token), `multi-one-by-one` (multi mode: a \
         multi-acquire takes its locks one after another). Each must turn at least one check red (fail).\n"
    );
    if mutants.is_empty() {
        let _ = writeln!(out, "No mutant runs.\n");
        return;
    }
    let _ =
        writeln!(out, "| mutant | scenario | backend | seed | checks turned red | caught |\n|---|---|---|--:|---|---|");
    for v in mutants {
        let red: Vec<String> = v
            .checks
            .iter()
            .filter(|c| c.status.is_red())
            .map(|c| format!("{} {} ({})", c.id, c.status, thousands(c.violations)))
            .collect();
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} |",
            v.info.mutant.as_deref().unwrap_or("?"),
            v.info.scenario,
            v.info.backend,
            v.info.seed,
            if red.is_empty() { "none".to_string() } else { red.join(", ") },
            if caught(v) { "✅ caught" } else { "❌ missed" },
        );
    }
    out.push('\n');
    for v in mutants {
        for c in v.checks.iter().filter(|c| c.status.is_red()) {
            if let Some(e) = c.examples.first() {
                let m = v.info.mutant.as_deref().unwrap_or("?");
                let _ = writeln!(out, "- {m}, {} {}: {}", c.id, c.name, e.replace('\n', " "));
            }
        }
    }
    out.push('\n');
}

/// A mutant is caught when at least one check fails (inconclusive is not enough).
fn caught(v: &Verdict) -> bool {
    v.checks.iter().any(|c| c.status == Status::Fail)
}

/// `1 violation`, `3 violations`.
fn violations_text(n: u64) -> String {
    format!("{} violation{}", thousands(n), if n == 1 { "" } else { "s" })
}

/// Text safe inside a table cell.
fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

fn wall_time(ms: u64) -> String {
    if ms == 0 {
        return "–".into();
    }
    let s = ms / 1000;
    match (s / 3600, s / 60 % 60, s % 60) {
        (0, 0, sec) => format!("{sec} s"),
        (0, m, sec) => format!("{m} min {sec} s"),
        (h, m, _) => format!("{h} h {m} min"),
    }
}

/// `1234567` → `1,234,567`.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checker::{Check, RunInfo, Stats};

    fn verdict(scenario: &str, backend: &str, mutant: Option<&str>, c3: Status, c3_violations: u64) -> Verdict {
        let info = RunInfo {
            scenario: scenario.into(),
            backend: backend.into(),
            mutant: mutant.map(str::to_string),
            seed: 7,
            duration_ms: 20_000,
            workers: 4,
            fencing: true,
            durable_tokens: true,
            ttl_ms: 500,
            heal_bound_ms: 2_500,
            heal_slack_ms: 0,
            min_stale_rejects: 1,
            required_evidence: vec!["stopped".into()],
            object_key: "chaos-object".into(),
            election: false,
            shared: false,
            permits: 0,
            polls_holders: false,
            multi: 0,
            lock: "chaos".into(),
        };
        let check = |id: &str, status, violations, example: &str| Check {
            id: id.into(),
            name: format!("{id} name"),
            status,
            violations,
            examples: vec![example.into()],
        };
        let mut stats = Stats {
            operations: 12_345,
            stale_rejected: 21,
            stale_reads_rejected: 4,
            heal_max_ms: Some(640),
            ..Stats::default()
        };
        stats.faults.insert(scenario.into(), 30);
        stats.evidence.insert("stopped".into(), 29);
        let checks = vec![
            check("C2", Status::Pass, 0, ""),
            check("C3", c3, c3_violations, "audit #17: PUT token 3 carried out (Accepted) after token 5 at #16"),
            check("C6", Status::NotApplicable, 0, "no restart"),
        ];
        let passed = !checks.iter().any(|c| c.status.is_red());
        Verdict { info, checks, stats, passed }
    }

    #[test]
    fn markdown_has_a_row_per_scenario_and_backend_and_marks_the_failing_one() {
        // One passing and one failing run: both rows, ✅ and ❌, the failure's example listed.
        let vs = [verdict("K1", "fencelock", None, Status::Pass, 0), verdict("K1", "redis", None, Status::Fail, 2)];
        let meta = ReportMeta { command: "fencelock-chaos profile short".into(), cores: 2, ..ReportMeta::default() };
        let md = markdown(&vs, &meta);
        let row =
            |backend: &str| md.lines().find(|l| l.starts_with(&format!("| K1 | {backend} |"))).map(str::to_string);
        let ok = row("fencelock").expect("fencelock row");
        let bad = row("redis").expect("redis row");
        assert!(ok.contains("12,345") && ok.contains("stopped 29") && ok.ends_with("| ✅ |"), "{ok}");
        assert!(bad.ends_with("| ❌ |") && bad.contains("| 2 |"), "{bad}");
        assert!(ok.contains("| n/a |"), "C6 never applied: {ok}");
        assert!(ok.contains("| 21 | 4 |"), "stale writes and stale reads rejected: {ok}");
        assert!(md.contains("### K1 — holder paused past its TTL"));
        assert!(md.contains("- **redis seed 7 — C3 C3 name: fail** (2 violations)"), "{md}");
        assert!(md.contains("audit #17"));
        assert!(md.contains("`fencelock-chaos profile short`"));
        assert!(md.contains("**1 of 2 runs passed; 0 of 0 mutants were caught.**"));
    }

    #[test]
    fn mutants_table_names_the_red_checks() {
        // A mutant run is caught when at least one check fails; one that stays green is missed.
        let vs = [
            verdict("K1", "fencelock", Some("fencing-off"), Status::Fail, 4),
            verdict("S1", "fencelock", Some("dead-waiter"), Status::Pass, 0),
        ];
        let md = markdown(&vs, &ReportMeta::default());
        assert!(md.contains("| fencing-off | K1 | fencelock | 7 | C3 fail (4) | ✅ caught |"), "{md}");
        assert!(md.contains("| dead-waiter | S1 | fencelock | 7 | none | ❌ missed |"), "{md}");
        assert!(!md.contains("| K1 | fencelock | 1 |"), "mutant runs stay out of the summary");
        assert!(md.contains("**0 of 0 runs passed; 1 of 2 mutants were caught.**"), "{md}");
    }

    #[test]
    fn findings_and_inconclusive_runs_are_named() {
        let vs =
            [verdict("K4", "redlock", None, Status::Finding, 3), verdict("K2", "etcd", None, Status::Inconclusive, 0)];
        let md = markdown(&vs, &ReportMeta::default());
        assert!(md.contains("| 3 (finding) |") && md.contains("| finding |"), "{md}");
        assert!(md.contains("| inconclusive |"), "{md}");
    }

    #[test]
    fn thousands_and_wall_time() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_000), "1,000");
        assert_eq!(thousands(1_234_567), "1,234,567");
        assert_eq!(wall_time(61_000), "1 min 1 s");
        assert_eq!(wall_time(3_725_000), "1 h 2 min");
    }
}
