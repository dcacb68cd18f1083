//! Holder values as text: [`encode`] for whoever shows one (the admin HTTP
//! JSON, the CLI), and the serde helper that writes bytes (holder values) as one standard base64 string, so a
//! 4 KiB value takes about 5.5 KB of JSON in log entries and snapshots rather
//! than an array of up to 16 KB of numbers.

use base64::{engine::general_purpose::STANDARD, Engine as _};
use serde::{Deserialize, Deserializer, Serializer};

pub(crate) fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&STANDARD.encode(bytes))
}

pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
    let text = String::deserialize(d)?;
    STANDARD.decode(text).map_err(serde::de::Error::custom)
}

/// `bytes` as standard base64 (with padding).
pub fn encode(bytes: &[u8]) -> String {
    STANDARD.encode(bytes)
}
