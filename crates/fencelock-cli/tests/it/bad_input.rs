//! INV-9: every invalid name, TTL, token, wait, lock-delay and request id gets a
//! clear error, over gRPC and from the CLI, and changes nothing.

use crate::support;

use fencelock_proto::v1::{lock_client::LockClient, *};
use support::{cli, stderr, Server};
use tonic::Code;

fn assert_status<T: std::fmt::Debug>(r: Result<T, tonic::Status>, code: Code, needle: &str) {
    let s = r.expect_err("must be rejected");
    assert_eq!(s.code(), code, "{s:?}");
    assert!(s.message().contains(needle), "message {:?} should mention {needle:?}", s.message());
}

#[tokio::test]
async fn grpc_rejects_each_bad_input_clearly() {
    let tmp = tempfile::tempdir().unwrap();
    let server = Server::start(tmp.path());
    let mut c = LockClient::connect(server.url()).await.unwrap();

    for ttl_ms in [0, 99, 3_600_001] {
        let r = c.grant_lease(GrantLeaseRequest { request_id: 1, ttl_ms }).await;
        assert_status(r, Code::InvalidArgument, "invalid ttl");
    }
    let r = c.grant_lease(GrantLeaseRequest { request_id: 0, ttl_ms: 5000 }).await;
    assert_status(r, Code::InvalidArgument, "request id");
    let lease = c.grant_lease(GrantLeaseRequest { request_id: 7, ttl_ms: 5000 }).await.unwrap().into_inner().lease_id;
    let counter = token_counter(&server);

    let acq = |lock: &str, wait_ms, lock_delay_ms| AcquireRequest {
        request_id: 11,
        lease_id: lease,
        lock: lock.into(),
        wait_ms,
        lock_delay_ms,
        ..Default::default()
    };
    for name in ["", &"x".repeat(513), "a\nb", "tab\there", "\u{7f}"] {
        assert_status(c.acquire(acq(name, 0, 0)).await, Code::InvalidArgument, "invalid lock name");
        assert_status(
            c.check(CheckRequest { lock: name.into(), token: 1 }).await,
            Code::InvalidArgument,
            "invalid lock name",
        );
    }
    assert_status(c.acquire(acq("ok", 3_600_001, 0)).await, Code::InvalidArgument, "invalid wait");
    assert_status(c.acquire(acq("ok", 0, 60_001)).await, Code::InvalidArgument, "invalid lock_delay");
    let unknown = AcquireRequest { lease_id: 999_999, ..acq("ok", 0, 0) };
    assert_status(c.acquire(unknown).await, Code::NotFound, "lease 999999 not found");
    let ka = KeepAliveRequest { request_id: 3, lease_id: 999_999 };
    assert_status(c.keep_alive(ka).await, Code::NotFound, "lease 999999 not found");
    let rel = ReleaseRequest { request_id: 4, lease_id: lease, lock: "ok".into(), token: 0 };
    assert_status(c.release(rel).await, Code::InvalidArgument, "invalid token");
    assert_status(c.check(CheckRequest { lock: "ok".into(), token: 0 }).await, Code::InvalidArgument, "invalid token");

    // Nothing changed: no lock exists and no token was consumed.
    let listed = c.list_locks(ListLocksRequest { prefix: String::new(), limit: 0 }).await.unwrap().into_inner();
    assert!(listed.locks.is_empty(), "{listed:?}");
    let ok = c.acquire(acq("ok", 0, 0)).await.unwrap().into_inner();
    match ok.outcome {
        // The counter starts at the leader's token floor (not 1): the first grant
        // takes the next token, so none was consumed by the rejected requests.
        Some(acquire_response::Outcome::Acquired(a)) => assert_eq!(a.token, counter + 1, "no token consumed"),
        other => panic!("expected a grant, got {other:?}"),
    }
}

/// The server's `fencelock_token_counter` gauge: every token issued so far is
/// at most this, and the next one is greater.
fn token_counter(server: &Server) -> u64 {
    let (_, text) = support::http_get(server.http, "/metrics").unwrap();
    let line = text.lines().find_map(|l| l.strip_prefix("fencelock_token_counter ")).expect("the gauge");
    line.trim().parse().unwrap()
}

#[test]
fn cli_reports_bad_input_with_documented_exit_codes() {
    let tmp = tempfile::tempdir().unwrap();
    let server = Server::start(tmp.path());
    let cases: &[(&[&str], i32, &str)] = &[
        (&["acquire", ""], 70, "invalid lock name"),
        (&["acquire", "a\u{1}b"], 70, "invalid lock name"),
        (&["acquire", "x", "--ttl", "50ms"], 70, "ttl 50 ms is out of range"),
        (&["acquire", "x", "--ttl", "2h"], 70, "ttl 7200000 ms is out of range"),
        (&["acquire", "x", "--ttl", "ten"], 2, "invalid duration"),
        (&["check", "x", "abc"], 2, "invalid value"),
        (&["check", "x", "0"], 70, "invalid token"),
        (&["release", "x", "--lease", "1", "--token", "0"], 70, "invalid token"),
        (&["run", "", "--", "true"], 70, "invalid lock name"),
        (&["check", "x", "-5"], 2, ""),
    ];
    for (args, code, needle) in cases {
        let out = cli(&server, args);
        assert_eq!(out.status.code(), Some(*code), "fencelock {args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(needle), "fencelock {args:?} stderr should mention {needle:?}: {}", stderr(&out));
    }
    let out = cli(&server, &["locks", "--json"]);
    assert_eq!(support::stdout(&out).trim(), r#"{"locks":[]}"#, "bad input changed nothing");

    // A command that cannot be started: a clear error, and the lock is released
    // at once rather than held until its TTL runs out.
    let out = cli(&server, &["run", "job", "--ttl", "1h", "--", "/nonexistent/command"]);
    assert_eq!(out.status.code(), Some(70), "{}", stderr(&out));
    assert!(stderr(&out).contains("starting \"/nonexistent/command\""), "{}", stderr(&out));
    let out = cli(&server, &["locks", "--json"]);
    assert_eq!(support::stdout(&out).trim(), r#"{"locks":[]}"#, "the lock was released");
}

/// Clear errors: a server that cannot be reached is named with the reason,
/// and the reason is said once (the client's message quotes tonic's
/// transport error, which hyper wraps twice alike).
#[test]
fn an_unreachable_server_is_named_with_its_reason_once() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let out = std::process::Command::new(support::bin()).args(["locks", "--server", &url]).output().unwrap();
    assert_eq!(out.status.code(), Some(70), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains(&url), "names the server: {err}");
    assert_eq!(err.matches("Connection refused").count(), 1, "the reason once: {err}");
    assert_eq!(err.matches("tcp connect error").count(), 1, "each cause once: {err}");
}
