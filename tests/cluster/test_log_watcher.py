"""The client's log watcher: one blocking XREAD over every log some caller waits on."""

from __future__ import annotations

import json

import pytest
import trio

from loopdock._cluster import LogWatcher
from loopdock.runtime import Changes
from loopdock.runtime.cluster import connect, keys


async def _append(redis, session_id: str, seq: int, event_type: str) -> None:
    await redis.xadd(keys.log(session_id), {"t": event_type, "m": "0", "d": json.dumps({"n": seq})},
                     identifier=keys.log_id(seq))


# Through coredis, and over the watcher's own connection (the client's way).
@pytest.mark.parametrize("own_connection", [False, True])
async def test_a_served_waiter_is_not_read_again_while_others_wait(redis_server, own_connection):
    async with connect(redis_server.url) as redis, trio.open_nursery() as nursery:
        reads: list[list[str]] = []
        read = Changes()
        watcher = LogWatcher(redis, url=redis_server.url if own_connection else None)
        xread = watcher._xread

        async def spy(streams):
            reads.append(list(streams))
            read.notify()
            return await xread(streams)

        watcher._xread = spy  # type: ignore[method-assign]
        nursery.start_soon(watcher.run)
        await _append(redis, "one", 0, "turn/start")

        # "two" keeps the watcher reading; "one" is served by its first read.
        async def wait_two() -> None:
            await watcher.follow("two", 0)

        nursery.start_soon(wait_two)
        await trio.testing.wait_all_tasks_blocked()  # wait_two's follow is in, waiting
        assert "two" in watcher.watched()
        with trio.fail_after(10):
            events, cursor = await watcher.follow("one", 0)
        assert [(e.seq, e.type, e.data) for e in events] == [(0, "turn/start", {"n": 0})]
        assert cursor == 1
        served = len(reads)

        with trio.fail_after(10):
            await read.wait_until(lambda: len(reads) >= served + 3)  # the watcher goes on reading for "two"
        # Only the read that served "one" asked for it. A waiter left in until its own
        # task ran made the next read ask for "one" from seq 0 again: that read returned
        # at once, with the same entries, decoded twice.
        assert [keys.log("one") in streams for streams in reads].count(True) == 1
        assert all(keys.log("two") in streams for streams in reads)
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("own_connection", [False, True])
async def test_a_waiter_that_follows_again_gets_only_what_is_new(redis_server, own_connection):
    async with connect(redis_server.url) as redis, trio.open_nursery() as nursery:
        watcher = LogWatcher(redis, url=redis_server.url if own_connection else None)
        nursery.start_soon(watcher.run)
        await _append(redis, "one", 0, "turn/start")
        with trio.fail_after(10):
            first, _ = await watcher.follow("one", 0)
        await _append(redis, "one", 1, "step/start")
        await _append(redis, "one", 2, "turn/end")
        with trio.fail_after(10):
            second, _ = await watcher.follow("one", 1)
        assert [e.seq for e in first] == [0]
        assert [e.seq for e in second] == [1, 2]
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("own_connection", [False, True])
async def test_a_cancelled_follow_leaves_nothing_watched(redis_server, own_connection):
    async with connect(redis_server.url) as redis, trio.open_nursery() as nursery:
        watcher = LogWatcher(redis, url=redis_server.url if own_connection else None)
        nursery.start_soon(watcher.run)
        with trio.move_on_after(0.2):
            await watcher.follow("one", 0)
        assert watcher.watched() == set()
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("own_connection", [False, True])
async def test_a_follow_for_some_types_decodes_only_those_and_moves_past_the_rest(redis_server, own_connection):
    async with connect(redis_server.url) as redis, trio.open_nursery() as nursery:
        watcher = LogWatcher(redis, url=redis_server.url if own_connection else None)
        nursery.start_soon(watcher.run)
        for seq, event_type in enumerate(["turn/start", "step/start", "assistant/message", "step/end"]):
            await _append(redis, "one", seq, event_type)
        with trio.fail_after(10):
            events, cursor = await watcher.follow("one", 0, {"turn/start", "turn/end"})
        assert ([e.type for e in events], cursor) == (["turn/start"], 4)
        await _append(redis, "one", 4, "step/start")
        await _append(redis, "one", 5, "step/end")
        with trio.fail_after(10):  # nothing of that type among what is new: none, moved on
            events, cursor = await watcher.follow("one", 4, {"turn/end"})
        assert (events, cursor) == ([], 6)
        await _append(redis, "one", 6, "turn/end")
        with trio.fail_after(10):
            events, cursor = await watcher.follow("one", 6, {"turn/end"})
        assert ([(e.seq, e.type) for e in events], cursor) == ([(6, "turn/end")], 7)
        nursery.cancel_scope.cancel()
