//! Decoding the native server's answers into the client's types.

use fencelock_proto::v1 as pb;

use crate::backend::Outcome;
use crate::error::Error;
use crate::types::{ms, Grant};

/// Decodes an `AcquireResponse` to one lock: one grant, never several.
pub(crate) fn acquire_from_proto(resp: pb::AcquireResponse) -> Result<Outcome<Grant>, Error> {
    single(acquire_all_from_proto(resp)?)
}

/// The one grant of an acquire of one lock (several is a protocol error).
pub(crate) fn single<G>(outcome: Outcome<Vec<G>>) -> Result<Outcome<G>, Error> {
    match outcome {
        Outcome::Acquired(mut grants) if grants.len() == 1 => Ok(Outcome::Acquired(grants.remove(0))),
        Outcome::Acquired(grants) => {
            Err(Error::Protocol(format!("{} grants for an acquire of one lock", grants.len())))
        }
        other => Ok(other.map(|_| unreachable!("the grants are matched above"))),
    }
}

fn acquired(a: pb::Acquired) -> Grant {
    Grant { lock: a.lock, lease_id: a.lease_id, token: a.token, waited: ms(a.waited_ms) }
}

/// Decodes the `AcquireResponse` to an acquire of `names`: one grant per lock,
/// in the order named (grants of other locks are a protocol error).
pub(crate) fn acquire_all_of(resp: pb::AcquireResponse, names: &[&str]) -> Result<Outcome<Vec<Grant>>, Error> {
    let outcome = acquire_all_from_proto(resp)?;
    if let Outcome::Acquired(grants) = &outcome {
        if !grants.iter().map(|g| g.lock.as_str()).eq(names.iter().copied()) {
            return Err(Error::Protocol(format!("grants of other locks than those asked ({names:?})")));
        }
    }
    Ok(outcome)
}

/// Decodes an `AcquireResponse` to its grants: one for a single lock, one per
/// lock for a multi-lock. A missing outcome is a protocol error.
pub(crate) fn acquire_all_from_proto(resp: pb::AcquireResponse) -> Result<Outcome<Vec<Grant>>, Error> {
    use pb::acquire_response::Outcome as Answer;
    match resp.outcome {
        Some(Answer::Acquired(a)) => Ok(Outcome::Acquired(vec![acquired(a)])),
        Some(Answer::AcquiredAll(all)) => Ok(Outcome::Acquired(all.grants.into_iter().map(acquired).collect())),
        Some(Answer::Busy(b)) => Ok(Outcome::Busy {
            holder_lease: b.holder.as_ref().map(|h| h.lease_id),
            holder_token: b.holder.map(|h| h.token),
            reopens_in: b.reopens_in_ms.map(ms),
            waiters: b.waiters,
        }),
        Some(Answer::TimedOut(_)) => Ok(Outcome::TimedOut),
        Some(Answer::SlotDone(d)) => {
            Err(Error::SlotDone { token: d.token, identity: d.identity, exit_code: d.exit_code })
        }
        None => Err(Error::Protocol("AcquireResponse without an outcome".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_outcome_carries_the_holder() {
        let resp = pb::AcquireResponse {
            outcome: Some(pb::acquire_response::Outcome::Busy(pb::Busy {
                holder: Some(pb::Holder { lease_id: 4, token: 9, ..Default::default() }),
                reopens_in_ms: None,
                waiters: 2,
            })),
        };
        match acquire_from_proto(resp).unwrap() {
            Outcome::Busy { holder_lease, holder_token, reopens_in, waiters } => {
                assert_eq!((holder_lease, holder_token, reopens_in, waiters), (Some(4), Some(9), None, 2));
            }
            other => panic!("expected busy, got {other:?}"),
        }
    }

    #[test]
    fn missing_outcome_is_a_protocol_error() {
        let got = acquire_from_proto(pb::AcquireResponse { outcome: None });
        assert!(matches!(got, Err(Error::Protocol(_))));
    }
}
