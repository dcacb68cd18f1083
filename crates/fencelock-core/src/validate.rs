//! Stateless validation of commands: the rules a command must meet whatever the
//! engine's state (request id, lock name, TTL, wait, lock-delay, hold-at-least, token, holder
//! identity and value, weight against permits, the locks of a multi-acquire,
//! a new value, a refusal report's tokens and resource).
//!
//! Where it sits: the one place these rules live. The engine applies them first to
//! every command it is given (an invalid command is rejected and leaves no trace,
//! INV-9), and the server applies the same [`Command::validate`] before it proposes
//! a command, so a command the engine would reject is never written to the log (a
//! rejected request costs no disk). Rules that depend on state (does the lease
//! exist?) stay in the engine.

use crate::*;

impl Command {
    /// Checks every rule of this command that does not depend on the engine's
    /// state, in the order the engine reports them (request id first).
    pub fn validate(&self) -> Result<(), EngineError> {
        match self {
            Command::GrantLease { req, ttl_ms, .. } => check_req(*req).and(check_ttl(*ttl_ms)),
            Command::KeepAlive { req, .. } | Command::Revoke { req, .. } => check_req(*req),
            Command::Acquire(a) => a.validate(),
            Command::Release { req, lock, token, .. } | Command::Downgrade { req, lock, token, .. } => {
                check_release(*req, lock, *token).map(drop)
            }
            Command::CancelWait { req, lock, .. } => check_cancel(*req, lock).map(drop),
            Command::SetValue { req, lock, token, value, .. } => check_set_value(*req, lock, *token, value).map(drop),
            Command::CompleteSlot { req, lock, token, slot, .. } => check_complete(*req, lock, *token, slot).map(drop),
            Command::As { caller, cmd } => check_caller(caller, cmd).and_then(|()| cmd.validate()),
            Command::Policy(change) => change.validate(),
            Command::Resize { lock, permits } => check_resize(lock, *permits).map(drop),
            Command::ReportRefusal { lock, refused, highest, resource } => {
                check_report(lock, *refused, *highest, resource).map(drop)
            }
        }
    }
}

/// The caller's name, and no `As` inside an `As`.
pub(crate) fn check_caller(caller: &Caller, cmd: &Command) -> Result<(), EngineError> {
    let name = &caller.name;
    if name.is_empty() || name.len() > MAX_CALLER_NAME || !name.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(EngineError::InvalidCaller(format!(
            "name must be 1 to {MAX_CALLER_NAME} bytes of visible ASCII, got {} bytes",
            name.len()
        )));
    }
    match cmd {
        Command::As { .. } => Err(EngineError::InvalidCaller("a command may carry one caller only".into())),
        _ => Ok(()),
    }
}

impl Acquire {
    /// [`Command::validate`] of this acquire.
    pub fn validate(&self) -> Result<(), EngineError> {
        check_acquire(self).map(drop)
    }
}

/// Request id 0 is reserved.
pub(crate) fn check_req(req: RequestId) -> Result<(), EngineError> {
    match req.0 {
        0 => Err(EngineError::InvalidRequestId),
        _ => Ok(()),
    }
}

pub(crate) fn check_ttl(ttl_ms: u64) -> Result<(), EngineError> {
    if (MIN_TTL_MS..=MAX_TTL_MS).contains(&ttl_ms) {
        return Ok(());
    }
    Err(EngineError::InvalidTtl { got_ms: ttl_ms, min_ms: MIN_TTL_MS, max_ms: MAX_TTL_MS })
}

