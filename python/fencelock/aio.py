"""fencelock for asyncio: the same client, guards and exceptions as the sync
API, awaited::

    import fencelock.aio

    client = await fencelock.aio.connect("fencelock://127.0.0.1:7070")
    async with client.lock("orders/42", ttl=10.0, wait=5.0) as guard:
        await write_order(fence=guard.token)

The Rust client does the work on its own threads and hands each result to
the event loop (``call_soon_threadsafe``); nothing blocks the loop. Cancelling
a task that waits for a lock withdraws the request from the queue, and a
grant that arrives as the wait is cancelled is released.
"""

import asyncio
import functools
from typing import Any, Callable, Dict, List, Optional, Sequence, Type, Union

from . import _fencelock
from ._election import Event, Leader, Vacant, _event, _leader
from ._errors import LeaseNotFound, LockLost
from ._watch import Revision, WatchEvent, _revision_arg, _watch_event

__all__ = [
    "connect",
    "Client",
    "Guard",
    "MultiGuard",
    "LostEvent",
    "Leadership",
    "Observation",
    "Leader",
    "Vacant",
    "Watch",
    "WatchEvent",
    "Revision",
]


async def _run(start: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Starts a call of the Rust client and awaits its result on this loop."""
    loop = asyncio.get_running_loop()
    fut: "asyncio.Future[Any]" = loop.create_future()

    def done(ok: bool, value: Any) -> None:  # on a client thread
        try:
            loop.call_soon_threadsafe(_settle, fut, ok, value)
        except RuntimeError:  # the loop is closed: nobody waits any more
            _discard(ok, value)

    task = start(done, *args, **kwargs)
    try:
        return await fut
    except asyncio.CancelledError:
        task.cancel()
        raise


def _settle(fut: "asyncio.Future[Any]", ok: bool, value: Any) -> None:
    if fut.cancelled():
        _discard(ok, value)
    elif ok:
        fut.set_result(value)
    else:
        fut.set_exception(value)


def _discard(ok: bool, value: Any) -> None:
    """A result nobody awaits: a grant is released rather than held until the GC."""
    if ok and isinstance(value, (_fencelock.Guard, _fencelock.MultiGuard)):
        value._start_release(lambda ok, value: None)


async def connect(url: str, *, token: Optional[str] = None, tls_ca: Optional[str] = None) -> "Client":
    """Connects to the lock service of ``url`` (any backend, as ``fencelock.connect``)."""
    inner = await _run(_fencelock._start_connect, url, token=token, tls_ca=tls_ca)
    return Client(inner)


class LostEvent:
    """Set once the lease under a held lock is lost: ``is_set()``, ``await wait(timeout)``, ``reason``."""

    def __init__(self, inner: "_fencelock.LostEvent"):
        self._inner = inner

    def is_set(self) -> bool:
        return self._inner.is_set()

    async def wait(self, timeout: Optional[float] = None) -> bool:
        """Waits until the lease is lost or ``timeout`` seconds pass; returns ``is_set()``."""
        return bool(await _run(self._inner._start_wait, timeout))

    @property
    def reason(self) -> Optional[str]:
        return self._inner.reason

    def __repr__(self) -> str:
        return repr(self._inner)


class _Held:
    """What a Guard and a MultiGuard share: the one lease under their locks,
    its loss, and a release that ``async with`` makes at the block's end,
    raising ``LockLost`` if the lease was lost inside the block."""

    _inner: Any

    @property
    def lease_id(self) -> int:
        return int(self._inner.lease_id)

    @property
    def backend(self) -> str:
        return str(self._inner.backend)

    @property
    def deadline(self) -> float:
        return float(self._inner.deadline)

    @property
    def held(self) -> bool:
        return bool(self._inner.held)

    @property
    def in_jeopardy(self) -> bool:
        return bool(self._inner.in_jeopardy)

    @property
    def lost(self) -> LostEvent:
        return LostEvent(self._inner.lost)

    async def release(self) -> bool:
        """Releases: True if this released what was still held."""
        return bool(await _run(self._inner._start_release))

    def _lost_while_held(self, reason: str) -> str:
        raise NotImplementedError

    async def __aexit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException], tb: Any) -> bool:
        reason = self._inner.lost.reason
        await self.release()
        if exc_type is None and reason is not None:
            error = LockLost(self._lost_while_held(reason))
            error.reason = reason
            raise error
        return False

    def __repr__(self) -> str:
        return repr(self._inner)


class Guard(_Held):
    """A held lock: ``async with`` releases it, and raises ``LockLost`` if it was lost inside the block."""

    _inner: "_fencelock.Guard"

    def __init__(self, inner: "_fencelock.Guard"):
        self._inner = inner

    @property
    def name(self) -> str:
        return self._inner.name

    @property
    def token(self) -> Optional[int]:
        return self._inner.token

    async def __aenter__(self) -> "Guard":
        return self

    def _lost_while_held(self, reason: str) -> str:
        return f"the lock {self.name!r} was lost while held: {reason}"


class Leadership(Guard):
    """Leadership won by ``await client.campaign(...)``: its ``term`` is the
    grant's fencing token. ``async with`` resigns at the end of the block."""

    def __init__(self, inner: "_fencelock.Guard", value: Optional[bytes]):
        super().__init__(inner)
        self._value = value or b""

    @property
    def term(self) -> int:
        token = self._inner.token
        assert token is not None  # elections need fencing tokens
        return token

    @property
    def value(self) -> bytes:
        return self._value

    async def proclaim(self, value: Union[bytes, str]) -> None:
        """Publishes a new value under the same term; ``LeaseNotFound`` if the term has ended."""
        data = value.encode() if isinstance(value, str) else bytes(value)
        if not await _run(self._inner._start_set_value, data):
            raise LeaseNotFound(f"{self.name}: term {self.term} has ended")
        self._value = data

    async def resign(self) -> bool:
        """Gives the leadership up; the next candidate is elected at once."""
        return await self.release()

    async def __aenter__(self) -> "Leadership":
        return self


class Observation:
    """The changes of one election as an async iterator of ``Leader`` and ``Vacant``."""

    def __init__(self, inner: "_fencelock.Observer"):
        self._inner = inner

    def __aiter__(self) -> "Observation":
        return self

    async def __anext__(self) -> Event:
        t = await _run(self._inner._start_next)
        if t is None:
            raise StopAsyncIteration
        return _event(t)


class MultiGuard(_Held):
    """The locks of one multi-lock, held: ``async with`` releases them all, and
    raises ``LockLost`` if they were lost inside the block (one lease: they are
    lost together)."""

    _inner: "_fencelock.MultiGuard"

    def __init__(self, inner: "_fencelock.MultiGuard"):
        self._inner = inner

    @property
    def names(self) -> List[str]:
        return self._inner.names

    @property
    def tokens(self) -> Dict[str, Optional[int]]:
        """Each lock's fencing token, by name, in the order named."""
        return self._inner.tokens

    async def __aenter__(self) -> "MultiGuard":
        return self

    def _lost_while_held(self, reason: str) -> str:
        return f"the locks {self.names!r} were lost while held: {reason}"


class Watch:
    """The events of a watch as an async iterator of ``WatchEvent`` (see
    ``fencelock.Watch``): ``async for event in client.watch(prefix)``."""

    def __init__(self, inner: "_fencelock.Watcher"):
        self._inner = inner

    def __aiter__(self) -> "Watch":
        return self

    async def __anext__(self) -> WatchEvent:
        t = await _run(self._inner._start_next)
        if t is None:
            raise StopAsyncIteration
        return _watch_event(t)


class _AcquireAll:
    """``client.lock_all(...)``: awaitable (the ``MultiGuard``) and an async context manager."""

    def __init__(self, client: "_fencelock.Client", names: Sequence[str], raise_contention: bool, options: Any):
        self._client, self._names, self._raise, self._options = client, list(names), raise_contention, options
        self._all: Optional[MultiGuard] = None

    async def _acquire(self) -> Optional[MultiGuard]:
        inner = await _run(self._client._start_lock_all, self._names, self._raise, **self._options)
        return None if inner is None else MultiGuard(inner)

    def __await__(self) -> Any:
        return self._acquire().__await__()

    async def __aenter__(self) -> MultiGuard:
        multi = await self._acquire()
        assert multi is not None  # lock_all() raises on contention
        self._all = multi
        return multi

    async def __aexit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException], tb: Any) -> bool:
        assert self._all is not None
        return await self._all.__aexit__(exc_type, exc, tb)


