"""Real servers for the package's tests: a fencelock node (the binary the
workspace built, or FENCELOCK_BIN) and Debian's redis-server, each on free
ports of 127.0.0.1 with a temp data dir, stopped after the test."""

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fencelock_bin() -> str:
    env = os.environ.get("FENCELOCK_BIN")
    if env:
        return env
    built = REPO / "target" / "debug" / "fencelock"
    if built.exists():
        return str(built)
    found = shutil.which("fencelock")
    if found:
        return found
    raise RuntimeError("no fencelock binary: build the workspace or set FENCELOCK_BIN")


class Node:
    """A `fencelock serve` process."""

    def __init__(self, tmp: Path):
        self.grpc = free_port()
        self.http = free_port()
        self.url = f"fencelock://127.0.0.1:{self.grpc}"
        self.log = tmp / "server.log"
        cmd = [
            fencelock_bin(),
            "serve",
            "--data-dir",
            str(tmp / "data"),
            "--listen",
            f"127.0.0.1:{self.grpc}",
            "--http",
            f"127.0.0.1:{self.http}",
        ]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(self.log, "wb"))
        self.wait_healthy()

    def wait_healthy(self, within: float = 20.0) -> None:
        end = time.monotonic() + within
        while time.monotonic() < end:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/healthz", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        raise RuntimeError(f"fencelock serve not healthy:\n{self.log.read_text()}")

    def describe(self, lock: str) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/v1/locks/{lock}", timeout=5) as r:
            return json.loads(r.read())

    def freeze(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        self.thaw()
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Redis:
    """Debian's redis-server, no persistence (as the redis-py recipe's users run it in tests)."""

    def __init__(self, tmp: Path):
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--dir", str(tmp)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        end = time.monotonic() + 10
        while time.monotonic() < end:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.02)
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


@pytest.fixture
def node(tmp_path):
    n = Node(tmp_path)
    yield n
    n.stop()


@pytest.fixture
def redis(tmp_path):
    r = Redis(tmp_path)
    yield r
    r.stop()
