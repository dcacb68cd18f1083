"""Watching locks: ``client.watch(prefix)``, the fencelock server's events of
every lock whose name starts with ``prefix``, in the order the group applied
them, each once.

Every event has a ``revision`` (the same on every node of the group): to
resume after an event ``e``, watch again with ``from_revision=e.revision.next()``
(inclusive). A revision the server no longer holds raises ``Compacted``
(its ``oldest`` is where to start again).
"""

from dataclasses import dataclass
from typing import Iterator, Optional, Tuple, Union

from . import _fencelock
from ._errors import InvalidArgument

_MAX_SEQ = 2**32 - 1


@dataclass(frozen=True, order=True)
class Revision:
    """A position in the group's event history (``INDEX.SEQ``): the Raft log
    index of the entry an event was applied at, and its place among that
    entry's events. Revisions order every event of the group."""

    index: int
    seq: int = 0

    def next(self) -> "Revision":
        """The revision right after this one: where to resume after it."""
        if self.seq < _MAX_SEQ:
            return Revision(self.index, self.seq + 1)
        return Revision(self.index + 1, 0)

    def __str__(self) -> str:
        return f"{self.index}.{self.seq}"


@dataclass(frozen=True)
class WatchEvent:
    """One thing that happened to a lock.

    ``kind`` is the server's name for it: ``granted``, ``released``,
    ``expired``, ``revoked``, ``queued``, ``dequeued``, ``value_changed``,
    ``downgraded`` or ``write_refused`` (a fence refused a stale write:
    ``token`` is the refused token, ``highest_token`` the fence's mark,
    ``resource`` what it protects, ``identity`` who reported it). ``token`` is
    the grant's fencing token (0 for queued and dequeued); ``identity`` and
    ``value`` what the acquire carried (empty when none); ``reason`` why a
    grant or a wait ended when the kind does not say it all; ``mode``
    ``"shared"`` for a reader's grant and a downgrade, else ``"exclusive"``.
    """

    revision: Revision
    kind: str
    lock: str
    lease_id: int
    token: int
    identity: str
    reason: str
    value: bytes
    mode: str
    highest_token: int
    resource: str


_EventTuple = Tuple[int, int, str, str, int, int, str, str, bytes, str, int, str]


def _watch_event(t: _EventTuple) -> WatchEvent:
    index, seq, kind, lock, lease_id, token, identity, reason, value, mode, highest, resource = t
    return WatchEvent(
        Revision(index, seq), kind, lock, lease_id, token, identity, reason, bytes(value), mode, highest, resource
    )


def _revision_arg(r: Optional[Union[Revision, str, int]]) -> Optional[str]:
    """``from_revision`` as the text the native client parses (``INDEX.SEQ``)."""
    if r is None:
        return None
    if isinstance(r, (Revision, str)) or (isinstance(r, int) and not isinstance(r, bool)):
        return str(r)
    raise InvalidArgument(f"from_revision must be a fencelock.Revision, 'INDEX.SEQ' or an int (got {r!r})")


class Watch:
    """The events of a watch, in revision order, each once: an iterator that
    waits for the next event (Ctrl-C interrupts). It ends only with an error
    it cannot get past (``Compacted``, a refused permission), raised from
    ``next()``; the client resumes by itself after a broken stream or a
    failed server. Dropping it ends the watch."""

    def __init__(self, inner: "_fencelock.Watcher"):
        self._inner = inner

    def __iter__(self) -> Iterator[WatchEvent]:
        return self

    def __next__(self) -> WatchEvent:
        t = self._inner.next()
        if t is None:
            raise StopIteration
        return _watch_event(t)


__all__ = ["Revision", "WatchEvent", "Watch"]