class _Acquire:
    """``client.lock(...)``: awaitable (the ``Guard``) and an async context manager."""

    def __init__(self, client: "_fencelock.Client", name: str, raise_contention: bool, options: Any):
        self._client, self._name, self._raise, self._options = client, name, raise_contention, options
        self._guard: Optional[Guard] = None

    async def _acquire(self) -> Optional[Guard]:
        inner = await _run(self._client._start_lock, self._name, self._raise, **self._options)
        return None if inner is None else Guard(inner)

    def __await__(self) -> Any:
        return self._acquire().__await__()

    async def __aenter__(self) -> Guard:
        guard = await self._acquire()
        assert guard is not None  # lock() raises on contention
        self._guard = guard
        return guard

    async def __aexit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException], tb: Any) -> bool:
        assert self._guard is not None
        return await self._guard.__aexit__(exc_type, exc, tb)


class Client:
    """A client of one lock service for asyncio; every method is awaited on the running loop."""

    def __init__(self, inner: "_fencelock.Client"):
        self._inner = inner

    def lock(self, name: str, **options: Any) -> _Acquire:
        """Takes ``name`` (the keywords of ``fencelock.Client.lock``): ``await`` it for the ``Guard``, or
        ``async with`` it. Raises ``Busy`` or ``TimedOut`` on contention."""
        return _Acquire(self._inner, name, True, options)

    async def try_lock(self, name: str, **options: Any) -> Optional[Guard]:
        """``lock``, with contention as an outcome: the ``Guard``, or None."""
        guard: Optional[Guard] = await _Acquire(self._inner, name, False, options)
        return guard

    def locked(self, name: str, **options: Any) -> Callable[[Any], Any]:
        """A decorator for a coroutine function: every call runs holding ``name``."""

        def decorate(fn: Any) -> Any:
            if not asyncio.iscoroutinefunction(fn):
                raise TypeError("a plain function takes fencelock.Client.locked")

            @functools.wraps(fn)
            async def call(*args: Any, **kwargs: Any) -> Any:
                async with self.lock(name, **options):
                    return await fn(*args, **kwargs)

            return call

        return decorate

    async def campaign(
        self,
        name: str,
        *,
        ttl: float = 15.0,
        value: Optional[Union[bytes, str]] = None,
        identity: Optional[str] = None,
        wait: Optional[float] = None,
    ) -> Leadership:
        """Campaigns in the election ``name`` (as ``fencelock.Client.campaign``); cancelling withdraws."""
        data = value.encode() if isinstance(value, str) else value
        inner = await _run(self._inner._start_campaign, name, ttl=ttl, value=data, identity=identity, wait=wait)
        return Leadership(inner, data)

    async def leader(self, name: str) -> Optional[Leader]:
        """The current leader of the election ``name``, or None."""
        return _leader(await _run(self._inner._start_leader, name))

    async def observe(self, name: str) -> Observation:
        """The changes of the election ``name``: ``async for event in await client.observe(name)``."""
        return Observation(await _run(self._inner._start_observe, name))

    async def check(self, name: str, token: int) -> bool:
        """Is ``token`` the current grant of ``name``?"""
        return bool(await _run(self._inner._start_check, name, token))

    def lock_all(self, names: Sequence[str], **options: Any) -> _AcquireAll:
        """Takes every lock of ``names`` at once, all or none (as ``fencelock.Client.lock_all``):
        ``await`` it for the ``MultiGuard``, or ``async with`` it. Raises ``Busy`` or ``TimedOut``."""
        return _AcquireAll(self._inner, names, True, options)

    async def try_lock_all(self, names: Sequence[str], **options: Any) -> Optional[MultiGuard]:
        """``lock_all``, with contention as an outcome: the ``MultiGuard``, or None."""
        multi: Optional[MultiGuard] = await _AcquireAll(self._inner, names, False, options)
        return multi

    def watch(self, prefix: str, *, from_revision: Optional[Union[Revision, str, int]] = None) -> Watch:
        """The events of every lock under ``prefix`` (as ``fencelock.Client.watch``), an async
        iterator: ``async for event in client.watch(prefix)`` (no ``await``: nothing waits to start)."""
        return Watch(self._inner._watch(prefix, from_revision=_revision_arg(from_revision)))

    async def resize(self, name: str, permits: int) -> int:
        """Gives the semaphore ``name`` ``permits`` permits; returns the number it had."""
        return int(await _run(self._inner._start_resize, name, permits))

    async def report_refusal(self, lock: str, refused: int, highest: int, resource: str = "") -> None:
        """A fence's report that it refused a stale write on ``lock`` (as ``fencelock.Client.report_refusal``)."""
        await _run(self._inner._start_report_refusal, lock, refused, highest, resource)

    @property
    def backend_kind(self) -> str:
        return self._inner.backend_kind

    def capabilities(self) -> Any:
        return self._inner.capabilities()

    def close(self) -> None:
        """Closes the client without waiting: the lease it kept for the next
        lock is revoked in the background (``await client.aclose()`` waits
        for that, as the sync client's ``close`` does)."""
        self._inner._close_later()

    async def aclose(self) -> None:
        """Closes the client once the lease it kept for the next lock is
        revoked (the ``async with`` block's end does this); the loop goes on
        meanwhile."""
        await _run(self._inner._start_close)

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException], tb: Any) -> bool:
        await self.aclose()
        return False

    def __repr__(self) -> str:
        return repr(self._inner).replace("fencelock.Client", "fencelock.aio.Client")
