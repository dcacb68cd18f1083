//! PostgreSQL.

use std::fs::{self, File};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use nix::sys::signal::Signal;

use crate::certs::TestCerts;
use crate::{free_port, shared_tempdir, stop_child, wait_ready, Profile, INSTALL_HINT, READY_POLLS};

/// A PostgreSQL cluster made by `initdb`, run by `postgres` (as the
/// `postgres` user when the tests run as root: postgres refuses root).
/// Durable in both profiles (`fsync=on`, `synchronous_commit=on`: a commit
/// is flushed to the WAL before it is acknowledged). [`Profile::Test`]: 16 MB
/// of shared buffers; [`Profile::Production`]: 256 MB (what a small dedicated
/// server would give it; Debian's default is 128 MB). Both allow 200
/// connections (the bench's 64 clients may hold two each) and log at the
/// default level (warnings), to a file.
pub struct PgServer {
    child: Option<Child>,
    port: u16,
    bin: PathBuf,
    dir: tempfile::TempDir,
    user: Option<(u32, u32)>,
    certs: Option<TestCerts>,
    profile: Profile,
}

/// The user [`PgServer::start_secure`] makes, its password and its database.
pub const PG_SECURE_USER: (&str, &str, &str) = ("locker", "pg-s3cret", "locks");

impl PgServer {
    /// initdb a fresh cluster, start it, wait until it accepts connections.
    pub fn start() -> Self {
        Self::start_with(false, Profile::Test)
    }

    /// initdb a fresh cluster, start it in `profile`, wait until it accepts
    /// connections.
    pub fn start_profile(profile: Profile) -> Self {
        Self::start_with(false, profile)
    }

    /// How the server runs, in one line (for a report).
    pub fn describe(&self) -> String {
        let settings: Vec<&str> = self.settings().into_iter().filter(|s| !s.contains("listen_addresses")).collect();
        format!("{}; the rest PostgreSQL's defaults (wal_level replica, log_min_messages warning)", settings.join(" "))
    }

