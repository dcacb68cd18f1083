//! Watch in a 3-node group of real processes (the README's secure setup: TLS,
//! auth file): followers serve watches from their own applied state with the
//! same revisions as the leader, a watcher whose node is killed resumes on
//! another with no gap and no duplicate, and `fencelock watch --json` prints
//! the same events.
#![allow(clippy::disallowed_methods)] // the CLI test reads a child's stdout by the clock

use crate::support;

use std::io::BufRead as _;
use std::process::{Command, Stdio};
use std::time::Duration;

use fencelock::{Client, ClientTls, Revision, WatchEvent, WatchKind, WatchStream};
use support::bin;
use support::cluster::{client, cycle, Cluster};

/// Upper bound of every wait; only reached when a test fails.
const WAIT: Duration = Duration::from_secs(30);
/// The lock whose grant ends every list of events.
const END: &str = "jobs/zz-end";

/// A client of the nodes at `idx` (in that order), over TLS with the client token.
async fn client_on(c: &Cluster, idx: &[usize]) -> Client {
    let urls: Vec<String> = idx.iter().map(|&i| format!("https://{}", c.nodes[i].grpc)).collect();
    let s = c.secure.as_ref().expect("a secure group");
    let tls = ClientTls::from_files(&s.ca(), None, None).expect("the CA");
    let b = Client::builder(urls.join(",")).rpc_timeout(Duration::from_secs(5)).tls(tls).token(s.client_token.clone());
    b.connect().await.expect("connect")
}

/// The events of `w` up to and including the grant of [`END`].
async fn until_end(w: &mut WatchStream) -> Vec<WatchEvent> {
    let mut out = Vec::new();
    let all = async {
        loop {
            let e = w.next_event().await.expect("the watch goes on").expect("an event");
            let end = e.kind == WatchKind::Granted && e.lock == END;
            out.push(e);
            if end {
                return;
            }
        }
    };
    tokio::time::timeout(WAIT, all).await.expect("the end event within the limit");
    out
}

/// `n` lock cycles (granted, released) on `jobs/{tag}-{i}`, each retried
/// until it goes through (a fail-over may be in progress).
async fn cycles(c: &Client, tag: &str, n: usize) {
    for i in 0..n {
        let name = format!("jobs/{tag}-{i}");
        tokio::time::timeout(WAIT, async { while cycle(c, &name).await.is_none() {} })
            .await
            .expect("a cycle goes through");
    }
}

fn assert_no_gap_no_dup(events: &[WatchEvent]) {
    assert!(events.windows(2).all(|p| p[0].revision < p[1].revision), "revisions must strictly increase: {events:?}");
}

/// Rules: a follower serves the same events at the same revisions as the
/// leader; a watcher whose serving node (the leader) is killed resumes on
/// another node with no gap and no duplicate, across the leader change;
/// `fencelock watch --json --from` prints the same events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_serve_and_watchers_survive_the_death_of_their_node() {
    let mut c = Cluster::start(3);
    let leader = c.must_lead("at start");
    let follower = (leader + 1) % 3;
    let other = (leader + 2) % 3;
    let writer = client(&c).await;
    let zero = Some(Revision { index: 0, seq: 0 });

    // Served by the leader first (it fails over to the others when it dies),
    // and by a follower.
    let on_leader = client_on(&c, &[leader, follower, other]).await;
    let mut w_leader = on_leader.watch_from("jobs/", zero);
    let on_follower = client_on(&c, &[follower]).await;
    let mut w_follower = on_follower.watch_from("jobs/", zero);

    cycles(&writer, "before", 3).await;
    c.nodes[leader].kill();
    c.wait_leader(Some(c.nodes[leader].id), Duration::from_secs(20)).unwrap_or_else(|| c.fail("no new leader"));
    cycles(&writer, "after", 3).await;
    cycle(&writer, END).await; // released too: the list ends at its grant

    let through_kill = until_end(&mut w_leader).await;
    let from_follower = until_end(&mut w_follower).await;
    // The reference: a fresh watch of the whole history on a survivor.
    let on_other = client_on(&c, &[other]).await;
    let reference = until_end(&mut on_other.watch_from("jobs/", zero)).await;

    assert_no_gap_no_dup(&reference);
    for name in (0..3).flat_map(|i| [format!("jobs/before-{i}"), format!("jobs/after-{i}")]) {
        let granted = reference.iter().any(|e| e.kind == WatchKind::Granted && e.lock == name);
        assert!(granted, "no grant of {name} in {reference:?}");
    }
    assert_eq!(from_follower, reference, "a follower serves the leader's sequence");
    assert_eq!(through_kill, reference, "no gap and no duplicate across the kill of the serving node");

    // The CLI, from the revision of the fourth event: exactly the rest.
    let from = reference[3].revision.to_string();
    let printed = cli_watch(&c, &from, reference.len() - 3);
    let want: Vec<String> = reference[3..]
        .iter()
        .map(|e| format!("{} {} {} {} {}", e.revision, e.kind, e.lock, e.lease_id, e.token))
        .collect();
    assert_eq!(printed, want);
}

/// `fencelock watch jobs/ --json --from FROM` until it printed `n` lines:
/// each as "revision kind lock lease token".
fn cli_watch(c: &Cluster, from: &str, n: usize) -> Vec<String> {
    let s = c.secure.as_ref().expect("a secure group");
    let mut child = Command::new(bin())
        .args(["watch", "jobs/", "--json", "--from", from, "--server", &c.urls()])
        .args(["--tls-ca", s.ca().to_str().unwrap()])
        .env_remove("FENCELOCK_SERVER")
        .env("FENCELOCK_AUTH_TOKEN", &s.client_token)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("run fencelock watch");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let mut out = Vec::new();
    while out.len() < n {
        let line = rx.recv_timeout(WAIT).unwrap_or_else(|_| panic!("fencelock watch printed {out:?} only"));
        let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
        out.push(format!(
            "{} {} {} {} {}",
            v["revision"].as_str().unwrap(),
            v["kind"].as_str().unwrap(),
            v["lock"].as_str().unwrap(),
            v["lease_id"],
            v["token"]
        ));
    }
    let _ = child.kill();
    let _ = child.wait();
    out
}
