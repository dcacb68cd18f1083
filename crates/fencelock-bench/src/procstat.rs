//! What the kernel says about a process: CPU time and resident memory from
//! `/proc`, and a description of the machine.
//!
//! Where it sits: the workloads read an engine's CPU before and after a measured
//! run ([`cpu_time`]); W3 reads the native server's memory ([`rss_bytes`]), and
//! `catchup` each node's peak as well ([`peak_rss_bytes`], [`reset_peak`]).
//! CPU is counted over the whole process tree (PostgreSQL serves each
//! connection from a child of the postmaster): every live descendant's user +
//! system time, plus the time of children already reaped (`cutime`, `cstime`).

use std::{fs, path::Path, time::Duration};

use crate::model::Machine;

/// One process's line of `/proc/PID/stat`: its parent, its own CPU ticks
/// (utime + stime, fields 14–15) and those of its reaped children (cutime +
/// cstime, fields 16–17).
struct Stat {
    ppid: u32,
    own: u64,
    reaped: u64,
}

fn stat(pid: u32) -> Option<Stat> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces: split after it.
    let rest = &text[text.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state): field n is f[n - 3].
    let sum = |r: std::ops::Range<usize>| -> Option<u64> { f.get(r)?.iter().map(|v| v.parse::<u64>().ok()).sum() };
    Some(Stat { ppid: f.get(1)?.parse().ok()?, own: sum(11..13)?, reaped: sum(13..15)? })
}

fn ticks_to_time(ticks: u64) -> Duration {
    Duration::from_secs_f64(ticks as f64 / clock_ticks())
}

/// CPU time (user + system) of `pid` and all its descendants so far.
pub fn cpu_time(pid: u32) -> Option<Duration> {
    let all: Vec<(u32, u32, u64)> = fs::read_dir("/proc")
        .ok()?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|p| stat(p).map(|s| (p, s.ppid, s.own + s.reaped)))
        .collect();
    all.iter().find(|(p, _, _)| *p == pid)?;
    let mut tree = vec![pid];
    let mut i = 0;
    while i < tree.len() {
        let parent = tree[i];
        tree.extend(all.iter().filter(|(_, pp, _)| *pp == parent).map(|(p, _, _)| *p));
        i += 1;
    }
    let ticks: u64 = all.iter().filter(|(p, _, _)| tree.contains(p)).map(|(_, _, t)| t).sum();
    Some(ticks_to_time(ticks))
}

/// CPU time (user + system, all threads) of `pid` alone, its children not counted.
pub fn own_cpu_time(pid: u32) -> Option<Duration> {
    stat(pid).map(|s| ticks_to_time(s.own))
}

fn clock_ticks() -> f64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok().flatten().unwrap_or(100) as f64
}

/// Resident set size of `pid` (`VmRSS`), bytes.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    status_bytes(&fs::read_to_string(format!("/proc/{pid}/status")).ok()?, "VmRSS")
}

/// Peak resident set size of `pid` (`VmHWM`, the high-water mark), bytes:
/// since it started, or since [`reset_peak`].
pub fn peak_rss_bytes(pid: u32) -> Option<u64> {
    status_bytes(&fs::read_to_string(format!("/proc/{pid}/status")).ok()?, "VmHWM")
}

/// Lowers the peak resident set size of `pid` to its current one (writes 5
/// to `/proc/PID/clear_refs`, Linux 4.0 and later; the process must be ours),
/// so that [`peak_rss_bytes`] measures from now on.
pub fn reset_peak(pid: u32) -> std::io::Result<()> {
    fs::write(format!("/proc/{pid}/clear_refs"), "5")
}

/// A `NAME:   1234 kB` line of a `/proc/PID/status` text, in bytes.
fn status_bytes(status: &str, name: &str) -> Option<u64> {
    let value = status.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))?;
    let kb: u64 = value.trim().strip_suffix("kB")?.trim().parse().ok()?;
    Some(kb * 1024)
}

/// This machine, and the filesystem that holds `data_dir`.
pub fn machine(data_dir: &Path) -> Machine {
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| "unknown CPU".into());
    let mem_kb: f64 = fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0.0);
    Machine {
        cores: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        cpu,
        memory_gib: (mem_kb / 1024.0 / 1024.0 * 10.0).round() / 10.0,
        kernel: fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_string(),
        data_fs: fs_type(data_dir),
        rustc: command_line("rustc", &["--version"]).unwrap_or_else(|| "unknown".into()),
        commit: git_head(Path::new(".")).unwrap_or_else(|| "unknown".into()),
    }
}

