//! Server configuration. Every field has a `fencelock serve` flag and a
//! `FENCELOCK_…` environment variable (see the CLI).

use std::{collections::BTreeMap, net::SocketAddr, path::PathBuf, time::Duration};

// Where the Raft log's entries are kept: defined beside the log.
pub use crate::raft::log_store::LogEngine;
use crate::raft::Bootstrap;

/// How to run one fencelock node.
#[derive(Debug, Clone)]
pub struct Config {
    /// This node's id in the Raft group (≥ 1). A single node is a group of one.
    pub node_id: u64,
    /// Directory for the redb database (vote, snapshot, with `log = "redb"`
    /// the log) and the log's segments in `wal/`. Created if missing.
    pub data_dir: PathBuf,
    /// gRPC listen address (client API and Raft peer API).
    pub grpc_listen: SocketAddr,
    /// HTTP admin listen address (health, metrics, JSON).
    pub http_listen: SocketAddr,
    /// Address other members use to reach this node's gRPC port; defaults to the
    /// bound gRPC address.
    pub advertise: Option<String>,
    /// Serve Raft on a listener of its own at this address (the client port
    /// then serves clients only); `None`: peers use the client port.
    pub peer_listen: Option<SocketAddr>,
    /// Address other members use to reach the peer listener; defaults to its
    /// bound address (or this node's `--peers` entry's peer part).
    pub peer_advertise: Option<String>,
    /// How an empty node comes into a group.
    pub bootstrap: Bootstrap,
    /// Raft heartbeat interval.
    pub heartbeat: Duration,
    /// Raft election timeout range (min; max is twice this).
    pub election_timeout: Duration,
    /// Most commands the driver puts into one log entry.
    pub max_batch: usize,
    /// Most log writes the driver keeps in flight at once, so one fsync can
    /// cover several entries (1: one at a time). See [`crate::driver::core`].
    pub max_inflight_writes: usize,
    /// Take a snapshot after this many applied entries, or after as many as
    /// the state holds records if that is more (see
    /// [`crate::raft::snapshot_policy`]).
    pub snapshot_every: u64,
    /// What this node accepts of a snapshot a leader streams to it: the free
    /// space it keeps on the data dir's disk, and a bound (see
    /// [`crate::raft::snapshot_rx::Limits`]).
    pub snapshot_limits: crate::raft::snapshot_rx::Limits,
    /// Where the Raft log's entries are kept (`Segment` by default). A data
    /// dir whose log is in redb moves it into the segment log on its first
    /// start with `Segment` (see [`crate::raft::log_store::migrate`]); one in
    /// segments is refused by `Redb`.
    pub log: LogEngine,
    /// Watch events kept for watchers that resume (see `watching`).
    pub watch_history: usize,
    /// Locks whose metrics `/metrics` reports one by one, the busiest; the
    /// rest are summed (see `lock_metrics`). 0 to 10,000.
    pub lock_metrics_top: usize,
    /// A grant held this long by a lease still renewed counts as stuck.
    pub stuck_after: Duration,
    /// Start a new group even where the data dir is refused (empty, without a
    /// database or identity, another node's): a refused database is moved
    /// aside, never deleted. See [`crate::raft::identity`].
    pub force_new_cluster: bool,
    /// Limits on accepted connections, both ports (see [`crate::access::conn_limits`]).
    pub connections: crate::access::conn_limits::ConnLimits,
    /// TLS on both ports and between members (see [`crate::access::tls`]); `None`
    /// serves plaintext, which only a loopback address or [`Config::insecure`]
    /// allows.
    pub tls: Option<crate::access::tls::TlsFiles>,
    /// The auth file (see [`crate::access::auth`]): identities and their rules. `None`
    /// serves everyone, which only a loopback address or
    /// [`Config::insecure`] allows.
    pub auth_file: Option<PathBuf>,
    /// Serve without TLS or without authentication on a non-loopback address
    /// all the same.
    pub insecure: bool,
    /// Quotas per identity and global limits (see [`crate::access::quota`]).
    pub limits: crate::access::quota::Limits,
    /// Where the audit log goes (see `access::audit`); `None`: no audit log.
    pub audit_log: Option<PathBuf>,
    /// Peer id → the address this node dials that peer at, instead of the
    /// address in the membership (a proxy in between, e.g. one that can cut
    /// that one direction). Empty: the membership's addresses. No flag sets it.
    pub peer_routes: BTreeMap<u64, String>,
    /// The storage backend and hooks plugged into this node (see
    /// [`crate::seams`]); the default plugs nothing. No flag sets it.
    pub seams: crate::seams::Seams,
}

