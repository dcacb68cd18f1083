//! The dashboard as a person uses it: a real `fencelock serve`, its page in
//! headless Chromium (Debian's, driven through ChromeDriver), and locks
//! taken, queued, released and lost by `fencelock` CLI processes. Each step
//! checks what the page shows, without reloading it: the page learns of
//! every change from its one live stream (`/v1/watch`).
//!
//! Screenshots of each view, light and dark, at 1280×800, are taken on every
//! run; with `FENCELOCK_SCREENSHOTS=1` they are written to `docs/dashboard/`,
//! where the README shows them.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fencelock_testkit::browser::Browser;
use serde_json::{json, Value};

use crate::support::cluster::Cluster;
use crate::support::secure::{server_with_tokens, READER_OF_JOBS};
use crate::support::{acquire_at, bin, fencelock_at, kill_child, stderr, Server};

/// How long the page may take to show a change: this many polls, 100 ms
/// apart. The page fetches the state 100 ms after each event it is pushed;
/// the bound is wide for a loaded 2-core machine (liveness, not a timing).
const POLLS: u32 = 100;
const EVERY: Duration = Duration::from_millis(100);

/// Where the screenshots go: `docs/dashboard/` when asked, else `tmp`.
fn shots_dir(tmp: &Path) -> PathBuf {
    match std::env::var_os("FENCELOCK_SCREENSHOTS") {
        Some(_) => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/dashboard"),
        None => tmp.join("shots"),
    }
}

/// Screenshots of what the page shows now, in the light and the dark theme.
fn shoot(b: &Browser, dir: &Path, name: &str) {
    std::fs::create_dir_all(dir).unwrap();
    for (dark, theme) in [(false, "light"), (true, "dark")] {
        b.set_color_scheme(dark);
        // The theme applies at the next frame.
        b.eval("return new Promise(r => requestAnimationFrame(() => requestAnimationFrame(() => r(true))));");
        b.screenshot(&dir.join(format!("{name}-{theme}.png")));
    }
    b.set_color_scheme(false);
}

/// A script that returns `expr` of the lock table's row of `lock` (as `r`),
/// or null while there is none.
fn row(lock: &str, expr: &str) -> String {
    let name = serde_json::to_string(lock).unwrap();
    format!(
        "const r = document.querySelector('tr[data-lock=\"' + CSS.escape({name}) + '\"]'); return r ? ({expr}) : null;"
    )
}

/// `fencelock run NAME -- …` in the background, holding the lock (its lease
/// kept alive) until killed; it writes its token to `token_file` once granted.
fn run_holder(server: &str, name: &str, identity: &str, token_file: &Path) -> Child {
    let script = format!("echo \"$FENCELOCK_TOKEN\" > {}; exec sleep 600", token_file.display());
    use std::os::unix::process::CommandExt as _;
    Command::new(bin())
        .process_group(0)
        .args(["run", name, "--ttl", "2s", "--wait", "120s", "--identity", identity, "--", "sh", "-c", &script])
        .env("FENCELOCK_SERVER", server)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn fencelock run")
}

/// SIGKILL a `run_holder` and its child (its process group), and reap it.
fn kill_group(child: &mut Option<Child>) {
    if let Some(c) = child {
        let _ = Command::new("kill").args(["-KILL", "--", &format!("-{}", c.id())]).status();
    }
    kill_child(child);
}

/// `fencelock elect NAME --value … -- sleep` in the background, as `who`.
fn elect(server: &str, name: &str, who: &str) -> Child {
    use std::os::unix::process::CommandExt as _;
    Command::new(bin())
        .process_group(0)
        .args(["elect", name, "--ttl", "5s", "--identity", who, "--value", "10.0.0.5:5432", "--", "sleep", "600"])
        .env("FENCELOCK_SERVER", server)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn fencelock elect")
}

/// `fencelock leader NAME --watch`: an election's observer, in its own
/// process group.
fn observe(server: &str, name: &str) -> Child {
    use std::os::unix::process::CommandExt as _;
    Command::new(bin())
        .process_group(0)
        .args(["leader", name, "--watch"])
        .env("FENCELOCK_SERVER", server)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn fencelock leader --watch")
}

