//! `fencelock top` as a person uses it: in a terminal (tmux, detached, one
//! server of its own per test), with keys sent to it and its screen read
//! back (`capture-pane`), while `fencelock` CLI processes take, queue for
//! and release locks. Each step waits until the screen shows the change:
//! `top` learns of it from its watch stream, without a key pressed.
//!
//! `top` runs under a small shell script that records the terminal's
//! settings before and after it and its exit code, then stays (so that the
//! terminal is still there to be read), so the tests see that it put the
//! terminal back as it found it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use crate::support::cluster::Cluster;
use crate::support::{acquire_at, bin, fencelock_at, kill_child, stderr, Server};

/// How long the screen may take to show a change: this many polls, 100 ms
/// apart. `top` lists again 100 ms after an event (every 2 s anyway, and a
/// list that gets no answer in 3 s means the server is unreachable); the
/// bound is wide for a loaded 2-core machine (liveness, not a timing).
const POLLS: u32 = 100;
const EVERY: Duration = Duration::from_millis(100);

/// A tmux server of its own (`-L`, a socket name no other test uses)
/// running one session, `top`, of a fixed size and without a status line.
/// Killed on drop (with what runs in it), even when the test panics.
struct Tmux {
    socket: String,
    dir: PathBuf,
    width: usize,
    height: usize,
}

impl Tmux {
    /// `fencelock top ARGS…` in a `width`×`height` terminal, with `env` set
    /// (and no other FENCELOCK_ variable). `name` makes the socket unique.
    fn start(dir: &Path, name: &str, (width, height): (usize, usize), args: &[&str], env: &[(&str, &str)]) -> Tmux {
        let dir = dir.to_path_buf();
        let conf = dir.join("tmux.conf");
        std::fs::write(&conf, "set -g status off\n").unwrap();
        let script = dir.join("run-top.sh");
        let mut text = String::from("#!/bin/sh\nunset FENCELOCK_SERVER FENCELOCK_ADMIN FENCELOCK_AUTH_TOKEN\n");
        for (k, v) in env {
            text.push_str(&format!("export {k}='{v}'\n"));
        }
        let quoted: Vec<String> = args.iter().map(|a| format!("'{a}'")).collect();
        let d = dir.display();
        text.push_str(&format!(
            "stty -g > {d}/stty.before\n'{}' top {}\ncode=$?\nstty -g > {d}/stty.after\necho $code > {d}/exit.code\nexec sleep 600\n",
            bin(),
            quoted.join(" ")
        ));
        std::fs::write(&script, text).unwrap();
        let tmux = Tmux { socket: format!("fencelock-top-{}-{name}", std::process::id()), dir, width, height };
        let out = tmux.tmux(&[
            "-f",
            conf.to_str().unwrap(),
            "new-session",
            "-d",
            "-s",
            "top",
            "-x",
            &width.to_string(),
            "-y",
            &height.to_string(),
            &format!("sh {}", script.display()),
        ]);
        assert!(out.status.success(), "tmux new-session: {}", stderr(&out));
        let size = tmux.pane("#{pane_width}x#{pane_height}");
        assert_eq!(size, format!("{width}x{height}"), "the pane is the terminal's size");
        tmux
    }

    /// `tmux -L SOCKET ARGS…`. A missing tmux fails the test: it is a test
    /// dependency (scripts/install-test-deps.sh installs it).
    fn tmux(&self, args: &[&str]) -> Output {
        Command::new("tmux")
            .args(["-L", &self.socket])
            .args(args)
            .output()
            .expect("run tmux (scripts/install-test-deps.sh installs it)")
    }

