//! `Client::watch` against a real single-node server: the events of the
//! issue's list, in order, with their tokens and revisions, and a resume from
//! a revision in the middle. (Fail-over across a 3-node group is in
//! `fencelock-cli/tests/it/watch.rs`, which runs real server processes.)

use crate::support;

use fencelock::{Client, Revision, WatchEvent, WatchKind, WatchStream};
use fencelock_proto::v1 as pb;
use fencelock_proto::v1::lock_client::LockClient;
use support::{eventually, fastrand_id, waiters, within, Server};
use tonic::transport::Channel;

type Raw = LockClient<Channel>;

async fn lease(raw: &mut Raw, ttl_ms: u64) -> u64 {
    let req = pb::GrantLeaseRequest { request_id: fastrand_id(), ttl_ms };
    raw.grant_lease(req).await.unwrap().into_inner().lease_id
}

async fn acquire(raw: &mut Raw, lease_id: u64, lock: &str, wait_ms: u64) -> u64 {
    let req =
        pb::AcquireRequest { request_id: fastrand_id(), lease_id, lock: lock.into(), wait_ms, ..Default::default() };
    match raw.acquire(req).await.unwrap().into_inner().outcome {
        Some(pb::acquire_response::Outcome::Acquired(a)) => a.token,
        other => panic!("acquire {lock}: {other:?}"),
    }
}

async fn take(w: &mut WatchStream, n: usize) -> Vec<WatchEvent> {
    let mut out = Vec::new();
    while out.len() < n {
        let e = within("a watch event", w.next_event()).await.expect("the watch goes on").expect("an event");
        out.push(e);
    }
    out
}

fn shape(events: &[WatchEvent]) -> Vec<(WatchKind, &str, u64, u64)> {
    events.iter().map(|e| (e.kind, e.lock.as_str(), e.lease_id, e.token)).collect()
}

/// Rules: a watcher sees granted, queued, released, granted (to the waiter),
/// revoked and expired, in the order they were applied, with the grants'
/// tokens; locks outside the prefix are not sent; revisions strictly
/// increase; a resume from a revision in the middle gives exactly the rest.
#[tokio::test]
async fn a_watch_sees_every_transition_in_order_and_resumes_exactly() {
    let server = Server::start().await;
    let client = server.client().await;
    let mut raw = server.raw().await;
    // From the start of the history: nothing the test does can come before it.
    let mut w = client.watch_from("jobs/", Some(Revision { index: 0, seq: 0 }));

    let (l1, l2, l3) = (lease(&mut raw, 60_000).await, lease(&mut raw, 60_000).await, lease(&mut raw, 100).await);
    let t1 = acquire(&mut raw, l1, "jobs/a", 0).await;
    acquire(&mut raw, l1, "other/x", 0).await;
    let mut raw2 = server.raw().await;
    let waiting = tokio::spawn(async move { acquire(&mut raw2, l2, "jobs/a", 30_000).await });
    eventually("the second lease queues", || async { waiters(&client, "jobs/a").await == 1 }).await;
    raw.release(pb::ReleaseRequest { request_id: fastrand_id(), lease_id: l1, lock: "jobs/a".into(), token: t1 })
        .await
        .unwrap();
    let t2 = within("the queued grant", waiting).await.unwrap();
    raw.revoke_lease(pb::RevokeLeaseRequest { request_id: fastrand_id(), lease_id: l2 }).await.unwrap();
    // l3 is never kept alive: its grant ends by expiry.
    let t3 = acquire(&mut raw, l3, "jobs/b", 0).await;

    let events = take(&mut w, 7).await;
    use WatchKind::*;
    assert_eq!(
        shape(&events),
        vec![
            (Granted, "jobs/a", l1, t1),
            (Queued, "jobs/a", l2, 0),
            (Released, "jobs/a", l1, t1),
            (Granted, "jobs/a", l2, t2),
            (Revoked, "jobs/a", l2, t2),
            (Granted, "jobs/b", l3, t3),
            (Expired, "jobs/b", l3, t3),
        ]
    );
    assert_eq!(events[2].reason, "released");
    assert!(events.iter().all(|e| e.identity.is_empty()), "identity is not wired yet");
    assert!(events.windows(2).all(|p| p[0].revision < p[1].revision), "{events:?}");

    let mid = events[2].revision;
    let mut resumed = client.watch_from("jobs/", Some(mid));
    assert_eq!(take(&mut resumed, 5).await, events[2..].to_vec());
    server.stop().await;
}

/// A role that may acquire and read every lock.
const APP_ROLE: &str = "[roles.app]\nrules = [{ prefix = \"\", verbs = [\"acquire\", \"read\"] }]\n";

