//! `fencelock storage`: run the fenced storage server (an HTTP object store that
//! refuses writes with stale fencing tokens) until SIGTERM or SIGINT;
//! `fencelock storage reset-mark KEY`: an operator's reset of one key's mark,
//! with the server stopped.
//!
//! TLS (`--tls-cert`, `--tls-key`, `--client-ca`, `--require-client-cert`)
//! follows `fencelock serve`'s flags and is `fencelock_fence::storage`'s
//! (files re-read when they change); plaintext on an address other hosts can
//! reach needs `--insecure`. `--lock-server` takes the client library's URL
//! grammar (`https://host:port?ca=…&cert=…&key=…&token=…`, see
//! `fencelock::backend::BackendUrl`) for a lock service with TLS.
//!
//! `--report-to URL` (with `--report-tls-ca`, `--report-tls-cert`,
//! `--report-tls-key`, `--report-auth-token`, as a client command's
//! `--server` takes them) reports each stale write the server refuses to the
//! lock service (`fencelock_fence::report`): the lock is the request's
//! `Fencing-Lock`, the resource its object key.

use std::{net::SocketAddr, path::PathBuf, process::ExitCode, sync::Arc};

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use fencelock::backend::BackendUrl;
use fencelock_fence::storage;
use tokio::signal::unix::{signal, SignalKind};

use crate::{exit, AuthToken};

#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct StorageArgs {
    #[command(subcommand)]
    cmd: Option<StorageCmd>,
    /// Directory for the objects, the fence marks and the audit log.
    #[arg(long, env = "FENCELOCK_STORAGE_DIR", default_value = "./fencelock-storage")]
    data_dir: PathBuf,
    /// HTTP listen address (HTTPS with --tls-cert). An address other than
    /// loopback needs TLS, or --insecure.
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
    /// refusing, so a fresh token passes; 503 if it cannot be asked). With
    /// TLS: https://host:port?ca=ca.pem (fencelock+tls:// too), and
    /// &cert=…&key=… if it asks for a client certificate.
    #[arg(long, env = "FENCELOCK_STORAGE_LOCK_SERVER")]
    lock_server: Option<String>,
    /// Bearer token for a lock service whose /metrics needs one
    /// (protect_metrics in its auth file); the URL's token= does the same.
    /// Never printed; prefer the environment variable.
    #[arg(long, env = "FENCELOCK_STORAGE_LOCK_SERVER_TOKEN", hide_env_values = true, value_name = "TOKEN")]
    lock_server_token: Option<AuthToken>,
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
    #[command(flatten)]
    tls: StorageTlsArgs,
    #[command(flatten)]
    report: ReportArgs,
}

/// Where refused stale writes are reported (`fencelock_fence::report`).
#[derive(Args, Debug, Default)]
pub struct ReportArgs {
    /// Report each stale write this server refuses to the lock service at
    /// this URL (its gRPC port, as --server of a client command takes it:
    /// fencelock://host:7070, a group fencelock://a:7070,b:7070,c:7070,
    /// fencelock+tls://…?ca=… with TLS): every member's `fencelock watch`
    /// then shows a write_refused event of the lock the request named in
    /// Fencing-Lock, with the refused token, the highest token and the object
    /// key. Never delays an answer: reports wait in a queue of 1024 (beyond
    /// it they are dropped) and are sent in the background; the lock service
    /// is connected at the first report. With authentication on, the token's
    /// identity needs the check verb on the locks.
    #[arg(long, env = "FENCELOCK_STORAGE_REPORT_TO", value_name = "URL")]
    report_to: Option<String>,
    /// The CA (PEM) of the lock service's certificates: TLS towards
    /// --report-to (fencelock:// becomes fencelock+tls://).
    #[arg(long, env = "FENCELOCK_STORAGE_REPORT_TLS_CA", requires = "report_to", value_name = "FILE")]
    report_tls_ca: Option<PathBuf>,
    /// A client certificate (PEM) to present to the lock service.
    #[arg(long, env = "FENCELOCK_STORAGE_REPORT_TLS_CERT", requires_all = ["report_tls_key", "report_tls_ca"], value_name = "FILE")]
    report_tls_cert: Option<PathBuf>,
    /// The key of --report-tls-cert (PEM).
    #[arg(long, env = "FENCELOCK_STORAGE_REPORT_TLS_KEY", requires = "report_tls_cert", value_name = "FILE")]
    report_tls_key: Option<PathBuf>,
    /// Bearer token for a lock service that requires one (the URL's token=
    /// does the same); its identity needs `check` on the locks. Never
    /// printed; prefer the environment variable.
    #[arg(
        long,
        env = "FENCELOCK_STORAGE_REPORT_AUTH_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN",
        requires = "report_to"
    )]
    report_auth_token: Option<AuthToken>,
}

