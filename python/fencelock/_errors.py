"""fencelock's exceptions.

Every exception is a ``fencelock.Error``. Those with a ``code`` are the codes
the server answers with (the HTTP API's ``{"error": {"code": ...}}``, in the
same words); the others are the client's own. Each keeps the whole message of
the failure and its causes.

Contention is an exception only where a ``with`` block cannot start:
``Busy`` (a try found the lock held) and ``TimedOut`` (the wait ran out).
"""

from typing import Optional


class Error(Exception):
    """Any failure of fencelock."""

    code: Optional[str] = None


class Busy(Error):
    """The lock is held and the request did not wait (``wait=0``).

    ``holder_token`` and ``holder_lease`` name the holder when the backend
    knows them; ``waiters`` is the queue's length; ``reopens_in`` (seconds) is
    set while a lock-delay or hold-at-least keeps the lock closed.
    """

    code = "busy"
    holder_lease: Optional[int] = None
    holder_token: Optional[int] = None
    reopens_in: Optional[float] = None
    waiters: int = 0


class TimedOut(Error):
    """The request waited in the queue for its whole ``wait`` without a grant."""

    code = "timed_out"


class NotHolder(Error):
    """The lease and token given are not a current grant of the lock."""

    code = "not_holder"


class LeaseNotFound(Error):
    """The lease does not exist (never granted, revoked or expired), or ended while the request waited."""

    code = "lease_not_found"


class SlotDone(Error):
    """The once-per slot was completed already: ``identity`` ran it under ``token`` and exited with ``exit_code``."""

    code = "slot_done"
    token: int = 0
    identity: str = ""
    exit_code: int = 0


class InvalidArgument(Error):
    """The request is malformed or out of the limits (the message names the field)."""

    code = "invalid_argument"


class NotFound(Error):
    """No such object."""

    code = "not_found"


class MethodNotAllowed(Error):
    """The HTTP path does not take this method."""

    code = "method_not_allowed"


class PayloadTooLarge(Error):
    """The request is larger than the server reads."""

    code = "payload_too_large"


class Compacted(Error):
    """A watch asked for events older than the oldest the server holds (``oldest``)."""

    code = "compacted"
    oldest: Optional[str] = None


class Unauthenticated(Error):
    """No credentials, or credentials the server does not know."""

    code = "unauthenticated"


class PermissionDenied(Error):
    """The caller may not do this to this object (or the lease is another identity's)."""

    code = "permission_denied"


class LimitReached(Error):
    """A quota or rate limit of the caller (or of the node) is reached."""

    code = "limit_reached"


class NotLeader(Error):
    """This node does not lead the group."""

    code = "not_leader"


class Unavailable(Error):
    """The service could not serve in time (no leader, unreachable, a backend failure).

    The request may or may not have taken effect.
    """

    code = "unavailable"


class Internal(Error):
    """A fault of the server or an answer the client does not understand (a bug)."""

    code = "internal"


class ConnectError(Error):
    """The first connection to the service could not be made (every server tried is named)."""


class Unsupported(Error):
    """The backend cannot do what was asked, and nothing was sent."""


class SecurityError(Error):
    """The connection could not be secured or authenticated (TLS, a password): retrying will not help."""


class LockLost(Error):
    """The lease under a held lock was lost (``reason``: expired, not_found, revoked, closed).

    Raised when a ``with`` block ends after its lock was lost, so the block's
    work is known to have run partly unprotected; ``guard.lost`` tells it
    while the block runs.
    """

    reason: str = "lost"


__all__ = [
    "Error",
    "Busy",
    "TimedOut",
    "NotHolder",
    "LeaseNotFound",
    "SlotDone",
    "InvalidArgument",
    "NotFound",
    "MethodNotAllowed",
    "PayloadTooLarge",
    "Compacted",
    "Unauthenticated",
    "PermissionDenied",
    "LimitReached",
    "NotLeader",
    "Unavailable",
    "Internal",
    "ConnectError",
    "Unsupported",
    "SecurityError",
    "LockLost",
]
