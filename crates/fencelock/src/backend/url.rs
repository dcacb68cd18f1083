//! Backend URLs: `scheme://[user[:password]@]host[:port][,host[:port]…][/path][?k=v&…]`.
//!
//! Where it sits: the one parser of server URLs. [`super::connect`] parses the
//! URL here and hands the parts to the backend's `connect`;
//! [`crate::ClientBuilder::connect`] parses a fencelock URL here too, so the
//! library and the CLI (`--server`) take the same URLs (docs/guide/cli.md, "Server
//! URLs" documents them). The parser is deliberately small: hosts, one path,
//! and query parameters; PostgreSQL gets the URL as written (its driver parses
//! it again, with every option it knows).
//!
//! # Transport security and credentials
//! One grammar for every backend that speaks TLS: the scheme says TLS, the
//! query names the files, the userinfo carries the credentials.
//!
//! | backend | TLS | files | credentials |
//! |---|---|---|---|
//! | fencelock | `fencelock+tls://` (or `https://`) | `ca=` (required), `cert=`, `key=` | `token=` (a bearer token) |
//! | Redis | `rediss://` (or `redis+tls://`) | `ca=`, `cert=`, `key=` | `user:password@` (ACL user) or `:password@` |
//! | Redlock | `redlock+tls://` | `ca=`, `cert=`, `key=` | as Redis, the same on every node |
//! | etcd | `etcd+tls://` | `ca=`, `cert=`, `key=` | `user:password@` (etcd's auth) |
//! | ZooKeeper | — | — | `user:password@` (`digest` scheme) |
//! | PostgreSQL | `sslmode=` (libpq's) | `sslrootcert=` | `user:password@` |
//!
//! * `ca=/path/ca.pem`: the CAs (PEM) the server's certificate must chain to;
//!   without it, the system's (`/etc/ssl/certs`). The host name of the URL
//!   must be named by the certificate (DNS name or IP address).
//! * `cert=` and `key=` (PEM, together): a client certificate for servers that
//!   ask for one.
//! * A user or password may be percent-encoded (`%40` for `@`).
//! * `token=` (fencelock only): the bearer token sent with every call (see
//!   [`crate::ClientBuilder::token`]), percent-encoded if it holds anything
//!   but letters, digits and `-._~` (the tokens a fencelock server issues
//!   never do). Another backend refuses it: its credentials are the userinfo.
//!
//! # Other fencelock options
//! * `transport=stream` (the default) or `transport=unary`: how the client
//!   sends acquires, releases and lease calls, on one shared stream per server
//!   or as one gRPC call each (see [`crate::ClientBuilder::transport`], which
//!   takes precedence).
//!
//! A password or token never leaves this module in text: [`BackendUrl`]'s
//! `Display` and `Debug`, and every error made from a URL, show it as `***`.

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
    /// `fencelock+json://` (`fencelock+json+tls://`): a fencelock node's
    /// HTTP/JSON API.
    Json,
}

impl Scheme {
    fn from_str(s: &str) -> Option<Scheme> {
        Self::with_tls(s).map(|(scheme, _)| scheme)
    }

    /// The scheme named by `s`, and whether the name asks for TLS.
    fn with_tls(s: &str) -> Option<(Scheme, bool)> {
        Some(match s {
            "fencelock" | "http" => (Scheme::Native, false),
            "fencelock+tls" | "https" => (Scheme::Native, true),
            "redis" => (Scheme::Redis, false),
            "rediss" | "redis+tls" => (Scheme::Redis, true),
            "redlock" => (Scheme::Redlock, false),
            "redlock+tls" => (Scheme::Redlock, true),
            "etcd" => (Scheme::Etcd, false),
            "etcd+tls" => (Scheme::Etcd, true),
            "zk" | "zookeeper" => (Scheme::ZooKeeper, false),
            "postgres" | "postgresql" => (Scheme::Postgres, false),
            "fencelock+json" => (Scheme::Json, false),
            "fencelock+json+tls" => (Scheme::Json, true),
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
            Scheme::Json => 7071,
        }
    }

    /// The cargo feature of the `fencelock` crate that compiles this backend in.
    pub fn feature(self) -> &'static str {
        match self {
            Scheme::Native | Scheme::Json => "(always on)",
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
            Scheme::Json => "fencelock-json",
        })
    }
}

