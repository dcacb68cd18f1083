//! `fencelock-proto` holds the wire format of fencelock: the `fencelock.v1` client
//! API and the `fencelock.raft.v1` peer API, as `.proto` files under `proto/` and
//! the tonic/prost code generated from them at build time (with protox, so no
//! `protoc` is needed). The `.proto` files document every field.

/// The client API (`proto/fencelock/v1/lock.proto`).
pub mod v1 {
    tonic::include_proto!("fencelock.v1");
}

/// The Raft peer API (`proto/fencelock/v1/raft.proto`).
pub mod raft {
    tonic::include_proto!("fencelock.raft.v1");
}
