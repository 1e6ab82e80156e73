"""``loopdock bench --cluster``: what a turn costs on one process and on a Redis cluster.

One run, on a private redis-server (append-only file, ``appendfsync everysec``), repeated
``repeats`` times in alternating order:

- **embedded**: ``n`` agents in one process, each sending ``k`` followups one after the
  other's turn ended (the single-process benchmark's shape: model answer -> tool call ->
  answer, with the built-in ``list_dir`` tool since workers load no benchmark tools);
- **cluster, 1, 2 and 4 workers**: the same from a client process to ``loopdock worker``
  processes, all on this machine's cores. The figure is CPU time, not wall-clock time
  (the machine is shared and small): what each process spent per turn (each worker, the
  client, redis-server; user + system from /proc), and what went over the wire per turn
  (Redis's ``INFO commandstats`` and ``INFO stats`` deltas; each process's requests sent
  and bytes in and out on its connections to Redis, from the kernel's TCP counters, ``ss``);
- **per-turn overhead**: one agent's turns one after the other, embedded and clustered
  (median turn time; the difference is what the cluster path adds to a message);
- **failover**: two workers, kill -9 one, then every agent gets a followup: how long until
  every shard has an owner again, how long until every agent has answered, and whether
  any turn was lost or doubled.

From the 1-worker figures, a projection of throughput on bigger machines (``projection``,
its assumptions written next to it).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import trio

from loopdock import GC_THRESHOLD, Runtime, open_cluster

from ._common import machine, process_cpu_seconds, summary_ms
from ._redis import RedisServer

TASK = 'call: list_dir {"path": "."}'
CONFIGS: dict[str, dict[str, Any]] = {
    "full": {"n": 60, "k": 30, "sequential": 100, "ttl": 2.0, "shards": 32, "repeats": 5, "workers": [1, 2, 4]},
    "quick": {"n": 8, "k": 3, "sequential": 10, "ttl": 1.0, "shards": 8, "repeats": 1, "workers": [1, 2, 4]},
}
#: The targets (docs/cluster.md): all processes' CPU per turn at most this many times the
#: embedded path's, and the workers' CPU per turn with more workers at most this many
#: times one worker's.
TARGET_VS_EMBEDDED = 2.0
TARGET_WORKERS_VS_ONE = 1.1
#: The cores the projection is made for.
PROJECTED_CORES = (8, 32)
#: INFO stats counters kept per turn.
_STATS = ("total_net_input_bytes", "total_net_output_bytes", "total_reads_processed", "total_commands_processed")


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


def _cpu_seconds(pids: Sequence[int]) -> list[float | None]:
    return [process_cpu_seconds(pid) for pid in pids]


def _per_turn(before: Sequence[float | None], after: Sequence[float | None], turns: int, scale: float) -> list[float | None]:
    return [None if a is None or b is None else (a - b) / turns * scale for b, a in zip(before, after, strict=True)]


def _sum(values: Sequence[float | None]) -> float | None:
    return None if any(v is None for v in values) else sum(v for v in values if v is not None)


_SS_PID = re.compile(r"pid=(\d+),")
_SS_FIELD = re.compile(r"\b(bytes_acked|bytes_received|data_segs_out|data_segs_in):(\d+)")


def tcp_counters(port: int) -> dict[tuple[int, str], dict[str, int]] | None:
    """Per connection to ``port`` on this machine (keyed by the owning pid and the local
    address): the kernel's counts of data segments sent and received and of bytes acked
    and received (``ss -tinp``); None without ``ss``."""
    if shutil.which("ss") is None:
        return None
    out = subprocess.run(["ss", "-tinpH", "state", "established", f"( dport = :{port} )"],
                         capture_output=True, text=True, timeout=10).stdout
    found: dict[tuple[int, str], dict[str, int]] = {}
    head: tuple[int, str] | None = None
    for line in out.splitlines():
        if not line.startswith((" ", "\t")):
            pid = _SS_PID.search(line)
            parts = line.split()
            head = (int(pid.group(1)), parts[2]) if pid and len(parts) > 2 else None
        elif head is not None:
            found[head] = {name: int(value) for name, value in _SS_FIELD.findall(line)}
    return found


def _wire_per_turn(
    before: dict[tuple[int, str], dict[str, int]] | None, after: dict[tuple[int, str], dict[str, int]] | None,
    pid: int, turns: int,
) -> dict[str, float] | None:
    """A process's requests sent to Redis (TCP data segments: a pipeline is one), replies
    received, and bytes sent and received per turn, over its connections (one opened
    meanwhile counts from zero; one closed meanwhile is missed)."""
    if before is None or after is None:
        return None
    total = {"requests": 0, "replies": 0, "bytes_out": 0, "bytes_in": 0}
    names = {"data_segs_out": "requests", "data_segs_in": "replies", "bytes_acked": "bytes_out",
             "bytes_received": "bytes_in"}
    for key, counters in after.items():
        if key[0] != pid:
            continue
        earlier = before.get(key, {})
        for field, name in names.items():
            total[name] += counters.get(field, 0) - earlier.get(field, 0)
    return {name: value / turns for name, value in total.items()}


async def _redis_counters(redis: Any) -> tuple[dict[str, dict[str, int]], dict[str, int]]:
    commands = await redis.info("commandstats")
    stats = await redis.info("stats")
    per_command = {name.removeprefix("cmdstat_"): {"calls": int(v["calls"]), "usec": int(v["usec"])}
                   for name, v in commands.items()}
    return per_command, {name: int(stats[name]) for name in _STATS}


def _redis_per_turn(
    before: tuple[dict[str, dict[str, int]], dict[str, int]], after: tuple[dict[str, dict[str, int]], dict[str, int]],
    turns: int,
) -> dict[str, Any]:
    commands: dict[str, dict[str, float]] = {}
    for name, now in after[0].items():
        then = before[0].get(name, {"calls": 0, "usec": 0})
        calls = now["calls"] - then["calls"]
        if calls > 0:
            commands[name] = {"calls": calls / turns, "usec": (now["usec"] - then["usec"]) / turns}
    stats = {name: (after[1][name] - before[1][name]) / turns for name in _STATS}
    return {"commands": dict(sorted(commands.items(), key=lambda kv: -kv[1]["usec"])), "stats": stats}


async def _embedded(n: int, k: int, scratch: Path) -> dict[str, Any]:
    work = scratch / "work"
    work.mkdir(exist_ok=True)
    latencies: list[float] = []
    async with Runtime.open(scratch / "embedded-home", gc_threshold=GC_THRESHOLD) as rt:
        handles = [await rt.create_agent(session_id=f"e{i}", loop="standard", cwd=str(work)) for i in range(n)]
        before = _cpu_seconds([os.getpid()])
        seconds = await _turns([h.agent for h in handles], k, latencies)
        after = _cpu_seconds([os.getpid()])
    shutil.rmtree(scratch / "embedded-home", ignore_errors=True)
    cpu = _per_turn(before, after, n * k, 1e6)[0]
    return {"n": n, "k": k, "seconds": seconds, "turns_per_s": n * k / seconds, "cpu_us_per_turn": {"all": cpu},
            "turn": summary_ms(latencies)}


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
    n, k = cfg["n"], cfg["k"]
    turns = n * k
    try:
        for i in range(workers):
            group.start(f"w{workers}-{i}")
        latencies: list[float] = []
        async with open_cluster(server.url) as rt:
            with trio.fail_after(60):
                await _balanced(rt, workers, cfg["shards"])
            agents = [(await rt.create_agent(session_id=f"c{i}", loop="standard")).agent for i in range(n)]
            assert server.process is not None
            worker_pids = [p.pid for p in group.processes]
            pids = [*worker_pids, os.getpid(), server.process.pid]
            redis_before = await _redis_counters(rt._redis)
            tcp_before = tcp_counters(server.port)
            cpu_before = _cpu_seconds(pids)
            seconds = await _turns(agents, k, latencies)
            cpu_after = _cpu_seconds(pids)
            tcp_after = tcp_counters(server.port)
            redis_after = await _redis_counters(rt._redis)
    finally:
        group.stop_all()
    cpu = _per_turn(cpu_before, cpu_after, turns, 1e6)
    each_worker = cpu[:workers]
    per_role: dict[str, float | None] = {"workers": _sum(each_worker), "client": cpu[workers], "redis": cpu[workers + 1]}
    per_role["all"] = _sum(list(per_role.values()))
    return {
        "workers": workers, "n": n, "k": k, "seconds": seconds, "turns_per_s": turns / seconds,
        "cpu_us_per_turn": per_role, "cpu_us_per_turn_each_worker": each_worker,
        "redis": _redis_per_turn(redis_before, redis_after, turns),
        "wire": {
            "client": _wire_per_turn(tcp_before, tcp_after, os.getpid(), turns),
            "workers": [_wire_per_turn(tcp_before, tcp_after, pid, turns) for pid in worker_pids],
        },
        "turn": summary_ms(latencies),
    }


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


def figure(values: Sequence[float | None]) -> dict[str, Any] | None:
    """Median, min and max of a figure over its runs (None if a run lacks it)."""
    if not values or any(v is None for v in values):
        return None
    known = [float(v) for v in values if v is not None]
    return {"median": statistics.median(known), "min": min(known), "max": max(known), "runs": len(known)}


def _med(fig: dict[str, Any] | None) -> float | None:
    return None if fig is None else float(fig["median"])


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _ratio_figure(values: Sequence[float | None], base: Sequence[float | None]) -> dict[str, Any] | None:
    """A ratio's median and spread over runs paired by repeat (run i with run i)."""
    return figure([_ratio(a, b) for a, b in zip(values, base, strict=True)])


