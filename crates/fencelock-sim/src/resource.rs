//! The "resource" host: a fenced register, the thing the lock protects.
//!
//! It accepts a write only if its token is at least the highest token it has
//! accepted (equal tokens are the same holder writing again), and records every
//! decision as an event. As a mutant ([`Mutant::UnfencedResource`]) it ignores
//! tokens and accepts everything, which must make INV-FENCE fail.

use std::{cell::RefCell, net::Ipv4Addr, rc::Rc};

use fencelock_core::Token;
use turmoil::net::{TcpListener, TcpStream};

use crate::{
    config::{Mutant, RESOURCE_PORT},
    event::{EventKind, Events},
    wire::{write_frame, Frames, WriteReq, WriteResp},
};

/// The register's state; it lives outside the host (the resource never crashes).
#[derive(Debug, Default)]
pub struct Register {
    fenced: bool,
    highest: Option<Token>,
}

impl Register {
    pub fn new(mutant: Mutant) -> Self {
        Self { fenced: mutant != Mutant::UnfencedResource, highest: None }
    }

    /// Decide one write.
    pub fn write(&mut self, token: Token) -> WriteResp {
        match self.highest {
            Some(highest) if self.fenced && token < highest => WriteResp::Rejected { highest },
            _ => {
                self.highest = Some(self.highest.map_or(token, |h| h.max(token)));
                WriteResp::Accepted
            }
        }
    }
}

/// What the resource host shares with the harness.
#[derive(Debug, Clone)]
pub struct ResourceShared {
    pub register: Rc<RefCell<Register>>,
    pub events: Events,
}

/// The resource host's software: accept connections, decide writes.
pub async fn run(shared: ResourceShared) -> turmoil::Result {
    let listener = TcpListener::bind((Ipv4Addr::UNSPECIFIED, RESOURCE_PORT)).await?;
    while let Ok((stream, _)) = listener.accept().await {
        tokio::task::spawn_local(serve(stream, shared.clone()));
    }
    Ok(())
}

async fn serve(stream: TcpStream, shared: ResourceShared) {
    let (rd, mut wr) = stream.into_split();
    let mut frames = Frames::new(rd);
    while let Ok(Some(req)) = frames.next::<WriteReq>().await {
        let resp = shared.register.borrow_mut().write(req.token);
        shared.events.push(EventKind::Write {
            client: req.client,
            token: req.token,
            accepted: resp == WriteResp::Accepted,
            after_pause: req.after_pause,
        });
        if write_frame(&mut wr, &resp).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fenced_register_rejects_lower_tokens_only() {
        let mut r = Register::new(Mutant::None);
        assert_eq!(r.write(Token(3)), WriteResp::Accepted);
        assert_eq!(r.write(Token(3)), WriteResp::Accepted);
        assert_eq!(r.write(Token(2)), WriteResp::Rejected { highest: Token(3) });
        assert_eq!(r.write(Token(5)), WriteResp::Accepted);
    }

    #[test]
    fn unfenced_register_accepts_everything() {
        let mut r = Register::new(Mutant::UnfencedResource);
        assert_eq!(r.write(Token(3)), WriteResp::Accepted);
        assert_eq!(r.write(Token(1)), WriteResp::Accepted);
    }
}
