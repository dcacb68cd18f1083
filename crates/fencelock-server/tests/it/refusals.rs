//! Fences' refusal reports (issue 36, part 3b) on a node started in this
//! process, with authentication on: `ReportRefusal` (gRPC) and
//! `POST /v1/locks/{name}/refusals` (HTTP) each make one `write_refused`
//! watch event of the lock and one audit line; a report is refused before
//! anything is written when the caller lacks `check`, when it is malformed,
//! and beyond the node's rate of reports.
//!
//! - INV-9 a refused request changes nothing: not the log, not the watch.

use std::time::Duration;

use fencelock_http::{Client as Http, Request};
use fencelock_proto::v1::{self as pb, lock_client::LockClient};
use fencelock_server::{Config, Running};
use serde_json::{json, Value};
use tonic::Code;

use crate::support::{self, add_token, request_id, Authed, Bearer};

/// A node with an auth file and an audit log, and the tokens of the file.
struct Node {
    running: Running,
    dir: tempfile::TempDir,
    /// `check` on every lock: a storage server that reports.
    reporter: String,
    /// `read` on every lock.
    watcher: String,
    /// `read` on "jobs/" only.
    jobs_reader: String,
    /// `acquire` and `read` on every lock, no `check`.
    worker: String,
    admin: String,
}

async fn start_node() -> Node {
    let dir = tempfile::tempdir().unwrap();
    let p = |f: &str| dir.path().join(f);
    let mut text = String::from(
        "[roles.verifier]\nrules = [{ prefix = \"\", verbs = [\"check\"] }]\n\
         [roles.reader]\nrules = [{ prefix = \"\", verbs = [\"read\"] }]\n\
         [roles.jobs-reader]\nrules = [{ prefix = \"jobs/\", verbs = [\"read\"] }]\n\
         [roles.worker]\nrules = [{ prefix = \"\", verbs = [\"acquire\", \"read\"] }]\n",
    );
    let reporter = add_token(&mut text, "storage-1", "verifier");
    let watcher = add_token(&mut text, "watcher", "reader");
    let jobs_reader = add_token(&mut text, "jobs-watcher", "jobs-reader");
    let worker = add_token(&mut text, "worker", "worker");
    let admin = add_token(&mut text, "root", "admin");
    std::fs::write(p("auth.toml"), text).unwrap();
    let mut config = Config::for_test(p("data"));
    config.auth_file = Some(p("auth.toml"));
    config.audit_log = Some(p("audit.log"));
    let running = support::try_start_config(&config).await.expect("start");
    let node = Node { running, dir, reporter, watcher, jobs_reader, worker, admin };
    node.wait_ready().await;
    node
}

impl Node {
    async fn grpc(&self, token: &str) -> Authed {
        let url = format!("http://{}", self.running.grpc_addr);
        let channel = tonic::transport::Endpoint::from_shared(url).unwrap().connect().await.expect("connect");
        LockClient::with_interceptor(channel, Bearer(Some(token.to_string())))
    }

    fn http(&self, token: Option<&str>) -> Http {
        let http = Http::new(self.running.http_addr).timeout(Duration::from_secs(30));
        match token {
            Some(t) => http.bearer(t).unwrap(),
            None => http,
        }
    }