impl ReportArgs {
    /// The lock service's URL with the TLS flags and the token folded in (as
    /// a client command's `--server`), checked: a fencelock server URL.
    /// `None` without `--report-to`. It holds the token: never print it.
    fn url(&self) -> anyhow::Result<Option<String>> {
        let Some(server) = &self.report_to else { return Ok(None) };
        let arg = crate::ServerArg {
            server: server.clone(),
            tls_ca: self.report_tls_ca.clone(),
            tls_cert: self.report_tls_cert.clone(),
            tls_key: self.report_tls_key.clone(),
            auth_token: self.report_auth_token.clone(),
        };
        let url = arg.url();
        let parsed = BackendUrl::parse(&url).context("--report-to")?;
        if parsed.scheme != fencelock::backend::Scheme::Native {
            bail!("--report-to {}: not a fencelock server URL (fencelock://host:port)", arg.shown());
        }
        if let Some(t) = parsed.auth_token() {
            fencelock::check_auth_token(&t).context("the auth token of --report-to")?;
        }
        Ok(Some(url))
    }
}

/// TLS on the storage listener (`fencelock_fence::storage::TlsFiles`).
#[derive(Args, Debug, Default)]
pub struct StorageTlsArgs {
    /// This server's certificate (PEM, leaf first); with --tls-key turns
    /// HTTPS on. `fencelock certs init` makes one (node1.pem). Re-read when
    /// the file changes (replace it by rename).
    #[arg(long, env = "FENCELOCK_STORAGE_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, env = "FENCELOCK_STORAGE_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// The CA of client certificates (PEM): clients may present one (mTLS).
    #[arg(long, env = "FENCELOCK_STORAGE_CLIENT_CA", requires = "tls_cert")]
    client_ca: Option<PathBuf>,
    /// Refuse connections without a client certificate of --client-ca.
    #[arg(long, env = "FENCELOCK_STORAGE_REQUIRE_CLIENT_CERT", requires = "client_ca")]
    require_client_cert: bool,
    /// Serve plaintext on an address other hosts can reach (refused without
    /// this flag): for a network that is yours alone.
    #[arg(long, env = "FENCELOCK_STORAGE_INSECURE")]
    insecure: bool,
}

impl StorageTlsArgs {
    fn files(&self) -> Option<storage::TlsFiles> {
        let (cert, key) = (self.tls_cert.clone()?, self.tls_key.clone()?);
        Some(storage::TlsFiles {
            cert,
            key,
            client_ca: self.client_ca.clone(),
            require_client_cert: self.require_client_cert,
        })
    }
}

/// The lock service's admin HTTP as the storage server reaches it.
struct LockServer {
    /// `http://host:port` or `https://host:port`.
    base: String,
    tls: Option<Arc<storage::rustls::ClientConfig>>,
    token: Option<String>,
}

