"""A chaos worker that uses only the fencelock Python package: the K1 run of
the `fencelock-py` backend (issue 35). The harness (`worker_control`) starts
it with the argument set of `fencelock-chaos worker` and drives it through
the same protocol, so that the same nemesis and checkers judge it.

Each cycle: `client.lock(...)`, a fenced read of the object from the fenced
storage server (`fencelock.fence.Storage`), the worker's unique id appended,
a fenced write with the token, a hold, `guard.release()`. Every step goes to
the history file as one JSON line in the harness's format (see
`crates/fencelock-chaos/src/history.rs`): an `invoke` and its completion,
`ok`, `fail` (certainly did not happen) or `unknown` (may have happened).

Control lines on stdin: `pause-next` (at the next write, after the last
check of the lease, stop this process with SIGSTOP: the Kleppmann pause; the
package's watchdog threads stop with it), `hold-next` (at the next write,
print `at-write <seq>` and wait up to 10 s for `go`), `cancel`, `stop`.
Reports on stdout: `ready`, `pausing <seq>`, `at-write <seq>`.

Times are `time.monotonic_ns()`, CLOCK_MONOTONIC on Linux, the clock every
history of the run is written in.
"""

import argparse
import json
import os
import queue
import random
import signal
import sys
import threading
import time
from typing import Any, Dict, List, Optional

import fencelock
from fencelock.fence import StaleToken, Storage

# Longer than any hold the nemesis applies: a held write must arrive late,
# not be abandoned by the worker (as the Rust worker's WRITE_TIMEOUT).
WRITE_TIMEOUT = 30.0
READ_TIMEOUT = 5.0
# Errors after which the request certainly did not take effect.
DEFINITE = (
    fencelock.ConnectError,
    fencelock.InvalidArgument,
    fencelock.Unsupported,
    fencelock.Unauthenticated,
    fencelock.PermissionDenied,
)
REFUSED = (fencelock.Unauthenticated, fencelock.PermissionDenied)


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def read_control(lines: "queue.Queue[str]") -> None:
    for line in sys.stdin:
        lines.put(line.strip())
    lines.put("stop")  # the harness is gone


