//! Issue 37 §1: fencelock installed like the services operators already run:
//! the Debian package `scripts/package.sh` builds (from `packaging/`), its
//! settings file, and the container file.
//!
//! - [`the_debian_package_installs_serves_and_purges`] builds the package from
//!   the binary under test, checks it with `dpkg-deb`, installs it on this
//!   machine with `dpkg -i` (as root), checks what it installed (files, modes,
//!   owners, the user, the man pages, the completion, the unit by
//!   `systemd-analyze verify`), runs the installed binary as the unit does (as
//!   the fencelock user, with the installed settings, `NOTIFY_SOCKET` an
//!   abstract socket of its own) until it says READY=1 and `/healthz` answers
//!   200, stops it (STOPPING=1), purges the package (the data stays),
//!   installs it again over the kept data and purges it with
//!   `FENCELOCK_PURGE_DATA=yes` (nothing stays). It installs system-wide, so
//!   it is one test function, and it holds a lock file so that another run
//!   on this machine (another checkout's suite) waits for it. It refuses to
//!   start on a machine that has fencelock installed or its leftovers, and a
//!   guard purges what it installed even when it fails, so the machine is
//!   left as it was found.
//! - [`the_settings_file_names_every_setting_with_its_default`]: the conffile
//!   has one line per `serve` setting, each commented one with the default
//!   `serve --help` states, and together they start a node.
//! - [`the_container_file_runs_the_node_it_documents`]: no container runtime
//!   here can pull the base images, so `packaging/Containerfile` is read
//!   instruction by instruction, the command it gives the image is run as the
//!   image would run it (its environment, its entrypoint and default
//!   command, the ports mapped to free ones), and its HEALTHCHECK command is
//!   run against a leader, a follower, a node without a leader and a stopped
//!   node. (`container.rs` builds and runs the image itself with podman, on
//!   local stand-ins of the two base images.)
//!
//! A missing tool is a failure naming scripts/install-test-deps.sh, never a skip.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{SocketAddr, TcpListener};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::support::{bin, free_port, http_get};

/// How long a step may take: this many polls of [`POLL`] (30 s in all; a
/// bound for a loaded 2-core machine, not a timing).
const POLLS: u32 = 300;
const POLL: Duration = Duration::from_millis(100);

/// What the package installs and the test looks at.
const BINARY: &str = "/usr/bin/fencelock";
const UNIT: &str = "/lib/systemd/system/fencelock.service";
const CONFFILE: &str = "/etc/fencelock/fencelock.toml";
const STATE: &str = "/var/lib/fencelock";
const MAN1: &str = "/usr/share/man/man1";
const BASH_COMPLETION: &str = "/usr/share/bash-completion/completions/fencelock";
const ZSH_COMPLETION: &str = "/usr/share/zsh/vendor-completions/_fencelock";
const FISH_COMPLETION: &str = "/usr/share/fish/vendor_completions.d/fencelock.fish";
const DOC: &str = "/usr/share/doc/fencelock";

/// The lock file that keeps two runs of the package test on one machine apart.
const MACHINE_LOCK: &str = "/tmp/fencelock-package-test.lock";

