//! `fencelock-bench --quick` end to end, in three parts (the native engines,
//! the Redis peers, the other peers): every engine is started, every cell of every workload runs
//! and completes cycles without errors, and the report,
//! JSON and charts are written. No figure is asserted (timings belong in the
//! benchmark's output, not in tests); what is checked is that each cell ran
//! and that the native server's durability check found every grant. The
//! 3-node group (`fencelock-3`) runs W1 and W2 like every other engine; W5
//! runs on the engines that declare shared locks and semaphores. By default
//! the native engines are measured per process and shared (`ID/shared`, one
//! connection for every client), the peers per process.

use std::{path::Path, process::Command};

use serde_json::Value;

const ENGINES: [&str; 12] = [
    "fencelock",
    "fencelock-secure",
    "fencelock-http",
    "fencelock-3",
    "redis",
    "redis-aof",
    "etcd",
    "zookeeper",
    "postgres",
    "pg-advisory",
    "redis-setnx",
    "redis-setnx-aof",
];

/// The engines whose backends declare leader election (W6 runs on them).
const ELECTING: &[&str] =
    &["fencelock", "fencelock-secure", "fencelock-3", "redis", "redis-aof", "etcd", "zookeeper", "postgres"];

/// The engines whose backends declare shared locks (W5-rw runs on them) and
/// semaphores (W5-sem); the others have no such cell. PostgreSQL's advisory
/// mode has shared locks but no semaphores; the seeds' Redis recipe
/// (`redis-setnx`, `redis-setnx-aof`) has neither.
const SHARING: &[&str] = &[
    "fencelock",
    "fencelock-secure",
    "fencelock-http",
    "fencelock-3",
    "redis",
    "redis-aof",
    "etcd",
    "zookeeper",
    "postgres",
    "pg-advisory",
];
const SEMAPHORES: &[&str] = &[
    "fencelock",
    "fencelock-secure",
    "fencelock-http",
    "fencelock-3",
    "redis",
    "redis-aof",
    "etcd",
    "zookeeper",
    "postgres",
];

/// The native engines, measured in both client modes by default.
const NATIVE: &[&str] = &["fencelock", "fencelock-secure", "fencelock-http", "fencelock-3"];

/// The engines of a report of `engines`, in order: each engine, and a
/// native one's `ID/shared` right after it.
fn measured(engines: &[&str]) -> Vec<String> {
    let mut ids = Vec::new();
    for e in engines {
        ids.push(e.to_string());
        if NATIVE.contains(e) {
            ids.push(format!("{e}/shared"));
        }
    }
    ids
}

/// `fencelock-bench --quick` on `engines` with `workloads`: its results.json
/// and results.md (and the directory holding them and the charts).
fn quick(engines: &[&str], workloads: &str) -> (Value, String, tempfile::TempDir) {
    let out = tempfile::tempdir().unwrap();
    let status = Command::new(env!("CARGO_BIN_EXE_fencelock-bench"))
        .args(["--quick", "--seconds", "0.3", "--clients", "1,16", "--engines", &engines.join(",")])
        .args(["--workloads", workloads, "--out"])
        .arg(out.path())
        .status()
        .expect("run fencelock-bench");
    assert!(status.success(), "fencelock-bench --quick failed: {status}");
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("results.json")).unwrap()).unwrap();
    let md = std::fs::read_to_string(out.path().join("results.md")).unwrap();
    (report, md, out)
}

/// Every W1, W2 and W5 cell of `engines` ran cycles without errors, W6 ran
/// one kill and one freeze on each that elects, and the report and charts
/// name them.
fn every_cell_ran(engines: &[&str], report: &Value, md: &str, out: &Path) {
    assert_eq!(report["mode"], "quick");
    let ids: Vec<&str> = report["engines"].as_array().unwrap().iter().map(|e| e["id"].as_str().unwrap()).collect();
    let measured = measured(engines);
    assert_eq!(ids, measured);

    let cells = report["cells"].as_array().unwrap();
    for engine in measured.iter().map(String::as_str) {
        for (workload, clients) in [("W1", 1), ("W1", 16), ("W2", 16)] {
            let cell = cells
                .iter()
                .find(|c| c["engine"] == engine && c["workload"] == workload && c["clients"] == clients)
                .unwrap_or_else(|| panic!("no {workload} cell with {clients} clients for {engine}"));
            let m = &cell["median"];
            assert!(m["cycles"].as_u64().unwrap() > 0, "{workload}/{clients} on {engine}: no cycle: {m}");
            assert_eq!(m["errors"], 0, "{workload}/{clients} on {engine}: errors: {m}");
            assert!(m["cpu_us_per_cycle"].as_f64().is_some(), "{engine}: engine CPU not read");
            if workload == "W2" {
                assert!(m["handoff_ms"]["samples"].as_u64().unwrap() > 0, "{engine}: no handoff measured");
            }
        }
    }

    for engine in measured.iter().map(String::as_str) {
        let server = engine.split('/').next().unwrap();
        for (workload, declaring) in [("W5-rw", SHARING), ("W5-sem", SEMAPHORES)] {
            let cell = cells.iter().find(|c| c["engine"] == engine && c["workload"] == workload);
            let m = match (declaring.contains(&server), cell) {
                (false, None) => continue,
                (false, Some(_)) => panic!("{engine} does not declare {workload}'s locks but has a cell"),
                (true, None) => panic!("no {workload} cell for {engine}"),
                (true, Some(cell)) => &cell["median"],
            };
            assert!(m["cycles"].as_u64().unwrap() > 0, "{workload} on {engine}: no cycle: {m}");
            assert_eq!(m["errors"], 0, "{workload} on {engine}: errors: {m}");
            assert!(m["handoff_ms"]["samples"].as_u64().unwrap() > 0, "{workload} on {engine}: no handoff: {m}");
        }
    }

    // W6 ran on every engine with elections, one kill and one freeze each.
    let elections = report["elections"].as_array().unwrap();
    for engine in engines.iter().filter(|e| ELECTING.contains(e)) {
        for fault in ["Kill", "Stop"] {
            let f = elections
                .iter()
                .find(|f| f["engine"] == *engine && f["fault"] == fault)
                .unwrap_or_else(|| panic!("no W6 {fault} result for {engine}: {elections:?}"));
            let samples = f["samples_ms"].as_array().unwrap();
            assert_eq!(samples.len(), 1, "{f}");
            assert!(samples[0].as_f64().unwrap() > 0.0, "{f}");
        }
    }

    for engine in &measured {
        assert!(md.contains(engine.as_str()), "results.md does not mention {engine}");
    }
    assert!(md.contains("### How each engine runs"), "results.md does not say how the engines run");
    for chart in ["w1-throughput", "w1-latency"] {
        let p = out.join(format!("{chart}.svg"));
        assert!(non_empty(&p), "{} missing", p.display());
    }
}

