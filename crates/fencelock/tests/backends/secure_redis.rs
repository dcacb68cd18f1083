//! Issue 15: Redis and Redlock over TLS (`rediss://`, `redlock+tls://`) with
//! an ACL user, against real `redis-server`s that speak TLS only and have
//! their `default` user off: the conformance suite over the secure URL, and
//! what a wrong password, a missing password, a plaintext client, a wrong CA
//! and a missing CA file get.

use std::time::Duration;

use fencelock::backend;
use fencelock::Error;
use fencelock_testkit::proxy::Proxy;
use fencelock_testkit::{RedisSecurity, RedisServer, TestCerts};
use redis::TlsCertificates;

use crate::suite::{self, opts, within, Target, MS, SECS};

const USER: &str = "locker";
const PASSWORD: &str = "s3cret-pw";

async fn start(tls: bool) -> RedisServer {
    let security = RedisSecurity { tls, user: Some((USER.into(), PASSWORD.into())) };
    tokio::task::spawn_blocking(move || RedisServer::start_secure(security)).await.unwrap()
}

/// `{scheme}://{userinfo}127.0.0.1:{port}{query}`.
fn url(scheme: &str, userinfo: &str, port: u16, query: &str) -> String {
    format!("{scheme}://{userinfo}127.0.0.1:{port}{query}")
}

fn ca_query(server: &RedisServer) -> String {
    format!("?ca={}", server.certs().expect("a TLS server").ca().display())
}

/// A TLS-only server with an ACL user, reached through `rediss://`.
pub struct SecureRedis {
    server: RedisServer,
}

impl Target for SecureRedis {
    async fn start() -> SecureRedis {
        SecureRedis { server: start(true).await }
    }

    fn url(&self) -> String {
        url("rediss", &format!("{USER}:{PASSWORD}@"), self.server.port(), &ca_query(&self.server))
    }

    async fn via_proxies(&self) -> (String, Vec<Proxy>) {
        // The proxy listens on 127.0.0.1 too: the certificate still names the host.
        let prefix = format!("rediss://{USER}:{PASSWORD}@");
        suite::through_proxy(&prefix, self.server.port(), &ca_query(&self.server)).await
    }

    fn short_ttl(&self) -> Duration {
        500 * MS
    }

    /// The recipe's queue (see `redis::queue_len`), read over TLS as the ACL user.
    async fn waiters(&self, lock: &str) -> Option<usize> {
        let ca = std::fs::read(self.server.certs().expect("a TLS server").ca()).unwrap();
        let tls = TlsCertificates { client_tls: None, root_cert: Some(ca) };
        let client =
            redis::Client::build_with_tls(url("rediss", &format!("{USER}:{PASSWORD}@"), self.server.port(), ""), tls);
        let mut conn = within("inspect connection", client.unwrap().get_multiplexed_async_connection()).await.unwrap();
        Some(crate::redis::queue_len(&mut conn, lock).await)
    }
}

crate::conformance!(SecureRedis);

/// The error `url` gets at connect (bounded: a hang fails the test).
async fn refused(url: &str) -> Error {
    match within("connect", backend::connect(url)).await {
        Ok(b) => panic!("{url}: connected ({b:?}) where it must be refused"),
        Err(e) => e,
    }
}

/// A wrong password is an `Error::Security` that says authentication was
/// refused, and shows neither password; no password at all says the server
/// requires one.
#[tokio::test]
async fn a_wrong_or_missing_password_is_refused_by_name() {
    let server = start(true).await;
    let wrong = url("rediss", &format!("{USER}:not-{PASSWORD}@"), server.port(), &ca_query(&server));
    let err = refused(&wrong).await;
    let text = err.to_string();
    assert!(matches!(err, Error::Security { .. }), "{err:?}");
    assert!(text.contains("authentication refused"), "{text}");
    assert!(!text.contains(PASSWORD) && !format!("{err:?}").contains(PASSWORD), "{text}");
    let none = url("rediss", "", server.port(), &ca_query(&server));
    let err = refused(&none).await;
    assert!(matches!(err, Error::Security { .. }) && err.to_string().contains("requires authentication"), "{err}");
}

/// The ACL user works without TLS too (`redis://user:password@`).
#[tokio::test]
async fn an_acl_user_over_plaintext() {
    let server = start(false).await;
    let b = suite::connect(&url("redis", &format!("{USER}:{PASSWORD}@"), server.port(), "")).await;
    let g = within("acquire", b.acquire("plain", &opts(10 * SECS, Duration::ZERO))).await.unwrap().acquired().unwrap();
    assert!(g.token().is_some());
    assert!(g.release().await.unwrap());
    let err = refused(&url("redis", &format!("{USER}:wrong@"), server.port(), "")).await;
    assert!(matches!(err, Error::Security { .. }), "{err:?}");
}

