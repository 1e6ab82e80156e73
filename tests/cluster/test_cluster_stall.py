"""A network stall between one worker and Redis (a proxy that holds its bytes) must not
give a shard two live owners, and what the stalled worker had is continued once."""

from __future__ import annotations

import functools

import trio

from loopdock import open_cluster
from loopdock._worker import run_worker
from loopdock.runtime.cluster import Ownership


class StallingProxy:
    """A loopback TCP proxy to Redis whose traffic can be held (``stall``) and let go."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.flowing = trio.Event()
        self.flowing.set()
        self.port = 0

    def stall(self) -> None:
        self.flowing = trio.Event()

    def resume(self) -> None:
        self.flowing.set()

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._connection, listeners)

    async def _connection(self, client: trio.SocketStream) -> None:
        upstream = await trio.open_tcp_stream("127.0.0.1", self.upstream_port)
        async with client, upstream, trio.open_nursery() as nursery:
            nursery.start_soon(self._pump, client, upstream, nursery.cancel_scope)
            nursery.start_soon(self._pump, upstream, client, nursery.cancel_scope)

    async def _pump(self, source: trio.SocketStream, sink: trio.SocketStream, scope: trio.CancelScope) -> None:
        try:
            async for chunk in source:
                await self.flowing.wait()  # held, not dropped: it arrives late
                await sink.send_all(chunk)
        except trio.BrokenResourceError:
            pass
        scope.cancel()


async def test_a_stalled_worker_never_shares_a_shard_and_its_agents_continue_once(redis_server, tmp_path, nursery):
    proxy = StallingProxy(redis_server.port)
    await nursery.start(proxy.serve)
    stalled_url = f"redis://127.0.0.1:{proxy.port}/0"
    overlaps: list[set[int]] = []
    with trio.fail_after(60):
        a = await nursery.start(functools.partial(
            run_worker, stalled_url, home=tmp_path / "a", shards=4, lease_ttl=1.0, worker_id="a"))
        await a.ownership.changes.wait_until(lambda: len(a.ownership.tokens) >= 4)
        b = await nursery.start(functools.partial(
            run_worker, redis_server.url, home=tmp_path / "b", lease_ttl=1.0, worker_id="b"))

        async def watch(mine: Ownership, other: Ownership) -> None:
            # An overlap begins with a shard one of them takes: looked for at every change
            # of ``mine``, not sampled (it would last until the other's next expiry check).
            await mine.changes.wait_until(lambda: bool(set(mine.tokens) & set(other.tokens)))
            overlaps.append(set(mine.tokens) & set(other.tokens))

        nursery.start_soon(watch, a.ownership, b.ownership)
        nursery.start_soon(watch, b.ownership, a.ownership)
        await b.ownership.changes.wait_until(lambda: len(b.ownership.tokens) >= 2)
        async with open_cluster(redis_server.url) as rt:
            handles = [await rt.create_agent(session_id=f"s{i}", loop="minimal-first") for i in range(8)]
            on_a = [h for h in handles if h.agent.id in a.host.handles]
            assert on_a, "some agents live on the worker that will stall"
            proxy.stall()
            sent = [h.agent.followup("during the stall") for h in on_a]
            # b takes a's shards once their leases expire.
            await b.ownership.changes.wait_until(lambda: len(b.ownership.tokens) >= 4)
            assert not a.ownership.tokens  # a let go by its own clock, before b could take them
            for h in on_a:
                await h.agent.wait_idle()
            proxy.resume()  # a's held commands now arrive, late
            for h in handles:
                h.agent.followup("after")
            for h in handles:
                await h.agent.wait_idle()
            logs = {h.agent.id: await rt.read_events(h.agent.id) for h in handles}
    assert overlaps == []
    for handle, message in zip(on_a, sent, strict=True):
        ids = [e.data["id"] for e in logs[handle.agent.id] if e.type == "user/message"]
        assert ids.count(message.id) == 1
    for events in logs.values():
        assert [e.seq for e in events] == list(range(len(events)))
        assert [e.type for e in events].count("turn/start") == [e.type for e in events].count("turn/end")
