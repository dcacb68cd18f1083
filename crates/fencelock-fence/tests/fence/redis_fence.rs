//! RedisFence: the write (or read) happens in the same script as the check,
//! a stale write writes nothing, a stale read reads nothing, a mark stored
//! before fenced reads still works, a refused write leaves the mark, and
//! marks survive a SIGKILL of redis-server (AOF, appendfsync always).

use fencelock_fence::{Access, Fence, FenceError, Fenced, Marks, RedisFence, RedisWrite, Stale};
use redis::aio::MultiplexedConnection;

use crate::support::RedisServer;

async fn setup() -> (RedisServer, RedisFence, MultiplexedConnection) {
    let server = tokio::task::spawn_blocking(RedisServer::start).await.unwrap();
    let fence = RedisFence::connect(&server.url()).await.unwrap();
    let conn = redis::Client::open(server.url()).unwrap().get_multiplexed_async_connection().await.unwrap();
    (server, fence, conn)
}

async fn get(conn: &mut MultiplexedConnection, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query_async(conn).await.unwrap()
}

fn set(key: &str, value: &str) -> RedisWrite {
    RedisWrite::Set { key: key.into(), value: value.into() }
}

#[tokio::test]
async fn a_stale_write_writes_nothing() {
    let (_server, fence, mut conn) = setup().await;
    assert_eq!(fence.write("doc", 5, set("doc:v", "from 5")).await.unwrap(), Fenced::Admitted(0));
    assert_eq!(fence.write("doc", 6, set("doc:v", "from 6")).await.unwrap(), Fenced::Admitted(0));
    assert_eq!(
        fence.write("doc", 5, set("doc:v", "late 5")).await.unwrap(),
        Fenced::Stale(Stale { access: Access::Write, highest: 6, got: 5 })
    );
    assert_eq!(get(&mut conn, "doc:v").await.as_deref(), Some("from 6"));
    assert_eq!(get(&mut conn, "fencelock:fence:doc").await.as_deref(), Some("6"));
    assert_eq!(fence.highest("doc").await.unwrap(), Some(6));
}

#[tokio::test]
async fn every_write_op() {
    let (_server, fence, mut conn) = setup().await;
    let append = |v: &str| RedisWrite::Append { key: "log".into(), value: v.into() };
    assert_eq!(fence.write("log", 1, append("a")).await.unwrap(), Fenced::Admitted(1));
    assert_eq!(fence.write("log", 2, append("bc")).await.unwrap(), Fenced::Admitted(3));
    assert_eq!(
        fence.write("log", 1, append("x")).await.unwrap(),
        Fenced::Stale(Stale { access: Access::Write, highest: 2, got: 1 })
    );
    assert_eq!(get(&mut conn, "log").await.as_deref(), Some("abc"));
    let hset =
        RedisWrite::HSet { key: "h".into(), fields: vec![("f1".into(), b"1".to_vec()), ("f2".into(), b"2".to_vec())] };
    assert_eq!(fence.write("h", 4, hset).await.unwrap(), Fenced::Admitted(2));
    let fields: Vec<String> = redis::cmd("HVALS").arg("h").query_async(&mut conn).await.unwrap();
    assert_eq!(fields, vec!["1", "2"]);
    assert_eq!(fence.write("h", 4, RedisWrite::Del { key: "h".into() }).await.unwrap(), Fenced::Admitted(1));
    assert_eq!(
        fence.write("h", 3, RedisWrite::Del { key: "log".into() }).await.unwrap(),
        Fenced::Stale(Stale { access: Access::Write, highest: 4, got: 3 })
    );
    assert_eq!(get(&mut conn, "log").await.as_deref(), Some("abc"));
}

#[tokio::test]
async fn a_write_redis_refuses_leaves_the_mark() {
    let (_server, fence, mut conn) = setup().await;
    assert!(fence.write("s", 2, set("s", "a string")).await.unwrap().is_admitted());
    let hset = RedisWrite::HSet { key: "s".into(), fields: vec![("f".into(), b"v".to_vec())] };
    let err = fence.write("s", 9, hset).await.unwrap_err();
    assert!(matches!(&err, FenceError::Storage(e) if e.to_string().contains("WRONGTYPE")), "{err}");
    assert_eq!(fence.highest("s").await.unwrap(), Some(2));
    assert_eq!(get(&mut conn, "s").await.as_deref(), Some("a string"));
}

