//! The fenced storage server over real HTTP: stale writes, fenced reads, bad
//! requests, concurrent writers checked against the audit log, restarts, and
//! SIGKILL of a server process in the middle of writes.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use fencelock_fence::storage::{self, AuditEntry, Outcome};
use fencelock_fence::{Access, Stale};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::ChildGuard;

// ------------------------------------------------------------ the client ---

/// A response: status, body.
#[derive(Debug)]
pub(crate) struct Resp {
    pub(crate) status: u16,
    pub(crate) body: Vec<u8>,
}

impl Resp {
    pub(crate) fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", String::from_utf8_lossy(&self.body)))
    }
    pub(crate) fn text(&self) -> String {
        String::from_utf8(self.body.clone()).unwrap()
    }
}

/// One HTTP/1.1 request on its own connection (`Connection: close`), written
/// by hand so that malformed requests can be sent too.
async fn request(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Resp {
    try_request(addr, method, path, headers, body).await.unwrap_or_else(|e| panic!("{method} {path}: {e}"))
}

pub(crate) async fn try_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<Resp> {
    let mut stream = TcpStream::connect(addr).await?;
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n");
    if !headers
        .iter()
        .any(|(n, _)| n.eq_ignore_ascii_case("content-length") || n.eq_ignore_ascii_case("transfer-encoding"))
    {
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body).await?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await?;
    parse_response(&raw)
        .ok_or_else(|| std::io::Error::other(format!("bad response {:?}", String::from_utf8_lossy(&raw))))
}

pub(crate) fn parse_response(raw: &[u8]) -> Option<Resp> {
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&raw[..split]).ok()?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    let mut body = raw[split + 4..].to_vec();
    if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        body = dechunk(&body)?;
    }
    let length = head
        .lines()
        .find_map(|l| l.split_once(':').filter(|(n, _)| n.eq_ignore_ascii_case("content-length")))
        .and_then(|(_, v)| v.trim().parse::<usize>().ok());
    if let Some(length) = length {
        body.truncate(length);
    }
    Some(Resp { status, body })
}

fn dechunk(mut rest: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let end = rest.windows(2).position(|w| w == b"\r\n")?;
        let size = usize::from_str_radix(std::str::from_utf8(&rest[..end]).ok()?.trim(), 16).ok()?;
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(rest.get(end + 2..end + 2 + size)?);
        rest = rest.get(end + 4 + size..)?;
    }
}