    /// Pane variables of the session (`#{alternate_on}`, …).
    fn pane(&self, format: &str) -> String {
        let out = self.tmux(&["display-message", "-p", "-t", "top", format]);
        assert!(out.status.success(), "tmux display-message: {}", stderr(&out));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// The screen's lines as the terminal shows them (`-J`: a line the
    /// terminal wrapped is one line here, so a line wider than the terminal
    /// shows as one), printed for the test's log. Each fits the terminal.
    fn screen(&self) -> Vec<String> {
        let out = self.tmux(&["capture-pane", "-p", "-J", "-t", "top"]);
        assert!(out.status.success(), "tmux capture-pane: {}", stderr(&out));
        let lines: Vec<String> = String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect();
        for line in &lines {
            assert!(
                line.chars().count() <= self.width,
                "a line wider than {}: {line:?}\n{}",
                self.width,
                lines.join("\n")
            );
        }
        assert!(lines.len() <= self.height, "more lines than {} rows:\n{}", self.height, lines.join("\n"));
        lines
    }

    /// Send tmux key names (`Enter`, `C-c`, `q`).
    fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "top"];
        args.extend(keys);
        assert!(self.tmux(&args).status.success());
    }

    /// Type `text` as it is.
    fn type_text(&self, text: &str) {
        assert!(self.tmux(&["send-keys", "-t", "top", "-l", text]).status.success());
    }

    /// Poll the screen until `ok` holds; the screen then, with the header
    /// on its first line. Panics with the last screen after [`POLLS`].
    fn wait_for(&self, what: &str, ok: impl Fn(&[String]) -> bool) -> Vec<String> {
        let mut last = Vec::new();
        for _ in 0..POLLS {
            last = self.screen();
            if ok(&last) {
                println!("--- {what}:\n{}", last.join("\n"));
                assert!(last[0].starts_with("fencelock top — "), "the header is on line 1: {:?}", last[0]);
                return last;
            }
            std::thread::sleep(EVERY);
        }
        panic!("the screen did not show {what} within {POLLS} polls:\n{}", last.join("\n"));
    }

    /// Wait until `top` ended (the script around it wrote its exit code);
    /// then its exit code, and whether the terminal's settings after it
    /// were those before it; and wait until the terminal runs the script's
    /// `sleep` and shows the normal screen with the cursor (once tmux has
    /// drawn what `top` wrote last).
    fn wait_exit(&self) -> (i32, bool) {
        let read = |f: &str| std::fs::read_to_string(self.dir.join(f)).unwrap_or_default();
        let mut code = None;
        for _ in 0..POLLS {
            code = read("exit.code").trim().parse().ok();
            if code.is_some() {
                break;
            }
            std::thread::sleep(EVERY);
        }
        let Some(code) = code else { panic!("top did not exit within {POLLS} polls:\n{}", self.screen().join("\n")) };
        let restored = !read("stty.before").is_empty() && read("stty.before") == read("stty.after");
        let mut flags = String::new();
        for _ in 0..POLLS {
            flags = self.pane("#{alternate_on} #{cursor_flag} #{pane_current_command}");
            if flags == "0 1 sleep" {
                let after = self.screen();
                assert!(
                    !after.iter().any(|l| l.contains("fencelock top")),
                    "top's screen is gone:\n{}",
                    after.join("\n")
                );
                return (code, restored);
            }
            std::thread::sleep(EVERY);
        }
        panic!(
            "the terminal is not back to the normal screen with the cursor shown (alternate, cursor, command: {flags})"
        );
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let out = self.tmux(&["display-message", "-p", "#{socket_path}"]);
        let _ = self.tmux(&["kill-server"]);
        // The socket may outlive its server.
        let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if out.status.success() && path.contains(&self.socket) {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// The columns of the row of `lock` (LOCK HOLDER TOKEN HELD TTL WAIT
/// WAITERS…, split at spaces) and its line's index, if it is on the screen.
fn row<'a>(screen: &'a [String], lock: &str) -> Option<(usize, Vec<&'a str>)> {
    screen.iter().enumerate().skip(4).find_map(|(i, l)| {
        let cols: Vec<&str> = l.split_whitespace().collect();
        (cols.first() == Some(&lock)).then_some((i, cols))
    })
}

/// A token as 80 columns show it: whole up to 9 digits, else `…` and its
/// last 8 (a server's tokens are large; grants differ in the last digits).
fn at_80(token: u64) -> String {
    let t = token.to_string();
    match t.len() {
        0..=9 => t,
        n => format!("…{}", &t[n - 8..]),
    }
}

/// `fencelock run NAME --wait 120s -- …` in its own process group: queued
/// until granted, then holding (its lease kept alive) until killed; it
/// writes its token to `token_file` once granted. Killed with its group on
/// drop.
struct Waiter(Option<Child>);

impl Waiter {
    fn start(server: &str, name: &str, identity: &str, token_file: &Path) -> Waiter {
        use std::os::unix::process::CommandExt as _;
        let script = format!("echo \"$FENCELOCK_TOKEN\" > {}; exec sleep 600", token_file.display());
        let child = Command::new(bin())
            .process_group(0)
            .args(["run", name, "--ttl", "15s", "--wait", "120s", "--identity", identity, "--", "sh", "-c", &script])
            .env("FENCELOCK_SERVER", server)
            .env_remove("FENCELOCK_AUTH_TOKEN")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn fencelock run");
        Waiter(Some(child))
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        if let Some(c) = &self.0 {
            let _ = Command::new("kill").args(["-KILL", "--", &format!("-{}", c.id())]).status();
        }
        kill_child(&mut self.0);
    }
}

/// The token a `Waiter` wrote, once it has.
fn token_in(file: &Path) -> u64 {
    for _ in 0..POLLS {
        if let Some(t) = std::fs::read_to_string(file).ok().and_then(|s| s.trim().parse().ok()) {
            return t;
        }
        std::thread::sleep(EVERY);
    }
    panic!("no token in {}", file.display());
}

/// Rule (issue 36): in an 80×24 terminal, `top` shows a grant's row with
/// the token the CLI printed, a queued `run` as WAIT 1 with its identity, a
/// lock with more waiters above it (contention order), a release handing
/// the lock to the waiter (its token, larger: INV-2), and the group line
/// from `--admin`; `/` + a prefix + Enter shows only that prefix's locks;
/// `q` ends it with exit 0, the terminal as it was (settings, normal screen,
/// cursor shown). No line is wider than 80 columns, the header is line 1.
#[test]
fn top_shows_grants_queues_contention_and_handoffs_live_and_filters() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let url = server.url();
    let admin = server.http.to_string();
    let t = Tmux::start(dir.path(), "walk", (80, 24), &["--server", &url, "--admin", &admin], &[]);
    let s = t.wait_for("the header and the group", |s| {
        s[0].contains("— live") && s.get(1).is_some_and(|g| g.starts_with("group: term") && g.contains("lag 0"))
    });
    assert!(s[0].starts_with(&format!("fencelock top — {url} — 0 locks, 0 held, 0 waiting — live")), "{}", s[0]);
    assert_eq!(s[2], "/ to filter, r to refresh, q to quit");
    assert_eq!(t.pane("#{alternate_on}"), "1", "top draws on the alternate screen");

    // A grant: its row, with the CLI's token.
    let (token_a, lease_a) = acquire_at(&url, None, "jobs/a", "holder-a");
    let s = t.wait_for("jobs/a's row", |s| row(s, "jobs/a").is_some());
    let (_, cols) = row(&s, "jobs/a").unwrap();
    assert_eq!((cols[1], cols[2], cols[5]), ("holder-a", at_80(token_a).as_str(), "0"), "{cols:?}");

    // A waiter: WAIT 1 and its identity.
    let a_file = dir.path().join("a.token");
    let _waiter_a = Waiter::start(&url, "jobs/a", "waiter-a", &a_file);
    let s = t.wait_for("jobs/a's waiter", |s| row(s, "jobs/a").is_some_and(|(_, c)| c[5] == "1"));
    assert_eq!(row(&s, "jobs/a").unwrap().1[6..], ["waiter-a"]);

    // More contention: jobs/b with two waiters sorts above jobs/a.
    acquire_at(&url, None, "jobs/b", "holder-b");
    let _waiters_b: Vec<Waiter> = ["waiter-b1", "waiter-b2"]
        .iter()
        .map(|who| {
            let w = Waiter::start(&url, "jobs/b", who, &dir.path().join(format!("{who}.token")));
            // In this order in the queue.
            t.wait_for(&format!("{who} queued"), |s| row(s, "jobs/b").is_some_and(|(_, c)| c.contains(who)));
            w
        })
        .collect();
    let s = t.wait_for("jobs/b's two waiters", |s| row(s, "jobs/b").is_some_and(|(_, c)| c[5] == "2"));
    let (b_line, b_cols) = row(&s, "jobs/b").unwrap();
    let (a_line, _) = row(&s, "jobs/a").unwrap();
    assert!(b_line < a_line, "the lock with more waiters comes first:\n{}", s.join("\n"));
    assert_eq!(b_cols[6..], ["waiter-b1,", "waiter-b2"]);
    assert!(s[0].contains("— 2 locks, 2 held, 3 waiting — live"), "{}", s[0]);

    // The release hands jobs/a to its waiter.
    let out = fencelock_at(
        &url,
        None,
        &["release", "jobs/a", "--lease", &lease_a.to_string(), "--token", &token_a.to_string()],
    );
    assert!(out.status.success(), "release: {}", stderr(&out));
    let s = t.wait_for("waiter-a holding jobs/a", |s| row(s, "jobs/a").is_some_and(|(_, c)| c[1] == "waiter-a"));
    let token = token_in(&a_file);
    let (_, cols) = row(&s, "jobs/a").unwrap();
    assert_eq!((cols[2], cols[5]), (at_80(token).as_str(), "0"), "{cols:?}");
    assert!(token > token_a, "INV-2: {token} > {token_a}");

    // The old holder writes late; the fence refuses and reports it: a line
    // above the table says so.
    let report = format!(r#"{{"refused_token":"{token_a}","highest_token":"{token}","resource":"out/a.csv"}}"#);
    let json = [("Content-Type", "application/json".to_string())];
    let (status, body) =
        crate::support::http_request(server.http, "POST", "/v1/locks/jobs%2Fa/refusals", &json, report.as_bytes())
            .unwrap();
    assert_eq!(status, 200, "{body}");
    let want = format!("refused: 1 stale write — last: jobs/a token {} < {} (out/a.csv)", at_80(token_a), at_80(token));
    let s = t.wait_for("the refusal line", |s| s[3] == want);
    assert!(s[4].starts_with("LOCK "), "the table moved down a line:\n{}", s.join("\n"));

    // The filter: only jobs/b….
    t.keys(&["/"]);
    t.wait_for("the filter being typed", |s| s[2] == "filter:   (Enter applies, Esc cancels)");
    t.type_text("jobs/b");
    t.wait_for("the typed prefix", |s| s[2] == "filter: jobs/b  (Enter applies, Esc cancels)");
    t.keys(&["Enter"]);
    let s = t.wait_for("only jobs/b", |s| s[2].starts_with("filter: jobs/b — ") && row(s, "jobs/b").is_some());
    assert!(row(&s, "jobs/a").is_none(), "jobs/a is filtered out:\n{}", s.join("\n"));
    assert!(s[0].contains("— 1 lock, 1 held, 2 waiting — live"), "{}", s[0]);

    // `q`: gone, and the terminal as it was.
    t.keys(&["q"]);
    let (code, restored) = t.wait_exit();
    assert_eq!(code, 0, "q exits with 0");
    assert!(restored, "the terminal's settings are put back (stty -g before = after)");
}

/// Rule: when the server goes away, the header says `reconnecting` and the
/// last table stays; when it is back, `live` again, without a key. Without
/// `--admin` the group line says what adds it. Ctrl-C quits with exit 0
/// and the terminal as it was.
#[test]
fn top_keeps_the_table_while_reconnecting_and_ctrl_c_quits() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(dir.path());
    let url = server.url();
    let t = Tmux::start(dir.path(), "reconnect", (80, 24), &["--server", &url], &[]);
    let (token, _) = acquire_at(&url, None, "jobs/kept", "holder-k");
    let s = t.wait_for("the row", |s| row(s, "jobs/kept").is_some());
    assert!(s[1].starts_with("group: --admin HOST:PORT"), "{}", s[1]);

    server.kill();
    let s = t.wait_for("reconnecting", |s| s[0].ends_with("— reconnecting"));
    let (_, cols) = row(&s, "jobs/kept").expect("the last table stays");
    assert_eq!(cols[2], at_80(token));

    server.restart();
    t.wait_for("live again", |s| s[0].trim_end().ends_with("— live") && row(s, "jobs/kept").is_some());

    t.keys(&["C-c"]);
    let (code, restored) = t.wait_exit();
    assert_eq!((code, restored), (0, true), "Ctrl-C exits with 0 and puts the terminal back");
}

