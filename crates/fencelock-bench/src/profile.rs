//! `--profile-server DIR`: a CPU profile of the native server while a cell
//! runs, as folded stacks and a flamegraph SVG.
//!
//! Where it sits: after a profiled cell's counted runs (W1 at its largest
//! client count, W2), `main` runs the cell once more on each native
//! single-node engine (`fencelock`, `fencelock/shared`) with a [`Recording`]
//! around the measured window; that run's figures are not counted (perf's
//! sampling and unwinding cost the server CPU). `perf record` samples the
//! server's process (every thread) at [`FREQUENCY`] Hz with DWARF call graphs
//! (the release build has debug info but no frame pointers); `perf script`
//! turns the samples into text, `inferno` folds it (`DIR/NAME.folded`) and
//! draws it (`DIR/NAME.svg`). `perf` must be installed and allowed to attach
//! (root, or `kernel.perf_event_paranoid` ≤ 1).

use std::{
    fs::File,
    io::{BufReader, BufWriter},
    os::unix::process::ExitStatusExt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
};

use anyhow::{bail, Context};
use inferno::collapse::Collapse;
use nix::{
    sys::signal::{kill, Signal},
    unistd::Pid,
};

/// Samples per second per CPU: enough for a 5 s window, and little
/// enough that DWARF stacks (16 KiB each) stay a few tens of MB.
pub const FREQUENCY: u32 = 499;

/// Where and under what name a run's server profile goes.
#[derive(Debug, Clone)]
pub struct Target {
    pub dir: PathBuf,
    /// The file stem (see [`name`]).
    pub name: String,
    /// The flamegraph's title.
    pub title: String,
}

impl Target {
    /// Starts sampling `pid` (see [`Recording::start`]).
    pub fn start(&self, pid: u32) -> anyhow::Result<Recording> {
        Recording::start(pid, &self.dir, &self.name, &self.title)
    }
}

/// A `perf record` attached to one process; [`stop`](Self::stop) ends the
/// sampling, [`finish`](Self::finish) writes the folded stacks and the flamegraph.
pub struct Recording {
    perf: Child,
    /// `DIR/NAME`: `.perf.data`, `.folded` and `.svg` are made from it.
    stem: PathBuf,
    title: String,
}