pub(crate) fn fenced(token: &str) -> [(&'static str, &str); 2] {
    [("Fencing-Lock", "doc-lock"), ("Fencing-Token", token)]
}

async fn put(addr: SocketAddr, key: &str, token: u64, body: &str) -> Resp {
    request(addr, "PUT", &format!("/objects/{key}"), &fenced(&token.to_string()), body.as_bytes()).await
}

async fn mark(addr: SocketAddr, key: &str) -> Value {
    request(addr, "GET", &format!("/fence/{key}"), &[], b"").await.json()["highest"].clone()
}

/// The key's highest token and last write's token, as `GET /fence/{key}` says.
async fn marks(addr: SocketAddr, key: &str) -> (Value, Value) {
    let j = request(addr, "GET", &format!("/fence/{key}"), &[], b"").await.json();
    (j["highest"].clone(), j["last_write"].clone())
}

/// The `409` body of a token refused by the fence's rule for `access`.
pub(crate) fn stale_body(access: Access, highest: u64, got: u64) -> Value {
    let rule = Stale { access, highest, got }.to_string();
    json!({"error": "stale token", "rule": rule, "highest": highest, "got": got})
}

async fn audit(addr: SocketAddr) -> Vec<AuditEntry> {
    let resp = request(addr, "GET", "/log", &[], b"").await;
    assert_eq!(resp.status, 200);
    resp.text().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

// ------------------------------------------------------------ the server ---

/// The storage server in this process, on a port of its own.
struct Server {
    addr: SocketAddr,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Server {
    async fn start(dir: &Path) -> Self {
        Self::start_with(storage::Config::new(dir)).await
    }

    async fn start_with(config: storage::Config) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(storage::serve_with(listener, config, async move {
            let _ = stopped.await;
        }));
        Server { addr, stop, task }
    }

    async fn shutdown(self) {
        self.stop.send(()).unwrap();
        self.task.await.unwrap().unwrap();
    }
}

// ------------------------------------------------------------- the tests ---

#[tokio::test]
async fn put_get_delete_and_a_stale_write() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path()).await;
    let r = put(s.addr, "doc", 5, "v5").await;
    assert_eq!((r.status, r.json()), (201, json!({"key": "doc", "token": 5, "size": 2})));
    let r = put(s.addr, "doc", 5, "v5b").await;
    assert_eq!((r.status, r.json()), (200, json!({"key": "doc", "token": 5, "size": 3})), "equal token admitted");
    let r = put(s.addr, "doc", 4, "late").await;
    assert_eq!((r.status, r.json()), (409, stale_body(Access::Write, 5, 4)));
    let r = request(s.addr, "GET", "/objects/doc", &[], b"").await;
    assert_eq!((r.status, r.text()), (200, "v5b".to_owned()));
    let r = request(s.addr, "DELETE", "/objects/doc", &fenced("3"), b"").await;
    assert_eq!((r.status, r.json()), (409, stale_body(Access::Write, 5, 3)));
    let r = request(s.addr, "DELETE", "/objects/doc", &fenced("6"), b"").await;
    assert_eq!((r.status, r.json()), (200, json!({"key": "doc", "token": 6, "existed": true})));
    let r = request(s.addr, "GET", "/objects/doc", &[], b"").await;
    assert_eq!((r.status, r.json()), (404, json!({"error": "not found", "key": "doc"})));
    assert_eq!(mark(s.addr, "doc").await, json!(6));
    let log: Vec<_> =
        audit(s.addr).await.into_iter().map(|e| (e.seq, e.op, e.token, e.outcome, e.highest, e.lock)).collect();
    let lock = || "doc-lock".to_owned();
    assert_eq!(
        log,
        vec![
            (0, "PUT".into(), 5, Outcome::Accepted, 5, lock()),
            (1, "PUT".into(), 5, Outcome::Accepted, 5, lock()),
            (2, "PUT".into(), 4, Outcome::Stale, 5, lock()),
            (3, "DELETE".into(), 3, Outcome::Stale, 5, lock()),
            (4, "DELETE".into(), 6, Outcome::Accepted, 6, lock()),
        ]
    );
    s.shutdown().await;
}

/// A fenced GET is a read by the fence's read rule (`Marks::admit`): it
/// raises the highest token, so holder 5's late write is refused after
/// holder 6 read; holder 5 may still read until a newer holder writes, then
/// its read is refused too (INV: no stale accepts at the resource).
#[tokio::test]
async fn a_fenced_get_raises_the_mark() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path()).await;
    assert_eq!(put(s.addr, "doc", 5, "v5").await.status, 201, "holder 5 writes");
    let r = request(s.addr, "GET", "/objects/doc", &fenced("6"), b"").await;
    assert_eq!((r.status, r.text()), (200, "v5".to_owned()), "holder 6 reads, fenced");
    assert_eq!(marks(s.addr, "doc").await, (json!(6), json!(5)));
    let r = put(s.addr, "doc", 5, "late 5").await;
    assert_eq!((r.status, r.json()), (409, stale_body(Access::Write, 6, 5)), "holder 5's late write");
    let r = request(s.addr, "GET", "/objects/doc", &fenced("5"), b"").await;
    assert_eq!((r.status, r.text()), (200, "v5".to_owned()), "nothing was written since holder 5's grant");
    assert_eq!(put(s.addr, "doc", 6, "v6").await.status, 200, "holder 6 writes");
    let r = request(s.addr, "GET", "/objects/doc", &fenced("5"), b"").await;
    assert_eq!((r.status, r.json()), (409, stale_body(Access::Read, 6, 5)), "a stale fenced read after a newer write");
    let r = request(s.addr, "GET", "/objects/doc", &[], b"").await;
    assert_eq!((r.status, r.text()), (200, "v6".to_owned()));
    assert_eq!(mark(s.addr, "doc").await, json!(6), "an unfenced read leaves the mark");
    let r = request(s.addr, "GET", "/objects/missing", &fenced("2"), b"").await;
    assert_eq!(r.status, 404);
    assert_eq!(
        mark(s.addr, "missing").await,
        Value::Null,
        "a fenced read of a missing, unmarked object creates no mark (issue 14)"
    );
    let ops: Vec<_> = audit(s.addr).await.into_iter().map(|e| (e.op, e.key, e.token, e.outcome)).collect();
    let e = |op: &str, key: &str, t, o| (op.to_owned(), key.to_owned(), t, o);
    assert_eq!(
        ops,
        vec![
            e("PUT", "doc", 5, Outcome::Accepted),
            e("GET", "doc", 6, Outcome::Accepted),
            e("PUT", "doc", 5, Outcome::Stale),
            e("GET", "doc", 5, Outcome::Accepted),
            e("PUT", "doc", 6, Outcome::Accepted),
            e("GET", "doc", 5, Outcome::Stale),
        ]
    );
    s.shutdown().await;
}

