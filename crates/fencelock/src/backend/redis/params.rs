//! The URL parameters of the Redis and Redlock backends: `prefix=`, the
//! database number in the path, and the refusal of unknown parameters.
//!
//! Where it sits: read once by [`super::RedisBackend::connect`] and
//! [`super::super::redlock::RedlockBackend`]'s connect; the TLS parameters
//! (`ca=`, `cert=`, `key=`) are read by [`crate::backend::tls`].

use crate::backend::BackendUrl;
use crate::error::Error;

/// The key prefix when the URL gives none.
pub const DEFAULT_PREFIX: &str = "fencelock";

/// Refuses query parameters other than `known` (a typo would otherwise be
/// ignored silently).
pub(in crate::backend) fn check_params(url: &BackendUrl, known: &[&str]) -> Result<(), Error> {
    match url.params.iter().find(|(k, _)| !known.contains(&k.as_str())) {
        Some((k, _)) => Err(Error::InvalidArgument(format!(
            "{}: unknown parameter {k:?} for the {} backend (known: {})",
            url,
            url.scheme,
            known.join(", ")
        ))),
        None => Ok(()),
    }
}

/// The `prefix=` parameter (default [`DEFAULT_PREFIX`]): not empty, no
/// control characters.
pub(in crate::backend) fn prefix(url: &BackendUrl) -> Result<String, Error> {
    let prefix = url.param("prefix").unwrap_or(DEFAULT_PREFIX);
    if prefix.is_empty() || prefix.chars().any(char::is_control) {
        return Err(Error::InvalidArgument(format!("{url}: prefix must be non-empty text")));
    }
    Ok(prefix.to_string())
}

/// The database number in the URL's path (default 0).
pub(super) fn db_number(url: &BackendUrl) -> Result<u32, Error> {
    if url.path.is_empty() {
        return Ok(0);
    }
    url.path
        .parse()
        .map_err(|_| Error::InvalidArgument(format!("{}: the path must be a database number, not {:?}", url, url.path)))
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::backend::redis::Conn;

    #[test]
    fn urls_are_checked() {
        let url = |u: &str| BackendUrl::parse(u).unwrap();
        assert!(check_params(&url("redis://h?prefix=a&durable=1"), &["prefix", "durable"]).is_ok());
        let err = check_params(&url("redis://h?durabel=1"), &["prefix", "durable"]).unwrap_err();
        assert!(matches!(&err, Error::InvalidArgument(m) if m.contains("durabel")), "{err}");
        assert_eq!(prefix(&url("redis://h")).unwrap(), "fencelock");
        assert_eq!(prefix(&url("redis://h?prefix=app")).unwrap(), "app");
        assert!(prefix(&url("redis://h?prefix=")).is_err());
        assert_eq!(db_number(&url("redis://h/3")).unwrap(), 3);
        assert!(db_number(&url("redis://h/x")).is_err());
        assert!(Conn::new(&url("redis://h/x"), "h", 1, None).is_err());
        assert_eq!(Conn::new(&url("redis://[::1]:7/2"), "::1", 7, None).unwrap().addr, "[::1]:7");
    }
}