def summarise(runs: dict[str, list[dict[str, Any]]], workers: Sequence[int], cpu_count: int | None) -> dict[str, Any]:
    """The figures of a run's repeats: medians with their spread, the targets' ratios,
    the Redis commands and wire traffic per turn, and the projection."""
    embedded = [run["cpu_us_per_turn"]["all"] for run in runs["embedded"]]
    figures: dict[str, Any] = {
        "embedded_cpu_us_per_turn": figure(embedded),
        "embedded_turns_per_s": figure([run["turns_per_s"] for run in runs["embedded"]]),
        "clusters": {},
    }
    one = [run["cpu_us_per_turn"]["workers"] for run in runs["cluster-1"]] if 1 in workers else None
    for w in workers:
        mine = runs[f"cluster-{w}"]
        cpu = {role: figure([run["cpu_us_per_turn"][role] for run in mine])
               for role in ("workers", "client", "redis", "all")}
        commands: dict[str, dict[str, Any]] = {}
        for name in sorted({c for run in mine for c in run["redis"]["commands"]}):
            commands[name] = {
                field: figure([run["redis"]["commands"].get(name, {}).get(field, 0.0) for run in mine])
                for field in ("calls", "usec")
            }
        wire: dict[str, Any] = {}
        if all(run["wire"]["client"] is not None for run in mine):
            wire["client"] = {f: figure([run["wire"]["client"][f] for run in mine])
                              for f in ("requests", "replies", "bytes_out", "bytes_in")}
            # Each worker's requests per turn of the whole run (so they add up), and the
            # workers' sum.
            wire["workers"] = {f: figure([sum(x[f] for x in run["wire"]["workers"]) for run in mine])
                               for f in ("requests", "replies", "bytes_out", "bytes_in")}
            wire["each_worker_requests"] = figure([max(x["requests"] for x in run["wire"]["workers"]) for run in mine])
        figures["clusters"][str(w)] = {
            "turns_per_s": figure([run["turns_per_s"] for run in mine]),
            "cpu_us_per_turn": cpu,
            "all_vs_embedded": _ratio_figure([run["cpu_us_per_turn"]["all"] for run in mine], embedded),
            "workers_vs_one": None if one is None else _ratio_figure(
                [run["cpu_us_per_turn"]["workers"] for run in mine], one),
            "redis_commands": dict(sorted(commands.items(), key=lambda kv: -(_med(kv[1]["usec"]) or 0.0))),
            "redis_stats": {s: figure([run["redis"]["stats"][s] for run in mine]) for s in _STATS},
            "wire": wire,
        }
    c1 = figures["clusters"].get("1")
    if c1 is not None:
        all_ratio = _med(c1["all_vs_embedded"])
        figures["all_vs_embedded_met"] = None if all_ratio is None else all_ratio <= TARGET_VS_EMBEDDED
        more = [_med(figures["clusters"][str(w)]["workers_vs_one"]) for w in workers if w > 1]
        figures["workers_vs_one_met"] = None if any(r is None for r in more) or not more else \
            all(r is not None and r <= TARGET_WORKERS_VS_ONE for r in more)
        figures["projection"] = projection(figures, workers)
    return figures