/// Parses `--lock-server` with the client library's URL grammar: `http://`
/// or `fencelock://` plaintext, `https://` or `fencelock+tls://` with TLS
/// (`ca=`, else the system's CAs; `cert=` and `key=` together), `token=`
/// (which wins over `--lock-server-token`, as `--server`'s does over
/// `--auth-token`). One host, its port given (the admin port, not gRPC's).
fn lock_server(raw: &str, flag_token: Option<&AuthToken>) -> anyhow::Result<LockServer> {
    use fencelock::backend::{
        tls::{client_config, TlsFiles, Verify},
        Scheme,
    };
    let url = BackendUrl::parse(raw).context("--lock-server")?;
    let bad = |why: &str| {
        anyhow::anyhow!("--lock-server {url}: {why} (expected http://host:port or https://host:port?ca=ca.pem, the lock service's admin HTTP)")
    };
    if url.scheme != Scheme::Native {
        return Err(bad("not a fencelock server URL"));
    }
    if url.hosts.len() != 1 {
        return Err(bad("name one node"));
    }
    if !url.path.is_empty() {
        return Err(bad("no path: /metrics is added"));
    }
    if !has_port(raw) {
        return Err(bad("name the port of its admin HTTP (--http of fencelock serve, e.g. 7071)"));
    }
    if let Some((k, _)) = url.params.iter().find(|(k, _)| !["ca", "cert", "key", "token"].contains(&k.as_str())) {
        return Err(bad(&format!("unknown parameter {k:?} (it takes ca, cert, key, token)")));
    }
    let tls = match TlsFiles::from_url(&url)? {
        Some(files) => Some(Arc::new(client_config(&files, Verify::Full)?)),
        None => None,
    };
    let token = url.auth_token().or_else(|| flag_token.map(|t| t.secret().to_string()));
    if let Some(t) = &token {
        fencelock::check_auth_token(t).context("--lock-server-token")?;
    }
    Ok(LockServer { base: url.native_endpoints(), tls, token })
}

