//! INV-10 and "fail closed" on a full disk: the data dir is a small tmpfs that is
//! filled up while the server runs. Requests then fail with a clear error, the
//! server does not crash, and after space is freed and it restarts, the last
//! acknowledged state is there and tokens continue above every token acknowledged.
//! Once on the segment log (the default engine; its segments are preallocated,
//! 64 MiB each, so the disk has room for the first one, and the first write
//! that needs new space is a snapshot's) and once with the log in redb
//! (`--log-engine redb`).
//!
//! Needs root (it mounts a tmpfs), as CI has.

use crate::support;

use std::{
    io::Write,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use fencelock::{Client, Outcome};
use support::{http_get, Server};

/// Unmounts on drop (declared before the server so it is dropped after it).
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(at).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "this test mounts a small tmpfs and needs root: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs(at.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// Write zeros into `dir/filler` until the disk is full.
fn fill(dir: &Path) -> PathBuf {
    let path = dir.join("filler");
    let mut f = std::fs::File::create(&path).unwrap();
    let chunk = vec![0u8; 16 * 1024];
    while f.write_all(&chunk).is_ok() {}
    let _ = f.sync_all();
    path
}

/// The segment log writes into its preallocated segment, which a full disk
/// does not stop: what fails is the next write that needs new space, here the
/// snapshot (taken every 50 entries) that redb stores.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_disk_fails_requests_and_keeps_the_last_good_state() {
    full_disk("96m", &["--snapshot-every", "50"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_disk_on_the_redb_log_fails_requests_and_keeps_the_last_good_state() {
    full_disk("16m", &["--log-engine", "redb"]).await;
}

/// The server with `flags` on a tmpfs of `size`, filled while it serves.
async fn full_disk(size: &str, flags: &[&str]) {
    let tmp = tempfile::tempdir().unwrap();
    let disk = Tmpfs::mount(&tmp.path().join("small"), size);
    let mut server = Server::start_with_data_and_flags(tmp.path(), &disk.0.join("data"), flags);
    // Generous: a loaded machine once took over 2 s to answer the write that
    // found the disk full (what is checked is the answer, not its speed).
    let client = Client::builder(server.url()).rpc_timeout(Duration::from_secs(10)).connect().await.unwrap();

    let before = match client.lock("before-full").ttl(Duration::from_secs(3600)).acquire().await.unwrap() {
        Outcome::Acquired(g) => g,
        other => panic!("{other:?}"),
    };
    let filler = fill(&disk.0);

    // Keep writing until the disk refuses; every acknowledged token is recorded.
    let mut acked = vec![before.token().unwrap()];
    let mut failure = None;
    for i in 0..5000 {
        match client.acquire_detached(&format!("during-full-{i}"), Default::default()).await {
            Ok(Outcome::Acquired(a)) => acked.push(a.token),
            Ok(other) => panic!("{other:?}"),
            Err(e) => {
                failure = Some(e.to_string());
                break;
            }
        }
    }
    let failure = failure.expect("the full disk never failed a write");
    assert!(failure.contains("restart the server"), "the error says what happened: {failure}");
    let again = client.acquire_detached("after-failure", Default::default()).await.unwrap_err();
    assert!(again.to_string().contains("last durable state is kept"), "{again}");
    assert!(server.is_running(), "the server must not crash on a full disk:\n{}", server.log_text());
    let (code, body) = http_get(server.http, "/healthz").unwrap();
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("\"error\""), "{body}");

    // Free the space and restart: the last good state is there.
    std::fs::remove_file(filler).unwrap();
    tokio::task::block_in_place(|| server.restart());
    let info = client.describe("before-full").await.unwrap();
    let h = info.holder.expect("the grant acknowledged before the disk filled survives");
    assert_eq!((h.lease_id, h.token), (before.lease_id(), before.token().unwrap()));
    let next = match client.acquire_detached("after-restart", Default::default()).await.unwrap() {
        Outcome::Acquired(a) => a.token,
        other => panic!("{other:?}"),
    };
    let max = *acked.iter().max().unwrap();
    assert!(next > max, "token {next} must be above every acknowledged token ({max})");
}
