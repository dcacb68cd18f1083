//! What `fencelock --version` (and `-V`) prints: the crate's version, the
//! commit it was built from (`build.rs`), and the on-disk and wire formats
//! this binary reads and writes, each from the constant that defines it.

use std::sync::OnceLock;

/// The version of the crate (the workspace's).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The commit this binary was built from: 12 hex digits, `+dirty` if a
/// tracked file had changes, or `unknown` (built without git).
pub const COMMIT: &str = env!("FENCELOCK_COMMIT");

/// The version as clap prints it after the name: the crate's version, then
/// one `what: value` line per commit and format.
pub fn long() -> &'static str {
    static TEXT: OnceLock<String> = OnceLock::new();
    TEXT.get_or_init(|| {
        let mut text = VERSION.to_string();
        for (what, value) in lines() {
            text.push_str(&format!("\n{what}: {value}"));
        }
        text
    })
}

/// The version and commit on one line, for the man pages' headers.
pub fn short() -> &'static str {
    static TEXT: OnceLock<String> = OnceLock::new();
    TEXT.get_or_init(|| format!("{VERSION} ({COMMIT})"))
}

/// The lines after the version: the commit, then the formats.
fn lines() -> Vec<(&'static str, String)> {
    use fencelock_server::raft;
    vec![
        ("commit", COMMIT.to_string()),
        // A data dir of a lower format is upgraded when it is opened; one of a higher is refused.
        ("data dir format", raft::identity::FORMAT_VERSION.to_string()),
        ("segment log format", raft::wal::format::FORMAT_VERSION.to_string()),
        ("log entry codec", raft::LOG_ENTRY_CODEC.to_string()),
        ("backup format", format!("{} {}", fencelock_server::backup::FORMAT, fencelock_server::backup::VERSION)),
        ("client API", package(fencelock_proto::v1::lock_server::SERVICE_NAME).to_string()),
        ("peer API", package(fencelock_proto::raft::raft_server::SERVICE_NAME).to_string()),
    ]
}

/// The protobuf package of a gRPC service's full name (`fencelock.v1.Lock`:
/// `fencelock.v1`).
fn package(service: &str) -> &str {
    service.rsplit_once('.').map_or(service, |(package, _)| package)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rule: `--version` names each format by its constant, and the gRPC
    /// packages by the generated services' names.
    #[test]
    fn the_version_text_names_every_format() {
        let text = long();
        assert!(text.starts_with(&format!("{VERSION}\ncommit: {COMMIT}\n")), "{text}");
        assert!(text.contains("\nclient API: fencelock.v1\n"), "{text}");
        assert!(text.contains("\npeer API: fencelock.raft.v1"), "{text}");
        let data = format!("\ndata dir format: {}\n", fencelock_server::raft::identity::FORMAT_VERSION);
        assert!(text.contains(&data), "{text}");
        assert_eq!(package("fencelock.v1.Lock"), "fencelock.v1");
        assert!(!short().contains('\n'));
    }
}
