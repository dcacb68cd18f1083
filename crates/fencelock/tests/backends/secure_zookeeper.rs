//! Issue 15: ZooKeeper with digest auth (`zk://user:password@`), against a
//! real server: the conformance suite as a digest user, and the ACLs of the
//! nodes the backend creates: another identity (a wrong password is one) or
//! an anonymous client can neither take the lock nor delete its nodes.
//! ZooKeeper's digest scheme accepts any `user:password` at login (it only
//! names the identity), so a wrong password shows as a refusal of the first
//! write, not of the login.

use std::time::Duration;

use fencelock::backend::zookeeper::encode_name;
use fencelock::Error;
use fencelock_testkit::proxy::Proxy;
use fencelock_testkit::ZkServer;
use zookeeper_client as zk;

use crate::suite::{self, opts, within, Target, SECS};

const CREDS: &str = "alice:zk-s3cret";

async fn start() -> ZkServer {
    tokio::task::spawn_blocking(ZkServer::start).await.unwrap()
}

fn url(creds: &str, server: &ZkServer) -> String {
    format!("zk://{creds}@127.0.0.1:{}", server.port())
}

pub struct SecureZk {
    server: ZkServer,
}

impl Target for SecureZk {
    async fn start() -> SecureZk {
        SecureZk { server: start().await }
    }

    fn url(&self) -> String {
        url(CREDS, &self.server)
    }

    async fn via_proxies(&self) -> (String, Vec<Proxy>) {
        suite::through_proxy(&format!("zk://{CREDS}@"), self.server.port(), "").await
    }
}

crate::conformance!(SecureZk:
    mutual_exclusion, contention_is_an_outcome, release_and_drop_free_the_lock, with_lock_runs_and_releases);

/// A raw client logged in as `creds` (anonymous if `None`).
async fn raw(server: &ZkServer, creds: Option<&str>) -> zk::Client {
    let mut connector = zk::Client::connector();
    if let Some(creds) = creds {
        connector = connector.with_auth("digest", creds.as_bytes());
    }
    within("raw client", connector.connect(&format!("127.0.0.1:{}", server.port()))).await.unwrap()
}

/// The holder's node carries `auth` ACLs (only its digest identity); a
/// client with a wrong password gets `Error::Security` (not authorized) when
/// it tries to take the lock, and neither it nor an anonymous client can
/// delete the holder's node; the holder's lock is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_identity_can_neither_take_nor_delete() {
    let server = start().await;
    let owner = suite::connect(&url(CREDS, &server)).await;
    let held = owner.acquire("guarded", &opts(30 * SECS, Duration::ZERO)).await.unwrap().acquired().unwrap();
    let parent = format!("/fencelock/{}", encode_name("guarded"));
    let anonymous = raw(&server, None).await;
    let got = within("anonymous list", anonymous.list_children(&parent)).await;
    assert!(matches!(got, Err(zk::Error::NoAuth)), "an anonymous client read the queue: {got:?}");
    let same = raw(&server, Some(CREDS)).await;
    let children = within("list", same.list_children(&parent)).await.unwrap();
    assert_eq!(children.len(), 1, "{children:?}");
    let node = format!("{parent}/{}", children[0]);
    let (acls, _) = within("acl", same.get_acl(&node)).await.unwrap();
    assert!(acls.iter().all(|a| a.scheme() == "digest" && a.id().starts_with("alice:")), "{acls:?}");

    let intruder = suite::connect(&url("alice:wrong-password", &server)).await;
    let got = within("intruder acquire", intruder.acquire("guarded", &opts(30 * SECS, Duration::ZERO))).await;
    match got {
        Err(e @ Error::Security { .. }) => assert!(e.to_string().contains("not authorized"), "{e}"),
        other => panic!("another identity on a guarded lock: {other:?}"),
    }
    let wrong = raw(&server, Some("alice:wrong-password")).await;
    for client in [&anonymous, &wrong] {
        let got = within("delete", client.delete(&node, None)).await;
        assert!(matches!(got, Err(zk::Error::NoAuth)), "{got:?}");
    }
    assert!(!held.is_lost());
    assert!(held.release().await.unwrap());
}

/// Without credentials the backend's nodes stay open to anyone (the
/// default, as before): an anonymous client can delete them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_credentials_nodes_are_open() {
    let server = start().await;
    let b = suite::connect(&server.url()).await;
    let held = b.acquire("open", &opts(30 * SECS, Duration::ZERO)).await.unwrap().acquired().unwrap();
    let anonymous = raw(&server, None).await;
    let parent = format!("/fencelock/{}", encode_name("open"));
    let children = within("list", anonymous.list_children(&parent)).await.unwrap();
    let (acls, _) = within("acl", anonymous.get_acl(&format!("{parent}/{}", children[0]))).await.unwrap();
    assert!(acls.iter().all(|a| a.scheme() == "world"), "{acls:?}");
    drop(held);
}
