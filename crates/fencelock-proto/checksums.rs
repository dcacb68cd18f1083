// The one definition of `src/gen/CHECKSUMS`, the record that ties the
// checked-in generated code to the `.proto` files it was generated from.
// Included (not a crate: the build script takes no dependencies) by
// `build.rs`, which checks the record on every build, and by
// `fencelock-protogen`, which writes it.
//
// Each line is `<fnv1a-64 in hex> <path relative to the crate>`. FNV-1a is
// no defence against anyone choosing a collision; it catches the mistakes
// it is for: a `.proto` edited and not regenerated, a generated file edited
// by hand.

/// The record's path, relative to the `fencelock-proto` crate.
pub const CHECKSUMS_PATH: &str = "src/gen/CHECKSUMS";

/// The directory the generated code is written to, relative to the crate.
pub const GEN_DIR: &str = "src/gen";

/// The `.proto` files, relative to the crate, grouped by how they are generated.
pub const CLIENT_AND_PEER_PROTOS: [&str; 2] =
    ["proto/fencelock/v1/lock.proto", "proto/fencelock/v1/raft.proto"];
/// The storage format of Raft log entries: messages only.
pub const LOG_PROTOS: [&str; 1] = ["proto/fencelock/v1/log.proto"];
/// The subset of etcd's v3 API that the etcd backend uses: clients only.
pub const ETCD_PROTOS: [&str; 2] = ["proto/etcd/kv.proto", "proto/etcd/rpc.proto"];

/// 64-bit FNV-1a of `bytes`.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        hash ^= u64::from(*b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// One line of the record.
pub fn checksum_line(path: &str, bytes: &[u8]) -> String {
    format!("{:016x} {path}\n", fnv1a64(bytes))
}

/// The record's entries: `(hash, path)`, or the first line that is not one.
pub fn parse_checksums(text: &str) -> Result<Vec<(u64, String)>, String> {
    let mut entries = Vec::new();
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
        let parsed = line
            .split_once(' ')
            .and_then(|(hash, path)| Some((u64::from_str_radix(hash, 16).ok()?, path.to_string())));
        entries.push(parsed.ok_or_else(|| format!("not a checksum line: {line:?}"))?);
    }
    Ok(entries)
}
