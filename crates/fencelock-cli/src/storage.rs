//! `fencelock storage`: run the fenced storage server (an HTTP object store that
//! refuses writes with stale fencing tokens) until SIGTERM or SIGINT;
//! `fencelock storage reset-mark KEY`: an operator's reset of one key's mark,
//! with the server stopped.

use std::{net::SocketAddr, path::PathBuf, process::ExitCode};

use anyhow::Context;
use clap::{Args, Subcommand};
use fencelock_fence::storage;
use tokio::signal::unix::{signal, SignalKind};

use crate::exit;

#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct StorageArgs {
    #[command(subcommand)]
    cmd: Option<StorageCmd>,
    /// Directory for the objects, the fence marks and the audit log.
    #[arg(long, env = "FENCELOCK_STORAGE_DIR", default_value = "./fencelock-storage")]
    data_dir: PathBuf,
    /// HTTP listen address.
    #[arg(long, env = "FENCELOCK_STORAGE_LISTEN", default_value = "127.0.0.1:7072")]
    listen: SocketAddr,
    /// Largest request body, in bytes.
    #[arg(long, default_value_t = storage::DEFAULT_MAX_BODY)]
    max_body: usize,
    /// Refuse tokens above this (400 naming the limit): an admitted absurd
    /// token would raise its key's mark for good.
    #[arg(long, default_value_t = storage::DEFAULT_MAX_TOKEN)]
    max_token: u64,
    /// The lock service's admin HTTP (http://host:port): refuse tokens above
    /// the highest it has issued plus --token-margin (asked again before
    /// refusing, so a fresh token passes; 503 if it cannot be asked).
    #[arg(long, env = "FENCELOCK_STORAGE_LOCK_SERVER")]
    lock_server: Option<String>,
    /// Tokens accepted above the lock service's last known count.
    #[arg(long, default_value_t = storage::DEFAULT_TOKEN_MARGIN)]
    token_margin: u64,
    /// Rotate audit.log when it would exceed this many bytes.
    #[arg(long, default_value_t = storage::DEFAULT_AUDIT_MAX_FILE_BYTES)]
    audit_max_bytes: u64,
    /// How many rotated audit files (audit.log.1, …) to keep.
    #[arg(long, default_value_t = storage::DEFAULT_AUDIT_KEEP_FILES)]
    audit_keep: usize,
    /// Carry out stale writes instead of rejecting them (logged as `unfenced`).
    /// Only to demonstrate what goes wrong without fencing; never in production.
    #[arg(long, hide = true)]
    unfenced: bool,
}

#[derive(Subcommand, Debug)]
enum StorageCmd {
    /// Reset one key's fence mark (the storage server must be stopped);
    /// written to the audit log as a RESET entry.
    ResetMark(ResetMarkArgs),
}

#[derive(Args, Debug)]
struct ResetMarkArgs {
    /// The object key.
    key: String,
    /// The storage server's data directory.
    #[arg(long, env = "FENCELOCK_STORAGE_DIR", default_value = "./fencelock-storage")]
    data_dir: PathBuf,
    /// The new mark; without it the mark is removed and any token is admitted
    /// next. Use at least the lock service's highest token issued
    /// (fencelock_token_counter on its /metrics), so stale holders stay out.
    #[arg(long)]
    to: Option<u64>,
}

pub async fn storage(a: StorageArgs) -> anyhow::Result<ExitCode> {
    match a.cmd {
        Some(StorageCmd::ResetMark(r)) => reset_mark(r).await,
        None => serve(a).await,
    }
}

async fn serve(a: StorageArgs) -> anyhow::Result<ExitCode> {
    crate::serve::init_logging("info");
    let listener = tokio::net::TcpListener::bind(a.listen)
        .await
        .with_context(|| format!("cannot listen on {}", a.listen))?;
    let addr = listener.local_addr()?;
    let mut config = storage::Config::new(&a.data_dir);
    config.max_body = a.max_body;
    config.enforce = !a.unfenced;
    config.max_token = a.max_token;
    config.lock_server = a.lock_server.clone();
    config.token_margin = a.token_margin;
    config.audit = storage::AuditConfig { max_file_bytes: a.audit_max_bytes, keep_files: a.audit_keep };
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let shutdown = async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    };
    eprintln!(
        "fencelock: fenced storage on http://{addr}, data in {}{}",
        a.data_dir.display(),
        if a.unfenced { " (FENCING OFF: stale writes are carried out)" } else { "" }
    );
    storage::serve_with(listener, config, shutdown).await.context("storage server failed")?;
    Ok(ExitCode::from(exit::OK))
}

async fn reset_mark(r: ResetMarkArgs) -> anyhow::Result<ExitCode> {
    let dir = r.data_dir.clone();
    let key = r.key.clone();
    let done = tokio::task::spawn_blocking(move || storage::reset_mark(&dir, &key, r.to))
        .await?
        .with_context(|| format!("cannot reset the mark of {:?}", r.key))?;
    let show = |m: Option<u64>| m.map_or("none".to_owned(), |t| t.to_string());
    println!("{}: mark {} -> {} (audited as RESET)", r.key, show(done.before), show(done.after));
    Ok(ExitCode::from(exit::OK))
}
