//! Issue 37 §3: the getting-started guide (`docs/guide/getting-started.md`)
//! runs as written, against a fresh `fencelock serve` of the binary under
//! test, on free ports.
//!
//! The guide's conventions, stated in an HTML comment at its top: the
//! commands are the lines of its `console` blocks that start with `$ ` (a
//! line ending in `\` goes on on the next), run in order in one bash in an
//! empty directory; each must exit 0 or the status its comment names
//! (`# exits 73`); one that ends with `&` runs in the background. The lines
//! under a command are what it prints: each must be one of its output lines,
//! in order, where a number of four digits or more or with a point in it
//! (ids, tokens, times, revisions) stands for any number, `…` for any text
//! and a run of spaces for any run of spaces ([`matches`]). The ports
//! 7070–7072 move to free ones, in the text and in the defaults
//! (`FENCELOCK_LISTEN`, …). Beyond the shown lines, the tokens the guide
//! promises to grow do.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::{bin, free_port};

const GUIDE: &str = include_str!("../../../../docs/guide/getting-started.md");

/// One command of the guide and the lines it shows under it.
#[derive(Debug)]
struct Step {
    command: String,
    shown: Vec<String>,
    status: i32,
}

/// The guide's commands, in order.
fn steps(doc: &str) -> Vec<Step> {
    let mut out: Vec<Step> = Vec::new();
    for block in doc.split("```console\n").skip(1) {
        let block = block.split("```").next().unwrap_or("");
        let mut lines = block.lines();
        while let Some(line) = lines.next() {
            if let Some(first) = line.strip_prefix("$ ") {
                let mut command = first.to_string();
                while command.ends_with('\\') {
                    let Some(next) = lines.next() else { break };
                    command.push('\n');
                    command.push_str(next);
                }
                let status = command
                    .split("# exits ")
                    .nth(1)
                    .map(|rest| rest.split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap())
                    .unwrap_or(0);
                out.push(Step { command, shown: Vec::new(), status });
            } else if !line.trim().is_empty() {
                out.last_mut().expect("a console block starts with a command").shown.push(line.to_string());
            }
        }
    }
    out
}

