"""A fenced write to a SQL row: the row keeps the token of the last write, and
an UPDATE with an older token changes nothing (sqlite3 here; psycopg and any
DB-API connection work the same).

    python fenced_sql.py fencelock://127.0.0.1:7070 orders.db
"""

import sqlite3
import sys

import fencelock
from fencelock.fence import fenced_update


def main(url: str, db: str) -> None:
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, state TEXT, fence_token INTEGER)")
    conn.execute("INSERT OR IGNORE INTO orders (id, state) VALUES (42, 'new')")
    conn.commit()
    client = fencelock.connect(url)
    with client.lock("examples/orders", ttl=10.0, wait=5.0) as guard:
        token = guard.token
        assert token is not None  # the fencelock server's grants are always fenced
        wrote = fenced_update(conn, "orders", {"state": "paid"}, {"id": 42}, token)
        conn.commit()
        print(f"token {token}: {'written' if wrote else 'refused, a newer holder wrote first'}")
    # An older token (a holder that paused past its lease) changes nothing:
    stale = fenced_update(conn, "orders", {"state": "stale"}, {"id": 42}, token - 1)
    conn.commit()
    print(f"token {token - 1}: {'written' if stale else 'refused'}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
