//! The leader of a 3-node group cut off from the other two (network
//! namespaces the test creates; needs root): the majority elects a new leader
//! and goes on, the isolated old leader grants nothing and its clients get
//! errors within their deadlines, and after the heal it follows again.
//!
//! Invariants: INV-1 (one holder: the minority cannot grant), INV-2 (tokens
//! increase across the partition), INV-10 (the held grant survives),
//! INV-11 (its holder hears of no loss while its lease lives).

#![allow(clippy::disallowed_methods)] // the test times processes by the clock

use crate::support;

use std::time::{Duration, Instant};

use support::cluster::{
    assert_increasing, assert_not_lost, client, cycle, hold, holder_token, Cluster, NEW_LEADER_WITHIN,
};
use support::netns::Net;

fn net() -> Option<Net> {
    match Net::create(3) {
        Ok(n) => Some(n),
        Err(e) if std::env::var_os("FENCELOCK_SKIP_NETNS").is_some() => {
            eprintln!("SKIPPED (FENCELOCK_SKIP_NETNS is set): {e}");
            None
        }
        Err(e) => panic!("this test needs network namespaces (run as root; FENCELOCK_SKIP_NETNS=1 skips it): {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_isolated_leader_grants_nothing_and_the_majority_goes_on() {
    let Some(net) = net() else { return };
    let c = Cluster::start_in(&net);
    let client = client(&c).await;
    let held = hold(&client, "held").await;
    let mut tokens = vec![held.token().unwrap(), cycle(&client, "probe").await.expect("a grant before the partition")];

    let old = c.must_lead("before the partition");
    let old_id = c.nodes[old].id;
    net.isolate(old_id as usize);
    let (_, took) = c
        .wait_leader(Some(old_id), Duration::from_secs(10))
        .unwrap_or_else(|| c.fail("the majority elected no leader"));
    assert!(took <= NEW_LEADER_WITHIN + Duration::from_secs(1), "the majority took {took:?} to elect a leader");
    tokens.push(cycle(&client, "probe").await.unwrap_or_else(|| c.fail("no grant from the majority")));

    // A client inside the minority, given only the old leader: an error
    // within its deadline (10 s RPC timeout, retrying the one server it
    // knows), never a grant, never a hang.
    let started = Instant::now();
    let out = net
        .command(old_id as usize, support::bin())
        .args(["acquire", "minority", "--ttl", "5s", "--server", &format!("http://{}", c.nodes[old].grpc)])
        .output()
        .expect("run fencelock acquire in the minority");
    let took = started.elapsed();
    assert!(!out.status.success(), "the minority granted: {}", support::stdout(&out));
    assert_eq!(out.status.code(), Some(70), "{}", support::stderr(&out));
    assert!(took < Duration::from_secs(15), "the minority's client waited {took:?}");
    // The old leader itself said why: it knows it is cut off.
    assert!(support::stderr(&out).contains("has not heard from a majority"), "{}", support::stderr(&out));

    net.heal(old_id as usize);
    let start = Instant::now();
    loop {
        let s = c.nodes[old].status();
        let follows = s.as_ref().is_some_and(|s| s["state"] == "follower" && s["leader"].as_u64() != Some(old_id));
        if follows {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "the old leader did not follow after the heal: {s:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    tokens.push(cycle(&client, "probe").await.unwrap_or_else(|| c.fail("no grant after the heal")));
    assert_increasing(&tokens);
    assert_not_lost(&held).await;
    let leader = c.must_lead("after the heal");
    assert_eq!(holder_token(&c, leader, "held"), Some(held.token().unwrap()), "INV-10: the held grant is gone");
    assert_eq!(holder_token(&c, leader, "minority"), None, "INV-1: the minority's acquire took effect");
}
