//! `results.md` and the targets, from a finished [`Report`].
//!
//! Where it sits: `main` calls [`targets`] once the cells are measured (the
//! result goes into the report and `results.json`), then [`markdown`] for the
//! document a reader sees first. Both only read the report: every figure is a
//! cell's median run (the run with the median throughput) or a W3/W4 record of
//! this run. Any engine, cell or workload may be missing (`--engines`,
//! `--workloads`, `--clients`): its figures and targets read "n/a".

use std::fmt::Write as _;

use crate::model::{Cell, Durability, Report, RunResult, Scale, Target};

/// The W1 client count the targets are set at.
pub const TARGET_CLIENTS: usize = 64;
/// Durable peers W2's handoff target compares against (the fastest one).
const DURABLE_PEERS: &[&str] = &["redis-aof", "etcd", "zookeeper"];
/// The single native node, and the 3-node group shown next to it.
const NATIVE: &str = "fencelock";
const GROUP: &str = "fencelock-3";
const SECURE: &str = "fencelock-secure";

/// The cell of `workload` on `engine` (W1: with `clients`; W2: any client count).
pub fn cell<'a>(r: &'a Report, workload: &str, engine: &str, clients: Option<usize>) -> Option<&'a Cell> {
    r.cells.iter().find(|c| c.workload == workload && c.engine == engine && clients.is_none_or(|n| c.clients == n))
}

/// Median run of a cell, if measured.
fn median<'a>(r: &'a Report, workload: &str, engine: &str, clients: Option<usize>) -> Option<&'a RunResult> {
    cell(r, workload, engine, clients).map(|c| &c.median)
}

/// Engine ids in report order, then any engine that only appears in a cell.
pub fn engine_ids(r: &Report) -> Vec<String> {
    let mut ids: Vec<String> = r.engines.iter().map(|e| e.id.clone()).collect();
    for c in &r.cells {
        if !ids.contains(&c.engine) {
            ids.push(c.engine.clone());
        }
    }
    ids
}

/// W1 client counts measured, ascending.
pub fn w1_clients(r: &Report) -> Vec<usize> {
    let mut cs: Vec<usize> = r.cells.iter().filter(|c| c.workload == "W1").map(|c| c.clients).collect();
    cs.sort_unstable();
    cs.dedup();
    cs
}

/// The W1 client count for headline comparisons: 64 when measured, else the largest.
pub fn headline_clients(r: &Report) -> Option<usize> {
    let cs = w1_clients(r);
    if cs.contains(&TARGET_CLIENTS) {
        Some(TARGET_CLIENTS)
    } else {
        cs.last().copied()
    }
}

/// `a / b` when both are known and `b` is positive.
fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 && a.is_finite() && b.is_finite() => Some(a / b),
        _ => None,
    }
}

fn target(name: impl Into<String>, op: &str, goal: f64, measured: Option<f64>, unit: &str) -> Target {
    let met = measured.map(|m| if op == ">=" { m >= goal } else { m <= goal });
    Target { name: name.into(), op: op.into(), goal, measured, unit: unit.into(), met }
}

/// The seeds' Redis recipe (`engines::SETNX`), without and with `appendfsync always`:
/// the W1 targets compare with the lock most Redis users write, not with
/// fencelock's FIFO recipe run on Redis (issue 38).
const SETNX: &str = "redis-setnx";
const SETNX_AOF: &str = "redis-setnx-aof";
/// Time to create a million leases (W3), in seconds.
const CREATE_GOAL_SECS: f64 = 5.0;

/// The targets (issue 38), evaluated on this run's medians.
pub fn targets(r: &Report) -> Vec<Target> {
    let mut t = w1_targets(r);
    t.extend(w2_targets(r));
    t.extend(w3_targets(r));
    t
}

/// W1: per-process clients ahead of the seeds' recipe on Redis, one client
/// too, the engine's CPU per cycle, and the 3-node group against one node.
fn w1_targets(r: &Report) -> Vec<Target> {
    let c = TARGET_CLIENTS;
    let w1 = |e: &str, n: usize| median(r, "W1", e, Some(n));
    let cps = |e: &str, n: usize| w1(e, n).map(|m| m.cycles_per_sec);
    let mut t = Vec::new();
    for (peer, goal) in [(SETNX, 1.0), (SETNX_AOF, 2.0)] {
        t.push(target(
            format!("W1 {c} clients: fencelock / {peer} cycles/s"),
            ">=",
            goal,
            ratio(cps(NATIVE, c), cps(peer, c)),
            "×",
        ));
    }
    t.push(target(
        format!("W1 1 client: fencelock / {SETNX_AOF} cycles/s"),
        ">=",
        1.0,
        ratio(cps(NATIVE, 1), cps(SETNX_AOF, 1)),
        "×",
    ));
    let p50 = |e: &str| w1(e, 1).map(|m| m.acquire_ms.p50);
    t.push(target(
        format!("W1 1 client: fencelock / {SETNX_AOF} acquire p50"),
        "<=",
        1.0,
        ratio(p50(NATIVE), p50(SETNX_AOF)),
        "×",
    ));
    let cpu = |e: &str| w1(e, c).and_then(|m| m.cpu_us_per_cycle);
    t.push(target(
        format!("W1 {c} clients: fencelock / {SETNX} engine CPU per cycle"),
        "<=",
        1.0,
        ratio(cpu(NATIVE), cpu(SETNX)),
        "×",
    ));
    t.push(target(
        format!("W1 {c} clients: {GROUP} / fencelock cycles/s"),
        ">=",
        0.7,
        ratio(cps(GROUP, c), cps(NATIVE, c)),
        "×",
    ));
    t
}

/// W2: handoff p99, fairness, FIFO, and throughput against the fastest durable FIFO peer.
fn w2_targets(r: &Report) -> Vec<Target> {
    let w2 = |e: &str| median(r, "W2", e, None);
    let native = w2(NATIVE);
    let mut t = vec![
        target("W2: fencelock handoff p99", "<=", 1.0, native.and_then(|m| m.handoff_ms).map(|h| h.p99), "ms"),
        target(
            "W2: fencelock fairness (max / min grants per client)",
            "<=",
            1.05,
            native.and_then(|m| m.fairness),
            "×",
        ),
        target(
            "W2: fencelock self re-grants while others waited (FIFO)",
            "<=",
            0.0,
            native.and_then(|m| m.self_regrant_while_others_waited).map(|n| n as f64),
            "grants",
        ),
    ];
    let fastest =
        DURABLE_PEERS.iter().filter_map(|&p| w2(p).map(|m| (p, m.cycles_per_sec))).max_by(|a, b| a.1.total_cmp(&b.1));
    let name = match fastest {
        Some((p, _)) => format!("W2: fencelock / fastest durable peer ({p}) cycles/s"),
        None => format!("W2: fencelock / fastest durable peer ({}: none measured) cycles/s", DURABLE_PEERS.join(", ")),
    };
    t.push(target(name, ">=", 3.0, ratio(native.map(|m| m.cycles_per_sec), fastest.map(|f| f.1)), "×"));
    t
}