def projection(figures: dict[str, Any], workers: Sequence[int]) -> dict[str, Any]:
    """Turns per second on machines with more cores, from the CPU each process spent per
    turn here (see ``assumptions``)."""
    clusters = figures["clusters"]
    # The highest of the 1, 2 and 4-worker medians: the cost per turn is not assumed to
    # fall with more workers.
    worker_us, redis_us, client_us = (
        max(_med(clusters[str(w)]["cpu_us_per_turn"][role]) or 0.0 for w in workers)
        for role in ("workers", "redis", "client")
    )
    ceiling = 1e6 / redis_us if redis_us else None
    cores: dict[str, Any] = {}
    for n in PROJECTED_CORES:
        workers_bound = (n - 1) * 1e6 / worker_us if worker_us else None  # one core is Redis's
        bound = min(x for x in (workers_bound, ceiling) if x is not None) if workers_bound or ceiling else None
        cores[str(n)] = {"workers": n - 1, "turns_per_s": bound, "workers_bound": workers_bound,
                         "limited_by": "redis" if ceiling is not None and bound == ceiling else "workers",
                         "clients_cores": bound * client_us / 1e6 if bound else None}
    return {
        "worker_us_per_turn": worker_us, "redis_us_per_turn": redis_us, "client_us_per_turn": client_us,
        "redis_ceiling_turns_per_s": ceiling, "cores": cores,
        "assumptions": [
            "Redis runs single-threaded on a core of its own: at most 1e6 / (its us per turn) turns/s, at the "
            "highest redis-server CPU per turn measured with 1, 2 or 4 workers",
            "every other core runs one worker, at the highest workers' CPU per turn measured with 1, 2 or 4 workers",
            "the clients (the load) run on other machines: their CPU per turn is given, not counted",
            "workers scale until Redis saturates: no other shared limit (network, memory bandwidth, "
            "the append-only file's disk) binds first",
        ],
    }


