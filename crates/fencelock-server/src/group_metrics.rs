//! The group's health in `/metrics`: this node's Raft term, last log and
//! applied indexes, whether it knows a leader, each follower's lag (on the
//! leader, the only node that knows it), and the data dir's sizes (database,
//! log segments, snapshots) and the free space of its filesystem. What the
//! alerting rules of `docs/alerts.yml` read (no leader, follower lag, disk
//! nearly full), and the dashboard's group view.
//!
//! Where it sits: rendered by the admin endpoint after [`crate::metrics`];
//! reads openraft's metrics and the data dir at each scrape (a handful of
//! files: the directory is not walked deeper than `wal/` and `snap/`).

use std::fmt::Write as _;
use std::path::Path;

use crate::raft::Raft;

/// Appends the group's families to `out`.
pub fn render(out: &mut String, raft: &Raft, data_dir: Option<&Path>) {
    let m = raft.metrics().borrow().clone();
    let gauges = [
        ("fencelock_raft_term", "The Raft term this node knows.", m.current_term),
        ("fencelock_raft_last_log_index", "The last index of this node's log.", m.last_log_index.unwrap_or(0)),
        ("fencelock_raft_applied_index", "The last index this node applied.", m.last_applied.map_or(0, |l| l.index)),
        ("fencelock_raft_has_leader", "1 if this node knows a leader of its term.", m.current_leader.is_some() as u64),
    ];
    for (name, help, v) in gauges {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
    }
    let name = "fencelock_follower_lag_entries";
    let _ = writeln!(
        out,
        "# HELP {name} Log entries the leader has that a member has not acknowledged (on the leader only; a member that has not answered since this leader was elected counts its whole log).\n# TYPE {name} gauge"
    );
    if let Some(replication) = &m.replication {
        let last = m.last_log_index.unwrap_or(0);
        for (id, matched) in replication.iter().filter(|(id, _)| **id != m.id) {
            let lag = last.saturating_sub(matched.map_or(0, |l| l.index));
            let _ = writeln!(out, "{name}{{node=\"{id}\"}} {lag}");
        }
    }
    if let Some(dir) = data_dir {
        render_disk(out, dir);
    }
}

/// The data dir's files by kind, and its filesystem's free space.
fn render_disk(out: &mut String, dir: &Path) {
    let parts = [
        ("database", file_size(&dir.join("fencelock.redb"))),
        ("log", dir_size(&dir.join("wal"))),
        ("snapshots", dir_size(&dir.join("snap"))),
    ];
    let name = "fencelock_data_dir_bytes";
    let _ = writeln!(out, "# HELP {name} Bytes of the data dir, by part.\n# TYPE {name} gauge");
    for (part, bytes) in parts {
        let _ = writeln!(out, "{name}{{part=\"{part}\"}} {bytes}");
    }
    if let Ok(fs) = nix::sys::statvfs::statvfs(dir) {
        let (avail, size) = (fs.blocks_available() * fs.fragment_size(), fs.blocks() * fs.fragment_size());
        let _ = writeln!(
            out,
            "# HELP fencelock_data_dir_available_bytes Free bytes (for this user) on the data dir's filesystem.\n\
             # TYPE fencelock_data_dir_available_bytes gauge\nfencelock_data_dir_available_bytes {avail}\n\
             # HELP fencelock_data_dir_filesystem_bytes Size of the data dir's filesystem.\n\
             # TYPE fencelock_data_dir_filesystem_bytes gauge\nfencelock_data_dir_filesystem_bytes {size}"
        );
    }
}

fn file_size(p: &Path) -> u64 {
    std::fs::metadata(p).map_or(0, |m| m.len())
}

/// The total size of the regular files directly in `dir` (0 if none).
fn dir_size(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries.filter_map(Result::ok).filter_map(|e| e.metadata().ok()).filter(|m| m.is_file()).map(|m| m.len()).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rule: the data dir's parts are measured where the node keeps them
    /// (the database, `wal/`, `snap/`), and the filesystem's free space is
    /// reported.
    #[test]
    fn the_data_dir_is_measured_by_part() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("fencelock.redb"), [0u8; 100]).unwrap();
        std::fs::create_dir(dir.path().join("wal")).unwrap();
        std::fs::write(dir.path().join("wal/00000001.seg"), [0u8; 30]).unwrap();
        std::fs::write(dir.path().join("wal/00000002.seg"), [0u8; 12]).unwrap();
        let mut out = String::new();
        render_disk(&mut out, dir.path());
        assert!(out.contains("fencelock_data_dir_bytes{part=\"database\"} 100\n"), "{out}");
        assert!(out.contains("fencelock_data_dir_bytes{part=\"log\"} 42\n"), "{out}");
        assert!(out.contains("fencelock_data_dir_bytes{part=\"snapshots\"} 0\n"), "{out}");
        let avail = fencelock_http::prometheus::value(&out, "fencelock_data_dir_available_bytes");
        assert!(avail.is_some_and(|a| a > 0), "{out}");
    }
}