#[tokio::test]
async fn a_fenced_read_stops_an_older_write() {
    let (_server, fence, mut conn) = setup().await;
    assert!(fence.write("doc", 5, set("doc", "v5")).await.unwrap().is_admitted());
    assert_eq!(fence.read("doc", 6, "doc").await.unwrap(), Fenced::Admitted(Some(b"v5".to_vec())), "holder 6 reads");
    let late = fence.write("doc", 5, set("doc", "late 5")).await.unwrap();
    assert_eq!(late, Fenced::Stale(Stale { access: Access::Write, highest: 6, got: 5 }));
    assert_eq!(get(&mut conn, "doc").await.as_deref(), Some("v5"));
    assert_eq!(get(&mut conn, "fencelock:fence:doc").await.as_deref(), Some("5:6"), "the marks as stored");
}

/// `RedisFence::read` by the read rule: readers in any token order read;
/// after a newer write an older reader gets nothing; a missing data key
/// reads as `None`.
#[tokio::test]
async fn a_stale_read_reads_nothing() {
    let (_server, fence, _conn) = setup().await;
    assert_eq!(fence.read("doc", 2, "doc").await.unwrap(), Fenced::Admitted(None), "nothing written yet");
    assert!(fence.write("doc", 3, set("doc", "v3")).await.unwrap().is_admitted());
    assert_eq!(fence.read("doc", 5, "doc").await.unwrap(), Fenced::Admitted(Some(b"v3".to_vec())));
    assert_eq!(fence.read("doc", 4, "doc").await.unwrap(), Fenced::Admitted(Some(b"v3".to_vec())), "4 after 5");
    assert!(fence.write("doc", 6, set("doc", "v6")).await.unwrap().is_admitted());
    assert_eq!(
        fence.read("doc", 5, "doc").await.unwrap(),
        Fenced::Stale(Stale { access: Access::Read, highest: 6, got: 5 })
    );
    assert_eq!(fence.marks("doc").await.unwrap(), Some(Marks::single(6)));
}

/// A mark stored before fenced reads (one decimal) reads as write = seen.
#[tokio::test]
async fn a_mark_from_before_fenced_reads_is_both_marks() {
    let (_server, fence, mut conn) = setup().await;
    let () = redis::cmd("SET").arg("fencelock:fence:old").arg("15").query_async(&mut conn).await.unwrap();
    assert_eq!(fence.marks("old").await.unwrap(), Some(Marks::single(15)));
    assert_eq!(
        fence.admit_read("old", 12).await.unwrap(),
        Fenced::Stale(Stale { access: Access::Read, highest: 15, got: 12 })
    );
    assert_eq!(
        fence.admit("old", 14).await.unwrap(),
        Fenced::Stale(Stale { access: Access::Write, highest: 15, got: 14 })
    );
    assert!(fence.admit_read("old", 16).await.unwrap().is_admitted());
    assert_eq!(get(&mut conn, "fencelock:fence:old").await.as_deref(), Some("15:16"));
}

#[tokio::test]
async fn the_script_refuses_bad_calls_without_writing() {
    let (_server, _fence, mut conn) = setup().await;
    let script = redis::Script::new(fencelock_fence::redis::SCRIPT);
    for (token, op, args) in [
        ("0", "SET", vec!["v"]),
        ("-1", "SET", vec!["v"]),
        ("9223372036854775808", "SET", vec!["v"]),
        ("5", "INCR", vec![]),
        ("5", "SET", vec![]),
        ("5", "HSET", vec!["f"]),
    ] {
        let mut call = script.key("fencelock:fence:k");
        call.key("k").arg(token).arg(op);
        for a in args {
            call.arg(a);
        }
        let result: redis::RedisResult<redis::Value> = call.invoke_async(&mut conn).await;
        assert!(result.is_err(), "token {token} op {op} must be refused");
    }
    assert_eq!(get(&mut conn, "k").await, None);
    assert_eq!(get(&mut conn, "fencelock:fence:k").await, None);
}

#[tokio::test]
async fn marks_survive_a_sigkill_of_redis() {
    let (server, fence, _conn) = setup().await;
    assert!(fence.write("doc", 41, set("doc", "v41")).await.unwrap().is_admitted());
    assert!(fence.admit("other", 7).await.unwrap().is_admitted());
    drop(fence);
    let server = tokio::task::spawn_blocking(move || {
        let mut server = server;
        server.kill_and_restart();
        server
    })
    .await
    .unwrap();
    let fence = RedisFence::connect(&server.url()).await.unwrap();
    assert_eq!(fence.highest("doc").await.unwrap(), Some(41));
    assert_eq!(fence.highest("other").await.unwrap(), Some(7));
    assert_eq!(
        fence.write("doc", 40, set("doc", "late")).await.unwrap(),
        Fenced::Stale(Stale { access: Access::Write, highest: 41, got: 40 })
    );
    let mut conn = redis::Client::open(server.url()).unwrap().get_multiplexed_async_connection().await.unwrap();
    assert_eq!(get(&mut conn, "doc").await.as_deref(), Some("v41"));
}
