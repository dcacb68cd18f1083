"""Leader election: ``client.campaign()``, ``client.leader()``, ``client.observe()``.

A leadership is a held lock whose fencing token is the *term*: every later
leader's term is greater, so a resource that keeps the highest term it saw
refuses a deposed leader's late write. Pass ``leadership.term`` along with
every write, and stop when ``leadership.lost`` is set.
"""

from dataclasses import dataclass
from typing import Any, Iterator, Optional, Tuple, Union

from . import _fencelock
from ._errors import LeaseNotFound, LockLost


@dataclass(frozen=True)
class Leader:
    """The leader of an election: its ``term``, what it published (``value``) and who it is."""

    name: str
    term: int
    value: bytes
    identity: Optional[str]


@dataclass(frozen=True)
class Vacant:
    """The leader of ``term`` is gone (it resigned, or its lease ended) and nobody leads yet."""

    name: str
    term: int


Event = Union[Leader, Vacant]


def _event(t: Tuple[str, str, int, Optional[bytes], Optional[str]]) -> Event:
    kind, name, term, value, identity = t
    if kind == "leader":
        return Leader(name, term, bytes(value or b""), identity)
    return Vacant(name, term)


def _leader(t: Optional[Tuple[str, str, int, Optional[bytes], Optional[str]]]) -> Optional[Leader]:
    if t is None:
        return None
    event = _event(t)
    assert isinstance(event, Leader)
    return event


class Leadership:
    """Leadership won by a campaign. A context manager: resigns at the end of
    the block, and raises ``LockLost`` if the leadership was lost inside it."""

    def __init__(self, guard: "_fencelock.Guard", value: Optional[bytes]):
        self._guard = guard
        self._value = value or b""

    @property
    def name(self) -> str:
        return self._guard.name

    @property
    def term(self) -> int:
        """The term: the grant's fencing token, above every earlier leader's."""
        token = self._guard.token
        assert token is not None  # elections need fencing tokens
        return token

    @property
    def value(self) -> bytes:
        """What this leader publishes."""
        return self._value

    @property
    def lost(self) -> "_fencelock.LostEvent":
        """Set once the leadership is lost (``is_set()``, ``wait(timeout)``, ``reason``)."""
        return self._guard.lost

    @property
    def deadline(self) -> float:
        """The ``time.monotonic()`` value before which the leadership is surely held."""
        return self._guard.deadline

    @property
    def held(self) -> bool:
        return self._guard.held

    def proclaim(self, value: Union[bytes, str]) -> None:
        """Publishes a new value under the same term; ``LeaseNotFound`` if the term has ended."""
        data = value.encode() if isinstance(value, str) else bytes(value)
        if not self._guard.set_value(data):
            raise LeaseNotFound(f"{self.name}: term {self.term} has ended")
        self._value = data

    def resign(self) -> bool:
        """Gives the leadership up; the next candidate is elected at once. False if it was lost before."""
        return self._guard.release()

    def __enter__(self) -> "Leadership":
        return self

    def __exit__(self, *exc: Any) -> bool:
        return self._guard.__exit__(*exc)

    def __repr__(self) -> str:
        return f"<fencelock.Leadership {self.name!r} term={self.term} {'held' if self.held else 'not held'}>"


class Observation:
    """The changes of one election, in order, terms never going back: the
    current leader first (if any), then each new leader, new value or
    vacancy. An iterator; it ends only when the service ends it."""

    def __init__(self, inner: "_fencelock.Observer"):
        self._inner = inner

    def __iter__(self) -> Iterator[Event]:
        return self

    def __next__(self) -> Event:
        t = self._inner.next()
        if t is None:
            raise StopIteration
        return _event(t)


__all__ = ["Leader", "Vacant", "Event", "Leadership", "Observation", "LockLost"]