    /// The `-c` settings the server starts with.
    fn settings(&self) -> Vec<&'static str> {
        let buffers = match self.profile {
            Profile::Test => "shared_buffers=16MB",
            Profile::Production => "shared_buffers=256MB",
        };
        vec!["listen_addresses=127.0.0.1", buffers, "max_connections=200", "fsync=on", "synchronous_commit=on"]
    }

    /// A cluster that speaks TLS only to TCP clients (`ssl=on` with a server
    /// certificate of a fresh test CA; `pg_hba.conf` has `hostssl` lines
    /// only), where user [`PG_SECURE_USER`] logs in with `scram-sha-256` and
    /// owns its database; `postgres` is trusted (over TLS) for inspection.
    pub fn start_secure() -> Self {
        Self::start_with(true, Profile::Test)
    }

    /// The test CA and certificates of a secure cluster.
    pub fn certs(&self) -> Option<&TestCerts> {
        self.certs.as_ref()
    }

    fn start_with(secure: bool, profile: Profile) -> Self {
        let bin = pg_bin_dir();
        let dir = shared_tempdir();
        let user = if running_as_root() { Some(postgres_ids()) } else { None };
        let data = dir.path().join("data");
        fs::create_dir(&data).unwrap();
        fs::set_permissions(&data, fs::Permissions::from_mode(0o700)).unwrap();
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(&data, Some(uid), Some(gid)).unwrap();
        }
        let mut server = PgServer { child: None, port: free_port(), bin, dir, user, certs: None, profile };
        server.initdb();
        if secure {
            server.secure();
        }
        server.spawn();
        if secure {
            server.add_password_user();
        }
        server
    }

    /// Certificates, `ssl=on` and `hostssl`-only `pg_hba.conf`.
    fn secure(&mut self) {
        let certs = TestCerts::new("postgres");
        if let Some((uid, gid)) = self.user {
            certs.chown(uid, gid);
        }
        let data = self.dir.path().join("data");
        let conf = format!(
            "ssl = on\nssl_cert_file = '{}'\nssl_key_file = '{}'\npassword_encryption = 'scram-sha-256'\n",
            certs.server_cert().display(),
            certs.server_key().display()
        );
        let mut existing = fs::read_to_string(data.join("postgresql.conf")).unwrap();
        existing.push_str(&conf);
        fs::write(data.join("postgresql.conf"), existing).unwrap();
        let hba = "hostssl all postgres 127.0.0.1/32 trust\nhostssl all all 127.0.0.1/32 scram-sha-256\n";
        fs::write(data.join("pg_hba.conf"), hba).unwrap();
        self.certs = Some(certs);
    }

    /// `CREATE ROLE` the password user and its database, through psql as
    /// `postgres` (over TLS).
    fn add_password_user(&self) {
        let (user, password, db) = PG_SECURE_USER;
        let port = self.port.to_string();
        for sql in
            [format!("CREATE ROLE {user} LOGIN PASSWORD '{password}'"), format!("CREATE DATABASE {db} OWNER {user}")]
        {
            let out = self
                .command("psql")
                .args(["-h", "127.0.0.1", "-p", &port, "-U", "postgres", "-d", "postgres"])
                .args(["-v", "ON_ERROR_STOP=1", "-c", &sql])
                // Not the tester's ~/.postgresql (unreadable to the postgres user).
                .env("HOME", self.dir.path())
                .env("PGSSLMODE", "require")
                .output()
                .unwrap_or_else(|e| panic!("cannot run psql ({e}): {INSTALL_HINT}"));
            assert!(out.status.success(), "psql {sql}: {}", String::from_utf8_lossy(&out.stderr));
        }
    }

    /// The tokio-postgres connection string.
    pub fn conn_str(&self) -> String {
        format!("host=127.0.0.1 port={} user=postgres dbname=postgres", self.port)
    }

    /// The server's process id (the postmaster: its backends are its children).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
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
        cmd.current_dir(self.dir.path()).env("LC_ALL", "C").stdin(Stdio::null());
        if let Some((uid, gid)) = self.user {
            cmd.uid(uid).gid(gid);
        }
        cmd
    }

    /// Fills the empty data dir with a fresh cluster: a copy of the cluster
    /// [`template`] made with `initdb` once per PostgreSQL version and user
    /// (initdb costs a second of CPU and 2–5 s on a loaded 2-core machine;
    /// the suite starts over a hundred clusters, the copy takes 50 ms).
    fn initdb(&self) {
        let template = template(&self.bin, self.user, |data| self.run_initdb(data));
        let data = self.dir.path().join("data");
        let out = Command::new("cp")
            .arg("-a")
            .arg(template.join("."))
            .arg(&data)
            .output()
            .unwrap_or_else(|e| panic!("cannot run cp ({e})"));
        assert!(out.status.success(), "copying the cluster template: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// `initdb` into the empty dir `data`, as the user the server runs as.
    fn run_initdb(&self, data: &Path) {
        let out = self
            .command("initdb")
            .args(["-D", data.to_str().unwrap(), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C", "-N"])
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
        let log = File::options().create(true).append(true).open(&log_path).unwrap();
        let mut command = self.command("postgres");
        command.args(["-D", data.to_str().unwrap(), "-p", &self.port.to_string()]);
        command.args(["-c", "unix_socket_directories="]);
        for setting in self.settings() {
            command.args(["-c", setting]);
        }
        let child = command
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start postgres ({e}): {INSTALL_HINT}"));
        let mut child = child;
        let (bin, port) = (self.bin.clone(), self.port);
        wait_ready("postgres", &mut child, &log_path, || pg_ready(&bin, port));
        self.child = Some(child);
    }

    /// A `postgres://` URL for the `postgres` superuser (trust authentication).
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            stop_child(&mut child, Signal::SIGQUIT, 500);
        }
    }
}

/// The data dir of a fresh cluster of the PostgreSQL in `bin`, owned by
/// `user` (or the tester): `initdb` (`run_initdb`) ran into it the first time
/// any test of this machine asked, and it is only ever copied. It lives in the
/// system's temp dir, one per version and user, and stays there (39 MB). Made
/// under a name of its own and renamed into place, so a test never copies a
/// half-made template; two tests that make one at once both succeed, and the
/// first rename wins.
fn template(bin: &Path, user: Option<(u32, u32)>, run_initdb: impl FnOnce(&Path)) -> PathBuf {
    let version = bin.parent().and_then(|v| v.file_name()).map(|v| v.to_string_lossy().into_owned());
    let uid = user.map_or_else(|| fs::metadata("/proc/self").map(|m| m.uid()).unwrap_or(0), |(uid, _)| uid);
    let name = format!("fencelock-pg-template-{}-{uid}", version.unwrap_or_default());
    let template = std::env::temp_dir().join(&name);
    if template.join("PG_VERSION").is_file() {
        return trusted(template, uid);
    }
    // A name no other test has: the template is renamed from it, never deleted with it.
    let partial = tempfile::Builder::new().prefix(&format!("{name}.partial-")).tempdir().unwrap().keep();
    fs::set_permissions(&partial, fs::Permissions::from_mode(0o700)).unwrap();
    if let Some((uid, gid)) = user {
        std::os::unix::fs::chown(&partial, Some(uid), Some(gid)).unwrap();
    }
    run_initdb(&partial);
    if fs::rename(&partial, &template).is_err() {
        // Another test's template is in place (a rename onto a non-empty dir fails).
        let _ = fs::remove_dir_all(&partial);
        assert!(template.join("PG_VERSION").is_file(), "no PostgreSQL cluster template at {}", template.display());
        return trusted(template, uid);
    }
    template
}

/// `template`, if it is what [`template`] makes: a directory (not a link)
/// owned by `uid` that nobody else may read or write. The temp dir is shared:
/// another user could have put a cluster of their own at that name before
/// the first test of this one (every test's cluster would be a copy of it).
fn trusted(template: PathBuf, uid: u32) -> PathBuf {
    let meta = fs::symlink_metadata(&template).unwrap();
    assert!(
        meta.is_dir() && meta.uid() == uid && meta.mode() & 0o077 == 0,
        "{} is not a PostgreSQL cluster template of this user's (a directory owned by uid {uid}, mode 0700): \
         remove it, and the next test makes one",
        template.display()
    );
    template
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
    dirs.pop()
        .map(|(_, bin)| bin)
        .unwrap_or_else(|| panic!("PostgreSQL not found in /usr/lib/postgresql/*/bin: {INSTALL_HINT}"))
}

fn running_as_root() -> bool {
    fs::metadata("/proc/self").map(|m| m.uid() == 0).unwrap_or(false)
}

/// uid and gid of the `postgres` user (Debian's package creates it).
fn postgres_ids() -> (u32, u32) {
    let passwd = fs::read_to_string("/etc/passwd").unwrap();
    passwd
        .lines()
        .map(|line| line.split(':').collect::<Vec<_>>())
        .find(|f| f.first() == Some(&"postgres") && f.len() > 3)
        .map(|f| (f[2].parse().unwrap(), f[3].parse().unwrap()))
        .unwrap_or_else(|| panic!("no postgres user to run PostgreSQL as (tests run as root): {INSTALL_HINT}"))
}

fn pg_ready(bin: &std::path::Path, port: u16) -> bool {
    Command::new(bin.join("pg_isready"))
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-U", "postgres", "-d", "postgres"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn my_uid() -> u32 {
        fs::metadata("/proc/self").unwrap().uid()
    }

    /// A template of this user's, mode 0700, is used.
    #[test]
    fn a_private_template_is_trusted() {
        let dir = tempfile::tempdir().unwrap();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o700)).unwrap();
        assert_eq!(trusted(dir.path().to_path_buf(), my_uid()), dir.path());
    }

    /// One others may write into, one of another user, or a link is refused.
    #[test]
    fn a_template_others_could_have_planted_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let open = dir.path().join("open");
        fs::create_dir(&open).unwrap();
        fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
        let private = dir.path().join("private");
        fs::create_dir(&private).unwrap();
        fs::set_permissions(&private, fs::Permissions::from_mode(0o700)).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&private, &link).unwrap();
        let refused = |p: &Path, uid: u32| {
            let p = p.to_path_buf();
            std::panic::catch_unwind(move || trusted(p, uid)).is_err()
        };
        assert!(refused(&open, my_uid()), "group and others may write");
        assert!(refused(&private, my_uid() + 1), "another user's");
        assert!(refused(&link, my_uid()), "a link");
        assert!(!refused(&private, my_uid()));
    }
}
