//! Issue 37: the image `packaging/Containerfile` describes, built and run by
//! podman (Debian's), as root.
//!
//! This machine cannot reach docker.io, where the file's two base images
//! live, and the builder stage's release build takes over ten minutes on 2
//! cores. So podman is given the file with its builder stage replaced by a
//! local image that holds the binary under test where the builder leaves it
//! (`/src/target/release/fencelock`), and with `debian:bookworm-slim`
//! replaced by a local stand-in made of this Debian 12 machine's own files
//! that the runtime stage runs (dash, bash, cat, timeout, install, groupadd,
//! useradd, nologin and the libraries they and the binary link). The runtime
//! stage is the file's own, byte for byte after its `FROM` line: podman parses
//! and runs each of its instructions.
//!
//! The image then runs as the file's comments say (ports published on
//! 127.0.0.1, a named volume on /var/lib/fencelock, the default command): the
//! node serves as the user 10001 with its data on the volume, `podman
//! healthcheck run` finds it healthy, and a container started anew on the
//! same volume goes on from the state the first one left (the next token is
//! larger).
//!
//! `--runtime runc` and the lowered `--ulimit`s: podman's own defaults ask
//! for limits this test machine does not let a container set, and crun does
//! not run on its hybrid cgroups; neither changes what the image is.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use crate::support::{bin, free_port, http_get, http_request};

/// Bound of each wait: polls of [`POLL`] (60 s in all, for a loaded machine).
const POLLS: u32 = 600;
const POLL: Duration = Duration::from_millis(100);

/// What the runtime stage runs (its RUN and HEALTHCHECK instructions), from this machine.
const STAND_IN_TOOLS: [&str; 8] = [
    "/usr/bin/dash",
    "/usr/bin/bash",
    "/usr/bin/cat",
    "/usr/bin/timeout",
    "/usr/bin/install",
    "/usr/sbin/groupadd",
    "/usr/sbin/useradd",
    "/usr/sbin/nologin",
];

/// podman, with the runtime and limits this machine allows (module docs).
fn podman() -> Command {
    let mut cmd = Command::new("podman");
    cmd.args(["--runtime", "runc"]);
    cmd
}

const LIMITS: [&str; 4] = ["--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096"];

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e} (scripts/install-test-deps.sh installs podman)"))
}

fn run_ok(cmd: &mut Command) -> String {
    let out = run(cmd);
    assert!(out.status.success(), "{cmd:?}: {}\n{}\n{}", out.status, text(&out.stdout), text(&out.stderr));
    text(&out.stdout)
}

/// Everything the test made in podman, removed when dropped (on failure too).
#[derive(Default)]
struct Made {
    containers: Vec<String>,
    volumes: Vec<String>,
    images: Vec<String>,
}

impl Drop for Made {
    fn drop(&mut self) {
        for c in &self.containers {
            let _ = podman().args(["rm", "-f", "-t", "1", c]).output();
        }
        for v in &self.volumes {
            let _ = podman().args(["volume", "rm", "-f", v]).output();
        }
        for i in &self.images {
            let _ = podman().args(["rmi", "-f", i]).output();
        }
    }
}

/// The shared libraries `binary` links, as `ldd` names them.
fn libraries(binary: &Path) -> Vec<PathBuf> {
    let out = run_ok(Command::new("ldd").arg(binary));
    out.lines().filter_map(|l| l.split_whitespace().find(|w| w.starts_with('/')).map(PathBuf::from)).collect()
}

/// `root` as an image named `tag`.
fn import(made: &mut Made, root: &Path, tag: &str) {
    let tar = root.with_extension("tar");
    run_ok(Command::new("tar").arg("-C").arg(root).arg("-cf").arg(&tar).arg("."));
    run_ok(podman().args(["import"]).arg(&tar).arg(tag));
    made.images.push(tag.to_string());
}

