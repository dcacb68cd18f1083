"""The resource side in Python: refuse a write whose fencing token is older
than one the resource has already accepted.

A lease cannot stop a holder that was paused past its TTL from waking up and
writing; the resource can, if every write carries the holder's token and the
resource keeps the highest it accepted. Two resources Python programs use:

* a SQL row, with :func:`fenced_update` (one ``UPDATE … WHERE token <= ?``
  statement on any DB-API connection: sqlite3, psycopg, …);
* the fenced storage server (``fencelock storage``), with :class:`Storage`.
"""

import json
import re
import ssl
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Mapping, Optional

from ._errors import Error, InvalidArgument

__all__ = ["fenced_update", "Storage", "StaleToken"]

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$")


class StaleToken(Error):
    """The resource refused the write: a newer token has written there since
    (``highest``), so another holder has the lock now. Stop writing."""

    highest: Optional[int] = None
    got: Optional[int] = None


def _ident(name: str) -> str:
    if not isinstance(name, str) or not _IDENT.match(name):
        raise InvalidArgument(f"{name!r} is not a plain SQL identifier (letters, digits, _; schema.table at most)")
    return name


def _placeholder(conn: Any) -> str:
    """The DB-API module's parameter marker for positional parameters."""
    module = __import__(type(conn).__module__.split(".")[0])
    style = getattr(module, "paramstyle", "qmark")
    return {"qmark": "?", "format": "%s", "pyformat": "%s"}.get(style, "?")


def fenced_update(
    conn: Any,
    table: str,
    values: Mapping[str, Any],
    where: Mapping[str, Any],
    token: int,
    *,
    token_column: str = "fence_token",
) -> bool:
    """Sets ``values`` on the row(s) of ``table`` matching ``where`` (equality on
    each column), in one statement, only if no write under a newer token came
    first; the row keeps the token in ``token_column`` (NULL: never written)::

        UPDATE t SET a = ?, fence_token = ? WHERE id = ? AND (fence_token IS NULL OR fence_token <= ?)

    True if it wrote; False if the row's token is newer (this holder's lock
    went to someone else) or no row matched. The caller commits, as with any
    statement on its connection (``conn`` is a DB-API connection: sqlite3,
    psycopg, …). Table and column names must be plain identifiers.
    """
    if not isinstance(token, int) or token < 0:
        raise InvalidArgument(f"token must be an int of 0 or more (got {token!r})")
    if not values or not where:
        raise InvalidArgument("values and where must each name at least one column")
    p = _placeholder(conn)
    col = _ident(token_column)
    sets = ", ".join(f"{_ident(k)} = {p}" for k in values) + f", {col} = {p}"
    conds = " AND ".join(f"{_ident(k)} = {p}" for k in where)
    sql = f"UPDATE {_ident(table)} SET {sets} WHERE {conds} AND ({col} IS NULL OR {col} <= {p})"
    params = [*values.values(), token, *where.values(), token]
    cur = conn.cursor()
    try:
        cur.execute(sql, params)
        return bool(cur.rowcount and cur.rowcount > 0)
    finally:
        cur.close()


class Storage:
    """A client of the fenced storage server (``fencelock storage``): objects
    written and read under a lock's fencing token.

    ``Storage("http://127.0.0.1:7072").put("orders-42", data, lock="orders", token=guard.token)``
    raises :class:`StaleToken` when a newer token wrote the object first.
    """

    def __init__(self, url: str = "http://127.0.0.1:7072", *, timeout: float = 10.0, ca: Optional[str] = None):
        self._base = url.rstrip("/")
        self._timeout = timeout
        self._ssl = ssl.create_default_context(cafile=ca) if ca else None

    def _call(self, method: str, key: str, body: Optional[bytes], lock: Optional[str], token: Optional[int]) -> Any:
        headers = {}
        if lock is not None or token is not None:
            if lock is None or token is None:
                raise InvalidArgument("a fenced request names both lock and token")
            headers = {"Fencing-Lock": lock, "Fencing-Token": str(int(token))}
        url = f"{self._base}/objects/{urllib.parse.quote(key, safe='')}"
        req = urllib.request.Request(url, data=body, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self._timeout, context=self._ssl) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            text = e.read()
            if e.code == 409:
                answer = json.loads(text or b"{}")
                stale = StaleToken(f"{method} {key} under token {token} refused: {answer.get('rule', answer)}")
                stale.highest, stale.got = answer.get("highest"), answer.get("got")
                raise stale from None
            if e.code == 404 and method == "GET":
                return 404, b""
            raise Error(f"{method} {key}: {e.code} {text.decode(errors='replace')}") from None
        except OSError as e:
            raise Error(f"{method} {key}: the storage server at {self._base} did not answer: {e}") from None

    def put(self, key: str, data: bytes, *, lock: str, token: int) -> None:
        """Writes ``data`` under ``lock``'s ``token``; :class:`StaleToken` if a newer one wrote first."""
        self._call("PUT", key, data, lock, token)

    def get(self, key: str, *, lock: Optional[str] = None, token: Optional[int] = None) -> Optional[bytes]:
        """The object (None if missing); with ``lock`` and ``token`` a fenced read."""
        status, body = self._call("GET", key, None, lock, token)
        return None if status == 404 else bytes(body)

    def delete(self, key: str, *, lock: str, token: int) -> None:
        """Deletes the object under ``lock``'s ``token``."""
        self._call("DELETE", key, None, lock, token)
