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
//! Equality, `Debug` and serde see only the input: the bytes are a cache of
//! it. Serde is transparent, so an entry in JSON (codec 1, the unary
//! `AppendEntries` call) reads and writes as the input alone, as before.

use bytes::Bytes;
use fencelock_core::Input;
use serde::{Deserialize, Serialize};

/// An engine input as a log entry's payload, with its codec-2 bytes when
/// known (see the module docs).
#[derive(Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub struct LogInput {
    input: Input,
    #[serde(skip)]
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
        Self { input, encoded: Some(encoded) }
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
        Self { input, encoded: None }
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