/// The most locks `/metrics` reports one by one.
pub const MAX_LOCK_METRICS_TOP: usize = 10_000;
/// The smallest watch history a node keeps (events).
const MIN_WATCH_HISTORY: usize = 16;
/// The largest (about 200 bytes and up per event in memory).
pub const MAX_WATCH_HISTORY: usize = 10_000_000;

impl Config {
    /// Defaults of `fencelock serve`: gRPC 127.0.0.1:7070, HTTP 127.0.0.1:7071,
    /// data in `./fencelock-data`.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Self {
            node_id: 1,
            data_dir: data_dir.into(),
            grpc_listen: SocketAddr::from(([127, 0, 0, 1], 7070)),
            http_listen: SocketAddr::from(([127, 0, 0, 1], 7071)),
            advertise: None,
            peer_listen: None,
            peer_advertise: None,
            bootstrap: Bootstrap::Single,
            heartbeat: Duration::from_millis(50),
            election_timeout: Duration::from_millis(150),
            max_batch: 4096,
            max_inflight_writes: crate::driver::core::DEFAULT_MAX_INFLIGHT,
            snapshot_every: 20_000,
            snapshot_limits: crate::raft::snapshot_rx::Limits::default(),
            log: LogEngine::default(),
            watch_history: crate::watching::hub::DEFAULT_HISTORY,
            lock_metrics_top: crate::lock_metrics::DEFAULT_TOP_K,
            stuck_after: crate::lock_metrics::DEFAULT_STUCK_AFTER,
            force_new_cluster: false,
            connections: crate::access::conn_limits::ConnLimits::default(),
            tls: None,
            auth_file: None,
            insecure: false,
            limits: crate::access::quota::Limits::default(),
            audit_log: None,
            peer_routes: BTreeMap::new(),
            seams: crate::seams::Seams::default(),
        }
    }

    /// Checks what the server cannot start with, and says why.
    pub fn validate(&self) -> Result<(), String> {
        if self.node_id == 0 {
            return Err("node ids start at 1".into());
        }
        if let Bootstrap::Peers(peers) = &self.bootstrap {
            if !peers.contains_key(&self.node_id) {
                let ids: Vec<String> = peers.keys().map(u64::to_string).collect();
                return Err(format!("node {} is not among the peers (ids {})", self.node_id, ids.join(", ")));
            }
            if peers.contains_key(&0) {
                return Err("node ids start at 1".into());
            }
        }
        self.validate_addresses()?;
        self.validate_exposure()?;
        if self.heartbeat.is_zero() || self.election_timeout <= self.heartbeat {
            return Err(format!(
                "the election timeout ({} ms) must be longer than the heartbeat ({} ms)",
                self.election_timeout.as_millis(),
                self.heartbeat.as_millis()
            ));
        }
        self.connections.validate()?;
        if !(MIN_WATCH_HISTORY..=MAX_WATCH_HISTORY).contains(&self.watch_history) {
            return Err(format!(
                "the watch history ({} events) must be {MIN_WATCH_HISTORY} to {MAX_WATCH_HISTORY} events",
                self.watch_history
            ));
        }
        if self.lock_metrics_top > MAX_LOCK_METRICS_TOP {
            return Err(format!(
                "--lock-metrics-top {} is more than {MAX_LOCK_METRICS_TOP} locks (each is a few series of /metrics)",
                self.lock_metrics_top
            ));
        }
        if self.stuck_after.is_zero() {
            return Err("--stuck-after must be above zero (every holder would be stuck)".into());
        }
        Ok(())
    }

    /// The address others are told to use must be one they can reach: a
    /// wildcard listen address needs `--advertise` (unless `--peers` names this
    /// node's address), and this node's `--peers` entry must be its address.
    fn validate_addresses(&self) -> Result<(), String> {
        let listen = self.grpc_listen;
        let raw = match &self.bootstrap {
            Bootstrap::Peers(peers) => peers.get(&self.node_id),
            _ => None,
        };
        let (entry, peer_entry_addr) = match raw.map(|e| peer_entry(e)) {
            Some((client, peer)) => (Some(client.to_string()), peer),
            None => (None, None),
        };
        if raw.is_some() && peer_entry_addr.is_some() != self.peer_listen.is_some() {
            return Err(format!(
                "node {}'s --peers entry {} does not match --peer-listen: a node with a peer port of its own is \
                 listed as CLIENT/PEER (and started with --peer-listen), one without as CLIENT",
                self.node_id,
                raw.map(String::as_str).unwrap_or_default()
            ));
        }
        if let Some(p) = self.peer_listen {
            if p.ip().is_unspecified() && self.peer_advertise.is_none() && peer_entry_addr.is_none() {
                return Err(format!(
                    "--peer-listen {p} is a wildcard address, which other nodes cannot use to reach this node: set \
                     --peer-advertise to the host:port they should use"
                ));
            }
        }
        if let (Some(peer), Some(pl)) = (peer_entry_addr, self.peer_listen) {
            let fits = match &self.peer_advertise {
                Some(adv) => adv == peer,
                None => names_listen_addr(peer, pl),
            };
            if !fits {
                return Err(format!(
                    "node {}'s --peers entry names {peer} for peers, which is not its --peer-listen {pl} (or \
                     --peer-advertise): the other nodes would send Raft messages there",
                    self.node_id
                ));
            }
        }
        let entry = entry.as_ref();
        if listen.ip().is_unspecified() && self.advertise.is_none() && entry.is_none() {
            return Err(format!(
                "--listen {listen} is a wildcard address, which other nodes and clients cannot use to reach \
                 this node: set --advertise to the host:port they should use"
            ));
        }
        match (entry, &self.advertise) {
            (Some(e), Some(a)) if e != a => Err(format!(
                "node {}'s --peers entry {e} is not its --advertise address {a}: the other nodes would use {e}",
                self.node_id
            )),
            (Some(e), None) if !names_listen_addr(e, listen) => Err(format!(
                "node {}'s --peers entry {e} is not its --listen address {listen}: fix the entry, or set \
                 --advertise {e} if that is how the others reach this node",
                self.node_id
            )),
            _ => Ok(()),
        }
    }

    /// Open doors only where nobody else can connect: a listener on an address
    /// other than loopback needs TLS and authentication, or `--insecure` to
    /// say it is meant.
    fn validate_exposure(&self) -> Result<(), String> {
        if self.insecure {
            return Ok(());
        }
        let peer = self.peer_listen.map(|p| ("--peer-listen", p));
        let exposed = [("--listen", self.grpc_listen), ("--http", self.http_listen)]
            .into_iter()
            .chain(peer)
            .find(|(_, a)| !a.ip().is_loopback());
        let Some((flag, addr)) = exposed else { return Ok(()) };
        if self.tls.is_none() {
            return Err(format!(
                "{flag} {addr} is reachable from other hosts and TLS is off: anyone there could read tokens, \
                 take and release locks and speak Raft to this node. Set --tls-cert, --tls-key and --tls-ca \
                 (fencelock certs init makes them), or pass --insecure if the network is yours alone"
            ));
        }
        if self.auth_file.is_none() {
            return Err(format!(
                "{flag} {addr} is reachable from other hosts and authentication is off: anyone there could \
                 take, release and revoke any lock. Set --auth-file (fencelock auth add-token writes one), \
                 or pass --insecure if the network is yours alone"
            ));
        }
        Ok(())
    }

    /// For tests: both listeners on free ports of 127.0.0.1.
    pub fn for_test(data_dir: impl Into<PathBuf>) -> Self {
        let mut c = Self::new(data_dir);
        c.grpc_listen = SocketAddr::from(([127, 0, 0, 1], 0));
        c.http_listen = SocketAddr::from(([127, 0, 0, 1], 0));
        c
    }
}

