//! The CLI as people use it around its commands (issue 37 §2): shell
//! completions, man pages, `--version`, and the server's log formats. Each
//! runs the real `fencelock` binary; the completion is run by a real bash,
//! the pages are rendered by a real `man` (man-db: scripts/install-test-deps.sh).

// Tests wait for a process by the clock; no lease logic lives here.
#![allow(clippy::disallowed_methods)]

use std::{
    collections::BTreeMap,
    path::Path,
    process::{Command, Output},
    time::{Duration, Instant},
};

use crate::support::{self, bin, stderr, stdout, Server};

/// `fencelock ARGS…`, waited for.
fn fencelock(args: &[&str]) -> Output {
    Command::new(bin()).args(args).output().expect("run fencelock")
}

/// The words bash's completion offers for `words` (the command line so far,
/// the word being completed last), with `script` sourced in a clean bash:
/// the function clap_complete writes, called as bash's `complete -F` does.
fn bash_complete(script: &Path, words: &[&str]) -> Vec<String> {
    let quoted: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
    let cword = words.len() - 1;
    let prev = if cword > 0 { words[cword - 1] } else { "" };
    let program = format!(
        "source '{}' && COMP_WORDS=({}) && COMP_CWORD={cword} && _fencelock fencelock '{}' '{prev}' \
         && printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        script.display(),
        quoted.join(" "),
        words[cword],
    );
    let out = Command::new("bash").args(["--norc", "--noprofile", "-c", &program]).output().expect("run bash");
    assert!(out.status.success(), "bash: {}", stderr(&out));
    stdout(&out).lines().map(str::to_string).collect()
}

