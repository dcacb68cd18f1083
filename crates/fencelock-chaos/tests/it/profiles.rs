//! The short profile of the fault-injection suite, as CI runs it: each test
//! runs `fencelock-chaos profile short` for one backend (fixed seeds) and
//! requires every run to pass — C2 tokens, C3 no stale accept, C4 no lost
//! update, C6 acknowledged grants survive restarts, S1/S4/S6, and C8 proof
//! that the faults happened (a run without proof is inconclusive and fails);
//! in the election runs (K1 on a node, L1 on the group) also E1–E3; in the
//! shared runs (readers and writers of a read-write lock, K1 on a node, L1
//! on the group) also R1 (fenced reads see the last accepted write) and R2
//! (the holders the server reports fit: a writer alone); in the multi run
//! (K1 on a node, workers taking three locks at once or one of them) also
//! M1 (every multi grant whole, its tokens consecutive in the order asked),
//! with C3 and C4 judged per lock and its object.
//! Against peers without durable tokens or fencing, violations are findings
//! and do not fail the run. fencelock's own runs (a node, and the 3-node group)
//! run with TLS and an auth file (`--tls`), the workers as an identity that may
//! only take, check and read the run's locks: A1 must pass in each (the
//! service's audit logs were read and refused nothing), so no run passes
//! because auth stopped its work. Their plaintext path is covered by the
//! other crates' tests and the mutants below.

use std::path::Path;
use std::process::Command;

fn profile(args: &[&str], out: &Path) -> (bool, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_fencelock-chaos"))
        .args(["profile"])
        .args(args)
        .arg("--out")
        .arg(out)
        .output()
        .expect("run fencelock-chaos");
    let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    (o.status.success(), text)
}

/// Every verdict.json under `out`.
fn verdicts(out: &Path) -> Vec<serde_json::Value> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(out).unwrap() {
        let f = e.unwrap().path().join("verdict.json");
        if f.exists() {
            v.push(serde_json::from_slice(&std::fs::read(f).unwrap()).unwrap());
        }
    }
    v
}

fn short(backend: &str, runs: usize) {
    short_with(backend, runs, false, None);
}

/// The short profile against `backend`, under TLS and auth if `tls`; only
/// its `part` (`K/N`, see `profile --part`) if given.
fn short_with(backend: &str, runs: usize, tls: bool, part: Option<&str>) {
    let tmp = tempfile::tempdir().unwrap();
    let mut args = vec!["short", "--backends", backend];
    if tls {
        args.push("--tls");
    }
    if let Some(part) = part {
        args.extend(["--part", part]);
    }
    let (ok, text) = profile(&args, tmp.path());
    assert!(ok, "the short profile against {backend} failed:\n{text}");
    let vs = verdicts(tmp.path());
    assert_eq!(vs.len(), runs, "{text}");
    for v in &vs {
        assert_eq!(v["passed"], true, "{v:#}");
        let faults: u64 = v["stats"]["faults"].as_object().map_or(0, |m| m.values().filter_map(|x| x.as_u64()).sum());
        assert!(faults > 0, "no fault injected: {v:#}");
        // With fencing tokens, the scenario's stale writes must reach the fence
        // (as C8 requires); a backend without them (Redlock) has nothing to fence with.
        if v["info"]["fencing"] == true {
            let needed = v["info"]["min_stale_rejects"].as_u64().unwrap();
            // In shared mode a reader paused at its read is refused as a writer is at its write.
            let reads =
                if v["info"]["shared"] == true { v["stats"]["stale_reads_rejected"].as_u64().unwrap() } else { 0 };
            let fenced = v["stats"]["stale_rejected"].as_u64().unwrap() + reads;
            assert!(fenced >= needed, "too few stale operations fenced: {v:#}");
        }
        if tls {
            assert_secure(v);
        }
        if v["info"]["election"] == true {
            assert_election(v);
        }
        if v["info"]["shared"] == true {
            assert_shared(v);
        }
        if v["info"]["multi"].as_u64().unwrap_or(0) > 0 {
            assert_multi(v);
        }
    }
    if backend == "fencelock" {
        assert_redb_log(&vs, part.is_none());
    }
    let report = std::fs::read_to_string(tmp.path().join("safety.md")).unwrap();
    assert!(report.contains(backend), "{report}");
}