/// A parsed backend URL. Its `Display` and `Debug` hide the password and the
/// `token=`.
#[derive(Clone, PartialEq, Eq)]
pub struct BackendUrl {
    /// The URL as given, password and token included: never print it (print
    /// the `BackendUrl`, which hides them).
    pub raw: String,
    pub scheme: Scheme,
    /// The scheme asks for TLS (`fencelock+tls`, `https`, `rediss`,
    /// `redis+tls`, `redlock+tls`, `etcd+tls`); PostgreSQL says it with `sslmode=` instead.
    pub tls: bool,
    /// `user[:password]` before the `@`, if any, as written (percent-encoded).
    pub userinfo: Option<String>,
    /// One or more `(host, port)`, in the order given.
    pub hosts: Vec<(String, u16)>,
    /// The path without its leading `/` (a Redis db number, a ZooKeeper chroot,
    /// a PostgreSQL database); empty if none.
    pub path: String,
    /// Query parameters in order, as written (`token=`'s value included:
    /// never print them; the `Debug` of the `BackendUrl` hides it).
    pub params: Vec<(String, String)>,
}

impl BackendUrl {
    /// Parses `url`. [`Error::InvalidArgument`] with the reason if it is not a
    /// backend URL.
    pub fn parse(url: &str) -> Result<BackendUrl, Error> {
        let shown = redact(url);
        let bad = |why: &str| {
            Error::InvalidArgument(format!(
                "bad server url {shown:?}: {why} (expected e.g. fencelock://127.0.0.1:7070, redis://host:6379, redlock://h1:6379,h2:6379,h3:6379, etcd://host:2379, zk://host:2181, postgres://user@host/db)"
            ))
        };
        let (scheme_str, rest) = url.split_once("://").ok_or_else(|| bad("no scheme"))?;
        let (scheme, tls) = Scheme::with_tls(&scheme_str.to_ascii_lowercase()).ok_or_else(|| bad("unknown scheme"))?;
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
        Ok(BackendUrl { raw: url.to_string(), scheme, tls, userinfo, hosts, path: path.to_string(), params })
    }

    /// The user of the userinfo (percent-decoded), if one is given and not empty.
    pub fn user(&self) -> Option<String> {
        let info = self.userinfo.as_deref()?;
        let user = info.split_once(':').map_or(info, |(u, _)| u);
        (!user.is_empty()).then(|| percent_decode(user))
    }

    /// The password of the userinfo (percent-decoded), if one is given.
    pub fn password(&self) -> Option<String> {
        let (_, password) = self.userinfo.as_deref()?.split_once(':')?;
        Some(percent_decode(password))
    }

    /// The URL as given, with the password and the `token=` (if any)
    /// replaced by `***`.
    pub fn redacted(&self) -> String {
        redact(&self.raw)
    }

    /// The bearer token of `token=` (percent-decoded), if one is given: for a
    /// fencelock server, which [`crate::Client::connect`] hands to
    /// [`crate::ClientBuilder::token`]. Not checked here (the builder checks
    /// it); never print it.
    pub fn auth_token(&self) -> Option<String> {
        self.param(TOKEN_PARAM).map(percent_decode)
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
            Some(v) => Err(Error::InvalidArgument(format!("{self}: {key}={v:?} is not a boolean"))),
        }
    }

    /// Exactly one host, or [`Error::InvalidArgument`].
    pub fn single_host(&self) -> Result<(&str, u16), Error> {
        match self.hosts.as_slice() {
            [(h, p)] => Ok((h, *p)),
            _ => Err(Error::InvalidArgument(format!("{self}: the {} backend takes one host", self.scheme))),
        }
    }

    /// `http://host:port` (`https://` with TLS) of every host, comma-separated:
    /// the members of a fencelock group for the native client
    /// (`fencelock://a:7070,b:7070,c:7070`).
    pub fn native_endpoints(&self) -> String {
        self.native_endpoint_list().join(",")
    }

    /// [`native_endpoints`](Self::native_endpoints) as a list.
    pub(crate) fn native_endpoint_list(&self) -> Vec<String> {
        let scheme = if self.tls { "https" } else { "http" };
        let host = |h: &str| {
            if h.contains(':') {
                format!("[{h}]")
            } else {
                h.to_string()
            }
        };
        self.hosts.iter().map(|(h, p)| format!("{scheme}://{}:{p}", host(h))).collect()
    }
}