/// The auth file's entry of the token `t`, called `name`, with `role`.
fn token_entry(name: &str, t: &fencelock_server::auth::NewToken, role: &str) -> String {
    format!("[[tokens]]\nname = \"{name}\"\nid = \"{}\"\nhash = \"{}\"\nroles = [\"{role}\"]\n", t.id, t.hash)
}

/// A node whose auth file (in `dir`) is `auth`; and its URL.
async fn start_with_auth(dir: &std::path::Path, auth: &str) -> (fencelock_server::Running, String) {
    std::fs::write(dir.join("auth.toml"), auth).unwrap();
    let mut config = fencelock_server::Config::for_test(dir.join("data"));
    config.auth_file = Some(dir.join("auth.toml"));
    let running = fencelock_server::start(config).await.unwrap();
    let url = format!("http://{}", running.grpc_addr);
    (running, url)
}

/// The `id:` and `data:` of the first `n` events of `GET path` (SSE), sent
/// with `extra` headers.
async fn sse(addr: std::net::SocketAddr, path: &str, extra: &str, n: usize) -> Vec<(String, serde_json::Value)> {
    within("SSE events", async {
        let mut lines = sse_open(addr, path, extra).await;
        let (mut out, mut id) = (Vec::new(), None);
        while out.len() < n {
            let line = lines.next_line().await.unwrap().expect("more events");
            if let Some(v) = line.strip_prefix("id: ") {
                id = Some(v.to_string());
            } else if let Some(d) = line.strip_prefix("data: ") {
                let data: serde_json::Value = serde_json::from_str(d).unwrap();
                out.push((id.take().expect("an id before the data"), data));
            }
        }
        out
    })
    .await
}

/// Rules: `GET /v1/watch` streams the events as SSE, each with `id:` its
/// revision (the same as the RPC's) and its kind; `Last-Event-ID` resumes
/// right after that event.
#[tokio::test]
async fn the_sse_endpoint_streams_events_with_revision_ids_and_resumes() {
    let server = Server::start().await;
    let client = server.client().await;
    let mut raw = server.raw().await;
    let mut w = client.watch_from("jobs/", Some(Revision { index: 0, seq: 0 }));
    let l = lease(&mut raw, 60_000).await;
    let t1 = acquire(&mut raw, l, "jobs/a", 0).await;
    raw.release(pb::ReleaseRequest { request_id: fastrand_id(), lease_id: l, lock: "jobs/a".into(), token: t1 })
        .await
        .unwrap();
    let t2 = acquire(&mut raw, l, "jobs/b", 0).await;
    let rpc = take(&mut w, 3).await;

    let got = sse(server.http_addr(), "/v1/watch?prefix=jobs/&from=0", "", 3).await;
    let ids: Vec<String> = got.iter().map(|(id, _)| id.clone()).collect();
    assert_eq!(ids, rpc.iter().map(|e| e.revision.to_string()).collect::<Vec<_>>());
    // Tokens are decimal strings, as everywhere in the HTTP API.
    let token = |d: &serde_json::Value| d["token"].as_str().and_then(|t| t.parse::<u64>().ok()).unwrap();
    let kinds: Vec<(&str, &str, u64)> =
        got.iter().map(|(_, d)| (d["kind"].as_str().unwrap(), d["lock"].as_str().unwrap(), token(d))).collect();
    assert_eq!(kinds, vec![("granted", "jobs/a", t1), ("released", "jobs/a", t1), ("granted", "jobs/b", t2)]);

    let resumed = sse(server.http_addr(), "/v1/watch?prefix=jobs/", &format!("Last-Event-ID: {}\r\n", ids[0]), 2).await;
    assert_eq!(resumed.iter().map(|(id, _)| id.clone()).collect::<Vec<_>>(), ids[1..].to_vec());
    server.stop().await;
}