/// Both log engines keep their crash and power-loss runs (issue 19): the
/// others run on the default engine, the segment log (no engine in their
/// backend label), and K4 and S5 also run on redb (`--log redb`, labelled
/// so); that they passed is checked with every run. A part of the profile
/// (`whole` false) holds some of them: only K4 and S5 of its runs may be on
/// redb (that the whole profile has both on both engines is the unit test
/// `the_short_profile_crashes_both_log_engines`).
fn assert_redb_log(vs: &[serde_json::Value], whole: bool) {
    let scenarios_on = |redb: bool| -> Vec<&str> {
        let on = |v: &&serde_json::Value| v["info"]["backend"].as_str().unwrap().contains("redb log") == redb;
        vs.iter().filter(on).map(|v| v["info"]["scenario"].as_str().unwrap()).collect()
    };
    if whole {
        for redb in [true, false] {
            let scenarios = scenarios_on(redb);
            assert!(scenarios.contains(&"K4") && scenarios.contains(&"S5"), "redb log {redb}: {scenarios:?}");
        }
        assert_eq!(scenarios_on(true).len(), 2, "only K4 and S5 on redb");
    }
    assert!(scenarios_on(true).iter().all(|s| ["K4", "S5"].contains(s)), "only K4 and S5 on redb: {vs:#?}");
}

/// A run under TLS and auth: reported as such, the workers' grants made, and
/// A1 passed (evaluated, not skipped: the audit logs were read).
fn assert_secure(v: &serde_json::Value) {
    if v["info"]["scenario"] != "P2" {
        let backend = v["info"]["backend"].as_str().unwrap();
        assert!(backend.contains(" (TLS, auth"), "{v:#}");
    }
    let grants = v["stats"]["acquires"]["ok"].as_u64().unwrap() + v["stats"]["campaigns"]["ok"].as_u64().unwrap();
    assert!(grants > 0, "{v:#}");
    let a1 = v["checks"].as_array().unwrap().iter().find(|c| c["id"] == "A1").expect("A1");
    assert_eq!(a1["status"], "pass", "{v:#}");
}

/// An election run (issue 17): workers were elected and wrote as leaders,
/// the observers saw leaders, and E1 (one leader per term, older terms
/// fenced), E2 (observers' terms never go back) and E3 (no phantom leader)
/// were evaluated and passed.
fn assert_election(v: &serde_json::Value) {
    assert!(v["info"]["backend"].as_str().unwrap().contains("election"), "{v:#}");
    assert!(v["stats"]["campaigns"]["ok"].as_u64().unwrap() > 0, "{v:#}");
    assert!(v["stats"]["writes"]["ok"].as_u64().unwrap() > 0, "{v:#}");
    assert!(v["stats"]["leader_events"].as_u64().unwrap() > 0, "{v:#}");
    for id in ["E1", "E2", "E3"] {
        let c = v["checks"].as_array().unwrap().iter().find(|c| c["id"] == id).unwrap_or_else(|| panic!("{id}"));
        assert_eq!(c["status"], "pass", "{v:#}");
    }
}

/// A shared run (issue 18): readers and writers both did their work and R1
/// passed; on the fencelock server, whose holders an observer can list, the
/// observer saw readers together and R2 passed too (a peer has no such list:
/// R2 is not applicable there).
fn assert_shared(v: &serde_json::Value) {
    let backend = v["info"]["backend"].as_str().unwrap();
    assert!(backend.contains("shared"), "{v:#}");
    assert!(v["stats"]["reads"]["ok"].as_u64().unwrap() > v["stats"]["writes"]["ok"].as_u64().unwrap(), "{v:#}");
    assert!(v["stats"]["writes"]["ok"].as_u64().unwrap() > 0, "{v:#}");
    let check = |id: &str| {
        let c = v["checks"].as_array().unwrap().iter().find(|c| c["id"] == id).unwrap_or_else(|| panic!("{id}"));
        c["status"].as_str().unwrap().to_string()
    };
    assert_eq!(check("R1"), "pass", "{v:#}");
    if backend.starts_with("fencelock") {
        assert!(v["stats"]["polls_shared"].as_u64().unwrap() > 0, "no poll saw readers together: {v:#}");
        assert_eq!(check("R2"), "pass", "{v:#}");
    } else {
        assert_eq!(check("R2"), "not-applicable", "{v:#}");
    }
}

