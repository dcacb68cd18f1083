"""fencelock: distributed locks whose loss is always reported.

One client over every lock service fencelock speaks: its own server
(``fencelock://``, ``fencelock+tls://``, ``fencelock+json://``) and Redis,
Redlock, etcd, ZooKeeper and PostgreSQL. It is the Rust client underneath: the
lease is renewed on the client's own threads (a busy Python thread does not
starve it), ``guard.lost`` is set the moment the lock can no longer be proved
held, and the fencing token orders every grant of a lock::

    import fencelock

    client = fencelock.connect("fencelock://127.0.0.1:7070")
    with client.lock("orders/42", ttl=10.0, wait=5.0) as guard:
        write_order(fence=guard.token)     # the resource refuses older tokens

A paused process is paused in any language: renewals on other threads do not
stop a holder that was frozen past its TTL from waking up and writing. The
token is what lets the resource refuse that write; pass it along.
"""

import atexit

from . import _fencelock
from ._errors import (
    Busy,
    Compacted,
    ConnectError,
    Error,
    Internal,
    InvalidArgument,
    LeaseNotFound,
    LimitReached,
    LockLost,
    MethodNotAllowed,
    NotFound,
    NotHolder,
    NotLeader,
    PayloadTooLarge,
    PermissionDenied,
    SecurityError,
    SlotDone,
    TimedOut,
    Unauthenticated,
    Unavailable,
    Unsupported,
)
from ._client import Client, connect
from ._election import Leader, Leadership, Observation, Vacant
from ._fencelock import Guard, LostEvent, MultiGuard, __version__
from ._watch import Revision, Watch, WatchEvent

__all__ = [
    "connect",
    "Client",
    "Guard",
    "LostEvent",
    "MultiGuard",
    "Watch",
    "WatchEvent",
    "Revision",
    "Leader",
    "Leadership",
    "Observation",
    "Vacant",
    "__version__",
    # The exceptions, named one by one: a type checker reads only a literal
    # list (``*_errors.__all__`` left ``fencelock.Busy`` unexported to mypy
    # --strict); test_sync checks that the two lists agree.
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

# No client thread may call into Python once the interpreter finalizes (one
# that tries aborts the process): stop them first.
atexit.register(_fencelock._close_at_exit)
