//! Backend URLs: `scheme://[user[:password]@]host[:port][,host[:port]…][/path][?k=v&…]`.
//!
//! Where it sits: [`super::connect`] parses the URL here and hands the parts to
//! the backend's `connect`. The parser is deliberately small: hosts, one path,
//! and query parameters; PostgreSQL gets the URL as written (its driver parses
//! it again, with every option it knows).

use std::fmt;

use crate::error::Error;

/// Which backend a URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scheme {
    /// `fencelock://` or `http://`: the fencelock server.
    Native,
    /// `redis://`: one Redis server.
    Redis,
    /// `redlock://`: a majority of independent Redis servers.
    Redlock,
    /// `etcd://`: an etcd cluster (v3 API).
    Etcd,
    /// `zk://` or `zookeeper://`: a ZooKeeper ensemble.
    ZooKeeper,
    /// `postgres://` or `postgresql://`: a PostgreSQL database.
    Postgres,
}

impl Scheme {
    fn from_str(s: &str) -> Option<Scheme> {
        Some(match s {
            "fencelock" | "http" => Scheme::Native,
            "redis" => Scheme::Redis,
            "redlock" => Scheme::Redlock,
            "etcd" => Scheme::Etcd,
            "zk" | "zookeeper" => Scheme::ZooKeeper,
            "postgres" | "postgresql" => Scheme::Postgres,
            _ => return None,
        })
    }

    /// The port used when a host has none.
    pub fn default_port(self) -> u16 {
        match self {
            Scheme::Native => 7070,
            Scheme::Redis | Scheme::Redlock => 6379,
            Scheme::Etcd => 2379,
            Scheme::ZooKeeper => 2181,
            Scheme::Postgres => 5432,
        }
    }

    /// The cargo feature of the `fencelock` crate that compiles this backend in.
    pub fn feature(self) -> &'static str {
        match self {
            Scheme::Native => "(always on)",
            Scheme::Redis | Scheme::Redlock => "redis",
            Scheme::Etcd => "etcd",
            Scheme::ZooKeeper => "zookeeper",
            Scheme::Postgres => "postgres",
        }
    }
}

impl fmt::Display for Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Scheme::Native => "fencelock",
            Scheme::Redis => "redis",
            Scheme::Redlock => "redlock",
            Scheme::Etcd => "etcd",
            Scheme::ZooKeeper => "zk",
            Scheme::Postgres => "postgres",
        })
    }
}

/// A parsed backend URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendUrl {
    /// The URL as given.
    pub raw: String,
    pub scheme: Scheme,
    /// `user[:password]` before the `@`, if any.
    pub userinfo: Option<String>,
    /// One or more `(host, port)`, in the order given.
    pub hosts: Vec<(String, u16)>,
    /// The path without its leading `/` (a Redis db number, a ZooKeeper chroot,
    /// a PostgreSQL database); empty if none.
    pub path: String,
    /// Query parameters in order.
    pub params: Vec<(String, String)>,
}

impl BackendUrl {
    /// Parses `url`. [`Error::InvalidArgument`] with the reason if it is not a
    /// backend URL.
    pub fn parse(url: &str) -> Result<BackendUrl, Error> {
        let bad = |why: &str| {
            Error::InvalidArgument(format!(
                "bad server url {url:?}: {why} (expected e.g. fencelock://127.0.0.1:7070, redis://host:6379, redlock://h1:6379,h2:6379,h3:6379, etcd://host:2379, zk://host:2181, postgres://user@host/db)"
            ))
        };
        let (scheme_str, rest) = url.split_once("://").ok_or_else(|| bad("no scheme"))?;
        let scheme = Scheme::from_str(&scheme_str.to_ascii_lowercase()).ok_or_else(|| bad("unknown scheme"))?;
        let rest = strip_repeated_schemes(rest, scheme).map_err(|why| bad(&why))?;
        let rest = rest.as_str();
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        let (authority, path) = match rest.split_once('/') {
            Some((a, p)) => (a, p.trim_end_matches('/')),
            None => (rest, ""),
        };
        let (userinfo, hostlist) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u.to_string()), h),
            None => (None, authority),
        };
        let mut hosts = Vec::new();
        for part in hostlist.split(',') {
            hosts.push(parse_host(part, scheme.default_port()).map_err(|why| bad(&why))?);
        }
        let mut params = Vec::new();
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            params.push((k.to_string(), v.to_string()));
        }
        Ok(BackendUrl { raw: url.to_string(), scheme, userinfo, hosts, path: path.to_string(), params })
    }

    /// The value of query parameter `key`, if given.
    pub fn param(&self, key: &str) -> Option<&str> {
        self.params.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    /// A boolean query parameter: absent is `default`; `true/1/yes/on` and
    /// `false/0/no/off`, else [`Error::InvalidArgument`].
    pub fn flag(&self, key: &str, default: bool) -> Result<bool, Error> {
        match self.param(key) {
            None => Ok(default),
            Some("true" | "1" | "yes" | "on" | "") => Ok(true),
            Some("false" | "0" | "no" | "off") => Ok(false),
            Some(v) => Err(Error::InvalidArgument(format!("{}: {key}={v:?} is not a boolean", self.raw))),
        }
    }

    /// Exactly one host, or [`Error::InvalidArgument`].
    pub fn single_host(&self) -> Result<(&str, u16), Error> {
        match self.hosts.as_slice() {
            [(h, p)] => Ok((h, *p)),
            _ => Err(Error::InvalidArgument(format!("{}: the {} backend takes one host", self.raw, self.scheme))),
        }
    }

    /// `http://host:port` of every host, comma-separated: the members of a
    /// fencelock group for the native client (`fencelock://a:7070,b:7070,c:7070`).
    pub fn native_endpoints(&self) -> String {
        let host = |h: &str| if h.contains(':') { format!("[{h}]") } else { h.to_string() };
        self.hosts.iter().map(|(h, p)| format!("http://{}:{p}", host(h))).collect::<Vec<_>>().join(",")
    }
}

