//! Real servers for the tests: `redis-server` and PostgreSQL, each on a free
//! port of 127.0.0.1 with its data in a temporary directory, started and
//! waited for here, killed on drop.
//!
//! Missing binaries fail the test (never skip it) with a message naming
//! `scripts/install-test-deps.sh`.

#![allow(dead_code)]

use std::fs::{self, File};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

const INSTALL_HINT: &str =
    "run scripts/install-test-deps.sh (it installs postgresql and redis-server)";

/// How many polls, 20 ms apart, a server gets to become ready (about a
/// minute) before the test fails. A bound on waiting, not a timing
/// assertion; counted rather than clocked, as the workspace reads no clock
/// outside the server's clock module.
const READY_POLLS: u32 = 3000;
const POLL: Duration = Duration::from_millis(20);

/// A port nobody listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A temporary directory that another user (postgres) can enter.
fn shared_tempdir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("create temp dir");
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

/// The last lines of a server's log, for a failure message.
fn log_tail(path: &Path) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// Signal `child` and wait for it; SIGKILL if it outlives `polls` polls.
fn stop_child(child: &mut Child, signal: Signal, polls: u32) {
    if child.try_wait().ok().flatten().is_some() {
        return;
    }
    let _ = kill(Pid::from_raw(child.id() as i32), signal);
    for _ in 0..polls {
        if child.try_wait().ok().flatten().is_some() {
            return;
        }
        sleep(POLL);
    }
    let _ = child.kill();
    let _ = child.wait();
}

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

// ---------------------------------------------------------------- Redis ---

/// A `redis-server` with AOF on and `appendfsync always`, so an
/// acknowledged write survives SIGKILL.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
}

impl RedisServer {
    /// Start a fresh server and wait until it answers PING.
    pub fn start() -> Self {
        let mut server = RedisServer {
            child: None,
            port: free_port(),
            dir: shared_tempdir(),
        };
        server.spawn();
        server
    }

    /// `redis://127.0.0.1:PORT/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// SIGKILL the server (no chance to write anything more), then start it
    /// again on the same port and data directory.
    pub fn kill_and_restart(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.spawn();
    }

    fn spawn(&mut self) {
        let bin = which("redis-server")
            .unwrap_or_else(|| panic!("redis-server not found: {INSTALL_HINT}"));
        let log = self.dir.path().join("redis.log");
        let child = Command::new(bin)
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--dir", self.dir.path().to_str().unwrap()])
            .args([
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
            ])
            .args(["--daemonize", "no", "--protected-mode", "no"])
            .args(["--logfile", log.to_str().unwrap()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start redis-server ({e}): {INSTALL_HINT}"));
        self.child = Some(child);
        for poll in 0.. {
            if redis_ping(self.port) {
                break;
            }
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("redis-server exited ({status}):\n{}", log_tail(&log));
            }
            assert!(
                poll < READY_POLLS,
                "redis-server not ready:\n{}",
                log_tail(&log)
            );
            sleep(POLL);
        }
    }
}

fn redis_ping(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let mut reply = [0u8; 5];
    stream.write_all(b"PING\r\n").is_ok()
        && stream.read_exact(&mut reply).is_ok()
        && &reply == b"+PONG"
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

// ----------------------------------------------------------- PostgreSQL ---

/// A PostgreSQL cluster made by `initdb`, run by `postgres` (as the
/// `postgres` user when the tests run as root: postgres refuses root).
pub struct PgServer {
    child: Option<Child>,
    port: u16,
    bin: PathBuf,
    dir: tempfile::TempDir,
    user: Option<(u32, u32)>,
}

impl PgServer {
    /// initdb a fresh cluster, start it, wait until it accepts connections.
    pub fn start() -> Self {
        let bin = pg_bin_dir();
        let dir = shared_tempdir();
        let user = if running_as_root() {
            Some(postgres_ids())
        } else {
            None
        };
        let data = dir.path().join("data");
        fs::create_dir(&data).unwrap();
        fs::set_permissions(&data, fs::Permissions::from_mode(0o700)).unwrap();
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(&data, Some(uid), Some(gid)).unwrap();
        }
        let mut server = PgServer {
            child: None,
            port: free_port(),
            bin,
            dir,
            user,
        };
        server.initdb();
        server.spawn();
        server
    }

    /// The tokio-postgres connection string.
    pub fn conn_str(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres",
            self.port
        )
    }