/// W3: memory per idle lease, and the time to create a million (a goal
/// scaled down in proportion for a smaller run, and named so).
fn w3_targets(r: &Report) -> Vec<Target> {
    let s = r.scale.as_ref();
    let memory = target("W3: memory per live lease", "<=", 300.0, s.map(|s| s.bytes_per_lease), "bytes");
    let full = 1_000_000u64;
    let create = match s {
        Some(s) if s.leases < full => {
            let goal = CREATE_GOAL_SECS * s.leases as f64 / full as f64;
            let name = format!(
                "W3: time to create {} leases (fewer than {}: goal scaled from {CREATE_GOAL_SECS} s)",
                thousands(s.leases),
                thousands(full)
            );
            target(name, "<=", goal, Some(s.create_seconds), "s")
        }
        Some(s) => target(
            format!("W3: time to create {} leases", thousands(s.leases)),
            "<=",
            CREATE_GOAL_SECS,
            Some(s.create_seconds),
            "s",
        ),
        None => target(format!("W3: time to create {} leases", thousands(full)), "<=", CREATE_GOAL_SECS, None, "s"),
    };
    vec![memory, create]
}

// ---- number formatting -------------------------------------------------------------------------------------------

/// `1234567` → `1,234,567`.
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

/// Cycles/s: whole numbers with separators; one decimal below 100.
pub fn rate(x: f64) -> String {
    if !x.is_finite() {
        "n/a".into()
    } else if x < 100.0 {
        format!("{x:.1}")
    } else {
        thousands(x.round() as u64)
    }
}

/// Milliseconds, with the decimals the magnitude needs.
pub fn ms(x: f64) -> String {
    match x {
        x if !x.is_finite() => "n/a".into(),
        x if x >= 1000.0 => thousands(x.round() as u64),
        x if x >= 100.0 => format!("{x:.0}"),
        x if x >= 10.0 => format!("{x:.1}"),
        x if x >= 0.1 || x == 0.0 => format!("{x:.2}"),
        x => format!("{x:.3}"),
    }
}

/// A ratio: `2.35×`, `23.5×`.
fn times(x: f64) -> String {
    if x >= 1000.0 {
        format!("{}×", thousands(x.round() as u64))
    } else if x >= 10.0 {
        format!("{x:.1}×")
    } else {
        format!("{x:.2}×")
    }
}

/// µs per cycle (or renewal).
fn us(x: f64) -> String {
    if x >= 1000.0 {
        thousands(x.round() as u64)
    } else if x >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

fn opt<T>(v: Option<T>, f: impl Fn(T) -> String) -> String {
    v.map(f).unwrap_or_else(|| "n/a".into())
}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

fn check(ok: bool) -> &'static str {
    if ok {
        "✅"
    } else {
        "❌"
    }
}

fn or_unknown(s: &str) -> &str {
    if s.trim().is_empty() {
        "unknown"
    } else {
        s
    }
}

/// A whole-number goal with its unit: `2×`, `1 ms`, `10 s`.
fn whole(x: f64, unit: &str) -> String {
    let n = if x >= 0.0 { thousands(x as u64) } else { format!("{x}") };
    match unit {
        "×" | "" => format!("{n}{unit}"),
        _ => format!("{n} {unit}"),
    }
}

/// A measured value with its unit: `2.35×`, `0.42 ms`, `262 bytes`.
fn with_unit(x: f64, unit: &str) -> String {
    let n = match unit {
        "×" => return times(x),
        "ms" => ms(x),
        "bytes" | "grants" if x.fract() == 0.0 && x >= 0.0 => thousands(x as u64),
        "bytes" => format!("{x:.0}"),
        "share" => return format!("{:.1} %", x * 100.0),
        "µs" => us(x),
        _ if x.fract() == 0.0 => format!("{x}"),
        _ if x >= 10.0 => format!("{x:.1}"),
        _ => format!("{x:.2}"),
    };
    if unit.is_empty() {
        n
    } else {
        format!("{n} {unit}")
    }
}

/// A markdown table row.
fn row(md: &mut String, cols: &[String]) {
    let _ = writeln!(md, "| {} |", cols.join(" | "));
}

/// A table header; columns from `numbers_from` on are right-aligned.
fn header(md: &mut String, cols: &[&str], numbers_from: usize) {
    let _ = writeln!(md, "| {} |", cols.join(" | "));
    let _ = writeln!(
        md,
        "|{}",
        (0..cols.len()).map(|i| if i < numbers_from { "---|" } else { "---:|" }).collect::<String>()
    );
}

/// "cycles/s low–high" over a cell's runs, when there is more than one.
fn run_range(c: &Cell) -> String {
    if c.runs.len() < 2 {
        return "–".into();
    }
    let lo = c.runs.iter().map(|r| r.cycles_per_sec).fold(f64::INFINITY, f64::min);
    let hi = c.runs.iter().map(|r| r.cycles_per_sec).fold(f64::NEG_INFINITY, f64::max);
    format!("{}–{}", rate(lo), rate(hi))
}

fn runs_phrase(n: usize) -> String {
    if n == 1 {
        "1 run (no median)".into()
    } else {
        format!("median of {n} runs")
    }
}

// ---- the document ------------------------------------------------------------------------------------------------

/// The whole `results.md`.
pub fn markdown(r: &Report) -> String {
    let mut md = String::new();
    let quick = r.mode == "quick";
    let _ = writeln!(md, "# fencelock bench results\n");
    let _ = writeln!(md, "Run started {} (UTC), mode `{}`.\n", or_unknown(&r.started), r.mode);
    if quick {
        let _ = writeln!(
            md,
            "**Quick mode: every cell ran briefly. These figures are a smoke check that everything runs, not results; \
             do not quote or compare them.**\n"
        );
    }
    let _ = writeln!(md, "Command: `{}`\n", r.command);
    machine_and_settings(&mut md, r);
    engines(&mut md, r);
    targets_table(&mut md, r);
    w1(&mut md, r);
    w2(&mut md, r);
    for v in &VARIANTS {
        variant_vs_node(&mut md, r, v);
    }
    ratios(&mut md, r);
    if let Some(s) = &r.scale {
        w3(&mut md, s);
    }
    if let Some(d) = &r.durability {
        w4(&mut md, d);
    }
    w5(&mut md, r);
    if !r.elections.is_empty() {
        w6(&mut md, &r.elections);
    }
    md
}

fn machine_and_settings(md: &mut String, r: &Report) {
    let m = &r.machine;
    let s = &r.settings;
    let _ = writeln!(md, "## Machine and settings\n");
    header(md, &["", ""], 2);
    for (k, v) in [
        ("Cores", m.cores.to_string()),
        ("CPU", or_unknown(&m.cpu).to_string()),
        ("Memory", format!("{:.1} GiB", m.memory_gib)),
        ("Kernel", format!("Linux {}", or_unknown(&m.kernel))),
        ("Data filesystem (all engines)", or_unknown(&m.data_fs).to_string()),
        ("rustc", or_unknown(&m.rustc).to_string()),
        ("fencelock commit", or_unknown(&m.commit).to_string()),
        ("Measured seconds per run", format!("{} s", s.seconds)),
        ("Warm-up before each run (not counted)", format!("{} s", s.warmup)),
        (
            "Runs per cell",
            format!(
                "{} (engines interleaved, order rotated every run; figures are the median run by throughput)",
                s.runs
            ),
        ),
        ("Lease TTL asked of every engine", format!("{} ms", thousands(s.ttl_ms))),
    ] {
        row(md, &[k.to_string(), v]);
    }
    let _ =
        writeln!(md, "\nEvery engine runs on this one machine, on 127.0.0.1, with the clients in the bench process.\n");
}

