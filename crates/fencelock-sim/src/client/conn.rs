//! Client connections with timeouts, to the lock server and to the resource.
//!
//! turmoil's TCP does not retransmit: a segment dropped by a partition leaves the
//! stream stalled for good. So every request has a timeout, and a timeout or an
//! error drops the connection; the next request opens a new one. A request retried
//! after that keeps its engine request id, so the engine answers it from memory
//! instead of applying it twice.

use std::{collections::VecDeque, time::Duration};

use fencelock_core::{Command, LeaseId, Reply, RequestId};
use serde::{de::DeserializeOwned, Serialize};
use turmoil::net::{
    tcp::{OwnedReadHalf, OwnedWriteHalf},
    TcpStream,
};

use crate::{
    clock::now_ms,
    wire::{write_frame, ActReq, ActResp, Frames, Push, PushOutcome, Request, ServerMsg},
};

/// Why a request got no answer. The outcome is unknown: it may have been applied.
#[derive(Debug)]
pub enum CallError {
    Timeout,
    Closed,
    Io,
}

/// One lazily (re)opened connection exchanging frames with `host:port`.
pub struct Link {
    host: String,
    port: u16,
    timeout_ms: u64,
    io: Option<(Frames<OwnedReadHalf>, OwnedWriteHalf)>,
}

impl Link {
    pub fn new(host: &str, port: u16, timeout_ms: u64) -> Self {
        Self { host: host.to_string(), port, timeout_ms, io: None }
    }

    /// Forget the connection; the next send opens a new one.
    pub fn reset(&mut self) {
        self.io = None;
    }

    async fn connect(&mut self) -> Result<(), CallError> {
        if self.io.is_some() {
            return Ok(());
        }
        let connect = TcpStream::connect((self.host.as_str(), self.port));
        let stream = within(self.timeout_ms, connect).await?.map_err(|_| CallError::Io)?;
        let (rd, wr) = stream.into_split();
        self.io = Some((Frames::new(rd), wr));
        Ok(())
    }

    /// Send one frame (opening the connection first if needed).
    pub async fn send<T: Serialize>(&mut self, msg: &T) -> Result<(), CallError> {
        let res = self.try_send(msg).await;
        if res.is_err() {
            self.reset();
        }
        res
    }

    async fn try_send<T: Serialize>(&mut self, msg: &T) -> Result<(), CallError> {
        self.connect().await?;
        let Some((_, wr)) = self.io.as_mut() else {
            return Err(CallError::Closed);
        };
        within(self.timeout_ms, write_frame(wr, msg)).await?.map_err(|_| CallError::Io)
    }

    /// The next frame within `ms`. A timeout keeps the connection (reads are
    /// cancel-safe); end of stream or an error drops it.
    pub async fn recv<T: DeserializeOwned>(&mut self, ms: u64) -> Result<T, CallError> {
        let Some((frames, _)) = self.io.as_mut() else {
            return Err(CallError::Closed);
        };
        let res = match within(ms, frames.next::<T>()).await? {
            Ok(Some(msg)) => return Ok(msg),
            Ok(None) => CallError::Closed,
            Err(_) => CallError::Io,
        };
        self.reset();
        Err(res)
    }

    pub fn timeout_ms(&self) -> u64 {
        self.timeout_ms
    }
}

async fn within<F: std::future::Future>(ms: u64, f: F) -> Result<F::Output, CallError> {
    tokio::time::timeout(Duration::from_millis(ms), f).await.map_err(|_| CallError::Timeout)
}

/// A connection to the lock server: request/reply, plus pushed wait outcomes.
pub struct ServerConn {
    link: Link,
    next_id: u64,
    pushes: VecDeque<Push>,
}

impl ServerConn {
    pub fn new(link: Link) -> Self {
        Self { link, next_id: 0, pushes: VecDeque::new() }
    }

    /// Send `cmd` and wait for its reply; on a timeout the connection is dropped.
    pub async fn call(&mut self, cmd: Command) -> Result<Reply, CallError> {
        self.call_attempt(cmd, 0).await
    }

    /// [`Self::call`] for attempt number `attempt` of an acquire.
    pub async fn call_attempt(&mut self, cmd: Command, attempt: u32) -> Result<Reply, CallError> {
        self.next_id += 1;
        let id = self.next_id;
        self.link.send(&Request { id, cmd, attempt }).await?;
        let until = now_ms() + self.link.timeout_ms();
        loop {
            let left = until.saturating_sub(now_ms()).max(1);
            match self.recv_until(until, left).await? {
                ServerMsg::Reply { id: got, reply } if got == id => return Ok(reply),
                ServerMsg::Reply { .. } => {} // the late answer to an abandoned request
                ServerMsg::Push(p) => self.pushes.push_back(p),
            }
        }
    }

    /// The pushed outcome of the queued acquire `(lease, req)`, waiting at most
    /// `ms`. `Ok(None)` when none came in time (the connection is kept).
    pub async fn push_for(
        &mut self,
        lease: LeaseId,
        req: RequestId,
        ms: u64,
    ) -> Result<Option<PushOutcome>, CallError> {
        if let Some(outcome) = self.take_push(lease, req) {
            return Ok(Some(outcome));
        }
        let until = now_ms() + ms;
        loop {
            let left = until.saturating_sub(now_ms()).max(1);
            match self.link.recv::<ServerMsg>(left).await {
                Ok(ServerMsg::Push(p)) if (p.lease, p.req) == (lease, req) => return Ok(Some(p.outcome)),
                Ok(_) => {}
                Err(CallError::Timeout) => return Ok(None),
                Err(e) => return Err(e),
            }
            if now_ms() >= until {
                return Ok(None);
            }
        }
    }

    fn take_push(&mut self, lease: LeaseId, req: RequestId) -> Option<PushOutcome> {
        let i = self.pushes.iter().position(|p| (p.lease, p.req) == (lease, req))?;
        self.pushes.remove(i).map(|p| p.outcome)
    }

    /// One frame before `until`; past it, the connection is given up.
    async fn recv_until(&mut self, until: u64, left: u64) -> Result<ServerMsg, CallError> {
        if now_ms() >= until {
            self.link.reset();
            return Err(CallError::Timeout);
        }
        let res = self.link.recv::<ServerMsg>(left).await;
        if matches!(res, Err(CallError::Timeout)) {
            self.link.reset();
        }
        res
    }
}

/// A connection to the fenced resource.
pub struct ResourceConn {
    link: Link,
}

impl ResourceConn {
    pub fn new(link: Link) -> Self {
        Self { link }
    }

    /// One act; on a timeout its outcome is unknown and the connection is dropped.
    pub async fn act(&mut self, req: &ActReq) -> Result<ActResp, CallError> {
        self.link.send(req).await?;
        let res = self.link.recv::<ActResp>(self.link.timeout_ms()).await;
        if res.is_err() {
            self.link.reset();
        }
        res
    }
}