#[tokio::test]
async fn bad_requests_get_4xx_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path()).await;
    let a = s.addr;
    // (method, path, headers, body, status, error)
    type Case<'a> = (&'a str, String, Vec<(&'a str, &'a str)>, Vec<u8>, u16, &'a str);
    let cases: Vec<Case> = vec![
        (
            "PUT",
            "/objects/doc".into(),
            vec![],
            b"x".to_vec(),
            400,
            "writes need Fencing-Lock and Fencing-Token headers",
        ),
        ("DELETE", "/objects/doc".into(), vec![], vec![], 400, "writes need Fencing-Lock and Fencing-Token headers"),
        ("PUT", "/objects/doc".into(), vec![("Fencing-Token", "5")], b"x".to_vec(), 400, "missing Fencing-Lock header"),
        ("PUT", "/objects/doc".into(), vec![("Fencing-Lock", "l")], b"x".to_vec(), 400, "missing Fencing-Token header"),
        ("GET", "/objects/doc".into(), vec![("Fencing-Token", "5")], vec![], 400, "missing Fencing-Lock header"),
        (
            "PUT",
            "/objects/doc".into(),
            fenced("0").to_vec(),
            b"x".to_vec(),
            400,
            "Fencing-Token 0 is not a token (tokens start at 1)",
        ),
        (
            "PUT",
            "/objects/.hidden".into(),
            fenced("5").to_vec(),
            b"x".to_vec(),
            400,
            "invalid object key: object keys may not start with '.'",
        ),
        (
            "PUT",
            "/objects/a%2Fb".into(),
            fenced("5").to_vec(),
            b"x".to_vec(),
            400,
            "invalid object key: object keys may hold only A-Z a-z 0-9 . _ -",
        ),
        (
            "PUT",
            "/objects/a%20b".into(),
            fenced("5").to_vec(),
            b"x".to_vec(),
            400,
            "invalid object key: object keys may hold only A-Z a-z 0-9 . _ -",
        ),
        (
            "PUT",
            format!("/objects/{}", "k".repeat(201)),
            fenced("5").to_vec(),
            b"x".to_vec(),
            400,
            "invalid object key: object keys are 1 to 200 bytes long",
        ),
    ];
    for (method, path, headers, body, status, error) in cases {
        let r = request(a, method, &path, &headers, &body).await;
        assert_eq!((r.status, r.json()), (status, json!({ "error": error })), "{method} {path} {headers:?}");
    }
    for token in ["abc", "-1", "+5", "1.5", "", " ", "0x10", "9223372036854775808", "99999999999999999999999"] {
        let r = request(a, "PUT", "/objects/doc", &fenced(token), b"x").await;
        assert_eq!(r.status, 400, "token {token:?}");
        let error = r.json()["error"].as_str().unwrap().to_owned();
        assert!(error.starts_with("malformed Fencing-Token"), "token {token:?}: {error}");
    }
    // Oversized: declared by Content-Length (refused before the body is read)...
    let limit = storage::DEFAULT_MAX_BODY;
    let too_long = (limit + 1).to_string();
    let mut headers = fenced("5").to_vec();
    headers.push(("Content-Length", &too_long));
    let r = request(a, "PUT", "/objects/doc", &headers, b"").await;
    assert_eq!((r.status, r.json()), (413, json!({"error": "body too large", "limit": limit})));
    // ...and sent chunked, with no length declared.
    let r = chunked_put(a, "doc", "5", limit + 1).await;
    assert_eq!((r.status, r.json()), (413, json!({"error": "body too large", "limit": limit})));
    // Nothing changed: no object, no mark, no log entry; token 1 still works.
    assert_eq!(request(a, "GET", "/objects/doc", &[], b"").await.status, 404);
    assert_eq!(mark(a, "doc").await, Value::Null);
    assert_eq!(audit(a).await, vec![]);
    let exactly = "x".repeat(limit);
    assert_eq!(put(a, "doc", 1, &exactly).await.status, 201, "a body of exactly the limit is fine");
    assert_eq!(request(a, "GET", "/objects/doc", &[], b"").await.body.len(), limit);
    s.shutdown().await;
}

