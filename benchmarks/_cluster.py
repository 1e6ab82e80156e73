"""``loopdock bench --cluster``: the same turns on one process and on a Redis cluster.

One run, on a private redis-server (append-only file, ``appendfsync everysec``):

- **embedded**: ``n`` agents in one process, each sending ``k`` followups one after the
  other's turn ended (the single-process benchmark's shape: model answer -> tool call ->
  answer, with the built-in ``list_dir`` tool since workers load no benchmark tools);
- **cluster, 1 and 2 workers**: the same from a client process to ``loopdock worker``
  processes (the client's own CPU is on the same 2 cores), with the CPU time each
  process spent per turn (workers, client, redis-server; from /proc) and how many cores
  that kept busy: one worker whose run keeps every core busy leaves nothing for a second;
- **per-turn overhead**: one agent's turns one after the other, embedded and clustered
  (median turn time; the difference is what the cluster path adds to a message);
- **failover**: two workers, kill -9 one, then every agent gets a followup: how long until
  every shard has an owner again, how long until every agent has answered, and whether
  any turn was lost or doubled.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, TextIO

import trio

from loopdock import GC_THRESHOLD, Runtime, open_cluster

from ._common import machine, process_cpu_seconds, summary_ms
from ._redis import RedisServer

TASK = 'call: list_dir {"path": "."}'
CONFIGS: dict[str, dict[str, Any]] = {
    "full": {"n": 60, "k": 10, "sequential": 100, "ttl": 2.0, "shards": 32, "repeats": 3},
    "quick": {"n": 8, "k": 3, "sequential": 10, "ttl": 1.0, "shards": 8, "repeats": 1},
}


async def _turns(agents: list[Any], k: int, latencies: list[float]) -> float:
    async def client(agent: Any) -> None:
        for _ in range(k):
            t0 = time.perf_counter()
            agent.followup(TASK)
            await agent.wait_idle()
            latencies.append(time.perf_counter() - t0)

    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for agent in agents:
            nursery.start_soon(client, agent)
    return time.perf_counter() - started


def _cpu_seconds(pids: dict[str, list[int]]) -> dict[str, float | None]:
    """CPU seconds so far of each role's processes, summed; None where unreadable."""
    spent: dict[str, float | None] = {}
    for role, role_pids in pids.items():
        values = [process_cpu_seconds(pid) for pid in role_pids]
        spent[role] = None if any(v is None for v in values) else sum(v for v in values if v is not None)
    return spent


async def _metered_turns(
    agents: list[Any], k: int, latencies: list[float], pids: dict[str, list[int]]
) -> dict[str, Any]:
    """``_turns``, with the CPU time each role's processes spent per turn meanwhile and
    how many cores that kept busy (all of them: this machine had no room for more)."""
    before = _cpu_seconds(pids)
    seconds = await _turns(agents, k, latencies)
    after = _cpu_seconds(pids)
    turns = len(agents) * k
    per_turn: dict[str, float | None] = {}
    for role in pids:
        b, a = before[role], after[role]
        per_turn[role] = None if a is None or b is None else (a - b) / turns * 1e6
    known = [v for v in per_turn.values() if v is not None]
    every = len(known) == len(per_turn)
    per_turn["all"] = sum(known) if every else None
    busy = per_turn["all"] * 1e-6 * turns / seconds if per_turn["all"] is not None else None
    return {"seconds": seconds, "cpu_us_per_turn": per_turn, "cores_busy": busy}


async def _embedded(n: int, k: int, scratch: Path) -> dict[str, Any]:
    work = scratch / "work"
    work.mkdir(exist_ok=True)
    latencies: list[float] = []
    async with Runtime.open(scratch / "embedded-home", gc_threshold=GC_THRESHOLD) as rt:
        handles = [await rt.create_agent(session_id=f"e{i}", loop="standard", cwd=str(work)) for i in range(n)]
        metered = await _metered_turns([h.agent for h in handles], k, latencies, {"process": [os.getpid()]})
    shutil.rmtree(scratch / "embedded-home", ignore_errors=True)
    return {"n": n, "k": k, "turns_per_s": n * k / metered["seconds"], **metered, "turn": summary_ms(latencies)}


