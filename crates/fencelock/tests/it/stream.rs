//! The client's stream transport (issue 19 §1) against the real server: the
//! acquires, releases and keep-alives of one `Client` share one `Session`
//! stream per server, a stream that breaks is replaced without losing the
//! exactly-once guarantee, and the unary transport still works when chosen.
//! The number of streams is the client's own count (`Client::streams_opened`);
//! what the server did is read from the server (a direct observer client and
//! `/metrics`).

use crate::support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fencelock::{Client, Error, Outcome, Transport};
use support::proxy::{Mode, Proxy};
use support::{acquired, eventually, holder, within, Server, SECS};

/// Locks taken and released, `n` at once on distinct locks and `n` more
/// queueing for one shared lock, all through `client`. Returns the tokens.
async fn many_locks(client: &Client, n: usize) -> Vec<u64> {
    let tasks: Vec<_> = (0..2 * n)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move {
                let name = if i < n { format!("own-{i}") } else { "shared".to_string() };
                let g = acquired(client.lock(name).wait(10 * SECS).acquire().await.unwrap());
                let token = g.token().unwrap();
                assert_eq!(g.release().await, Ok(true));
                token
            })
        })
        .collect();
    let mut tokens = Vec::new();
    for t in tasks {
        tokens.push(within("a lock cycle", t).await.unwrap());
    }
    tokens
}

/// Issue 19 §1: many locks of one client (acquires on distinct locks, waits
/// queued on one lock, their releases, the shared lease's keep-alives) share
/// one stream; each grant has its own token.
#[tokio::test]
async fn the_locks_of_one_client_share_one_stream() {
    let server = Server::start().await;
    let client = server.client().await;
    assert_eq!(client.streams_opened(), 0, "opened on first use");
    let mut tokens = many_locks(&client, 16).await;
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), 32, "every grant its own token");
    assert_eq!(client.streams_opened(), 1, "one stream for every lock of the client");
    assert_eq!(client.clone().streams_opened(), 1, "clones share it");
    server.stop().await;
}

/// `Transport::Unary` (builder) and `transport=unary` (URL) send every
/// operation as its own call: the same locks work and no stream is opened.
/// A transport the URL grammar does not know is refused before dialing.
#[tokio::test]
async fn the_unary_transport_still_works() {
    let server = Server::start().await;
    let built = Client::builder(server.url.clone()).transport(Transport::Unary).connect().await.unwrap();
    let from_url = Client::connect(format!("{}?transport=unary", server.url)).await.unwrap();
    for client in [&built, &from_url] {
        assert_eq!(many_locks(client, 4).await.len(), 8);
        assert_eq!(client.streams_opened(), 0, "no stream with the unary transport");
    }
    let streamed = Client::connect(format!("{}?transport=stream", server.url)).await.unwrap();
    assert_eq!(many_locks(&streamed, 4).await.len(), 8);
    assert_eq!(streamed.streams_opened(), 1);
    let bad = Client::connect(format!("{}?transport=pigeon", server.url)).await;
    assert!(matches!(&bad, Err(Error::InvalidArgument(m)) if m.contains("transport=pigeon")), "{bad:?}");
    server.stop().await;
}

/// INV-6 over the stream: the server grants an acquire and its answer is lost
/// on the stream; the stream breaks and the server restarts before the client
/// sees the answer. The client retries the same request id on a new stream
/// (to the restarted server, whose dedup memory is durable state) and gets
/// that same grant: one grant, not two, and the server's holder is it.
#[tokio::test]
async fn an_acquire_whose_stream_breaks_after_the_grant_gets_that_grant_after_a_restart() {
    let mut server = Server::start().await;
    let proxy = Proxy::start(server.grpc_addr).await;
    let client = Client::connect(proxy.url()).await.unwrap();
    // The shared lease and the stream exist before the fault, so that the
    // acquire is the one operation in flight when it hits.
    let warm = acquired(client.lock("warm").acquire().await.unwrap());
    assert_eq!(client.streams_opened(), 1);
    let issued = server.metric("fencelock_tokens_issued").await;
    let observer = server.client().await;

    proxy.set_mode(Mode::DropReplies);
    let dropped = proxy.dropped_bytes();
    let pending = tokio::spawn(client.lock("a").acquire());
    eventually("granted on the server, answer dropped", || async {
        holder(&observer, "a").await.is_some() && proxy.dropped_bytes() > dropped
    })
    .await;
    let granted = holder(&observer, "a").await.unwrap();
    assert!(!pending.is_finished(), "the client has not seen the answer");
    proxy.set_mode(Mode::Reset); // the stream breaks
    server.restart().await;
    proxy.set_mode(Mode::Pass);
    let guard = acquired(within("the retried acquire", pending).await.unwrap().unwrap());

    assert_eq!((guard.lease_id(), guard.token().unwrap()), granted, "the retry got the first grant");
    assert!(client.streams_opened() >= 2, "the retry went over a new stream");
    let observer = server.client().await;
    assert_eq!(holder(&observer, "a").await, Some(granted), "the server's holder is that grant");
    assert_eq!(server.metric("fencelock_tokens_issued").await, issued + 1, "one grant, not two");
    assert!(!guard.is_lost() && !warm.is_lost(), "the lease survived the restart");
    assert_eq!(guard.release().await, Ok(true));
    assert_eq!(holder(&observer, "a").await, None, "released over the new stream");
    drop(warm);
    server.stop().await;
}

