//! PgFence: the caller's SQL in the fenced transaction, a stale writer's
//! transaction changing nothing, fenced reads by the read rule, a table from
//! before fenced reads still working, the check made after the row lock, and
//! the marks surviving a crash of PostgreSQL.

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;

use fencelock_fence::pg::RunError;
use fencelock_fence::{Access, Fence, Fenced, Marks, PgFence, Stale};
use tokio_postgres::{Client, NoTls};

use crate::support::PgServer;

async fn connect(server: &PgServer) -> Client {
    let (client, connection) = tokio_postgres::connect(&server.conn_str(), NoTls).await.unwrap();
    tokio::spawn(connection);
    client
}

async fn setup() -> (PgServer, Client) {
    let server = tokio::task::spawn_blocking(PgServer::start).await.unwrap();
    let client = connect(&server).await;
    PgFence::create_table(&client).await.unwrap();
    client.batch_execute("CREATE TABLE doc (id int PRIMARY KEY, body text NOT NULL)").await.unwrap();
    client.batch_execute("INSERT INTO doc VALUES (1, 'v0')").await.unwrap();
    (server, client)
}

async fn body(client: &Client) -> String {
    client.query_one("SELECT body FROM doc WHERE id = 1", &[]).await.unwrap().get(0)
}

async fn mark(client: &Client, key: &str) -> Option<i64> {
    client.query_opt("SELECT token FROM fencelock_fence WHERE key = $1", &[&key]).await.unwrap().map(|r| r.get(0))
}

/// Run a fenced `UPDATE doc SET body = $body`.
async fn write(
    client: &mut Client,
    token: u64,
    new_body: &str,
) -> Result<Fenced<u64>, RunError<tokio_postgres::Error>> {
    let new_body = new_body.to_owned();
    PgFence::run(client, "doc:1", token, move |tx| {
        Box::pin(async move { tx.execute("UPDATE doc SET body = $1 WHERE id = 1", &[&new_body]).await })
    })
    .await
}

#[tokio::test]
async fn a_stale_transaction_changes_nothing() {
    let (_server, mut client) = setup().await;
    assert_eq!(write(&mut client, 5, "from 5").await.unwrap(), Fenced::Admitted(1));
    assert_eq!(write(&mut client, 6, "from 6").await.unwrap(), Fenced::Admitted(1));
    let ran = Arc::new(AtomicBool::new(false));
    let flag = ran.clone();
    let outcome = PgFence::run(&mut client, "doc:1", 5, move |tx| {
        Box::pin(async move {
            flag.store(true, SeqCst);
            tx.execute("UPDATE doc SET body = 'late 5' WHERE id = 1", &[]).await
        })
    })
    .await
    .unwrap();
    assert_eq!(outcome, Fenced::Stale(Stale { access: Access::Write, highest: 6, got: 5 }));
    assert!(!ran.load(SeqCst), "the stale writer's SQL must not run");
    assert_eq!(body(&client).await, "from 6");
    assert_eq!(mark(&client, "doc:1").await, Some(6));
}

#[tokio::test]
async fn a_failing_caller_rolls_back_its_writes_and_the_raise() {
    let (_server, mut client) = setup().await;
    assert!(write(&mut client, 6, "from 6").await.unwrap().is_admitted());
    let err = PgFence::run(&mut client, "doc:1", 9, |tx| {
        Box::pin(async move {
            tx.execute("UPDATE doc SET body = 'half' WHERE id = 1", &[]).await?;
            tx.execute("INSERT INTO doc VALUES (1, 'duplicate key')", &[]).await
        })
    })
    .await
    .unwrap_err();
    assert!(matches!(err, RunError::Caller(_)), "{err:?}");
    assert_eq!(body(&client).await, "from 6");
    assert_eq!(mark(&client, "doc:1").await, Some(6), "the raise must roll back with the caller's SQL");
}

/// Run a fenced `SELECT body`.
async fn read(client: &mut Client, token: u64) -> Result<Fenced<String>, RunError<tokio_postgres::Error>> {
    PgFence::run_read(client, "doc:1", token, |tx| {
        Box::pin(
            async move { tx.query_one("SELECT body FROM doc WHERE id = 1", &[]).await.map(|r| r.get::<_, String>(0)) },
        )
    })
    .await
}

#[tokio::test]
async fn a_fenced_read_raises_the_mark() {
    let (_server, mut client) = setup().await;
    assert!(write(&mut client, 5, "from 5").await.unwrap().is_admitted());
    assert_eq!(read(&mut client, 6).await.unwrap(), Fenced::Admitted("from 5".to_owned()), "holder 6 reads");
    let late = write(&mut client, 5, "late 5").await.unwrap();
    assert_eq!(late, Fenced::Stale(Stale { access: Access::Write, highest: 6, got: 5 }));
    assert_eq!(body(&client).await, "from 5");
}