    /// Until the node grants a lease; revoked at once, so that no expiry of
    /// it lands in a test's count of log entries.
    async fn wait_ready(&self) {
        let mut c = self.grpc(&self.admin).await;
        for _ in 0..400 {
            if let Ok(r) = c.grant_lease(pb::GrantLeaseRequest { request_id: request_id(), ttl_ms: 100 }).await {
                let revoke = pb::RevokeLeaseRequest { request_id: request_id(), lease_id: r.into_inner().lease_id };
                let _ = c.revoke_lease(revoke).await;
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("the node did not become ready");
    }

    async fn last_log_index(&self) -> Option<u64> {
        support::last_log_index(&self.running).await
    }

    /// The audit log's lines, once the node is shut down (which writes them
    /// out).
    async fn shutdown_and_audit(self) -> Vec<Value> {
        let log = self.dir.path().join("audit.log");
        self.running.shutdown().await;
        let text = std::fs::read_to_string(log).unwrap();
        text.lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect()
    }
}

fn report(lock: &str, refused: u64, highest: u64, resource: &str) -> pb::ReportRefusalRequest {
    pb::ReportRefusalRequest {
        lock: lock.into(),
        refused_token: refused,
        highest_token: highest,
        resource: resource.into(),
    }
}

/// `POST /v1/locks/{lock}/refusals` with `body`: status and JSON answer.
async fn post_report(http: &Http, lock: &str, body: &str) -> (u16, Value) {
    let headers = [("Content-Type", "application/json".to_string())];
    let path = format!("/v1/locks/{lock}/refusals");
    let req = Request { method: "POST", path: &path, headers: &headers, body: body.as_bytes() };
    let r = http.send(req).await.unwrap_or_else(|e| panic!("POST {path}: {e}"));
    (r.status, serde_json::from_slice(&r.body).unwrap_or_else(|_| json!({ "text": r.text() })))
}

/// A watch of `prefix` as `token` from now, past its START message.
async fn watch(node: &Node, token: &str, prefix: &str) -> tonic::Streaming<pb::WatchEvent> {
    let mut c = node.grpc(token).await;
    let req = pb::WatchRequest { prefix: prefix.into(), name: String::new(), from: None };
    let mut events = c.watch(req).await.expect("watch").into_inner();
    let start = events.message().await.unwrap().expect("a START message");
    assert_eq!(start.kind, pb::WatchEventKind::Start as i32);
    events
}

/// The next event of `events`, within 10 s.
async fn next(events: &mut tonic::Streaming<pb::WatchEvent>) -> pb::WatchEvent {
    let got = tokio::time::timeout(Duration::from_secs(10), events.message()).await;
    got.expect("an event within 10 s").expect("the watch goes on").expect("the watch goes on")
}

/// (kind, lock, token, highest_token, resource, identity, lease_id) of a
/// watch event.
fn shape(e: &pb::WatchEvent) -> (i32, &str, u64, u64, &str, &str, u64) {
    (e.kind, e.lock.as_str(), e.token, e.highest_token, e.resource.as_str(), e.identity.as_str(), e.lease_id)
}

/// The shape of the `write_refused` event of `storage-1`'s report.
fn refused<'a>(
    lock: &'a str,
    token: u64,
    highest: u64,
    resource: &'a str,
) -> (i32, &'a str, u64, u64, &'a str, &'a str, u64) {
    (pb::WatchEventKind::WriteRefused as i32, lock, token, highest, resource, "storage-1", 0)
}

/// Rule: a report over gRPC and one over HTTP each make exactly one
/// `write_refused` event of their lock, with the refused token, the fence's
/// highest, the resource and the reporter's authenticated identity, and one
/// audit line (`report_refusal`, verb `check`, the lock, "token R refused,
/// highest H, resource X"). A watcher that may read only "jobs/" sees the
/// report on "jobs/x" and not the one on "orders" (the watch's filter covers
/// reports), and may not watch every lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_is_one_write_refused_event_and_one_audit_line() {
    let node = start_node().await;
    let mut all = watch(&node, &node.watcher, "").await;
    let mut jobs = watch(&node, &node.jobs_reader, "jobs/").await;
    let mut c = node.grpc(&node.jobs_reader).await;
    let req = pb::WatchRequest { prefix: String::new(), name: String::new(), from: None };
    assert_eq!(c.watch(req).await.map(drop).unwrap_err().code(), Code::PermissionDenied);