/// The native engines in both client modes, every workload: W3 (scale) and
/// W4 (durability) run on natives only. One of two halves of the engine list
/// (CI runs the halves side by side, two threads each).
#[test]
fn quick_run_measures_every_cell_of_the_native_engines() {
    let (report, md, out) = quick(NATIVE, "W1,W2,W3,W4,W5,W6");
    every_cell_ran(NATIVE, &report, &md, out.path());
    assert!(md.contains("3-node group next to 1 node"), "results.md does not put the group next to the node");

    let scale = &report["scale"];
    assert_eq!(scale["leases"], 20_000, "W3 created every lease: {scale}");
    assert_eq!(scale["renew_failures"], 0, "{scale}");
    assert!(scale["renewals"].as_u64().unwrap() > 0, "{scale}");
    assert!(scale["rss_after"].as_u64().unwrap() > scale["rss_before"].as_u64().unwrap(), "{scale}");

    let d = &report["durability"];
    assert!(d["fsyncs"].as_u64().unwrap() > 0, "strace saw no fsync: {d}");
    assert!(d["grants_verified"].as_u64().unwrap() > 0, "{d}");
    assert_eq!(d["grants_missing"], 0, "an acknowledged grant was lost: {d}");
    assert!(d["first_token_after"].as_u64().unwrap() > d["max_token_before"].as_u64().unwrap(), "{d}");
}

/// The Redis peers (fencelock's FIFO recipe and the seeds' `SET NX PX`
/// recipe, each with and without AOF), in W1, W2, W5 and W6: a third of the
/// engine list.
const REDIS_PEERS: &[&str] = &["redis", "redis-aof", "redis-setnx", "redis-setnx-aof"];

/// The peers other than Redis, each through the recipe its users run.
fn other_peers() -> Vec<&'static str> {
    ENGINES.iter().copied().filter(|e| !NATIVE.contains(e) && !REDIS_PEERS.contains(e)).collect()
}

#[test]
fn quick_run_measures_every_cell_of_the_redis_peers() {
    let (report, md, out) = quick(REDIS_PEERS, "W1,W2,W5,W6");
    every_cell_ran(REDIS_PEERS, &report, &md, out.path());
}

/// etcd, ZooKeeper and PostgreSQL (both recipes), through the recipes their
/// users run, in W1, W2, W5 and W6: the last third. Together the three
/// tests cover every engine once.
#[test]
fn quick_run_measures_every_cell_of_the_other_peers() {
    let peers = other_peers();
    assert!(peers.contains(&"etcd") && peers.contains(&"zookeeper") && peers.contains(&"pg-advisory"), "{peers:?}");
    let (report, md, out) = quick(&peers, "W1,W2,W5,W6");
    every_cell_ran(&peers, &report, &md, out.path());
}

/// The three quick runs together start every engine the bench measures by
/// default (`--engines`' default in its `--help`), each once: an engine added
/// to the bench but to no quick run fails here.
#[test]
fn the_quick_runs_cover_every_engine() {
    let help = Command::new(env!("CARGO_BIN_EXE_fencelock-bench")).arg("--help").output().unwrap();
    assert!(help.status.success(), "{help:?}");
    let help = String::from_utf8(help.stdout).unwrap();
    let engines = help.split("--engines").nth(1).expect("--engines in --help");
    // clap lists a default of many values with spaces, and may wrap the line at any of them.
    let default = engines.split("[default:").nth(1).and_then(|d| d.split(']').next()).expect("--engines' default");
    let mut all: Vec<&str> = default.split(|c: char| c == ',' || c.is_whitespace()).filter(|e| !e.is_empty()).collect();
    let mut covered: Vec<&str> = NATIVE.iter().chain(REDIS_PEERS).copied().chain(other_peers()).collect();
    all.sort_unstable();
    covered.sort_unstable();
    assert_eq!(covered, all);
}

fn non_empty(p: &Path) -> bool {
    std::fs::metadata(p).map(|m| m.len() > 0).unwrap_or(false)
}
