//! `fencelock-protogen` generates the tonic/prost code of `fencelock-proto`
//! from its `.proto` files, with protox (pure Rust: no `protoc`), into
//! `crates/fencelock-proto/src/gen/`, and writes the record of what it read
//! and wrote (`src/gen/CHECKSUMS`) that the crate's build script checks.
//!
//! Run it after changing a `.proto` file and commit what it writes:
//! `cargo run -p fencelock-protogen`. With `--check` it changes nothing and
//! fails if the checked-in code differs from what it would write.
//!
//! It is a tool, not a build step: protox, prost-build and their
//! dependencies were about a tenth of every build of the workspace (and of
//! the docs and the Python package's), for code that changes only with the
//! `.proto` files. CI leaves it out of its build.

#[allow(dead_code)] // `parse_checksums` is the build script's
mod checksums {
    include!("../../fencelock-proto/checksums.rs");
}

use checksums::{checksum_line, CHECKSUMS_PATH, CLIENT_AND_PEER_PROTOS, ETCD_PROTOS, GEN_DIR, LOG_PROTOS};
use std::collections::BTreeMap;
use std::error::Error;
use std::path::{Path, PathBuf};

fn main() -> Result<(), Box<dyn Error>> {
    let check = match std::env::args().nth(1).as_deref() {
        None => false,
        Some("--check") => true,
        Some(other) => return Err(format!("unknown argument {other:?} (the only one is --check)").into()),
    };
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fencelock-proto");
    let files = generate(&crate_dir)?;
    if check {
        return compare(&crate_dir, &files);
    }
    let gen_dir = crate_dir.join(GEN_DIR);
    for old in std::fs::read_dir(&gen_dir)? {
        let old = old?.path();
        if old.extension().is_some_and(|e| e == "rs") {
            std::fs::remove_file(old)?;
        }
    }
    for (path, bytes) in &files {
        std::fs::write(crate_dir.join(path), bytes)?;
        println!("wrote crates/fencelock-proto/{path}");
    }
    Ok(())
}

/// Every file this tool writes, by its path relative to the crate: the
/// generated modules and the record of checksums.
fn generate(crate_dir: &Path) -> Result<BTreeMap<String, Vec<u8>>, Box<dyn Error>> {
    let out = std::env::temp_dir().join(format!("fencelock-protogen-{}", std::process::id()));
    std::fs::create_dir_all(&out)?;
    let result = generate_into(crate_dir, &out);
    let _ = std::fs::remove_dir_all(&out);
    result
}

fn generate_into(crate_dir: &Path, out: &Path) -> Result<BTreeMap<String, Vec<u8>>, Box<dyn Error>> {
    let include = crate_dir.join("proto");
    let abs = |protos: &[&str]| -> Vec<PathBuf> { protos.iter().map(|p| crate_dir.join(p)).collect() };
    let fds = protox::compile(abs(&CLIENT_AND_PEER_PROTOS), [&include])?;
    tonic_prost_build::configure().build_server(true).build_client(true).out_dir(out).compile_fds(fds)?;
    let fds = protox::compile(abs(&LOG_PROTOS), [&include])?;
    tonic_prost_build::configure().build_server(false).build_client(false).out_dir(out).compile_fds(fds)?;
    let fds = protox::compile(abs(&ETCD_PROTOS), [&include])?;
    tonic_prost_build::configure().build_server(false).build_client(true).out_dir(out).compile_fds(fds)?;

    let mut files = BTreeMap::new();
    let mut record =
        String::from("# Written by `cargo run -p fencelock-protogen`; checked by build.rs. Do not edit.\n");
    for proto in CLIENT_AND_PEER_PROTOS.iter().chain(&LOG_PROTOS).chain(&ETCD_PROTOS) {
        record.push_str(&checksum_line(proto, &std::fs::read(crate_dir.join(proto))?));
    }
    let mut generated: Vec<PathBuf> = std::fs::read_dir(out)?.map(|e| e.map(|e| e.path())).collect::<Result<_, _>>()?;
    generated.sort();
    for file in generated {
        let name = file.file_name().and_then(|n| n.to_str()).ok_or("a generated file's name is not UTF-8")?;
        let path = format!("{GEN_DIR}/{name}");
        let bytes = std::fs::read(&file)?;
        record.push_str(&checksum_line(&path, &bytes));
        files.insert(path, bytes);
    }
    files.insert(CHECKSUMS_PATH.to_string(), record.into_bytes());
    Ok(files)
}

/// `--check`: the checked-in files are exactly what [`generate`] made.
fn compare(crate_dir: &Path, files: &BTreeMap<String, Vec<u8>>) -> Result<(), Box<dyn Error>> {
    let mut differ = Vec::new();
    for (path, bytes) in files {
        if std::fs::read(crate_dir.join(path)).ok().as_ref() != Some(bytes) {
            differ.push(path.clone());
        }
    }
    if differ.is_empty() {
        println!("the generated code in crates/fencelock-proto/{GEN_DIR} is up to date");
        return Ok(());
    }
    Err(format!("out of date: {} (run `cargo run -p fencelock-protogen`)", differ.join(", ")).into())
}
