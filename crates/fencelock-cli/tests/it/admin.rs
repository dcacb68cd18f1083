//! The HTTP admin endpoints answer with the documented JSON and Prometheus text.

use crate::support;

use support::{cli, http_get, stdout, Server};

#[test]
fn admin_endpoints_report_locks_and_metrics() {
    let tmp = tempfile::tempdir().unwrap();
    let server = Server::start(tmp.path());

    let (code, body) = http_get(server.http, "/healthz").unwrap();
    assert_eq!(code, 200);
    let health: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(health["status"], "ok");
    assert_eq!(health["leader"], 1);

    let out = cli(&server, &["acquire", "admin-a", "--ttl", "30s", "--json"]);
    assert!(out.status.success(), "{out:?}");
    let grant: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();

    let (code, body) = http_get(server.http, "/v1/locks/admin-a").unwrap();
    assert_eq!(code, 200, "{body}");
    let lock: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(lock["name"], "admin-a");
    // The admin port writes ids and tokens as decimal strings; the CLI's
    // --json as numbers.
    let id = crate::support::id;
    assert_eq!(lock["holder"]["lease_id"].as_str().map(str::to_string), Some(grant["lease_id"].to_string()));
    assert_eq!(id(&lock["holder"]["token"]), id(&grant["token"]));
    let ttl_left = lock["holder"]["ttl_left_ms"].as_u64().unwrap();
    assert!(ttl_left > 0 && ttl_left <= 30_000, "ttl_left_ms {ttl_left}");
    assert!(lock["holder"]["token_age_ms"].as_u64().is_some());
    assert_eq!(lock["waiters"], serde_json::json!([]));

    let (code, body) = http_get(server.http, "/v1/locks").unwrap();
    assert_eq!(code, 200);
    let all: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(all["locks"].as_array().unwrap().len(), 1);
    assert_eq!(all["locks"][0]["name"], "admin-a");

    let (code, body) = http_get(server.http, "/v1/locks/nobody-holds-this").unwrap();
    assert_eq!(code, 200);
    let free: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(free["holder"], serde_json::Value::Null);

    let (code, body) = http_get(server.http, "/v1/locks/bad%01name").unwrap();
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("invalid lock name"), "{body}");

    let (code, text) = http_get(server.http, "/metrics").unwrap();
    assert_eq!(code, 200);
    for line in [
        "fencelock_grants_total 1",
        "fencelock_tokens_issued 1",
        "fencelock_active_leases 1",
        "fencelock_held_locks 1",
        "fencelock_queue_depth 0",
        "fencelock_is_leader 1",
        "# TYPE fencelock_wait_seconds histogram",
        "fencelock_wait_seconds_count 1",
        "# TYPE fencelock_hold_seconds histogram",
    ] {
        assert!(text.lines().any(|l| l == line), "metrics lack {line:?}:\n{text}");
    }
}