impl fmt::Display for BackendUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl fmt::Debug for BackendUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let userinfo =
            self.userinfo.as_ref().map(|_| (self.user().unwrap_or_default(), self.password().map(|_| "***")));
        let params: Vec<(&str, &str)> = self
            .params
            .iter()
            .map(|(k, v)| (k.as_str(), if is_secret_param(k) { "***" } else { v.as_str() }))
            .collect();
        f.debug_struct("BackendUrl")
            .field("raw", &self.redacted())
            .field("scheme", &self.scheme)
            .field("tls", &self.tls)
            .field("userinfo", &userinfo)
            .field("hosts", &self.hosts)
            .field("path", &self.path)
            .field("params", &params)
            .finish()
    }
}

/// The query parameter that carries a fencelock bearer token.
pub(crate) const TOKEN_PARAM: &str = "token";

/// Is the value of query parameter `key` a secret, hidden when a URL is
/// shown? (`Token=` too: a misspelt key is not read as the token, but may
/// still hold one.)
fn is_secret_param(key: &str) -> bool {
    key.eq_ignore_ascii_case(TOKEN_PARAM)
}

/// `url` with the password of its userinfo and the value of its `token=`
/// replaced by `***` (a URL without them as it is). Works on any text, parsed
/// or not.
pub(crate) fn redact(url: &str) -> String {
    match url.split_once('?') {
        Some((head, query)) => format!("{}?{}", redact_password(head), redact_query(query)),
        None => redact_password(url),
    }
}

/// A query with the values of its secret parameters replaced by `***`.
fn redact_query(query: &str) -> String {
    let hide = |pair: &str| match pair.split_once('=') {
        Some((k, _)) if is_secret_param(k) => format!("{k}=***"),
        _ => pair.to_string(),
    };
    query.split('&').map(hide).collect::<Vec<_>>().join("&")
}

/// A URL without its query, with the password of its userinfo replaced by `***`.
fn redact_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let Some((userinfo, hosts)) = authority.rsplit_once('@') else {
        return url.to_string();
    };
    match userinfo.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***@{hosts}{tail}"),
        None => url.to_string(),
    }
}