/// `a:1,http://b:2` → `a:1,b:2`: each member of a list may repeat the scheme
/// (`http://a:7070,http://b:7070`, as `Client::connect` documents it), as long
/// as it names the same backend.
fn strip_repeated_schemes(rest: &str, scheme: Scheme) -> Result<String, String> {
    let mut parts = Vec::new();
    for part in rest.split(',') {
        let listed = part.split_once("://").and_then(|(s, tail)| Some((Scheme::from_str(&s.to_ascii_lowercase())?, tail)));
        match listed {
            Some((other, _)) if other != scheme => {
                return Err(format!("a server list takes one scheme, not both {scheme} and {other}"));
            }
            Some((_, tail)) => parts.push(tail),
            None => parts.push(part),
        }
    }
    Ok(parts.join(","))
}

fn parse_host(part: &str, default_port: u16) -> Result<(String, u16), String> {
    if part.is_empty() {
        return Err("empty host".into());
    }
    // [v6]:port
    if let Some(rest) = part.strip_prefix('[') {
        let (host, after) = rest.split_once(']').ok_or("unclosed [")?;
        let port = match after.strip_prefix(':') {
            Some(p) => p.parse().map_err(|_| format!("bad port {p:?}"))?,
            None if after.is_empty() => default_port,
            None => return Err(format!("junk after ]: {after:?}")),
        };
        return Ok((host.to_string(), port));
    }
    match part.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() => {
            let port: u16 = port.parse().map_err(|_| format!("bad port {port:?}"))?;
            if port == 0 {
                return Err("port 0".into());
            }
            Ok((host.to_string(), port))
        }
        Some(_) => Err(format!("no host in {part:?}")),
        None => Ok((part.to_string(), default_port)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 16: the list form `Client::connect` documents parses for the CLI too.
    #[test]
    fn a_list_may_repeat_its_scheme_but_not_mix_schemes() {
        let u = BackendUrl::parse("http://a:7070,http://b:7071,c").unwrap();
        assert_eq!(u.scheme, Scheme::Native);
        assert_eq!(u.hosts, vec![("a".into(), 7070), ("b".into(), 7071), ("c".into(), 7070)]);
        let u = BackendUrl::parse("fencelock://a:7070,http://b:7070").unwrap();
        assert_eq!(u.native_endpoints(), "http://a:7070,http://b:7070");
        let err = BackendUrl::parse("fencelock://a:1,redis://b:2").unwrap_err().to_string();
        assert!(err.contains("one scheme, not both fencelock and redis"), "{err}");
    }

    #[test]
    fn every_scheme_parses_with_default_ports() {
        let cases = [
            ("fencelock://127.0.0.1:7070", Scheme::Native, 7070),
            ("http://localhost", Scheme::Native, 7070),
            ("redis://127.0.0.1", Scheme::Redis, 6379),
            ("etcd://h:2380", Scheme::Etcd, 2380),
            ("zk://h", Scheme::ZooKeeper, 2181),
            ("zookeeper://h:1", Scheme::ZooKeeper, 1),
            ("postgresql://u@h/db", Scheme::Postgres, 5432),
        ];
        for (url, scheme, port) in cases {
            let u = BackendUrl::parse(url).unwrap();
            assert_eq!((u.scheme, u.hosts[0].1), (scheme, port), "{url}");
        }
    }

    #[test]
    fn host_lists_paths_users_and_params() {
        let u = BackendUrl::parse("redlock://a:1,b,[::1]:3/2?prefix=x&durable").unwrap();
        assert_eq!(u.hosts, vec![("a".into(), 1), ("b".into(), 6379), ("::1".into(), 3)]);
        assert_eq!(u.path, "2");
        assert_eq!(u.param("prefix"), Some("x"));
        assert_eq!(u.flag("durable", false), Ok(true));
        assert_eq!(u.flag("other", false), Ok(false));
        let pg = BackendUrl::parse("postgres://me:pw@db:6432/locks?mode=advisory").unwrap();
        assert_eq!(pg.userinfo.as_deref(), Some("me:pw"));
        assert_eq!((pg.path.as_str(), pg.param("mode")), ("locks", Some("advisory")));
        assert_eq!(BackendUrl::parse("http://h:9").unwrap().native_endpoints(), "http://h:9");
        let group = BackendUrl::parse("fencelock://a:7070,b,[::1]:7171").unwrap();
        assert_eq!(group.native_endpoints(), "http://a:7070,http://b:7070,http://[::1]:7171");
    }

    #[test]
    fn malformed_urls_say_why() {
        for (url, why) in [
            ("127.0.0.1:7070", "no scheme"),
            ("mysql://h", "unknown scheme"),
            ("redis://h:x", "bad port"),
            ("redis://h:0", "port 0"),
            ("redlock://a,,b", "empty host"),
            ("redis://:80", "no host"),
        ] {
            let err = BackendUrl::parse(url).unwrap_err();
            assert!(matches!(&err, Error::InvalidArgument(m) if m.contains(why)), "{url}: {err}");
        }
        let u = BackendUrl::parse("redis://h?durable=maybe").unwrap();
        assert!(u.flag("durable", false).is_err());
        assert!(BackendUrl::parse("redlock://a,b").unwrap().single_host().is_err());
    }
}