/// `serve` flags that are no setting of the file: the file itself, a one-off
/// (`--force-new-cluster` is for one start, never a standing setting) and help.
const NOT_IN_THE_FILE: [&str; 3] = ["config", "force-new-cluster", "help"];
/// A flag whose file key is not its name with underscores: `--log-level` is
/// the file's `log` (the flag's former name, still its alias).
const FILE_KEY_OF_FLAG: [(&str, &str); 1] = [("log-level", "log")];
/// Commented settings whose value is an example, not a default: hosts and
/// ports of a group, files a node reads; uncommented they need those.
const EXAMPLES: [&str; 10] = [
    "peers",
    "advertise",
    "peer_listen",
    "peer_advertise",
    "tls_cert",
    "tls_key",
    "tls_ca",
    "client_ca",
    "auth_file",
    "audit_log",
];

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs `cmd` and returns its output; fails if it cannot start.
fn output(cmd: &mut Command) -> Output {
    cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

/// Runs `cmd`, fails unless it succeeds, and returns its stdout.
fn run_ok(cmd: &mut Command) -> String {
    let out = output(cmd);
    assert!(
        out.status.success(),
        "{cmd:?}: {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// Fails, naming scripts/install-test-deps.sh, unless every tool is on PATH.
fn require_tools(tools: &[&str]) {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let missing: Vec<&str> =
        tools.iter().copied().filter(|t| !std::env::split_paths(&path).any(|d| d.join(t).is_file())).collect();
    assert!(missing.is_empty(), "missing {missing:?}: scripts/install-test-deps.sh installs them");
}

/// `fencelock --version`'s version (its first line, `fencelock X`).
fn version_of(binary: &str) -> String {
    let out = run_ok(Command::new(binary).arg("--version"));
    let first = out.lines().next().unwrap_or_default();
    first.strip_prefix("fencelock ").unwrap_or_else(|| panic!("{first:?}")).split(' ').next().unwrap().to_string()
}

/// A `serve` flag as `serve --help` documents it: its long name and the
/// `[default: …]` its help states, if any.
struct Flag {
    name: String,
    default: Option<String>,
}

fn serve_flags() -> Vec<Flag> {
    let help = run_ok(Command::new(bin()).args(["serve", "--help"]));
    let mut flags: Vec<(String, String)> = Vec::new();
    for line in help.lines() {
        let t = line.trim_start();
        let long = t.strip_prefix("-h, ").unwrap_or(t);
        if line.starts_with("  ") && long.starts_with("--") && line.len() - t.len() <= 6 {
            let name = long[2..].split([' ', ',']).next().unwrap().to_string();
            flags.push((name, String::new()));
        } else if let Some((_, doc)) = flags.last_mut() {
            doc.push_str(t);
            doc.push(' ');
        }
    }
    assert!(flags.len() > 30, "serve --help lists {} flags:\n{help}", flags.len());
    flags
        .into_iter()
        .map(|(name, doc)| {
            let default =
                doc.split_once("[default: ").and_then(|(_, rest)| rest.split_once(']')).map(|(d, _)| d.to_string());
            Flag { name, default }
        })
        .collect()
}

/// The file key of a `serve` flag.
fn file_key(flag: &str) -> String {
    FILE_KEY_OF_FLAG.iter().find(|(f, _)| *f == flag).map_or_else(|| flag.replace('-', "_"), |(_, k)| k.to_string())
}

/// A setting of the settings file: its key, its value as TOML, whether it is
/// commented out (`#key = value`), and the line as written.
#[derive(Debug)]
struct Setting {
    key: String,
    value: toml::Value,
    commented: bool,
    line: String,
}

/// The settings of `text`: the lines `key = value` and `#key = value` (a
/// comment of prose is `# …`, with a space, or `## …`).
fn settings(text: &str) -> Vec<Setting> {
    let mut out = Vec::new();
    for line in text.lines() {
        let (body, commented) = match line.strip_prefix('#') {
            Some(rest) if rest.starts_with(|c: char| c.is_ascii_lowercase()) => (rest, true),
            Some(_) => continue,
            None if line.trim().is_empty() => continue,
            None => (line, false),
        };
        let table: toml::Table = toml::from_str(body).unwrap_or_else(|e| panic!("{line:?} is no TOML setting: {e}"));
        assert_eq!(table.len(), 1, "{line:?}");
        let (key, value) = table.into_iter().next().unwrap();
        out.push(Setting { key, value, commented, line: line.to_string() });
    }
    out
}

/// A TOML value as `--help` writes a default: a string without quotes.
fn plain(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => s.clone(),
        toml::Value::Integer(i) => i.to_string(),
        toml::Value::Boolean(b) => b.to_string(),
        other => panic!("a setting of another type: {other:?}"),
    }
}

/// The `Key=Value` lines of a systemd unit, in order.
fn unit_settings(text: &str) -> Vec<(String, String)> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with('[') && !l.starts_with(';'))
        .map(|l| {
            let (k, v) = l.split_once('=').unwrap_or_else(|| panic!("{l:?} is no Key=Value"));
            (k.trim().to_string(), v.trim().to_string())
        })
        .collect()
}

/// A duration of a unit (`30s`, `5min`, `90`), in seconds.
fn unit_seconds(v: &str) -> u64 {
    let split = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    let n: u64 = v[..split].parse().unwrap_or_else(|_| panic!("{v:?}"));
    match &v[split..] {
        "" | "s" => n,
        "min" => n * 60,
        unit => panic!("{v:?}: unit {unit:?} not understood here"),
    }
}

/// A process the test started; killed on drop.
struct Process {
    child: Child,
    log: PathBuf,
}