/// Rules (authorization, as `ListLocks`): a watch needs `read` on its whole
/// prefix; a token that may read only `jobs/` sees the events of `jobs/` and
/// none of `other/`, and is refused a watch of `""` or of `other/`; a caller
/// without a token is refused.
#[tokio::test]
async fn a_token_limited_to_a_prefix_sees_only_that_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let (app, reader) = (fencelock_server::auth::new_token().unwrap(), fencelock_server::auth::new_token().unwrap());
    let file = format!(
        "{APP_ROLE}[roles.jobs]\nrules = [{{ prefix = \"jobs/\", verbs = [\"read\"] }}]\n{}{}",
        token_entry("app", &app, "app"),
        token_entry("reader", &reader, "jobs")
    );
    let (running, url) = start_with_auth(dir.path(), &file).await;
    let as_token = |t: &str| Client::builder(url.clone()).token(t.to_string()).connect();
    let (app_client, reader_client) = (as_token(&app.token).await.unwrap(), as_token(&reader.token).await.unwrap());
    let zero = Some(Revision { index: 0, seq: 0 });
    let mut w = reader_client.watch_from("jobs/", zero);

    // Held (a dropped guard releases): the grants are the only events.
    let mut guards = Vec::new();
    for name in ["other/x", "jobs/a", "other/y", "jobs/b"] {
        guards.push(support::acquired(within("acquire", app_client.lock(name).acquire()).await.unwrap()));
    }
    let tokens: Vec<u64> = guards.iter().map(|g| g.token().unwrap()).collect();
    let seen = take(&mut w, 2).await;
    let seen: Vec<_> = seen.iter().map(|e| (e.kind, e.lock.as_str(), e.token)).collect();
    assert_eq!(seen, vec![(WatchKind::Granted, "jobs/a", tokens[1]), (WatchKind::Granted, "jobs/b", tokens[3])]);

    for prefix in ["", "other/"] {
        let err = within("a refusal", reader_client.watch_from(prefix, zero).next_event()).await;
        assert!(matches!(err, Some(Err(fencelock::Error::PermissionDenied(_)))), "{prefix:?}: {err:?}");
    }
    let anonymous = Client::connect(url.clone()).await.unwrap();
    let err = within("a refusal", anonymous.watch_from("jobs/", zero).next_event()).await;
    assert!(matches!(err, Some(Err(fencelock::Error::Unauthenticated(_)))), "{err:?}");
    within("shutdown", running.shutdown()).await;
}

/// Issue 36. Rules: `Client::report_refusal` (a fence's report, needs
/// `check`) is one `WriteRefused` event of the lock, with the refused token,
/// the fence's highest, the resource and the reporter's authenticated
/// identity; a report no fence makes (the refused token not below the
/// highest) is `InvalidArgument`, and a caller without `check` is
/// `PermissionDenied`: neither shows in the watch.
#[tokio::test]
async fn a_fence_s_report_is_a_write_refused_event() {
    let dir = tempfile::tempdir().unwrap();
    let (app, fence) = (fencelock_server::auth::new_token().unwrap(), fencelock_server::auth::new_token().unwrap());
    let file = format!(
        "{APP_ROLE}[roles.fence]\nrules = [{{ prefix = \"\", verbs = [\"check\"] }}]\n{}{}",
        token_entry("app", &app, "app"),
        token_entry("storage-1", &fence, "fence")
    );
    let (running, url) = start_with_auth(dir.path(), &file).await;
    let as_token = |t: &str| Client::builder(url.clone()).token(t.to_string()).connect();
    let (app_client, fence_client) = (as_token(&app.token).await.unwrap(), as_token(&fence.token).await.unwrap());
    let mut w = app_client.watch_from("orders", Some(Revision { index: 0, seq: 0 }));
    eventually("the node serves", || async { app_client.describe("orders").await.is_ok() }).await;

    let bad = fence_client.report_refusal("orders", 9, 9, "orders-42").await;
    assert!(matches!(bad, Err(fencelock::Error::InvalidArgument(_))), "{bad:?}");
    let denied = app_client.report_refusal("orders", 5, 9, "orders-42").await;
    assert!(matches!(denied, Err(fencelock::Error::PermissionDenied(_))), "{denied:?}");
    within("a report", fence_client.report_refusal("orders", 5, 9, "orders-42")).await.unwrap();
    within("a report", fence_client.report_refusal("orders", 6, 9, "")).await.unwrap();

    let got = take(&mut w, 2).await;
    let seen: Vec<_> = got
        .iter()
        .map(|e| (e.kind, e.lock.as_str(), e.token, e.highest_token, e.resource.as_str(), e.identity.as_str()))
        .collect();
    let refused = |token, resource| (WatchKind::WriteRefused, "orders", token, 9, resource, "storage-1");
    assert_eq!(seen, vec![refused(5, "orders-42"), refused(6, "")]);
    assert_eq!(got[0].kind.to_string(), "write_refused");
    within("shutdown", running.shutdown()).await;
}

