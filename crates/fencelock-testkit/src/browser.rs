//! A headless browser for the tests of a web page (the dashboard's): Debian's
//! Chromium driven through Debian's ChromeDriver, over the W3C WebDriver HTTP
//! protocol spoken with [`fencelock_http::blocking`] (no WebDriver crate).
//!
//! Where it sits: beside the testkit's servers. Like them it runs a Debian
//! binary (`chromedriver`, which starts `/usr/bin/chromium`) on a free port of
//! 127.0.0.1 with its files (the browser's profile, the driver's log) in a
//! temporary directory, waits for it by a count of polls (no clock is read),
//! and kills it on drop; a missing binary fails the test with a message naming
//! `scripts/install-test-deps.sh`. Everything here panics on failure, with
//! the driver's message and its log: this is test code.
//!
//! The browser is headless, without sandbox or GPU, and its viewport (what a
//! page sees as `window.innerWidth`/`innerHeight`, and what
//! [`Browser::screenshot`] shoots) is 1280×800 unless
//! [`Browser::set_window_size`] says otherwise.

use std::fs::{self, File};
use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::Duration;

use fencelock_http::blocking;
use fencelock_http::Request;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use serde_json::{json, Value};

use crate::{free_port, log_tail, wait_ready, which};

/// The browser ChromeDriver starts (Debian's launcher script).
const CHROMIUM: &str = "/usr/bin/chromium";

const HINT: &str = "run scripts/install-test-deps.sh (it installs chromium and chromium-driver)";

/// How long one WebDriver request may wait for each read and write (a busy
/// 2-core machine starts a browser slowly).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The viewport a fresh browser has.
const VIEWPORT: (u32, u32) = (1280, 800);

/// How much of the page's text a failed [`Browser::wait_for`] shows.
const PAGE_TEXT_CHARS: usize = 2000;

/// A headless Chromium with one WebDriver session, killed (with its driver)
/// on drop.
pub struct Browser {
    child: Child,
    addr: SocketAddr,
    /// None until the session is created (and again once deleted on drop).
    session: Option<String>,
    /// The driver's (and the browser's) stdout and stderr.
    log: std::path::PathBuf,
    /// The browser's profile and the log; removed after the processes end.
    dir: tempfile::TempDir,
}

impl Browser {
    /// Starts `chromedriver` on a free port, waits until its `/status` says
    /// it is ready, and opens a session of a headless Chromium with a fresh
    /// profile and a 1280×800 viewport.
    pub fn start() -> Self {
        Self::launch(false)
    }

    /// [`Browser::start`], taking any server certificate (W3C
    /// `acceptInsecureCerts`): for a page served over TLS with a test CA the
    /// browser does not know. The connection is still TLS.
    pub fn start_accepting_any_certificate() -> Self {
        Self::launch(true)
    }

