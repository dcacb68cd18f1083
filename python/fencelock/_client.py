"""``fencelock.connect`` and ``fencelock.Client``: the Rust client's handle with
the Python conveniences (the ``locked`` decorator) around it."""

import functools
import inspect
from typing import Any, Callable, Dict, Literal, Optional, Sequence, TypeVar, Union

from . import _fencelock
from ._election import Leader, Leadership, Observation, _leader
from ._fencelock import Guard, MultiGuard
from ._watch import Revision, Watch, _revision_arg

F = TypeVar("F", bound=Callable[..., Any])


def connect(url: str, *, token: Optional[str] = None, tls_ca: Optional[str] = None) -> "Client":
    """Connects to the lock service of ``url``: ``fencelock://host:port`` (several
    members of a group comma-separated), ``fencelock+tls://``,
    ``fencelock+json://``, ``redis://``, ``redlock://``, ``etcd://``, ``zk://``
    or ``postgres://``. ``token`` and ``tls_ca`` are the fencelock server's
    bearer token and CA file. Raises ``ConnectError`` if no server answers."""
    return Client(_fencelock.connect(url, token=token, tls_ca=tls_ca))


class Client:
    """A client of one lock service, shared by every thread of the process.

    Lock keywords (seconds as floats), the Rust client's options with its
    defaults: ``ttl=15.0``, ``wait=0.0`` (try once), ``shared``, ``permits``,
    ``weight``, ``identity``, ``value``, ``hold_at_least``, ``once_per``,
    ``lock_delay``, ``require_fencing``. A backend that lacks one raises
    ``Unsupported`` before anything is sent.
    """

    def __init__(self, inner: "_fencelock.Client"):
        self._inner = inner

    def lock(self, name: str, **options: Any) -> Guard:
        """Takes the lock ``name``: the ``Guard`` (a context manager that releases
        it). Raises ``Busy`` (held, and ``wait=0``) or ``TimedOut`` (the wait ran out)."""
        return self._inner.lock(name, **options)

    def try_lock(self, name: str, **options: Any) -> Optional[Guard]:
        """``lock``, with contention as an outcome: the ``Guard``, or None."""
        return self._inner.try_lock(name, **options)

    def locked(self, name: str, **options: Any) -> Callable[[F], F]:
        """A decorator: every call of the function runs holding ``name`` (taken with
        ``options``), and ends with ``LockLost`` if the lock was lost during it::

            @client.locked("nightly-report", ttl=30.0, wait=60.0)
            def report(): ...
        """

        def decorate(fn: F) -> F:
            if inspect.iscoroutinefunction(fn):
                raise TypeError("an async function takes fencelock.aio's Client.locked")

            @functools.wraps(fn)
            def call(*args: Any, **kwargs: Any) -> Any:
                with self._inner.lock(name, **options):
                    return fn(*args, **kwargs)

            return call  # type: ignore[return-value]

        return decorate

    def campaign(
        self,
        name: str,
        *,
        ttl: float = 15.0,
        value: Optional[Union[bytes, str]] = None,
        identity: Optional[str] = None,
        wait: Optional[float] = None,
    ) -> Leadership:
        """Campaigns in the election ``name`` and returns the ``Leadership`` once
        elected (candidates are elected in the order they came). ``wait=None``
        waits as long as it takes, ``wait=0`` tries once (``Busy``), otherwise
        ``TimedOut`` after ``wait`` seconds. ``value`` is published with the
        leadership (an address), ``identity`` names the candidate."""
        data = value.encode() if isinstance(value, str) else value
        guard = self._inner._campaign(name, ttl=ttl, value=data, identity=identity, wait=wait)
        return Leadership(guard, data)

    def leader(self, name: str) -> Optional[Leader]:
        """The current leader of the election ``name``, or None when nobody leads."""
        return _leader(self._inner._leader(name))

    def observe(self, name: str) -> Observation:
        """The changes of the election ``name`` as an iterator of ``Leader`` and ``Vacant``."""
        return Observation(self._inner._observe(name))

    def check(self, name: str, token: int) -> bool:
        """Is ``token`` the current grant of ``name``? (``Unsupported`` where the backend cannot tell.)"""
        return self._inner.check(name, token)

    def lock_all(self, names: Sequence[str], **options: Any) -> MultiGuard:
        """Takes every lock of ``names`` (2 to 16) at once, all or none: the
        ``MultiGuard`` (a context manager that releases them), each lock with its
        own token (``tokens``, by name). The keywords of ``lock`` (read-write
        locks only: no ``permits``, ``weight`` or ``once_per``). Raises ``Busy``
        or ``TimedOut`` and takes nothing; ``Unsupported`` but on the fencelock
        server."""
        return self._inner.lock_all(list(names), **options)

    def try_lock_all(self, names: Sequence[str], **options: Any) -> Optional[MultiGuard]:
        """``lock_all``, with contention as an outcome: the ``MultiGuard``, or None."""
        return self._inner.try_lock_all(list(names), **options)

    def watch(self, prefix: str, *, from_revision: Optional[Union[Revision, str, int]] = None) -> Watch:
        """The events of every lock whose name starts with ``prefix`` ("": all), an
        iterator of ``WatchEvent``: from ``from_revision`` (inclusive; to resume
        after an event ``e``, ``e.revision.next()``), else from the events applied
        once the watch has opened (the client opens it in the background: pass a
        revision to be sure to miss nothing). The fencelock server's only
        (``Unsupported`` elsewhere)."""
        return Watch(self._inner._watch(prefix, from_revision=_revision_arg(from_revision)))

    def resize(self, name: str, permits: int) -> int:
        """Gives the semaphore ``name`` ``permits`` permits from now on (a larger
        number grants its waiters at once; later acquires name the new number);
        returns the number it had. An admin's call; the fencelock server's only."""
        return self._inner.resize(name, permits)

    def report_refusal(self, lock: str, refused: int, highest: int, resource: str = "") -> None:
        """A fence's report that it refused a stale write on ``lock``: the token
        ``refused`` was below ``highest``, the highest it had admitted, on
        ``resource`` (what it protects). Every watch of the lock shows a
        ``write_refused`` event; nothing about the lock changes. The fencelock
        server's only."""
        self._inner.report_refusal(lock, refused, highest, resource)

    @property
    def backend_kind(self) -> str:
        """The backend's name, as in its URL scheme."""
        return self._inner.backend_kind

    def capabilities(self) -> Dict[str, Union[bool, str, float]]:
        """What the backend guarantees: fencing, durable tokens, FIFO, push wake-up, …"""
        return self._inner.capabilities()

    def close(self) -> None:
        """Closes the client; locks it still holds are released in the background."""
        self._inner.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> Literal[False]:
        self.close()
        return False

    def __repr__(self) -> str:
        return repr(self._inner)
