#!/usr/bin/env python3
"""Take a fencelock lock over HTTP, keep its lease alive while working, release it.

Python's standard library only (urllib). Usage:

    FENCELOCK_HTTP=http://127.0.0.1:7071 python3 http_lock.py LOCK [SECONDS]

Prints one JSON line per step. The keep-alive runs every third of the TTL in a
thread; if it ever answers 404 (the lease ended: a pause past the TTL, a cut
network) the work must stop, because another process may hold the lock now.
Ids and tokens are decimal strings: pass them on as they are.
"""
import json
import os
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

BASE = os.environ.get("FENCELOCK_HTTP", "http://127.0.0.1:7071")
TTL_MS = 3000


def call(method, path, body=None):
    """One request; (status, JSON answer). Refusals are JSON too: {"error": {"code", "message"}}."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(BASE + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=70) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def say(**fields):
    print(json.dumps(fields), flush=True)


def main():
    lock = sys.argv[1]
    path = "/v1/locks/" + urllib.parse.quote(lock, safe="")  # a "/" in a name is %2F
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 2.0
    # One call: a new lease, and the lock on it, waiting up to a minute in the queue.
    status, grant = call("POST", f"{path}/acquire", {"ttl_ms": TTL_MS, "wait_ms": 60000})
    if status != 200:
        say(step="refused", status=status, error=grant["error"])
        sys.exit(1)
    lease, token = grant["lease_id"], grant["token"]
    say(step="acquired", lock=lock, lease_id=lease, token=token, waited_ms=grant["waited_ms"])

    lost = threading.Event()
    done = threading.Event()

    def keep_alive():
        while not done.wait(TTL_MS / 3000):
            status, answer = call("POST", f"/v1/leases/{lease}/keepalive")
            if status == 200:
                say(step="renewed", ttl_ms=answer["ttl_ms"])
            elif status == 404:
                say(step="lost", error=answer["error"])
                lost.set()
                return
            # Anything else (a node restarting): try again at the next turn.

    renewer = threading.Thread(target=keep_alive, daemon=True)
    renewer.start()
    end = time.monotonic() + seconds
    while time.monotonic() < end and not lost.is_set():
        time.sleep(0.05)  # the work, passing `token` with every write it makes
    done.set()
    renewer.join()
    if lost.is_set():
        sys.exit(2)
    status, answer = call("POST", f"{path}/release", {"lease_id": lease, "token": token})
    say(step="released", status=status, answer=answer)
    call("DELETE", f"/v1/leases/{lease}")


if __name__ == "__main__":
    main()
