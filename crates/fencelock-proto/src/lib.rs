//! `fencelock-proto` holds the wire format of fencelock: the `fencelock.v1` client
//! API, the `fencelock.raft.v1` peer API and `fencelock.log.v1` (the storage
//! format of Raft log entries), as `.proto` files under `proto/` and the
//! tonic/prost code generated from them at build time (with protox, so no
//! `protoc` is needed). The `.proto` files document every field.

/// The client API (`proto/fencelock/v1/lock.proto`).
pub mod v1 {
    tonic::include_proto!("fencelock.v1");
}

/// The Raft peer API (`proto/fencelock/v1/raft.proto`).
pub mod raft {
    tonic::include_proto!("fencelock.raft.v1");
}

/// The storage format of Raft log entries (`proto/fencelock/v1/log.proto`):
/// not an API, see the file.
pub mod log {
    tonic::include_proto!("fencelock.log.v1");
}

/// A client-only subset of etcd's v3 API (`proto/etcd/`): the KV, Watch and
/// Lease services with the messages and field numbers of etcd's own
/// `rpc.proto` and `kv.proto`, for the etcd backend of the `fencelock` crate.
pub mod etcd {
    /// etcd's `etcdserverpb` package (`proto/etcd/rpc.proto`).
    pub mod etcdserverpb {
        tonic::include_proto!("etcdserverpb");
    }

    /// etcd's `mvccpb` package (`proto/etcd/kv.proto`).
    pub mod mvccpb {
        tonic::include_proto!("mvccpb");
    }
}