/// The members the group line lists (`…; members 1 lag 0, 2 lag 0, 3 lag 0`).
fn members(group_line: &str) -> usize {
    group_line.split_once("; members ").map_or(0, |(_, m)| m.split(", ").count())
}

/// Rule (issue 36, a 3-node group): `top` given every member's client and
/// admin address shows the group (its three members and its leader) and
/// the group's locks, and follows the group through a fail-over: once the
/// leader is SIGKILLed, the group line names the new leader and a grant
/// taken after it shows its row, without a key pressed.
#[test]
fn top_shows_a_three_node_group_and_follows_it_through_a_fail_over() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::start_plain(3);
    let (urls, admins) = (c.urls(), c.admins());
    let t = Tmux::start(dir.path(), "group", (80, 24), &["--server", &urls, "--admin", &admins], &[]);
    let leader_id = c.nodes[c.must_lead("with top")].id;
    let names_leader = |id: u64| {
        move |s: &[String]| s.get(1).is_some_and(|g| g.contains(&format!("leader node {id};")) && members(g) == 3)
    };
    t.wait_for("the group with its leader", names_leader(leader_id));

    let (before, _) = acquire_at(&urls, None, "jobs/g", "holder-g");
    let s = t.wait_for("jobs/g's row", |s| row(s, "jobs/g").is_some());
    assert_eq!(row(&s, "jobs/g").unwrap().1[1..3], ["holder-g", at_80(before).as_str()]);

    let kill = c.kill_leader();
    let new_id = c.nodes[kill.new].id;
    t.wait_for("the group line naming the new leader", names_leader(new_id));
    let (after, _) = acquire_at(&urls, None, "jobs/h", "holder-h");
    assert!(after > before, "INV-2 across the fail-over: {after} > {before}");
    let s = t.wait_for("jobs/h's row after the fail-over", |s| row(s, "jobs/h").is_some() && s[0].contains("— live"));
    assert_eq!(row(&s, "jobs/h").unwrap().1[1..3], ["holder-h", at_80(after).as_str()]);
    assert!(row(&s, "jobs/g").is_some(), "the grant from before the fail-over is still listed:\n{}", s.join("\n"));
    t.keys(&["q"]);
    assert_eq!(t.wait_exit(), (0, true));
}