/// A PUT with a chunked body of `len` bytes.
async fn chunked_put(addr: SocketAddr, key: &str, token: &str, len: usize) -> Resp {
    let mut body = Vec::new();
    for chunk in vec![b'y'; len].chunks(64 * 1024) {
        body.extend(format!("{:x}\r\n", chunk.len()).as_bytes());
        body.extend(chunk);
        body.extend(b"\r\n");
    }
    body.extend(b"0\r\n\r\n");
    let mut headers = fenced(token).to_vec();
    headers.push(("Transfer-Encoding", "chunked"));
    request(addr, "PUT", &format!("/objects/{key}"), &headers, &body).await
}

/// 16 writers PUT random tokens on 3 keys at once. The audit log, in order,
/// must replay per key as a fence would: accepted tokens never go down,
/// every stale entry is below the mark of its moment and names it; the
/// answers the writers got must match the log one to one; each object must
/// hold the body of its key's last accepted PUT.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writers_agree_with_the_audit_log() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path()).await;
    let mut tasks = Vec::new();
    for task in 0..16u64 {
        let addr = s.addr;
        tasks.push(tokio::spawn(async move {
            let mut rng = fastrand::Rng::with_seed(100 + task);
            let mut answers = Vec::new();
            for op in 0..12u64 {
                let key = format!("obj{}", rng.u8(..3));
                // Unique tokens, so each body is known by (key, token).
                let token = rng.u64(1..=(2 + op)) * 1000 + task * 20 + op;
                let body = format!("task {task} op {op} token {token}");
                let r = put(addr, &key, token, &body).await;
                answers.push((key, token, body, r.status, r.json()));
            }
            answers
        }));
    }
    let mut answers = Vec::new();
    for t in tasks {
        answers.extend(t.await.unwrap());
    }
    let log = audit(s.addr).await;
    assert_eq!(log.len(), answers.len(), "one log entry per fenced request");
    let mut marks: HashMap<String, u64> = HashMap::new();
    let mut last_body: HashMap<String, u64> = HashMap::new();
    for (i, e) in log.iter().enumerate() {
        assert_eq!(e.seq, i as u64);
        let mark = marks.get(&e.key).copied();
        match e.outcome {
            Outcome::Accepted => {
                assert!(mark.is_none_or(|m| m <= e.token), "entry {i}: accepted {} after {mark:?}", e.token);
                assert_eq!(e.highest, e.token);
                marks.insert(e.key.clone(), e.token);
                last_body.insert(e.key.clone(), e.token);
            }
            Outcome::Stale => {
                assert_eq!(Some(e.highest), mark, "entry {i}: a stale entry names the mark of its moment");
                assert!(e.token < e.highest, "entry {i}");
            }
            Outcome::Unfenced => {
                panic!("entry {i}: an enforcing server never carries out a stale write")
            }
        }
    }
    let by_token: HashMap<(String, u64), (String, u16, Value)> =
        answers.iter().map(|(k, t, b, st, j)| ((k.clone(), *t), (b.clone(), *st, j.clone()))).collect();
    assert_eq!(by_token.len(), answers.len(), "tokens are unique");
    for e in &log {
        let (_, status, body) = &by_token[&(e.key.clone(), e.token)];
        match e.outcome {
            Outcome::Accepted => assert!(*status == 200 || *status == 201, "{e:?}: {status}"),
            Outcome::Stale => {
                assert_eq!((*status, body), (409, &stale_body(Access::Write, e.highest, e.token)))
            }
            Outcome::Unfenced => {
                panic!("{e:?}: an enforcing server never carries out a stale write")
            }
        }
    }
    let stale = log.iter().filter(|e| e.outcome == Outcome::Stale).count();
    assert!(stale > 0 && stale < log.len(), "{stale} stale of {}", log.len());
    for (key, token) in &last_body {
        let r = request(s.addr, "GET", &format!("/objects/{key}"), &[], b"").await;
        assert_eq!(r.text(), by_token[&(key.clone(), *token)].0, "object {key}");
        assert_eq!(mark(s.addr, key).await, json!(token));
    }
    s.shutdown().await;
}

