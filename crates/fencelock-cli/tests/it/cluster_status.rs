//! `fencelock cluster status` of a 3-node group of real processes (issue 16:
//! it printed `MATCHED -` for every member). Only the leader knows how far
//! each member has replicated (openraft reports `replication` on the leader
//! alone), and `status` printed the view of the first listed member that
//! answered, a follower's as often as not, leader row included. It now shows
//! the leader's view when any listed member leads.
#![allow(clippy::disallowed_methods)] // the test waits for processes by the clock

use crate::support;

use std::time::{Duration, Instant};

use support::cluster::Cluster;
use support::{stderr, stdout};

/// With every member listed, a follower first, `status` shows the leader's
/// view: for each member the last log index known to be replicated to it, no
/// further than the leader's own last index. Both in `--json` and in the
/// table. A follower listed alone shows its own view, which has none, and
/// says who knows.
#[test]
fn the_leader_shows_a_matched_index_for_each_follower() {
    let c = Cluster::start(3);
    let leader = c.must_lead("at the start");
    let follower = (0..3).find(|i| *i != leader).expect("a follower");
    let mut order = vec![follower];
    order.extend((0..3).filter(|i| *i != follower));
    let admin = order.iter().map(|i| c.nodes[*i].http.to_string()).collect::<Vec<_>>().join(",");
    let status = |args: &[&str]| {
        let secure = c.secure.as_ref().expect("a secure group");
        let out = std::process::Command::new(support::bin())
            .args(["cluster", "status"])
            .args(args)
            .args(["--tls-ca", secure.ca().to_str().unwrap()])
            .env("FENCELOCK_AUTH_TOKEN", &secure.admin_token)
            .output()
            .expect("run fencelock cluster status");
        assert!(out.status.success(), "cluster status {args:?}: {}", stderr(&out));
        stdout(&out)
    };
    // Replication to a follower is reported once it has answered; bounded.
    let start = Instant::now();
    let v = loop {
        let v: serde_json::Value = serde_json::from_str(&status(&["--admin", &admin, "--json"])).expect("json");
        let members = v["members"].as_array().expect("members").clone();
        if members.iter().all(|m| m["matched"].is_u64()) || start.elapsed() > Duration::from_secs(10) {
            break v;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!((v["state"].as_str(), v["node_id"].as_u64()), (Some("leader"), Some(c.nodes[leader].id)), "{v}");
    let last = v["last_log_index"].as_u64().expect("the leader's last log index");
    let members = v["members"].as_array().expect("members");
    assert_eq!(members.len(), 3, "{v}");
    for m in members {
        let matched = m["matched"].as_u64().unwrap_or_else(|| panic!("no matched index for member {}: {v}", m["id"]));
        assert!(matched >= 1 && matched <= last, "member {}: matched {matched}, leader's last {last}", m["id"]);
    }

    let table = status(&["--admin", &admin]);
    assert!(!table.contains("known to the leader only"), "{table}");
    let rows: Vec<&str> = table.lines().skip(2).collect();
    assert_eq!(rows.len(), 3, "{table}");
    for row in rows {
        let matched = row.split_whitespace().last().unwrap_or_default();
        assert!(matched.parse::<u64>().is_ok(), "a row without a matched index: {row:?}\n{table}");
    }

    let alone = c.nodes[follower].http.to_string();
    let v: serde_json::Value = serde_json::from_str(&status(&["--admin", &alone, "--json"])).expect("json");
    assert_eq!(v["state"], "follower", "{v}");
    assert!(v["members"].as_array().expect("members").iter().all(|m| m["matched"].is_null()), "{v}");
    let table = status(&["--admin", &alone]);
    assert!(table.contains(&format!("MATCHED is known to the leader only (node {}", c.nodes[leader].id)), "{table}");
}