/// A `--peers` entry: `CLIENT` or `CLIENT/PEER` (a node with a peer port of
/// its own, `--peer-listen`): (client address, peer address).
pub fn peer_entry(entry: &str) -> (&str, Option<&str>) {
    match entry.split_once('/') {
        Some((client, peer)) => (client.trim(), Some(peer.trim())),
        None => (entry.trim(), None),
    }
}

/// `1=host:port,2=host:port,…` (`--peers`, and the same list in the config
/// file) → node id → entry. The one grammar of a peer list, for every binary
/// that starts a node (`fencelock serve`, the chaos and bench harnesses): ids
/// from 1, each once; an entry is `CLIENT` or `CLIENT/PEER` (see
/// [`peer_entry`]), each `host:port`. An error says which entry and why.
pub fn parse_peers(s: &str) -> Result<BTreeMap<u64, String>, String> {
    let mut peers = BTreeMap::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((id, addr)) = part.split_once('=') else {
            return Err(format!("peer {part:?}: expected id=host:port"));
        };
        let id: u64 = id.trim().parse().map_err(|_| format!("peer {part:?}: the id is not a number"))?;
        if id == 0 {
            return Err(format!("peer {part:?}: node ids start at 1"));
        }
        let addr = addr.trim();
        let (client, peer) = peer_entry(addr);
        for a in std::iter::once(client).chain(peer) {
            let port_ok = a.rsplit_once(':').is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok());
            if !port_ok || a.contains('/') {
                return Err(format!("peer {part:?}: {a:?} is not host:port (an entry is CLIENT or CLIENT/PEER)"));
            }
        }
        if peers.insert(id, addr.to_string()).is_some() {
            return Err(format!("peer id {id} is listed twice"));
        }
    }
    if peers.is_empty() {
        return Err("the peer list is empty; expected id=host:port,…".into());
    }
    Ok(peers)
}