#[tokio::test]
async fn objects_marks_and_log_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path()).await;
    assert_eq!(put(s.addr, "a", 10, "a10").await.status, 201);
    assert_eq!(put(s.addr, "b", 3, "b3").await.status, 201);
    assert_eq!(put(s.addr, "a", 9, "a9").await.status, 409);
    s.shutdown().await;

    let s = Server::start(dir.path()).await;
    assert_eq!(request(s.addr, "GET", "/objects/a", &[], b"").await.text(), "a10");
    assert_eq!(request(s.addr, "GET", "/objects/b", &[], b"").await.text(), "b3");
    assert_eq!((mark(s.addr, "a").await, mark(s.addr, "b").await), (json!(10), json!(3)));
    let r = put(s.addr, "a", 9, "a9 again").await;
    assert_eq!((r.status, r.json()), (409, stale_body(Access::Write, 10, 9)));
    assert_eq!(put(s.addr, "a", 11, "a11").await.status, 200);
    let log: Vec<_> = audit(s.addr).await.into_iter().map(|e| (e.seq, e.key, e.token, e.outcome)).collect();
    assert_eq!(
        log,
        vec![
            (0, "a".into(), 10, Outcome::Accepted),
            (1, "b".into(), 3, Outcome::Accepted),
            (2, "a".into(), 9, Outcome::Stale),
            (3, "a".into(), 9, Outcome::Stale),
            (4, "a".into(), 11, Outcome::Accepted),
        ]
    );
    assert_eq!(request(s.addr, "GET", "/healthz", &[], b"").await.json(), json!({"status": "ok"}));
    s.shutdown().await;
}

// ------------------------------------------------- SIGKILL of the server ---

const CHILD_DIR_ENV: &str = "FENCELOCK_FENCE_TEST_STORAGE_DIR";

/// Runs only as the child of `writes_survive_sigkill_of_the_server`: serve
/// on a free port, print it, serve until killed. (libtest prints "test … "
/// before it on the same line, so the parent looks for the marker anywhere.)
#[tokio::test]
async fn storage_child_serves_until_killed() {
    let Ok(dir) = std::env::var(CHILD_DIR_ENV) else {
        return;
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    println!("LISTENING {}", listener.local_addr().unwrap());
    storage::serve(listener, PathBuf::from(dir), std::future::pending()).await.unwrap();
}

fn spawn_server_process(dir: &Path) -> (ChildGuard, SocketAddr) {
    let mut child = ChildGuard::spawn_test("storage_server::storage_child_serves_until_killed", CHILD_DIR_ENV, dir);
    let mut lines = BufReader::new(child.0.stdout.take().unwrap()).lines();
    let addr = lines
        .find_map(|l| l.ok()?.split_once("LISTENING ").map(|(_, a)| a.trim().parse().unwrap()))
        .expect("the storage child did not report its address");
    (child, addr)
}

/// A writer PUTs rising tokens to 2 keys while the server process is
/// SIGKILLed, three times. After each restart: every acknowledged write is
/// in the log as accepted, each object holds its last acknowledged body or
/// the one body in flight at the kill, the marks are at least the last
/// acknowledged tokens, and a lower token is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_survive_sigkill_of_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let mut acked: HashMap<String, (u64, String)> = HashMap::new();
    let mut token = 0u64;
    for round in 0..3 {
        let (mut child, addr) = spawn_server_process(dir.path());
        let mut in_flight: HashMap<String, String> = HashMap::new();
        let mut sent_this_round = 0;
        loop {
            token += 1;
            let key = format!("k{}", token % 2);
            let body = format!("round {round} token {token}");
            if sent_this_round == 25 {
                // Kill while this request is on its way.
                let req = tokio::spawn({
                    let (key, body) = (key.clone(), body.clone());
                    async move {
                        try_request(
                            addr,
                            "PUT",
                            &format!("/objects/{key}"),
                            &fenced(&token.to_string()),
                            body.as_bytes(),
                        )
                        .await
                    }
                });
                child.kill();
                if let Ok(Ok(r)) = req.await {
                    if r.status == 200 || r.status == 201 {
                        acked.insert(key.clone(), (token, body.clone()));
                    }
                }
                in_flight.insert(key, body);
                break;
            }
            let r = put(addr, &key, token, &body).await;
            assert!(r.status == 200 || r.status == 201, "{:?}", r);
            acked.insert(key, (token, body));
            sent_this_round += 1;
        }
        let s = Server::start(dir.path()).await;
        let log = audit(s.addr).await;
        for (key, (t, body)) in &acked {
            assert!(
                log.iter().any(|e| &e.key == key && e.token == *t && e.outcome == Outcome::Accepted),
                "round {round}: acked {key}@{t} not in log"
            );
            let stored = request(s.addr, "GET", &format!("/objects/{key}"), &[], b"").await.text();
            assert!(
                &stored == body || in_flight.get(key) == Some(&stored),
                "round {round}: {key} holds {stored:?}, acked {body:?}"
            );
            let m = mark(s.addr, key).await.as_u64().unwrap();
            assert!(m >= *t, "round {round}: mark {m} below acked {t}");
            let r = put(s.addr, key, t - 1, "stale").await;
            assert_eq!(r.status, 409, "round {round}: a lower token after restart");
        }
        s.shutdown().await;
    }
}

