//! Reading an HTTP request's JSON body, as untrusted input: bounded in size
//! ([`MAX_BODY_BYTES`]) and in time ([`BODY_READ_TIMEOUT`]), decoded into a
//! type that refuses unknown fields, and refused with a 400 that names the
//! field at fault, before anything is proposed or written. And the JSON forms
//! the HTTP API shares: 64-bit ids and tokens as decimal strings ([`Id`]),
//! bytes as text or base64 ([`value_bytes`]).
//!
//! Where it sits: the extractor [`JsonBody`] of the HTTP API's handlers
//! ([`super::leases`], [`super::locks`]).

use std::time::Duration;

use axum::extract::{FromRequest, Request};
use base64::Engine as _;
use fencelock_core::ErrorCode;
use http_body_util::{BodyExt, Limited};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::errors::ApiError;

/// The largest request body read: room for the largest acquire (16 names
/// of 512 bytes, a 4 KiB value in base64, an identity) several times over.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// How long a request body may take to arrive once its headers are in (the
/// headers have their own timeout, the connection's).
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// A request body decoded as `T` (an empty body reads as `{}`).
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, _state: &S) -> Result<Self, ApiError> {
        let body = Limited::new(req.into_body(), MAX_BODY_BYTES);
        let bytes = match tokio::time::timeout(BODY_READ_TIMEOUT, body.collect()).await {
            Err(_) => {
                let secs = BODY_READ_TIMEOUT.as_secs();
                return Err(ApiError::new(
                    ErrorCode::InvalidArgument,
                    format!("the body did not arrive within {secs} s"),
                ));
            }
            Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
                let message = format!("the body is larger than {MAX_BODY_BYTES} bytes");
                return Err(ApiError::new(ErrorCode::PayloadTooLarge, message));
            }
            Ok(Err(e)) => return Err(ApiError::new(ErrorCode::InvalidArgument, format!("reading the body: {e}"))),
            Ok(Ok(collected)) => collected.to_bytes(),
        };
        decode(if bytes.iter().all(u8::is_ascii_whitespace) { b"{}" } else { &bytes }).map(JsonBody)
    }
}

/// `bytes` as `T`, or a 400 naming the field at fault.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let message = inner.to_string();
        let field = unknown_field(&message).or((path != ".").then_some(path));
        match (field, inner.classify()) {
            (_, serde_json::error::Category::Syntax | serde_json::error::Category::Eof) => {
                ApiError::new(ErrorCode::InvalidArgument, format!("the body is not JSON: {message}"))
            }
            (Some(field), _) => ApiError::field(&field, format!("{field}: {message}")),
            (None, _) => ApiError::new(ErrorCode::InvalidArgument, message),
        }
    })
}

/// The name in serde's "unknown field `x`, expected …".
fn unknown_field(message: &str) -> Option<String> {
    let rest = message.strip_prefix("unknown field `")?;
    rest.split('`').next().map(str::to_string)
}

/// A 64-bit id or token. Written as a decimal string (a JSON number above
/// 2^53 loses its low digits in JavaScript and in jq 1.6, and tokens are
/// far above it); read from a string or a number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Id(pub u64);

impl Serialize for Id {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Id {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(IdVisitor)
    }
}

struct IdVisitor;

impl serde::de::Visitor<'_> for IdVisitor {
    type Value = Id;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a decimal string or a non-negative integer")
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Id, E> {
        Ok(Id(v))
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Id, E> {
        v.parse().map(Id).map_err(|_| E::custom(format!("{v:?} is not a decimal 64-bit number")))
    }
}

/// Bytes given as `value` (UTF-8 text) or `value_base64` (standard base64):
/// at most one of the two; neither is empty.
pub fn value_bytes(value: Option<String>, value_base64: Option<String>) -> Result<Vec<u8>, ApiError> {
    match (value, value_base64) {
        (Some(_), Some(_)) => Err(ApiError::field("value", "give value (text) or value_base64, not both")),
        (Some(text), None) => Ok(text.into_bytes()),
        (None, Some(b64)) => base64::engine::general_purpose::STANDARD
            .decode(b64.as_bytes())
            .map_err(|e| ApiError::field("value_base64", format!("value_base64 is not standard base64: {e}"))),
        (None, None) => Ok(Vec::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Req {
        #[allow(dead_code)]
        lease_id: Id,
        #[serde(default)]
        #[allow(dead_code)]
        ttl_ms: u64,
    }

    /// Ids read from strings and numbers, and are written as strings.
    #[test]
    fn ids_read_both_forms_and_write_strings() {
        let a: Id = serde_json::from_str("\"18446744073709551615\"").unwrap();
        let b: Id = serde_json::from_str("42").unwrap();
        assert_eq!((a, b), (Id(u64::MAX), Id(42)));
        assert_eq!(serde_json::to_string(&Id(7)).unwrap(), "\"7\"");
        assert!(serde_json::from_str::<Id>("\"-1\"").is_err());
        assert!(serde_json::from_str::<Id>("1.5").is_err());
    }

    /// A 400 names the field: a wrong type, an unknown field, a missing one;
    /// a body that is not JSON says so.
    #[test]
    fn refusals_name_the_field() {
        let e = decode::<Req>(br#"{"lease_id": "7", "ttl_ms": "soon"}"#).unwrap_err();
        assert_eq!((e.code, e.body()["error"]["field"].as_str()), (ErrorCode::InvalidArgument, Some("ttl_ms")));
        let e = decode::<Req>(br#"{"lease_id": 7, "tll_ms": 5}"#).unwrap_err();
        assert_eq!(e.body()["error"]["field"], "tll_ms");
        let e = decode::<Req>(br#"{}"#).unwrap_err();
        assert!(e.message.contains("lease_id"), "{}", e.message);
        let e = decode::<Req>(b"lease_id=7").unwrap_err();
        assert!(e.message.starts_with("the body is not JSON"), "{}", e.message);
    }

    /// A value is text or base64, never both.
    #[test]
    fn values_are_text_or_base64() {
        assert_eq!(value_bytes(Some("10.0.0.5".into()), None).unwrap(), b"10.0.0.5");
        assert_eq!(value_bytes(None, Some("AAE=".into())).unwrap(), [0, 1]);
        assert_eq!(value_bytes(None, None).unwrap(), b"");
        let both = value_bytes(Some("a".into()), Some("YQ==".into())).unwrap_err();
        assert_eq!(both.body()["error"]["field"], "value");
        let bad = value_bytes(None, Some("*".into())).unwrap_err();
        assert_eq!(bad.body()["error"]["field"], "value_base64");
    }
}