fn engines(md: &mut String, r: &Report) {
    let _ = writeln!(md, "## Engines\n");
    if r.engines.is_empty() {
        let _ = writeln!(md, "No engine was measured.\n");
        return;
    }
    header(md, &["id", "engine", "version", "durable", "fencing", "FIFO", "engine CPU read"], 7);
    for e in &r.engines {
        row(
            md,
            &[
                format!("`{}`", e.id),
                e.label.clone(),
                e.version.clone(),
                yes(e.durable).into(),
                e.fencing.clone(),
                yes(e.fifo).into(),
                yes(e.cpu_measured).into(),
            ],
        );
    }
    let _ = writeln!(
        md,
        "\nDurable: an acknowledged grant survives a crash (fsync before the reply). `redis` and `redis-aof` run \
         fencelock's FIFO recipe on Redis (a queue, push handoff, a global token); `redis-setnx` and `redis-setnx-aof` \
         run the lock most Redis users write, the seeds' recipe (SET NX PX and INCR of the lock's token in one script, \
         a compare-and-delete release, retried every 100 ms while taken: no queue), which the W1 targets compare \
         with. `fencelock-3` is three fencelock nodes forming one Raft group on this machine; its clients are given \
         all three and follow the leader.\n"
    );
    configurations(md, r);
}

/// How each engine's server ran (once per server: `ID/shared` is the same
/// server as `ID`), and what became of the TTL asked for.
fn configurations(md: &mut String, r: &Report) {
    let mut seen: Vec<&str> = Vec::new();
    let mut lines = Vec::new();
    for e in r.engines.iter().filter(|e| !e.shared_connection && !e.config.is_empty()) {
        if !seen.contains(&e.config.as_str()) || e.config.starts_with("given") {
            seen.push(&e.config);
            lines.push(format!("- `{}`: {}", e.id, e.config));
        }
    }
    if !lines.is_empty() {
        let _ = writeln!(md, "### How each engine runs\n\n{}\n", lines.join("\n"));
        let _ = writeln!(
            md,
            "Every peer runs as its operators would run it (durable, default timers), not as the tests run it (short \
             timers for fast tests). The TTL asked for ({} ms) is what every engine gets, within each one's range: \
             ZooKeeper negotiates a session timeout into [2, 20] × tickTime (4 s to 40 s at tickTime 2000); etcd's \
             leases start at 2 s with its default election timeout and count whole seconds. The same holds for W6's \
             election TTL: ZooKeeper serves anything asked below 4 s as 4 s.\n",
            thousands(r.settings.ttl_ms)
        );
    }
    if r.engines.iter().any(|e| e.shared_connection) {
        let _ = writeln!(
            md,
            "An engine `ID/shared` is `ID`'s server measured with one `Backend` (one connection; for ZooKeeper one \
             session) used by every client's task; `ID` gives each client its own, as separate processes have.\n"
        );
    }
}

fn targets_table(md: &mut String, r: &Report) {
    // The report's own targets (as written to results.json); evaluate them if the caller did not.
    let computed;
    let ts = if r.targets.is_empty() {
        computed = targets(r);
        &computed
    } else {
        &r.targets
    };
    let _ = writeln!(md, "## Targets\n");
    if quick_mode(r) {
        let _ = writeln!(md, "Quick mode: met or not, these say nothing about the targets.\n");
    }
    header(md, &["target", "goal", "measured", "met"], 1);
    for t in ts {
        let op = match t.op.as_str() {
            ">=" => "≥",
            "<=" => "≤",
            o => o,
        };
        let met = match t.met {
            Some(m) => check(m),
            None => "n/a",
        };
        let goal = if t.goal.fract() == 0.0 && t.unit != "share" {
            whole(t.goal, &t.unit)
        } else {
            with_unit(t.goal, &t.unit)
        };
        row(md, &[t.name.clone(), format!("{op} {goal}"), opt(t.measured, |m| with_unit(m, &t.unit)), met.into()]);
    }
    let _ = writeln!(md);
}

fn quick_mode(r: &Report) -> bool {
    r.mode == "quick"
}

fn errors_col(cells: &[Option<&Cell>]) -> bool {
    cells.iter().flatten().any(|c| c.median.errors > 0 || c.runs.iter().any(|r| r.errors > 0))
}

fn runs_col(r: &Report, cells: &[Option<&Cell>]) -> bool {
    cells.iter().flatten().any(|c| c.runs.len() != r.settings.runs)
}

fn w1(md: &mut String, r: &Report) {
    let cs = w1_clients(r);
    if cs.is_empty() {
        return;
    }
    let ids = engine_ids(r);
    let _ = writeln!(md, "## W1: uncontended cycles ({})\n", runs_phrase(r.settings.runs));
    let _ = writeln!(
        md,
        "C clients, each on its own lock, loop acquire → release. Acquire latency is the acquire call until the grant \
         returns. Engine CPU is the engine process's (user + system, children included; for `fencelock-3` its three nodes' \
         summed) per cycle; client CPU is \
         the benchmark process's own (the client library and its connections; every engine's clients run in it).\n"
    );
    for &c in &cs {
        let cells: Vec<Option<&Cell>> = ids.iter().map(|e| cell(r, "W1", e, Some(c))).collect();
        let (errs, runs, range) = (errors_col(&cells), runs_col(r, &cells), r.settings.runs > 1);
        let _ = writeln!(md, "### W1, {c} client{}\n", if c == 1 { "" } else { "s" });
        let cols = columns(
            &["acquire p50 ms", "p99 ms", "p99.9 ms", "engine CPU µs/cycle", "client CPU µs/cycle"],
            (range, runs, errs),
        );
        header(md, &cols, 1);
        for (id, cell) in ids.iter().zip(&cells) {
            let figures = |m: &RunResult| {
                vec![
                    ms(m.acquire_ms.p50),
                    ms(m.acquire_ms.p99),
                    ms(m.acquire_ms.p999),
                    opt(m.cpu_us_per_cycle, us),
                    opt(m.client_cpu_us_per_cycle, us),
                ]
            };
            cell_row(md, id, *cell, cols.len(), (range, runs, errs), figures);
        }
        let _ = writeln!(md);
    }
}

/// The columns of a W1, W2 or W5 table: engine and cycles/s, the run range
/// if `range`, the workload's `figures`, then runs and errors if shown.
fn columns<'a>(figures: &[&'a str], (range, runs, errs): (bool, bool, bool)) -> Vec<&'a str> {
    let mut cols = vec!["engine", "cycles/s"];
    if range {
        cols.push("cycles/s, runs low–high");
    }
    cols.extend(figures);
    if runs {
        cols.push("runs");
    }
    if errs {
        cols.push("errors");
    }
    cols
}

/// One engine's row of a W1, W2 or W5 table: id, cycles/s, the run range if
/// `range`, the workload's `figures`, then runs and errors if those columns
/// are shown; "n/a" throughout for an engine without this cell.
fn cell_row(
    md: &mut String,
    id: &str,
    cell: Option<&Cell>,
    width: usize,
    (range, runs, errs): (bool, bool, bool),
    figures: impl Fn(&RunResult) -> Vec<String>,
) {
    let mut v = vec![format!("`{id}`")];
    match cell {
        Some(cl) => {
            let m = &cl.median;
            v.push(rate(m.cycles_per_sec));
            if range {
                v.push(run_range(cl));
            }
            v.extend(figures(m));
            if runs {
                v.push(cl.runs.len().to_string());
            }
            if errs {
                v.push(thousands(m.errors));
            }
        }
        None => v.extend(std::iter::repeat_n("n/a".to_string(), width - 1)),
    }
    row(md, &v);
}

