//! `fencelock snapshot save | restore`: back up a running group's state, and
//! build a new data dir from a backup (see `fencelock_server::backup` for what
//! a restore keeps and drops, and why its tokens start above the old group's).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use fencelock_server::backup::{self, Backup, RestoreOptions};

use crate::{exit, http};

#[derive(Args, Debug)]
pub struct SnapshotArgs {
    #[command(subcommand)]
    cmd: SnapshotCmd,
}

#[derive(Subcommand, Debug)]
enum SnapshotCmd {
    /// Write a consistent backup of a running group's state to FILE (taken on
    /// the leader; the admin addresses are tried in order until one answers).
    Save {
        file: PathBuf,
        /// HTTP admin address of a member; several, comma-separated.
        #[arg(long, env = "FENCELOCK_ADMIN", default_value = "127.0.0.1:7071", value_delimiter = ',')]
        admin: Vec<SocketAddr>,
        #[command(flatten)]
        tls: crate::http::AdminTlsArgs,
    },
    /// Build a new data dir (absent or empty) from the backup FILE: a group of
    /// one with no leases and no locks, whose tokens start above every token the
    /// old group could have issued.
    Restore {
        file: PathBuf,
        #[arg(long)]
        data_dir: PathBuf,
        /// The restored node's id.
        #[arg(long, default_value_t = 1)]
        node_id: u64,
        /// The restored node's gRPC address, as other members will reach it.
        #[arg(long, default_value = "127.0.0.1:7070")]
        advertise: String,
        /// The first token the restored group issues is at least this: give one
        /// above the highest token your fences have accepted.
        #[arg(long)]
        min_token: Option<u64>,
        /// Tokens skipped past the backup's counter (the old group may have
        /// issued more after the backup was taken).
        #[arg(long, default_value_t = backup::DEFAULT_TOKEN_GAP)]
        token_gap: u64,
    },
}

pub async fn snapshot(a: SnapshotArgs) -> anyhow::Result<ExitCode> {
    match a.cmd {
        SnapshotCmd::Save { file, admin, tls } => save(&file, &admin, &tls).await,
        SnapshotCmd::Restore { file, data_dir, node_id, advertise, min_token, token_gap } => {
            let opts = RestoreOptions { node_id, addr: advertise, min_token, token_gap };
            restore(&file, &data_dir, &opts)
        }
    }
}

async fn save(file: &std::path::Path, admins: &[SocketAddr], tls: &http::AdminTlsArgs) -> anyhow::Result<ExitCode> {
    let headers: Vec<_> = tls.auth_header()?.into_iter().collect();
    let tls = tls.config()?;
    let mut errors = Vec::new();
    for admin in admins {
        match http::request_tls(tls.as_ref(), *admin, "GET", "/v1/snapshot", &headers, b"").await {
            Ok((200, body)) => {
                let b = Backup::decode(body.as_bytes()).with_context(|| format!("the backup from {admin}"))?;
                write_new(file, body.as_bytes())?;
                println!(
                    "saved {}: {} leases, {} held locks, last token {} (node {}, log index {})",
                    file.display(),
                    b.engine.stats().leases,
                    b.engine.stats().held_locks,
                    b.last_token,
                    b.node_id,
                    b.last_applied_index.map_or("-".into(), |i| i.to_string())
                );
                return Ok(ExitCode::from(exit::OK));
            }
            Ok((code, body)) => {
                // Every member refuses the same token: no use trying the next.
                if let Some(refused) = http::auth_refusal(*admin, code, body.trim()) {
                    return Err(refused);
                }
                errors.push(format!("{admin}: {code}: {}", body.trim()))
            }
            Err(e) => errors.push(format!("{admin}: {e:#}")),
        }
    }
    bail!("no member gave a backup: {}", errors.join("; "))
}

/// Writes `bytes` to a new file (never over an existing one), synced.
fn write_new(file: &std::path::Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(file)
        .with_context(|| format!("cannot create {} (a backup never overwrites a file)", file.display()))?;
    f.write_all(bytes)?;
    f.sync_all()?;
    Ok(())
}

fn restore(file: &std::path::Path, dir: &std::path::Path, opts: &RestoreOptions) -> anyhow::Result<ExitCode> {
    let bytes = std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?;
    let b = Backup::decode(&bytes).with_context(|| format!("{}", file.display()))?;
    let r = backup::restore(&b, dir, opts)?;
    println!(
        "restored {} into {} as node {} of a new group: dropped {} leases and {} held locks; the next token is {}",
        file.display(),
        dir.display(),
        opts.node_id,
        r.dropped_leases,
        r.dropped_locks,
        r.next_token
    );
    Ok(ExitCode::from(exit::OK))
}
