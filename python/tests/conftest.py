"""Real servers for the package's tests: a fencelock node (the binary the
workspace built, or FENCELOCK_BIN) and Debian's redis-server, each on free
ports of 127.0.0.1 with a temp data dir, stopped after the test."""

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.parse
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


def chaos_bin() -> str:
    """The fault-injection harness the workspace built (or FENCELOCK_CHAOS_BIN)."""
    env = os.environ.get("FENCELOCK_CHAOS_BIN")
    if env:
        return env
    built = Path(fencelock_bin()).with_name("fencelock-chaos")
    if built.exists():
        return str(built)
    raise RuntimeError("no fencelock-chaos binary: build the workspace or set FENCELOCK_CHAOS_BIN")


def wait_healthy(base: str, proc: subprocess.Popen, log: Path, within: float = 20.0) -> None:
    """Until `base`/healthz answers 200; the process's log if it never does."""
    end = time.monotonic() + within
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(f"{base}/healthz", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.02)
    raise RuntimeError(f"{proc.args[:2]} not healthy:\n{log.read_text()}")


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

    def wait_healthy(self) -> None:
        wait_healthy(f"http://127.0.0.1:{self.http}", self.proc, self.log)

    def active_leases(self) -> int:
        """The node's live leases (`fencelock_active_leases` of /metrics)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/metrics", timeout=10) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("fencelock_active_leases "):
                    return int(line.split()[1])
        raise AssertionError("no fencelock_active_leases in /metrics")

    def describe(self, lock: str) -> dict:
        name = urllib.parse.quote(lock, safe="")
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/v1/locks/{name}", timeout=5) as r:
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


class Storage:
    """`fencelock storage`: the fenced object store."""

    def __init__(self, tmp: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [fencelock_bin(), "storage", "--data-dir", str(tmp / "storage"), "--listen", f"127.0.0.1:{self.port}"],
            stdout=subprocess.DEVNULL,
            stderr=open(tmp / "storage.log", "wb"),
        )
        wait_healthy(self.url, self.proc, tmp / "storage.log")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def pg_bin(program: str) -> str:
    found = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{program}"))
    if not found:
        raise RuntimeError("no PostgreSQL: scripts/install-test-deps.sh installs Debian's")
    return str(found[-1])


class Postgres:
    """Debian's PostgreSQL: initdb into a temp dir, `postgres` on a free port
    (as the `postgres` user when run as root: it refuses root)."""

    def __init__(self, tmp: Path):
        self.port = free_port()
        # A directory of its own under /tmp: pytest's tmp_path sits below a
        # directory only its owner may enter, and postgres runs as another user.
        self.dir = Path(tempfile.mkdtemp(prefix="fencelock-pg-"))
        data = self.dir / "pgdata"
        data.mkdir()
        user = None
        if os.geteuid() == 0:
            import pwd

            pw = pwd.getpwnam("postgres")
            user = pw.pw_uid
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
            os.chown(data, pw.pw_uid, pw.pw_gid)
        subprocess.run(
            [pg_bin("initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C", "-N"],
            check=True,
            stdout=subprocess.DEVNULL,
            user=user,
        )
        self.proc = subprocess.Popen(
            [pg_bin("postgres"), "-D", str(data), "-p", str(self.port), "-c", "listen_addresses=127.0.0.1",
             "-c", "unix_socket_directories="],
            stdout=subprocess.DEVNULL,
            stderr=open(self.dir / "pg.log", "wb"),
            user=user,
        )
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/postgres"
        self.dsn = f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"
        end = time.monotonic() + 30
        while time.monotonic() < end:
            r = subprocess.run([pg_bin("pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)], capture_output=True)
            if r.returncode == 0:
                return
            time.sleep(0.1)
        raise RuntimeError(f"postgres did not start:\n{(self.dir / 'pg.log').read_text()}")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(20)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def storage(tmp_path):
    s = Storage(tmp_path)
    yield s
    s.stop()


@pytest.fixture
def postgres(tmp_path):
    p = Postgres(tmp_path)
    yield p
    p.stop()