/// Whether `entry` (`host:port` from `--peers`) can name a socket bound to
/// `listen`: the same port, and the same IP when both are IP literals and
/// `listen` is not a wildcard. A host name is not resolved.
fn names_listen_addr(entry: &str, listen: SocketAddr) -> bool {
    if let Ok(addr) = entry.parse::<SocketAddr>() {
        return addr.port() == listen.port() && (listen.ip().is_unspecified() || addr.ip() == listen.ip());
    }
    entry.rsplit_once(':').and_then(|(_, port)| port.parse::<u16>().ok()) == Some(listen.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rule: a log engine's setting is its name; the default is the segment
    /// log (issue 19 §2: it passed the chaos suite's node and group scenarios,
    /// see docs/safety.md); anything else is refused.
    #[test]
    fn log_engines_parse_by_name() {
        for engine in [LogEngine::Redb, LogEngine::Segment] {
            assert_eq!(engine.to_string().parse::<LogEngine>(), Ok(engine));
        }
        assert_eq!(Config::new("d").log, LogEngine::Segment);
        let err = "sqlite".parse::<LogEngine>().unwrap_err();
        assert!(err.contains("\"redb\" or \"segment\""), "{err}");
    }

    /// Rule: one peer-list grammar; a bad list says which entry and why.
    #[test]
    fn peers_parse_and_bad_ones_say_why() {
        let p = parse_peers("1=127.0.0.1:7070, 2=node-2:7070,3=[::1]:7070/[::1]:7073").unwrap();
        assert_eq!(p.len(), 3);
        assert_eq!(p[&2], "node-2:7070");
        assert_eq!(p[&3], "[::1]:7070/[::1]:7073");
        let err = |s: &str| parse_peers(s).unwrap_err();
        assert!(err("1=a:1,1=b:2").contains("twice"));
        assert!(err("0=a:1").contains("start at 1"));
        assert!(err("x=a:1").contains("not a number"));
        assert!(err("1=a").contains("not host:port"));
        assert!(err("2=").contains("not host:port"));
        assert!(err("1=http://a:1").contains("not host:port"));
        assert!(err("1=a:1/b").contains("not host:port"));
        assert!(err("1").contains("expected id=host:port"));
        assert!(err("").contains("empty"));
    }

    fn with_peers(entry: &str, peer_listen: Option<&str>) -> Config {
        let mut c = Config::new("d");
        c.grpc_listen = "127.0.0.1:7070".parse().unwrap();
        c.peer_listen = peer_listen.map(|p| p.parse().unwrap());
        c.bootstrap =
            Bootstrap::Peers(BTreeMap::from([(1, entry.to_string()), (2, "127.0.0.1:7170/127.0.0.1:7173".into())]));
        c
    }

    /// A node with a peer port is listed as CLIENT/PEER, one without as
    /// CLIENT, and the peer part names its --peer-listen; a mismatch says so.
    #[test]
    fn a_peers_entry_must_match_the_peer_listener() {
        assert_eq!(with_peers("127.0.0.1:7070/127.0.0.1:7073", Some("127.0.0.1:7073")).validate(), Ok(()));
        let e = with_peers("127.0.0.1:7070", Some("127.0.0.1:7073")).validate().unwrap_err();
        assert!(e.contains("does not match --peer-listen"), "{e}");
        let e = with_peers("127.0.0.1:7070/127.0.0.1:7073", None).validate().unwrap_err();
        assert!(e.contains("does not match --peer-listen"), "{e}");
        let e = with_peers("127.0.0.1:7070/127.0.0.1:7999", Some("127.0.0.1:7073")).validate().unwrap_err();
        assert!(e.contains("not its --peer-listen"), "{e}");
        assert_eq!(peer_entry(" a:1 / b:2 "), ("a:1", Some("b:2")));
        assert_eq!(peer_entry("a:1"), ("a:1", None));
    }

    /// A wildcard peer listener needs an address others can use.
    #[test]
    fn a_wildcard_peer_listener_needs_an_advertised_address() {
        let mut c = Config::for_test("d");
        c.peer_listen = Some("0.0.0.0:7073".parse().unwrap());
        c.insecure = true;
        assert!(c.validate().unwrap_err().contains("--peer-advertise"));
        c.peer_advertise = Some("10.0.0.1:7073".into());
        assert_eq!(c.validate(), Ok(()));
    }
}
