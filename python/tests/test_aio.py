"""fencelock.aio against a real fencelock node: the sync API's guarantees,
awaited on an event loop that nothing blocks."""

import asyncio
import threading
import time

import pytest

import fencelock
import fencelock.aio


class Ticker:
    """Counts the event loop's turns from its creation (in a running loop)
    until `stop()`: that the loop ran, and so was not blocked, meanwhile."""

    def __init__(self, every: float = 0.0):
        self.ticks = 0
        self.every = every
        self.task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while True:
            self.ticks += 1
            await asyncio.sleep(self.every)

    def stop(self) -> int:
        self.task.cancel()
        return self.ticks


def test_async_with_takes_and_releases_in_token_order(node):
    async def main():
        client = await fencelock.aio.connect(node.url)
        tokens = []
        for _ in range(3):
            async with client.lock("a/orders", ttl=5.0) as guard:
                assert guard.held and isinstance(guard.token, int)
                tokens.append(guard.token)
            assert not guard.held
        return tokens

    tokens = asyncio.run(main())
    assert tokens == sorted(tokens) and len(set(tokens)) == 3


def test_contention_is_busy_timed_out_or_none(node):
    async def main():
        client = await fencelock.aio.connect(node.url)
        holder = await client.lock("a/seat", ttl=5.0)
        with pytest.raises(fencelock.Busy) as busy:
            await client.lock("a/seat", ttl=5.0)
        assert busy.value.holder_token == holder.token
        with pytest.raises(fencelock.TimedOut):
            await client.lock("a/seat", ttl=5.0, wait=0.2)
        assert await client.try_lock("a/seat", ttl=5.0) is None
        assert await client.check("a/seat", holder.token) is True
        assert await holder.release() is True
        assert await holder.release() is False
        assert await client.check("a/seat", holder.token) is False

    asyncio.run(main())


def test_cancelling_a_waiting_task_leaves_the_queue(node):
    # Cancellation withdraws the request: no dead waiter stays ahead of others.
    async def main():
        client = await fencelock.aio.connect(node.url)
        holder = await client.lock("a/cancel", ttl=10.0)
        waiting = asyncio.ensure_future(client.lock("a/cancel", ttl=5.0, wait=60.0))
        for _ in range(500):
            if node.describe("a/cancel").get("waiters"):
                break
            await asyncio.sleep(0.01)
        assert node.describe("a/cancel")["waiters"], "the waiter never queued"
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        for _ in range(500):
            if not node.describe("a/cancel").get("waiters"):
                break
            await asyncio.sleep(0.01)
        assert not node.describe("a/cancel").get("waiters"), "the cancelled waiter is still queued"
        # The next acquire after the release is granted: nobody dead ahead of it.
        await holder.release()
        async with client.lock("a/cancel", ttl=5.0, wait=5.0) as g:
            assert g.token > holder.token

    asyncio.run(main())


def test_lost_is_awaited_and_the_block_ends_with_lock_lost(node):
    async def main():
        client = await fencelock.aio.connect(node.url)
        with pytest.raises(fencelock.LockLost):
            async with client.lock("a/frozen", ttl=1.0) as guard:
                node.freeze()
                try:
                    assert not await guard.lost.wait(0.1)  # not yet: a timeout answers False
                    assert await guard.lost.wait(10.0), "lost never set"
                    assert guard.lost.reason == "expired"
                finally:
                    node.thaw()

    asyncio.run(main())


def test_tasks_and_threads_share_a_lock_without_lost_updates(node):
    # Mutual exclusion between asyncio tasks (one aio client) and a thread of
    # the same process (a sync client): 8 tasks and a thread, 5 rounds each.
    counter = {"n": 0}
    sync_client = fencelock.connect(node.url)

    def thread_work():
        for _ in range(5):
            with sync_client.lock("a/counter", ttl=5.0, wait=60.0):
                n = counter["n"]
                time.sleep(0.002)
                counter["n"] = n + 1

    async def task_work(client):
        for _ in range(5):
            async with client.lock("a/counter", ttl=5.0, wait=60.0):
                n = counter["n"]
                await asyncio.sleep(0.002)
                counter["n"] = n + 1

    async def main():
        client = await fencelock.aio.connect(node.url)
        await asyncio.gather(*(task_work(client) for _ in range(8)))

    t = threading.Thread(target=thread_work)
    t.start()
    asyncio.run(main())
    t.join(60)
    assert counter["n"] == 45


def test_the_loop_is_never_blocked_while_a_task_waits(node):
    # A wait of 1 s for a held lock leaves the loop free: a ticker runs throughout.
    async def main():
        client = await fencelock.aio.connect(node.url)
        holder = await client.lock("a/free-loop", ttl=5.0)
        ticker = Ticker(every=0.01)
        with pytest.raises(fencelock.TimedOut):
            await client.lock("a/free-loop", ttl=5.0, wait=1.0)
        ticks = ticker.stop()
        await holder.release()
        return ticks

    assert asyncio.run(main()) >= 20


def test_the_async_locked_decorator(node):
    async def main():
        client = await fencelock.aio.connect(node.url)

        @client.locked("a/decorated", ttl=5.0, wait=10.0)
        async def job(x):
            return x, node.describe("a/decorated")["holder"]["token"]

        (a, ta), (b, tb) = await job(1), await job(2)
        assert (a, b) == (1, 2) and int(tb) > int(ta)

    asyncio.run(main())


def test_aclose_returns_once_the_kept_lease_is_revoked(node):
    """`await client.aclose()` (and the end of `async with client`) returns
    only once the lease the client kept for its next lock is revoked, as the
    sync client's close does; `close()` leaves that to the background. The
    loop runs meanwhile."""

    async def main():
        async with await fencelock.aio.connect(node.url) as client:
            async with client.lock("a/once", ttl=60.0):
                assert node.active_leases() == 1
        assert node.active_leases() == 0, "revoked when the block ended"
        client = await fencelock.aio.connect(node.url)
        await (await client.lock("a/twice", ttl=60.0)).release()
        assert node.active_leases() == 1, "kept for the next lock"
        ticker = Ticker()
        await client.aclose()
        assert ticker.stop() > 0, "the loop ran while aclose waited"
        assert node.active_leases() == 0
        with pytest.raises(fencelock.Error, match="closed"):
            await client.lock("a/after", ttl=5.0)

    asyncio.run(main())