/// The read rule in `PgFence::run_read`: readers in any token order are
/// admitted; after a newer write, an older reader's transaction is rolled
/// back before its SQL runs.
#[tokio::test]
async fn a_stale_reader_after_a_newer_write_reads_nothing() {
    let (_server, mut client) = setup().await;
    assert!(write(&mut client, 3, "from 3").await.unwrap().is_admitted());
    assert_eq!(read(&mut client, 5).await.unwrap(), Fenced::Admitted("from 3".to_owned()), "reader 5");
    assert_eq!(read(&mut client, 4).await.unwrap(), Fenced::Admitted("from 3".to_owned()), "reader 4 after 5");
    assert!(write(&mut client, 6, "from 6").await.unwrap().is_admitted());
    assert_eq!(read(&mut client, 5).await.unwrap(), Fenced::Stale(Stale { access: Access::Read, highest: 6, got: 5 }));
    assert_eq!(read(&mut client, 6).await.unwrap(), Fenced::Admitted("from 6".to_owned()), "the writer reads");
}

/// A table created before fenced reads (no `written` column, one token per
/// row) keeps working: `create_table` adds the column, an old row reads as
/// write = seen = its token.
#[tokio::test]
async fn a_table_from_before_fenced_reads_keeps_its_marks() {
    let server = tokio::task::spawn_blocking(PgServer::start).await.unwrap();
    let client = connect(&server).await;
    client
        .batch_execute(
            "CREATE TABLE fencelock_fence (key text PRIMARY KEY, token bigint NOT NULL CHECK (token > 0)); \
             INSERT INTO fencelock_fence VALUES ('old', 15)",
        )
        .await
        .unwrap();
    let fence = PgFence::connect(&server.conn_str()).await.unwrap();
    assert_eq!(fence.marks("old").await.unwrap(), Some(Marks::single(15)));
    assert_eq!(
        fence.admit_read("old", 12).await.unwrap(),
        Fenced::Stale(Stale { access: Access::Read, highest: 15, got: 12 })
    );
    assert!(fence.admit_read("old", 16).await.unwrap().is_admitted());
    assert_eq!(fence.marks("old").await.unwrap(), Some(Marks { write: 15, seen: 16 }));
    drop(server);
}

/// Wait (without a time limit of our own: the test harness has one) until a
/// backend is blocked on a lock.
async fn until_one_waits_on_a_lock(observer: &Client) {
    loop {
        let waiting: i64 = observer
            .query_one("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'", &[])
            .await
            .unwrap()
            .get(0);
        if waiting == 1 {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// Holder 7's transaction holds the fence row; holder 6 arrives meanwhile and
/// blocks on the row. When 7 commits, 6's check runs against the committed
/// mark 7, after the row lock: stale, its SQL never runs. (Checking before
/// the lock would have compared 6 with the old mark 5 and let it through.)
#[tokio::test]
async fn the_check_runs_after_the_row_lock() {
    let (server, mut client) = setup().await;
    assert!(write(&mut client, 5, "from 5").await.unwrap().is_admitted());
    let (entered_tx, entered_rx) = tokio::sync::oneshot::channel();
    let (release_tx, release_rx) = tokio::sync::oneshot::channel::<()>();
    let mut holder7 = connect(&server).await;
    let seven = tokio::spawn(async move {
        PgFence::run(&mut holder7, "doc:1", 7, move |tx| {
            Box::pin(async move {
                let n = tx.execute("UPDATE doc SET body = 'from 7' WHERE id = 1", &[]).await?;
                entered_tx.send(()).unwrap();
                release_rx.await.unwrap();
                Ok::<_, tokio_postgres::Error>(n)
            })
        })
        .await
        .unwrap()
    });
    entered_rx.await.unwrap();
    let mut holder6 = connect(&server).await;
    let six = tokio::spawn(async move { write(&mut holder6, 6, "late 6").await.unwrap() });
    until_one_waits_on_a_lock(&client).await;
    release_tx.send(()).unwrap();
    assert_eq!(seven.await.unwrap(), Fenced::Admitted(1));
    assert_eq!(six.await.unwrap(), Fenced::Stale(Stale { access: Access::Write, highest: 7, got: 6 }));
    assert_eq!(body(&client).await, "from 7");
    assert_eq!(mark(&client, "doc:1").await, Some(7));
}

#[tokio::test]
async fn marks_survive_a_crash_of_postgres() {
    let mut server = tokio::task::spawn_blocking(PgServer::start).await.unwrap();
    {
        let fence = PgFence::connect(&server.conn_str()).await.unwrap();
        for (key, token) in [("a", 3), ("b", 10), ("a", 7)] {
            assert!(fence.admit(key, token).await.unwrap().is_admitted());
        }
    }
    let mut server = tokio::task::spawn_blocking(move || {
        server.crash_and_restart();
        server
    })
    .await
    .unwrap();
    let fence = PgFence::connect(&server.conn_str()).await.unwrap();
    assert_eq!(fence.highest("a").await.unwrap(), Some(7));
    assert_eq!(fence.highest("b").await.unwrap(), Some(10));
    assert_eq!(fence.admit("a", 6).await.unwrap(), Fenced::Stale(Stale { access: Access::Write, highest: 7, got: 6 }));
    drop(fence);
    server = tokio::task::spawn_blocking(move || {
        server.crash_and_restart();
        server
    })
    .await
    .unwrap();
    let fence = PgFence::connect(&server.conn_str()).await.unwrap();
    assert_eq!(fence.highest("a").await.unwrap(), Some(7));
    drop(server);
}