fn w2(md: &mut String, r: &Report) {
    let ids = engine_ids(r);
    let cells: Vec<Option<&Cell>> = ids.iter().map(|e| cell(r, "W2", e, None)).collect();
    let Some(any) = cells.iter().flatten().next() else { return };
    let _ = writeln!(
        md,
        "## W2: contended handoff, {} clients on one lock ({})\n",
        any.clients,
        runs_phrase(r.settings.runs)
    );
    let _ = writeln!(
        md,
        "Every client loops acquire → release on the same lock, holding it for no time. Handoff: a holder starts its \
         release → the next holder's acquire returns. Fairness: most / fewest grants per client (1.00 is perfectly \
         even; \"starved N\": N clients got no grant). Self re-grant: the lock went straight back to the client that \
         had just released it; \"while others waited\" counts those where another client's acquire had started before \
         that release, which FIFO forbids.\n"
    );
    let (errs, runs, range) = (errors_col(&cells), runs_col(r, &cells), r.settings.runs > 1);
    let cols = columns(
        &[
            "handoff p50 ms",
            "handoff p99 ms",
            "fairness",
            "self re-grants",
            "… while others waited",
            "engine CPU µs/cycle",
            "client CPU µs/cycle",
        ],
        (range, runs, errs),
    );
    header(md, &cols, 1);
    for (id, cell) in ids.iter().zip(&cells) {
        let figures = |m: &RunResult| {
            let fairness = match (m.fairness, m.starved_clients) {
                (Some(f), _) => format!("{f:.2}"),
                (None, Some(n)) => format!("starved {n}"),
                (None, None) => "n/a".into(),
            };
            vec![
                opt(m.handoff_ms, |h| ms(h.p50)),
                opt(m.handoff_ms, |h| ms(h.p99)),
                fairness,
                opt(m.self_regrant_share, |s| format!("{:.1} %", s * 100.0)),
                opt(m.self_regrant_while_others_waited, thousands),
                opt(m.cpu_us_per_cycle, us),
                opt(m.client_cpu_us_per_cycle, us),
            ]
        };
        cell_row(md, id, *cell, cols.len(), (range, runs, errs), figures);
    }
    let _ = writeln!(md);
}

/// W5: the read-mostly mix and the semaphore, one table each; engines that
/// do not declare shared locks or semaphores read "n/a".
fn w5(md: &mut String, r: &Report) {
    let ids = engine_ids(r);
    let tables = [
        (
            "W5-rw",
            format!(
                "read-write locks, {} locks, {:.0} % exclusive",
                crate::workload::W5_LOCKS,
                crate::workload::W5_EXCLUSIVE_SHARE * 100.0
            ),
        ),
        ("W5-sem", format!("a semaphore of {} permits", crate::workload::W5_PERMITS)),
    ];
    let mut intro = false;
    for (id, what) in tables {
        let cells: Vec<Option<&Cell>> = ids.iter().map(|e| cell(r, id, e, None)).collect();
        let Some(any) = cells.iter().flatten().next() else { continue };
        if !intro {
            intro = true;
            let _ = writeln!(md, "## W5: shared and counted locks ({})\n", runs_phrase(r.settings.runs));
            let _ = writeln!(
                md,
                "Every client loops acquire → release, holding for no time. W5-rw: each cycle picks one of the locks at \
                 random and takes it exclusive (a writer) or shared (a reader). W5-sem: every client takes one permit. \
                 Handoff, per lock: a grant whose acquire started before the latest release of that lock that began \
                 before the grant waited for it; handoff is that release's start → the grant. Engines that do not \
                 declare shared locks or semaphores read n/a.\n"
            );
        }
        let _ = writeln!(md, "### {id}: {} clients, {what}\n", any.clients);
        let (errs, runs, range) = (errors_col(&cells), runs_col(r, &cells), r.settings.runs > 1);
        let cols = columns(
            &["acquire p50 ms", "acquire p99 ms", "handoff p50 ms", "handoff p99 ms", "engine CPU µs/cycle"],
            (range, runs, errs),
        );
        header(md, &cols, 1);
        for (id, cell) in ids.iter().zip(&cells) {
            let figures = |m: &RunResult| {
                vec![
                    ms(m.acquire_ms.p50),
                    ms(m.acquire_ms.p99),
                    opt(m.handoff_ms, |h| ms(h.p50)),
                    opt(m.handoff_ms, |h| ms(h.p99)),
                    opt(m.cpu_us_per_cycle, us),
                ]
            };
            cell_row(md, id, *cell, cols.len(), (range, runs, errs), figures);
        }
        let _ = writeln!(md);
    }
}

/// Pairs of cells measured on both the single node and the group: every W1
/// client count, then W2; each with its label.
/// A variant of the single node measured in the same run: its cells stand
/// next to the node's, with the ratio.
struct Variant {
    id: &'static str,
    title: &'static str,
    /// Short name in the columns ("3 nodes").
    short: &'static str,
}

const VARIANTS: [Variant; 2] = [
    Variant { id: GROUP, title: "3-node group next to 1 node", short: "3 nodes" },
    Variant { id: SECURE, title: "TLS and authentication next to plaintext", short: "TLS + token" },
];

fn variant_pairs<'a>(r: &'a Report, v: &Variant) -> Vec<(String, &'a Cell, &'a Cell)> {
    let mut pairs = Vec::new();
    for c in w1_clients(r) {
        if let (Some(one), Some(other)) = (cell(r, "W1", NATIVE, Some(c)), cell(r, "W1", v.id, Some(c))) {
            pairs.push((format!("W1, {c} client{}", if c == 1 { "" } else { "s" }), one, other));
        }
    }
    if let (Some(one), Some(other)) = (cell(r, "W2", NATIVE, None), cell(r, "W2", v.id, None)) {
        pairs.push((format!("W2, {} clients on one lock", other.clients), one, other));
    }
    pairs
}

/// What the variant is, for the reader of its section.
fn variant_intro(v: &Variant, r: &Report) -> String {
    let m = &r.machine;
    let setting = format!(
        "All run on this one machine ({} cores, {}, data on {}). Every run measured {} s after {} s of warm-up. \
         Latency is the acquire in W1, the handoff in W2.",
        m.cores,
        or_unknown(&m.cpu),
        or_unknown(&m.data_fs),
        r.settings.seconds,
        r.settings.warmup
    );
    match v.id {
        GROUP => format!(
            "The cells above, side by side: `{NATIVE}` is one node, `{GROUP}` a Raft group of three nodes whose leader \
             acknowledges a write once a majority has it in its log. They share the machine's cores and its disk, and \
             their Raft traffic goes over loopback; the group's engine CPU is its three processes' summed. {setting}\n"
        ),
        _ => format!(
            "The cells above, side by side: `{NATIVE}` is one node over plaintext without authentication, `{SECURE}` the \
             same node with TLS (ECDSA P-256 certificates, rustls) and an auth file, every call carrying a bearer token \
             that the node checks (a salted SHA-256) along with the identity's permission and quotas. Connections are \
             opened once per client, so this is the steady cost per call, not the handshake's. {setting}\n"
        ),
    }
}

