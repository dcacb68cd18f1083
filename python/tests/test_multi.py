"""Multi-locks and semaphore resizes against a real fencelock node: several
locks taken all or none, each with its own token, lost together; a resize
that changes what a second holder can take."""

import asyncio
import threading
import time

import pytest

import fencelock
import fencelock.aio


def wait_queued(node, lock, within=10.0):
    """Until the node shows a waiter on `lock`."""
    deadline = time.monotonic() + within
    while not node.describe(lock).get("waiters") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert node.describe(lock).get("waiters"), f"nobody queued on {lock}"


def test_lock_all_is_all_or_none_and_tokens_increase(node):
    a, b = fencelock.connect(node.url), fencelock.connect(node.url)
    first = a.lock_all(["m/a", "m/b"], ttl=5.0)
    assert isinstance(first, fencelock.MultiGuard)
    assert first.held and first.backend == "fencelock" and first.names == ["m/a", "m/b"]
    assert list(first.tokens) == ["m/a", "m/b"] and all(isinstance(t, int) for t in first.tokens.values())
    assert a.check("m/a", first.tokens["m/a"]) and a.check("m/b", first.tokens["m/b"])
    # An overlapping set is busy as a whole, and takes nothing of it.
    assert b.try_lock_all(["m/b", "m/c"], ttl=5.0) is None
    with pytest.raises(fencelock.Busy):
        b.lock_all(["m/b", "m/c"], ttl=5.0)
    with pytest.raises(fencelock.TimedOut):
        b.lock_all(["m/b", "m/c"], ttl=5.0, wait=0.2)
    alone = b.try_lock("m/c", ttl=5.0)
    assert alone is not None, "a multi-lock that was not granted left m/c taken"
    assert alone.release() is True
    assert first.release() is True and not first.held
    assert first.release() is False  # released already
    second = b.try_lock_all(["m/b", "m/c"], ttl=5.0)
    assert second is not None
    assert second.tokens["m/b"] > first.tokens["m/b"] and second.tokens["m/c"] > alone.token
    assert not a.check("m/b", first.tokens["m/b"])
    assert second.release() is True
    # Refused before anything is sent: a name twice, a semaphore (read-write locks only).
    with pytest.raises(fencelock.InvalidArgument, match="twice"):
        a.lock_all(["m/a", "m/a"], ttl=5.0)
    with pytest.raises(fencelock.InvalidArgument):
        a.lock_all(["m/a", "m/b"], ttl=5.0, permits=2)
    both = a.try_lock_all(["m/a", "m/b"], ttl=5.0)  # nothing of the refused requests was taken
    assert both is not None and both.release() is True


def test_opposite_orders_do_not_deadlock_and_the_with_block_releases(node):
    # A waiting multi-lock naming the same locks in the other order is granted
    # at the holder's release: both locks at once, never one of them.
    client, other = fencelock.connect(node.url), fencelock.connect(node.url)
    got = []
    with client.lock_all(["m/x", "m/y"], ttl=5.0) as held:
        waiter = threading.Thread(target=lambda: got.append(other.lock_all(["m/y", "m/x"], ttl=5.0, wait=10.0)))
        waiter.start()
        wait_queued(node, "m/y")
        assert held.held and not got
    assert not held.held
    waiter.join(10)
    assert got, "the waiting multi-lock was not granted"
    assert got[0].names == ["m/y", "m/x"]
    assert got[0].tokens["m/x"] > held.tokens["m/x"] and got[0].tokens["m/y"] > held.tokens["m/y"]
    assert got[0].release() is True


def test_the_locks_are_lost_together_and_the_block_ends_with_lock_lost(node):
    client = fencelock.connect(node.url)
    with pytest.raises(fencelock.LockLost) as lost:
        with client.lock_all(["m/f1", "m/f2"], ttl=1.0) as held:
            node.freeze()
            try:
                assert held.lost.wait(10.0), "lost never set"
                assert held.lost.reason == "expired"
                assert not held.held
            finally:
                node.thaw()
    assert lost.value.reason == "expired"


def test_resize_changes_the_permits_a_second_holder_can_take(node):
    client, other = fencelock.connect(node.url), fencelock.connect(node.url)
    first = client.lock("s/pool", ttl=5.0, permits=2, weight=2)  # every permit
    assert other.try_lock("s/pool", ttl=5.0, permits=2) is None
    assert client.resize("s/pool", 3) == 2  # the number it had
    second = other.try_lock("s/pool", ttl=5.0, permits=3)
    assert second is not None and first.held
    with pytest.raises(fencelock.InvalidArgument):
        other.try_lock("s/pool", ttl=5.0, permits=2)  # later acquires name the new number
    with pytest.raises(fencelock.InvalidArgument):
        client.resize("s/pool", 2)  # fewer than the holders use
    first.release()
    second.release()


def test_asyncio_lock_all_and_resize(node):
    async def main():
        client = await fencelock.aio.connect(node.url)
        async with client.lock_all(["a/m/1", "a/m/2"], ttl=5.0) as held:
            assert held.held and list(held.tokens) == ["a/m/1", "a/m/2"]
            assert await client.try_lock_all(["a/m/2", "a/m/3"], ttl=5.0) is None
            with pytest.raises(fencelock.Busy):
                await client.lock_all(["a/m/2", "a/m/3"], ttl=5.0)
            waiting = asyncio.ensure_future(client.lock_all(["a/m/2", "a/m/3"], ttl=5.0, wait=10.0))
            for _ in range(500):
                if node.describe("a/m/2").get("waiters"):
                    break
                await asyncio.sleep(0.01)
            assert node.describe("a/m/2")["waiters"], "the waiting multi-lock never queued"
        assert not held.held
        second = await asyncio.wait_for(waiting, 10)
        assert isinstance(second, fencelock.aio.MultiGuard)
        assert second.tokens["a/m/2"] > held.tokens["a/m/2"]
        assert await second.release() is True

        # A resize up grants the waiter at once.
        first = await client.lock("a/s/pool", ttl=5.0, permits=2, weight=2)
        queued = asyncio.ensure_future(client.lock("a/s/pool", ttl=5.0, permits=2, wait=10.0))
        for _ in range(500):
            if node.describe("a/s/pool").get("waiters"):
                break
            await asyncio.sleep(0.01)
        assert node.describe("a/s/pool")["waiters"], "the waiter never queued"
        assert await client.resize("a/s/pool", 3) == 2
        granted = await asyncio.wait_for(queued, 10)
        assert granted.held and first.held
        await granted.release()
        await first.release()

    asyncio.run(main())