    fn launch(accept_insecure_certs: bool) -> Self {
        let driver = which("chromedriver").unwrap_or_else(|| panic!("chromedriver not found: {HINT}"));
        assert!(Path::new(CHROMIUM).is_file(), "{CHROMIUM} not found: {HINT}");
        let dir = tempfile::tempdir().expect("create temp dir");
        let log = dir.path().join("chromedriver.log");
        let out = File::create(&log).expect("create chromedriver.log");
        let port = free_port();
        // Its own process group, which the browser's processes join: drop
        // kills the group, so no browser outlives a test that panicked.
        let child = Command::new(driver)
            .arg(format!("--port={port}"))
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("clone log file"))
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start chromedriver ({e}): {HINT}"));
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        // From here on, a panic drops `browser`, which kills the driver.
        let mut browser = Browser { child, addr, session: None, log, dir };
        let log = browser.log.clone();
        wait_ready("chromedriver", &mut browser.child, &log, || driver_ready(addr).unwrap_or(false));
        let profile = browser.dir.path().join("profile");
        let (w, h) = VIEWPORT;
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "acceptInsecureCerts": accept_insecure_certs,
            "goog:loggingPrefs": {"browser": "ALL"},
            // Below REQUEST_TIMEOUT, so that the driver answers with its own
            // error before the request gives up.
            "timeouts": {"pageLoad": 25_000, "script": 25_000},
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": [
                    "--headless=new",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-dev-shm-usage",
                    format!("--window-size={w},{h}"),
                    "--hide-scrollbars",
                    format!("--user-data-dir={}", profile.display()),
                ],
            },
        }}});
        let created = browser.command("POST", "/session", Some(caps));
        let id = created["sessionId"].as_str().unwrap_or_else(|| panic!("no sessionId in {created}"));
        browser.session = Some(id.to_string());
        browser.set_window_size(w, h);
        browser
    }

    /// Opens `url` and waits until the page has loaded.
    pub fn goto(&self, url: &str) {
        self.session_command("POST", "url", Some(json!({ "url": url })));
    }

    /// Runs `js` as the body of a function in the page (the caller writes
    /// `return ...;`) and gives what it returns, as JSON.
    pub fn eval(&self, js: &str) -> Value {
        self.try_eval(js).unwrap_or_else(|e| panic!("eval of {js:?} failed: {e}"))
    }

    /// Polls [`eval`](Self::eval) of `js` up to `polls` times, `every` apart,
    /// until it gives a truthy value (neither null, false, 0 nor ""), and
    /// gives that value. A script that throws is not yet ready (the element
    /// it reads may not be there yet). Running out of polls fails with `what`,
    /// the last value (or error) and the start of the page's text.
    pub fn wait_for(&self, what: &str, js: &str, polls: u32, every: Duration) -> Value {
        let mut last = Err("never polled".to_string());
        for poll in 0..polls {
            if poll > 0 {
                sleep(every);
            }
            last = self.try_eval(js);
            if let Ok(value) = &last {
                if truthy(value) {
                    return value.clone();
                }
            }
        }
        let last = match last {
            Ok(value) => value.to_string(),
            Err(e) => format!("error: {e}"),
        };
        let text = match self.try_eval("return document.body ? document.body.innerText : null;") {
            Ok(Value::String(s)) => {
                let mut head: String = s.chars().take(PAGE_TEXT_CHARS).collect();
                if head.len() < s.len() {
                    head.push_str("\n[…]");
                }
                head
            }
            Ok(other) => format!("({other})"),
            Err(e) => format!("(cannot read it: {e})"),
        };
        panic!("waited in vain for {what} ({polls} polls, {every:?} apart): {js:?} last gave {last}; the page's text:\n{text}");
    }

    /// Shoots the viewport and writes it to `path` as PNG.
    pub fn screenshot(&self, path: &Path) {
        let value = self.session_command("GET", "screenshot", None);
        let text = value.as_str().unwrap_or_else(|| {
            let shown: String = value.to_string().chars().take(200).collect();
            panic!("a screenshot that is not a string: {shown}")
        });
        let png = base64_decode(text).unwrap_or_else(|e| panic!("a screenshot that is not base64: {e}"));
        fs::write(path, png).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
    }

    /// Makes the page see `prefers-color-scheme: dark` (or `light`), through
    /// ChromeDriver's passthrough to the DevTools protocol.
    pub fn set_color_scheme(&self, dark: bool) {
        let value = if dark { "dark" } else { "light" };
        let params = json!({"features": [{"name": "prefers-color-scheme", "value": value}]});
        self.session_command(
            "POST",
            "goog/cdp/execute",
            Some(json!({"cmd": "Emulation.setEmulatedMedia", "params": params})),
        );
    }

    /// Makes the viewport `w`×`h` CSS pixels. The window's rect includes
    /// the browser's (invisible) top bar, even headless, so the window is set,
    /// the viewport measured, and the window grown by the difference once.
    pub fn set_window_size(&self, w: u32, h: u32) {
        let set = |w: i64, h: i64| self.session_command("POST", "window/rect", Some(json!({"width": w, "height": h})));
        let viewport = || {
            let v = self.eval("return [window.innerWidth, window.innerHeight];");
            (v[0].as_i64().unwrap_or(0), v[1].as_i64().unwrap_or(0))
        };
        let (w, h) = (i64::from(w), i64::from(h));
        set(w, h);
        let (iw, ih) = viewport();
        if (iw, ih) != (w, h) {
            set(2 * w - iw, 2 * h - ih);
            let got = viewport();
            assert_eq!(got, (w, h), "the viewport is {}×{} after resizing the window for {w}×{h}", got.0, got.1);
        }
    }

    /// The messages the browser's console logged at error level (`console.error`,
    /// uncaught exceptions, failed loads) since the last call (ChromeDriver
    /// hands each entry out once).
    pub fn console_errors(&self) -> Vec<String> {
        let entries = self.session_command("POST", "se/log", Some(json!({"type": "browser"})));
        entries
            .as_array()
            .map(|all| {
                all.iter()
                    .filter(|e| e["level"] == "SEVERE")
                    .map(|e| e["message"].as_str().unwrap_or_default().to_string())
                    .collect()
            })
            .unwrap_or_default()
    }

    fn try_eval(&self, js: &str) -> Result<Value, String> {
        self.call("POST", &self.session_path("execute/sync"), Some(json!({"script": js, "args": []})))
    }

    fn session_path(&self, suffix: &str) -> String {
        let id = self.session.as_deref().expect("a WebDriver session");
        format!("/session/{id}/{suffix}")
    }

    fn session_command(&self, method: &str, suffix: &str, body: Option<Value>) -> Value {
        self.command(method, &self.session_path(suffix), body)
    }

    /// [`call`](Self::call), failing the test with the driver's log on error.
    fn command(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        self.call(method, path, body)
            .unwrap_or_else(|e| panic!("chromedriver {method} {path}: {e}\nits log:\n{}", log_tail(&self.log)))
    }

    /// One WebDriver request: the answer's `value`, or the driver's error and
    /// message (its stack trace left out).
    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, String> {
        webdriver(self.addr, method, path, body)
    }
}