/// A variant next to the single node, cell by cell: what replication, or TLS
/// and authentication, cost.
fn variant_vs_node(md: &mut String, r: &Report, v: &Variant) {
    let pairs = variant_pairs(r, v);
    if pairs.is_empty() {
        return;
    }
    let _ = writeln!(md, "## fencelock: {} ({})\n", v.title, runs_phrase(r.settings.runs));
    let _ = writeln!(md, "{}", variant_intro(v, r));
    let s = v.short;
    let cols = [
        "cell".to_string(),
        "1 node cycles/s".into(),
        format!("{s} cycles/s"),
        format!("{s} ÷ 1 node"),
        "1 node p50 / p99 ms".into(),
        format!("{s} p50 / p99 ms"),
        "1 node engine CPU µs/cycle".into(),
        format!("{s} engine CPU µs/cycle"),
    ];
    header(md, &cols.iter().map(String::as_str).collect::<Vec<_>>(), 1);
    let lat = |c: &Cell| {
        let l = if c.workload == "W2" { c.median.handoff_ms } else { Some(c.median.acquire_ms) };
        opt(l, |l| format!("{} / {}", ms(l.p50), ms(l.p99)))
    };
    for (name, one, other) in pairs {
        let (a, b) = (&one.median, &other.median);
        row(
            md,
            &[
                name,
                rate(a.cycles_per_sec),
                rate(b.cycles_per_sec),
                opt(ratio(Some(b.cycles_per_sec), Some(a.cycles_per_sec)), times),
                lat(one),
                lat(other),
                opt(a.cpu_us_per_cycle, us),
                opt(b.cpu_us_per_cycle, us),
            ],
        );
    }
    let _ = writeln!(md);
}

fn ratios(md: &mut String, r: &Report) {
    let ids: Vec<String> = engine_ids(r).into_iter().filter(|e| e != "fencelock").collect();
    let c = headline_clients(r);
    let has_w2 = r.cells.iter().any(|c| c.workload == "W2");
    if ids.is_empty() || (c.is_none() && !has_w2) {
        return;
    }
    let _ =
        writeln!(md, "## Ratios: fencelock ÷ each engine (cycles/s of the medians; above 1: fencelock is faster)\n");
    let w1_col = c.map(|c| format!("W1, {c} clients"));
    let mut cols = vec!["engine"];
    if let Some(w) = &w1_col {
        cols.push(w);
    }
    if has_w2 {
        cols.push("W2");
    }
    header(md, &cols, 1);
    let rate_of = |w: &str, e: &str, n: Option<usize>| median(r, w, e, n).map(|m| m.cycles_per_sec);
    for id in &ids {
        let mut v = vec![format!("fencelock ÷ `{id}`")];
        if let Some(c) = c {
            v.push(opt(ratio(rate_of("W1", "fencelock", Some(c)), rate_of("W1", id, Some(c))), times));
        }
        if has_w2 {
            v.push(opt(ratio(rate_of("W2", "fencelock", None), rate_of("W2", id, None)), times));
        }
        row(md, &v);
    }
    let _ = writeln!(md);
}

/// W3's memory readings: before, a second after the creates and once settled
/// (results from before the wait have the one reading after).
fn memory_line(s: &Scale, grew: u64) -> String {
    if s.rss_after_create == 0 {
        return format!(
            "- Server resident memory: {} before creating anything, {} with every lease live and idle (+{}).",
            mib(s.rss_before),
            mib(s.rss_after),
            mib(grew)
        );
    }
    format!(
        "- Server resident memory: {} before creating anything, {} a second after the last create, {} with every lease live and idle once it stopped falling, {:.1} s later (+{}).",
        mib(s.rss_before),
        mib(s.rss_after_create),
        mib(s.rss_after),
        s.settle_seconds,
        mib(grew)
    )
}

fn w3(md: &mut String, s: &Scale) {
    let _ = writeln!(md, "## W3: scale (native server)\n");
    let grew = s.rss_after.saturating_sub(s.rss_before);
    let every = s.renew_ttl_ms / 3;
    let per_s = if s.renew_seconds > 0.0 { s.renewals as f64 / s.renew_seconds } else { 0.0 };
    for line in [
        format!("- Leases created, each holding one lock of its own: **{}**.", thousands(s.leases)),
        runs_line(&s.create_seconds_runs),
        format!(
            "- Time to create them all (grant a lease + acquire its lock, each): **{:.2} s**, {} creates/s.",
            s.create_seconds,
            rate(s.creates_per_sec)
        ),
        create_cpu_line(s),
        memory_line(s, grew),
        format!("- Memory per live lease (growth ÷ leases): **{:.0} bytes**.", s.bytes_per_lease),
        format!(
            "- Then {} of the leases renewed (TTL {} ms, a keep-alive every TTL/3 ≈ {} ms) for {:.1} s: {} keep-alives acknowledged ({}/s).",
            thousands(s.renewing),
            thousands(s.renew_ttl_ms),
            thousands(every),
            s.renew_seconds,
            thousands(s.renewals),
            rate(per_s)
        ),
        format!(
            "- Server CPU while they renewed: {:.3} cores (1.0 = one core busy), {} µs per renewal.",
            s.renew_cpu_cores,
            us(s.cpu_us_per_renewal)
        ),
        format!("- Renewals that found their lease already ended (must be 0): {} {}.", thousands(s.renew_failures), check(s.renew_failures == 0)),
    ]
    .into_iter()
    .filter(|line| !line.is_empty())
    {
        let _ = writeln!(md, "{line}");
    }
    let _ = writeln!(md);
}

/// The CPU a create cost while W3 created (empty in results written before
/// W3 read it).
fn create_cpu_line(s: &Scale) -> String {
    if s.create_server_cpu_us <= 0.0 {
        return String::new();
    }
    format!(
        "- CPU per create while creating (user + system): the server {} µs, the bench's client side {} µs.",
        us(s.create_server_cpu_us),
        us(s.create_client_cpu_us)
    )
}

/// W3's runs, when there were several (empty otherwise): the figures that
/// follow are the median run's.
fn runs_line(create_seconds: &[f64]) -> String {
    if create_seconds.len() < 2 {
        return String::new();
    }
    let each: Vec<String> = create_seconds.iter().map(|t| format!("{t:.2} s")).collect();
    format!(
        "- {} runs, each on a fresh server; the figures below are the median run's by create time (create times, in run order: {}).",
        create_seconds.len(),
        each.join(", ")
    )
}

fn w4(md: &mut String, d: &Durability) {
    let _ = writeln!(md, "## W4: durability (native server)\n");
    let per_grant = if d.acknowledged_grants > 0 { d.fsyncs as f64 / d.acknowledged_grants as f64 } else { 0.0 };
    for line in [
        format!("- {} clients, each on its own lock.", d.clients),
        format!(
            "- Acknowledged operations (grants, releases and lease operations): **{}**, of which {} grants.",
            thousands(d.acknowledged_ops),
            thousands(d.acknowledged_grants)
        ),
        format!(
            "- fsync + fdatasync calls by the server meanwhile (counted by `strace -f -c`): **{}**, i.e. **{:.3} per acknowledged operation** ({:.3} per grant).",
            thousands(d.fsyncs),
            d.fsyncs_per_op,
            per_grant
        ),
        format!("- Then the server was stopped by {} and restarted on the same data.", or_unknown(&d.stop)),
        format!(
            "- Acknowledged grants found in the restarted server's state: {}; missing (must be 0): {} {}.",
            thousands(d.grants_verified),
            thousands(d.grants_missing),
            check(d.grants_missing == 0)
        ),
        format!(
            "- Highest token acknowledged before the kill: {}; first token granted after the restart (must be larger): {} {}.",
            thousands(d.max_token_before),
            thousands(d.first_token_after),
            check(d.first_token_after > d.max_token_before)
        ),
    ] {
        let _ = writeln!(md, "{line}");
    }
    let _ = writeln!(md);
}