impl Recording {
    /// Starts sampling `pid` into `dir/name.perf.data`.
    pub fn start(pid: u32, dir: &Path, name: &str, title: &str) -> anyhow::Result<Recording> {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        let stem = dir.join(name);
        let perf = Command::new("perf")
            .args(["record", "-q", "-F", &FREQUENCY.to_string(), "--call-graph", "dwarf,16384"])
            .args(["-p", &pid.to_string(), "-o"])
            .arg(stem.with_extension("perf.data"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .context("start perf record (is perf installed?)")?;
        Ok(Recording { perf, stem, title: title.to_string() })
    }

    /// Stops sampling (SIGINT, as perf expects: it then writes its file).
    pub fn stop(&self) -> anyhow::Result<()> {
        kill(Pid::from_raw(self.perf.id() as i32), Signal::SIGINT).context("signal perf record")
    }

    /// Waits for perf to write its samples, folds them and draws them: the
    /// SVG's path. Call after [`stop`](Self::stop).
    pub fn finish(mut self) -> anyhow::Result<PathBuf> {
        let status = self.perf.wait()?;
        // After SIGINT perf writes its file and ends by that signal (or exits
        // 0 or 130, depending on the version).
        let interrupted = status.signal() == Some(Signal::SIGINT as i32) || status.code() == Some(130);
        if !(status.success() || interrupted) {
            bail!("perf record failed ({status})");
        }
        let data = self.stem.with_extension("perf.data");
        let script = self.stem.with_extension("perf.txt");
        let out = Command::new("perf")
            .args(["script", "--no-inline", "-i"])
            .arg(&data)
            .stdout(File::create(&script)?)
            .stderr(Stdio::null())
            .status()
            .context("run perf script")?;
        if !out.success() {
            bail!("perf script -i {} failed ({out})", data.display());
        }
        let folded = self.stem.with_extension("folded");
        fold(&script, &folded)?;
        let svg = self.stem.with_extension("svg");
        draw(&folded, &svg, &self.title)?;
        // The raw files are large and machine-specific; the folded stacks keep what they say.
        let _ = std::fs::remove_file(&script);
        let _ = std::fs::remove_file(&data);
        Ok(svg)
    }
}

/// A recording dropped before it finished (its run failed, or `stop` could
/// not signal perf) ends perf, so no `perf record` outlives the bench.
impl Drop for Recording {
    fn drop(&mut self) {
        if matches!(self.perf.try_wait(), Ok(None)) {
            let _ = self.perf.kill();
            let _ = self.perf.wait();
        }
    }
}

/// `perf script` text → folded stacks (`comm;outer;…;inner weight` per line,
/// the weight the summed periods of the samples: CPU nanoseconds).
fn fold(script: &Path, folded: &Path) -> anyhow::Result<()> {
    let mut options = inferno::collapse::perf::Options::default();
    options.nthreads = 1;
    let mut folder = inferno::collapse::perf::Folder::from(options);
    let reader = BufReader::new(File::open(script)?);
    folder.collapse(reader, BufWriter::new(File::create(folded)?)).context("fold perf script output")?;
    Ok(())
}

/// Folded stacks → a flamegraph SVG titled `title`.
fn draw(folded: &Path, svg: &Path, title: &str) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(folded)?;
    if text.trim().is_empty() {
        bail!("no samples in {} (did perf attach to the server?)", folded.display());
    }
    let mut options = inferno::flamegraph::Options::default();
    options.title = title.to_string();
    let writer = BufWriter::new(File::create(svg)?);
    inferno::flamegraph::from_lines(&mut options, text.lines(), writer).context("draw the flamegraph")?;
    Ok(())
}

/// A file name for a profiled cell: `w1-64-fencelock`, `w2-16-fencelock-shared`.
pub fn name(workload: &str, clients: usize, engine: &str) -> String {
    let engine: String = engine.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '-' }).collect();
    format!("{}-{clients}-{engine}", workload.to_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// perf's text, folded: a sample's stack is written outermost first under
    /// its command, and equal stacks add up, each sample weighing its period
    /// (nanoseconds of CPU for perf's cpu-clock event).
    #[test]
    fn folds_perf_script_stacks() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("s.txt");
        let sample = |inner: &str| {
            format!(
                "fencelock-bench 10/11 [000] 1.000000: 2004008 cpu-clock:ppp: \n\
                 \t 1000 {inner}+0x10 (/bin/x)\n\t 2000 outer+0x20 (/bin/x)\n\n"
            )
        };
        std::fs::write(&script, [sample("leaf_a"), sample("leaf_a"), sample("leaf_b")].concat()).unwrap();
        let folded = dir.path().join("s.folded");
        fold(&script, &folded).unwrap();
        let mut lines: Vec<String> = std::fs::read_to_string(&folded).unwrap().lines().map(String::from).collect();
        lines.sort();
        assert_eq!(lines, vec!["fencelock-bench;outer;leaf_a 4008016", "fencelock-bench;outer;leaf_b 2004008"]);
        let svg = dir.path().join("s.svg");
        draw(&folded, &svg, "t").unwrap();
        assert!(std::fs::read_to_string(&svg).unwrap().contains("leaf_a"));
    }

    /// Names are safe file names, one per (workload, clients, engine).
    #[test]
    fn names_are_file_names() {
        assert_eq!(name("W1", 64, "fencelock/shared"), "w1-64-fencelock-shared");
        assert_eq!(name("W2", 16, "fencelock"), "w2-16-fencelock");
    }
}
