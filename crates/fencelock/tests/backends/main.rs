//! One conformance suite ([`suite`]), run against every backend on real
//! servers started on free ports of 127.0.0.1: one module per backend, each
//! a [`suite::Target`] plus the tests of what only that backend does.

mod suite;

#[cfg(feature = "etcd")]
mod etcd;
mod json;
mod native;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "redis")]
mod redis;
#[cfg(feature = "redis")]
mod redlock;
#[cfg(feature = "etcd")]
mod secure_etcd;
#[cfg(feature = "postgres")]
mod secure_postgres;
#[cfg(feature = "redis")]
mod secure_redis;
#[cfg(feature = "zookeeper")]
mod secure_zookeeper;
#[cfg(feature = "zookeeper")]
mod zookeeper;
