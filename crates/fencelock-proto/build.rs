//! Checks that the generated code in `src/gen/` is what `fencelock-protogen`
//! made from the `.proto` files under `proto/` as they are now (the record
//! in `src/gen/CHECKSUMS`). The code is generated ahead of time, not here:
//! protox, prost-build and their dependencies were about a tenth of the
//! workspace's build. A `.proto` changed without regenerating, or a
//! generated file edited by hand, fails the build and says what to run.

#[allow(dead_code)] // `checksum_line` is the generator's
mod checksums {
    include!("checksums.rs");
}
use checksums::*;

fn main() {
    for path in [CHECKSUMS_PATH, GEN_DIR, "proto", "checksums.rs"] {
        println!("cargo:rerun-if-changed={path}");
    }
    if let Err(e) = check() {
        eprintln!("error: {e}");
        eprintln!("the generated code in crates/fencelock-proto/src/gen/ does not match its .proto files;");
        eprintln!("regenerate it with `cargo run -p fencelock-protogen` and commit both");
        std::process::exit(1);
    }
}

fn check() -> Result<(), String> {
    let text = std::fs::read_to_string(CHECKSUMS_PATH).map_err(|e| format!("{CHECKSUMS_PATH}: {e}"))?;
    let entries = parse_checksums(&text)?;
    let protos = CLIENT_AND_PEER_PROTOS.iter().chain(&LOG_PROTOS).chain(&ETCD_PROTOS);
    for proto in protos {
        if !entries.iter().any(|(_, path)| path == proto) {
            return Err(format!("{proto} is not in {CHECKSUMS_PATH}"));
        }
    }
    for (hash, path) in &entries {
        let bytes = std::fs::read(path).map_err(|e| format!("{path}: {e}"))?;
        if fnv1a64(&bytes) != *hash {
            return Err(format!("{path} changed since the code was generated"));
        }
    }
    Ok(())
}
