//! `CheckValidator` with the real fencelock client against a real server: the
//! act runs only while the token is the current grant (Chubby's CheckSequencer).

use std::time::Duration;

use fencelock::{Client, Outcome};
use fencelock_fence::{CheckValidator, Checked};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_validator_asks_the_lock_server() {
    let tmp = tempfile::tempdir().unwrap();
    let server = fencelock_server::start(fencelock_server::Config::for_test(tmp.path().join("data"))).await.unwrap();
    let client = Client::connect(format!("http://{}", server.grpc_addr)).await.unwrap();
    let guard = match client.lock("mailer").ttl(Duration::from_secs(10)).acquire().await.unwrap() {
        Outcome::Acquired(g) => g,
        other => panic!("expected a grant, got {other:?}"),
    };
    let token = guard.token().unwrap();
    let v = CheckValidator::new(client.clone());

    assert!(v.validate("mailer", token).await.unwrap(), "the holder's token is current");
    let ran = v.run("mailer", token, || async { "sent" }).await.unwrap();
    assert_eq!(ran, Checked::Current("sent"));
    assert!(!v.validate("mailer", token + 1).await.unwrap(), "a token never issued is not current");

    assert!(guard.release().await.unwrap());
    let refused = v.run("mailer", token, || async { panic!("must not act on a released token") }).await.unwrap();
    assert_eq!(refused, Checked::NotCurrent { lock: "mailer".into(), token });
    drop(client);
    server.shutdown().await;
}