// ------------------------------------------- issue 14: the storage server ---

/// Issue 14 finding: a fenced GET of a missing key raised (created) its mark,
/// so reading future keys with a high token poisoned them. Now such a read
/// creates no mark and no log entry; a deleted key's mark is still raised;
/// and `If-None-Match: *` keeps "a stale writer cannot write after a newer
/// holder read" for a key the fence did not know.
#[tokio::test]
async fn a_fenced_read_of_a_missing_key_creates_no_mark() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path()).await;
    for n in 0..50 {
        let r = request(s.addr, "GET", &format!("/objects/future-{n}"), &fenced("1000"), b"").await;
        assert_eq!(r.status, 404);
    }
    for n in 0..50 {
        let key = format!("future-{n}");
        assert_eq!(mark(s.addr, &key).await, Value::Null, "{key}");
        assert_eq!(put(s.addr, &key, 1, "first").await.status, 201, "{key} is not poisoned");
    }
    assert_eq!(audit(s.addr).await.len(), 50, "only the 50 PUTs are logged");

    // A deleted object's key keeps its mark, and a fenced read raises it.
    assert_eq!(request(s.addr, "DELETE", "/objects/future-0", &fenced("3"), b"").await.status, 200);
    assert_eq!(request(s.addr, "GET", "/objects/future-0", &fenced("4"), b"").await.status, 404);
    assert_eq!(mark(s.addr, "future-0").await, json!(4));

    // Holder 6 reads `doc` (missing), stale holder 5 creates it, holder 6's
    // create-only write is refused, it reads again and holder 5 is fenced out.
    assert_eq!(request(s.addr, "GET", "/objects/doc", &fenced("6"), b"").await.status, 404);
    assert_eq!(put(s.addr, "doc", 5, "by 5").await.status, 201);
    let mut create_only = fenced("6").to_vec();
    create_only.push(("If-None-Match", "*"));
    let r = request(s.addr, "PUT", "/objects/doc", &create_only, b"by 6").await;
    assert_eq!((r.status, r.json()), (412, json!({"error": "object exists (If-None-Match: *)", "key": "doc"})));
    let r = request(s.addr, "GET", "/objects/doc", &fenced("6"), b"").await;
    assert_eq!((r.status, r.text()), (200, "by 5".to_owned()), "5's acknowledged write was not lost");
    assert_eq!(put(s.addr, "doc", 5, "late 5").await.status, 409);
    let r = request(s.addr, "PUT", "/objects/new", &create_only, b"by 6").await;
    assert_eq!(r.status, 201, "a create-only write of a missing object");
    let mut bad = fenced("6").to_vec();
    bad.push(("If-None-Match", "\"etag\""));
    assert_eq!(request(s.addr, "PUT", "/objects/new", &bad, b"x").await.status, 400);
    s.shutdown().await;
}

/// The lock service as a [`fencelock_fence::report::RefusalSink`]: the
/// reports it took.
#[derive(Default)]
struct Reports(std::sync::Mutex<Vec<fencelock_fence::report::Refusal>>);

#[async_trait::async_trait]
impl fencelock_fence::report::RefusalSink for Reports {
    async fn report_refusal(&self, r: &fencelock_fence::report::Refusal) -> Result<(), fencelock_fence::BoxError> {
        self.0.lock().unwrap().push(r.clone());
        Ok(())
    }
}