async def _run(cfg: dict[str, Any], scratch: Path, progress: TextIO) -> dict[str, Any]:
    server = RedisServer(scratch / "redis", fsync="everysec")
    (scratch / "redis").mkdir()
    server.start()
    names = ["embedded", *(f"cluster-{w}" for w in cfg["workers"])]
    try:
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
        for r in range(cfg["repeats"]):
            for name in (names if r % 2 == 0 else names[::-1]):
                print(f"loopdock bench --cluster: {name} (run {r + 1}/{cfg['repeats']})", file=progress, flush=True)
                if name == "embedded":
                    runs[name].append(await _embedded(cfg["n"], cfg["k"], scratch))
                else:
                    runs[name].append(await _clustered(server, cfg, scratch, int(name.split("-")[1])))
        print("loopdock bench --cluster: per-turn overhead", file=progress, flush=True)
        sequential = await _sequential(server, cfg, scratch)
        print("loopdock bench --cluster: failover after kill -9", file=progress, flush=True)
        failover = await _failover(server, cfg, scratch)
    finally:
        server.stop()
    figures = summarise(runs, cfg["workers"], os.cpu_count())
    figures.update({
        "overhead_ms_per_turn": sequential["overhead_ms"],
        "failover_s": failover["all_answered_s"],
        "failover_vs_ttl": failover["all_answered_s"] / cfg["ttl"],
    })
    return {"runs": runs, "sequential": sequential, "failover": failover, "figures": figures}


def run_cluster(mode: str, out_dir: Path, stdout: TextIO) -> dict[str, Any]:
    cfg = CONFIGS[mode]
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="loopdock-bench-cluster-") as scratch:
        result = trio.run(_run, cfg, Path(scratch), sys.stderr)
    result.update({"schema": 2, "mode": mode, "config": cfg, "machine": machine(),
                   "seconds": time.monotonic() - started})
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"bench-cluster-{mode}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    _print(result, stdout)
    print(f"  written to {path}", file=stdout)
    return result


