//! `fencelock check-data DIR`: verify a data dir offline (the server must not
//! be running on it): every record's checksum, the log's order, the snapshot,
//! and the state a start would rebuild. Exit 0 when it passes, 1 when it does
//! not (with the record that failed).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use fencelock_server::raft::check::check_data;

use crate::exit;

#[derive(Args, Debug)]
pub struct CheckDataArgs {
    /// The data directory to check.
    dir: PathBuf,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

pub fn check(a: CheckDataArgs) -> anyhow::Result<ExitCode> {
    let report = match check_data(&a.dir) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("fencelock: {e}");
            return Ok(ExitCode::from(exit::NO));
        }
    };
    if a.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        let idx = |i: Option<u64>| i.map_or("-".to_string(), |i| i.to_string());
        println!(
            "{}: ok: snapshot at {}, {} log entries ({}..={}), committed {}; {} leases, {} held locks, last token {}",
            a.dir.display(),
            idx(report.snapshot_index),
            report.entries,
            idx(report.first_index),
            idx(report.last_index),
            idx(report.committed_index),
            report.stats.leases,
            report.stats.held_locks,
            report.stats.token_counter
        );
    }
    Ok(ExitCode::from(exit::OK))
}
