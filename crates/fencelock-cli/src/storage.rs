//! `fencelock storage`: run the fenced storage server (an HTTP object store that
//! refuses writes with stale fencing tokens) until SIGTERM or SIGINT.

use std::{net::SocketAddr, path::PathBuf, process::ExitCode};

use anyhow::Context;
use clap::Args;
use tokio::signal::unix::{signal, SignalKind};

use crate::exit;

#[derive(Args, Debug)]
pub struct StorageArgs {
    /// Directory for the objects, the fence marks and the audit log.
    #[arg(long, env = "FENCELOCK_STORAGE_DIR", default_value = "./fencelock-storage")]
    data_dir: PathBuf,
    /// HTTP listen address.
    #[arg(long, env = "FENCELOCK_STORAGE_LISTEN", default_value = "127.0.0.1:7072")]
    listen: SocketAddr,
    /// Largest request body, in bytes.
    #[arg(long, default_value_t = fencelock_fence::storage::DEFAULT_MAX_BODY)]
    max_body: usize,
    /// Carry out stale writes instead of rejecting them (logged as `unfenced`).
    /// Only to demonstrate what goes wrong without fencing; never in production.
    #[arg(long, hide = true)]
    unfenced: bool,
}

pub async fn storage(a: StorageArgs) -> anyhow::Result<ExitCode> {
    crate::serve::init_logging("info");
    let listener = tokio::net::TcpListener::bind(a.listen)
        .await
        .with_context(|| format!("cannot listen on {}", a.listen))?;
    let addr = listener.local_addr()?;
    let mut config = fencelock_fence::storage::Config::new(&a.data_dir);
    config.max_body = a.max_body;
    config.enforce = !a.unfenced;
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
    fencelock_fence::storage::serve_with(listener, config, shutdown)
        .await
        .context("storage server failed")?;
    Ok(ExitCode::from(exit::OK))
}