    let mut reporter = node.grpc(&node.reporter).await;
    let answer = reporter.report_refusal(report("orders", 5, 9, "orders-42")).await.expect("reported").into_inner();
    assert!(answer.recorded);
    let http = node.http(Some(&node.reporter));
    let (status, body) = post_report(&http, "jobs%2Fx", r#"{"refused_token": "7", "highest_token": 8}"#).await;
    assert_eq!((status, &body), (200, &json!({ "recorded": true })));

    let (first, second) = (next(&mut all).await, next(&mut all).await);
    assert_eq!(shape(&first), refused("orders", 5, 9, "orders-42"));
    assert_eq!(shape(&second), refused("jobs/x", 7, 8, ""));
    let at = |e: &pb::WatchEvent| e.revision.map(|r| (r.index, r.seq)).expect("an event has its revision");
    assert!(at(&first) < at(&second), "{first:?} {second:?}");
    let seen = next(&mut jobs).await;
    assert_eq!((shape(&seen), seen.revision), (refused("jobs/x", 7, 8, ""), second.revision));
    // Nothing more: a marker event comes next on both watches.
    reporter.report_refusal(report("jobs/end", 1, 2, "")).await.expect("reported");
    assert_eq!(next(&mut all).await.lock, "jobs/end");
    assert_eq!(next(&mut jobs).await.lock, "jobs/end");

    let lines = node.shutdown_and_audit().await;
    let reports: Vec<_> = lines.iter().filter(|l| l["action"] == "report_refusal").collect();
    assert_eq!(reports.len(), 3, "{lines:#?}");
    let shown = |l: &Value| {
        let field = |k: &str| l[k].as_str().unwrap_or_default().to_string();
        (field("identity"), field("verb"), field("object"), field("outcome"), field("detail"))
    };
    let line = |object: &str, detail: &str| {
        ("storage-1".to_string(), "check".to_string(), object.to_string(), "ok".to_string(), detail.to_string())
    };
    assert_eq!(shown(reports[0]), line("lock \"orders\"", "token 5 refused, highest 9, resource orders-42"));
    assert_eq!(shown(reports[1]), line("lock \"jobs/x\"", "token 7 refused, highest 8"));
    assert!(reports[0]["remote"].as_str().is_some_and(|r| r.starts_with("127.0.0.1:")), "{}", reports[0]);
}

/// Rule: a report needs `check` on its lock: without it, 403 / PERMISSION_DENIED
/// (audited as denied), without credentials 401 / UNAUTHENTICATED, and
/// nothing is written (INV-9).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_without_check_is_refused_and_writes_nothing() {
    let node = start_node().await;
    let before = node.last_log_index().await;
    let mut worker = node.grpc(&node.worker).await;
    let e = worker.report_refusal(report("orders", 5, 9, "orders-42")).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("worker may not check lock \"orders\""), "{e:?}");
    let body = r#"{"refused_token": "5", "highest_token": "9"}"#;
    let (status, v) = post_report(&node.http(Some(&node.worker)), "orders", body).await;
    assert_eq!((status, v["error"]["code"].as_str()), (403, Some("permission_denied")), "{v}");
    let (status, v) = post_report(&node.http(None), "orders", body).await;
    assert_eq!((status, v["error"]["code"].as_str()), (401, Some("unauthenticated")), "{v}");
    assert_eq!(node.last_log_index().await, before, "a refused report wrote to the log");

    let lines = node.shutdown_and_audit().await;
    assert!(!lines.iter().any(|l| l["action"] == "report_refusal"), "{lines:#?}");
    let denied = lines.iter().filter(|l| l["identity"] == "worker" && l["outcome"] == "denied").count();
    assert_eq!(denied, 2, "{lines:#?}");
}

/// Rule: a report no fence makes is refused with 400 `invalid_argument` (gRPC
/// INVALID_ARGUMENT) before anything is written: a token 0, a refused token
/// not below the highest, a resource over 256 bytes or with a control
/// character, an unknown field, an invalid lock name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_report_is_refused_with_400_and_writes_nothing() {
    let node = start_node().await;
    let before = node.last_log_index().await;
    let http = node.http(Some(&node.reporter));
    let long = "k".repeat(257);
    let cases = [
        ("orders", json!({ "refused_token": "0", "highest_token": "9" }), "invalid token: 0"),
        ("orders", json!({ "refused_token": "5", "highest_token": "0" }), "invalid token: 0"),
        ("orders", json!({ "refused_token": "9", "highest_token": "9" }), "not below the highest token 9"),
        ("orders", json!({ "refused_token": "10", "highest_token": "9" }), "not below the highest token 9"),
        ("orders", json!({ "refused_token": "5", "highest_token": "9", "resource": long }), "resource is 257 bytes"),
        ("orders", json!({ "refused_token": "5", "highest_token": "9", "resource": "a\nb" }), "control characters"),
        ("orders", json!({ "refused_token": "5", "highest_token": "9", "lock": "x" }), "unknown field"),
        ("orders", json!({ "highest_token": "9" }), "refused_token"),
        ("bad%07name", json!({ "refused_token": "5", "highest_token": "9" }), "invalid lock name"),
    ];
    for (lock, body, why) in cases {
        let (status, v) = post_report(&http, lock, &body.to_string()).await;
        assert_eq!((status, v["error"]["code"].as_str()), (400, Some("invalid_argument")), "{body}: {v}");
        assert!(v["error"]["message"].as_str().is_some_and(|m| m.contains(why)), "{body}: {v}");
    }
    let mut c = node.grpc(&node.reporter).await;
    let e = c.report_refusal(report("orders", 9, 9, "")).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert_eq!(node.last_log_index().await, before, "a malformed report wrote to the log");
    node.running.shutdown().await;
}

