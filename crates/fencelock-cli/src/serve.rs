//! `fencelock serve`: run one node until SIGTERM or SIGINT.

use std::{net::SocketAddr, path::PathBuf};

use anyhow::Context;
use clap::Args;
use tokio::signal::unix::{signal, SignalKind};

use crate::exit;

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Directory for the durable state (Raft log, vote, snapshots).
    #[arg(long, env = "FENCELOCK_DATA_DIR", default_value = "./fencelock-data")]
    data_dir: PathBuf,
    /// gRPC listen address (client API).
    #[arg(long, env = "FENCELOCK_LISTEN", default_value = "127.0.0.1:7070")]
    listen: SocketAddr,
    /// HTTP admin listen address (/healthz, /metrics, /v1/locks).
    #[arg(long, env = "FENCELOCK_HTTP", default_value = "127.0.0.1:7071")]
    http: SocketAddr,
    /// This node's id in the Raft group.
    #[arg(long, env = "FENCELOCK_NODE_ID", default_value_t = 1)]
    node_id: u64,
    /// Log filter (tracing env-filter syntax), e.g. `info` or `fencelock_server=debug`.
    #[arg(long, env = "FENCELOCK_LOG", default_value = "info,openraft=warn")]
    log: String,
}

pub async fn serve(a: ServeArgs) -> anyhow::Result<std::process::ExitCode> {
    init_logging(&a.log);
    let mut config = fencelock_server::Config::new(&a.data_dir);
    config.grpc_listen = a.listen;
    config.http_listen = a.http;
    config.node_id = a.node_id;
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let running = fencelock_server::start(config).await?;
    eprintln!(
        "fencelock: serving gRPC on {} and HTTP on {}, data in {}",
        running.grpc_addr,
        running.http_addr,
        a.data_dir.display()
    );
    tokio::select! {
        _ = term.recv() => eprintln!("fencelock: SIGTERM, shutting down"),
        _ = int.recv() => eprintln!("fencelock: SIGINT, shutting down"),
    }
    running.shutdown().await;
    Ok(std::process::ExitCode::from(exit::OK))
}

pub fn init_logging(filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(filter).unwrap_or_else(|e| {
        eprintln!("fencelock: warning: log filter {filter:?} is invalid ({e}); using \"info\"");
        tracing_subscriber::EnvFilter::new("info")
    });
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_ansi(ansi).with_writer(std::io::stderr).try_init();
}