class Worker:
    def __init__(self, a: argparse.Namespace, client: fencelock.Client):
        self.a = a
        self.p = f"w{a.id}"
        self.client = client
        self.storage = Storage(f"http://{a.storage}", timeout=WRITE_TIMEOUT)
        self.reads = Storage(f"http://{a.storage}", timeout=READ_TIMEOUT)
        self.out = open(a.history, "a", encoding="utf-8")
        self.ctl: "queue.Queue[str]" = queue.Queue()
        self.pending: Optional[str] = None
        self.stopping = False
        self.rng = random.Random(a.seed ^ ((a.id + 1) * 0x9E3779B97F4A7C15 % 2**64))

    def log(self, e: Dict[str, Any]) -> None:
        self.out.write(json.dumps(e) + "\n")
        self.out.flush()

    def ev(self, kind: str, f: str, seq: int, **fields: Any) -> Dict[str, Any]:
        e: Dict[str, Any] = {"t": time.monotonic_ns(), "p": self.p, "kind": kind, "f": f, "seq": seq}
        e.update({k: v for k, v in fields.items() if v is not None and v is not False})
        return e

    def take(self, line: str) -> None:
        if line == "stop":
            self.stopping = True
        elif line in ("pause-next", "hold-next"):
            self.pending = line
        elif line == "cancel":
            self.pending = None

    def drain_control(self) -> None:
        while True:
            try:
                self.take(self.ctl.get_nowait())
            except queue.Empty:
                return

    def run(self) -> None:
        threading.Thread(target=read_control, args=(self.ctl,), daemon=True).start()
        say("ready")
        seq = 0
        while True:
            self.drain_control()
            if self.stopping:
                return
            seq += 1
            self.cycle(seq)

    def cycle(self, seq: int) -> None:
        guard = self.acquire(seq)
        if guard is None:
            time.sleep(0.02)
            return
        token = guard.token if guard.token is not None else 1
        value = self.read(seq, token)
        if value is not None:
            self.write(seq, token, guard, value)
        if self.a.hold_ms > 0:
            time.sleep(self.rng.randrange(self.a.hold_ms) / 1000)
        self.release(seq, token, guard)

    def acquire(self, seq: int) -> Optional[fencelock.Guard]:
        self.log(self.ev("invoke", "acquire", seq))
        e = self.ev("ok", "acquire", seq)
        guard = None
        try:
            guard = self.client.lock(self.a.lock, ttl=self.a.ttl_ms / 1000, wait=self.a.wait_ms / 1000)
            e.update(token=guard.token, lease=guard.lease_id)
        except fencelock.Busy as err:
            e.update(kind="fail", error=f"busy: {err}")
        except fencelock.TimedOut as err:
            e.update(kind="fail", error=f"timed out: {err}")
        except fencelock.Error as err:
            failed(e, err)
        e["t"] = time.monotonic_ns()
        self.log(e)
        return guard

    def read(self, seq: int, token: int) -> Optional[List[str]]:
        key = self.a.key
        self.log(self.ev("invoke", "read", seq, token=token, key=key))
        e = self.ev("ok", "read", seq, token=token, key=key)
        value: Optional[List[str]] = None
        try:
            body = self.reads.get(key, lock=self.a.lock, token=token)
            value = entries(body)
            e["value"] = value
        except StaleToken as err:
            e.update(kind="fail", stale=True, error=str(err))
        except fencelock.Error as err:
            e.update(kind="unknown", error=str(err))
        e["t"] = time.monotonic_ns()
        self.log(e)
        return value

    def write(self, seq: int, token: int, guard: fencelock.Guard, value: List[str]) -> None:
        ident = f"{self.p}-{seq}"
        invoke = self.ev("invoke", "write", seq, token=token, key=self.a.key, append=ident)
        self.log(invoke)
        # The last check: never write once the guard says the lease may be gone.
        if guard.lost.is_set() or time.monotonic() >= guard.deadline:
            self.log(dict(invoke, kind="fail", t=time.monotonic_ns(), skipped=True, error="lease lost before the write"))
            return
        self.fault_point(seq)
        e = dict(invoke, kind="ok")
        try:
            self.storage.put(self.a.key, "\n".join(value + [ident]).encode(), lock=self.a.lock, token=token)
        except StaleToken as err:
            e.update(kind="fail", stale=True, error=str(err))
        except fencelock.Error as err:
            e.update(kind="unknown", error=str(err))
        e["t"] = time.monotonic_ns()
        self.log(e)

    def fault_point(self, seq: int) -> None:
        pending, self.pending = self.pending, None
        if pending == "pause-next":
            say(f"pausing {seq}")
            os.kill(os.getpid(), signal.SIGSTOP)
        elif pending == "hold-next":
            say(f"at-write {seq}")
            end = time.monotonic() + 10
            while time.monotonic() < end:
                try:
                    line = self.ctl.get(timeout=max(0.0, end - time.monotonic()))
                except queue.Empty:
                    return
                if line == "go":
                    return
                self.take(line)

    def release(self, seq: int, token: int, guard: fencelock.Guard) -> None:
        self.log(self.ev("invoke", "release", seq, token=token))
        e = self.ev("ok", "release", seq, token=token)
        try:
            e["released"] = guard.release()
        except REFUSED as err:
            e.update(kind="fail", refused=True, error=str(err))
        except fencelock.Error as err:
            e.update(kind="unknown", error=str(err))
        e["t"] = time.monotonic_ns()
        self.log(e)


def failed(e: Dict[str, Any], err: fencelock.Error) -> None:
    """A lock service error: `fail` if it certainly did not take effect, else `unknown`."""
    e["kind"] = "fail" if isinstance(err, DEFINITE) else "unknown"
    if isinstance(err, REFUSED):
        e["refused"] = True
    e["error"] = f"{type(err).__name__}: {err}"


def entries(body: Optional[bytes]) -> List[str]:
    """The object's entries, one id per line (none if it does not exist yet)."""
    if body is None:
        return []
    return [line for line in body.decode(errors="replace").splitlines() if line]


def connect(url: str) -> fencelock.Client:
    """Connects, retrying for up to 30 s (the service may be restarting)."""
    end = time.monotonic() + 30
    while True:
        try:
            return fencelock.connect(url)
        except (fencelock.InvalidArgument, fencelock.Unsupported):
            raise
        except fencelock.Error:
            if time.monotonic() > end:
                raise
            time.sleep(0.1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--id", type=int, required=True)
    ap.add_argument("--lock-url", required=True)
    ap.add_argument("--storage", required=True, help="host:port of the fenced storage server")
    ap.add_argument("--lock", required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--ttl-ms", type=int, required=True)
    ap.add_argument("--wait-ms", type=int, required=True)
    ap.add_argument("--history", required=True)
    ap.add_argument("--hold-ms", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    Worker(a, connect(a.lock_url)).run()


if __name__ == "__main__":
    main()
