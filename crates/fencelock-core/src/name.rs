//! Lock names: 1–512 bytes of UTF-8 without control characters.
//!
//! A name is shared, not copied: [`LockName`] is a reference-counted string, so
//! the engine's lock map key, the holds of a lease, its remembered replies and
//! its timers all point at the one allocation made when the acquire was
//! validated (issue 19 §4). Its serialized form is the plain string.

use std::{borrow::Borrow, fmt, sync::Arc};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Longest lock name, in bytes of UTF-8.
pub const MAX_LOCK_NAME_BYTES: usize = 512;

/// A validated lock name. Construct with [`LockName::new`]; deserialization does
/// not re-validate, because names only enter the log after validation. Clones
/// share the string; equality, order and hash are the string's.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LockName(Arc<str>);

/// Why a string is not a lock name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[non_exhaustive]
pub enum NameError {
    #[error("name is empty")]
    Empty,
    #[error("name is {len} bytes long (at most {MAX_LOCK_NAME_BYTES})")]
    TooLong { len: usize },
    #[error("name contains a control character at byte {at}")]
    ControlChar { at: usize },
}

impl LockName {
    /// Validate `name`: 1..=512 bytes, no control characters (Unicode `Cc`).
    pub fn new(name: impl Into<String>) -> Result<Self, NameError> {
        let name = name.into();
        if name.is_empty() {
            return Err(NameError::Empty);
        }
        if name.len() > MAX_LOCK_NAME_BYTES {
            return Err(NameError::TooLong { len: name.len() });
        }
        if let Some((at, _)) = name.char_indices().find(|(_, c)| c.is_control()) {
            return Err(NameError::ControlChar { at });
        }
        Ok(Self(name.into()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Serialize for LockName {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for LockName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(|s| Self(s.into()))
    }
}

impl Borrow<str> for LockName {
    fn borrow(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_ordinary_and_boundary_names() {
        assert!(LockName::new("nightly-report").is_ok());
        assert!(LockName::new("a").is_ok());
        assert!(LockName::new("x".repeat(512)).is_ok());
        assert!(LockName::new("ünïcödé/ключ/鍵").is_ok());
    }

    #[test]
    fn rejects_empty_long_and_control_names() {
        assert_eq!(LockName::new(""), Err(NameError::Empty));
        assert_eq!(LockName::new("x".repeat(513)), Err(NameError::TooLong { len: 513 }));
        assert_eq!(LockName::new("ab\ncd"), Err(NameError::ControlChar { at: 2 }));
        assert_eq!(LockName::new("\u{7f}"), Err(NameError::ControlChar { at: 0 }));
        // 511 ASCII bytes + a 2-byte char = 513 bytes: too long even though 512 chars.
        let s = format!("{}é", "x".repeat(511));
        assert_eq!(LockName::new(s), Err(NameError::TooLong { len: 513 }));
    }

    /// The serialized form is the plain string, both ways (snapshots and log
    /// entries written before names were shared still read).
    #[test]
    fn serializes_as_a_plain_string() {
        let name = LockName::new("jobs/nightly").unwrap();
        assert_eq!(serde_json::to_string(&name).unwrap(), "\"jobs/nightly\"");
        assert_eq!(serde_json::from_str::<LockName>("\"jobs/nightly\"").unwrap(), name);
    }

    /// A clone shares the string instead of copying it.
    #[test]
    fn clones_share_the_string() {
        let name = LockName::new("shared").unwrap();
        let copy = name.clone();
        assert!(std::ptr::eq(name.as_str(), copy.as_str()));
    }
}