/// Rule: `fencelock completions bash` is a script bash parses, and its
/// completion offers the subcommands that start with what was typed (`r`:
/// run, release, resize, not serve), nested subcommands, and a flag's
/// choices.
#[test]
fn bash_completion_parses_and_completes_subcommands() {
    let tmp = tempfile::tempdir().unwrap();
    let out = fencelock(&["completions", "bash"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let script = tmp.path().join("fencelock.bash");
    std::fs::write(&script, &out.stdout).unwrap();
    let parsed = Command::new("bash").arg("-n").arg(&script).output().expect("run bash -n");
    assert!(parsed.status.success(), "bash -n: {}", stderr(&parsed));

    let offered = bash_complete(&script, &["fencelock", "r"]);
    for word in ["run", "release", "resize"] {
        assert!(offered.iter().any(|o| o == word), "{word} in {offered:?}");
    }
    assert!(!offered.iter().any(|o| o == "serve"), "{offered:?}");
    assert!(offered.iter().all(|o| o.starts_with('r')), "{offered:?}");
    assert_eq!(bash_complete(&script, &["fencelock", "cluster", "a"]), ["add"]);
    assert_eq!(bash_complete(&script, &["fencelock", "serve", "--log-format", ""]), ["text", "json"]);
}

/// Rule: there is a script for each shell clap_complete knows, and any
/// other shell is a usage error (exit 2) that names the choices.
#[test]
fn completions_for_each_shell_and_a_wrong_one_is_a_usage_error() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = fencelock(&["completions", shell]);
        assert!(out.status.success(), "{shell}: {}", stderr(&out));
        let script = stdout(&out);
        assert!(script.contains("fencelock") && script.contains("check-data"), "{shell}: {script}");
    }
    let out = fencelock(&["completions", "tcsh"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("bash") && stderr(&out).contains("powershell"), "{}", stderr(&out));
}

/// `page` as `man -l` renders it, wide enough that no help line is broken;
/// its warnings (`--warnings`: undefined macros, bad escapes) fail the test.
fn man_render(page: &Path) -> String {
    let out = Command::new("man")
        .args(["--warnings", "-P", "cat", "-l"])
        .arg(page)
        .env("MANWIDTH", "200")
        .env("LC_ALL", "C.UTF-8")
        .output()
        .expect("run man (package man-db; scripts/install-test-deps.sh installs it)");
    assert!(out.status.success(), "man -l {}: {}", page.display(), stderr(&out));
    assert_eq!(stderr(&out), "", "man -l {} warned", page.display());
    stdout(&out)
}

/// Rule: `fencelock man DIR` writes a page per command, nested ones named
/// `fencelock-PARENT-CHILD.1`, prints their paths, and each is roff that
/// `man -l` renders without a warning; every subcommand a page lists has
/// its own page, and the run page has `--ttl` with its help. (That every
/// subcommand of the clap tree has a page: `manual::tests`.)
#[test]
fn man_writes_a_page_per_command_that_man_renders_cleanly() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("man1");
    let out = fencelock(&["man", dir.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let mut printed: Vec<String> = stdout(&out).lines().map(str::to_string).collect();
    printed.sort();
    let mut files: Vec<String> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path().display().to_string()).collect();
    files.sort();
    assert_eq!(printed, files);
    let names: Vec<String> = files.iter().map(|f| f.rsplit('/').next().unwrap().to_string()).collect();
    for page in ["fencelock.1", "fencelock-run.1", "fencelock-serve.1", "fencelock-cluster-add.1", "fencelock-man.1"] {
        assert!(names.iter().any(|n| n == page), "{page} in {names:?}");
    }

    let mut rendered = BTreeMap::new();
    for name in &names {
        let text = man_render(&dir.join(name));
        let title = name.trim_end_matches(".1");
        let name_line = text.lines().skip_while(|l| l.trim() != "NAME").nth(1).unwrap_or_default();
        let words: Vec<&str> = name_line.split_whitespace().take(2).collect();
        assert_eq!(words, [title, "-"], "{name}: its NAME line\n{text}");
        rendered.insert(name.clone(), text);
    }
    // The pages' own SUBCOMMANDS sections, followed from fencelock.1.
    let mut listed = Vec::new();
    for text in rendered.values() {
        for word in text.split_whitespace() {
            if let Some(sub) = word.strip_suffix("(1)").filter(|w| w.starts_with("fencelock-")) {
                listed.push(format!("{sub}.1"));
            }
        }
    }
    assert!(listed.len() + 1 >= names.len(), "{listed:?}");
    for page in &listed {
        assert!(rendered.contains_key(page), "{page} is listed but not written");
    }

    let run = &rendered["fencelock-run.1"];
    let ttl = run.lines().position(|l| l.trim_start().starts_with("--ttl ")).expect("--ttl on the run page");
    let help = run.lines().nth(ttl + 1).unwrap_or_default();
    assert!(help.contains("Lease TTL: the lock is lost this long after the holder stops renewing"), "{run}");
}

/// The `what: value` lines of `--version`'s output, after its first.
fn version_fields(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .skip(1)
        .map(|l| {
            let (k, v) = l.split_once(": ").unwrap_or_else(|| panic!("not `what: value`: {l:?}"));
            (k.to_string(), v.to_string())
        })
        .collect()
}

/// Rule: `--version` and `-V` print the crate's version, the commit it was
/// built from (12 hex digits, `+dirty` if the tree had changes, or
/// `unknown` without git: HEAD's when there is git here), and every on-disk
/// and wire format it reads and writes, each equal to its constant.
#[test]
fn version_names_the_commit_and_every_format() {
    let out = fencelock(&["--version"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let short = fencelock(&["-V"]);
    assert_eq!(stdout(&short), text, "-V prints the same");
    assert_eq!(text.lines().next(), Some(format!("fencelock {}", env!("CARGO_PKG_VERSION")).as_str()), "{text}");

    let fields = version_fields(&text);
    let commit = &fields["commit"];
    let hash = commit.strip_suffix("+dirty").unwrap_or(commit);
    assert!(
        hash == "unknown" || (hash.len() == 12 && hash.bytes().all(|b| b.is_ascii_hexdigit())),
        "commit {commit:?}"
    );
    let head = Command::new("git")
        .args(["-C", env!("CARGO_MANIFEST_DIR"), "rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success());
    if let Some(head) = head {
        assert_eq!(hash, stdout(&head).trim(), "the commit is HEAD's");
    }

    use fencelock_server::{backup, raft};
    let package = |service: &str| service.rsplit_once('.').unwrap().0.to_string();
    let expected = BTreeMap::from([
        ("commit".to_string(), commit.clone()),
        ("data dir format".to_string(), raft::identity::FORMAT_VERSION.to_string()),
        ("segment log format".to_string(), raft::wal::format::FORMAT_VERSION.to_string()),
        ("log entry codec".to_string(), raft::LOG_ENTRY_CODEC.to_string()),
        ("backup format".to_string(), format!("{} {}", backup::FORMAT, backup::VERSION)),
        ("client API".to_string(), package(fencelock_proto::v1::lock_server::SERVICE_NAME)),
        ("peer API".to_string(), package(fencelock_proto::raft::raft_server::SERVICE_NAME)),
    ]);
    assert_eq!(fields, expected, "{text}");
    assert_eq!(expected["client API"], "fencelock.v1");
}

/// SIGTERM `server` and wait until it has exited.
fn stop(server: &mut Server) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(server.pid() as i32), nix::sys::signal::Signal::SIGTERM)
        .expect("SIGTERM");
    let start = Instant::now();
    while server.is_running() {
        assert!(start.elapsed() < Duration::from_secs(20), "server did not stop; log:\n{}", server.log_text());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Rule: `serve --log-format json` writes nothing to stderr but JSON
/// objects, one a line, each with `level` and `fields.message` (the
/// "fencelock serving" event, the node's serving and shutting-down lines
/// among them); the default stays the text log with its plain
/// `fencelock: node N serving …` line.
#[test]
fn serve_logs_one_json_object_a_line() {
    let tmp = tempfile::tempdir().unwrap();
    let mut server = Server::start_with_flags(&tmp.path().join("json"), &["--log-format", "json"], None);
    let out = support::cli(&server, &["acquire", "cli-surface", "--ttl", "5s"]);
    assert!(out.status.success(), "{}", stderr(&out));
    stop(&mut server);
    let log = server.log_text();
    let mut messages = Vec::new();
    for line in log.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}\nlog:\n{log}"));
        assert!(v["level"].is_string() && v["timestamp"].is_string() && v["target"].is_string(), "{line}");
        let message = v["fields"]["message"].as_str().unwrap_or_else(|| panic!("no fields.message: {line}"));
        messages.push(message.to_string());
    }
    assert!(messages.iter().any(|m| m == "fencelock serving"), "{log}");
    assert!(messages.iter().any(|m| m.starts_with("node 1 serving gRPC on ")), "{log}");
    assert!(messages.iter().any(|m| m == "SIGTERM, shutting down"), "{log}");

    // The line follows the first healthy answer by a moment.
    let text = Server::start(&tmp.path().join("text"));
    let start = Instant::now();
    while !text.log_text().lines().any(|l| l.starts_with("fencelock: node 1 serving gRPC on ")) {
        assert!(start.elapsed() < Duration::from_secs(10), "no serving line in the text log:\n{}", text.log_text());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Rule: a log format other than `text` and `json`, by flag or by
/// FENCELOCK_LOG_FORMAT, is a usage error (exit 2) that names both.
#[test]
fn a_wrong_log_format_is_a_usage_error() {
    let by_flag = fencelock(&["serve", "--log-format", "xml"]);
    let by_env = Command::new(bin()).args(["serve"]).env("FENCELOCK_LOG_FORMAT", "yaml").output().unwrap();
    for out in [by_flag, by_env] {
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        let e = stderr(&out);
        assert!(e.contains("--log-format") && e.contains("text") && e.contains("json"), "{e}");
    }
}