/// `%XX` escapes decoded (an escape that is not two hex digits is kept as it
/// is); the result is read as UTF-8, lossily.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
        match (bytes[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `a:1,http://b:2` → `a:1,b:2`: each member of a list may repeat the scheme
/// (`http://a:7070,http://b:7070`, as `Client::connect` documents it), as long
/// as it names the same backend.
fn strip_repeated_schemes(rest: &str, scheme: Scheme) -> Result<String, String> {
    let mut parts = Vec::new();
    for part in rest.split(',') {
        let listed =
            part.split_once("://").and_then(|(s, tail)| Some((Scheme::from_str(&s.to_ascii_lowercase())?, tail)));
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

    /// Issue 15: the TLS schemes, and credentials taken apart and decoded.
    #[test]
    fn tls_schemes_and_credentials() {
        for (url, scheme, tls) in [
            ("rediss://h", Scheme::Redis, true),
            ("redis+tls://h", Scheme::Redis, true),
            ("redis://h", Scheme::Redis, false),
            ("redlock+tls://a,b,c", Scheme::Redlock, true),
            ("etcd+tls://h", Scheme::Etcd, true),
            ("etcd://h", Scheme::Etcd, false),
        ] {
            let u = BackendUrl::parse(url).unwrap();
            assert_eq!((u.scheme, u.tls), (scheme, tls), "{url}");
        }
        assert_eq!(BackendUrl::parse("rediss://h").unwrap().hosts[0].1, 6379);
        let u = BackendUrl::parse("rediss://al%40ice:p%3Aw%2F@h:1?ca=/x").unwrap();
        assert_eq!((u.user().as_deref(), u.password().as_deref()), (Some("al@ice"), Some("p:w/")));
        let u = BackendUrl::parse("redis://:secret@h").unwrap();
        assert_eq!((u.user(), u.password().as_deref()), (None, Some("secret")));
        let u = BackendUrl::parse("zk://bob@h").unwrap();
        assert_eq!((u.user().as_deref(), u.password()), (Some("bob"), None));
    }

    /// Rule: `token=` is kept as written by the parser (percent-decoded by
    /// `auth_token`), and hidden in Display, Debug, `redacted()` and every parse
    /// error, like a password; the other parameters stay visible.
    #[test]
    fn tokens_are_kept_and_never_shown() {
        let secret = "flt_0123abcd_c2VrcmV0c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0c2Vj";
        let u = BackendUrl::parse(&format!("fencelock+tls://a:7070,b:7070?ca=/ca.pem&token={secret}")).unwrap();
        assert_eq!(u.auth_token().as_deref(), Some(secret));
        assert_eq!(u.param("ca"), Some("/ca.pem"));
        assert_eq!(u.native_endpoints(), "https://a:7070,https://b:7070");
        assert_eq!(u.to_string(), "fencelock+tls://a:7070,b:7070?ca=/ca.pem&token=***");
        assert_eq!(u.redacted(), u.to_string());
        let debug = format!("{u:?}");
        assert!(!debug.contains(secret) && debug.contains("/ca.pem"), "{debug}");
        let with_pw = BackendUrl::parse(&format!("http://u:pw@h?token={secret}&x=1")).unwrap();
        assert_eq!(with_pw.to_string(), "http://u:***@h?token=***&x=1");
        assert_eq!(BackendUrl::parse("http://h?token=a%20b").unwrap().auth_token().as_deref(), Some("a b"));
        assert_eq!(BackendUrl::parse("http://h").unwrap().auth_token(), None);
        for bad in [format!("fencelock://h:x?token={secret}"), format!("h:7070?token={secret}")] {
            let err = BackendUrl::parse(&bad).unwrap_err().to_string();
            assert!(!err.contains(secret) && err.contains("token=***"), "{err}");
        }
        assert_eq!(redact(&format!("h?Token={secret}&TOKEN={secret}")), "h?Token=***&TOKEN=***");
    }

    /// Issue 15: a password appears in no Display, Debug or parse error of a URL.
    #[test]
    fn passwords_are_never_shown() {
        let u = BackendUrl::parse("rediss://alice:hunter2@h:1/0?ca=/x").unwrap();
        assert_eq!(u.to_string(), "rediss://alice:***@h:1/0?ca=/x");
        let debug = format!("{u:?}");
        assert!(!debug.contains("hunter2") && debug.contains("alice"), "{debug}");
        assert!(!u.flag("ca", false).unwrap_err().to_string().contains("hunter2"));
        for bad in ["redis://alice:hunter2@h:x", "mysql://alice:hunter2@h", "redis://alice:hunter2@"] {
            let err = BackendUrl::parse(bad).unwrap_err().to_string();
            assert!(!err.contains("hunter2") && err.contains("alice:***@"), "{err}");
        }
        assert_eq!(redact("postgres://u:p@w@h/db?x=@"), "postgres://u:***@h/db?x=@");
        assert_eq!(redact("redis://h/a@b"), "redis://h/a@b");
    }
}
