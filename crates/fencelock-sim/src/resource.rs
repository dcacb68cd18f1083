//! The "resource" host: fenced registers, the things the locks protect (the
//! main lock's, and one per multi-lock, each fenced by its own lock's tokens:
//! [`Act::fenced`]), and the place where semaphore permits are used.
//!
//! It decides reads and writes of each register by the fence's own rule
//! ([`fencelock_fence::Marks::admit`]): a write only if its token is at least
//! every token accepted so far, a read only if its token is at least the last
//! accepted write's (equal tokens are the same holder acting again; readers'
//! tokens may arrive in any order). A permit use is always accepted. Every
//! decision is recorded as an event. As a mutant
//! ([`Mutant::UnfencedResource`]) it ignores tokens and accepts everything,
//! which must make INV-FENCE fail.

use std::{cell::RefCell, collections::BTreeMap, net::Ipv4Addr, rc::Rc};

use fencelock_core::Token;
use fencelock_fence::Marks;
use turmoil::net::{TcpListener, TcpStream};

use crate::{
    config::{Mutant, RESOURCE_PORT},
    event::{EventKind, Events},
    wire::{write_frame, Act, ActReq, ActResp, Frames},
};

/// The register's state; it lives outside the host (the resource never crashes).
#[derive(Debug, Default)]
pub struct Register {
    fenced: bool,
    /// The fence's marks of each register ([`Act::fenced`]).
    marks: BTreeMap<u8, Marks>,
}

impl Register {
    pub fn new(mutant: Mutant) -> Self {
        Self { fenced: mutant != Mutant::UnfencedResource, marks: BTreeMap::new() }
    }

    /// Decide one act.
    pub fn act(&mut self, act: Act, token: Token) -> ActResp {
        let Some((register, access)) = act.fenced() else {
            return ActResp::Accepted;
        };
        if !self.fenced {
            return ActResp::Accepted;
        }
        match Marks::admit(self.marks.get(&register).copied(), access, token.0) {
            Ok(after) => {
                self.marks.insert(register, after);
                ActResp::Accepted
            }
            Err(stale) => ActResp::Rejected { highest: Token(stale.highest) },
        }
    }
}

/// What the resource host shares with the harness.
#[derive(Debug, Clone)]
pub struct ResourceShared {
    pub register: Rc<RefCell<Register>>,
    pub events: Events,
}

/// The resource host's software: accept connections, decide acts.
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
    while let Ok(Some(req)) = frames.next::<ActReq>().await {
        let resp = shared.register.borrow_mut().act(req.act, req.token);
        shared.events.push(EventKind::Acted {
            client: req.client,
            token: req.token,
            act: req.act,
            accepted: resp == ActResp::Accepted,
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
        assert_eq!(r.act(Act::Write, Token(3)), ActResp::Accepted);
        assert_eq!(r.act(Act::Write, Token(3)), ActResp::Accepted);
        assert_eq!(r.act(Act::Write, Token(2)), ActResp::Rejected { highest: Token(3) });
        assert_eq!(r.act(Act::Write, Token(5)), ActResp::Accepted);
    }

    /// The fence's read rule: readers in any order; a reader older than the
    /// last write is refused; a writer older than a read is refused.
    #[test]
    fn fenced_register_judges_reads_by_the_last_write() {
        let mut r = Register::new(Mutant::None);
        assert_eq!(r.act(Act::Write, Token(3)), ActResp::Accepted);
        assert_eq!(r.act(Act::Read, Token(6)), ActResp::Accepted);
        assert_eq!(r.act(Act::Read, Token(4)), ActResp::Accepted);
        assert_eq!(r.act(Act::Write, Token(5)), ActResp::Rejected { highest: Token(6) });
        assert_eq!(r.act(Act::Write, Token(6)), ActResp::Accepted);
        assert_eq!(r.act(Act::Read, Token(4)), ActResp::Rejected { highest: Token(6) });
        assert_eq!(r.act(Act::Use, Token(1)), ActResp::Accepted);
    }

    /// Each multi-lock's register is fenced by its own lock's tokens only.
    #[test]
    fn each_register_has_its_own_fence() {
        let mut r = Register::new(Mutant::None);
        assert_eq!(r.act(Act::Write, Token(9)), ActResp::Accepted);
        assert_eq!(r.act(Act::WriteOn(0), Token(4)), ActResp::Accepted);
        assert_eq!(r.act(Act::WriteOn(1), Token(2)), ActResp::Accepted);
        assert_eq!(r.act(Act::WriteOn(0), Token(3)), ActResp::Rejected { highest: Token(4) });
    }

    #[test]
    fn unfenced_register_accepts_everything() {
        let mut r = Register::new(Mutant::UnfencedResource);
        assert_eq!(r.act(Act::Write, Token(3)), ActResp::Accepted);
        assert_eq!(r.act(Act::Write, Token(1)), ActResp::Accepted);
        assert_eq!(r.act(Act::Read, Token(1)), ActResp::Accepted);
    }
}
