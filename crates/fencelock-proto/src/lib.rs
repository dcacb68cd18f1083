//! `fencelock-proto` holds the wire format of fencelock: the `fencelock.v1` client
//! API, the `fencelock.raft.v1` peer API and `fencelock.log.v1` (the storage
//! format of Raft log entries), as `.proto` files under `proto/` and the
//! tonic/prost code generated from them with protox (no `protoc` needed) by
//! `fencelock-protogen`, checked in under `src/gen/`. The build script
//! refuses generated code that no longer matches its `.proto` files. The
//! `.proto` files document every field.

/// The client API (`proto/fencelock/v1/lock.proto`).
pub mod v1 {
    include!("gen/fencelock.v1.rs");
}

pub mod framing;

/// The Raft peer API (`proto/fencelock/v1/raft.proto`).
pub mod raft {
    include!("gen/fencelock.raft.v1.rs");
}

/// The storage format of Raft log entries (`proto/fencelock/v1/log.proto`):
/// not an API, see the file.
pub mod log {
    include!("gen/fencelock.log.v1.rs");
}

/// A client-only subset of etcd's v3 API (`proto/etcd/`): the KV, Watch and
/// Lease services with the messages and field numbers of etcd's own
/// `rpc.proto` and `kv.proto`, for the etcd backend of the `fencelock` crate.
pub mod etcd {
    /// etcd's `etcdserverpb` package (`proto/etcd/rpc.proto`).
    pub mod etcdserverpb {
        include!("gen/etcdserverpb.rs");
    }

    /// etcd's `mvccpb` package (`proto/etcd/kv.proto`).
    pub mod mvccpb {
        include!("gen/mvccpb.rs");
    }
}
