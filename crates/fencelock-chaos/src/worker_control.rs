//! The worker processes as the harness sees them: spawn, send a control line,
//! wait for a report line, stop.
//!
//! Where it sits: the harness's side of the workers; what a worker process
//! runs is `worker_process` (or, for the `fencelock-py` backend, the Python
//! worker `python/worker.py`, which speaks the same protocol), whose
//! arguments ([`WorkerArgs`]) this passes on.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};
use tokio::sync::mpsc;

use crate::procs::self_exe;
use crate::worker_process::WorkerArgs;

/// The Python worker: a process that uses only the fencelock Python package
/// (issue 35), embedded so that the harness needs no source tree to run it.
const PYTHON_WORKER: &str = include_str!("../python/worker.py");

/// What a worker process runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Program {
    /// `fencelock-chaos worker`: the Rust client.
    Native,
    /// `<interpreter> worker.py`: the Python package on that interpreter.
    Python(PathBuf),
}

impl Program {
    /// Makes ready what the workers need in `dir` (the Python worker's script)
    /// and checks that they can start: the interpreter imports `fencelock`.
    /// The executable and its first arguments.
    fn prepare(&self, dir: &Path) -> anyhow::Result<(PathBuf, Vec<String>)> {
        match self {
            Program::Native => Ok((self_exe()?, vec!["worker".into()])),
            Program::Python(python) => {
                let script = dir.join("worker.py");
                std::fs::write(&script, PYTHON_WORKER).with_context(|| format!("write {}", script.display()))?;
                let probe = Command::new(python)
                    .args(["-c", "import fencelock"])
                    .output()
                    .with_context(|| format!("run {} (the Python workers' interpreter, --python)", python.display()))?;
                if !probe.status.success() {
                    bail!(
                        "{} cannot import the fencelock package (install it: pip install ./python, or pass \
                         --python with a virtual environment's python): {}",
                        python.display(),
                        String::from_utf8_lossy(&probe.stderr).trim()
                    );
                }
                Ok((python.clone(), vec![script.display().to_string()]))
            }
        }
    }
}

struct Proc {
    child: Child,
    stdin: Option<ChildStdin>,
}

/// Every worker of a run.
pub struct Workers {
    procs: Vec<Proc>,
    lines: mpsc::UnboundedReceiver<(usize, String)>,
}

impl Workers {
    /// Starts one worker of `program` per argument set (stderr to `log`;
    /// worker `i` gets the extra environment `envs[i]`, if any) and waits
    /// until each says `ready`.
    pub async fn start(
        program: &Program,
        args: Vec<WorkerArgs>,
        envs: &[Vec<(String, String)>],
        log: &Path,
    ) -> anyhow::Result<Workers> {
        let (tx, lines) = mpsc::unbounded_channel();
        let mut procs = Vec::new();
        let (exe, first) = program.prepare(log.parent().unwrap_or(Path::new(".")))?;
        for (i, a) in args.into_iter().enumerate() {
            let err = std::fs::File::options().create(true).append(true).open(log)?;
            let mut child = Command::new(&exe)
                .args(&first)
                .args(worker_argv(&a))
                .envs(envs.get(i).cloned().unwrap_or_default())
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(err)
                .spawn()
                .context("start a worker")?;
            let out = BufReader::new(child.stdout.take().expect("piped stdout"));
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in out.lines().map_while(Result::ok) {
                    if tx.send((i, line)).is_err() {
                        return;
                    }
                }
            });
            let stdin = child.stdin.take();
            procs.push(Proc { child, stdin });
        }
        let mut w = Workers { procs, lines };
        let mut ready = vec![false; w.len()];
        let deadline = tokio::time::Instant::now() + Duration::from_secs(40);
        while ready.iter().any(|r| !r) {
            match tokio::time::timeout_at(deadline, w.lines.recv()).await {
                Ok(Some((i, line))) if line == "ready" => ready[i] = true,
                Ok(Some(_)) => {}
                _ => bail!("workers {:?} did not start; see {}", unready(&ready), log.display()),
            }
        }
        Ok(w)
    }

    pub fn len(&self) -> usize {
        self.procs.len()
    }

    pub fn pid(&self, i: usize) -> u32 {
        self.procs[i].child.id()
    }

    /// Sends one control line to worker `i`.
    pub fn send(&mut self, i: usize, line: &str) {
        if let Some(stdin) = self.procs[i].stdin.as_mut() {
            let _ = writeln!(stdin, "{line}");
            let _ = stdin.flush();
        }
    }

    /// Waits up to `within` for worker `i` to print a line starting with
    /// `prefix`, and returns it; other lines are dropped.
    pub async fn wait_line(&mut self, i: usize, prefix: &str, within: Duration) -> Option<String> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            match tokio::time::timeout_at(deadline, self.lines.recv()).await {
                Ok(Some((w, line))) if w == i && line.starts_with(prefix) => return Some(line),
                Ok(Some(_)) => continue,
                _ => return None,
            }
        }
    }

    /// Tells every worker to stop after its cycle and waits up to `within`;
    /// any still running is killed. Returns how many had to be killed.
    pub async fn stop(&mut self, within: Duration) -> usize {
        for i in 0..self.len() {
            crate::procs::signal(self.pid(i), nix::sys::signal::Signal::SIGCONT);
            self.send(i, "stop");
        }
        let deadline = tokio::time::Instant::now() + within;
        let mut killed = 0;
        for p in &mut self.procs {
            loop {
                if p.child.try_wait().ok().flatten().is_some() {
                    break;
                }
                if tokio::time::Instant::now() > deadline {
                    let _ = p.child.kill();
                    let _ = p.child.wait();
                    killed += 1;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        killed
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for p in &mut self.procs {
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
    }
}

fn unready(ready: &[bool]) -> Vec<usize> {
    ready.iter().enumerate().filter(|(_, r)| !**r).map(|(i, _)| i).collect()
}

/// A worker's arguments (after the program's own first ones).
fn worker_argv(a: &WorkerArgs) -> Vec<String> {
    let mut argv = vec![
        "--id".into(),
        a.id.to_string(),
        "--lock-url".into(),
        a.lock_url.clone(),
        "--storage".into(),
        a.storage.to_string(),
        "--lock".into(),
        a.lock.clone(),
        "--key".into(),
        a.key.clone(),
        "--ttl-ms".into(),
        a.ttl_ms.to_string(),
        "--wait-ms".into(),
        a.wait_ms.to_string(),
        "--history".into(),
        a.history.display().to_string(),
        "--hold-ms".into(),
        a.hold_ms.to_string(),
    ];
    if a.election {
        argv.push("--election".into());
    }
    if a.shared {
        argv.push("--shared".into());
    }
    if a.permits > 0 {
        argv.extend(["--permits".into(), a.permits.to_string()]);
    }
    if a.multi > 0 {
        argv.extend(["--multi".into(), a.multi.to_string()]);
    }
    if a.unfenced_reads {
        argv.push("--unfenced-reads".into());
    }
    if a.multi_one_by_one {
        argv.push("--multi-one-by-one".into());
    }
    argv.extend(["--seed".into(), a.seed.to_string()]);
    argv
}