/// Does `line` (trimmed) match the shown `pattern` (trimmed): a number of
/// four digits or more, or with a point in it (an id, a token, a time, a
/// revision), stands for any number; `…` for any text; a run of spaces for
/// any run of spaces; everything else, shorter numbers included (an HTTP
/// status, a size), is itself.
fn matches(pattern: &str, line: &str) -> bool {
    fn go(p: &[char], l: &[char]) -> bool {
        match p.first() {
            None => l.is_empty(),
            Some('…') => (0..=l.len()).any(|i| go(&p[1..], &l[i..])),
            Some(c) if c.is_ascii_digit() && varies(&p[..number(p)]) => {
                let (pn, ln) = (number(p), number(l));
                ln > 0 && go(&p[pn..], &l[ln..])
            }
            Some(' ') => {
                let (ps, ls) = (spaces(p), spaces(l));
                ls > 0 && go(&p[ps..], &l[ls..])
            }
            Some(c) => l.first() == Some(c) && go(&p[1..], &l[1..]),
        }
    }
    /// The length of the number at the start of `s`: digits, and more digits
    /// after each point (`4.9`, `16.1`, `127.0.0.1`).
    fn number(s: &[char]) -> usize {
        let mut n = s.iter().take_while(|c| c.is_ascii_digit()).count();
        while n > 0 && s.get(n) == Some(&'.') && s.get(n + 1).is_some_and(char::is_ascii_digit) {
            n += 1 + s[n + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
        }
        n
    }
    fn varies(number: &[char]) -> bool {
        number.contains(&'.') || number.len() >= 4
    }
    fn spaces(s: &[char]) -> usize {
        s.iter().take_while(|c| **c == ' ').count()
    }
    let (p, l): (Vec<char>, Vec<char>) = (pattern.trim().chars().collect(), line.trim().chars().collect());
    go(&p, &l)
}

#[test]
fn the_pattern_rules() {
    let shown = "nightly-report   -   host-a   8250150434838619450  3856733623667392513   4.9s   0  -";
    assert!(matches(shown, "nightly-report  -  host-a  17  38567342722074  5.0s        0  -"));
    assert!(!matches(shown, "nightly-report  -  host-b  17  38567342722074  5.0s        0  -"));
    assert!(matches(
        "acquired \"x\": token 1234 lease … (expires in 5s)",
        "acquired \"x\": token 9 lease 7 (expires in 5s)"
    ));
    assert!(!matches("exit 73", "exit 73 and more"));
    assert!(matches("{\"token\":3856733623667392516} (HTTP 409)", "{\"token\":17} (HTTP 409)"));
    assert!(!matches("{\"token\":3856733623667392516} (HTTP 409)", "{\"token\":17} (HTTP 408)"));
    assert!(matches("16.1 granted orders", "9.0 granted orders"));
    assert!(!matches("\"size\":19", "\"size\":20"));
    let got = steps("x\n```console\n$ a \\\n  b    # exits 73\nshown\n$ c &\n```\n```sh\n$ not run\n```\n");
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!((got[0].command.as_str(), got[0].status), ("a \\\n  b    # exits 73", 73));
    assert_eq!((got[0].shown.as_slice(), got[1].status), (&["shown".to_string()][..], 0));
}

#[test]
fn the_getting_started_guide_runs_as_written() {
    let dir = tempfile::tempdir().unwrap();
    let ports: Vec<String> = (0..3).map(|_| free_port().to_string()).collect();
    let doc = GUIDE.replace("7070", &ports[0]).replace("7071", &ports[1]).replace("7072", &ports[2]);
    let steps = steps(&doc);
    assert!(steps.len() >= 10, "{steps:#?}");
    assert!(steps[0].command.starts_with("fencelock serve"), "the guide starts a node first: {steps:#?}");
    // One bash: each command's output in a file of its own (a background
    // command's keeps going there), its status in another; the first
    // command that ends otherwise than the guide says stops the script.
    let mut script = String::new();
    for (n, step) in steps.iter().enumerate() {
        script.push_str(&format!(
            "{{ {}\n}} >out.{n} 2>&1\nrc=$?; echo $rc >rc.{n}; [ $rc = {} ] || exit 3\n",
            step.command, step.status
        ));
    }
    let bin_dir = Path::new(bin()).parent().unwrap();
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default());
    let mut cmd = Command::new("bash");
    cmd.arg("-c").arg(&script).current_dir(dir.path());
    for (key, _) in std::env::vars().filter(|(k, _)| k.starts_with("FENCELOCK_")) {
        cmd.env_remove(key);
    }
    let mut child = cmd
        .env("PATH", path)
        .env("FENCELOCK_LISTEN", format!("127.0.0.1:{}", ports[0]))
        .env("FENCELOCK_HTTP", format!("127.0.0.1:{}", ports[1]))
        .env("FENCELOCK_SERVER", format!("http://127.0.0.1:{}", ports[0]))
        .env("FENCELOCK_ADMIN", format!("127.0.0.1:{}", ports[1]))
        .env("FENCELOCK_STORAGE_LISTEN", format!("127.0.0.1:{}", ports[2]))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("bash");
    let group = format!("-{}", child.id());
    let kill_group = || Command::new("kill").args(["-KILL", "--", &group]).stderr(Stdio::null()).status();
    // The guide's bound: 60 s in steps of 50 ms (it takes about 10 s).
    let mut timed_out = true;
    for _ in 0..1200 {
        if child.try_wait().unwrap().is_some() {
            timed_out = false;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // Whatever the guide left running (its `kill` may not have come).
    let _ = kill_group();
    let out = child.wait_with_output().unwrap();
    let read = |name: String| std::fs::read_to_string(dir.path().join(name)).ok();
    let report = |n: usize| {
        format!(
            "command {n}: {}\n--- its output:\n{}\n--- the node's output:\n{}\n--- bash: {}\n{}",
            steps[n].command,
            read(format!("out.{n}")).unwrap_or_default(),
            read("out.0".into()).unwrap_or_default(),
            out.status,
            String::from_utf8_lossy(&out.stderr),
        )
    };
    let ran = (0..steps.len()).take_while(|n| read(format!("rc.{n}")).is_some()).count();
    assert!(!timed_out, "the guide ran over 60 s, in {}", report(ran.min(steps.len() - 1)));
    for (n, step) in steps.iter().enumerate() {
        let status = read(format!("rc.{n}")).unwrap_or_else(|| panic!("never ran: {}", report(n)));
        assert_eq!(status.trim(), step.status.to_string(), "the exit status of {}", report(n));
    }
    assert!(out.status.success(), "{}", report(steps.len() - 1));
    // What each command printed: the lines the guide shows, in order.
    for (n, step) in steps.iter().enumerate() {
        let printed = read(format!("out.{n}")).unwrap_or_default();
        let mut lines = printed.lines();
        for shown in &step.shown {
            assert!(lines.any(|line| matches(shown, line)), "the guide shows {shown:?} (in order) from {}", report(n));
        }
    }
    // What the guide says of the tokens: the run that waited out host-a's
    // lease got a larger one than host-a's, and so did client 2 than client 1.
    let token = |command: &str, after: &str| -> u64 {
        let n = steps.iter().position(|s| s.command.starts_with(command)).unwrap_or_else(|| panic!("{command}"));
        let printed = read(format!("out.{n}")).unwrap_or_default();
        let digits: String = printed
            .split(after)
            .nth(1)
            .unwrap_or_else(|| panic!("no {after:?} in {}", report(n)))
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().unwrap_or_else(|_| panic!("a token after {after:?} in {}", report(n)))
    };
    let (host_a, waited) = (
        token("fencelock acquire nightly-report", "token "),
        token("fencelock run nightly-report --wait", "running under token "),
    );
    assert!(waited > host_a, "the waiting run's token {waited} is above host-a's {host_a}");
    let (client_1, client_2) =
        (token("fencelock acquire orders", "token "), token("fencelock run orders", "\"token\":"));
    assert!(client_2 > client_1, "client 2's token {client_2} is above client 1's {client_1}");
}