impl Drop for Browser {
    /// Deletes the session (the browser quits), then kills the driver's
    /// process group (anything of the browser that is left) and the driver.
    fn drop(&mut self) {
        if self.session.is_some() {
            let path = self.session_path("");
            let _ = self.call("DELETE", path.trim_end_matches('/'), None);
            self.session = None;
        }
        // The driver is not yet reaped, so its pid still names its group.
        let _ = killpg(Pid::from_raw(self.child.id() as i32), Signal::SIGKILL);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether the driver at `addr` says it is ready for a new session.
fn driver_ready(addr: SocketAddr) -> Result<bool, String> {
    Ok(webdriver(addr, "GET", "/status", None)?["ready"] == true)
}

fn webdriver(addr: SocketAddr, method: &str, path: &str, body: Option<Value>) -> Result<Value, String> {
    let body = body.map(|b| serde_json::to_vec(&b).expect("JSON")).unwrap_or_default();
    let headers = [("Content-Type", "application/json; charset=utf-8".to_string())];
    let req = Request { method, path, headers: &headers, body: &body };
    let answer = blocking::send(addr, req, REQUEST_TIMEOUT).map_err(|e| e.to_string())?;
    let json: Value = serde_json::from_slice(&answer.body)
        .map_err(|e| format!("HTTP {} with a body that is not JSON ({e}): {:.500}", answer.status, answer.text()))?;
    let value = json.get("value").cloned().unwrap_or(Value::Null);
    if answer.status == 200 {
        Ok(value)
    } else {
        Err(format!("HTTP {}: {}: {}", answer.status, value["error"], value["message"]))
    }
}

/// JavaScript's truthiness of a JSON value (NaN arrives as null).
fn truthy(value: &Value) -> bool {
    match value {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(_) | Value::Object(_) => true,
    }
}

/// Standard base64 (padding optional, white space ignored) to bytes.
fn base64_decode(text: &str) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    let (mut acc, mut bits) = (0u32, 0u32);
    for (i, c) in text.bytes().enumerate() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            b'=' => break,
            b' ' | b'\n' | b'\r' | b'\t' => continue,
            _ => return Err(format!("byte {c:#04x} at {i}")),
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpListener;

    use super::*;

    const PAGE: &str = r#"<!doctype html>
<html><head><title>fencelock browser test</title>
<style>
body { background: rgb(255, 255, 255); color: rgb(0, 0, 0); }
@media (prefers-color-scheme: dark) { body { background: rgb(0, 0, 0); color: rgb(255, 255, 255); } }
</style></head>
<body><p id="status">waiting</p>
<button onclick="setTimeout(() => { document.getElementById('status').textContent = 'clicked'; console.error('the button was clicked'); }, 50)">Go</button>
<canvas id="noise" width="640" height="400"></canvas>
<script>
// Noise, which PNG cannot compress: the screenshot is a big answer (MBs of base64).
const c = document.getElementById('noise').getContext('2d');
const img = c.createImageData(640, 400);
let x = 1;
for (let i = 0; i < img.data.length; i++) { x ^= x << 13; x ^= x >>> 17; x ^= x << 5; img.data[i] = i % 4 === 3 ? 255 : x >>> 24; }
c.putImageData(img, 0, 0);
</script>
</body></html>"#;

    /// Serves [`PAGE`] at `/` (and 404 elsewhere) on 127.0.0.1, one thread a
    /// connection (the browser may open one it sends nothing on), for the
    /// rest of the test process.
    fn serve_page() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut s) = stream else { continue };
                std::thread::spawn(move || {
                    let _ = s.set_read_timeout(Some(Duration::from_secs(30)));
                    let mut head = Vec::new();
                    let mut buf = [0u8; 4096];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match s.read(&mut buf) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    let (status, body) =
                        if head.starts_with(b"GET / ") { ("200 OK", PAGE) } else { ("404 Not Found", "not found") };
                    let answer = format!(
                        "HTTP/1.1 {status}\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = s.write_all(answer.as_bytes());
                });
            }
        });
        addr
    }

    /// Rule: the browser drives a real page as a user would see it: the page
    /// loads, a script reads it, a click changes it (waited for by polling),
    /// the emulated dark scheme reaches its CSS media queries, the console's
    /// errors are read, and a screenshot is a PNG of exactly the 1280×800
    /// viewport, read whole however big (the page's noise makes it about
    /// 800 KB, a megabyte of base64).
    #[test]
    fn the_browser_loads_clicks_darkens_and_shoots_the_1280x800_viewport() {
        let addr = serve_page();
        let browser = Browser::start();
        browser.goto(&format!("http://{addr}/"));
        assert_eq!(browser.eval("return document.title;"), "fencelock browser test");
        assert_eq!(browser.eval("return [window.innerWidth, window.innerHeight];"), json!([1280, 800]));

        assert_eq!(browser.eval("document.querySelector('button').click(); return true;"), true);
        let text = browser.wait_for(
            "the button's click to change the text",
            "const t = document.getElementById('status').textContent; return t === 'clicked' && t;",
            250,
            Duration::from_millis(20),
        );
        assert_eq!(text, "clicked");
        let errors = browser.console_errors();
        assert!(errors.iter().any(|e| e.contains("the button was clicked")), "{errors:?}");

        let background = "return getComputedStyle(document.body).backgroundColor;";
        assert_eq!(browser.eval(background), "rgb(255, 255, 255)");
        browser.set_color_scheme(true);
        assert_eq!(browser.eval("return matchMedia('(prefers-color-scheme: dark)').matches;"), true);
        assert_eq!(browser.eval(background), "rgb(0, 0, 0)");

        let dir = tempfile::tempdir().unwrap();
        let shot = dir.path().join("page.png");
        browser.screenshot(&shot);
        let png = fs::read(&shot).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
        assert_eq!(&png[12..16], b"IHDR", "the first chunk is not IHDR");
        let size =
            (u32::from_be_bytes(png[16..20].try_into().unwrap()), u32::from_be_bytes(png[20..24].try_into().unwrap()));
        assert_eq!(size, (1280, 800));
        assert!(png.len() > 500_000, "the noise should make a big screenshot, not {} bytes", png.len());
    }

    /// Rule: a wait that runs out names what it waited for, the last value,
    /// and the page's text.
    #[test]
    fn a_browser_wait_that_runs_out_says_what_and_shows_the_page() {
        let addr = serve_page();
        let browser = Browser::start();
        browser.goto(&format!("http://{addr}/"));
        let wait = || browser.wait_for("the impossible", "return 0;", 3, Duration::from_millis(10));
        let panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(wait)).unwrap_err();
        let message = panic.downcast_ref::<String>().expect("a formatted panic message");
        for part in ["waited in vain for the impossible", "last gave 0", "the page's text:\nwaiting\n\nGo"] {
            assert!(message.contains(part), "{part:?} not in {message:?}");
        }
    }

    /// Rule: base64 decodes with or without padding; a foreign byte is an error.
    #[test]
    fn browser_screenshots_decode_from_base64() {
        assert_eq!(base64_decode("aGVsbG8=").unwrap(), b"hello");
        assert_eq!(base64_decode("aGVsbG8").unwrap(), b"hello");
        assert_eq!(base64_decode("AAEC/w==").unwrap(), [0, 1, 2, 255]);
        assert_eq!(base64_decode("").unwrap(), b"");
        assert!(base64_decode("aGV*").is_err());
    }
}