/// Issue 36. Rule: with a reporter, each stale PUT and DELETE the storage
/// server refuses (409) is reported once: the `Fencing-Lock`, the refused
/// token, the mark that refused it and the object key; admitted writes and
/// refused fenced reads are not reported.
#[tokio::test]
async fn refused_stale_writes_are_reported() {
    use fencelock_fence::report::{Refusal, Reporter};
    let dir = tempfile::tempdir().unwrap();
    let reports = std::sync::Arc::new(Reports::default());
    let reporter = Reporter::new(reports.clone());
    let s =
        Server::start_with(storage::Config { reporter: Some(reporter.clone()), ..storage::Config::new(dir.path()) })
            .await;
    assert_eq!(put(s.addr, "doc", 6, "v6").await.status, 201);
    assert_eq!(put(s.addr, "doc", 5, "late").await.status, 409);
    let r = request(s.addr, "DELETE", "/objects/doc", &fenced("4"), b"").await;
    assert_eq!(r.status, 409);
    let r = request(s.addr, "GET", "/objects/doc", &fenced("3"), b"").await;
    assert_eq!(r.status, 409, "a stale fenced read is refused, not reported");
    assert_eq!(put(s.addr, "doc", 7, "v7").await.status, 200);
    for _ in 0..500 {
        if reporter.sent() >= 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let report = |refused, highest| Refusal { lock: "doc-lock".into(), refused, highest, resource: "doc".into() };
    assert_eq!(*reports.0.lock().unwrap(), vec![report(5, 6), report(4, 6)]);
    assert_eq!((reporter.sent(), reporter.failed(), reporter.dropped()), (2, 0, 0));
    s.shutdown().await;
}

/// Issue 14 finding: a fenced write with token 2^63−1 was accepted, and the
/// key could never be written again. Now tokens above the configured
/// maximum are refused with 400 naming the limit, and change nothing.
#[tokio::test]
async fn a_token_above_the_maximum_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path()).await;
    let absurd = fencelock_fence::MAX_TOKEN.to_string();
    for method in ["PUT", "DELETE", "GET"] {
        let r = request(s.addr, method, "/objects/doc", &fenced(&absurd), b"x").await;
        assert_eq!(r.status, 400, "{method}");
        assert_eq!(r.json()["limit"], json!(storage::DEFAULT_MAX_TOKEN), "{method}");
        let error = r.json()["error"].as_str().unwrap().to_owned();
        assert!(error.contains("above this server's maximum token"), "{error}");
    }
    assert_eq!(mark(s.addr, "doc").await, Value::Null);
    assert_eq!(put(s.addr, "doc", 5, "v5").await.status, 201, "the key is not poisoned");
    assert_eq!(audit(s.addr).await.len(), 1);
    s.shutdown().await;
}

/// Issue 14 finding, with the lock service known: a token above the highest
/// it has issued (plus the margin) is refused, and a token issued after the
/// server's last look is not (it asks again before refusing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_the_lock_service_never_issued_are_refused() {
    use fencelock::{Client, Outcome};
    let tmp = tempfile::tempdir().unwrap();
    let lock = fencelock_server::start(fencelock_server::Config::for_test(tmp.path().join("lock"))).await.unwrap();
    let client = Client::connect(format!("http://{}", lock.grpc_addr)).await.unwrap();
    let acquire = || async {
        match client.lock("doc-lock").ttl(std::time::Duration::from_secs(10)).acquire().await.unwrap() {
            Outcome::Acquired(g) => g,
            other => panic!("expected a grant, got {other:?}"),
        }
    };
    let mut config = storage::Config::new(tmp.path().join("storage"));
    config.lock_server = Some(format!("http://{}", lock.http_addr));
    config.token_margin = 0;
    let s = Server::start_with(config).await;

    let first = acquire().await;
    let t1 = first.token().unwrap();
    assert_eq!(put(s.addr, "doc", t1, "v1").await.status, 201);
    let r = put(s.addr, "doc", t1 + 1, "never issued").await;
    assert_eq!(r.status, 400, "{:?}", r.json());
    assert_eq!(r.json()["limit"], json!(t1));
    assert!(r.json()["error"].as_str().unwrap().contains("was never issued"));
    assert!(first.release().await.unwrap());
    let second = acquire().await;
    let t2 = second.token().unwrap();
    assert!(t2 > t1);
    assert_eq!(put(s.addr, "doc", t2, "v2").await.status, 200, "a token issued since the last look");
    assert_eq!(mark(s.addr, "doc").await, json!(t2));
    drop(second);
    s.shutdown().await;
    lock.shutdown().await;

    // The lock service unreachable: within the known count plus the margin
    // is fine, above it fails closed with 503.
    let mut config = storage::Config::new(tmp.path().join("storage2"));
    config.lock_server = Some(format!("http://127.0.0.1:{}", fencelock_testkit::free_port()));
    config.token_margin = 10;
    let s = Server::start_with(config).await;
    assert_eq!(put(s.addr, "doc", 10, "v").await.status, 201);
    let r = put(s.addr, "doc", 11, "v").await;
    assert_eq!(r.status, 503, "{:?}", r.json());
    assert_eq!(mark(s.addr, "doc").await, json!(10));
    s.shutdown().await;
}

