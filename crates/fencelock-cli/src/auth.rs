//! `fencelock auth`: edits the auth file a node reads with `--auth-file` (see
//! `fencelock_server::auth` for its format). A running node re-reads the file
//! when it changes.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::{Args, Subcommand};

use crate::exit;

#[derive(Args, Debug)]
pub struct AuthArgs {
    #[command(subcommand)]
    cmd: AuthCmd,
}

#[derive(Subcommand, Debug)]
enum AuthCmd {
    /// Add a bearer token for an identity to the auth file (created if
    /// missing) and print the token, once: only its hash is stored.
    AddToken(AddTokenArgs),
    /// Check an auth file and list its identities.
    Check(CheckArgs),
}

#[derive(Args, Debug)]
struct AddTokenArgs {
    /// The identity's name (visible ASCII, no spaces): shown as the holder of
    /// its locks.
    name: String,
    /// A role for the identity (repeat for several): `admin` (built in), or
    /// one the file defines under [roles.NAME].
    #[arg(long = "role", required = true)]
    roles: Vec<String>,
    /// The auth file.
    #[arg(long, env = "FENCELOCK_AUTH_FILE")]
    file: PathBuf,
}

#[derive(Args, Debug)]
struct CheckArgs {
    /// The auth file.
    #[arg(long, env = "FENCELOCK_AUTH_FILE")]
    file: PathBuf,
}

pub fn auth(a: AuthArgs) -> anyhow::Result<std::process::ExitCode> {
    match a.cmd {
        AuthCmd::AddToken(a) => add_token(a),
        AuthCmd::Check(a) => check(a),
    }
}

fn add_token(a: AddTokenArgs) -> anyhow::Result<std::process::ExitCode> {
    let old = match std::fs::read_to_string(&a.file) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e).with_context(|| format!("reading {}", a.file.display())),
    };
    let new = fencelock_server::auth::new_token().map_err(anyhow::Error::msg)?;
    let roles: Vec<String> = a.roles.iter().map(|r| toml_string(r)).collect();
    let entry = format!(
        "\n[[tokens]]\nname = {}\nid = \"{}\"\nhash = \"{}\"\nroles = [{}]\n",
        toml_string(&a.name),
        new.id,
        new.hash,
        roles.join(", ")
    );
    let text = format!("{old}{entry}");
    // The whole new file must load as a node would load it: an unknown role or
    // a name used twice is refused here, before anything is written.
    if let Err(why) = fencelock_server::auth::Table::parse(&text) {
        bail!("not added: {why}");
    }
    write_private(&a.file, &text)?;
    println!("{}", new.token);
    eprintln!(
        "fencelock: token for {:?} (roles {}) added to {}; it is shown only this once",
        a.name,
        a.roles.join(", "),
        a.file.display()
    );
    Ok(std::process::ExitCode::from(exit::OK))
}

fn check(a: CheckArgs) -> anyhow::Result<std::process::ExitCode> {
    let text = std::fs::read_to_string(&a.file).with_context(|| format!("reading {}", a.file.display()))?;
    let table = fencelock_server::auth::Table::parse(&text).map_err(|why| anyhow::anyhow!("{}: {why}", a.file.display()))?;
    for (name, how) in table.identities() {
        println!("{name}\t{how}");
    }
    Ok(std::process::ExitCode::from(exit::OK))
}

/// A TOML basic string.
fn toml_string(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// Replaces `path` with `text` atomically (a temporary file renamed over it),
/// readable by its owner only: the file holds hashes, not tokens, but it
/// decides who may do what.
fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let tmp = dir.join(format!(".{}.tmp-{}", path.file_name().and_then(|n| n.to_str()).unwrap_or("auth"), std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
    f.write_all(text.as_bytes()).and_then(|()| f.sync_all()).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("replacing {}", path.display()))?;
    Ok(())
}
