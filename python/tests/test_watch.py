"""client.watch against a real fencelock node: the events of the locks under
a prefix, in revision order, each once, resumed from a revision exactly; a
fence's refusal report as a write_refused event; the native-only calls
refused by another backend.

Every watch here starts at revision 0, the start of a fresh node's history:
nothing a test does can come before it, whenever the stream opens."""

import asyncio
import dataclasses
import threading

import pytest

import fencelock
import fencelock.aio

START = fencelock.Revision(0, 0)


def take(events, n, within=20.0):
    """The next `n` events of a watch; a failure, not a hang, if they do not come."""
    got = []

    def run():
        for e in events:
            got.append(e)
            if len(got) == n:
                return

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(within)
    assert len(got) == n, f"{len(got)} of {n} events within {within} s: {got}"
    return got


def test_a_watch_sees_a_grant_then_its_release_with_the_token(node):
    client = fencelock.connect(node.url)
    events = client.watch("w/", from_revision=START)
    guard = client.lock("w/a", ttl=5.0, identity="py-worker", value="10.0.0.7")
    client.lock("other/x", ttl=5.0).release()  # outside the prefix: never sent
    assert guard.release() is True
    granted, released = take(events, 2)
    assert isinstance(granted, fencelock.WatchEvent)
    assert (granted.kind, granted.lock, granted.lease_id, granted.token) == (
        "granted",
        "w/a",
        guard.lease_id,
        guard.token,
    )
    assert (granted.identity, granted.value, granted.mode) == ("py-worker", b"10.0.0.7", "exclusive")
    assert (released.kind, released.lock, released.lease_id, released.token) == (
        "released",
        "w/a",
        guard.lease_id,
        guard.token,
    )
    assert released.reason == "released"
    assert granted.revision < released.revision
    with pytest.raises(dataclasses.FrozenInstanceError):
        granted.token = 0  # an event is read-only


def test_a_watch_resumed_from_a_revision_misses_and_repeats_nothing(node):
    client = fencelock.connect(node.url)
    events = client.watch("w/", from_revision=START)
    tokens = []
    for _ in range(2):
        with client.lock("w/r", ttl=5.0) as g:
            tokens.append(g.token)
    first = take(events, 4)
    assert [(e.kind, e.token) for e in first] == [
        ("granted", tokens[0]),
        ("released", tokens[0]),
        ("granted", tokens[1]),
        ("released", tokens[1]),
    ]
    assert all(a.revision < b.revision for a, b in zip(first, first[1:])), first
    # Resume right after the second event: exactly the rest, then what comes next.
    resumed = client.watch("w/", from_revision=first[1].revision.next())
    with client.lock("w/r", ttl=5.0) as third:
        pass
    rest = take(resumed, 3)
    assert rest[:2] == first[2:]
    assert (rest[2].kind, rest[2].token) == ("granted", third.token) and rest[2].revision > first[3].revision
    # The revision as the text the CLI and SSE show ("INDEX.SEQ"), inclusive.
    again = client.watch("w/", from_revision=str(first[2].revision))
    assert take(again, 1) == [first[2]]
    with pytest.raises(fencelock.InvalidArgument):
        client.watch("w/", from_revision="not-a-revision")


def test_a_refusal_report_arrives_as_a_write_refused_event(node):
    # A fence that refused a stale write tells the group: the late writer is seen.
    client = fencelock.connect(node.url)
    events = client.watch("w/", from_revision=START)
    old = client.lock("w/fenced", ttl=5.0)
    old.release()
    new = client.lock("w/fenced", ttl=5.0)
    with pytest.raises(fencelock.InvalidArgument):
        client.report_refusal("w/fenced", new.token, old.token, "orders-42")  # no fence refuses a newer token
    client.report_refusal("w/fenced", old.token, new.token, "orders-42")
    got = take(events, 4)
    assert [e.kind for e in got] == ["granted", "released", "granted", "write_refused"]
    refusal = got[3]
    assert (refusal.lock, refusal.token, refusal.highest_token, refusal.resource) == (
        "w/fenced",
        old.token,
        new.token,
        "orders-42",
    )
    assert refusal.lease_id == 0 and refusal.identity == ""  # no lease; no authentication on this node
    # Nothing about the lock changed.
    assert new.held and client.check("w/fenced", new.token)
    new.release()


def test_the_native_only_calls_are_unsupported_on_redis(redis):
    client = fencelock.connect(redis.url)
    with pytest.raises(fencelock.Unsupported, match="watch"):
        client.watch("w/")
    with pytest.raises(fencelock.Unsupported):
        client.watch("w/", from_revision=START)
    with pytest.raises(fencelock.Unsupported):
        client.resize("s/pool", 2)
    with pytest.raises(fencelock.Unsupported):
        client.report_refusal("w/fenced", 1, 2, "orders-42")
    with pytest.raises(fencelock.Unsupported):
        client.lock_all(["m/a", "m/b"], ttl=5.0)
    # Nothing was taken: the locks are free.
    with client.lock("m/a", ttl=5.0), client.lock("m/b", ttl=5.0):
        pass


def test_asyncio_watch_resume_and_refusal(node):
    async def main():
        client = await fencelock.aio.connect(node.url)
        events = client.watch("a/w/", from_revision=START)
        async with client.lock("a/w/x", ttl=5.0) as old:
            pass
        new = await client.lock("a/w/x", ttl=5.0)
        await client.report_refusal("a/w/x", old.token, new.token, "x-1")
        got = []

        async def collect():
            async for e in events:
                got.append(e)
                if len(got) == 4:
                    return

        await asyncio.wait_for(collect(), 20)
        assert [(e.kind, e.token) for e in got] == [
            ("granted", old.token),
            ("released", old.token),
            ("granted", new.token),
            ("write_refused", old.token),
        ]
        assert (got[3].highest_token, got[3].resource) == (new.token, "x-1")
        assert all(a.revision < b.revision for a, b in zip(got, got[1:]))
        resumed = client.watch("a/w/", from_revision=got[1].revision.next())
        assert [await asyncio.wait_for(resumed.__anext__(), 20) for _ in range(2)] == got[2:]
        await new.release()

    asyncio.run(main())


def test_asyncio_native_only_calls_are_unsupported_on_redis(redis):
    async def main():
        client = await fencelock.aio.connect(redis.url)
        with pytest.raises(fencelock.Unsupported):
            client.watch("w/")
        with pytest.raises(fencelock.Unsupported):
            await client.resize("s/pool", 2)
        with pytest.raises(fencelock.Unsupported):
            await client.report_refusal("w/fenced", 1, 2)
        with pytest.raises(fencelock.Unsupported):
            await client.lock_all(["m/a", "m/b"], ttl=5.0)

    asyncio.run(main())
