"""The sync API against a real fencelock node (and Redis where said).

Each test names the guarantee it checks."""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import fencelock
from fencelock import _errors, _fencelock


def test_tokens_increase_and_release_is_once(node):
    # Fencing: every grant of a lock has a larger token than the one before.
    client = fencelock.connect(node.url)
    tokens = []
    for _ in range(3):
        guard = client.lock("orders/42", ttl=5.0)
        assert guard.held and guard.name == "orders/42" and guard.backend == "fencelock"
        tokens.append(guard.token)
        assert guard.release() is True
        assert guard.release() is False  # released already: nothing to free
        assert not guard.held
    assert tokens == sorted(tokens) and len(set(tokens)) == 3, tokens


def test_the_with_block_releases_even_on_an_exception(node):
    client = fencelock.connect(node.url)
    with pytest.raises(ZeroDivisionError):
        with client.lock("job", ttl=5.0) as guard:
            assert isinstance(guard.token, int)
            1 / 0
    # Released at the block's end: a try takes it at once.
    again = client.try_lock("job", ttl=5.0)
    assert again is not None and again.token > guard.token
    again.release()


def test_busy_and_timed_out_name_the_holder(node):
    # Contention: a try on a held lock is Busy (the holder named), a wait that
    # runs out is TimedOut; try_lock answers None for both.
    holder = fencelock.connect(node.url).lock("seat/7", ttl=5.0)
    other = fencelock.connect(node.url)
    with pytest.raises(fencelock.Busy) as busy:
        other.lock("seat/7", ttl=5.0)
    assert busy.value.holder_token == holder.token
    assert busy.value.code == "busy" and isinstance(busy.value, fencelock.Error)
    started = time.monotonic()
    with pytest.raises(fencelock.TimedOut) as timed_out:
        other.lock("seat/7", ttl=5.0, wait=0.3)
    assert timed_out.value.code == "timed_out"
    assert time.monotonic() - started >= 0.3
    assert other.try_lock("seat/7", ttl=5.0) is None
    holder.release()
    assert other.try_lock("seat/7", ttl=5.0) is not None


def test_a_waiter_is_granted_when_the_holder_releases(node):
    # Push handoff: the waiter in the queue gets the lock on release, not on a poll.
    client = fencelock.connect(node.url)
    holder = client.lock("handoff", ttl=5.0)
    got = []
    waiter = threading.Thread(target=lambda: got.append(client.lock("handoff", ttl=5.0, wait=10.0)))
    waiter.start()
    deadline = time.monotonic() + 5
    while not node.describe("handoff").get("waiters") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert node.describe("handoff")["waiters"], "the waiter never queued"
    holder.release()
    waiter.join(10)
    assert got and got[0].token > holder.token
    got[0].release()


def test_threads_share_one_client_without_lost_updates(node):
    # Mutual exclusion across threads of one process, one client.
    client = fencelock.connect(node.url)
    counter = {"n": 0}

    def work():
        for _ in range(10):
            with client.lock("counter", ttl=5.0, wait=30.0):
                n = counter["n"]
                time.sleep(0.001)
                counter["n"] = n + 1

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert counter["n"] == 80


WORKER = """
import sys, time, fencelock
url, path, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
client = fencelock.connect(url)
tokens = []
for _ in range(rounds):
    with client.lock("shared-file", ttl=5.0, wait=60.0) as g:
        with open(path) as f:
            n = int(f.read())
        time.sleep(0.002)
        with open(path, "w") as f:
            f.write(str(n + 1))
        tokens.append(g.token)
print(" ".join(map(str, tokens)))
"""


def test_eight_processes_never_lose_an_update(node, tmp_path):
    # Mutual exclusion across processes: a read-modify-write of one file by
    # 8 processes under the lock loses no update, and no token repeats.
    path = tmp_path / "counter"
    path.write_text("0")
    procs = [
        subprocess.Popen([sys.executable, "-c", WORKER, node.url, str(path), "10"], stdout=subprocess.PIPE, text=True)
        for _ in range(8)
    ]
    tokens = []
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0
        tokens += [int(t) for t in out.split()]
    assert int(path.read_text()) == 80
    assert len(tokens) == 80 and len(set(tokens)) == 80