impl Process {
    fn spawn(cmd: &mut Command, log: &Path) -> Process {
        let file = std::fs::File::create(log).unwrap();
        let child = cmd.stdout(Stdio::null()).stderr(file).spawn().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
        Process { child, log: log.to_path_buf() }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn fail_if_exited(&mut self, waiting_for: &str) {
        if let Some(status) = self.child.try_wait().unwrap() {
            panic!("the process exited ({status}) while waiting for {waiting_for}; log:\n{}", self.log_text());
        }
    }

    /// Waits until `/healthz` on `http` answers `code`.
    fn wait_health(&mut self, http: SocketAddr, code: u16) {
        for _ in 0..POLLS {
            if matches!(http_get(http, "/healthz"), Ok((c, _)) if c == code) {
                return;
            }
            self.fail_if_exited("/healthz");
            std::thread::sleep(POLL);
        }
        panic!("/healthz on {http} did not answer {code} within {POLLS} polls; log:\n{}", self.log_text());
    }

    /// SIGTERM, then waits for the exit; returns the exit status and how
    /// many polls it took.
    fn terminate(&mut self) -> (std::process::ExitStatus, u32) {
        kill(Pid::from_raw(self.child.id() as i32), Signal::SIGTERM).unwrap();
        self.wait_polls()
    }

    /// Waits for an exit that comes by itself.
    fn wait_exit(&mut self) -> std::process::ExitStatus {
        self.wait_polls().0
    }

    fn wait_polls(&mut self) -> (std::process::ExitStatus, u32) {
        for polls in 0..POLLS {
            if let Some(status) = self.child.try_wait().unwrap() {
                return (status, polls);
            }
            std::thread::sleep(POLL);
        }
        panic!("no exit within {POLLS} polls; log:\n{}", self.log_text());
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The settings file names every setting of `serve` once, each commented
/// one with the default `serve --help` states (where that is one value), and
/// with the examples left out, all of them uncommented at once start a node
/// that serves: the documented values are ones the node takes.
#[test]
fn the_settings_file_names_every_setting_with_its_default() {
    let source = std::fs::read_to_string(repo_root().join("packaging/fencelock.toml")).unwrap();
    let settings = settings(&source);
    let flags = serve_flags();

    let mut seen = BTreeSet::new();
    for s in &settings {
        assert!(seen.insert(s.key.clone()), "{} is in the file twice", s.key);
    }
    let wanted: BTreeSet<String> =
        flags.iter().filter(|f| !NOT_IN_THE_FILE.contains(&f.name.as_str())).map(|f| file_key(&f.name)).collect();
    let missing: Vec<_> = wanted.difference(&seen).collect();
    let unknown: Vec<_> = seen.difference(&wanted).collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "settings not in the file: {missing:?}; not serve's: {unknown:?}"
    );

    let active: Vec<_> = settings.iter().filter(|s| !s.commented).map(|s| s.key.as_str()).collect();
    assert_eq!(active, ["data_dir"], "the package sets the data dir and leaves the rest at their defaults");
    assert_eq!(settings.iter().find(|s| s.key == "data_dir").unwrap().value.as_str(), Some("/var/lib/fencelock/data"));
    for f in &flags {
        let key = file_key(&f.name);
        let (Some(default), Some(s)) = (&f.default, settings.iter().find(|s| s.key == key)) else { continue };
        if s.commented && !default.contains(' ') {
            assert_eq!(&plain(&s.value), default, "{:?}: serve --help says [default: {default}]", s.line);
        }
    }
    for key in ["listen", "http"] {
        let s = settings.iter().find(|s| s.key == key).unwrap();
        let addr: SocketAddr = plain(&s.value).parse().unwrap();
        assert!(s.commented && addr.ip().is_loopback(), "{:?}: loopback by default", s.line);
    }

    // Everything but the examples, uncommented, on free ports and a data dir
    // of the test's.
    let dir = tempfile::tempdir().unwrap();
    let uncommented: String = source
        .lines()
        .map(|l| match l.strip_prefix('#') {
            Some(rest)
                if settings.iter().any(|s| s.commented && s.line == l && !EXAMPLES.contains(&s.key.as_str())) =>
            {
                rest
            }
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n");
    let config = dir.path().join("fencelock.toml");
    std::fs::write(&config, &uncommented).unwrap();
    let http = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let mut node = Process::spawn(
        Command::new(bin())
            .args(["serve", "--config"])
            .arg(&config)
            .env("FENCELOCK_DATA_DIR", dir.path().join("data"))
            .env("FENCELOCK_LISTEN", format!("127.0.0.1:{}", free_port()))
            .env("FENCELOCK_HTTP", http.to_string()),
        &dir.path().join("node.log"),
    );
    node.wait_health(http, 200);
    let (status, _) = node.terminate();
    assert!(status.success(), "{status}; log:\n{}", node.log_text());
}

/// Holds the machine for the package test: a lock file (another run waits),
/// and on drop, whatever happened, purges the package and removes the state
/// directory, the user and the group, which [`Machine::take`] found absent.
struct Machine {
    _lock: nix::fcntl::Flock<std::fs::File>,
}

impl Machine {
    /// Takes the lock, then fails unless this machine has no trace of fencelock.
    fn take() -> Machine {
        let file = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(MACHINE_LOCK).unwrap();
        let lock = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
            .unwrap_or_else(|(_, e)| panic!("locking {MACHINE_LOCK}: {e}"));
        let mut found = Vec::new();
        if package_known() {
            found.push("the package fencelock (installed or its settings kept)".to_string());
        }
        for (db, name) in [("passwd", "user"), ("group", "group")] {
            if getent(db, "fencelock").is_some() {
                found.push(format!("a {name} fencelock"));
            }
        }
        if Path::new(STATE).exists() {
            found.push(STATE.to_string());
        }
        assert!(
            found.is_empty(),
            "this machine already has {found:?}: this test installs and purges the package and would not leave \
             them as they are; remove them first (FENCELOCK_PURGE_DATA=yes dpkg --purge fencelock)"
        );
        Machine { _lock: lock }
    }
}

impl Drop for Machine {
    fn drop(&mut self) {
        if package_known() {
            let _ = Command::new("dpkg").args(["--purge", "fencelock"]).env("FENCELOCK_PURGE_DATA", "yes").output();
        }
        let _ = std::fs::remove_dir_all(STATE);
        if getent("passwd", "fencelock").is_some() {
            let _ = Command::new("userdel").arg("fencelock").output();
        }
        if getent("group", "fencelock").is_some() {
            let _ = Command::new("groupdel").arg("fencelock").output();
        }
    }
}

/// Whether dpkg knows the package fencelock (installed, or purged not yet).
fn package_known() -> bool {
    let out = output(Command::new("dpkg-query").args(["-W", "-f=${db:Status-Status}", "fencelock"]));
    out.status.success() && !matches!(text(&out.stdout).trim(), "" | "not-installed")
}

/// The fields of `name` in the database `db` (`getent`), if it is there.
fn getent(db: &str, name: &str) -> Option<Vec<String>> {
    let out = output(Command::new("getent").args([db, name]));
    out.status.success().then(|| text(&out.stdout).trim().split(':').map(str::to_string).collect())
}

/// Mode (permission bits), uid and gid of `path`.
fn mode_owner(path: &str) -> (u32, u32, u32) {
    let m = std::fs::metadata(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    (m.permissions().mode() & 0o7777, m.uid(), m.gid())
}

#[test]
fn the_debian_package_installs_serves_and_purges() {
    assert!(std::fs::metadata("/proc/self").unwrap().uid() == 0, "this test installs a Debian package: run it as root");
    require_tools(&[
        "dpkg",
        "dpkg-deb",
        "dpkg-query",
        "systemd-analyze",
        "setpriv",
        "gzip",
        "man",
        "bash",
        "getent",
        "userdel",
        "groupdel",
    ]);
    let machine = Machine::take();
    let dir = tempfile::tempdir().unwrap();
    let root = repo_root();
    let version = version_of(bin());
    let arch = run_ok(Command::new("dpkg").arg("--print-architecture")).trim().to_string();

    // Build it from the binary under test.
    let out = dir.path().join("out");
    // gzip: xz (the default, for a release) spends most of the test's time
    // compressing a debug binary.
    let built = run_ok(
        Command::new(root.join("scripts/package.sh"))
            .arg("--binary")
            .arg(bin())
            .arg("--out")
            .arg(&out)
            .args(["--compression", "gzip"]),
    );
    let deb = PathBuf::from(built.lines().last().unwrap_or_default());
    assert_eq!(deb, out.join(format!("fencelock_{version}_{arch}.deb")), "{built}");

    // What dpkg-deb says it holds.
    let field = |name: &str| run_ok(Command::new("dpkg-deb").arg("--field").arg(&deb).arg(name)).trim().to_string();
    assert_eq!(field("Package"), "fencelock");
    assert_eq!(field("Version"), version);
    assert_eq!(field("Architecture"), arch);
    let depends = field("Depends");
    assert!(depends.starts_with("libc6 (>= 2.") && depends.contains("passwd"), "Depends: {depends}");
    assert!(field("Maintainer").contains('@'), "{}", field("Maintainer"));
    let description = field("Description");
    assert!(description.contains("FENCELOCK_PURGE_DATA=yes"), "the description says how purge treats the data");
    let conffiles = run_ok(Command::new("dpkg-deb").arg("--info").arg(&deb).arg("conffiles"));
    assert_eq!(conffiles.trim(), CONFFILE);
    let info = run_ok(Command::new("dpkg-deb").arg("--info").arg(&deb));
    for script in ["postinst", "prerm", "postrm"] {
        assert!(info.lines().any(|l| l.contains(&format!("*  {script}"))), "{script} (executable) in:\n{info}");
    }
    let listing = run_ok(Command::new("dpkg-deb").arg("--contents").arg(&deb));
    let mut contents = BTreeMap::new();
    for line in listing.lines() {
        let cols: Vec<&str> = line.split_whitespace().collect();
        assert!(cols.len() >= 6, "{line}");
        assert_eq!(cols[1], "root/root", "{line}");
        let path = cols[5].trim_start_matches('.').trim_end_matches('/').to_string();
        contents.insert(path, cols[0].to_string());
    }
    let pages = dir.path().join("pages");
    std::fs::create_dir(&pages).unwrap();
    run_ok(Command::new(bin()).arg("man").arg(&pages));
    let page_names: BTreeSet<String> = std::fs::read_dir(&pages)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".1"))
        .collect();
    assert!(page_names.contains("fencelock.1") && page_names.contains("fencelock-serve.1"), "{page_names:?}");
    let mut expected: BTreeMap<String, &str> = BTreeMap::from([
        (BINARY.to_string(), "-rwxr-xr-x"),
        (UNIT.to_string(), "-rw-r--r--"),
        (CONFFILE.to_string(), "-rw-r--r--"),
        (BASH_COMPLETION.to_string(), "-rw-r--r--"),
        (ZSH_COMPLETION.to_string(), "-rw-r--r--"),
        (FISH_COMPLETION.to_string(), "-rw-r--r--"),
        (format!("{DOC}/copyright"), "-rw-r--r--"),
        (format!("{DOC}/changelog.Debian.gz"), "-rw-r--r--"),
        (format!("{DOC}/README.Debian"), "-rw-r--r--"),
    ]);
    for name in &page_names {
        expected.insert(format!("{MAN1}/{name}.gz"), "-rw-r--r--");
    }
    let files: BTreeMap<String, &str> =
        contents.iter().filter(|(_, m)| !m.starts_with('d')).map(|(p, m)| (p.clone(), m.as_str())).collect();
    assert_eq!(files, expected, "the package's files and their modes");
    for (path, mode) in &contents {
        assert!(!mode.starts_with('d') || mode == "drwxr-xr-x", "{path}: {mode}");
        assert!(!path.starts_with("/var"), "{path}: the state directory is made by postinst, not shipped");
    }

    // Install it.
    run_ok(Command::new("dpkg").arg("-i").arg(&deb));
    assert_eq!(version_of(BINARY), version);
    assert_eq!(mode_owner(BINARY), (0o755, 0, 0));
    assert_eq!(mode_owner(CONFFILE), (0o644, 0, 0));
    let shipped = std::fs::read_to_string(root.join("packaging/fencelock.toml")).unwrap();
    assert_eq!(std::fs::read_to_string(CONFFILE).unwrap(), shipped);
    let known = run_ok(Command::new("dpkg-query").args(["-W", "-f=${Conffiles}", "fencelock"]));
    assert!(known.contains(CONFFILE), "dpkg's conffiles: {known}");

    let user = getent("passwd", "fencelock").expect("postinst makes the user fencelock");
    let group = getent("group", "fencelock").expect("postinst makes the group fencelock");
    let (uid, gid): (u32, u32) = (user[2].parse().unwrap(), group[2].parse().unwrap());
    assert!(uid > 0 && uid < 1000, "a system user: {user:?}");
    assert_eq!(user[3], group[2], "the user's group is fencelock: {user:?} {group:?}");
    assert_eq!((user[5].as_str(), user[6].as_str()), (STATE, "/usr/sbin/nologin"), "{user:?}");
    assert_eq!(mode_owner(STATE), (0o750, uid, gid));

    for name in &page_names {
        let page = format!("{MAN1}/{name}.gz");
        run_ok(Command::new("gzip").args(["-t", &page]));
        let out =
            output(Command::new("man").args(["--warnings", "-l", &page]).env("MANPAGER", "cat").env("MANWIDTH", "80"));
        let (shown, warnings) = (text(&out.stdout), text(&out.stderr));
        assert!(out.status.success() && warnings.is_empty(), "man -l {page}: {}\n{warnings}", out.status);
        assert!(shown.contains("NAME") && shown.contains(name.trim_end_matches(".1")), "man -l {page}:\n{shown}");
    }
    run_ok(Command::new("bash").args(["-n", BASH_COMPLETION]));
    let registered =
        run_ok(Command::new("bash").args(["-c", &format!("source {BASH_COMPLETION} && complete -p fencelock")]));
    assert!(registered.contains("fencelock"), "{registered}");
    assert!(std::fs::read_to_string(ZSH_COMPLETION).unwrap().starts_with("#compdef fencelock"));
    assert!(std::fs::read_to_string(FISH_COMPLETION).unwrap().contains("complete -c fencelock"));
    std::fs::metadata(format!("{DOC}/copyright")).unwrap();
    let changelog = run_ok(Command::new("gzip").args(["-dc", &format!("{DOC}/changelog.Debian.gz")]));
    assert!(changelog.starts_with(&format!("fencelock ({version})")), "{changelog}");

    // The unit: systemd accepts it, and it says what the task asks.
    let verify = output(Command::new("systemd-analyze").args(["verify", UNIT]));
    let said = format!("{}{}", text(&verify.stdout), text(&verify.stderr));
    assert!(verify.status.success(), "systemd-analyze verify {UNIT}: {}\n{said}", verify.status);
    assert!(!said.lines().any(|l| l.contains("fencelock.service")), "systemd-analyze verify {UNIT}:\n{said}");
    let unit = unit_settings(&std::fs::read_to_string(UNIT).unwrap());
    let get = |key: &str| {
        let all: Vec<&str> = unit.iter().filter(|(k, _)| k == key).map(|(_, v)| v.as_str()).collect();
        assert_eq!(all.len(), 1, "{key} once in the unit: {all:?}");
        all[0].to_string()
    };
    for (key, value) in [
        ("Type", "notify"),
        ("ExecStart", "/usr/bin/fencelock serve --config /etc/fencelock/fencelock.toml"),
        ("User", "fencelock"),
        ("Restart", "on-failure"),
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("ReadWritePaths", STATE),
        ("WorkingDirectory", STATE),
    ] {
        assert_eq!(get(key), value, "{key}");
    }
    let max_connections: u64 = serve_flags()
        .into_iter()
        .find(|f| f.name == "max-connections")
        .and_then(|f| f.default)
        .expect("--max-connections states its default")
        .parse()
        .unwrap();
    let nofile: u64 = get("LimitNOFILE").parse().unwrap();
    assert!(max_connections * 4 <= nofile * 3, "LimitNOFILE={nofile} leaves a quarter beside {max_connections}");
    let stop_timeout = unit_seconds(&get("TimeoutStopSec"));

    // Run it as the unit does: the installed binary and settings, as the
    // user fencelock, without new privileges, in the state directory; only
    // the ports moved to free ones (the environment beats the file).
    let grpc = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let http = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let name = format!("fencelock-package-test-{}", std::process::id());
    let notify = {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        UnixDatagram::bind_addr(&addr).unwrap()
    };
    notify.set_read_timeout(Some(POLL)).unwrap();
    let exec: Vec<String> = get("ExecStart").split_whitespace().map(str::to_string).collect();
    let mut node = Process::spawn(
        Command::new("setpriv")
            .args(["--reuid", "fencelock", "--regid", "fencelock", "--init-groups", "--no-new-privs", "--"])
            .args(&exec)
            .current_dir(STATE)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("FENCELOCK_LISTEN", grpc.to_string())
            .env("FENCELOCK_HTTP", http.to_string())
            .env("NOTIFY_SOCKET", format!("@{name}")),
        &dir.path().join("installed.log"),
    );
    let receive = |node: &mut Process, what: &str| -> String {
        let mut buf = [0u8; 4096];
        for _ in 0..POLLS {
            if let Ok(n) = notify.recv(&mut buf) {
                return text(&buf[..n]);
            }
            node.fail_if_exited(what);
        }
        panic!("no {what} on @{name} within {POLLS} polls; log:\n{}", node.log_text());
    };
    let ready = receive(&mut node, "READY=1");
    assert!(ready.lines().next() == Some("READY=1") && ready.contains(&http.to_string()), "{ready:?}");
    node.wait_health(http, 200);
    let status = std::fs::read_to_string(format!("/proc/{}/status", node.child.id())).unwrap();
    let real_uid = status.lines().find_map(|l| l.strip_prefix("Uid:")).unwrap().split_whitespace().next().unwrap();
    assert_eq!(real_uid, uid.to_string(), "the node runs as the user fencelock");
    assert_eq!(mode_owner(&format!("{STATE}/data")).1, uid, "the node made its data dir as fencelock");
    let (exited, polls) = node.terminate();
    let stopping = receive(&mut node, "STOPPING=1");
    assert_eq!(stopping.lines().next(), Some("STOPPING=1"), "{stopping:?}");
    assert!(exited.success(), "{exited}; log:\n{}", node.log_text());
    assert!(u64::from(polls) * (POLL.as_millis() as u64) < stop_timeout * 1000, "stopped within TimeoutStopSec");
    drop(node);

    // Purge: the program, the unit and the settings go; the data and its
    // owner stay.
    run_ok(Command::new("dpkg").args(["--purge", "fencelock"]).env_remove("FENCELOCK_PURGE_DATA"));
    assert!(!package_known(), "purged");
    for gone in [BINARY, UNIT, CONFFILE, BASH_COMPLETION] {
        assert!(!Path::new(gone).exists(), "{gone} after purge");
    }
    assert!(Path::new(&format!("{STATE}/data")).is_dir(), "the data is kept on purge");
    assert!(getent("passwd", "fencelock").is_some(), "the user that owns the data is kept on purge");

    // Installed again over the kept data, then purged with the data.
    run_ok(Command::new("dpkg").arg("-i").arg(&deb));
    assert_eq!(mode_owner(STATE), (0o750, uid, gid), "the kept state directory, as it was");
    assert!(Path::new(&format!("{STATE}/data")).is_dir());
    run_ok(Command::new("dpkg").args(["--purge", "fencelock"]).env("FENCELOCK_PURGE_DATA", "yes"));
    assert!(!package_known(), "purged");
    assert!(!Path::new(STATE).exists(), "FENCELOCK_PURGE_DATA=yes removes {STATE}");
    assert!(getent("passwd", "fencelock").is_none() && getent("group", "fencelock").is_none(), "and the user");
    assert!(!Path::new(BINARY).exists());
    drop(machine);
}

/// A `Containerfile` instruction: its keyword and the rest of it, with line
/// continuations joined and comments left out.
fn instructions(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with('#') || (t.is_empty() && current.is_empty()) {
            continue;
        }
        match t.strip_suffix('\\') {
            Some(part) => {
                current.push_str(part);
                current.push(' ');
            }
            None => {
                current.push_str(t);
                let (word, rest) = current.trim().split_once(char::is_whitespace).unwrap_or((current.trim(), ""));
                out.push((word.to_ascii_uppercase(), rest.trim().to_string()));
                current.clear();
            }
        }
    }
    assert!(current.is_empty(), "a continuation at the end");
    out
}

fn json_array(v: &str) -> Vec<String> {
    serde_json::from_str(v).unwrap_or_else(|e| panic!("{v:?} is no JSON array of strings (exec form): {e}"))
}

/// Runs the HEALTHCHECK command (exec form) with `FENCELOCK_HTTP` as the
/// node's; true if it says healthy (exit 0).
fn healthy(check: &[String], http: SocketAddr) -> bool {
    let out = output(
        Command::new(&check[0])
            .args(&check[1..])
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("FENCELOCK_HTTP", format!("0.0.0.0:{}", http.port())),
    );
    out.status.success()
}

#[test]
fn the_container_file_runs_the_node_it_documents() {
    require_tools(&["bash", "timeout"]);
    let root = repo_root();
    let file = std::fs::read_to_string(root.join("packaging/Containerfile")).unwrap();
    let all = instructions(&file);
    let froms: Vec<usize> = all.iter().enumerate().filter(|(_, (k, _))| k == "FROM").map(|(i, _)| i).collect();
    assert_eq!(froms.len(), 2, "two stages");
    let (builder, runtime) = (&all[froms[0] + 1..froms[1]], &all[froms[1] + 1..]);
    let (builder_image, stage) = all[froms[0]].1.split_once(" AS ").expect("FROM … AS builder");
    assert!(
        builder_image.starts_with("docker.io/library/rust:") && builder_image.ends_with("-bookworm"),
        "{builder_image}"
    );
    assert_eq!(all[froms[1]].1, "docker.io/library/debian:bookworm-slim");

    // The builder builds the CLI from the whole workspace, release and locked.
    let build = builder.iter().find(|(k, v)| k == "RUN" && v.contains("cargo build")).expect("RUN cargo build");
    for arg in ["-p fencelock-cli", "--release", "--locked"] {
        assert!(build.1.contains(arg), "{}", build.1);
    }
    let copied: Vec<&str> =
        builder.iter().filter(|(k, _)| k == "COPY").flat_map(|(_, v)| v.split_whitespace().rev().skip(1)).collect();
    let manifest: toml::Table = toml::from_str(&std::fs::read_to_string(root.join("Cargo.toml")).unwrap()).unwrap();
    let members = manifest["workspace"]["members"].as_array().unwrap();
    for member in members.iter().map(|m| m.as_str().unwrap()) {
        assert!(
            copied.iter().any(|c| Path::new(member).starts_with(c)),
            "workspace member {member} not copied: {copied:?}"
        );
    }
    for needed in ["Cargo.toml", "Cargo.lock", ".cargo"] {
        assert!(copied.contains(&needed), "{needed} not copied: {copied:?}");
    }

    // The runtime stage: the binary alone, a user of its own, the volume, the ports.
    let find = |key: &str| -> Vec<&str> { runtime.iter().filter(|(k, _)| k == key).map(|(_, v)| v.as_str()).collect() };
    assert_eq!(find("COPY"), [format!("--from={stage} /src/target/release/fencelock /usr/bin/fencelock")]);
    let user = find("USER");
    assert_eq!(user.len(), 1);
    let uid = user[0].split(':').next().unwrap();
    assert!(uid.parse::<u32>().is_ok_and(|u| u > 0), "a numeric user that is not root: {user:?}");
    assert!(find("RUN").iter().any(|r| r.contains(&format!("useradd --uid {uid} "))), "the user {uid} is made");
    assert_eq!(find("VOLUME"), ["/var/lib/fencelock"]);
    assert_eq!(find("EXPOSE"), ["7070 7071"]);
    let env: BTreeMap<&str, &str> =
        find("ENV").iter().flat_map(|e| e.split_whitespace()).map(|kv| kv.split_once('=').expect("ENV K=V")).collect();
    assert_eq!(env.get("FENCELOCK_LISTEN"), Some(&"0.0.0.0:7070"));
    assert_eq!(env.get("FENCELOCK_HTTP"), Some(&"0.0.0.0:7071"));
    let data = Path::new(env["FENCELOCK_DATA_DIR"]);
    assert!(
        data.starts_with("/var/lib/fencelock") && data != Path::new("/var/lib/fencelock"),
        "{data:?}: below the volume (the node refuses an empty existing data dir)"
    );
    let entrypoint = json_array(find("ENTRYPOINT")[0]);
    assert_eq!(entrypoint, ["fencelock", "serve"]);
    let cmd = json_array(find("CMD")[0]);
    assert!(cmd.contains(&"--insecure".to_string()), "the default command says it serves plaintext: {cmd:?}");
    let health = find("HEALTHCHECK");
    assert_eq!(health.len(), 1);
    let check = json_array(health[0].split_once(" CMD ").expect("HEALTHCHECK … CMD [...]").1);
    assert_eq!(check[..2], ["bash", "-c"]);

    // The image's command as the image runs it, ports mapped to free ones and
    // the data dir to the test's.
    let dir = tempfile::tempdir().unwrap();
    let (grpc_port, http_port) = (free_port(), free_port());
    let map = |s: &str| s.replace(":7070", &format!(":{grpc_port}")).replace(":7071", &format!(":{http_port}"));
    let image_run = |args: &[String], log: &str| {
        let mut c = Command::new(bin());
        c.args(&entrypoint[1..]).args(args.iter().map(|a| map(a))).env_clear().env("PATH", "/usr/bin:/bin");
        for (k, v) in &env {
            c.env(k, map(v));
        }
        c.env("FENCELOCK_DATA_DIR", dir.path().join("image-data"));
        Process::spawn(&mut c, &dir.path().join(log))
    };
    // Without --insecure the node would not serve plaintext on 0.0.0.0: the
    // default command's --insecure is what lets it, and says so.
    let without: Vec<String> = cmd.iter().filter(|a| *a != "--insecure").cloned().collect();
    let mut refused = image_run(&without, "refused.log");
    let status = refused.wait_exit();
    assert!(!status.success() && refused.log_text().contains("--insecure"), "{status}: {}", refused.log_text());
    let http = SocketAddr::from(([127, 0, 0, 1], http_port));
    let mut leader = image_run(&cmd, "image.log");
    leader.wait_health(http, 200);
    assert!(healthy(&check, http), "the HEALTHCHECK passes on a leader");

    // A node waiting to join (503, no leader) is not healthy; once added, a
    // follower of a group with a leader (503 naming it) is.
    let joiner_grpc = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let joiner_http = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let mut joiner = Process::spawn(
        Command::new(bin())
            .args(["serve", "--join", "--node-id", "2", "--data-dir"])
            .arg(dir.path().join("joiner-data"))
            .args(["--listen", &joiner_grpc.to_string(), "--http", &joiner_http.to_string()]),
        &dir.path().join("joiner.log"),
    );
    joiner.wait_health(joiner_http, 503);
    assert!(!healthy(&check, joiner_http), "a node that knows no leader is not healthy");
    run_ok(Command::new(bin()).args(["cluster", "add", "2", &joiner_grpc.to_string(), "--admin", &http.to_string()]));
    let mut follower_healthy = false;
    for _ in 0..POLLS {
        if healthy(&check, joiner_http) {
            follower_healthy = true;
            break;
        }
        joiner.fail_if_exited("the follower's health");
        std::thread::sleep(POLL);
    }
    assert!(follower_healthy, "a follower of a group with a leader is healthy; log:\n{}", joiner.log_text());
    assert_eq!(http_get(joiner_http, "/healthz").unwrap().0, 503, "the follower's /healthz is 503, yet it is healthy");

    // A node that answers nothing is not healthy.
    let (status, _) = joiner.terminate();
    assert!(status.success(), "{status}");
    assert!(!healthy(&check, joiner_http), "a stopped node is not healthy");
    let unused = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    assert!(!healthy(&check, unused), "nothing listening is not healthy");
    let (status, _) = leader.terminate();
    assert!(status.success(), "{status}; log:\n{}", leader.log_text());
}