/// Rule: the node takes a burst of `REPORTS_BURST` reports and then
/// `REPORTS_PER_SECOND` a second, whoever sends them: a flood of 300 at once
/// gets the rest refused with RESOURCE_EXHAUSTED `limit_reached` (429 over
/// HTTP), counted in `fencelock_limit_refusals_total` and audited, and
/// exactly the accepted reports reach the watch: a refused one writes
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::disallowed_methods)] // the flood's duration bounds what the rate lets through
async fn a_flood_of_reports_beyond_the_rate_is_refused_and_writes_nothing_more() {
    use fencelock_server::quota::{REPORTS_BURST, REPORTS_PER_SECOND};
    const FLOOD: u64 = 300;
    let node = start_node().await;
    let mut events = watch(&node, &node.watcher, "").await;
    let reporter = node.grpc(&node.reporter).await;
    let started = tokio::time::Instant::now();
    let calls = (0..FLOOD).map(|i| {
        let mut c = reporter.clone();
        async move { c.report_refusal(report("flood", i + 1, FLOOD + 1, "k")).await }
    });
    let answers = futures::future::join_all(calls).await;
    let elapsed = started.elapsed().as_secs_f64();
    let ok = answers.iter().filter(|a| a.is_ok()).count() as u64;
    let limited = answers.iter().filter(|a| a.as_ref().is_err_and(|e| e.code() == Code::ResourceExhausted)).count();
    assert_eq!(ok + limited as u64, FLOOD, "every report is accepted or limited: {answers:?}");
    let most = REPORTS_BURST + (elapsed * REPORTS_PER_SECOND as f64).ceil() as u64;
    assert!(ok >= REPORTS_BURST && ok <= most, "{ok} accepted in {elapsed:.2} s (at most {most})");
    let e = answers.iter().find_map(|a| a.as_ref().err()).expect("some refused");
    assert_eq!(e.message(), format!("limit reached: refusal_reports_per_second = {REPORTS_PER_SECOND}"));
    let (status, v) =
        post_report(&node.http(Some(&node.reporter)), "flood", r#"{"refused_token":"1","highest_token":"2"}"#).await;
    let limited_http = match status {
        429 => 1,
        200 => 0,
        other => panic!("the report after the flood answered {other}: {v}"),
    };
    if limited_http == 1 {
        assert_eq!(v["error"]["code"], "limit_reached", "{v}");
    }

    // The bucket refills; a marker report ends what the watch has to show.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let mut c = node.grpc(&node.reporter).await;
    c.report_refusal(report("marker", 1, 2, "")).await.expect("the marker is reported");
    let mut seen = 0;
    loop {
        let e = next(&mut events).await;
        if e.lock == "marker" {
            break;
        }
        assert_eq!((e.kind, e.lock.as_str()), (pb::WatchEventKind::WriteRefused as i32, "flood"), "{e:?}");
        seen += 1;
    }
    assert_eq!(seen, ok + 1 - limited_http, "the watch shows exactly the accepted reports");

    let metrics = node.http(None).send(Request::get("/metrics")).await.expect("/metrics").text();
    let counted = format!(
        "fencelock_limit_refusals_total{{limit=\"refusal_reports_per_second\"}} {}",
        limited as u64 + limited_http
    );
    assert!(metrics.contains(&counted), "{counted} not in\n{metrics}");
    let lines = node.shutdown_and_audit().await;
    let audited = lines.iter().filter(|l| l["outcome"] == "limited" && l["identity"] == "storage-1").count();
    assert_eq!(audited as u64, limited as u64 + limited_http, "every limited report is audited");
    let accepted = lines.iter().filter(|l| l["action"] == "report_refusal").count() as u64;
    assert_eq!(accepted, seen + 1, "every accepted report is audited, the marker too");
}
