//! Server configuration. Every field has a `fencelock serve` flag and a
//! `FENCELOCK_…` environment variable (see the CLI).

use std::{collections::BTreeMap, net::SocketAddr, path::PathBuf, time::Duration};

/// How a node whose data dir is empty comes into a group. A node with data
/// ignores it: its membership is in its log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bootstrap {
    /// A new group of one (the default).
    Single,
    /// A new group of these voters, node id → gRPC address, or
    /// `CLIENT/PEER` for a node with its own peer port (see [`peer_entry`]);
    /// this node must be one of them. Start every listed node with the same
    /// list.
    Peers(BTreeMap<u64, String>),
    /// No group of its own: wait to be added to an existing group (`fencelock
    /// cluster add`).
    Join,
}

/// How to run one fencelock node.
#[derive(Debug, Clone)]
pub struct Config {
    /// This node's id in the Raft group (≥ 1). A single node is a group of one.
    pub node_id: u64,
    /// Directory for the redb database (log, vote, snapshot). Created if missing.
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
    /// Take a snapshot after this many applied entries.
    pub snapshot_every: u64,
    /// Start a new group even where the data dir is refused (empty, without a
    /// database or identity, another node's): a refused database is moved
    /// aside, never deleted. See [`crate::raft::identity`].
    pub force_new_cluster: bool,
    /// Limits on accepted connections, both ports (see [`crate::conn_limits`]).
    pub connections: crate::conn_limits::ConnLimits,
    /// TLS on both ports and between members (see [`crate::tls`]); `None`
    /// serves plaintext, which only a loopback address or [`Config::insecure`]
    /// allows.
    pub tls: Option<crate::tls::TlsFiles>,
    /// The auth file (see [`crate::auth`]): identities and their rules. `None`
    /// serves everyone, which only a loopback address or
    /// [`Config::insecure`] allows.
    pub auth_file: Option<PathBuf>,
    /// Serve without TLS or without authentication on a non-loopback address
    /// all the same.
    pub insecure: bool,
    /// Quotas per identity and global limits (see [`crate::quota`]).
    pub limits: crate::quota::Limits,
    /// Where the audit log goes (see [`crate::audit`]); `None`: no audit log.
    pub audit_log: Option<PathBuf>,
    /// Peer id → the address this node dials that peer at, instead of the
    /// address in the membership (a proxy in between, e.g. one that can cut
    /// that one direction). Empty: the membership's addresses. No flag sets it.
    pub peer_routes: BTreeMap<u64, String>,
    /// The storage backend and hooks plugged into this node (see
    /// [`crate::seams`]); the default plugs nothing. No flag sets it.
    pub seams: crate::seams::Seams,
}

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
            snapshot_every: 20_000,
            force_new_cluster: false,
            connections: crate::conn_limits::ConnLimits::default(),
            tls: None,
            auth_file: None,
            insecure: false,
            limits: crate::quota::Limits::default(),
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