/// A multi run (atomic multi-locks, issue 18): multi grants and single
/// grants both made, writes ok, and M1 passed (evaluated: not inconclusive).
fn assert_multi(v: &serde_json::Value) {
    assert!(v["info"]["backend"].as_str().unwrap().contains("multi-lock of"), "{v:#}");
    assert!(v["stats"]["multi_grants"].as_u64().unwrap() > 0, "{v:#}");
    assert!(v["stats"]["single_grants"].as_u64().unwrap() > 0, "{v:#}");
    assert!(v["stats"]["writes"]["ok"].as_u64().unwrap() > 0, "{v:#}");
    let m1 = v["checks"].as_array().unwrap().iter().find(|c| c["id"] == "M1").expect("M1");
    assert_eq!(m1["status"], "pass", "{v:#}");
}

/// K1, K2, K3, K4 (kills and failpoints), S1, S4, S5, P1 (malformed and
/// forged peer messages, from a member's certificate), P2 (forged peers
/// without one), K1 in election mode (leaders paused at their write), K1
/// in shared mode (readers paused at their read, writers at their write) and
/// K1 in multi mode (multi-holders paused at their first write with all
/// their locks), all on the segment log (the default engine: crashes around
/// its fsync, its files rolled back and torn at each power loss), and K4 and
/// S5 again with the log in redb (`--log redb`) against fencelock under TLS
/// and auth. In two parts of 7 runs (`--part 1/2`, `2/2`), so that CI runs
/// them side by side (each about two minutes).
#[test]
fn short_profile_fencelock_part_1() {
    short_with("fencelock", 7, true, Some("1/2"));
}

/// The other half of the node's short profile (see `short_profile_fencelock_part_1`).
#[test]
fn short_profile_fencelock_part_2() {
    short_with("fencelock", 7, true, Some("2/2"));
}

/// P2 alone, briefly (6 s of rounds): the server under TLS and auth refuses
/// every well-formed Vote, AppendEntries and rollback snapshot from a sender
/// without a node certificate (UNAUTHENTICATED, counted), its term does not
/// move, and the run's checks pass.
#[test]
fn p2_forged_peer_under_tls() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("P2");
    let o = Command::new(env!("CARGO_BIN_EXE_fencelock-chaos"))
        .args(["run", "--scenario", "P2", "--seed", "9", "--duration", "6s", "--out"])
        .arg(&out)
        .output()
        .expect("run fencelock-chaos");
    let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "P2 failed:\n{text}");
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("verdict.json")).unwrap()).unwrap();
    assert_eq!(v["passed"], true, "{v:#}");
    let evidence = &v["stats"]["evidence"];
    for what in ["refused", "term-unmoved", "serving"] {
        assert!(evidence[what].as_u64().unwrap_or(0) > 0, "no {what}: {v:#}");
    }
    // Two senders, at least Vote and AppendEntries each, in every round.
    assert!(evidence["refused"].as_u64().unwrap() >= 4, "{v:#}");
    let harness = std::fs::read_to_string(out.join("history/harness.jsonl")).unwrap();
    assert!(!harness.contains("not-refused") && !harness.contains("term-moved"), "{harness}");
}

/// L1 (leader kills), L2 (leader isolation), L3 (a node cut off), L1 in
/// election mode and L1 in shared mode against a 3-node fencelock group under TLS and auth: every
/// node with its own node certificate, Raft on peer ports of their own
/// (through the nemesis's proxies), clients and admin calls with their tokens.
#[test]
fn short_profile_fencelock3() {
    short_with("fencelock3", 5, true, None);
}

