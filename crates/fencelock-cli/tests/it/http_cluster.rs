//! The HTTP API in a 3-node group (TLS, tokens): a follower answers every
//! operation, reads too, with 503 `not_leader` naming the leader's address
//! (the gRPC address the membership records), so a client given every
//! member's URL finds the leader by trying the next; the leader serves it;
//! and a grant made over HTTP survives the leader's death (INV-10), held by
//! the same lease under the same token on the new leader.

use serde_json::Value;

use crate::support::cluster::Cluster;

fn json(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|_| panic!("not JSON: {body}"))
}

#[test]
fn a_follower_names_the_leader_and_a_grant_survives_its_death() {
    let mut c = Cluster::start(3);
    let leader = c.must_lead("at start");
    let follower = (leader + 1) % 3;
    let acquire = br#"{"ttl_ms": 20000}"#;
    for (method, path, body) in [
        ("POST", "/v1/locks/http%2Fone/acquire", &acquire[..]),
        ("POST", "/v1/leases", &br#"{"ttl_ms": 5000}"#[..]),
        ("GET", "/v1/locks/http%2Fone", &b""[..]),
    ] {
        let (code, body) = c.nodes[follower].admin_request(method, path, body).unwrap();
        let v = json(&body);
        assert_eq!((code, v["error"]["code"].as_str()), (503, Some("not_leader")), "{method} {path}: {body}");
        assert_eq!(v["error"]["leader"].as_str(), Some(c.nodes[leader].grpc.to_string().as_str()), "{body}");
    }

    let (code, body) = c.nodes[leader].admin_request("POST", "/v1/locks/http%2Fone/acquire", acquire).unwrap();
    assert_eq!(code, 200, "{body}");
    let grant = json(&body);
    c.kill_leader();
    let new = c.must_lead("after the kill");
    let (code, body) = c.nodes[new].admin_get("/v1/locks/http%2Fone").unwrap();
    assert_eq!(code, 200, "{body}");
    let holder = &json(&body)["holder"];
    assert_eq!((&holder["lease_id"], &holder["token"]), (&grant["lease_id"], &grant["token"]), "INV-10: {body}");
}
