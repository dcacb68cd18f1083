//! Issue 15: PostgreSQL over TLS with a password user, against a real
//! cluster that has `ssl=on` and only `hostssl … scram-sha-256` lines for
//! that user: the conformance suite over `sslmode=verify-full`, and what a
//! wrong password, a plaintext client, a wrong CA and a certificate that does
//! not name the host get; `sslmode=require` encrypts without verifying.

use std::time::Duration;

use fencelock::backend;
use fencelock::Error;
use fencelock_testkit::proxy::Proxy;
use fencelock_testkit::{PgServer, TestCerts, PG_SECURE_USER};

use crate::suite::{self, opts, within, Target, MS, SECS};

async fn start() -> PgServer {
    tokio::task::spawn_blocking(PgServer::start_secure).await.unwrap()
}

/// `postgres://{user}:{password}@{host}/{db}?{query}`.
fn url(password: &str, host: &str, query: &str) -> String {
    let (user, _, db) = PG_SECURE_USER;
    format!("postgres://{user}:{password}@{host}/{db}?{query}")
}

fn verify_full(pg: &PgServer) -> String {
    format!("sslmode=verify-full&sslrootcert={}", pg.certs().unwrap().ca().display())
}

fn host(pg: &PgServer) -> String {
    format!("127.0.0.1:{}", pg.port())
}

/// The lease-table mode over TLS (`verify-full`) as the password user.
pub struct SecurePg {
    pg: PgServer,
}

impl Target for SecurePg {
    async fn start() -> SecurePg {
        SecurePg { pg: start().await }
    }

    fn url(&self) -> String {
        url(PG_SECURE_USER.1, &host(&self.pg), &verify_full(&self.pg))
    }

    async fn via_proxies(&self) -> (String, Vec<Proxy>) {
        let (user, password, db) = PG_SECURE_USER;
        let suffix = format!("/{db}?{}", verify_full(&self.pg));
        suite::through_proxy(&format!("postgres://{user}:{password}@"), self.pg.port(), &suffix).await
    }

    fn short_ttl(&self) -> Duration {
        500 * MS
    }
}

crate::conformance!(SecurePg:
    mutual_exclusion, contention_is_an_outcome, release_and_drop_free_the_lock,
    lost_fires_when_the_connection_is_cut, with_lock_runs_and_releases);

async fn refused(url: &str) -> Error {
    match within("connect", backend::connect(url)).await {
        Ok(b) => panic!("connected ({b:?}) where it must be refused"),
        Err(e) => e,
    }
}

/// A wrong password: `Error::Security` saying authentication was refused,
/// without the password in its text.
#[tokio::test]
async fn a_wrong_password_is_refused_by_name() {
    let pg = start().await;
    let err = refused(&url("not-the-password", &host(&pg), &verify_full(&pg))).await;
    let text = err.to_string();
    assert!(matches!(err, Error::Security { source: Some(_), .. }), "{err:?}");
    assert!(text.contains("authentication refused"), "{text}");
    assert!(!text.contains("not-the-password") && !format!("{err:?}").contains("not-the-password"), "{err:?}");
}

/// `sslmode=disable` against a server that admits the user over TLS only: an
/// `Error::Security` naming the missing encryption, not a hang.
#[tokio::test]
async fn a_plaintext_client_is_refused() {
    let pg = start().await;
    let err = refused(&url(PG_SECURE_USER.1, &host(&pg), "sslmode=disable")).await;
    assert!(matches!(&err, Error::Security { message, .. } if message.contains("no encryption")), "{err:?}");
}

/// `verify-full` with another CA fails the handshake; so does `require` once
/// `sslrootcert=` is given (libpq then checks the chain); `require` without
/// it encrypts and does not verify, as libpq's does.
#[tokio::test]
async fn a_wrong_ca_is_refused_and_require_does_not_verify() {
    let pg = start().await;
    let other = TestCerts::new("other");
    let wrong = format!("sslmode=verify-full&sslrootcert={}", other.ca().display());
    let err = refused(&url(PG_SECURE_USER.1, &host(&pg), &wrong)).await;
    assert!(matches!(&err, Error::Security { message, .. } if message.contains("TLS handshake failed")), "{err:?}");
    let wrong = format!("sslmode=require&sslrootcert={}", other.ca().display());
    let err = refused(&url(PG_SECURE_USER.1, &host(&pg), &wrong)).await;
    assert!(matches!(&err, Error::Security { .. }), "{err:?}");
    let b = suite::connect(&url(PG_SECURE_USER.1, &host(&pg), "sslmode=require")).await;
    let g = within("acquire", b.acquire("req", &opts(10 * SECS, Duration::ZERO))).await.unwrap().acquired().unwrap();
    assert!(g.release().await.unwrap());
}

/// `verify-full` checks the host name: the same server reached as
/// `[::ffff:127.0.0.1]` (a name its certificate does not carry) is refused,
/// while `verify-ca` (the chain only) accepts it.
#[tokio::test]
async fn verify_full_checks_the_host_name() {
    let pg = start().await;
    let mapped = format!("[::ffff:127.0.0.1]:{}", pg.port());
    let err = refused(&url(PG_SECURE_USER.1, &mapped, &verify_full(&pg))).await;
    assert!(matches!(&err, Error::Security { message, .. } if message.contains("TLS handshake failed")), "{err:?}");
    let ca = format!("sslmode=verify-ca&sslrootcert={}", pg.certs().unwrap().ca().display());
    suite::connect(&url(PG_SECURE_USER.1, &mapped, &ca)).await;
}
