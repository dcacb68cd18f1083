//! ZooKeeper (Debian's zookeeper package), standalone.
//!
//! Debian's jar names no logging binding for slf4j, so a server started the
//! way Debian's `zkServer.sh` does (and as the test profile does) logs
//! nothing at all: `/etc/zookeeper/conf/log4j.properties` is never read. The
//! production profile adds log4j's binding and logs warnings to a file.

use std::fs::{self, File};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::{free_port, shared_tempdir, stop_child, wait_ready, which, Profile, INSTALL_HINT};

/// Where Debian puts the server's jar (its manifest names the dependencies).
const ZK_JAR: &str = "/usr/share/java/zookeeper.jar";

/// log4j's slf4j binding and log4j itself (Debian's libslf4j-java and
/// liblog4j1.2-java, both dependencies of the zookeeper package).
const LOG4J_JARS: [&str; 2] = ["/usr/share/java/slf4j-log4j12.jar", "/usr/share/java/log4j-1.2.jar"];

/// A standalone ZooKeeper server, with no per-host connection limit
/// (`maxClientCnxns=0`: the bench's clients all come from 127.0.0.1, past the
/// default of 60) and `forceSync` on (the default: transactions are fsynced
/// before they are acknowledged). [`Profile::Test`]: `tickTime` 100 ms, so
/// sessions of 200 ms to 60 s are allowed; a 256 MB heap, serial GC, no
/// logging. [`Profile::Production`]: `tickTime` 2000 (the default: sessions
/// of 4 s to 40 s), the JVM's default G1 collector with a 1 GB heap, the
/// transaction log in its own directory, warnings logged to a file.
pub struct ZkServer {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
    profile: Profile,
}

impl ZkServer {
    /// Starts a fresh server in the test profile and waits until it serves
    /// (`srvr` answers a mode).
    pub fn start() -> Self {
        Self::start_profile(Profile::Test)
    }

    /// Starts a fresh server in `profile` and waits until it serves.
    pub fn start_profile(profile: Profile) -> Self {
        let mut server = ZkServer { child: None, port: free_port(), dir: shared_tempdir(), profile };
        server.spawn();
        server
    }

    /// How the server runs, in one line (for a report).
    pub fn describe(&self) -> String {
        let (jvm, cfg) = (self.jvm_args(), self.config_lines());
        let log = match self.profile {
            Profile::Test => "no logging (Debian's jar has no slf4j binding)",
            Profile::Production => "log4j at WARN to a file",
        };
        format!("java {}; {}; {log}", jvm.join(" "), cfg.join(", "))
    }

    /// `zk://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("zk://127.0.0.1:{}", self.port)
    }

    /// The client port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// SIGKILL, then start again on the same port and data.
    pub fn kill_and_restart(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.spawn();
    }

    /// The settings of `zoo.cfg` that differ between profiles or matter to
    /// the bench (the rest: the data directories, the port, the admin server
    /// off, `srvr` and `ruok` allowed).
    fn config_lines(&self) -> Vec<String> {
        let mut lines: Vec<String> = match self.profile {
            Profile::Test => {
                ["tickTime=100", "minSessionTimeout=200", "maxSessionTimeout=60000"].map(String::from).into()
            }
            Profile::Production => vec!["tickTime=2000".into()],
        };
        lines.extend(["maxClientCnxns=0", "forceSync=yes"].map(String::from));
        lines
    }

    fn jvm_args(&self) -> Vec<String> {
        let args: &[&str] = match self.profile {
            Profile::Test => &["-Xmx256m", "-XX:+UseSerialGC"],
            Profile::Production => &["-Xmx1g", "-XX:+UseG1GC"],
        };
        args.iter().map(|a| a.to_string()).collect()
    }

    /// The classpath: the production profile puts its `log4j.properties`
    /// (written into the temp dir) and log4j's jars on it.
    fn classpath(&self) -> String {
        match self.profile {
            Profile::Test => format!("/etc/zookeeper/conf:{ZK_JAR}"),
            Profile::Production => {
                let dir = self.dir.path();
                let props = format!(
                    "log4j.rootLogger=WARN, FILE\nlog4j.appender.FILE=org.apache.log4j.FileAppender\n\
                     log4j.appender.FILE.File={}\nlog4j.appender.FILE.layout=org.apache.log4j.PatternLayout\n\
                     log4j.appender.FILE.layout.ConversionPattern=%d{{ISO8601}} %-5p [%t] %c{{1}}: %m%n\n",
                    dir.join("zookeeper-warn.log").display()
                );
                fs::write(dir.join("log4j.properties"), props).unwrap();
                for jar in LOG4J_JARS {
                    assert!(Path::new(jar).exists(), "{jar} not found: {INSTALL_HINT}");
                }
                format!("{}:{ZK_JAR}:{}", dir.display(), LOG4J_JARS.join(":"))
            }
        }
    }

    fn spawn(&mut self) {
        let java = which("java").unwrap_or_else(|| panic!("java not found: {INSTALL_HINT}"));
        assert!(Path::new(ZK_JAR).exists(), "{ZK_JAR} not found: {INSTALL_HINT}");
        let dir = self.dir.path();
        let cfg = dir.join("zoo.cfg");
        let mut text = format!(
            "dataDir={}\ndataLogDir={}\nclientPort={}\nclientPortAddress=127.0.0.1\n\
             admin.enableServer=false\n4lw.commands.whitelist=srvr,ruok\n",
            dir.join("data").display(),
            dir.join(if self.profile == Profile::Test { "data" } else { "txlog" }).display(),
            self.port
        );
        for line in self.config_lines() {
            text.push_str(&line);
            text.push('\n');
        }
        fs::write(&cfg, text).unwrap();
        let log_path = dir.join("zookeeper.log");
        let log = File::options().create(true).append(true).open(&log_path).unwrap();
        let mut child = Command::new(java)
            .args(self.jvm_args())
            .args(["-cp", &self.classpath()])
            .arg(format!("-Dzookeeper.log.dir={}", dir.display()))
            .args(["org.apache.zookeeper.server.ZooKeeperServerMain", cfg.to_str().unwrap()])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start ZooKeeper ({e}): {INSTALL_HINT}"));
        let port = self.port;
        wait_ready("zookeeper", &mut child, &log_path, || zk_serving(port));
        self.child = Some(child);
    }
}

fn zk_serving(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    // Short: a server that accepted before it serves answers nothing, and the
    // next poll asks again.
    let _ = stream.set_read_timeout(Some(Duration::from_millis(300)));
    let mut reply = String::new();
    stream.write_all(b"srvr").is_ok() && stream.read_to_string(&mut reply).is_ok() && reply.contains("Mode:")
}

impl Drop for ZkServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            stop_child(&mut child, Signal::SIGKILL, 500);
        }
    }
}