/// Whether the authority of `raw` names a port (`BackendUrl` fills in gRPC's
/// 7070 when it does not, which is not the admin port).
fn has_port(raw: &str) -> bool {
    let rest = raw.split_once("://").map_or(raw, |(_, r)| r);
    let authority = rest.split(['/', '?']).next().unwrap_or("");
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let after_bracket = host.rsplit_once(']').map_or(host, |(_, p)| p);
    after_bracket.rsplit_once(':').is_some_and(|(_, p)| !p.is_empty())
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
    let mut config = storage::Config::new(&a.data_dir);
    config.max_body = a.max_body;
    config.enforce = !a.unfenced;
    config.max_token = a.max_token;
    config.token_margin = a.token_margin;
    config.audit = storage::AuditConfig { max_file_bytes: a.audit_max_bytes, keep_files: a.audit_keep };
    config.tls = a.tls.files();
    config.insecure = a.tls.insecure;
    if let Some(raw) = &a.lock_server {
        let l = lock_server(raw, a.lock_server_token.as_ref())?;
        config.lock_server = Some(l.base);
        config.lock_server_tls = l.tls;
        config.lock_server_token = l.token;
    } else if a.lock_server_token.is_some() {
        bail!("--lock-server-token needs --lock-server");
    }
    if let Some(url) = a.report.url()? {
        let service = fencelock_fence::report::LockService::new(url);
        config.reporter = Some(fencelock_fence::report::Reporter::new(service));
    }
    config.check_exposure(a.listen).map_err(anyhow::Error::msg)?;
    let listener =
        tokio::net::TcpListener::bind(a.listen).await.with_context(|| format!("cannot listen on {}", a.listen))?;
    let addr = listener.local_addr()?;
    let scheme = if config.tls.is_some() { "https" } else { "http" };
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let shutdown = async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    };
    let reporting = match &a.report.report_to {
        Some(_) => ", refused writes reported to the lock service",
        None => "",
    };
    eprintln!(
        "fencelock: fenced storage on {scheme}://{addr}, data in {}{reporting}{}",
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

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "flt_0123abcd_c2VrcmV0c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0c2Vj";

    /// Rule: `--lock-server` takes the client library's URLs: plaintext
    /// `http://` / `fencelock://` unchanged, `https://` / `fencelock+tls://`
    /// with `ca=` (a file that does not load is named), `token=` or
    /// `--lock-server-token`; one host with its (admin) port, no path, no
    /// unknown parameter. No error shows the token.
    #[test]
    fn lock_server_urls() {
        let l = lock_server("http://127.0.0.1:7071/", None).unwrap();
        assert_eq!((l.base.as_str(), l.tls.is_none(), l.token), ("http://127.0.0.1:7071", true, None));
        let l = lock_server("fencelock://[::1]:7071", None).unwrap();
        assert_eq!(l.base, "http://[::1]:7071");

        let flag: AuthToken = SECRET.parse().unwrap();
        let l = lock_server("http://h:7071", Some(&flag)).unwrap();
        assert_eq!(l.token.as_deref(), Some(SECRET));
        let l = lock_server("http://h:7071?token=from-url", Some(&flag)).unwrap();
        assert_eq!(l.token.as_deref(), Some("from-url"), "the URL's token= wins, as for --server");

        let err = |url: &str| format!("{:#}", lock_server(url, None).err().unwrap_or_else(|| panic!("{url} accepted")));
        assert!(err("http://h").contains("name the port"), "{}", err("http://h"));
        assert!(err("http://a:1,b:1").contains("one node"));
        assert!(err("http://h:1/metrics").contains("no path"));
        assert!(err("http://h:1?x=1").contains("unknown parameter \"x\""));
        assert!(err("redis://h:1").contains("not a fencelock server URL"));
        assert!(err("http://h:1?ca=/x.pem").contains("TLS"), "{}", err("http://h:1?ca=/x.pem"));
        let missing = err("https://h:1?ca=/nonexistent/ca.pem");
        assert!(missing.contains("/nonexistent/ca.pem"), "{missing}");
        let e = err(&format!("https://h:1?ca=/nonexistent/ca.pem&token={SECRET}"));
        assert!(!e.contains(SECRET), "{e}");
        let e = format!("{:#}", lock_server("http://h:1?token=a%20b", None).err().unwrap());
        assert!(e.contains("invalid auth token") && !e.contains("a b"), "{e}");
    }

    /// Rule: `--report-to` takes a fencelock server URL, with the TLS flags
    /// and the token folded in as `--server`'s are; another backend's URL
    /// or a malformed one is refused, and no error shows the token.
    #[test]
    fn report_to_urls() {
        let args = |to: &str, ca: Option<&str>, token: Option<&str>| ReportArgs {
            report_to: Some(to.into()),
            report_tls_ca: ca.map(PathBuf::from),
            report_auth_token: token.map(|t| t.parse().unwrap()),
            ..ReportArgs::default()
        };
        assert_eq!(ReportArgs::default().url().unwrap(), None);
        assert_eq!(
            args("fencelock://a:7070,b:7070", None, None).url().unwrap().as_deref(),
            Some("fencelock://a:7070,b:7070")
        );
        let url = args("fencelock://a:7070", Some("/c/ca.pem"), Some(SECRET)).url().unwrap().unwrap();
        assert_eq!(url, format!("fencelock+tls://a:7070?ca=/c/ca.pem&token={SECRET}"));
        let err = |a: ReportArgs| format!("{:#}", a.url().expect_err("refused"));
        let e = err(args("redis://h:6379", None, Some(SECRET)));
        assert!(e.contains("not a fencelock server URL") && !e.contains(SECRET), "{e}");
        let e = err(args("h:7070", None, None));
        assert!(e.contains("--report-to"), "{e}");
        let e = err(args("fencelock://h:7070", None, Some("a b")));
        assert!(e.contains("auth token of --report-to") && !e.contains("a b"), "{e}");
    }

    #[test]
    fn ports_are_seen() {
        assert!(has_port("http://h:1"));
        assert!(has_port("https://u:p@h:1/?ca=x"));
        assert!(has_port("http://[::1]:7071"));
        assert!(!has_port("http://[::1]"));
        assert!(!has_port("http://h/"));
        assert!(!has_port("http://h?ca=a:b"));
    }
}