/// Issue 17 (elections must not cost locks their ACL users): an ACL user
/// without any pub/sub channel (Redis 7's default for a new user) still takes,
/// hands over and releases locks, and campaigns, although the scripts cannot
/// announce grants and releases on the election channel; only `observe`,
/// which must subscribe, is refused (`Error::Security`, naming the ACL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_user_without_channels_still_locks() {
    let server = start(false).await;
    let admin = redis::Client::open(url("redis", &format!("{USER}:{PASSWORD}@"), server.port(), "")).unwrap();
    let mut admin = within("admin", admin.get_multiplexed_async_connection()).await.unwrap();
    let _: () = redis::cmd("ACL")
        .arg(&["SETUSER", "keysonly", "on", ">pw-2", "~*", "+@all", "resetchannels"])
        .query_async(&mut admin)
        .await
        .unwrap();
    let keys_only = url("redis", "keysonly:pw-2@", server.port(), "");
    let (a, b) = (suite::connect(&keys_only).await, suite::connect(&keys_only).await);
    let held = within("acquire", a.acquire("acl", &opts(10 * SECS, Duration::ZERO))).await.unwrap().acquired().unwrap();
    let waiter = tokio::spawn(async move { b.acquire("acl", &opts(10 * SECS, 20 * SECS)).await });
    tokio::time::sleep(200 * MS).await;
    assert!(held.release().await.unwrap());
    let handed = within("the waiter", waiter).await.unwrap().unwrap().acquired().unwrap();
    assert!(handed.release().await.unwrap());
    let leadership = within("campaign", a.election("acl").value(&b"v"[..]).campaign()).await.unwrap();
    assert_eq!(a.leader("acl").await.unwrap().map(|l| (l.term, l.value)), Some((leadership.term(), b"v".to_vec())));
    let refused = a.observe("acl").await.map(drop);
    assert!(matches!(&refused, Err(Error::Security { message, .. }) if message.contains("ACL")), "{refused:?}");
    assert!(leadership.resign().await.unwrap());
}

/// A plaintext client of a TLS-only server gets `Error::Connect` within the
/// connect timeout (not a hang), with a hint to use `rediss://`.
#[tokio::test]
async fn a_plaintext_client_of_a_tls_server_is_told_so() {
    let server = start(true).await;
    let err = refused(&url("redis", &format!("{USER}:{PASSWORD}@"), server.port(), "")).await;
    assert!(matches!(&err, Error::Connect { message: m, .. } if m.contains("rediss://")), "{err:?}");
}

/// A server whose certificate is not signed by the `ca=` given is refused in
/// the handshake (`Error::Security` naming TLS and the certificate); so is a
/// `ca=` file that does not exist, before anything is sent.
#[tokio::test]
async fn a_wrong_or_missing_ca_is_refused() {
    let server = start(true).await;
    let other = TestCerts::new("other");
    let creds = format!("{USER}:{PASSWORD}@");
    let err = refused(&url("rediss", &creds, server.port(), &format!("?ca={}", other.ca().display()))).await;
    let text = err.to_string();
    assert!(matches!(err, Error::Security { .. }), "{err:?}");
    assert!(text.contains("TLS handshake failed") && text.to_lowercase().contains("certificate"), "{text}");
    let err = refused(&url("rediss", &creds, server.port(), "?ca=/nonexistent/ca.pem")).await;
    assert!(matches!(&err, Error::Security { message, .. } if message.contains("/nonexistent/ca.pem")), "{err:?}");
    let err = refused(&url("redis", &creds, server.port(), &format!("?ca={}", other.ca().display()))).await;
    assert!(matches!(err, Error::InvalidArgument(_)), "ca= without TLS: {err:?}");
}

/// Redlock over three TLS-only servers with the same ACL user: a grant and a
/// release; a wrong CA is reported as the TLS failure it is, not as
/// "unreachable nodes".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_over_tls() {
    let mut servers = Vec::new();
    for _ in 0..3 {
        servers.push(start(true).await);
    }
    // Each server has its own CA: one file holding all three.
    let bundle = tempfile::NamedTempFile::new().unwrap();
    let pems: Vec<String> = servers.iter().map(|s| std::fs::read_to_string(s.certs().unwrap().ca()).unwrap()).collect();
    std::fs::write(bundle.path(), pems.concat()).unwrap();
    let hosts: Vec<String> = servers.iter().map(|s| format!("127.0.0.1:{}", s.port())).collect();
    let good = format!("redlock+tls://{USER}:{PASSWORD}@{}?ca={}", hosts.join(","), bundle.path().display());
    let b = suite::connect(&good).await;
    let g = within("acquire", b.acquire("rl", &opts(10 * SECS, Duration::ZERO))).await.unwrap().acquired().unwrap();
    assert!(g.release().await.unwrap());
    let one_ca = format!("redlock+tls://{USER}:{PASSWORD}@{}{}", hosts.join(","), ca_query(&servers[0]));
    let err = refused(&one_ca).await;
    assert!(matches!(err, Error::Security { .. }) && err.to_string().contains("TLS"), "{err:?}");
}
