//! Generates the tonic/prost code from `proto/` with protox (pure Rust: no `protoc`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["proto/fencelock/v1/lock.proto", "proto/fencelock/v1/raft.proto"];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure().build_server(true).build_client(true).compile_fds(fds)?;

    // The storage format of Raft log entries: messages only.
    let log = ["proto/fencelock/v1/log.proto"];
    for p in log {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(log, ["proto"])?;
    tonic_prost_build::configure().build_server(false).build_client(false).compile_fds(fds)?;

    // The subset of etcd's v3 API that the etcd backend uses: clients only.
    let etcd = ["proto/etcd/kv.proto", "proto/etcd/rpc.proto"];
    for p in etcd {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(etcd, ["proto"])?;
    tonic_prost_build::configure().build_server(false).build_client(true).compile_fds(fds)?;
    Ok(())
}