/// A dropped acquire that waits in the queue is cancelled over the stream: the
/// server withdraws it (the waiter is gone while the stream stays open), and
/// the stream carries on for the next lock.
#[tokio::test]
async fn a_dropped_waiting_acquire_is_withdrawn_over_the_stream() {
    let server = Server::start().await;
    let (holder_client, client) = (server.client().await, server.client().await);
    let held = acquired(holder_client.lock("q").acquire().await.unwrap());
    let waiting = tokio::spawn({
        let client = client.clone();
        async move { client.lock("q").wait(Duration::from_secs(60)).acquire().await }
    });
    eventually("queued", || async { support::waiters(&holder_client, "q").await == 1 }).await;
    waiting.abort();
    eventually("withdrawn", || async { support::waiters(&holder_client, "q").await == 0 }).await;
    assert_eq!(held.release().await, Ok(true));
    assert!(matches!(client.lock("q").acquire().await, Ok(Outcome::Acquired(_))), "the stream still serves");
    assert_eq!(client.streams_opened(), 1, "the cancel did not cost the stream");
    server.stop().await;
}

/// A TCP front for `server` that answers a connection beginning with the
/// framed protocol's first byte as an HTTP/1 server would (a plain-text 400,
/// then the end) and relays every other connection: a server, or a proxy,
/// that does not speak the framed protocol. Counts the framed attempts.
async fn front_without_framing(server: std::net::SocketAddr) -> (String, Arc<AtomicUsize>) {
    use tokio::io::AsyncWriteExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let attempts = Arc::new(AtomicUsize::new(0));
    let counted = attempts.clone();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let counted = counted.clone();
            tokio::spawn(async move {
                let mut first = [0u8; 1];
                if conn.peek(&mut first).await.is_err() {
                    return;
                }
                if first[0] == fencelock_proto::framing::PREFACE[0] {
                    counted.fetch_add(1, Ordering::SeqCst);
                    let _ = conn.write_all(b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n").await;
                    return;
                }
                if let Ok(mut upstream) = tokio::net::TcpStream::connect(server).await {
                    let _ = tokio::io::copy_bidirectional(&mut conn, &mut upstream).await;
                }
            });
        }
    });
    (url, attempts)
}

/// Issue 38 §1: on a plaintext server the stream is the framed session on a
/// connection of its own (two connections through a proxy: the gRPC channel
/// and the session); through a front that does not speak it, the client
/// opens the gRPC `Session` call instead, after one framed attempt.
#[tokio::test]
async fn the_stream_is_framed_where_the_server_speaks_it_and_grpc_elsewhere() {
    let server = Server::start().await;
    let proxy = Proxy::start(server.grpc_addr).await;
    let client = Client::connect(proxy.url()).await.unwrap();
    assert_eq!(many_locks(&client, 4).await.len(), 8);
    assert_eq!((client.streams_opened(), proxy.accepted()), (1, 2), "the session on a connection of its own");

    let (url, attempts) = front_without_framing(server.grpc_addr).await;
    let client = Client::connect(url).await.unwrap();
    assert_eq!(many_locks(&client, 4).await.len(), 8);
    assert_eq!((client.streams_opened(), attempts.load(Ordering::SeqCst)), (1, 1), "one framed attempt, then gRPC");
    server.stop().await;
}

/// A refused token on the framed session is the refusal a gRPC call gets
/// (`Unauthenticated`), not a broken stream retried until the deadline.
#[tokio::test]
async fn a_refused_token_on_the_framed_session_is_unauthenticated() {
    let dir = tempfile::tempdir().unwrap();
    let app = fencelock_server::auth::new_token().unwrap();
    let file = format!(
        "[roles.app]\nrules = [{{ prefix = \"\", verbs = [\"acquire\", \"read\"] }}]\n\
         [[tokens]]\nname = \"app\"\nid = \"{}\"\nhash = \"{}\"\nroles = [\"app\"]\n",
        app.id, app.hash
    );
    std::fs::write(dir.path().join("auth.toml"), file).unwrap();
    let mut config = fencelock_server::Config::for_test(dir.path().join("data"));
    config.auth_file = Some(dir.path().join("auth.toml"));
    let running = fencelock_server::start(config).await.unwrap();
    let url = format!("http://{}", running.grpc_addr);
    let as_token = |t: &str| Client::builder(url.clone()).token(t.to_string()).connect();
    let good = as_token(&app.token).await.unwrap();
    let guard = acquired(within("acquire", good.lock("a").acquire()).await.unwrap());
    assert_eq!(guard.release().await, Ok(true));
    let wrong = as_token("flt_00000000_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA").await.unwrap();
    let refused = within("a refusal", wrong.lock("a").acquire()).await;
    assert!(matches!(refused, Err(Error::Unauthenticated(_))), "{refused:?}");
    within("shutdown", running.shutdown()).await;
}