class _Workers:
    def __init__(self, url: str, scratch: Path, ttl: float, shards: int) -> None:
        self.url, self.scratch, self.ttl, self.shards = url, scratch, ttl, shards
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self, name: str) -> subprocess.Popen[bytes]:
        log = open(self.scratch / f"worker-{name}.log", "wb")  # noqa: SIM115 (closed with the process)
        process = subprocess.Popen(
            [sys.executable, "-P", "-m", "loopdock", "worker", "--cluster", self.url, "--home", str(self.scratch / name),
             "--id", name, "--lease-ttl", str(self.ttl), "--shards", str(self.shards)],
            stdout=subprocess.PIPE, stderr=log,
        )
        assert process.stdout is not None
        line = process.stdout.readline().decode()
        if "serving" not in line:
            raise RuntimeError(f"worker {name} did not start: {line!r} (see {log.name})")
        self.processes.append(process)
        return process

    def stop_all(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
        self.processes = []


async def _balanced(rt: Any, workers: int, shards: int) -> None:
    """Wait until ``workers`` workers hold every shard between them, evenly."""
    from loopdock.runtime.cluster import keys

    share = -(-shards // workers)
    while True:
        owners = await rt._redis.mget([keys.lease(s) for s in range(shards)])
        held = [o.split("/")[0] for o in owners if o]
        counts = {w: held.count(w) for w in set(held)}
        if len(held) == shards and len(counts) == workers and max(counts.values()) <= share:
            return
        await trio.sleep(0.05)


async def _clustered(server: RedisServer, cfg: dict[str, Any], scratch: Path, workers: int) -> dict[str, Any]:
    from loopdock.runtime.cluster import connect

    async with connect(server.url) as redis:
        await redis.flushall()
    group = _Workers(server.url, scratch, cfg["ttl"], cfg["shards"])
    try:
        for i in range(workers):
            group.start(f"w{workers}-{i}")
        latencies: list[float] = []
        async with open_cluster(server.url) as rt:
            with trio.fail_after(60):
                await _balanced(rt, workers, cfg["shards"])
            agents = [(await rt.create_agent(session_id=f"c{i}", loop="standard")).agent for i in range(cfg["n"])]
            assert server.process is not None
            pids = {"workers": [p.pid for p in group.processes], "client": [os.getpid()],
                    "redis": [server.process.pid]}
            metered = await _metered_turns(agents, cfg["k"], latencies, pids)
    finally:
        group.stop_all()
    n, k = cfg["n"], cfg["k"]
    return {"workers": workers, "n": n, "k": k, "turns_per_s": n * k / metered["seconds"], **metered,
            "turn": summary_ms(latencies)}


async def _sequential(server: RedisServer, cfg: dict[str, Any], scratch: Path) -> dict[str, Any]:
    from loopdock.runtime.cluster import connect

    turns = cfg["sequential"]
    embedded: list[float] = []
    clustered: list[float] = []
    work = scratch / "work"
    work.mkdir(exist_ok=True)
    async with Runtime.open(scratch / "seq-home", gc_threshold=GC_THRESHOLD) as rt:
        handle = await rt.create_agent(session_id="one", loop="standard", cwd=str(work))
        await _turns([handle.agent], turns, embedded)
    shutil.rmtree(scratch / "seq-home", ignore_errors=True)
    async with connect(server.url) as redis:
        await redis.flushall()
    group = _Workers(server.url, scratch, cfg["ttl"], cfg["shards"])
    try:
        group.start("seq")
        async with open_cluster(server.url) as client:
            with trio.fail_after(60):
                await _balanced(client, 1, cfg["shards"])
            agent = (await client.create_agent(session_id="one", loop="standard")).agent
            await _turns([agent], turns, clustered)
    finally:
        group.stop_all()
    e, c = statistics.median(embedded), statistics.median(clustered)
    return {"turns": turns, "embedded_ms": e * 1e3, "cluster_ms": c * 1e3, "overhead_ms": (c - e) * 1e3}


async def _failover(server: RedisServer, cfg: dict[str, Any], scratch: Path) -> dict[str, Any]:
    from loopdock.runtime.cluster import connect, keys

    async with connect(server.url) as redis:
        await redis.flushall()
    group = _Workers(server.url, scratch, cfg["ttl"], cfg["shards"])
    try:
        victim = group.start("f-a")
        group.start("f-b")
        async with open_cluster(server.url) as rt:
            with trio.fail_after(60):
                await _balanced(rt, 2, cfg["shards"])
            agents = [(await rt.create_agent(session_id=f"f{i}", loop="standard")).agent for i in range(cfg["n"])]
            await _turns(agents, 1, [])
            victim.kill()
            killed = time.perf_counter()
            sent = [agent.followup(TASK) for agent in agents]
            owned_at: float | None = None

            async def watch_leases() -> None:
                nonlocal owned_at
                while True:
                    owners = await rt._redis.mget([keys.lease(s) for s in range(cfg["shards"])])
                    if all(o and not o.startswith("f-a/") for o in owners):
                        owned_at = time.perf_counter() - killed
                        return
                    await trio.sleep(0.01)

            with trio.fail_after(10 * cfg["ttl"] + 30):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(watch_leases)
                    for agent in agents:
                        nursery.start_soon(agent.wait_idle)
            answered = time.perf_counter() - killed
            logs = [await rt.read_events(agent.id) for agent in agents]
    finally:
        group.stop_all()
    lost = doubled = 0
    for events, message in zip(logs, sent, strict=True):
        count = [e.data.get("id") for e in events if e.type == "user/message"].count(message.id)
        lost += count == 0
        doubled += count > 1
    return {"ttl_s": cfg["ttl"], "shards_owned_again_s": owned_at, "all_answered_s": answered,
            "agents": len(agents), "lost_turns": lost, "doubled_turns": doubled}


async def _run(cfg: dict[str, Any], scratch: Path, progress: TextIO) -> dict[str, Any]:
    server = RedisServer(scratch / "redis", fsync="everysec")
    (scratch / "redis").mkdir()
    server.start()
    try:
        runs: dict[str, list[dict[str, Any]]] = {"embedded": [], "cluster-1": [], "cluster-2": []}
        for r in range(cfg["repeats"]):
            order = ["embedded", "cluster-1", "cluster-2"] if r % 2 == 0 else ["cluster-2", "cluster-1", "embedded"]
            for name in order:
                print(f"loopdock bench --cluster: {name} (run {r + 1}/{cfg['repeats']})", file=progress, flush=True)
                if name == "embedded":
                    runs[name].append(await _embedded(cfg["n"], cfg["k"], scratch))
                else:
                    runs[name].append(await _clustered(server, cfg, scratch, int(name[-1])))
        print("loopdock bench --cluster: per-turn overhead", file=progress, flush=True)
        sequential = await _sequential(server, cfg, scratch)
        print("loopdock bench --cluster: failover after kill -9", file=progress, flush=True)
        failover = await _failover(server, cfg, scratch)
    finally:
        server.stop()

    def median(name: str, key: str = "turns_per_s") -> float | None:
        values = [run[key] for run in runs[name] if run.get(key) is not None]
        return statistics.median(values) if values else None

    def cpu(role: str) -> float | None:
        values = [run["cpu_us_per_turn"][role] for run in runs["cluster-1"]
                  if run["cpu_us_per_turn"].get(role) is not None]
        return statistics.median(values) if values else None

    busy = median("cluster-1", "cores_busy")

    return {
        "runs": runs, "sequential": sequential, "failover": failover,
        "figures": {
            "embedded_turns_per_s": median("embedded"),
            "cluster_1_turns_per_s": median("cluster-1"),
            "cluster_2_turns_per_s": median("cluster-2"),
            "two_workers_vs_one": _ratio(median("cluster-2"), median("cluster-1")),
            # With 1 worker: CPU per turn by role, the cores that kept busy, and so the
            # most any number of workers could give on this machine if a turn cost each
            # process what it cost there (it costs more with two: smaller batches).
            "cluster_1_cpu_us_per_turn": {role: cpu(role) for role in ("workers", "client", "redis", "all")},
            "cluster_1_cores_busy": busy,
            "workers_ceiling_vs_one": _ratio(os.cpu_count(), busy),
            "overhead_ms_per_turn": sequential["overhead_ms"],
            "failover_s": failover["all_answered_s"],
            "failover_vs_ttl": failover["all_answered_s"] / cfg["ttl"],
        },
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def run_cluster(mode: str, out_dir: Path, stdout: TextIO) -> dict[str, Any]:
    cfg = CONFIGS[mode]
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="loopdock-bench-cluster-") as scratch:
        result = trio.run(_run, cfg, Path(scratch), sys.stderr)
    result.update({"schema": 1, "mode": mode, "config": cfg, "machine": machine(),
                   "seconds": time.monotonic() - started})
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"bench-cluster-{mode}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    f = result["figures"]
    print(f"cluster benchmark ({mode}: {cfg['n']} agents x {cfg['k']} turns, median of {cfg['repeats']}; "
          f"{os.cpu_count()} CPUs)", file=stdout)
    print(f"  embedded           {f['embedded_turns_per_s']:9.1f} turns/s", file=stdout)
    print(f"  cluster, 1 worker  {f['cluster_1_turns_per_s']:9.1f} turns/s", file=stdout)
    print(f"  cluster, 2 workers {f['cluster_2_turns_per_s']:9.1f} turns/s  "
          f"({f['two_workers_vs_one']:.2f}x one worker; target 1.7x)", file=stdout)
    cpu = f["cluster_1_cpu_us_per_turn"]
    if cpu["all"] is not None and f["cluster_1_cores_busy"] is not None:
        print(f"  1 worker's CPU     {cpu['all']:9.0f} us per turn (worker {cpu['workers']:.0f}, client "
              f"{cpu['client']:.0f}, redis {cpu['redis']:.0f}); {f['cluster_1_cores_busy']:.2f} of "
              f"{os.cpu_count()} cores busy: more workers at most {f['workers_ceiling_vs_one']:.2f}x one here",
              file=stdout)
    else:
        print("  1 worker's CPU     not measured (no /proc)", file=stdout)
    print(f"  per-turn overhead  {f['overhead_ms_per_turn']:9.2f} ms (one agent, median turn)", file=stdout)
    fo = result["failover"]
    print(f"  failover           {fo['all_answered_s']:9.2f} s until every agent answered "
          f"({f['failover_vs_ttl']:.2f} x ttl {fo['ttl_s']:g} s; target < 2); shards owned again after "
          f"{fo['shards_owned_again_s']:.2f} s; lost {fo['lost_turns']}, doubled {fo['doubled_turns']}", file=stdout)
    print(f"  written to {path}", file=stdout)
    return result
