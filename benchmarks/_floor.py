"""The floor: the same request/response pattern on bare trio memory channels.

One "agent" is a task that receives a request on its own channel and sends the reply on
another; one hop is send request -> receive -> send reply -> receive, the cheapest a trio
actor exchange can be. Nothing here is loopdock: it is what the runtime is measured against.
"""

from __future__ import annotations

import time
from typing import Any

import trio
import trio.testing

from ._common import Progress, percentile, settled_rss, waves_for


async def _serve(requests: trio.MemoryReceiveChannel[int], replies: trio.MemorySendChannel[int]) -> None:
    async for request in requests:
        await replies.send(request)


async def _sequential_hops(count: int, batches: int = 10) -> dict[str, float]:
    """One client, one server: the cost of a single hop, without concurrency.

    ``mean_us`` is the median over ``batches`` batches of each batch's mean (robust to a
    neighbour's burst on a shared machine); p50/p99 come from a pass timing every hop.
    """
    send_request, receive_request = trio.open_memory_channel[int](1)
    send_reply, receive_reply = trio.open_memory_channel[int](1)
    clock = time.perf_counter
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_serve, receive_request, send_reply)
        for i in range(200):  # warm-up
            await send_request.send(i)
            await receive_reply.receive()
        per_batch = max(1, count // batches)
        means = []
        cpu_started = time.process_time()
        for _ in range(batches):
            started = clock()
            for i in range(per_batch):
                await send_request.send(i)
                await receive_reply.receive()
            means.append((clock() - started) / per_batch)
        cpu = time.process_time() - cpu_started
        samples: list[float] = []
        for i in range(count):
            t0 = clock()
            await send_request.send(i)
            await receive_reply.receive()
            samples.append(clock() - t0)
        nursery.cancel_scope.cancel()
    return {
        "hops": count,
        "mean_us": percentile(means, 50) * 1e6,
        "cpu_us": cpu / (per_batch * batches) * 1e6,
        "p50_us": percentile(samples, 50) * 1e6,
        "p99_us": percentile(samples, 99) * 1e6,
    }


async def _concurrent(n: int, k: int, waves: int, progress: Progress, label: str) -> dict[str, Any]:
    """``n`` client/server pairs, each client doing ``k`` hops; repeated ``waves`` times."""
    latencies: list[float] = []
    elapsed = cpu = 0.0
    mem_per_task = None
    for wave in range(waves):
        pairs = []
        async with trio.open_nursery() as servers:
            before = settled_rss() if wave == 0 else 0
            for _ in range(n):
                send_request, receive_request = trio.open_memory_channel[int](1)
                send_reply, receive_reply = trio.open_memory_channel[int](1)
                servers.start_soon(_serve, receive_request, send_reply)
                pairs.append((send_request, receive_reply))
            await trio.testing.wait_all_tasks_blocked()  # every server blocks on its channel: n idle "agents"
            if wave == 0:
                mem_per_task = (settled_rss() - before) / n

            async def client(send_request: trio.MemorySendChannel[int], receive_reply: trio.MemoryReceiveChannel[int]) -> None:
                now = trio.current_time
                for i in range(k):
                    t0 = now()
                    await send_request.send(i)
                    await receive_reply.receive()
                    latencies.append(now() - t0)

            started, cpu_started = time.perf_counter(), time.process_time()
            async with trio.open_nursery() as clients:
                for send_request, receive_reply in pairs:
                    clients.start_soon(client, send_request, receive_reply)
            elapsed += time.perf_counter() - started
            cpu += time.process_time() - cpu_started
            servers.cancel_scope.cancel()
        progress((wave + 1) / waves, label)
    hops = n * k * waves
    return {
        "n": n,
        "k": k,
        "waves": waves,
        "hops": hops,
        "seconds": elapsed,
        "hops_per_s": hops / elapsed,
        "cpu_us_per_hop": cpu / hops * 1e6,
        "p50_ms": percentile(latencies, 50) * 1e3,
        "p99_ms": percentile(latencies, 99) * 1e3,
        "mem_per_idle_kb": mem_per_task / 1024 if mem_per_task is not None else None,
    }


async def run_floor(params: dict[str, Any], progress: Progress) -> dict[str, Any]:
    """``params``: ``ns``, ``k``, ``min_turns`` (as for the agents), ``sequential_hops``."""
    hop = await _sequential_hops(params["sequential_hops"])
    rows = []
    ns = params["ns"]
    for index, n in enumerate(ns):
        waves = waves_for(n, params["k"], params["min_turns"])

        def sub(fraction: float, label: str, index: int = index) -> None:
            progress((index + fraction) / len(ns), label)

        rows.append(await _concurrent(n, params["k"], waves, sub, f"floor N={n}"))
    return {"hop": hop, "rows": rows}


async def run_floor_bare(params: dict[str, Any], progress: Progress) -> dict[str, Any]:
    """A plain trio task per agent: ``n`` pairs, ``k`` hops each (the bare comparison)."""
    row = await _concurrent(params["n"], params["k"], 1, progress, f"floor N={params['n']}")
    return {"n": row["n"], "k": row["k"], "turns": row["hops"], "turns_per_s": row["hops_per_s"],
            "cpu_us_per_turn": row["cpu_us_per_hop"], "seconds": row["seconds"]}