fn w6(md: &mut String, results: &[crate::model::Failover]) {
    let _ = writeln!(md, "## W6: election fail-over\n");
    let ttl = results.first().map_or(0, |f| f.ttl_ms);
    let _ = writeln!(
        md,
        "Three `fencelock elect` candidate processes per engine, each campaigning with a lease TTL of {} ms; an \
         observer in the bench process. The leader's process is signalled, and the time runs until the observer \
         sees a leader of a higher term. The signalled candidate is then replaced, so three compete in every \
         sample.\n",
        thousands(ttl)
    );
    header(md, &["Engine", "Fault", "Samples", "Median", "Max", "Each sample (ms)"], 2);
    for f in results {
        let each: Vec<String> = f.samples_ms.iter().map(|ms| format!("{ms:.0}")).collect();
        row(
            md,
            &[
                f.engine.clone(),
                f.fault.as_str().to_string(),
                f.samples_ms.len().to_string(),
                format!("{:.0} ms", f.median_ms),
                format!("{:.0} ms", f.max_ms),
                each.join(", "),
            ],
        );
    }
    let _ = writeln!(md);
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::model::{EngineInfo, Latency, Machine, Settings};

    pub fn engine(id: &str) -> EngineInfo {
        EngineInfo {
            id: id.into(),
            label: format!("{id} label"),
            version: "1.0".into(),
            durable: id != "redis" && id != "redis-setnx",
            fencing: "global".into(),
            fifo: !id.starts_with("redis-setnx") && id != "pg-advisory",
            cpu_measured: true,
            config: format!("{id} config"),
            shared_connection: false,
        }
    }

    pub fn run(cps: f64, p99: f64) -> RunResult {
        RunResult {
            cycles: (cps * 5.0) as u64,
            seconds: 5.0,
            cycles_per_sec: cps,
            acquire_ms: Latency { p50: p99 / 4.0, p99, p999: p99 * 2.0, max: p99 * 3.0, samples: 1000 },
            cpu_us_per_cycle: Some(1e6 / cps),
            ..RunResult::default()
        }
    }

    /// The seeds' Redis recipe runs on the servers of `redis` and `redis-aof`: their configuration.
    fn on_server(mut e: EngineInfo) -> EngineInfo {
        if let Some(server) = e.id.strip_prefix("redis-setnx").map(|rest| format!("redis{rest}")) {
            e.config = format!("{server} config");
        }
        e
    }

    pub fn w1_cell(engine: &str, clients: usize, cps: f64) -> Cell {
        let runs = vec![run(cps * 0.9, 1.0), run(cps, 1.0), run(cps * 1.1, 1.0)];
        Cell { workload: "W1".into(), engine: engine.into(), clients, locks: clients, median: runs[1].clone(), runs }
    }

    pub fn w2_cell(engine: &str, cps: f64, handoff_p99: f64) -> Cell {
        let m = RunResult {
            handoff_ms: Some(Latency {
                p50: handoff_p99 / 3.0,
                p99: handoff_p99,
                p999: handoff_p99,
                max: handoff_p99,
                samples: 100,
            }),
            fairness: Some(1.02),
            starved_clients: Some(0),
            self_regrant_share: Some(0.0),
            self_regrant_while_others_waited: Some(0),
            ..run(cps, 0.5)
        };
        Cell { workload: "W2".into(), engine: engine.into(), clients: 16, locks: 1, runs: vec![m.clone()], median: m }
    }

    /// A serde-built record, so that fields other helpers add later (zero) do not break these tests.
    pub fn from_json<T: serde::de::DeserializeOwned>(mut v: serde_json::Value) -> T {
        loop {
            match serde_json::from_value::<T>(v.clone()) {
                Ok(t) => return t,
                Err(e) => {
                    let msg = e.to_string();
                    let field = msg
                        .strip_prefix("missing field `")
                        .and_then(|s| s.split('`').next())
                        .unwrap_or_else(|| panic!("{msg}"));
                    v[field] = 0.into();
                }
            }
        }
    }

    pub fn scale(leases: u64, create_seconds: f64) -> Scale {
        from_json(serde_json::json!({
            "leases": leases, "create_seconds": create_seconds, "creates_per_sec": leases as f64 / create_seconds,
            "rss_before": 10_000_000u64, "rss_after": 10_000_000 + leases * 250, "bytes_per_lease": 250.0,
            "renewing": 1000, "renew_ttl_ms": 3000, "renewals": 5000, "renew_seconds": 5.0,
            "renew_cpu_cores": 0.02, "cpu_us_per_renewal": 20.0, "renew_failures": 0,
        }))
    }

    pub fn durability() -> Durability {
        from_json(serde_json::json!({
            "clients": 16, "acknowledged_ops": 9000, "acknowledged_grants": 3000, "fsyncs": 4500, "fsyncs_per_op": 0.5,
            "stop": "SIGKILL", "grants_verified": 3000, "grants_missing": 0, "max_token_before": 3000, "first_token_after": 3001,
        }))
    }

    /// fencelock, redis, redis-aof, etcd, zookeeper, redis-setnx, redis-setnx-aof (on the servers of
    /// redis and redis-aof): W1 at 1 and 64 clients, W2, W3 (20,000 leases) and W4.
    pub fn report() -> Report {
        let ids = ["fencelock", "redis", "redis-aof", "etcd", "zookeeper", "redis-setnx", "redis-setnx-aof"];
        let w1_64 = [120_000.0, 50_000.0, 30_000.0, 5_000.0, 8_000.0, 60_000.0, 80_000.0];
        let w2 = [20_000.0, 15_000.0, 2_000.0, 900.0, 3_000.0, 500.0, 400.0];
        let mut cells = Vec::new();
        for (i, id) in ids.iter().enumerate() {
            cells.push(w1_cell(id, 1, w1_64[i] / 10.0));
            cells.push(w1_cell(id, 64, w1_64[i]));
        }
        for (i, id) in ids.iter().enumerate() {
            cells.push(w2_cell(id, w2[i], if *id == "fencelock" { 0.4 } else { 2.5 }));
        }
        Report {
            started: "2025-01-02T03:04:05Z".into(),
            mode: "full".into(),
            command: "fencelock-bench --runs 3".into(),
            machine: Machine {
                cores: 2,
                cpu: "Test CPU @ 3.0GHz".into(),
                memory_gib: 7.7,
                kernel: "6.1.0".into(),
                data_fs: "ext4".into(),
                rustc: "rustc 1.88.0".into(),
                commit: "abc1234".into(),
            },
            settings: Settings { seconds: 5.0, warmup: 1.0, runs: 3, ttl_ms: 10_000 },
            engines: ids.iter().map(|id| on_server(engine(id))).collect(),
            cells,
            scale: Some(scale(20_000, 0.1)),
            durability: Some(durability()),
            elections: vec![crate::model::Failover {
                engine: "fencelock".into(),
                fault: crate::model::Fault::Kill,
                ttl_ms: 2000,
                samples_ms: vec![2100.0, 1900.4, 2300.0],
                median_ms: 2100.0,
                max_ms: 2300.0,
            }],
            targets: Vec::new(),
        }
    }

    /// Issue 19 §6: the report says how each server ran, once per server
    /// (`ID/shared` and a second engine on one server add no line), and
    /// explains the shared rows when there are some.
    #[test]
    fn configurations_once_per_server() {
        let mut r = report();
        let mut shared = engine("fencelock/shared");
        (shared.config, shared.shared_connection) = ("fencelock config".into(), true);
        r.engines.push(shared);
        let md = markdown(&r);
        let section = md.split("### How each engine runs").nth(1).and_then(|t| t.split("##").next()).unwrap();
        for id in ["fencelock", "redis", "redis-aof", "etcd", "zookeeper"] {
            assert_eq!(section.matches(&format!("- `{id}`: {id} config")).count(), 1, "{section}");
        }
        assert!(!section.contains("shared`:") && !section.contains("redis-setnx"), "{section}");
        assert!(section.contains("TTL asked for (10,000 ms)"), "{section}");
        assert!(md.contains("`ID/shared` is `ID`'s server"), "{md}");
        r.engines.retain(|e| !e.shared_connection);
        assert!(!markdown(&r).contains("`ID/shared`"), "no shared rows, no word on them");
    }

    /// W6 lists each engine and fault with its samples, median and max.
    #[test]
    fn w6_rows_show_every_sample() {
        let md = markdown(&report());
        assert!(md.contains("## W6: election fail-over"), "{md}");
        assert!(md.contains("lease TTL of 2,000 ms"), "{md}");
        assert!(md.contains("| fencelock | SIGKILL | 3 | 2100 ms | 2300 ms | 2100, 1900, 2300 |"), "{md}");
    }

    /// W5: one table per cell kind, only when measured; an engine without
    /// the cell reads n/a, and the handoff figures are the cell's.
    #[test]
    fn w5_tables_when_measured() {
        let mut r = report();
        assert!(!markdown(&r).contains("## W5"), "no W5 cells, no W5 section");
        let mut rw = w2_cell("fencelock", 4321.0, 1.5);
        (rw.workload, rw.locks) = ("W5-rw".into(), 4);
        let mut sem = w2_cell("zookeeper", 1234.0, 3.0);
        sem.workload = "W5-sem".into();
        r.cells.extend([rw, sem]);
        let md = markdown(&r);
        assert!(md.contains("### W5-rw: 16 clients, read-write locks, 4 locks, 10 % exclusive"), "{md}");
        assert!(md.contains("### W5-sem: 16 clients, a semaphore of 4 permits"), "{md}");
        assert!(md.contains("one of the locks at random and takes it"), "one paragraph, no stray spaces: {md}");
        let rw_table = md.split("### W5-rw").nth(1).and_then(|t| t.split("###").next()).unwrap();
        assert!(rw_table.contains("| `fencelock` | 4,321 |"), "{rw_table}");
        assert!(rw_table.contains("| 1.50 |"), "handoff p99 1.5 ms: {rw_table}");
        assert!(rw_table.contains("| `zookeeper` | n/a |"), "{rw_table}");
    }

    fn find<'a>(ts: &'a [Target], prefix: &str) -> &'a Target {
        ts.iter().find(|t| t.name.starts_with(prefix)).unwrap_or_else(|| panic!("no target {prefix:?} in {ts:#?}"))
    }

    /// Ratios are of the medians; met follows the op on both sides of the goal.
    #[test]
    fn report_targets_ratios_and_met() {
        let mut r = report();
        let ts = targets(&r);
        let setnx = find(&ts, "W1 64 clients: fencelock / redis-setnx cycles/s");
        assert_eq!(setnx.measured, Some(120_000.0 / 60_000.0));
        assert_eq!((setnx.op.as_str(), setnx.goal, setnx.met), (">=", 1.0, Some(true)));
        let aof = find(&ts, "W1 64 clients: fencelock / redis-setnx-aof cycles/s");
        assert_eq!((aof.measured, aof.goal, aof.met), (Some(1.5), 2.0, Some(false)));
        let one = find(&ts, "W1 1 client: fencelock / redis-setnx-aof cycles/s");
        assert_eq!((one.measured, one.met), (Some(1.5), Some(true)));
        // The synthetic runs' acquire p50 is the same everywhere: a ratio of 1 meets "<= 1".
        let p50 = find(&ts, "W1 1 client: fencelock / redis-setnx-aof acquire p50");
        assert_eq!((p50.op.as_str(), p50.measured, p50.met), ("<=", Some(1.0), Some(true)));
        assert_eq!(find(&ts, "W1 64 clients: fencelock-3 / fencelock").measured, None, "no group measured");
        r.cells.push(w1_cell(GROUP, 64, 90_000.0));
        let ts = targets(&r);
        let group = find(&ts, "W1 64 clients: fencelock-3 / fencelock cycles/s");
        assert_eq!((group.measured, group.goal, group.met), (Some(0.75), 0.7, Some(true)));
        let p99 = find(&ts, "W2: fencelock handoff p99");
        assert_eq!((p99.measured, p99.met, p99.unit.as_str()), (Some(0.4), Some(true), "ms"));
        // The fastest durable FIFO peer is zookeeper (3,000/s; redis-setnx-aof has no queue): 20,000 / 3,000 = 6.7×.
        let peer = find(&ts, "W2: fencelock / fastest durable peer");
        assert!(peer.name.contains("zookeeper"), "{}", peer.name);
        assert_eq!((peer.measured, peer.met), (Some(20_000.0 / 3_000.0), Some(true)));
        // CPU per cycle is 1e6 / cps in the synthetic runs: fencelock's is below the recipe's.
        let cpu = find(&ts, "W1 64 clients: fencelock / redis-setnx engine CPU");
        assert_eq!((cpu.op.as_str(), cpu.met), ("<=", Some(true)));
        assert!((cpu.measured.unwrap() - 60_000.0 / 120_000.0).abs() < 1e-12);

        // The other side: slower fencelock, worse handoff, a FIFO break, starvation.
        for c in r.cells.iter_mut().filter(|c| c.engine == "fencelock") {
            c.median.cycles_per_sec /= 100.0;
            c.median.cpu_us_per_cycle = Some(1e9);
            c.median.acquire_ms.p50 *= 2.0;
            if let Some(h) = &mut c.median.handoff_ms {
                h.p99 = 1.5;
            }
            c.median.fairness = None;
            c.median.starved_clients = Some(3);
            c.median.self_regrant_while_others_waited = Some(2);
        }
        let ts = targets(&r);
        for name in [
            "W1 64 clients: fencelock / redis-setnx cycles/s",
            "W1 64 clients: fencelock / redis-setnx-aof cycles/s",
            "W1 1 client: fencelock / redis-setnx-aof cycles/s",
            "W1 1 client: fencelock / redis-setnx-aof acquire p50",
            "W2: fencelock handoff p99",
            "W2: fencelock self re-grants",
            "W2: fencelock / fastest",
            "W1 64 clients: fencelock / redis-setnx engine CPU",
        ] {
            assert_eq!(find(&ts, name).met, Some(false), "{name}");
        }
        let fair = find(&ts, "W2: fencelock fairness");
        assert_eq!((fair.measured, fair.met), (None, None), "starved: no fairness figure");
        // A group slower than 0.7 of one node misses its target.
        for c in r.cells.iter_mut().filter(|c| c.engine == "fencelock-3") {
            c.median.cycles_per_sec = 0.5;
        }
        assert_eq!(find(&targets(&r), "W1 64 clients: fencelock-3").met, Some(false));
    }

    /// A missing engine or workload leaves its targets unmeasured, not failed.
    #[test]
    fn report_targets_missing_engine() {
        let mut r = report();
        let gone = ["redis-setnx", "etcd", "zookeeper"];
        r.engines.retain(|e| !gone.contains(&e.id.as_str()));
        r.cells.retain(|c| !gone.contains(&c.engine.as_str()));
        r.scale = None;
        let ts = targets(&r);
        for name in [
            "W1 64 clients: fencelock / redis-setnx cycles/s",
            "W1 64 clients: fencelock-3 / fencelock",
            "W1 64 clients: fencelock / redis-setnx engine CPU",
            "W3: memory",
            "W3: time to create 1,000,000",
        ] {
            let t = find(&ts, name);
            assert_eq!((t.measured, t.met), (None, None), "{name}");
        }
        assert_eq!(find(&ts, "W1 64 clients: fencelock / redis-setnx-aof").met, Some(false));
        // Only redis-aof is left among the durable FIFO peers: 20,000 / 2,000.
        let peer = find(&ts, "W2: fencelock / fastest durable peer");
        assert!(peer.name.contains("redis-aof"), "{}", peer.name);
        assert_eq!(peer.measured, Some(10.0));
        // Without fencelock nothing is measured.
        r.cells.retain(|c| c.engine != "fencelock");
        assert!(targets(&r).iter().all(|t| t.measured.is_none() && t.met.is_none()));
        let none = Report { cells: Vec::new(), engines: Vec::new(), durability: None, ..r };
        assert!(targets(&none).iter().all(|t| t.met.is_none()));
        assert!(!markdown(&none).is_empty());
    }

    /// With fewer than a million leases the create-time goal shrinks in proportion, and the name says so.
    #[test]
    fn report_targets_w3_scaled() {
        let mut r = report();
        let ts = targets(&r);
        let create = find(&ts, "W3: time to create 20,000 leases");
        assert!((create.goal - 0.1).abs() < 1e-12, "{create:?}");
        assert!(create.name.contains("scaled"), "{}", create.name);
        assert_eq!((create.measured, create.met), (Some(0.1), Some(true)));
        assert_eq!(find(&ts, "W3: memory per live lease").met, Some(true));
        r.scale = Some(scale(20_000, 0.15));
        assert_eq!(find(&targets(&r), "W3: time to create 20,000").met, Some(false));
        r.scale = Some(scale(1_000_000, 4.5));
        let full = targets(&r).into_iter().find(|t| t.name.starts_with("W3: time")).unwrap();
        assert_eq!((full.name.as_str(), full.goal, full.met), ("W3: time to create 1,000,000 leases", 5.0, Some(true)));
    }

    /// W3 states the CPU a create cost on each side when it was read, and
    /// says nothing of it in results written before it was.
    #[test]
    fn w3_states_the_cpu_per_create_when_read() {
        let mut s = scale(1_000_000, 21.6);
        let mut md = String::new();
        w3(&mut md, &s);
        assert!(!md.contains("CPU per create"), "{md}");
        (s.create_server_cpu_us, s.create_client_cpu_us) = (29.2, 9.9);
        let mut md = String::new();
        w3(&mut md, &s);
        let line = md.lines().find(|l| l.contains("CPU per create")).unwrap_or_else(|| panic!("{md}"));
        assert!(
            line.contains(&format!("server {} µs", us(29.2))) && line.contains(&format!("side {} µs", us(9.9))),
            "{line}"
        );
    }

    #[test]
    fn report_markdown_contents() {
        let mut r = report();
        r.engines.push(engine("etcd-missing"));
        r.targets = targets(&r);
        let md = markdown(&r);
        for id in engine_ids(&r) {
            assert!(md.contains(&format!("`{id}`")), "engine {id} missing");
        }
        for t in &r.targets {
            assert!(md.contains(&format!("| {} |", t.name)), "target row {:?} missing", t.name);
        }
        // The engine without cells reads n/a in W1 and W2.
        assert!(md.lines().any(|l| l.starts_with("| `etcd-missing` | n/a | n/a")), "{md}");
        assert!(md.contains("| fencelock ÷ `redis` | 2.40× | 1.33× |"), "{md}");
        assert!(md.contains("120,000"), "thousands separators");
        assert!(md.contains("median of 3 runs"));
        assert!(md.contains("✅") && md.contains("❌"));
        assert!(md.contains("## W3") && md.contains("## W4") && md.contains("SIGKILL"));
        assert!(!md.contains("runs, each on a fresh server"), "one W3 run: no line of runs");
        assert!(!md.contains("Quick mode"), "no quick banner in full mode");
        assert!(!md.contains("| errors |"), "no errors column without errors");

        if let Some(s) = &mut r.scale {
            s.create_seconds_runs = vec![0.12, 0.1, 0.3];
        }
        let md = markdown(&r);
        assert!(md.contains("3 runs, each on a fresh server") && md.contains("0.12 s, 0.10 s, 0.30 s"), "{md}");

        r.mode = "quick".into();
        r.cells[0].median.errors = 7;
        r.scale = None;
        let md = markdown(&r);
        assert!(md.contains("**Quick mode"), "{md}");
        assert!(md.contains("errors"));
        assert!(!md.contains("## W3"));
    }

    /// With `fencelock-secure` measured, its cells stand next to the plain
    /// node's, with the ratio: the cost of TLS and authentication.
    #[test]
    fn report_secure_next_to_plain() {
        let mut r = report();
        assert!(!markdown(&r).contains("TLS and authentication next to plaintext"));
        r.engines.insert(1, engine(SECURE));
        r.cells.push(w1_cell(SECURE, 64, 90_000.0));
        r.cells.push(w2_cell(SECURE, 15_000.0, 1.2));
        let md = markdown(&r);
        assert!(md.contains("## fencelock: TLS and authentication next to plaintext (median of 3 runs)"), "{md}");
        assert!(md.contains("| cell | 1 node cycles/s | TLS + token cycles/s | TLS + token ÷ 1 node |"), "{md}");
        assert!(md.contains("| W1, 64 clients | 120,000 | 90,000 | 0.75× |"), "{md}");
        assert!(md.contains("| W2, 16 clients on one lock | 20,000 | 15,000 | 0.75× |"), "{md}");
    }

    /// With `fencelock-3` measured, its cells stand next to the single node's,
    /// with the ratio; without it, no such section.
    #[test]
    fn report_group_next_to_node() {
        let mut r = report();
        assert!(!markdown(&r).contains("3-node group next to 1 node"));
        r.engines.insert(1, engine(GROUP));
        r.cells.push(w1_cell(GROUP, 1, 3_000.0));
        r.cells.push(w1_cell(GROUP, 64, 30_000.0));
        r.cells.push(w2_cell(GROUP, 5_000.0, 1.2));
        let md = markdown(&r);
        assert!(md.contains("## fencelock: 3-node group next to 1 node (median of 3 runs)"), "{md}");
        assert!(md.contains("2 cores, Test CPU @ 3.0GHz"), "the machine is named: {md}");
        assert!(md.contains("| W1, 1 client | 12,000 | 3,000 | 0.25× | 0.25 / 1.00 | 0.25 / 1.00 |"), "{md}");
        assert!(md.contains("| W1, 64 clients | 120,000 | 30,000 | 0.25× |"), "{md}");
        assert!(
            md.contains("| W2, 16 clients on one lock | 20,000 | 5,000 | 0.25× | 0.13 / 0.40 | 0.40 / 1.20 |"),
            "{md}"
        );
        assert!(md.contains("| fencelock ÷ `fencelock-3` | 4.00× | 4.00× |"), "{md}");
        // Targets stay the single node's.
        assert_eq!(targets(&r).len(), targets(&report()).len());
    }

    #[test]
    fn report_number_formats() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_234_567), "1,234,567");
        assert_eq!(rate(12_345.6), "12,346");
        assert_eq!(rate(9.84), "9.8");
        assert_eq!(
            (ms(0.0421), ms(0.42), ms(12.34), ms(2500.0)),
            ("0.042".into(), "0.42".into(), "12.3".into(), "2,500".into())
        );
        assert_eq!(
            (whole(2.0, "×"), whole(1.0, "ms"), whole(300.0, "bytes")),
            ("2×".into(), "1 ms".into(), "300 bytes".into())
        );
        assert_eq!(
            (with_unit(4.0, "×"), with_unit(1.05, "×"), with_unit(2040.8, "×")),
            ("4.00×".into(), "1.05×".into(), "2,041×".into())
        );
        assert_eq!(with_unit(262.4, "bytes"), "262 bytes");
    }
}