/// Rule: with authentication on, a prefix the token may not read is refused
/// on the filter line and nothing of it is shown; a prefix it may read is
/// listed. Where the token may not see the group (`/v1/cluster` needs
/// admin), the group line is the node's `/healthz`, and says why.
#[test]
fn top_shows_a_refusal_on_the_filter_line_and_the_nodes_health() {
    let dir = tempfile::tempdir().unwrap();
    let roles = crate::support::secure::READER_OF_JOBS;
    let tokens = [("ops", "admin"), ("jobs-viewer", "reader")];
    let (server, tokens) = crate::support::secure::server_with_tokens(dir.path(), roles, &tokens);
    let [admin_token, reader]: [String; 2] = tokens.try_into().unwrap();
    let url = server.url();
    acquire_at(&url, Some(&admin_token), "jobs/nightly", "host-a");
    acquire_at(&url, Some(&admin_token), "billing/close", "host-b");

    let admin = server.http.to_string();
    let env = [("FENCELOCK_AUTH_TOKEN", reader.as_str())];
    let t = Tmux::start(dir.path(), "refused", (80, 24), &["--server", &url, "--admin", &admin], &env);
    let s = t.wait_for("the refusal", |s| s[2].starts_with("filter: (all) — permission denied"));
    assert!(!s.iter().any(|l| l.contains("billing") || l.contains("jobs/nightly")), "{}", s.join("\n"));
    let s = t.wait_for("the node's health", |s| s[1].starts_with("node "));
    assert!(s[1].ends_with("(/v1/cluster: permission denied)"), "{}", s[1]);
    assert!(s[1].contains("leader") && s[1].contains("applied"), "{}", s[1]);

    t.keys(&["/"]);
    t.type_text("jobs/");
    t.keys(&["Enter"]);
    let s = t.wait_for("jobs/nightly", |s| row(s, "jobs/nightly").is_some());
    assert!(s[2].starts_with("filter: jobs/ — / to change"), "the refusal is gone: {}", s[2]);
    assert!(!s.iter().any(|l| l.contains("billing")), "{}", s.join("\n"));
    assert!(!s.join("\n").contains(&reader), "the token is never shown");
    t.keys(&["q"]);
    assert_eq!(t.wait_exit(), (0, true));
}