/// The type and device of the mount holding `dir` (the longest mount point
/// that is a prefix of it), e.g. "ext4 on /dev/vda".
fn fs_type(dir: &Path) -> String {
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let mounts = fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    mounts
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 3 && dir.starts_with(f[1])).then(|| (f[1].len(), format!("{} on {}", f[2], f[0])))
        })
        .max_by_key(|(len, _)| *len)
        .map(|(_, s)| s)
        .unwrap_or_else(|| "unknown".into())
}

/// The first line a command prints, if it runs.
/// The commit checked out at `dir` (where the bench runs); `None` outside a
/// clone (git then fails, and its complaint is no commit).
fn git_head(dir: &Path) -> Option<String> {
    let out =
        std::process::Command::new("git").args(["rev-parse", "--short=12", "HEAD"]).current_dir(dir).output().ok()?;
    let head = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (out.status.success() && !head.is_empty()).then_some(head)
}

pub fn command_line(program: &str, args: &[&str]) -> Option<String> {
    let out = std::process::Command::new(program).args(args).output().ok()?;
    let text = String::from_utf8_lossy(if out.stdout.is_empty() { &out.stderr } else { &out.stdout }).to_string();
    text.lines().next().map(|l| l.trim().to_string()).filter(|l| !l.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run inside the clone names its commit; one outside names none
    /// (not git's complaint, as results run from /tmp once did).
    #[test]
    fn the_commit_is_git_s_or_none() {
        let head = git_head(Path::new(env!("CARGO_MANIFEST_DIR"))).expect("the tests run in a clone");
        assert!(head.len() == 12 && head.bytes().all(|b| b.is_ascii_hexdigit()), "{head:?}");
        let outside = tempfile::tempdir().unwrap();
        assert_eq!(git_head(outside.path()), None);
    }

    /// Our own process exists, has used some CPU after spinning, and has a resident size.
    #[test]
    fn reads_own_process() {
        let me = std::process::id();
        let before = cpu_time(me).unwrap();
        let mut x = 0u64;
        for i in 0..50_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        assert!(cpu_time(me).unwrap() > before, "spinning used no CPU");
        assert!(own_cpu_time(me).unwrap() <= cpu_time(me).unwrap());
        assert!(rss_bytes(me).unwrap() > 1024 * 1024);
        assert!(cpu_time(u32::MAX).is_none());
        assert!(peak_rss_bytes(me).unwrap() > 1024 * 1024);
        assert!(peak_rss_bytes(u32::MAX).is_none());
    }

    /// Fields of `/proc/PID/status` are read by their exact name, in kB.
    #[test]
    fn status_fields_in_bytes() {
        let text = "Name:\tfencelock-bench\nVmPeak:\t 9000 kB\nVmHWM:\t    2048 kB\nVmRSS:\t    1024 kB\nThreads:\t3\n";
        assert_eq!(status_bytes(text, "VmHWM"), Some(2048 * 1024));
        assert_eq!(status_bytes(text, "VmRSS"), Some(1024 * 1024));
        assert_eq!(status_bytes(text, "VmSwap"), None, "a missing field");
        assert_eq!(status_bytes(text, "Threads"), None, "not in kB");
        assert_eq!(status_bytes(text, "Vm"), None, "a prefix of a name is not a name");
    }

    /// A reset peak is no longer the process's past high-water mark.
    #[test]
    fn a_reset_peak_drops_to_the_current_size() {
        use std::alloc::{GlobalAlloc, Layout, System};
        let me = std::process::id();
        // From glibc's allocator, not the binary's (mimalloc keeps what is
        // freed a while): 64 MiB is a mapping of its own there, unmapped as it
        // is freed, so the process's size falls back below its peak.
        let layout = Layout::from_size_align(64 << 20, 4096).unwrap();
        // SAFETY: a non-zero layout; the block is written within its size and
        // freed once, with the layout it was allocated with.
        unsafe {
            let big = System.alloc(layout);
            assert!(!big.is_null(), "64 MiB from the system allocator");
            std::ptr::write_bytes(big, 1, layout.size());
            System.dealloc(big, layout);
        }
        let before = peak_rss_bytes(me).unwrap();
        if reset_peak(me).is_err() {
            return; // a kernel before 4.0, or /proc read-only: nothing to check
        }
        let after = peak_rss_bytes(me).unwrap();
        assert!(after < before, "peak {after} not below {before} after the reset");
    }
}