def test_a_busy_python_thread_does_not_starve_the_renewals(node):
    # The watchdog runs on Rust threads: a Python thread that never yields the
    # GIL for 3 TTLs does not cost the lease.
    client = fencelock.connect(node.url)
    with client.lock("busy-python", ttl=1.0) as guard:
        end = time.monotonic() + 3.0
        x = 0
        while time.monotonic() < end:
            x += 1
        assert not guard.lost.is_set(), guard.lost.reason
        assert guard.deadline > time.monotonic()


def test_lost_is_set_when_the_server_freezes_past_the_ttl(node):
    # A lost lease is always reported: while the server is frozen (SIGSTOP)
    # no keep-alive is confirmed, and `lost` is set by the deadline; the with
    # block then ends with LockLost.
    client = fencelock.connect(node.url)
    with pytest.raises(fencelock.LockLost) as lost:
        with client.lock("frozen", ttl=1.0) as guard:
            node.freeze()
            try:
                assert guard.lost.wait(10.0), "lost never set"
                assert guard.lost.reason == "expired"
                assert time.monotonic() >= guard.deadline
                assert not guard.held
            finally:
                node.thaw()
    assert lost.value.reason == "expired"


def test_invalid_arguments_are_refused_with_the_field_named(node):
    client = fencelock.connect(node.url)
    with pytest.raises(fencelock.InvalidArgument, match="ttl"):
        client.lock("x", ttl=-1.0)
    with pytest.raises(fencelock.InvalidArgument, match="wait"):
        client.lock("x", wait=float("nan"))
    with pytest.raises(fencelock.InvalidArgument):
        client.lock("", ttl=5.0)
    with pytest.raises(fencelock.InvalidArgument):
        client.lock("x", ttl=0.01)  # below the 100 ms minimum
    with pytest.raises(fencelock.InvalidArgument):
        fencelock.connect("nosuch://127.0.0.1:1")


def test_a_server_that_is_not_there_is_a_connect_error():
    port = __import__("conftest").free_port()
    with pytest.raises(fencelock.ConnectError) as e:
        fencelock.connect(f"fencelock://127.0.0.1:{port}")
    assert str(port) in str(e.value)


def test_check_tells_the_current_grant(node):
    client = fencelock.connect(node.url)
    guard = client.lock("checked", ttl=5.0)
    assert client.check("checked", guard.token) is True
    assert client.check("checked", guard.token - 1) is False
    guard.release()
    assert client.check("checked", guard.token) is False


def test_identity_and_value_are_published_with_the_grant(node):
    client = fencelock.connect(node.url)
    with client.lock("named", ttl=5.0, identity="py-worker-1", value="10.0.0.7:8080"):
        holder = node.describe("named")["holder"]
        assert holder["identity"] == "py-worker-1", holder