/// Issue 14: an operator resets a poisoned mark (`fencelock storage
/// reset-mark`): refused while the server runs, audited as `RESET`, and the
/// key takes ordinary tokens again.
#[tokio::test]
async fn reset_mark_repairs_a_poisoned_key_and_is_audited() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path()).await;
    let high = storage::DEFAULT_MAX_TOKEN;
    assert_eq!(put(s.addr, "doc", high, "poison").await.status, 201);
    assert_eq!(put(s.addr, "doc", 7, "v7").await.status, 409);
    let running = storage::reset_mark(dir.path(), "doc", Some(5));
    assert!(matches!(running, Err(storage::ResetMarkError::Fence { .. })), "{running:?}");
    s.shutdown().await;

    assert!(matches!(storage::reset_mark(dir.path(), "a/b", None), Err(storage::ResetMarkError::InvalidKey { .. })));
    let done = storage::reset_mark(dir.path(), "doc", Some(5)).unwrap();
    assert_eq!(done, storage::MarkReset { before: Some(high), after: Some(5) });
    let s = Server::start(dir.path()).await;
    assert_eq!(mark(s.addr, "doc").await, json!(5));
    assert_eq!(put(s.addr, "doc", 4, "v4").await.status, 409, "below the new mark");
    assert_eq!(put(s.addr, "doc", 7, "v7").await.status, 200);
    let log = audit(s.addr).await;
    let reset = &log[2];
    assert_eq!(
        (reset.seq, reset.op.as_str(), reset.token, reset.highest, reset.outcome),
        (2, "RESET", high, 5, Outcome::Accepted)
    );
    assert_eq!(log.len(), 5);
    s.shutdown().await;
}

/// Issue 14 findings: the audit log grew without bound and `GET /log` read
/// it whole. It rotates by size, keeping `keep_files` old files, `seq` runs
/// on, and `GET /log?from=&limit=` returns a range (streamed).
#[tokio::test]
async fn the_audit_log_rotates_and_log_takes_a_range() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = storage::Config::new(dir.path());
    config.audit = storage::AuditConfig { max_file_bytes: 2000, keep_files: 2 };
    let s = Server::start_with(config).await;
    for token in 1..=60 {
        assert!(matches!(put(s.addr, "doc", token, "v").await.status, 200 | 201));
    }
    for token in 1..=10 {
        assert_eq!(put(s.addr, "doc", token, "stale").await.status, 409);
    }
    let mut names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with("audit.log"))
        .collect();
    names.sort();
    assert_eq!(names, ["audit.log", "audit.log.1", "audit.log.2"]);
    for name in &names {
        assert!(std::fs::metadata(dir.path().join(name)).unwrap().len() <= 2000, "{name}");
    }
    let log = audit(s.addr).await;
    let seqs: Vec<u64> = log.iter().map(|e| e.seq).collect();
    let first = seqs[0];
    assert!(first > 0, "the oldest entries were rotated away");
    assert_eq!(seqs, (first..70).collect::<Vec<_>>(), "contiguous up to the last entry");
    let addr = s.addr;
    let range = |q: &'static str| async move {
        let r = request(addr, "GET", &format!("/log?{q}"), &[], b"").await;
        assert_eq!(r.status, 200, "{q}");
        r.text().lines().map(|l| serde_json::from_str::<AuditEntry>(l).unwrap().seq).collect::<Vec<_>>()
    };
    assert_eq!(range("from=55&limit=3").await, vec![55, 56, 57]);
    assert_eq!(range("from=68").await, vec![68, 69]);
    assert_eq!(range("from=0&limit=2").await, vec![first, first + 1]);
    assert_eq!(range("from=70").await, Vec::<u64>::new());
    assert_eq!(request(s.addr, "GET", "/log?from=x", &[], b"").await.status, 400);
    s.shutdown().await;
}
