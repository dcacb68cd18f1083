"""Type stubs of fencelock's native module (the Rust client)."""

from types import TracebackType
from typing import Dict, List, Optional, Tuple, Type, Union

__version__: str

def connect(url: str, *, token: Optional[str] = None, tls_ca: Optional[str] = None) -> Client:
    """Connects to the lock service of ``url`` (any backend)."""

def codes() -> List[Tuple[str, str]]:
    """Every error code of the server with its exception class's name."""

class LostEvent:
    """Set once the lease under a held lock is lost; never cleared."""

    def is_set(self) -> bool: ...
    def wait(self, timeout: Optional[float] = None) -> bool: ...
    @property
    def reason(self) -> Optional[str]: ...

class Guard:
    """A held lock: a context manager that releases it."""

    @property
    def name(self) -> str: ...
    @property
    def token(self) -> Optional[int]: ...
    @property
    def lease_id(self) -> int: ...
    @property
    def backend(self) -> str: ...
    @property
    def deadline(self) -> float: ...
    @property
    def lost(self) -> LostEvent: ...
    @property
    def in_jeopardy(self) -> bool: ...
    @property
    def held(self) -> bool: ...
    def release(self) -> bool: ...
    def set_value(self, value: Union[bytes, str]) -> bool: ...
    def complete_slot(self, slot: str, exit_code: int) -> bool: ...
    def downgrade(self) -> bool: ...
    def __enter__(self) -> Guard: ...
    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> bool: ...

class Client:
    """A client of one lock service, shared by every thread."""

    def lock(
        self,
        name: str,
        *,
        ttl: float = 15.0,
        wait: float = 0.0,
        shared: bool = False,
        permits: int = 0,
        weight: int = 1,
        identity: Optional[str] = None,
        value: Optional[Union[bytes, str]] = None,
        hold_at_least: float = 0.0,
        once_per: Optional[str] = None,
        lock_delay: float = 0.0,
        require_fencing: bool = False,
    ) -> Guard: ...
    def try_lock(
        self,
        name: str,
        *,
        ttl: float = 15.0,
        wait: float = 0.0,
        shared: bool = False,
        permits: int = 0,
        weight: int = 1,
        identity: Optional[str] = None,
        value: Optional[Union[bytes, str]] = None,
        hold_at_least: float = 0.0,
        once_per: Optional[str] = None,
        lock_delay: float = 0.0,
        require_fencing: bool = False,
    ) -> Optional[Guard]: ...
    def check(self, name: str, token: int) -> bool: ...
    @property
    def backend_kind(self) -> str: ...
    def capabilities(self) -> Dict[str, Union[bool, str, float]]: ...
    def close(self) -> None: ...
    def __enter__(self) -> Client: ...
    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> bool: ...
