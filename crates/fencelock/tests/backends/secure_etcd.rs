//! Issue 15: etcd over TLS with auth on, against a real member serving
//! `https` client URLs only, auth enabled through the gRPC Auth API (no
//! etcdctl): the conformance suite over `etcd+tls://user:password@`, the
//! token renewed after it expires, and what a wrong password, no
//! credentials, a plaintext client and a wrong CA get.

use std::time::Duration;

use fencelock::backend;
use fencelock::Error;
use fencelock_proto::etcd::etcdserverpb::auth_client::AuthClient;
use fencelock_proto::etcd::etcdserverpb::{AuthEnableRequest, AuthUserAddRequest, AuthUserGrantRoleRequest};
use fencelock_testkit::proxy::Proxy;
use fencelock_testkit::{EtcdServer, TestCerts};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};

use crate::suite::{self, opts, within, Target, SECS};

const USER: &str = "locker";
const PASSWORD: &str = "etcd-s3cret";

/// A TLS-only member with auth on: users `root` and [`USER`], both with the
/// root role. Simple tokens expire after `token_ttl_secs` idle seconds.
async fn start(token_ttl_secs: u32) -> EtcdServer {
    let server = tokio::task::spawn_blocking(move || EtcdServer::start_tls(token_ttl_secs)).await.unwrap();
    within("enable auth", enable_auth(&server)).await;
    server
}

async fn enable_auth(server: &EtcdServer) {
    let ca = std::fs::read(server.certs().unwrap().ca()).unwrap();
    let tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca)).domain_name("127.0.0.1");
    let endpoint = Endpoint::from_shared(format!("https://127.0.0.1:{}", server.port())).unwrap();
    let channel = endpoint.tls_config(tls).unwrap().connect().await.unwrap();
    let mut auth = AuthClient::new(channel);
    for (name, password) in [("root", "root-pw"), (USER, PASSWORD)] {
        let add = AuthUserAddRequest { name: name.into(), password: password.into() };
        auth.user_add(add).await.unwrap();
        let grant = AuthUserGrantRoleRequest { user: name.into(), role: "root".into() };
        auth.user_grant_role(grant).await.unwrap();
    }
    auth.auth_enable(AuthEnableRequest {}).await.unwrap();
}

fn ca_query(server: &EtcdServer) -> String {
    format!("?ca={}", server.certs().unwrap().ca().display())
}

fn url(userinfo: &str, server: &EtcdServer) -> String {
    format!("etcd+tls://{userinfo}127.0.0.1:{}{}", server.port(), ca_query(server))
}

pub struct SecureEtcd {
    server: EtcdServer,
}

impl Target for SecureEtcd {
    async fn start() -> SecureEtcd {
        SecureEtcd { server: start(300).await }
    }

    fn url(&self) -> String {
        url(&format!("{USER}:{PASSWORD}@"), &self.server)
    }

    async fn via_proxies(&self) -> (String, Vec<Proxy>) {
        suite::through_proxy(&format!("etcd+tls://{USER}:{PASSWORD}@"), self.server.port(), &ca_query(&self.server))
            .await
    }
}

crate::conformance!(SecureEtcd:
    mutual_exclusion, contention_is_an_outcome, release_and_drop_free_the_lock, with_lock_runs_and_releases);

async fn refused(url: &str) -> Error {
    match within("connect", backend::connect(url)).await {
        Ok(b) => panic!("connected ({b:?}) where it must be refused"),
        Err(e) => e,
    }
}

/// The token expires (1 s idle): the next acquire authenticates again and
/// succeeds, and a held lock's renewals (every TTL/3, longer than the
/// token's life) keep it held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_token_is_renewed() {
    let server = start(1).await;
    let b = suite::connect(&url(&format!("{USER}:{PASSWORD}@"), &server)).await;
    let held = within("acquire", b.acquire("kept", &opts(6 * SECS, Duration::ZERO))).await.unwrap().acquired().unwrap();
    tokio::time::sleep(5 * SECS).await;
    assert!(!held.is_lost(), "renewals with an expired token lost the lock");
    let other = within("acquire", b.acquire("later", &opts(6 * SECS, Duration::ZERO))).await;
    let other = other.unwrap_or_else(|e| panic!("an acquire after the token expired: {e}")).acquired().unwrap();
    assert!(other.release().await.unwrap());
    assert!(held.release().await.unwrap());
}

/// A wrong password and missing credentials are `Error::Security`, each
/// saying which; the password is not in the text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_or_missing_credentials_are_refused_by_name() {
    let server = start(300).await;
    let err = refused(&url(&format!("{USER}:not-{PASSWORD}@"), &server)).await;
    let text = err.to_string();
    assert!(matches!(err, Error::Security { .. }) && text.contains("authentication refused"), "{err:?}");
    assert!(!text.contains(PASSWORD), "{text}");
    let err = refused(&url("", &server)).await;
    assert!(matches!(&err, Error::Security { message, .. } if message.contains("auth on")), "{err:?}");
}

/// A plaintext client of the TLS-only member: `Error::Connect` within the
/// connect timeout, with the hint to use `etcd+tls://`; another CA: the
/// handshake fails, as `Error::Security`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plaintext_and_wrong_ca_are_refused() {
    let server = start(300).await;
    let plain = format!("etcd://{USER}:{PASSWORD}@127.0.0.1:{}", server.port());
    let err = refused(&plain).await;
    assert!(matches!(&err, Error::Connect { message: m, .. } if m.contains("etcd+tls://")), "{err:?}");
    let other = TestCerts::new("other");
    let wrong = format!("etcd+tls://{USER}:{PASSWORD}@127.0.0.1:{}?ca={}", server.port(), other.ca().display());
    let err = refused(&wrong).await;
    assert!(matches!(&err, Error::Security { message, .. } if message.contains("TLS handshake failed")), "{err:?}");
}
