"""Leader election from Python against a real fencelock node: terms only
grow, the next candidate is elected when the leader resigns, observers see
every change in order."""

import asyncio
import threading

import pytest

import fencelock
import fencelock.aio


def test_a_campaign_wins_a_term_and_the_next_candidate_follows_on_resign(node):
    a, b = fencelock.connect(node.url), fencelock.connect(node.url)
    leader = a.campaign("el/jobs", ttl=5.0, value="10.0.0.1:8080", identity="a")
    assert leader.held and leader.term > 0
    with pytest.raises(fencelock.Busy):
        b.campaign("el/jobs", ttl=5.0, wait=0)
    with pytest.raises(fencelock.TimedOut):
        b.campaign("el/jobs", ttl=5.0, wait=0.2)
    seen = b.leader("el/jobs")
    assert seen == fencelock.Leader("el/jobs", leader.term, b"10.0.0.1:8080", "a")
    leader.proclaim(b"10.0.0.1:9090")
    assert b.leader("el/jobs").value == b"10.0.0.1:9090"
    won = []
    t = threading.Thread(target=lambda: won.append(b.campaign("el/jobs", ttl=5.0, value="b")))
    t.start()
    assert leader.resign() is True
    t.join(10)
    assert won and won[0].term > leader.term
    assert b.leader("el/jobs").term == won[0].term
    with pytest.raises(fencelock.LeaseNotFound):
        leader.proclaim("too late")
    won[0].resign()
    assert b.leader("el/jobs") is None


def test_an_observer_sees_each_leader_and_vacancy_in_term_order(node):
    client = fencelock.connect(node.url)
    first = client.campaign("el/watched", ttl=5.0, value="one")
    events = client.observe("el/watched")
    e = next(events)
    assert e == fencelock.Leader("el/watched", first.term, b"one", None)
    first.resign()
    second = client.campaign("el/watched", ttl=5.0, value="two")
    terms = []
    for e in events:
        terms.append(e.term)
        if isinstance(e, fencelock.Leader) and e.term == second.term:
            break
    assert terms == sorted(terms) and terms[-1] == second.term > first.term
    second.resign()


def test_asyncio_campaign_and_observe(node):
    async def main():
        client = await fencelock.aio.connect(node.url)
        async with await client.campaign("el/aio", ttl=5.0, value="x") as leader:
            assert (await client.leader("el/aio")).term == leader.term
            await leader.proclaim("y")
            events = await client.observe("el/aio")
            e = await events.__anext__()
            assert e == fencelock.Leader("el/aio", leader.term, b"y", None)
        assert await client.leader("el/aio") is None

    asyncio.run(main())
