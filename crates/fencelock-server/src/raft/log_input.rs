//! What a Raft log entry carries for the engine: its [`Input`], and that
//! input's codec-2 bytes once they exist (openraft's `D`, see
//! [`super::TypeConfig`]).
//!
//! Where it sits: between openraft and the entry codec (`codec.rs`). The
//! driver proposes a bare input; the log store encodes it once, when it
//! appends it, and keeps the bytes with the entry it holds in memory. What
//! is read from there (to apply it, to send it to a follower) is a clone that
//! shares them, so the leader sends each follower the bytes it wrote rather
//! than encoding the entry again per follower. A follower decodes a received
//! entry and keeps the bytes it decoded with it, so its log writes them as
//! they came instead of encoding the entry it just decoded.
//!
//! Why the bytes travel inside the entry and not in a cache beside it: they
//! are only ever the encoding of the input they are kept with (made from it,
//! or it was decoded from them), so no lookup can pair an entry with another
//! entry's bytes: not a forged message's, not a deposed leader's.
//!
//! The input itself is shared, not copied, when an entry is cloned: openraft
//! clones every entry it reads from the log (to apply it, and once per
//! follower it sends it to), and a batch's commands each own their strings.
//!
//! Equality, `Debug` and serde see only the input: the bytes are a cache of
//! it. An entry in JSON (codec 1, the unary `AppendEntries` call) reads and
//! writes as the input alone, as before.

use std::sync::Arc;

use bytes::Bytes;
use fencelock_core::Input;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// An engine input as a log entry's payload, with its codec-2 bytes when
/// known (see the module docs).
#[derive(Clone)]
pub struct LogInput {
    input: Arc<Input>,
    encoded: Option<Bytes>,
}

impl LogInput {
    /// The engine's input.
    pub fn input(&self) -> &Input {
        &self.input
    }

    /// `input` with `encoded`, which must be its codec-2 bytes (the codec's
    /// to call: it made them from the input, or the input from them).
    pub(crate) fn with_encoded(input: Input, encoded: Bytes) -> Self {
        Self { input: Arc::new(input), encoded: Some(encoded) }
    }

    /// The input's codec-2 bytes, if known.
    pub(crate) fn encoded(&self) -> Option<&Bytes> {
        self.encoded.as_ref()
    }

    /// Keeps `encoded`, the input's codec-2 bytes (see [`Self::with_encoded`]).
    pub(crate) fn keep_encoded(&mut self, encoded: Bytes) {
        self.encoded = Some(encoded);
    }
}

impl From<Input> for LogInput {
    fn from(input: Input) -> Self {
        Self { input: Arc::new(input), encoded: None }
    }
}

impl Serialize for LogInput {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.input.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for LogInput {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Input::deserialize(deserializer).map(Self::from)
    }
}

impl PartialEq for LogInput {
    fn eq(&self, other: &Self) -> bool {
        self.input == other.input
    }
}

impl Eq for LogInput {}

impl std::fmt::Debug for LogInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.input.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A clone shares the input, not a copy of its commands: openraft clones
    /// every entry it reads from the log.
    #[test]
    fn a_clone_shares_the_input() {
        let a = LogInput::from(Input::leader_start(1));
        let b = a.clone();
        assert!(std::ptr::eq(a.input(), b.input()));
    }

    /// Serde and equality see the input alone: its JSON is the input's, as
    /// before there were bytes to keep, and reads back without them.
    #[test]
    fn serde_and_equality_see_the_input_alone() {
        let input = Input::Batch { now: 3, cmds: Vec::new() };
        let kept = LogInput::with_encoded(input.clone(), Bytes::from_static(b"\x12\x02\x08\x03"));
        let json = serde_json::to_string(&kept).unwrap();
        assert_eq!(json, serde_json::to_string(&input).unwrap());
        let back: LogInput = serde_json::from_str(&json).unwrap();
        assert_eq!(back.input(), &input);
        assert!(back.encoded().is_none());
        assert_eq!(back, kept);
    }
}