/// Rule: a node keeps a bounded history (`--watch-history`); a watch that
/// resumes from a revision it no longer holds ends with `Compacted`, naming
/// the oldest revision still held, and a watch from that revision goes on
/// with the newest events, values and identities included.
#[tokio::test]
async fn a_resume_older_than_the_history_is_compacted_and_the_oldest_revision_resumes() {
    let server = Server::start_with(|c| c.watch_history = 16).await;
    let client = server.client().await;
    let mut live = client.watch("hist/");
    let guard = support::acquired(client.lock("hist/a").value(&b"v0"[..]).identity("me").acquire().await.unwrap());
    let first = take(&mut live, 1).await.remove(0);
    assert_eq!((first.kind, first.value.as_slice(), first.identity.as_str()), (WatchKind::Granted, &b"v0"[..], "me"));
    for i in 1..=40 {
        assert!(guard.set_value(format!("v{i}")).await.unwrap());
    }
    let changes = take(&mut live, 40).await;
    let values: Vec<_> = changes.iter().map(|e| (e.kind, String::from_utf8(e.value.clone()).unwrap())).collect();
    let expected: Vec<_> = (1..=40).map(|i| (WatchKind::ValueChanged, format!("v{i}"))).collect();
    assert_eq!(values, expected, "every new value, in order, once");
    let mut stale = client.watch_from("hist/", Some(first.revision));
    let oldest = match within("compacted", stale.next_event()).await {
        Some(Err(fencelock::Error::Compacted { oldest })) => oldest,
        other => panic!("a resume from before the history: {other:?}"),
    };
    assert!(oldest > first.revision, "{oldest} after {}", first.revision);
    let mut resumed = client.watch_from("hist/", Some(oldest));
    let from_oldest = take(&mut resumed, 1).await.remove(0);
    assert_eq!(from_oldest.revision, oldest);
    assert!(from_oldest.value.starts_with(b"v"), "{from_oldest:?}");
    drop(guard);
}

/// Rule (as on a session stream): an open watch authenticates its caller
/// again before each batch of events, against the auth file as it is then. A
/// token removed from the file ends its open watch with `Unauthenticated`,
/// over gRPC and over SSE, and the event that found it removed is not sent.
#[tokio::test]
async fn a_token_removed_from_the_auth_file_ends_its_open_watch() {
    let dir = tempfile::tempdir().unwrap();
    let (app, reader) = (fencelock_server::auth::new_token().unwrap(), fencelock_server::auth::new_token().unwrap());
    let app_only = format!("{APP_ROLE}{}", token_entry("app", &app, "app"));
    let with_reader = format!("{app_only}{}", token_entry("reader", &reader, "app"));
    let (running, url) = start_with_auth(dir.path(), &with_reader).await;
    let file = dir.path().join("auth.toml");
    let as_token = |t: &str| Client::builder(url.clone()).token(t.to_string()).connect();
    let (app_client, reader_client) = (as_token(&app.token).await.unwrap(), as_token(&reader.token).await.unwrap());
    let mut w = reader_client.watch_from("jobs/", Some(Revision { index: 0, seq: 0 }));
    let first = support::acquired(within("acquire", app_client.lock("jobs/a").acquire()).await.unwrap());
    let seen = take(&mut w, 1).await;
    assert_eq!(shape(&seen), vec![(WatchKind::Granted, "jobs/a", first.lease_id(), first.token().unwrap())]);
    let bearer = format!("Authorization: Bearer {}\r\n", reader.token);
    let mut sse_stream = sse_open(running.http_addr, "/v1/watch?prefix=jobs/", &bearer).await;

    // A file's change is seen by its modification time (one-second granularity on some file systems).
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    std::fs::write(&file, &app_only).unwrap();
    eventually("the file is read again", || async {
        reader_client
            .lock("elsewhere/probe")
            .acquire()
            .await
            .is_err_and(|e| matches!(e, fencelock::Error::Unauthenticated(_)))
    })
    .await;
    let second = support::acquired(within("acquire", app_client.lock("jobs/b").acquire()).await.unwrap());
    let end = within("the watch ends", w.next_event()).await;
    assert!(matches!(end, Some(Err(fencelock::Error::Unauthenticated(_)))), "{end:?} (jobs/b was {second:?})");
    let sse_end = within("the SSE watch ends", sse_until_error(&mut sse_stream)).await;
    assert!(sse_end.0.is_empty(), "no event after the removal: {:?}", sse_end.0);
    assert!(sse_end.1.contains("not authenticated"), "{}", sse_end.1);
    drop((first, second));
    within("shutdown", running.shutdown()).await;
}

type SseLines = tokio::io::Lines<tokio::io::BufReader<tokio::net::TcpStream>>;

/// `GET path` (SSE) with `extra` headers, its 200 read.
async fn sse_open(addr: std::net::SocketAddr, path: &str, extra: &str) -> SseLines {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\n{extra}\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut lines = BufReader::new(s).lines();
    let status = lines.next_line().await.unwrap().expect("a status line");
    assert!(status.starts_with("HTTP/1.1 200"), "GET {path}: {status}");
    lines
}

/// The kinds of the events before the first `event: error`, and that error's data.
async fn sse_until_error(lines: &mut SseLines) -> (Vec<String>, String) {
    let (mut kinds, mut error) = (Vec::new(), false);
    loop {
        let line = lines.next_line().await.unwrap().expect("more of the stream");
        match line.strip_prefix("event: ") {
            Some("error") => error = true,
            Some(kind) => kinds.push(kind.to_string()),
            None if error && line.starts_with("data: ") => return (kinds, line["data: ".len()..].to_string()),
            None => {}
        }
    }
}
