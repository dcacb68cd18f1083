//! The integration tests of fencelock-fence, one binary: the shared
//! conformance suite run against every `Fence`, then each implementation's
//! own durability and atomicity tests, then the storage server (plaintext and
//! TLS). The suite's read-write-lock body takes its tokens from a real
//! fencelock server.
//!
//! PostgreSQL and Redis are real servers started by `support` (install them
//! with `scripts/install-test-deps.sh`; without them these tests fail).

#[path = "../support/mod.rs"]
mod support;

mod conformance;
mod file_fence;
mod pg_fence;
mod redis_fence;
mod shared_lock;
mod storage_server;
mod storage_tls;

use std::any::Any;
use std::sync::Arc;

use fencelock_fence::{Fence, FileFence, MemoryFence, PgFence, RedisFence};

/// A fence under test: 16 handles on it (separate connections where the
/// store has connections) and whatever must live as long as they do.
pub struct Subject {
    pub fences: Vec<Arc<dyn Fence>>,
    _guard: Box<dyn Any + Send>,
}

impl Subject {
    pub fn one(&self) -> &dyn Fence {
        &*self.fences[0]
    }
}

async fn memory() -> Subject {
    let fence: Arc<dyn Fence> = Arc::new(MemoryFence::new());
    Subject { fences: vec![fence; 16], _guard: Box::new(()) }
}

async fn file() -> Subject {
    let dir = tempfile::tempdir().unwrap();
    let fence: Arc<dyn Fence> = Arc::new(FileFence::open(dir.path()).await.unwrap());
    Subject { fences: vec![fence; 16], _guard: Box::new(dir) }
}

async fn postgres() -> Subject {
    let server = tokio::task::spawn_blocking(support::PgServer::start).await.unwrap();
    let mut fences: Vec<Arc<dyn Fence>> = Vec::new();
    for _ in 0..16 {
        fences.push(Arc::new(PgFence::connect(&server.conn_str()).await.unwrap()));
    }
    Subject { fences, _guard: Box::new(server) }
}

async fn redis() -> Subject {
    let server = tokio::task::spawn_blocking(support::RedisServer::start).await.unwrap();
    let mut fences: Vec<Arc<dyn Fence>> = Vec::new();
    for _ in 0..16 {
        fences.push(Arc::new(RedisFence::connect(&server.url()).await.unwrap()));
    }
    Subject { fences, _guard: Box::new(server) }
}

/// The conformance suite as one test per case, for one implementation.
macro_rules! conformance_suite {
    ($module:ident, $name:ident) => {
        mod $module {
            use super::conformance as suite;

            #[tokio::test]
            async fn exact_cases() {
                suite::exact_cases(super::$name().await.one(), "t").await;
            }

            #[tokio::test]
            async fn large_tokens_are_exact() {
                suite::large_tokens_are_exact(super::$name().await.one(), "t").await;
            }

            #[tokio::test]
            async fn keys_are_independent() {
                suite::keys_are_independent(super::$name().await.one(), "t").await;
            }

            #[tokio::test]
            async fn invalid_input_is_refused() {
                suite::invalid_input_is_refused(super::$name().await.one(), "t").await;
            }

            #[tokio::test]
            async fn fenced_read_stops_an_older_write() {
                suite::fenced_read_stops_an_older_write(super::$name().await.one(), "t").await;
            }

            #[tokio::test]
            async fn reads_and_writes_exact_cases() {
                suite::reads_and_writes_exact_cases(super::$name().await.one(), "t").await;
            }

            #[tokio::test]
            async fn agrees_with_the_rule() {
                let subject = super::$name().await;
                for seed in [1, 2] {
                    suite::agrees_with_the_rule(subject.one(), &format!("seed{seed}"), seed).await;
                }
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn readers_then_a_queued_writer_with_a_real_lock() {
                let (subject, locks) = (super::$name().await, super::shared_lock::LockService::start().await);
                super::shared_lock::readers_then_a_queued_writer(subject.one(), &locks.client, "t").await;
                locks.stop().await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn racing_tokens() {
                let subject = super::$name().await;
                for seed in [1, 2, 3] {
                    suite::racing_tokens(&subject.fences, &format!("seed{seed}"), seed, false).await;
                }
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn racing_reads_and_writes() {
                let subject = super::$name().await;
                for seed in [4, 5, 6] {
                    suite::racing_tokens(&subject.fences, &format!("seed{seed}"), seed, true).await;
                }
            }
        }
    };
}

conformance_suite!(suite_memory, memory);
conformance_suite!(suite_file, file);
conformance_suite!(suite_postgres, postgres);
conformance_suite!(suite_redis, redis);