def _print(result: dict[str, Any], stdout: TextIO) -> None:
    cfg, f = result["config"], result["figures"]
    print(f"cluster benchmark ({result['mode']}: {cfg['n']} agents x {cfg['k']} turns, median of {cfg['repeats']}; "
          f"{os.cpu_count()} CPUs; CPU time per turn from /proc)", file=stdout)
    embedded = _med(f["embedded_cpu_us_per_turn"])
    print(f"  embedded            {embedded or 0:7.0f} us per turn", file=stdout)
    for w, c in f["clusters"].items():
        cpu = {role: _med(c["cpu_us_per_turn"][role]) for role in ("workers", "client", "redis", "all")}
        if cpu["all"] is None:
            print(f"  cluster, {w} worker(s): CPU not measured (no /proc)", file=stdout)
            continue
        vs_one = _med(c["workers_vs_one"])
        print(f"  cluster, {w} worker(s) {cpu['all']:7.0f} us per turn ({_med(c['all_vs_embedded']) or 0:.2f}x "
              f"embedded; target {TARGET_VS_EMBEDDED:g}x): workers {cpu['workers']:.0f} ({vs_one or 0:.2f}x one; "
              f"target {TARGET_WORKERS_VS_ONE:g}x), client {cpu['client']:.0f}, redis {cpu['redis']:.0f}", file=stdout)
    p = f.get("projection")
    if p is not None:
        for n, c in p["cores"].items():
            print(f"  projected on {n} cores: {c['turns_per_s'] or 0:,.0f} turns/s ({c['workers']} workers; "
                  f"limited by {c['limited_by']})", file=stdout)
    print(f"  per-turn overhead   {f['overhead_ms_per_turn']:7.2f} ms (one agent, median turn)", file=stdout)
    fo = result["failover"]
    print(f"  failover            {fo['all_answered_s']:7.2f} s until every agent answered "
          f"({f['failover_vs_ttl']:.2f} x ttl {fo['ttl_s']:g} s; target < 2); shards owned again after "
          f"{fo['shards_owned_again_s']:.2f} s; lost {fo['lost_turns']}, doubled {fo['doubled_turns']}", file=stdout)


async def _ab(cfg: dict[str, Any], scratch: Path, progress: TextIO) -> dict[str, Any]:
    server = RedisServer(scratch / "redis", fsync="everysec")
    (scratch / "redis").mkdir()
    server.start()
    names = ["embedded", *(f"cluster-{w}" for w in cfg["workers"])]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    try:
        for r in range(cfg["repeats"]):
            for name in (names if r % 2 == 0 else names[::-1]):
                print(f"cluster a/b: {name} (run {r + 1}/{cfg['repeats']})", file=progress, flush=True)
                if name == "embedded":
                    runs[name].append(await _embedded(cfg["n"], cfg["k"], scratch))
                else:
                    runs[name].append(await _clustered(server, cfg, scratch, int(name.split("-")[1])))
    finally:
        server.stop()
    return {"runs": runs, "figures": summarise(runs, cfg["workers"], os.cpu_count())}


def main(argv: list[str]) -> int:
    """``python -m loopdock.benchmarks._cluster OUT [REPEATS]``: only the CPU-per-turn runs
    of the full configuration (no overhead or failover phase), for a before/after
    measurement of one change; written to OUT with the commit it ran."""
    out = Path(argv[0])
    cfg = {**CONFIGS["full"], "repeats": int(argv[1]) if len(argv) > 1 else 3}
    with tempfile.TemporaryDirectory(prefix="loopdock-bench-cluster-ab-") as scratch:
        result = trio.run(_ab, cfg, Path(scratch), sys.stderr)
    result.update({"schema": 2, "mode": "ab", "config": cfg, "machine": machine(),
                   "command": "python -m loopdock.benchmarks._cluster " + " ".join(argv)})
    out.write_text(json.dumps(result, indent=2) + "\n")
    f = result["figures"]
    print(f"embedded {_med(f['embedded_cpu_us_per_turn']) or 0:.0f} us per turn", file=sys.stdout)
    for w, c in f["clusters"].items():
        cpu = {role: _med(c["cpu_us_per_turn"][role]) or 0.0 for role in ("workers", "client", "redis", "all")}
        print(f"{w} worker(s): all {cpu['all']:.0f} ({_med(c['all_vs_embedded']) or 0:.2f}x embedded), workers "
              f"{cpu['workers']:.0f} ({_med(c['workers_vs_one']) or 0:.2f}x one), client {cpu['client']:.0f}, "
              f"redis {cpu['redis']:.0f}; evalsha {_med(c['redis_commands'].get('evalsha', {}).get('calls')) or 0:.2f}"
              f"/turn, redis reads {_med(c['redis_stats']['total_reads_processed']) or 0:.2f}/turn", file=sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
