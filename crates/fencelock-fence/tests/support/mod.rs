//! Test support of the fence crate: the real servers come from
//! `fencelock-testkit`; [`ChildGuard`] re-runs this test binary as a child.

#![allow(dead_code)]

pub use fencelock_testkit::{PgServer, RedisServer};

use std::process::Child;

/// A child process that is SIGKILLed and reaped when dropped, so a failing
/// test leaves no process behind.
pub struct ChildGuard(pub Child);

impl ChildGuard {
    /// Run this test binary again as a child that executes only the test
    /// `test` (which sees `env=dir` and plays the child's part), with its
    /// stdout piped back.
    pub fn spawn_test(test: &str, env: &str, dir: &std::path::Path) -> ChildGuard {
        let child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", test, "--nocapture", "--test-threads=1"])
            .env(env, dir)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        ChildGuard(child)
    }

    /// SIGKILL the child and reap it; its exit status.
    pub fn kill(&mut self) -> std::process::ExitStatus {
        let _ = self.0.kill();
        self.0.wait().unwrap()
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