/// The stand-in for debian:bookworm-slim: Debian 12's merged /usr layout, the
/// tools of [`STAND_IN_TOOLS`] (`sh` is dash), their libraries and the
/// binary's, and the account files useradd edits.
fn stand_in_base(made: &mut Made, dir: &Path, tag: &str) {
    let root = dir.join("base");
    for d in
        ["usr/bin", "usr/sbin", "usr/lib", "usr/lib64", "etc/default", "tmp", "var/lib", "root", "proc", "dev", "sys"]
    {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    for (link, to) in [("bin", "usr/bin"), ("sbin", "usr/sbin"), ("lib", "usr/lib"), ("lib64", "usr/lib64")] {
        std::os::unix::fs::symlink(to, root.join(link)).unwrap();
    }
    std::os::unix::fs::symlink("dash", root.join("usr/bin/sh")).unwrap();
    let mut files: Vec<PathBuf> = STAND_IN_TOOLS.iter().map(PathBuf::from).collect();
    let linked: Vec<PathBuf> = files.iter().chain([PathBuf::from(bin())].iter()).flat_map(|f| libraries(f)).collect();
    files.extend(linked);
    files.push("/etc/login.defs".into());
    for f in &files {
        // Libraries under /lib go to /usr/lib (the merged layout).
        let at = match f.strip_prefix("/lib") {
            Ok(rest) => Path::new("/usr/lib").join(rest),
            Err(_) => match f.strip_prefix("/lib64") {
                Ok(rest) => Path::new("/usr/lib64").join(rest),
                Err(_) => f.clone(),
            },
        };
        let to = root.join(at.strip_prefix("/").unwrap());
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(f, &to).unwrap_or_else(|e| panic!("copy {f:?}: {e}"));
    }
    for (name, body) in [
        ("etc/passwd", "root:x:0:0:root:/root:/bin/bash\n"),
        ("etc/group", "root:x:0:\n"),
        ("etc/shadow", "root:*:19000:0:99999:7:::\n"),
        ("etc/gshadow", "root:*::\n"),
    ] {
        std::fs::write(root.join(name), body).unwrap();
    }
    std::fs::set_permissions(root.join("tmp"), std::os::unix::fs::PermissionsExt::from_mode(0o1777)).unwrap();
    import(made, &root, tag);
}

/// The builder stage's stand-in: the binary under test where the builder leaves it.
fn stand_in_builder(made: &mut Made, dir: &Path, tag: &str) {
    let root = dir.join("builder");
    let to = root.join("src/target/release/fencelock");
    std::fs::create_dir_all(to.parent().unwrap()).unwrap();
    std::fs::copy(bin(), &to).unwrap();
    import(made, &root, tag);
}

/// The file's runtime stage (from its second `FROM`), its base replaced by
/// `base`, after a builder stage that is `builder`.
fn derived(file: &str, builder: &str, base: &str) -> String {
    let runtime_at = file.match_indices("\nFROM ").nth(1).expect("a second FROM: the runtime stage").0 + 1;
    let runtime = &file[runtime_at..];
    let (from_line, rest) = runtime.split_once('\n').unwrap();
    assert_eq!(from_line, "FROM docker.io/library/debian:bookworm-slim");
    let stage = file[..runtime_at].lines().find_map(|l| l.strip_prefix("FROM ")).unwrap();
    let (_, name) = stage.split_once(" AS ").expect("FROM … AS builder");
    format!("FROM {builder} AS {name}\nFROM {base}\n{rest}")
}

fn wait_for(what: &str, mut ready: impl FnMut() -> Option<String>) -> String {
    for _ in 0..POLLS {
        if let Some(v) = ready() {
            return v;
        }
        std::thread::sleep(POLL);
    }
    panic!("{what}: not within {:?}", POLL * POLLS);
}

/// Starts the image as the file's comments say, its ports published on `api`
/// and `admin`; returns the container's name.
fn start(made: &mut Made, image: &str, volume: &str, api: u16, admin: u16, n: usize) -> String {
    let name = format!("{volume}-{n}");
    run_ok(podman().arg("run").args(LIMITS).args(["-d", "--name", &name]).args([
        "-p",
        &format!("127.0.0.1:{api}:7070"),
        "-p",
        &format!("127.0.0.1:{admin}:7071"),
        "-v",
        &format!("{volume}:/var/lib/fencelock"),
        image,
    ]));
    made.containers.push(name.clone());
    name
}

fn healthz(admin: SocketAddr, name: &str) {
    wait_for("the container's node serving /healthz", || {
        let up = matches!(http_get(admin, "/healthz"), Ok((200, _)));
        if !up {
            let state = run(podman().args(["inspect", "-f", "{{.State.Status}}", name]));
            let status = text(&state.stdout);
            let logs = run(podman().args(["logs", name]));
            assert!(status.trim() == "running", "the container stopped ({status}):\n{}", text(&logs.stderr));
        }
        up.then(String::new)
    });
}

/// A lock taken through the container's published HTTP port: its token.
fn acquire(admin: SocketAddr) -> u64 {
    let (code, body) = http_request(admin, "POST", "/v1/locks/jobs/acquire", &[], br#"{"ttl_ms": 60000}"#).unwrap();
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["token"].as_str().and_then(|t| t.parse().ok()).unwrap_or_else(|| panic!("no token: {body}"))
}

#[test]
fn the_image_builds_serves_as_its_user_is_healthy_and_keeps_its_state_on_the_volume() {
    let uid = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self").unwrap());
    assert_eq!(uid, 0, "the container test runs as root (podman builds and runs as root here)");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap();
    let file = std::fs::read_to_string(root.join("packaging/Containerfile")).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let id = format!("{}-{}", std::process::id(), tmp.path().file_name().unwrap().to_string_lossy().to_lowercase());
    let (base, builder, image) = (
        format!("localhost/fencelock-test-base:{id}"),
        format!("localhost/fencelock-test-builder:{id}"),
        format!("localhost/fencelock-test:{id}"),
    );
    let mut made = Made::default();
    stand_in_base(&mut made, tmp.path(), &base);
    stand_in_builder(&mut made, tmp.path(), &builder);

    // The file's runtime stage, built by podman (docker format: OCI images
    // have no HEALTHCHECK).
    let derived = derived(&file, &builder, &base);
    let runtime_at = file.match_indices("\nFROM ").nth(1).unwrap().0 + 1;
    assert!(derived.ends_with(file[runtime_at..].split_once('\n').unwrap().1), "the runtime stage is the file's");
    let context = tmp.path().join("context");
    std::fs::create_dir_all(&context).unwrap();
    std::fs::write(context.join("Containerfile"), &derived).unwrap();
    made.images.push(image.clone());
    run_ok(
        podman()
            .arg("build")
            .args(LIMITS)
            .args(["--format", "docker", "-t", &image, "-f"])
            .arg(context.join("Containerfile"))
            .arg(&context),
    );
    let config = run_ok(podman().args(["inspect", "-f", "{{.Config.User}} {{json .HealthCheck.Test}}", &image]));
    assert!(config.starts_with("10001:10001 [\"CMD\",\"bash\",\"-c\""), "{config}");

    let volume = format!("fencelock-test-{id}");
    made.volumes.push(volume.clone());
    let (api, admin) = (free_port(), free_port());
    let admin_addr: SocketAddr = ([127, 0, 0, 1], admin).into();
    let first = start(&mut made, &image, &volume, api, admin, 1);
    healthz(admin_addr, &first);

    // The node runs as the image's user, and its data dir is on the volume.
    let pid = run_ok(podman().args(["inspect", "-f", "{{.State.Pid}}", &first]));
    let status = std::fs::read_to_string(format!("/proc/{}/status", pid.trim())).unwrap();
    let uid = status.lines().find_map(|l| l.strip_prefix("Uid:")).unwrap();
    assert_eq!(uid.split_whitespace().next(), Some("10001"), "{status}");
    let mountpoint = run_ok(podman().args(["volume", "inspect", "-f", "{{.Mountpoint}}", &volume]));
    wait_for("the data dir on the volume", || Path::new(mountpoint.trim()).join("data").is_dir().then(String::new));

    // The image's HEALTHCHECK, run by podman.
    let health = run(podman().args(["healthcheck", "run", &first]));
    assert!(health.status.success(), "healthcheck: {}\n{}", text(&health.stdout), text(&health.stderr));

    // State survives the container: a new one on the same volume goes on.
    let before = acquire(admin_addr);
    run_ok(podman().args(["stop", "-t", "10", &first]));
    let second = start(&mut made, &image, &volume, api, admin, 2);
    healthz(admin_addr, &second);
    let after = wait_for("a grant from the second container", || {
        let (code, body) =
            http_request(admin_addr, "POST", "/v1/locks/other/acquire", &[], br#"{"ttl_ms": 60000}"#).ok()?;
        (code == 200).then_some(body)
    });
    let v: serde_json::Value = serde_json::from_str(&after).unwrap();
    let token: u64 = v["token"].as_str().unwrap().parse().unwrap();
    assert!(token > before, "token {token} from the second container, {before} before it");
    let (code, body) = http_get(admin_addr, "/v1/locks/jobs").unwrap();
    assert_eq!(code, 200, "the first container's lock, read back after the restart: {body}");
    assert!(body.contains(&format!("\"{before}\"")), "the held lock survived with its token {before}: {body}");
}