    /// Stop the server the way a crash would (immediate shutdown: no
    /// checkpoint, WAL recovery at the next start), then start it again on
    /// the same port and data.
    pub fn crash_and_restart(&mut self) {
        if let Some(mut child) = self.child.take() {
            stop_child(&mut child, Signal::SIGQUIT, READY_POLLS);
        }
        self.spawn();
    }

    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(self.bin.join(program));
        cmd.current_dir(self.dir.path())
            .env("LC_ALL", "C")
            .stdin(Stdio::null());
        if let Some((uid, gid)) = self.user {
            cmd.uid(uid).gid(gid);
        }
        cmd
    }

    fn initdb(&self) {
        let data = self.dir.path().join("data");
        let out = self
            .command("initdb")
            .args([
                "-D",
                data.to_str().unwrap(),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C",
                "-N",
            ])
            .output()
            .unwrap_or_else(|e| panic!("cannot run initdb ({e}): {INSTALL_HINT}"));
        assert!(
            out.status.success(),
            "initdb failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn spawn(&mut self) {
        let data = self.dir.path().join("data");
        let log_path = self.dir.path().join("postgres.log");
        let log = File::options()
            .create(true)
            .append(true)
            .open(&log_path)
            .unwrap();
        let child = self
            .command("postgres")
            .args(["-D", data.to_str().unwrap(), "-p", &self.port.to_string()])
            .args([
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "unix_socket_directories=",
            ])
            .args([
                "-c",
                "shared_buffers=16MB",
                "-c",
                "max_connections=60",
                "-c",
                "fsync=on",
            ])
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start postgres ({e}): {INSTALL_HINT}"));
        self.child = Some(child);
        for poll in 0.. {
            if self.ready() {
                break;
            }
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("postgres exited ({status}):\n{}", log_tail(&log_path));
            }
            assert!(
                poll < READY_POLLS,
                "postgres not ready:\n{}",
                log_tail(&log_path)
            );
            sleep(POLL);
        }
    }

    fn ready(&self) -> bool {
        Command::new(self.bin.join("pg_isready"))
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
                "-d",
                "postgres",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            stop_child(&mut child, Signal::SIGQUIT, 500);
        }
    }
}

/// The newest `/usr/lib/postgresql/*/bin` that has `initdb` and `postgres`.
fn pg_bin_dir() -> PathBuf {
    let mut dirs: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path().join("bin"))))
        .filter(|(_, bin)| bin.join("initdb").exists() && bin.join("postgres").exists())
        .collect();
    dirs.sort();
    dirs.pop().map(|(_, bin)| bin).unwrap_or_else(|| {
        panic!("PostgreSQL not found in /usr/lib/postgresql/*/bin: {INSTALL_HINT}")
    })
}

fn running_as_root() -> bool {
    fs::metadata("/proc/self")
        .map(|m| m.uid() == 0)
        .unwrap_or(false)
}

/// uid and gid of the `postgres` user (Debian's package creates it).
fn postgres_ids() -> (u32, u32) {
    let passwd = fs::read_to_string("/etc/passwd").unwrap();
    passwd
        .lines()
        .map(|line| line.split(':').collect::<Vec<_>>())
        .find(|f| f.first() == Some(&"postgres") && f.len() > 3)
        .map(|f| (f[2].parse().unwrap(), f[3].parse().unwrap()))
        .unwrap_or_else(|| {
            panic!("no postgres user to run PostgreSQL as (tests run as root): {INSTALL_HINT}")
        })
}

fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/usr/bin".into()])
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}
