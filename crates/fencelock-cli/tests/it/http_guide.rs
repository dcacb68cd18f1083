//! The HTTP guide (`docs/http-api.md`) runs as written: every `sh` block, in
//! order, in one bash (`set -euo pipefail`), against the `fencelock` binary
//! under test, with only the ports 7070–7072 moved to free ones. What a
//! reader is promised is checked on its output: the stale write is refused
//! (409), the waiter in the queue is handed the lock at the release (not at
//! the holder's expiry, 15 s later), and the election passes to the second
//! candidate. And the guide's table of error codes is the one list
//! (`fencelock_core::ErrorCode`), each with its status.

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::{bin, free_port};

const GUIDE: &str = include_str!("../../../../docs/http-api.md");

/// The guide's `sh` blocks, in order.
fn shell_blocks(doc: &str) -> Vec<&str> {
    doc.split("```sh\n").skip(1).map(|rest| rest.split("```").next().unwrap_or("")).collect()
}

#[test]
fn the_http_guide_runs_as_written() {
    let dir = tempfile::tempdir().unwrap();
    let mut script = String::from("set -euo pipefail\n");
    let ports: Vec<String> = (0..3).map(|_| free_port().to_string()).collect();
    for block in shell_blocks(GUIDE) {
        script.push_str(&block.replace("7070", &ports[0]).replace("7071", &ports[1]).replace("7072", &ports[2]));
    }
    let bin_dir = std::path::Path::new(bin()).parent().unwrap();
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default());
    let mut child = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .current_dir(dir.path())
        .env("PATH", path)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("bash");
    let group = format!("-{}", child.id());
    let kill_group = || Command::new("kill").args(["-KILL", "--", &group]).stderr(Stdio::null()).status();
    // The script's bound: 60 s in steps of 50 ms.
    for step in 0.. {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if step == 1200 {
            let _ = kill_group();
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // Whatever the script left running (its `kill` may not have come).
    let _ = kill_group();
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the guide failed ({}):\n{stdout}\n--- stderr\n{stderr}", out.status);
    assert!(stdout.contains("the old holder's write: 409"), "{stdout}");
    let waited: u64 = stdout
        .split("shell 2 got token ")
        .nth(1)
        .and_then(|rest| rest.split(" after ").nth(1))
        .and_then(|rest| rest.split(" ms").next())
        .and_then(|ms| ms.trim().parse().ok())
        .unwrap_or_else(|| panic!("no handoff line in:\n{stdout}"));
    assert!(waited < 10_000, "the waiter was granted at the release, not at the holder's expiry: {waited} ms");
    assert!(stdout.contains("leader: host-b, term "), "{stdout}");
}

/// The guide's error table lists every code, each with its HTTP status.
#[test]
fn the_guide_lists_every_error_code_with_its_status() {
    for code in fencelock_core::ErrorCode::ALL {
        let row = format!("| `{}` | {} |", code.as_str(), code.http_status());
        assert!(GUIDE.contains(&row), "docs/http-api.md has no row {row:?}");
    }
    let rows = GUIDE.lines().filter(|l| l.starts_with("| `")).count();
    assert_eq!(rows, fencelock_core::ErrorCode::ALL.len(), "the table lists a code the server does not have");
}