def test_ctrl_c_interrupts_a_wait_and_leaves_the_queue(node):
    # A KeyboardInterrupt during a wait withdraws the request: no dead waiter
    # stays queued ahead of the others.
    holder = fencelock.connect(node.url).lock("interrupted", ttl=10.0)
    # As an interactive program gets it: a background job of a shell starts
    # with SIGINT ignored, and Python then installs no handler of its own.
    script = (
        "import signal, sys, fencelock\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "c = fencelock.connect(sys.argv[1])\n"
        "print('waiting', flush=True)\n"
        "c.lock('interrupted', ttl=5.0, wait=60.0)\n"
    )
    p = subprocess.Popen([sys.executable, "-c", script, node.url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "waiting"
    deadline = time.monotonic() + 10
    while not node.describe("interrupted").get("waiters") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert node.describe("interrupted")["waiters"], "the waiter never queued"
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=10)
    assert "KeyboardInterrupt" in err, err
    deadline = time.monotonic() + 5
    while node.describe("interrupted").get("waiters") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not node.describe("interrupted").get("waiters"), "the interrupted waiter is still queued"
    holder.release()


def test_a_fork_after_connect_gets_a_clear_error_and_can_connect_again(node):
    # A forked child (gunicorn, celery prefork) cannot use its parent's client
    # (its threads are not in the child): a clear error, never a hang; a new
    # connect in the child works.
    client = fencelock.connect(node.url)
    held = client.lock("forked", ttl=5.0)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            try:
                client.lock("other", ttl=5.0)
                os.write(w, b"the parent's client worked in the child")
            except fencelock.Error as e:
                if "fork" in str(e):
                    own = fencelock.connect(node.url)
                    with own.lock("in-child", ttl=5.0) as g:
                        os.write(w, f"ok {g.token}".encode())
                        code = 0
                else:
                    os.write(w, f"wrong error: {e}".encode())
        finally:
            os._exit(code)
    os.close(w)
    _, status = os.waitpid(pid, 0)
    said = os.read(r, 4096).decode()
    assert os.WEXITSTATUS(status) == 0, said
    assert said.startswith("ok "), said
    # The parent's lock is still the parent's, and still held.
    assert held.held and client.check("forked", held.token)
    held.release()


def test_redis_backend_through_the_same_api(redis):
    client = fencelock.connect(redis.url)
    assert client.backend_kind == "redis"
    with client.lock("r", ttl=5.0) as g:
        assert isinstance(g.token, int)
        with pytest.raises(fencelock.Busy):
            fencelock.connect(redis.url).lock("r", ttl=5.0)
    assert client.try_lock("r", ttl=5.0) is not None


def test_capabilities_are_the_backends_declaration(node):
    caps = fencelock.connect(node.url).capabilities()
    assert caps["durable_tokens"] is True and caps["fifo"] is True
    assert caps["fencing"] in ("per lock", "global")
    assert caps["min_ttl"] == pytest.approx(0.1)


def test_every_server_error_code_has_its_exception():
    # One source of truth: the server's error codes (fencelock_core::ErrorCode)
    # and the package's classes agree, name by name and code by code.
    for code, name in _fencelock.codes():
        cls = getattr(fencelock, name)
        assert issubclass(cls, fencelock.Error) and cls.code == code, (code, name)
    coded = {c.code for c in vars(_errors).values() if isinstance(c, type) and issubclass(c, fencelock.Error) and c.code}
    assert coded == {code for code, _ in _fencelock.codes()}


def test_the_locked_decorator_runs_each_call_under_the_lock(node):
    client = fencelock.connect(node.url)
    seen = []

    @client.locked("decorated", ttl=5.0, wait=10.0)
    def job(x):
        seen.append((x, node.describe("decorated")["holder"]["token"]))
        return x * 2

    assert job(21) == 42 and job(1) == 2
    assert seen[0][1] != seen[1][1], "each call is its own grant"
    assert "holder" not in node.describe("decorated") or not node.describe("decorated")["holder"]
    with pytest.raises(TypeError):
        client.locked("x")(_async_job)


async def _async_job():
    pass


def test_closing_the_client_revokes_the_lease_it_kept_for_the_next_lock(node):
    """A short script leaves no lease behind: closing the client (the `with`
    block's end) revokes the lease it kept between locks, at once rather than
    a TTL later (where it would count against the identity's lease quota)."""
    with fencelock.connect(node.url) as client:
        with client.lock("jobs/once", ttl=60):
            assert node.active_leases() == 1
    assert node.active_leases() == 0


def test_the_package_exports_every_exception_by_name() -> None:
    """Every exception of `_errors` is in `fencelock.__all__`, literally (a
    type checker reads only a literal list: `except fencelock.Busy` must
    type-check under mypy --strict), and is the same class."""
    assert set(_errors.__all__) <= set(fencelock.__all__)
    for name in _errors.__all__:
        assert getattr(fencelock, name) is getattr(_errors, name), name
