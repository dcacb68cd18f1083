//! The lock services a run can target: fencelock's own server (a child
//! process of the harness, with the test-only fault features) or one of the
//! peer engines from Debian's packages (started by `fencelock-testkit` on free
//! ports, data in temp dirs), reached through `fencelock::backend::connect`.

use std::net::SocketAddr;
use std::path::Path;

use anyhow::bail;
use fencelock_testkit::{EtcdServer, PgServer, RedisServer, ZkServer};

use crate::cluster::Cluster;
use crate::procs::{free_addr, lock_server, ServerProc};
use crate::secure::Secure;

/// Every backend id `--backend` takes (`fencelock3`: a 3-node fencelock group).
pub const BACKENDS: &[&str] =
    &["fencelock", "fencelock-json", "fencelock-py", "fencelock3", "redis", "redlock", "etcd", "zk", "postgres"];

/// How the workers of a run against one fencelock node reach it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Clients {
    /// The Rust client over gRPC (`fencelock`).
    Rust,
    /// The Rust client over the HTTP/JSON API, `fencelock+json://` (`fencelock-json`).
    Json,
    /// The Python package over gRPC, in worker processes that use nothing
    /// else (`fencelock-py`; see `worker_control::Program::Python`).
    Python,
}

/// A running lock service.
pub enum Target {
    /// One node, and how its workers reach it.
    Native {
        server: ServerProc,
        grpc: SocketAddr,
        http: SocketAddr,
        clients: Clients,
    },
    Cluster(Cluster),
    Redis(RedisServer),
    Redlock(Vec<RedisServer>),
    Etcd(EtcdServer),
    Zk(ZkServer),
    Postgres(PgServer),
}

impl Target {
    /// Starts the backend `id`. fencelock's own (a node or a group) gets `env`
    /// (faults, mutants), the extra `serve` arguments `serve_args` (its Raft
    /// log) and, with `secure`, TLS and the auth file.
    pub async fn start(
        id: &str,
        dir: &Path,
        env: Vec<(String, String)>,
        serve_args: &[String],
        secure: Option<&Secure>,
    ) -> anyhow::Result<Target> {
        if secure.is_some() && !matches!(id, "fencelock" | "fencelock3") {
            bail!("TLS and auth are set up for fencelock's own server only (a node or a group), not {id}");
        }
        let t = match id {
            "fencelock" | "fencelock-json" | "fencelock-py" => {
                let (grpc, http) = (free_addr(), free_addr());
                let mut server = lock_server(&dir.join("lock-data"), grpc, http, dir.join("lock-server.log"));
                server.env.extend(env);
                server.args.extend_from_slice(serve_args);
                if let Some(s) = secure {
                    server.args.extend(s.serve_args(&dir.join(format!("lock{}", crate::secure::AUDIT_SUFFIX))));
                    s.register_admin(http)?;
                }
                server.start().await?;
                let clients = match id {
                    "fencelock-json" => Clients::Json,
                    "fencelock-py" => Clients::Python,
                    _ => Clients::Rust,
                };
                Target::Native { server, grpc, http, clients }
            }
            "fencelock3" => Target::Cluster(Cluster::start(dir, env, serve_args, secure).await?),
            "redis" => Target::Redis(blocking(RedisServer::start_volatile).await?),
            "redlock" => Target::Redlock(blocking(|| (0..3).map(|_| RedisServer::start_volatile()).collect()).await?),
            "etcd" => Target::Etcd(blocking(EtcdServer::start).await?),
            "zk" => Target::Zk(blocking(ZkServer::start).await?),
            "postgres" => Target::Postgres(blocking(PgServer::start).await?),
            other => bail!("unknown backend {other:?} (one of {})", BACKENDS.join(", ")),
        };
        Ok(t)
    }

    /// The URL a client uses to reach it directly.
    pub fn url(&self) -> String {
        match self {
            Target::Native { http, clients: Clients::Json, .. } => format!("fencelock+json://{http}"),
            Target::Native { grpc, .. } => format!("http://{grpc}"),
            Target::Cluster(c) => c.url(),
            Target::Redis(r) => r.url(),
            Target::Redlock(rs) => {
                let hosts: Vec<String> = rs.iter().map(|r| format!("127.0.0.1:{}", r.port())).collect();
                format!("redlock://{}", hosts.join(","))
            }
            Target::Etcd(e) => e.url(),
            Target::Zk(z) => z.url(),
            Target::Postgres(p) => p.url(),
        }
    }

    /// The one address all of its clients talk to, if there is one (a proxy
    /// can then stand in front of it); `None` for Redlock's several nodes.
    pub fn upstream(&self) -> Option<SocketAddr> {
        let port = match self {
            Target::Native { http, clients: Clients::Json, .. } => http.port(),
            Target::Native { grpc, .. } => grpc.port(),
            Target::Redis(r) => r.port(),
            Target::Redlock(_) | Target::Cluster(_) => return None,
            Target::Etcd(e) => e.port(),
            Target::Zk(z) => z.port(),
            Target::Postgres(p) => p.port(),
        };
        Some(SocketAddr::from(([127, 0, 0, 1], port)))
    }

    /// The URL through a proxy at `proxy` instead of the upstream address.
    pub fn url_via(&self, proxy: SocketAddr) -> String {
        match self.upstream() {
            Some(up) => self.url().replacen(&format!("127.0.0.1:{}", up.port()), &proxy.to_string(), 1),
            None => self.url(),
        }
    }

    /// The admin HTTP address of the native server.
    pub fn admin(&self) -> Option<SocketAddr> {
        match self {
            Target::Native { http, .. } => Some(*http),
            _ => None,
        }
    }

    /// The service's process id (the first node's for Redlock and a group).
    pub fn pid(&self) -> Option<u32> {
        match self {
            Target::Native { server, .. } => server.pid(),
            Target::Cluster(c) => c.nodes.first().and_then(|n| n.server.pid()),
            Target::Redis(r) => Some(r.pid()),
            Target::Redlock(rs) => rs.first().map(RedisServer::pid),
            Target::Etcd(e) => Some(e.pid()),
            Target::Zk(z) => Some(z.pid()),
            Target::Postgres(p) => Some(p.pid()),
        }
    }

    /// SIGKILLs a peer engine and starts it again on the same port and data
    /// (PostgreSQL: an immediate shutdown, its crash). The native server is
    /// killed and restarted by the K4 nemesis itself (failpoints, power loss).
    pub async fn kill_and_restart_peer(&mut self, which: usize) -> anyhow::Result<()> {
        // The testkit's start and restart block while the engine boots.
        tokio::task::block_in_place(|| match self {
            Target::Redis(r) => r.kill_and_restart(),
            Target::Redlock(rs) => {
                let n = rs.len();
                rs[which % n].kill_and_restart()
            }
            Target::Etcd(e) => e.kill_and_restart(),
            Target::Zk(z) => z.kill_and_restart(),
            Target::Postgres(p) => p.crash_and_restart(),
            Target::Native { .. } | Target::Cluster(_) => {}
        });
        Ok(())
    }
}

async fn blocking<T>(f: impl FnOnce() -> T) -> anyhow::Result<T> {
    // The testkit panics with an install hint when an engine is missing.
    let r = tokio::task::block_in_place(|| std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)));
    r.map_err(|p| {
        let msg = p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()));
        anyhow::anyhow!("cannot start the engine: {}", msg.unwrap_or_default())
    })
}
