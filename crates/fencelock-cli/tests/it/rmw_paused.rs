//! Issue 3, C3/C4 end to end: worker processes append to one object by
//! read-modify-write under the lock, reading with their fencing token (a fenced
//! read raises the object's mark, so an older holder can no longer write it).
//! A read of the missing object creates no mark (issue 14), so a worker that
//! read "missing" creates it with `If-None-Match: *`: a creation by anyone
//! since its read, a stale holder's included, makes that write fail (`412`).
//! Holders are paused with SIGSTOP between their read and their write for longer
//! than their TTL. At the end the object holds exactly the appends the storage
//! acknowledged, each once: no acknowledged write is lost or duplicated.
//!
//! The workers are this test binary run again with `RMW_WORKER` set.

#![allow(clippy::disallowed_methods)] // the test times processes by the clock

use crate::support;

use std::{
    collections::HashSet,
    io::{BufRead, BufReader, Write},
    process::{Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use fencelock::{Client, Outcome};
use nix::{
    sys::signal::{kill, Signal},
    unistd::Pid,
};
use support::{http_request, Server, Storage};

const TEST: &str = "paused_holders_lose_no_acknowledged_append";
const WORKERS: usize = 3;
const APPENDS: usize = 8;
const TTL: Duration = Duration::from_millis(400);
const PAUSE: Duration = Duration::from_millis(1000);
const MAX_PAUSES: usize = 6;
const LOCK: &str = "rmw";

#[test]
fn paused_holders_lose_no_acknowledged_append() {
    if let Ok(id) = std::env::var("RMW_WORKER") {
        return worker(&id);
    }
    let tmp = tempfile::tempdir().unwrap();
    let server = Server::start(&tmp.path().join("lock"));
    let storage = Storage::start(&tmp.path().join("storage"));
    let (tx, rx) = mpsc::channel::<(usize, String)>();
    let mut workers = Vec::new();
    for w in 0..WORKERS {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                &fencelock_testkit::test_name(module_path!(), TEST),
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env("RMW_WORKER", w.to_string())
            .env("RMW_SERVER", server.url())
            .env("RMW_STORAGE", storage.addr.to_string())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                let _ = tx.send((w, line));
            }
        });
        workers.push(child);
    }
    drop(tx);

    // Pause a worker right after it reads (it waits 50 ms before writing), every
    // other read, up to MAX_PAUSES times; resume it after PAUSE (> TTL).
    let (mut acked, mut rejected, mut pauses, mut reads) = (Vec::new(), 0, 0, 0);
    let deadline = Instant::now() + Duration::from_secs(120);
    while let Ok((w, line)) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        let f: Vec<&str> = line.split_whitespace().collect();
        match f.as_slice() {
            ["RMW", "READ", ..] => {
                reads += 1;
                if reads % 2 == 0 && pauses < MAX_PAUSES {
                    let pid = Pid::from_raw(workers[w].id() as i32);
                    kill(pid, Signal::SIGSTOP).unwrap();
                    pauses += 1;
                    std::thread::spawn(move || {
                        std::thread::sleep(PAUSE);
                        let _ = kill(pid, Signal::SIGCONT);
                    });
                }
            }
            ["RMW", "ACK", entry, ..] => acked.push(entry.to_string()),
            ["RMW", "REJ", ..] => rejected += 1,
            _ => {}
        }
    }
    for mut w in workers {
        assert!(w.wait().unwrap().success(), "a worker failed");
    }
    assert!(Instant::now() < deadline, "workers did not finish in time");

    let (status, body) = http_request(storage.addr, "GET", "/objects/list", &[], b"").unwrap();
    assert_eq!(status, 200, "{body}");
    let final_list: Vec<String> = serde_json::from_str(&body).unwrap();
    let unique: HashSet<&String> = final_list.iter().collect();
    assert_eq!(unique.len(), final_list.len(), "an append appears twice: {final_list:?}");
    let acked_set: HashSet<&String> = acked.iter().collect();
    assert_eq!(unique, acked_set, "the object must hold exactly the acknowledged appends");
    // The faults must have happened (else the run proves nothing).
    assert!(pauses >= 3, "only {pauses} pauses happened");
    assert!(rejected >= 1, "no stale write was attempted and rejected ({pauses} pauses)");
    assert_eq!(acked.len() + rejected, WORKERS * APPENDS, "every attempt was answered");
}

/// One worker: APPENDS read-modify-write cycles under the lock.
fn worker(id: &str) {
    let url = std::env::var("RMW_SERVER").unwrap();
    let storage: std::net::SocketAddr = std::env::var("RMW_STORAGE").unwrap().parse().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    rt.block_on(async move {
        let client = Client::connect(&url).await.unwrap();
        for i in 0..APPENDS {
            let guard = loop {
                match client.lock(LOCK).ttl(TTL).wait(Duration::from_secs(30)).acquire().await {
                    Ok(Outcome::Acquired(g)) => break g,
                    _ => tokio::time::sleep(Duration::from_millis(20)).await,
                }
            };
            let mut fencing =
                vec![("Fencing-Lock", LOCK.to_string()), ("Fencing-Token", guard.token().unwrap().to_string())];
            let (status, body) = http_request(storage, "GET", "/objects/list", &fencing, b"").unwrap();
            if status == 404 {
                fencing.push(("If-None-Match", "*".to_string()));
            }
            let mut list: Vec<String> = match status {
                200 => serde_json::from_str(&body).unwrap(),
                404 => Vec::new(),
                // A fenced read can be refused too: a later holder already read.
                409 => {
                    say(&format!("REJ read-{id}-{i} {}", guard.token().unwrap()));
                    continue;
                }
                s => panic!("read failed: {s} {body}"),
            };
            say(&format!("READ {id} {}", guard.token().unwrap()));
            tokio::time::sleep(Duration::from_millis(50)).await;
            let entry = format!("w{id}-{i}");
            list.push(entry.clone());
            let bytes = serde_json::to_vec(&list).unwrap();
            let (status, body) = http_request(storage, "PUT", "/objects/list", &fencing, &bytes).unwrap();
            match status {
                200 | 201 => say(&format!("ACK {entry} {}", guard.token().unwrap())),
                409 | 412 => say(&format!("REJ {entry} {}", guard.token().unwrap())),
                s => panic!("write failed: {s} {body}"),
            }
            let _ = guard.release().await;
        }
    });
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "RMW {line}");
    let _ = out.flush();
}
