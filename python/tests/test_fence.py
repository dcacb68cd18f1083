"""The resource side from Python: a holder paused past its TTL wakes up and
writes with its old token; the SQL fence and the fenced storage server refuse
that write, after the next holder's went in."""

import json
import signal
import sqlite3
import subprocess
import sys

import pytest

import fencelock
from fencelock.fence import Storage, StaleToken, fenced_update

PAUSED_HOLDER = r"""
import json, sqlite3, sys, fencelock
from fencelock.fence import Storage, StaleToken, fenced_update
url, db, storage_url = sys.argv[1:4]
g = fencelock.connect(url).lock("fence/orders", ttl=1.0)
conn = sqlite3.connect(db)
first = fenced_update(conn, "orders", {"state": "first"}, {"id": 42}, g.token)
conn.commit()
store = Storage(storage_url)
store.put("orders-42", b"first", lock="fence/orders", token=g.token)
print(json.dumps({"token": g.token, "first": first}), flush=True)
sys.stdin.readline()  # frozen here (SIGSTOP) by the test, past the TTL
late = fenced_update(conn, "orders", {"state": "late"}, {"id": 42}, g.token)
conn.commit()
try:
    store.put("orders-42", b"late", lock="fence/orders", token=g.token)
    refused = False
except StaleToken:
    refused = True
print(json.dumps({"late": late, "storage_refused": refused, "lost": g.lost.is_set()}), flush=True)
"""


def test_a_paused_holders_late_write_is_refused_by_both_fences(node, storage, tmp_path):
    db = tmp_path / "orders.db"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, state TEXT, fence_token INTEGER)")
    conn.execute("INSERT INTO orders (id, state) VALUES (42, 'new')")
    conn.commit()
    holder = subprocess.Popen(
        [sys.executable, "-c", PAUSED_HOLDER, node.url, str(db), storage.url],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    first = json.loads(holder.stdout.readline())
    assert first["first"] is True
    holder.send_signal(signal.SIGSTOP)  # a GC pause, a VM stall: past the 1 s TTL
    try:
        # The lock goes to the next holder once the frozen one's lease expires.
        with fencelock.connect(node.url).lock("fence/orders", ttl=5.0, wait=10.0) as g:
            assert g.token > first["token"]
            assert fenced_update(conn, "orders", {"state": "second"}, {"id": 42}, g.token) is True
            conn.commit()
            Storage(storage.url).put("orders-42", b"second", lock="fence/orders", token=g.token)
    finally:
        holder.send_signal(signal.SIGCONT)
    holder.stdin.write("go\n")
    holder.stdin.flush()
    late = json.loads(holder.stdout.readline())
    holder.wait(10)
    assert late == {"late": False, "storage_refused": True, "lost": True}, late
    assert conn.execute("SELECT state FROM orders WHERE id = 42").fetchone() == ("second",)
    assert Storage(storage.url).get("orders-42") == b"second"


def test_fenced_update_on_postgres_with_psycopg(postgres):
    import psycopg  # installed by scripts/python-test.sh
    with psycopg.connect(postgres.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE seats (id int PRIMARY KEY, owner text, fence_token bigint)")
        conn.execute("INSERT INTO seats (id) VALUES (7)")
        assert fenced_update(conn, "seats", {"owner": "a"}, {"id": 7}, 10) is True
        assert fenced_update(conn, "seats", {"owner": "a2"}, {"id": 7}, 10) is True  # the same holder again
        assert fenced_update(conn, "seats", {"owner": "b"}, {"id": 7}, 9) is False  # an older token
        assert fenced_update(conn, "seats", {"owner": "c"}, {"id": 8}, 11) is False  # no such row
        assert conn.execute("SELECT owner, fence_token FROM seats WHERE id = 7").fetchone() == ("a2", 10)


def test_the_postgres_backend_through_the_package(postgres):
    client = fencelock.connect(postgres.url)
    assert client.backend_kind == "postgres"
    with client.lock("pg/seat", ttl=5.0) as g:
        assert isinstance(g.token, int)
        assert client.try_lock("pg/seat", ttl=5.0) is None
    again = client.lock("pg/seat", ttl=5.0)
    assert again.token > g.token
    again.release()


def test_identifiers_that_are_not_plain_names_are_refused():
    conn = sqlite3.connect(":memory:")
    with pytest.raises(fencelock.InvalidArgument):
        fenced_update(conn, "orders; DROP TABLE x", {"a": 1}, {"id": 1}, 5)
    with pytest.raises(fencelock.InvalidArgument):
        fenced_update(conn, "orders", {"a = 1 --": 1}, {"id": 1}, 5)
    with pytest.raises(fencelock.InvalidArgument):
        fenced_update(conn, "orders", {"a": 1}, {"id": 1}, -1)
