//! Random identifiers that tell clients apart: a Redis waiter's ticket, a
//! PostgreSQL lease-table instance, a ZooKeeper node's nonce.
//!
//! Where it sits: under the backends, which put these into the shared lock
//! service as the proof of who holds or waits. They come from the operating
//! system's random source (ring's `SystemRandom`, already linked for TLS), not
//! from `fastrand`, whose per-thread generator is seeded from the time and the
//! thread id only: two processes that start at the same instant could draw the
//! same ticket, and the second would then be answered as the holder of the
//! first one's grant (both ran `fencelock run` at once, with token 1, in one CI
//! run on Redis).

use ring::rand::{SecureRandom, SystemRandom};

/// 128 random bits from the operating system.
///
/// Panics only if the OS has no random source at all (ring's `fill` fails
/// only then), which no supported platform lacks.
pub(crate) fn u128() -> u128 {
    let mut bytes = [0u8; 16];
    SystemRandom::new().fill(&mut bytes).expect("the operating system's random source");
    u128::from_le_bytes(bytes)
}

/// 64 random bits from the operating system (see [`u128`]).
pub(crate) fn u64() -> u64 {
    u128() as u64
}

#[cfg(test)]
mod tests {
    /// Many draws, none equal (a time-seeded generator in two processes is
    /// what this replaces; within one process, equal draws would mean a
    /// broken source).
    #[test]
    fn draws_differ() {
        let mut seen: Vec<u128> = (0..1000).map(|_| super::u128()).collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), 1000);
    }
}
