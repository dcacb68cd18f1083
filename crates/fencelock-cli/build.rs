//! The commit `fencelock --version` names: `FENCELOCK_COMMIT`, the first 12
//! hex digits of `git rev-parse HEAD` at build time, with `+dirty` when a
//! tracked file differs from it, or `unknown` where there is no git (a
//! source tarball, a machine without git).
//!
//! Reruns only when `HEAD` or the ref it points to moves (a commit, a
//! checkout), not on every build: the crate is not rebuilt for nothing. So
//! `+dirty` is as of the last such move or the last change of this script;
//! a release is built from a fresh clone, where it is exact.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let commit = commit(&dir).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=FENCELOCK_COMMIT={commit}");
    // Without any rerun-if-changed, cargo would rerun this on every change
    // of the package's files; with them, on theirs only (and on this script's).
    println!("cargo:rerun-if-changed=build.rs");
    for path in watched(&dir) {
        println!("cargo:rerun-if-changed={}", path.display());
    }
}

/// `git` in `dir`: its trimmed output, if it ran and succeeded.
fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git").arg("-C").arg(dir).args(args).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn commit(dir: &Path) -> Option<String> {
    let hash = git(dir, &["rev-parse", "--short=12", "HEAD"])?;
    if hash.len() != 12 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    // Tracked files only: a build's own outputs and scratch files are not changes.
    let status = git(dir, &["status", "--porcelain", "--untracked-files=no"])?;
    Some(if status.is_empty() { hash } else { format!("{hash}+dirty") })
}

/// The files whose change means HEAD moved: HEAD itself, packed-refs, and
/// the ref HEAD points to (none when detached), as absolute paths (worktrees
/// included); a ref that is only in packed-refs is watched by its directory,
/// where a commit writes it. Only paths that exist: cargo reruns on every
/// build for a missing one.
fn watched(dir: &Path) -> Vec<PathBuf> {
    let path = |name: &str| git(dir, &["rev-parse", "--path-format=absolute", "--git-path", name]).map(PathBuf::from);
    let mut out: Vec<PathBuf> = ["HEAD", "packed-refs"].into_iter().filter_map(path).filter(|p| p.is_file()).collect();
    if let Some(loose) = git(dir, &["symbolic-ref", "-q", "HEAD"]).and_then(|r| path(&r)) {
        out.extend(loose.ancestors().find(|p| p.exists()).map(Path::to_path_buf));
    }
    out
}
