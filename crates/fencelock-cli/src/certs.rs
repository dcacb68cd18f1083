//! `fencelock certs init`: the certificates of a secure group, for a test or
//! a first setup (see `fencelock_server::certs` for what is written).

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};

use crate::exit;

#[derive(Args, Debug)]
pub struct CertsArgs {
    #[command(subcommand)]
    cmd: CertsCmd,
}

#[derive(Subcommand, Debug)]
enum CertsCmd {
    /// Write a cluster CA, a certificate per node, a client CA and a client
    /// certificate into a directory (refuses to overwrite).
    Init(InitArgs),
}

#[derive(Args, Debug)]
struct InitArgs {
    /// Where to write the files (created if missing).
    #[arg(long)]
    dir: PathBuf,
    /// How many node certificates (node1.pem … nodeN.pem).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=100))]
    nodes: u64,
    /// Host names and IP addresses the node certificates are valid for
    /// (comma-separated): every address clients and peers dial.
    #[arg(long, value_delimiter = ',', default_value = "localhost,127.0.0.1,::1")]
    hosts: Vec<String>,
}

pub fn certs(a: CertsArgs) -> anyhow::Result<std::process::ExitCode> {
    match a.cmd {
        CertsCmd::Init(a) => init(a),
    }
}

fn init(a: InitArgs) -> anyhow::Result<std::process::ExitCode> {
    let hosts: Vec<String> = a.hosts.iter().map(|h| h.trim().to_string()).filter(|h| !h.is_empty()).collect();
    anyhow::ensure!(!hosts.is_empty(), "--hosts is empty: name the hosts the nodes are reached at");
    let written = fencelock_server::certs::init(&a.dir, a.nodes, &hosts)
        .with_context(|| format!("writing certificates into {}", a.dir.display()))?;
    for p in &written {
        println!("{}", p.display());
    }
    eprintln!(
        "fencelock: certificates of nodes 1..={} (valid for {}) and of a client in {}; keep the *.key files secret",
        a.nodes,
        hosts.join(", "),
        a.dir.display()
    );
    Ok(std::process::ExitCode::from(exit::OK))
}