/// K1 with workers that use only the HTTP/JSON API (`fencelock+json://`):
/// paused past their TTL, their stale writes refused by the fence.
#[test]
fn short_profile_fencelock_json() {
    short("fencelock-json", 1);
}

/// K1 and K4 against Redis (no persistence: its lost grants are findings),
/// and K1 in election mode and in shared mode.
#[test]
fn short_profile_redis() {
    short("redis", 4);
}

/// K1 and K4 against Redlock (no token: its violations are findings).
#[test]
fn short_profile_redlock() {
    short("redlock", 2);
}

/// K1, K4, and K1 in election mode (etcd's election recipe) and in shared mode.
#[test]
fn short_profile_etcd() {
    short("etcd", 4);
}

/// K1, K4, and K1 in election mode (Curator's LeaderSelector recipe) and in
/// shared mode (Curator's read-write lock).
#[test]
fn short_profile_zookeeper() {
    short("zk", 4);
}

/// K1, K4, and K1 in election mode (the lease table's election) and in
/// shared mode.
#[test]
fn short_profile_postgres() {
    short("postgres", 4);
}

/// C9: each mutant must turn its scenario red, in the check that guards
/// against it: storage with fencing off → stale accepts or lost updates (C3,
/// C4); a token counter only in memory → token inversions (C2); the
/// dead-waiter check removed → a grant to a dead waiter (S1); reads served
/// unfenced in shared mode → a stale read accepted (C3); multi-locks taken
/// one lock after another → multi grants whose tokens are not consecutive
/// (M1), or crossed orders deadlocked until their waits end (S6); the
/// segment log acknowledging before its fsync, under power loss → a grant
/// not read back after the restart (C6) or no heal (S6). The six mutants
/// run in two parts of three (`--part`), side by side in CI.
#[test]
fn every_mutant_turns_the_suite_red_part_1() {
    mutants("1/2");
}

/// The other half of the mutants (see `every_mutant_turns_the_suite_red_part_1`).
#[test]
fn every_mutant_turns_the_suite_red_part_2() {
    mutants("2/2");
}

/// Part `part` of the mutants profile: each of its three mutants red where
/// it must be.
fn mutants(part: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let (ok, text) = profile(&["mutants", "--part", part], tmp.path());
    assert!(ok, "a mutant survived:\n{text}");
    let vs = verdicts(tmp.path());
    assert_eq!(vs.len(), 3, "{text}");
    for v in &vs {
        assert_eq!(v["passed"], false, "{v:#}");
        let red: Vec<&str> = v["checks"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["status"] == "fail")
            .map(|c| c["id"].as_str().unwrap())
            .collect();
        let expect: &[&str] = match v["info"]["mutant"].as_str().unwrap() {
            "fencing-off" => &["C3", "C4"],
            // Forgetting the counter re-issues low tokens: seen as a token
            // inversion (C2), or, since the engine keys holds by token, as
            // holders that do not survive the restart (C6). Since leaders raise
            // a wall-clock token floor, runs have shown the C6 form. When the
            // fence refuses every re-issued token, nothing is written after the
            // restart: no heal (S6) is the only red (seen in CI at c78ed89).
            "memory-token" => &["C2", "C6", "S6"],
            "dead-waiter" => &["S1"],
            "reads-unfenced" => &["C3"],
            // Taking the locks one by one shows as multi grants with another
            // grant between their tokens (M1); its crossed orders also
            // deadlock until the waits end, stalling the writes (S6).
            "multi-one-by-one" => &["M1", "S6"],
            // The segment log acknowledging before its fsync: after a power
            // loss the node refuses its log (behind its committed index), so
            // the grant live at the kill is not read back (C6) and nothing is
            // written after (S6); were the node to start, tokens could repeat (C2).
            "wal-no-sync" => &["C6", "S6", "C2"],
            m => panic!("unknown mutant {m}"),
        };
        assert!(
            red.iter().any(|id| expect.contains(id)),
            "mutant {} red in {red:?}, expected one of {expect:?}",
            v["info"]["mutant"]
        );
    }
}
