"""The peer: the same request/response pattern on autogen-core's SingleThreadedAgentRuntime.

asyncio-based, so it always runs in its own process (``benchmarks._worker peer``) and
never shares an event loop with trio. One agent instance per key of one agent type; each
client awaits ``send_message`` (request -> handler -> response) ``k`` times.
"""

# No `from __future__ import annotations` here: autogen-core reads the handler's type
# hints at class creation, and they must be real classes, not strings.
import asyncio
import importlib.util
import time
from dataclasses import dataclass
from typing import Any

from ._common import Progress, percentile, settled_rss, waves_for

NAME = "autogen-core SingleThreadedAgentRuntime"


def available() -> bool:
    return importlib.util.find_spec("autogen_core") is not None


@dataclass
class Request:
    number: int


@dataclass
class Reply:
    number: int


def _echo_agent_class() -> type:
    from autogen_core import MessageContext, RoutedAgent, message_handler

    class Echo(RoutedAgent):
        def __init__(self) -> None:
            super().__init__("bench echo agent")

        @message_handler
        async def on_request(self, message: Request, ctx: MessageContext) -> Reply:
            return Reply(message.number)

    return Echo


async def _run(params: dict[str, Any], progress: Progress) -> dict[str, Any]:
    from autogen_core import AgentId, SingleThreadedAgentRuntime

    echo = _echo_agent_class()
    runtime = SingleThreadedAgentRuntime()
    await echo.register(runtime, "echo", echo)
    runtime.start()
    clock = time.perf_counter
    try:
        # A single message, sequentially: the peer's cost of one exchange.
        single = AgentId("echo", "single")
        for i in range(200):
            await runtime.send_message(Request(i), single)
        # Median of batch means (robust on a shared machine); p50/p99 from a timed pass.
        count = params["sequential_messages"]
        batches = 10
        per_batch = max(1, count // batches)
        means = []
        cpu_started = time.process_time()
        for _ in range(batches):
            started = clock()
            for i in range(per_batch):
                await runtime.send_message(Request(i), single)
            means.append((clock() - started) / per_batch)
        cpu = time.process_time() - cpu_started
        samples = []
        for i in range(count):
            t0 = clock()
            await runtime.send_message(Request(i), single)
            samples.append(clock() - t0)
        sequential = {
            "messages": count,
            "mean_us": percentile(means, 50) * 1e6,
            "cpu_us": cpu / (per_batch * batches) * 1e6,
            "p50_us": percentile(samples, 50) * 1e6,
            "p99_us": percentile(samples, 99) * 1e6,
        }

        rows = []
        ns, k = params["ns"], params["k"]
        for index, n in enumerate(ns):
            waves = waves_for(n, k, params["min_turns"])
            latencies: list[float] = []
            seconds = cpu = 0.0
            mem_per_agent = None
            for wave in range(waves):
                ids = [AgentId("echo", f"n{n}-w{wave}-a{i}") for i in range(n)]
                before = settled_rss() if wave == 0 else 0
                # autogen creates an agent on its first message: this makes n idle agents.
                await asyncio.gather(*(runtime.send_message(Request(-1), agent) for agent in ids))
                if wave == 0:
                    mem_per_agent = (settled_rss() - before) / n

                async def client(agent: Any) -> None:
                    for i in range(k):
                        t0 = clock()
                        await runtime.send_message(Request(i), agent)
                        latencies.append(clock() - t0)

                started, cpu_started = clock(), time.process_time()
                await asyncio.gather(*(client(agent) for agent in ids))
                seconds += clock() - started
                cpu += time.process_time() - cpu_started
                progress((index + (wave + 1) / waves) / len(ns), f"autogen-core N={n}")
            messages = n * k * waves
            rows.append({
                "n": n,
                "k": k,
                "waves": waves,
                "messages": messages,
                "seconds": seconds,
                "msgs_per_s": messages / seconds,
                "cpu_us_per_msg": cpu / messages * 1e6,
                "p50_ms": percentile(latencies, 50) * 1e3,
                "p99_ms": percentile(latencies, 99) * 1e3,
                "mem_per_idle_kb": mem_per_agent / 1024 if mem_per_agent is not None else None,
            })
    finally:
        await runtime.stop()
    return {"sequential": sequential, "rows": rows}


def run_peer(params: dict[str, Any], progress: Progress) -> dict[str, Any]:
    return asyncio.run(_run(params, progress))
