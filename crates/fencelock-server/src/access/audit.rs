//! The audit log (`--audit-log FILE`): one JSON line per admin action,
//! auth-file change and refused call, with who, when, what and the outcome.
//!
//! Where it sits: [`crate::api::Ops`] records refused calls (unauthenticated,
//! denied, over a limit), the admin router records membership changes and
//! snapshots, and the auth file's watcher records reloads. A line is
//!
//! ```json
//! {"time":"2026-11-23T12:00:00.123Z","identity":"ops","verb":"admin",
//!  "action":"cluster.remove","object":"node 2","outcome":"ok","detail":"..."}
//! ```
//!
//! `identity` is `-` for a caller that is not authenticated (then `remote`
//! gives its address, when known). Lines are buffered and written out at least
//! every second, so a flood of refusals costs no write each; a crash loses at
//! most the last second's lines. The log is an account, not state: losing its
//! tail loses no lock. When the file would pass [`MAX_FILE_BYTES`] it is
//! renamed `FILE.1` (an older `.1` becomes `.2`, and so on, [`KEEP_FILES`]
//! kept), so the log takes at most `(KEEP_FILES + 1) × MAX_FILE_BYTES`.

use std::{
    fs::{File, OpenOptions},
    io::{BufWriter, Write},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use serde::Serialize;

/// Rotate the file when it would pass this size.
pub const MAX_FILE_BYTES: u64 = 64 * 1024 * 1024;
/// How many rotated files are kept.
pub const KEEP_FILES: usize = 4;

/// One audit line.
#[derive(Debug, Clone, Serialize)]
pub struct Event<'a> {
    pub identity: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remote: Option<String>,
    pub verb: &'a str,
    pub action: &'a str,
    pub object: &'a str,
    pub outcome: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    pub detail: &'a str,
}

#[derive(Serialize)]
struct Line<'a> {
    time: String,
    #[serde(flatten)]
    event: &'a Event<'a>,
}

/// The audit log of a node; [`Audit::off`] records nothing.
pub struct Audit {
    file: Option<Mutex<Writer>>,
}

struct Writer {
    path: PathBuf,
    out: BufWriter<File>,
    len: u64,
    max_bytes: u64,
}

impl Audit {
    pub fn off() -> Arc<Audit> {
        Arc::new(Audit { file: None })
    }

    /// Appends to `path` (created if missing, readable by its owner only).
    pub fn open(path: &Path) -> std::io::Result<Arc<Audit>> {
        Self::open_with(path, MAX_FILE_BYTES)
    }

    fn open_with(path: &Path, max_bytes: u64) -> std::io::Result<Arc<Audit>> {
        let (out, len) = open_file(path)?;
        let w = Writer { path: path.to_path_buf(), out: BufWriter::with_capacity(64 * 1024, out), len, max_bytes };
        Ok(Arc::new(Audit { file: Some(Mutex::new(w)) }))
    }

    /// Records `event` now. A failure to write is logged, never the caller's.
    #[allow(clippy::disallowed_methods)] // an audit line says when, on the wall clock
    pub fn record(&self, event: &Event<'_>) {
        let Some(file) = &self.file else { return };
        let line = Line { time: rfc3339(SystemTime::now()), event };
        let Ok(mut text) = serde_json::to_string(&line) else { return };
        text.push('\n');
        let mut w = file.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = w.append(text.as_bytes()) {
            tracing::error!(error = %e, path = %w.path.display(), "audit log not written");
        }
    }

    /// Writes out what is buffered.
    pub fn flush(&self) {
        if let Some(file) = &self.file {
            let mut w = file.lock().unwrap_or_else(|p| p.into_inner());
            if let Err(e) = w.out.flush() {
                tracing::error!(error = %e, path = %w.path.display(), "audit log not flushed");
            }
        }
    }

    /// Flushes every second until `stop`, and once more then.
    pub async fn run(self: Arc<Self>, mut stop: tokio::sync::watch::Receiver<bool>) {
        loop {
            tokio::select! {
                _ = stop.wait_for(|s| *s) => break,
                _ = tokio::time::sleep(Duration::from_secs(1)) => self.flush(),
            }
        }
        self.flush();
    }
}

impl Writer {
    fn append(&mut self, line: &[u8]) -> std::io::Result<()> {
        if self.len > 0 && self.len + line.len() as u64 > self.max_bytes {
            self.rotate()?;
        }
        self.out.write_all(line)?;
        self.len += line.len() as u64;
        Ok(())
    }

    fn rotate(&mut self) -> std::io::Result<()> {
        self.out.flush()?;
        for n in (1..KEEP_FILES).rev() {
            let from = rotated(&self.path, n);
            if from.exists() {
                std::fs::rename(&from, rotated(&self.path, n + 1))?;
            }
        }
        std::fs::rename(&self.path, rotated(&self.path, 1))?;
        let (file, len) = open_file(&self.path)?;
        self.out = BufWriter::with_capacity(64 * 1024, file);
        self.len = len;
        Ok(())
    }
}

fn rotated(path: &Path, n: usize) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(format!(".{n}"));
    PathBuf::from(p)
}

fn open_file(path: &Path) -> std::io::Result<(File, u64)> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = OpenOptions::new().create(true).append(true).mode(0o600).open(path)?;
    let len = f.metadata()?.len();
    Ok((f, len))
}

/// `t` as `YYYY-MM-DDTHH:MM:SS.mmmZ` (UTC).
fn rfc3339(t: SystemTime) -> String {
    let t = time::OffsetDateTime::from(t);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.millisecond()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(detail: &str) -> Event<'_> {
        Event {
            identity: "ops",
            remote: None,
            verb: "admin",
            action: "cluster.remove",
            object: "node 2",
            outcome: "ok",
            detail,
        }
    }

    #[test]
    fn each_event_is_one_json_line_with_its_time() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let a = Audit::open(&path).unwrap();
        a.record(&event("first"));
        a.record(&Event {
            identity: "-",
            remote: Some("10.0.0.9:5000".into()),
            outcome: "unauthenticated",
            ..event("")
        });
        a.flush();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["identity"], "ops");
        assert_eq!(lines[0]["detail"], "first");
        assert_eq!(lines[1]["remote"], "10.0.0.9:5000");
        assert!(lines[1].get("detail").is_none());
        let time = lines[0]["time"].as_str().unwrap();
        assert!(time.len() == 24 && time.ends_with('Z') && time.as_bytes()[10] == b'T', "{time}");
    }

    #[test]
    fn rotation_keeps_a_bounded_number_of_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let a = Audit::open_with(&path, 1000).unwrap();
        for i in 0..200 {
            a.record(&event(&format!("event {i}")));
        }
        a.flush();
        let mut files: Vec<String> =
            std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        files.sort();
        assert_eq!(files, ["audit.log", "audit.log.1", "audit.log.2", "audit.log.3", "audit.log.4"]);
        for f in &files {
            assert!(std::fs::metadata(dir.path().join(f)).unwrap().len() <= 1000, "{f}");
        }
        assert!(
            std::fs::read_to_string(&path).unwrap().contains("event 199"),
            "the newest line is in the current file"
        );
    }
}