/// An acquire's request id, name, wait, lock-delay, hold-at-least, identity,
/// value, weight and slot,
/// in this order; the name.
pub(crate) fn check_acquire(a: &Acquire) -> Result<LockName, EngineError> {
    check_req(a.req)?;
    let name = LockName::new(a.lock.as_str())?;
    if a.wait_ms > MAX_WAIT_MS {
        return Err(EngineError::InvalidWait { got_ms: a.wait_ms, max_ms: MAX_WAIT_MS });
    }
    if a.lock_delay_ms > MAX_LOCK_DELAY_MS {
        return Err(EngineError::InvalidLockDelay { got_ms: a.lock_delay_ms, max_ms: MAX_LOCK_DELAY_MS });
    }
    if a.hold_at_least_ms > MAX_HOLD_AT_LEAST_MS {
        return Err(EngineError::InvalidHoldAtLeast { got_ms: a.hold_at_least_ms, max_ms: MAX_HOLD_AT_LEAST_MS });
    }
    check_identity(&a.identity)?;
    check_value(&a.value)?;
    check_weight(a.weight, a.permits)?;
    if !a.once_per.is_empty() {
        check_slot(&a.once_per)?;
    }
    if a.is_multi() {
        multi_names(a)?;
    }
    Ok(name)
}

/// The locks of a multi-acquire, in the order asked: 2 to
/// [`MAX_MULTI_LOCKS`] valid, distinct names, with no permits, no weight and
/// no slot (those are rules of single locks: a multi-acquire of semaphores
/// or of a job's slot is not defined).
pub(crate) fn multi_names(a: &Acquire) -> Result<Vec<LockName>, EngineError> {
    check_multi_count(a.also.len())?;
    if a.permits != 0 || a.weight != 1 || !a.once_per.is_empty() {
        return Err(EngineError::InvalidLocks(
            "a multi-acquire takes read-write locks only: no permits, no weight, no once-per slot".into(),
        ));
    }
    let names = a.locks().map(LockName::new).collect::<Result<Vec<_>, _>>()?;
    let distinct: std::collections::BTreeSet<&LockName> = names.iter().collect();
    if distinct.len() != names.len() {
        return Err(EngineError::InvalidLocks("a lock is named twice".into()));
    }
    Ok(names)
}

/// How many locks a multi-acquire with `also` more names: 2 to
/// [`MAX_MULTI_LOCKS`] in all (`also` 0, a single acquire, is not one). The
/// server checks it before it looks at the permission of each name, so a
/// request naming thousands is refused for the cost of a comparison.
pub fn check_multi_count(also: usize) -> Result<(), EngineError> {
    let n = also.saturating_add(1);
    match (2..=MAX_MULTI_LOCKS).contains(&n) {
        true => Ok(()),
        false => Err(EngineError::InvalidLocks(format!("{n} locks (a multi-acquire names 2 to {MAX_MULTI_LOCKS})"))),
    }
}

/// A weight is 1 to the permits asked for (1 when not a semaphore): an
/// acquire of more permits than the semaphore has could never be granted.
pub(crate) fn check_weight(weight: u32, permits: u32) -> Result<(), EngineError> {
    let max = permits.max(1);
    match weight {
        0 => Err(EngineError::InvalidWeight { weight, max }),
        w if w > max => Err(EngineError::InvalidWeight { weight, max }),
        _ => Ok(()),
    }
}

/// A release's request id, name and token, in this order; the name.
pub(crate) fn check_release(req: RequestId, lock: &str, token: Token) -> Result<LockName, EngineError> {
    check_req(req)?;
    let name = LockName::new(lock)?;
    if token.0 == 0 {
        return Err(EngineError::InvalidToken);
    }
    Ok(name)
}

/// A set-value's request id, name, token and value, in this order; the name.
pub(crate) fn check_set_value(req: RequestId, lock: &str, token: Token, value: &[u8]) -> Result<LockName, EngineError> {
    let name = check_release(req, lock, token)?;
    check_value(value)?;
    Ok(name)
}

/// A slot completion's request id, name, token and slot, in this order; the name.
pub(crate) fn check_complete(req: RequestId, lock: &str, token: Token, slot: &str) -> Result<LockName, EngineError> {
    let name = check_release(req, lock, token)?;
    check_slot(slot)?;
    Ok(name)
}