/// The token a `run_holder` wrote, once it has.
fn token_in(file: &Path) -> Option<u64> {
    std::fs::read_to_string(file).ok()?.trim().parse().ok()
}

fn s(v: &Value) -> String {
    v.as_str().map(str::to_string).unwrap_or_else(|| v.to_string())
}

/// Issue 36's walk through the locks view: a grant shows its row with the
/// token the CLI printed; a queued `run` shows in the queue; a release hands
/// the lock to the waiter, whose row then shows its (larger, INV-2) token; a
/// holder killed with SIGKILL loses its lease when the TTL runs out, and the
/// row goes. The page is never reloaded (a marker set at the start is still
/// there at the end). Then the other views, and their screenshots.
#[test]
fn the_dashboard_shows_grants_queues_handoffs_and_expiries_live() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let url = server.url();
    let shots = shots_dir(dir.path());
    let b = Browser::start();
    b.goto(&format!("http://{}/", server.http));
    b.wait_for("the live stream", "return document.querySelector('#live').dataset.state === 'live';", POLLS, EVERY);
    b.eval("window.__notReloaded = true; return true;");
    b.wait_for("the empty table", "return !!document.querySelector('#empty');", POLLS, EVERY);

    // A grant: the row and the CLI's token.
    let (token_a, lease_a) = acquire_at(&url, None, "jobs/report", "holder-a");
    let shown = b.wait_for("the holder's row", &row("jobs/report", "r.dataset.token"), POLLS, EVERY);
    assert_eq!(s(&shown), token_a.to_string(), "the row shows the token the CLI printed");
    let holder = b.eval(&row("jobs/report", "r.querySelector('td.holder').innerText"));
    assert!(s(&holder).contains("holder-a") && s(&holder).contains(&lease_a.to_string()), "{holder}");

    // A waiter, in the queue.
    let b_file = dir.path().join("b.token");
    let mut waiter = Some(run_holder(&url, "jobs/report", "waiter-b", &b_file));
    let queue = b.wait_for(
        "the waiter in the queue",
        &row("jobs/report", "r.dataset.waiters === '1' && r.querySelector('td.waiters').innerText"),
        POLLS,
        EVERY,
    );
    assert!(s(&queue).contains("waiter-b"), "the queue names the waiter: {queue}");
    acquire_at(&url, None, "billing/invoices", "billing-7");
    b.wait_for("a second lock", &row("billing/invoices", "r.dataset.token"), POLLS, EVERY);
    shoot(&b, &shots, "locks");

    // The release hands the lock to the waiter.
    let out = fencelock_at(
        &url,
        None,
        &["release", "jobs/report", "--token", &token_a.to_string(), "--lease", &lease_a.to_string()],
    );
    assert!(out.status.success(), "release: {}", stderr(&out));
    let shown = b.wait_for(
        "the waiter as holder",
        &row("jobs/report", "r.dataset.waiters === '0' && r.dataset.token !== '' && r.dataset.token"),
        POLLS,
        EVERY,
    );
    let mut token_b = None;
    for _ in 0..POLLS {
        token_b = token_in(&b_file);
        if token_b.is_some() {
            break;
        }
        std::thread::sleep(EVERY);
    }
    let token_b = token_b.expect("the waiter's run wrote its token");
    assert_eq!(s(&shown), token_b.to_string(), "the row shows the new holder's token");
    assert!(token_b > token_a, "INV-2: the waiter's token {token_b} is above {token_a}");
    let holder = b.eval(&row("jobs/report", "r.querySelector('td.holder').innerText"));
    assert!(s(&holder).contains("waiter-b"), "{holder}");

    // The old holder, paused past its lease, writes late: the fence refuses
    // its token and reports it (as `fencelock storage --report-to` does);
    // the page marks the lock and lists the refusal under Fences.
    let report = json!({"refused_token": token_a.to_string(), "highest_token": token_b.to_string(),
                        "resource": "reports/2026-11-29.csv"});
    let json = [("Content-Type", "application/json".to_string())];
    let (status, body) = crate::support::http_request(
        server.http,
        "POST",
        "/v1/locks/jobs%2Freport/refusals",
        &json,
        report.to_string().as_bytes(),
    )
    .unwrap();
    assert_eq!(status, 200, "{body}");
    let chip = b.wait_for(
        "the refusal's mark",
        &row("jobs/report", "r.querySelector('.chip.refused')?.innerText"),
        POLLS,
        EVERY,
    );
    assert!(s(&chip).contains("1 late write refused"), "{chip}");
    b.goto(&format!("http://{}/#/fences", server.http));
    let refused = b.wait_for(
        "the refusal under Fences",
        "const r = document.querySelector('#refusals tr[data-lock=\"jobs/report\"]'); return r && r.innerText;",
        POLLS,
        EVERY,
    );
    for part in [token_a.to_string(), token_b.to_string(), "reports/2026-11-29.csv".into()] {
        assert!(s(&refused).contains(&part), "{part} in {refused}");
    }
    shoot(&b, &shots, "fences");

    // The one-lock view: its grants, in token order, and its events.
    b.goto(&format!("http://{}/#/lock/{}", server.http, "jobs%2Freport"));
    b.wait_for(
        "the lock's events",
        "return document.querySelectorAll('#events tr[data-kind=\"granted\"]').length === 2;",
        POLLS,
        EVERY,
    );
    let chart = b.eval("return document.querySelector('#token-chart') !== null;");
    assert_eq!(chart, Value::Bool(true), "the token chart is drawn");
    shoot(&b, &shots, "lock");
    b.eval("window.__notReloaded = true; return true;");

    // SIGKILL the holder: its lease runs out (TTL 2 s) and the page says so.
    kill_group(&mut waiter);
    let expired = b.wait_for(
        "the expiry",
        "const e = document.querySelector('#events tr[data-kind=\"expired\"]'); return e && e.innerText;",
        POLLS,
        EVERY,
    );
    assert!(s(&expired).contains(&token_b.to_string()), "the expired grant is the waiter's: {expired}");
    let state = b.eval("return document.querySelector('#lock-state').innerText;");
    assert!(s(&state).contains("free"), "the lock is free: {state}");
    let marker = b.eval("return window.__notReloaded === true;");
    assert_eq!(marker, Value::Bool(true), "the page was not reloaded");

    // The locks view no longer lists it.
    b.goto(&format!("http://{}/#/locks", server.http));
    b.wait_for(
        "the row gone",
        &format!(
            "return !document.querySelector('tr[data-lock=\"jobs/report\"]') && ({})",
            "document.querySelector('tr[data-lock=\"billing/invoices\"]') !== null"
        ),
        POLLS,
        EVERY,
    );

    // The other views, each with what it is for.
    let holders: Vec<Child> = (0..2)
        .map(|i| run_holder(&url, "pool/workers", &format!("worker-{i}"), &dir.path().join(format!("w{i}"))))
        .collect();
    b.goto(&format!("http://{}/#/leases", server.http));
    let leases = b.wait_for(
        "the leases",
        // Every lease the test made, not just any two: the two holders start at once and either may be first.
        "const t = document.querySelector('#leases').innerText; \
         return ['billing-7', 'worker-0', 'worker-1'].every(i => t.includes(i)) && t;",
        POLLS,
        EVERY,
    );
    assert!(s(&leases).contains("billing-7") && s(&leases).contains("worker-0"), "{leases}");
    shoot(&b, &shots, "leases");
    // An election: its leader's identity, term (the token) and value, a
    // candidate in its queue, and the one process observing it.
    let candidates: Vec<Child> = ["db-1", "db-2"].iter().map(|who| elect(&url, "db-primary", who)).collect();
    let observer = observe(&url, "db-primary");
    b.goto(&format!("http://{}/#/elections", server.http));
    let election = b.wait_for(
        "the election with its observer",
        &row(
            "db-primary",
            "r.querySelectorAll('td.waiters li').length === 1 && r.querySelector('td.observers').innerText === '1' && r.innerText",
        ),
        POLLS,
        EVERY,
    );
    assert!(s(&election).contains("10.0.0.5:5432") && s(&election).contains("db-"), "{election}");
    assert_eq!(b.eval(&row("pool/workers", "true")), Value::Null, "a lock with no value is no election");
    shoot(&b, &shots, "elections");
    b.goto(&format!("http://{}/#/group", server.http));
    let group = b.wait_for(
        "the group",
        "return document.querySelector('#members') && document.querySelector('#members').innerText;",
        POLLS,
        EVERY,
    );
    assert!(s(&group).contains(&server.grpc.to_string()) && s(&group).contains("leader"), "{group}");
    shoot(&b, &shots, "group");
    // Traffic: grants and releases from a loop of `fencelock run`, drawn as
    // rates from the node's own /metrics, sampled every 2 s.
    b.goto(&format!("http://{}/#/traffic", server.http));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = {
        let (stop, url) = (stop.clone(), url.clone());
        std::thread::spawn(move || {
            for _ in 0..200 {
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                let out = fencelock_at(&url, None, &["run", "jobs/busy", "--wait", "10s", "--", "true"]);
                assert!(out.status.success(), "run: {}", stderr(&out));
            }
        })
    };
    let grants = b.wait_for(
        "grants drawn over several samples",
        "const c = document.querySelector('#chart-grants'); \
         const pts = c && c.querySelector('polyline').getAttribute('points').trim().split(' ').length; \
         return c && pts >= 4 && !c.innerText.includes('peak 0.0/s') && c.innerText;",
        3 * POLLS,
        EVERY,
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    load.join().unwrap();
    assert!(s(&grants).contains("grants"), "{grants}");
    let held = b.eval("return document.querySelector('.cards').innerText;");
    assert!(s(&held).contains("Held locks"), "{held}");
    shoot(&b, &shots, "traffic");
    let errors = b.console_errors();
    assert!(errors.is_empty(), "the page logged errors: {errors:?}");
    for h in holders.into_iter().chain(candidates).chain([observer]) {
        kill_group(&mut Some(h));
    }
}

