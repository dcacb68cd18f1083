//! The URL of the etcd backend: `etcd://h:p[,h:p…][?prefix=P]` (TLS files
//! are read by [`crate::backend::tls`]); no path, no other parameter.
//!
//! Where it sits: read once by [`super::EtcdBackend::connect`].

use super::keys::encode;
use crate::backend::{BackendUrl, Scheme};
use crate::error::Error;

/// The key prefix of every lock when the URL names none.
pub const DEFAULT_PREFIX: &str = "fencelock";

/// The prefix of `url` (encoded, with its `/`), after checking the URL.
pub(super) fn parse_url(url: &BackendUrl) -> Result<Vec<u8>, Error> {
    let bad = |why: String| Error::InvalidArgument(format!("{url}: {why}"));
    if url.scheme != Scheme::Etcd {
        return Err(bad(format!("not an etcd url (scheme {})", url.scheme)));
    }
    if !url.path.is_empty() {
        return Err(bad("an etcd url has no path (use ?prefix=)".into()));
    }
    if let Some((key, _)) = url.params.iter().find(|(k, _)| !["prefix", "ca", "cert", "key"].contains(&k.as_str())) {
        return Err(bad(format!("unknown parameter {key:?} (etcd takes prefix, ca, cert, key)")));
    }
    let prefix = url.param("prefix").unwrap_or(DEFAULT_PREFIX);
    if prefix.is_empty() || prefix.chars().any(char::is_control) {
        return Err(bad("the prefix must be non-empty, without control characters".into()));
    }
    let mut out = Vec::new();
    encode(prefix, &mut out);
    out.push(b'/');
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefix_of(url: &str) -> Result<String, Error> {
        parse_url(&BackendUrl::parse(url)?).map(|p| String::from_utf8(p).unwrap())
    }

    #[test]
    fn urls_give_the_prefix_or_say_why_not() {
        assert_eq!(prefix_of("etcd://h:1").unwrap(), "fencelock/");
        assert_eq!(prefix_of("etcd://h:1,g:2?prefix=app/locks").unwrap(), "app%2Flocks/");
        for bad in ["etcd://h/x", "etcd://h?prefix=", "etcd://h?ttl=3", "redis://h"] {
            assert!(matches!(prefix_of(bad), Err(Error::InvalidArgument(_))), "{bad}");
        }
    }
}
