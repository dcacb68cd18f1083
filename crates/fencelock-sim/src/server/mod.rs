//! The "server" host: a small lock server around the real `fencelock_core::Engine`.
//!
//! On every (re)start it rebuilds the engine by replaying the durable log, binds
//! its listener, and hands every connection's requests to the [`driver`], which
//! models the real server's persist-before-reply loop. A crash (turmoil's
//! `Sim::crash`) drops the engine, the connections and any batch not yet in the
//! log; [`ServerShared`] is what survives.
//!
//! A connection that sends a frame the server cannot parse is closed; nothing a
//! client sends makes the server panic.

mod driver;
mod log;

use std::net::Ipv4Addr;

use tokio::sync::mpsc;
use turmoil::net::{TcpListener, TcpStream};

pub use log::{ServerShared, WritePhase};

use crate::{
    config::SERVER_PORT,
    wire::{write_frame, Frames, Request, ServerMsg},
};
use driver::{ConnId, Driver, ToDriver};

/// The server host's software: recover, listen, drive.
pub async fn run(shared: ServerShared) -> turmoil::Result {
    let replayed = shared.log.len();
    let engine = shared.log.replay();
    shared.phase.set(WritePhase::Idle);
    let listener = TcpListener::bind((Ipv4Addr::UNSPECIFIED, SERVER_PORT)).await?;
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::task::spawn_local(accept_loop(listener, tx));
    Driver::new(engine, shared, rx).run(replayed).await;
    Ok(())
}

async fn accept_loop(listener: TcpListener, driver: mpsc::UnboundedSender<ToDriver>) {
    let mut next: ConnId = 0;
    while let Ok((stream, _)) = listener.accept().await {
        next += 1;
        tokio::task::spawn_local(connection(next, stream, driver.clone()));
    }
}

/// Read requests until the peer closes or sends garbage; a writer task sends what
/// the driver addresses to this connection.
async fn connection(conn: ConnId, stream: TcpStream, driver: mpsc::UnboundedSender<ToDriver>) {
    let (rd, mut wr) = stream.into_split();
    let (tx, mut rx) = mpsc::unbounded_channel::<ServerMsg>();
    if driver.send(ToDriver::Opened { conn, tx }).is_err() {
        return;
    }
    // Ends when the driver drops this connection's sender (on `Closed`).
    tokio::task::spawn_local(async move {
        while let Some(msg) = rx.recv().await {
            if write_frame(&mut wr, &msg).await.is_err() {
                break;
            }
        }
    });
    let mut frames = Frames::new(rd);
    while let Ok(Some(req)) = frames.next::<Request>().await {
        if driver.send(ToDriver::Request { conn, req }).is_err() {
            return;
        }
    }
    let _ = driver.send(ToDriver::Closed { conn });
}