/// With authentication on, the page asks for a token, keeps it in the tab's
/// memory only, and shows only what that identity may read: a reader of
/// `jobs/` sees `jobs/` locks and none of `billing/` (INV-13 at the page).
/// An admin revokes a lease behind a confirmation that names what the holder
/// loses; the holder's lock is then free.
#[test]
fn with_authentication_the_page_shows_only_what_the_token_may_read() {
    let dir = tempfile::tempdir().unwrap();
    let (server, tokens) =
        server_with_tokens(dir.path(), READER_OF_JOBS, &[("ops", "admin"), ("jobs-viewer", "reader")]);
    let [admin, reader]: [String; 2] = tokens.try_into().unwrap();
    let url = server.url();
    let (_, lease_jobs) = acquire_at(&url, Some(&admin), "jobs/nightly", "host-a");
    acquire_at(&url, Some(&admin), "billing/close", "host-b");

    let b = Browser::start();
    b.goto(&format!("http://{}/#/locks?prefix=jobs/", server.http));
    b.wait_for("the sign-in form", "return !document.querySelector('#login').hidden;", POLLS, EVERY);
    sign_in(&b, &reader);
    b.wait_for("the jobs/ lock", &row("jobs/nightly", "r.dataset.token"), POLLS, EVERY);
    let text = b.eval("return document.body.innerText;");
    assert!(!s(&text).contains("billing"), "a reader of jobs/ sees no billing/ lock: {text}");
    let stored = b.eval("return localStorage.length + sessionStorage.length + document.cookie.length;");
    assert_eq!(stored, Value::from(0), "the token is kept in memory only");

    // Every lock, or billing/: refused, and nothing of billing/ shown.
    for prefix in ["", "billing/"] {
        b.eval(&format!(
            "const i = document.querySelector('#prefix'); i.value = {}; i.dispatchEvent(new Event('input')); return true;",
            serde_json::to_string(prefix).unwrap()
        ));
        let under = serde_json::to_string(&format!("under \"{prefix}\"")).unwrap();
        let refused = b.wait_for(
            "the refusal",
            &format!("const n = document.querySelector('#refused'); return n && n.innerText.includes({under}) && n.innerText;"),
            POLLS,
            EVERY,
        );
        assert!(s(&refused).contains("Not allowed"), "{refused}");
        assert_eq!(b.eval(&row("billing/close", "true")), Value::Null, "no billing/ row for prefix {prefix:?}");
    }
    shoot(&b, &shots_dir(dir.path()), "refused");

    // An admin (a new tab: the token went with the old page) revokes a lease.
    b.goto("about:blank");
    b.goto(&format!("http://{}/#/lock/jobs%2Fnightly", server.http));
    b.wait_for("the sign-in form", "return !document.querySelector('#login').hidden;", POLLS, EVERY);
    sign_in(&b, &admin);
    b.wait_for(
        "the holder",
        "return document.querySelector('#lock-state tr[data-lease] button') !== null;",
        POLLS,
        EVERY,
    );
    b.eval("document.querySelector('#lock-state tr[data-lease] button').click(); return true;");
    let text = b.wait_for(
        "the confirmation",
        "const d = document.querySelector('#confirm'); return d.open && d.innerText;",
        POLLS,
        EVERY,
    );
    assert!(
        s(&text).contains(&lease_jobs.to_string()) && s(&text).contains("loses"),
        "the dialog says what happens: {text}"
    );
    shoot(&b, &shots_dir(dir.path()), "revoke");
    b.eval("document.querySelector('#confirm-ok').click(); return true;");
    b.wait_for(
        "the lock free",
        "const s = document.querySelector('#lock-state'); return s && s.innerText.includes('free');",
        POLLS,
        EVERY,
    );
    let revoked = b.wait_for(
        "the revocation event",
        "return document.querySelector('#events tr[data-kind=\"revoked\"]') !== null;",
        POLLS,
        EVERY,
    );
    assert_eq!(revoked, Value::Bool(true));

    // A semaphore of 1 permit with a waiter: the admin resizes it to 2 behind
    // a confirmation, and the waiter is granted beside the holder.
    let out =
        fencelock_at(&url, Some(&admin), &["acquire", "pool/x", "--permits", "1", "--ttl", "120s", "--identity", "p1"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let mut waiter = Some(
        Command::new(bin())
            .args(["acquire", "pool/x", "--permits", "1", "--ttl", "120s", "--wait", "60s", "--identity", "p2"])
            .env("FENCELOCK_SERVER", &url)
            .env("FENCELOCK_AUTH_TOKEN", &admin)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    b.goto(&format!("http://{}/#/lock/pool%2Fx", server.http));
    b.wait_for(
        "the queued permit",
        "const q = document.querySelector('ol.queue'); return q && q.innerText.includes('p2');",
        POLLS,
        EVERY,
    );
    b.eval(
        "[...document.querySelectorAll('button')].find(b => b.innerText.startsWith('Resize')).click(); return true;",
    );
    let text = b.wait_for(
        "the resize dialog",
        "const d = document.querySelector('#confirm'); return d.open && d.innerText;",
        POLLS,
        EVERY,
    );
    assert!(
        s(&text).contains("has 1 permit.") && s(&text).contains("refused"),
        "the dialog says what a resize does: {text}"
    );
    b.eval("const i = document.querySelector('#permits'); i.value = '2'; document.querySelector('#confirm-ok').click(); return true;");
    let holders = b.wait_for(
        "both permits held",
        "return document.querySelectorAll('#lock-state tr[data-lease]').length === 2 && document.querySelector('#lock-state').innerText;",
        POLLS,
        EVERY,
    );
    assert!(s(&holders).contains("p1") && s(&holders).contains("p2"), "{holders}");
    kill_child(&mut waiter);
}

/// The page is served over the node's TLS like the rest of the admin port,
/// and a secure node's page asks for a token: an admin of a TLS group signs
/// in and sees a lock a client of the group took.
#[test]
fn a_secure_nodes_page_is_served_over_its_tls() {
    let c = Cluster::start(1);
    let secure = c.secure.clone().expect("a secure group");
    let out = c.client_cli(&["acquire", "jobs/tls", "--ttl", "120s", "--identity", "host-t", "--server", &c.urls()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let b = Browser::start_accepting_any_certificate();
    b.goto(&format!("https://{}/", c.nodes[0].http));
    let scheme = b.eval("return location.protocol;");
    assert_eq!(scheme, Value::from("https:"));
    b.wait_for("the sign-in form", "return !document.querySelector('#login').hidden;", POLLS, EVERY);
    sign_in(&b, &secure.admin_token);
    let holder =
        b.wait_for("the lock over TLS", &row("jobs/tls", "r.querySelector('td.holder').innerText"), POLLS, EVERY);
    assert!(s(&holder).contains("host-t"), "{holder}");
}

/// A refusal that answers a request sent before the sign-in, without a
/// token, does not sign out the token signed in since: the page and its live
/// stream stay. (A slow answer to the page's first requests once signed a
/// fast sign-in out again, and stopped its live stream.)
#[test]
fn a_late_refusal_of_a_request_sent_before_the_sign_in_does_not_sign_out() {
    let dir = tempfile::tempdir().unwrap();
    let (server, tokens) = server_with_tokens(dir.path(), "", &[("ops", "admin")]);
    let b = Browser::start();
    b.goto(&format!("http://{}/#/locks", server.http));
    b.wait_for("the sign-in form", "return !document.querySelector('#login').hidden;", POLLS, EVERY);
    // The page's fetch holds back a request without a token for 1.5 s, so
    // that its refusal comes after the sign-in below.
    b.eval(
        "const f = window.fetch; window.lateDone = false; \
         window.fetch = (u, o) => (o && o.headers && o.headers.Authorization) ? f(u, o) \
           : new Promise((r) => setTimeout(r, 1500)).then(() => f(u, o)).finally(() => { window.lateDone = true; }); \
         api('/v1/locks?limit=1').catch(() => null); return true;",
    );
    sign_in(&b, &tokens[0]);
    b.wait_for("the late refusal", "return window.lateDone === true;", POLLS, EVERY);
    b.wait_for("the live stream", "return document.querySelector('#live').dataset.state === 'live';", POLLS, EVERY);
    let shown = b.eval("return [document.querySelector('#login').hidden, document.querySelector('#main').hidden];");
    assert_eq!(shown, serde_json::json!([true, false]), "still signed in after the late refusal");
}

fn sign_in(b: &Browser, token: &str) {
    let token = serde_json::to_string(token).unwrap();
    b.eval(&format!(
        "document.querySelector('#token').value = {token}; document.querySelector('#login').requestSubmit(); return true;"
    ));
}

/// On a 3-node group, any member's page shows the locks and the group: a
/// follower's page shows a grant made through the group, and all three
/// members with their roles.
#[test]
fn a_followers_dashboard_shows_the_groups_locks_and_members() {
    let c = Cluster::start_plain(3);
    let leader = c.must_lead("at start");
    let follower = (leader + 1) % 3;
    let b = Browser::start();
    b.goto(&format!("http://{}/", c.nodes[follower].http));
    b.wait_for("the live stream", "return document.querySelector('#live').dataset.state === 'live';", POLLS, EVERY);
    let (token, _) = acquire_at(&c.urls(), None, "jobs/group", "host-g");
    let shown = b.wait_for("the row on a follower", &row("jobs/group", "r.dataset.token"), POLLS, EVERY);
    assert_eq!(s(&shown), token.to_string(), "a follower's page shows the grant made through the group");
    // The follower's TTLs count in its estimate of the group's clock: within
    // a replication delay of the leader's.
    let ttl = |i: usize| {
        let (status, body) = c.nodes[i].admin_get("/v1/locks/jobs%2Fgroup?consistency=local").unwrap();
        assert_eq!(status, 200, "{body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        v["holder"]["ttl_left_ms"].as_u64().unwrap_or_else(|| panic!("a holder with a TTL: {v}"))
    };
    let (on_leader, on_follower) = (ttl(leader), ttl(follower));
    assert!(on_follower <= 120_000 && on_follower + 5_000 >= on_leader, "{on_follower} vs {on_leader} ms");
    let summary = b.eval("return document.querySelector('#summary').innerText;");
    assert!(s(&summary).contains("follower"), "the page says where its data comes from: {summary}");
    b.goto(&format!("http://{}/#/group", c.nodes[follower].http));
    let members = b.wait_for(
        "the members",
        "return document.querySelectorAll('#members tr[data-node]').length === 3 && document.querySelector('#members').innerText;",
        POLLS,
        EVERY,
    );
    assert!(s(&members).contains("leader") && s(&members).contains("voter"), "{members}");
}