/// Rule: `top` draws for the terminal's size as it is now: a lock name cut
/// with `…` in 80 columns is whole once the terminal is 120 wide, and the
/// header spans the new width.
#[test]
fn top_redraws_for_the_new_size_when_the_terminal_is_resized() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let url = server.url();
    let long = "databases/primary/schema-migrations/2026";
    acquire_at(&url, None, long, "migrator");
    let mut t = Tmux::start(dir.path(), "resize", (80, 24), &["--server", &url], &[]);
    let s = t.wait_for("the cut name", |s| s.iter().any(|l| l.starts_with("databases/primary/")));
    assert!(row(&s, long).is_none() && s.iter().any(|l| l.contains('…')), "cut at 80:\n{}", s.join("\n"));
    assert_eq!(s[0].chars().count(), 80, "the header spans the width");

    assert!(t.tmux(&["resize-window", "-t", "top", "-x", "120", "-y", "30"]).status.success());
    (t.width, t.height) = (120, 30);
    let s = t.wait_for("the whole name", |s| row(s, long).is_some());
    assert_eq!(s[0].chars().count(), 120, "the header spans the new width");
    t.keys(&["q"]);
    assert_eq!(t.wait_exit(), (0, true));
}

/// Rule: `top` needs a terminal: with stdout not one (a pipe, a script) it
/// says what to use instead and exits with the usage code, 2.
#[test]
fn top_refuses_without_a_terminal() {
    // No server: the terminal is checked first.
    let out = Command::new(bin())
        .args(["top", "--server", "http://127.0.0.1:1"])
        .stdin(Stdio::null())
        .output()
        .expect("run fencelock top");
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(
        stderr(&out).trim(),
        "fencelock: error: fencelock top needs a terminal; use `fencelock locks` or `fencelock watch` in scripts"
    );
    assert!(out.stdout.is_empty(), "no escape sequence reaches a pipe");
}