/// A slot name: 1 to [`MAX_SLOT_BYTES`] bytes of UTF-8 without control
/// characters (it is shown on terminals).
pub fn check_slot(slot: &str) -> Result<(), EngineError> {
    if slot.is_empty() || slot.len() > MAX_SLOT_BYTES {
        return Err(EngineError::InvalidSlot(format!("{} bytes (must be 1 to {MAX_SLOT_BYTES})", slot.len())));
    }
    if slot.chars().any(char::is_control) {
        return Err(EngineError::InvalidSlot("must not contain control characters".into()));
    }
    Ok(())
}

/// A resize's name and permits (at least 1), in this order; the name.
pub(crate) fn check_resize(lock: &str, permits: u32) -> Result<LockName, EngineError> {
    let name = LockName::new(lock)?;
    match permits {
        0 => Err(EngineError::ResizeTooSmall { asked: 0, needed: 1 }),
        _ => Ok(name),
    }
}

/// A refusal report's name, tokens (neither 0, the refused one below the
/// highest) and resource, in this order; the name.
///
/// Why `refused < highest` and not `<=`: a fence refuses an operation only
/// when its token is *below* the mark it is judged against (a write: the
/// highest admitted; a read: the last write's, at most the highest), and
/// admits an equal one (`fencelock-fence`'s `Marks::admit`). A report with
/// `refused >= highest` describes no refusal a fence makes.
pub(crate) fn check_report(
    lock: &str,
    refused: Token,
    highest: Token,
    resource: &str,
) -> Result<LockName, EngineError> {
    let name = LockName::new(lock)?;
    if refused.0 == 0 || highest.0 == 0 {
        return Err(EngineError::InvalidToken);
    }
    if refused >= highest {
        return Err(EngineError::InvalidReport(format!(
            "refused token {refused} is not below the highest token {highest} (a fence refuses only tokens below its mark)"
        )));
    }
    check_resource(resource)?;
    Ok(name)
}

/// What a refusal report says the fence protects: at most
/// [`MAX_RESOURCE_BYTES`] of UTF-8 without control characters (it is shown on
/// terminals and in the audit log); "" is none.
pub(crate) fn check_resource(resource: &str) -> Result<(), EngineError> {
    if resource.len() > MAX_RESOURCE_BYTES {
        return Err(EngineError::InvalidReport(format!(
            "resource is {} bytes (must be at most {MAX_RESOURCE_BYTES} bytes of UTF-8)",
            resource.len()
        )));
    }
    if resource.chars().any(char::is_control) {
        return Err(EngineError::InvalidReport("resource must not contain control characters".into()));
    }
    Ok(())
}

/// A cancel's request id and name; the name.
pub(crate) fn check_cancel(req: RequestId, lock: &str) -> Result<LockName, EngineError> {
    check_req(req)?;
    Ok(LockName::new(lock)?)
}

/// A holder identity: at most [`MAX_IDENTITY_BYTES`] of UTF-8 (a `String` is
/// UTF-8 already) and no control character (it is shown on terminals and in
/// logs, where one could forge or hide lines). Empty is allowed (none).
pub fn check_identity(identity: &str) -> Result<(), EngineError> {
    if identity.len() > MAX_IDENTITY_BYTES {
        return Err(EngineError::InvalidIdentity(format!(
            "{} bytes (must be at most {MAX_IDENTITY_BYTES} bytes of UTF-8)",
            identity.len()
        )));
    }
    if identity.chars().any(char::is_control) {
        return Err(EngineError::InvalidIdentity("must not contain control characters".into()));
    }
    Ok(())
}

/// A holder value: at most [`MAX_VALUE_BYTES`] bytes, any content.
pub fn check_value(value: &[u8]) -> Result<(), EngineError> {
    if value.len() > MAX_VALUE_BYTES {
        return Err(EngineError::InvalidValue { got_bytes: value.len(), max_bytes: MAX_VALUE_BYTES });
    }
    Ok(())
}
