"""`loopdock bench` at a tiny size: it completes and every figure is there and sane.

No timing is asserted (times vary on shared machines). What is checked could fail:
every figure exists and is finite, positive where it must be, consistent with the others
(p50 <= p99 <= max, rates = counts / seconds, ratios = the figures they divide), counts
are exactly what the workload does (turns, steps per loop, samples, pending reservations),
memory per agent is plausible, each target's ``passed`` is its own comparison of the
figure it reports, the quick run says at which N it measured, and the table prints the
same verdicts. The JSON, the table and the plot are written. autogen-core is optional:
without it the peer says "not installed".
"""

import io
import json
import math
import re

import pytest

from benchmarks import _peer_autogen, _run
from benchmarks._agents import MIX
from benchmarks._common import waves_for

TINY = {
    "k": 2,
    "min_turns": 4,
    "tracemalloc_agents": 8,
    "sequential_hops": 200,
    "peer_sequential": 50,
    "priority": {"agents": 4, "pending": 20, "humans": 5, "busy": 2, "busy_interval": 0.01, "one_agent_humans": 2},
    # A relay window below the plugin's batch (200) exercises the "at least one frame" rule.
    "bridge": {
        "sequential": 20, "warmup": 5, "bursts": 2, "burst_size": 10, "agents": 2,
        "ingest_events": 450, "ingest_sessions": 2, "relay_events": 450, "relay_window": 100,
        "goalbar_wakes": 5, "goalbar_flood": 450, "timeout": 60,
    },
}


def positive(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def check_latency(summary, samples=None) -> None:
    assert summary["samples"] > 0 if samples is None else summary["samples"] == samples
    assert positive(summary["p50_ms"])
    assert summary["max_ms"] >= summary["p99_ms"] >= summary["p50_ms"] > 0


def expected_steps(n: int, turns_per_agent: int) -> int:
    """A react-driver turn is two steps (the ping model calls the tool, then answers it),
    a turn of the fake driver loop one; agents take the loops of MIX round-robin."""
    return sum(turns_per_agent * (1 if MIX[i % len(MIX)][0] == "bench-fake" else 2) for i in range(n))


def check_bridge(results, saved) -> None:
    """The bridge workload: every figure there, non-zero, p50 <= p99, counts add up."""
    bridge = results["bridge"]
    assert saved["bridge"] == bridge and bridge["status"] == "ok"
    size = TINY["bridge"]
    for key in ("ping", "pre_step_sequential"):
        check_latency(bridge[key], samples=size["sequential"])
    burst = bridge["pre_step_burst"]
    check_latency(burst, samples=size["bursts"] * size["burst_size"])
    assert positive(burst["verdicts_per_s"])
    ingest = bridge["ingest"]
    assert ingest["events"] == 450 and ingest["frames"] == 4  # 225 per session: 200 + 25
    for key in ("events_per_s", "frames_per_s", "mb_per_s", "chars_per_event"):
        assert positive(ingest[key]), key
    relay = bridge["relay"]
    assert relay["events"] == size["relay_events"] and relay["page_frames"] >= 3
    assert positive(relay["events_per_s"])
    check_latency(relay["latency"], samples=size["relay_events"])
    goalbar = bridge["goalbar"]
    check_latency(goalbar["wake_to_frame"], samples=size["goalbar_wakes"])
    assert 1 <= goalbar["flood_frames"] <= size["goalbar_flood"]
    for key in ("flood_events_per_s", "flood_frames_per_s", "events_per_frame"):
        assert positive(goalbar[key]), key
    assert bridge["errors"] == []
    server = bridge["server"]
    # Every event the client sent was mirrored by the HostHandler, in order, and relayed.
    assert server["ingest_events"] == ingest["events"] and server["relay_events"] == relay["events"]
    assert server["gaps"] == 0 and server["relayed"] == relay["events"] and server["not_relayed"] == 0
    assert server["goalbar_reads"] >= size["goalbar_wakes"] and positive(server["cpu_seconds"])
    assert not any(ending["kind"] == "slow-peer" for ending in server["endings"])
    ratios = results["ratios"]["bridge"]
    hop = results["floor"]["hop"]
    assert ratios["pre_step_p50_vs_floor_hop_p50"] == pytest.approx(bridge["pre_step_sequential"]["p50_ms"] * 1e3 / hop["p50_us"])
    assert ratios["pre_step_p50_vs_ws_ping_p50"] == pytest.approx(bridge["pre_step_sequential"]["p50_ms"] / bridge["ping"]["p50_ms"])
    for key in ("pre_step_p99_vs_floor_hop_p99", "ws_ping_p50_vs_floor_hop_p50", "goalbar_wake_p50_vs_floor_hop_p50"):
        assert positive(ratios[key]), key


def check_many(results, ns) -> None:
    assert [r["n"] for r in results["many"]] == ns
    for row in results["many"]:
        n, k = row["n"], TINY["k"]
        assert (row["k"], row["waves"]) == (k, waves_for(n, k, TINY["min_turns"]))
        assert row["turns"] == n * k * row["waves"] > 0
        assert row["steps"] == expected_steps(n, k) * row["waves"]
        assert row["events"] > row["steps"]  # every step logs its start, and more
        expected_loops = {f"{loop}@{driver or 'default'}" for loop, driver in MIX[: min(n, len(MIX))]}
        assert row["loops"] == sorted(expected_loops)
        for key in ("seconds", "steps_per_s", "us_per_step", "cpu_us_per_step", "peak_rss_mb", "rss_after_run_mb"):
            assert positive(row[key]), key
        assert row["steps_per_s"] == pytest.approx(row["steps"] / row["seconds"])
        assert row["turns_per_s"] == pytest.approx(row["turns"] / row["seconds"])
        assert row["commits"] > 0
        # Memory per idle agent: RSS moves by whole pages and arenas (it can stay flat over
        # a few agents, in pages the allocator already holds, or jump), so over a handful
        # of agents it is only a number; tracemalloc counts the objects themselves: an
        # idle agent (actor, session, inbox, nursery) is surely more than 1 KB of Python
        # objects and less than 1 MB.
        assert finite(row["mem_per_idle_agent_kb"])
        assert row["tracemalloc_agents"] == min(n, TINY["tracemalloc_agents"])
        assert 1 < row["tracemalloc_per_agent_kb"] < 1024
        assert row["peak_rss_mb"] >= row["rss_after_run_mb"] - 1  # a peak is no lower than a later figure
        check_latency(row["admission"], samples=row["turns"])
        check_latency(row["turn"], samples=row["turns"])


def check_targets(results, table: str) -> None:
    """Each target's verdict is its own comparison of the figure it reports, the quick
    run says where it measured, and the table prints the same verdict."""
    ratios, many = results["ratios"], results["many"]
    largest = many[-1]
    targets = {t["id"]: t for t in results["targets"]}
    assert list(targets) == ["step-cost", "throughput", "memory", "human-priority"]

    step = targets["step-cost"]
    assert step["measured"] == ratios["step_cpu_vs_floor_hop_cpu"] and positive(step["measured"])
    assert step["passed"] is (step["measured"] <= 20)

    throughput = targets["throughput"]
    per_n = {r["n"]: r for r in ratios["per_n"]}
    assert throughput["at_n"] == largest["n"]  # the largest N <= 1,000 measured
    assert throughput["measured"] == per_n[largest["n"]]["throughput_vs_peer"]
    if throughput["measured"] is None:
        assert throughput["passed"] is None and results["peer"]["status"] in throughput["note"]
    else:
        assert positive(throughput["measured"]) and throughput["passed"] is (throughput["measured"] >= 2)

    memory = targets["memory"]
    assert memory["at_n"] == largest["n"] and memory["measured"] == largest["mem_per_idle_agent_kb"]
    assert memory["passed"] is (memory["measured"] <= 50)
    assert f"tracemalloc: {largest['tracemalloc_per_agent_kb']:.1f} KB" in memory["note"]

    for target in (throughput, memory):  # a quick run is not at the target's N, and says so
        assert f"quick run: at N={largest['n']}" in target["note"], target

    priority = targets["human-priority"]
    spread = next(r for r in results["priority"]["rows"] if r["scenario"] == "spread")
    assert priority["measured"] == spread["admission"]["p99_ms"] and priority["pending"] == spread["pending"]
    assert priority["passed"] is (priority["measured"] < 5)
    assert "quick run: fewer pending" in priority["note"]

    printed = re.findall(r"^  \[(PASS|MISS|N/A )\] (.+?): ", table, re.MULTILINE)
    assert printed == [
        ({True: "PASS", False: "MISS", None: "N/A "}[t["passed"]], t["target"]) for t in results["targets"]
    ]


def check_results(results, out_dir, table, *, ns, peer_ok) -> None:
    # The JSON on disk is the same, complete, parseable document.
    saved = json.loads((out_dir / "bench-quick.json").read_text())
    assert saved["many"] == results["many"] and saved["targets"] == results["targets"]
    assert saved["mode"] == "quick" and saved["config"]["ns"] == ns
    for key in ("platform", "cpu_count", "python", "trio", "date"):
        assert saved["machine"][key]

    floor = results["floor"]
    hop = floor["hop"]
    assert hop["hops"] == TINY["sequential_hops"]
    assert positive(hop["mean_us"]) and positive(hop["cpu_us"])
    assert hop["p99_us"] >= hop["p50_us"] > 0
    assert [r["n"] for r in floor["rows"]] == ns
    for row in floor["rows"]:
        assert row["hops"] == row["n"] * TINY["k"] * waves_for(row["n"], TINY["k"], TINY["min_turns"])
        assert positive(row["hops_per_s"]) and row["hops_per_s"] == pytest.approx(row["hops"] / row["seconds"])
        assert row["p99_ms"] >= row["p50_ms"] > 0

    check_many(results, ns)

    size = TINY["priority"]
    rows = {r["scenario"]: r for r in results["priority"]["rows"]}
    assert set(rows) == {"spread", "spread+busy", "one-agent"}
    for name, agents, humans, busy in (
        ("spread", size["agents"], size["humans"], 0),
        ("spread+busy", size["agents"], size["humans"], size["busy"]),
        ("one-agent", 1, size["one_agent_humans"], 0),
    ):
        row = rows[name]
        assert (row["agents"], row["humans"], row["busy_agents"]) == (agents, humans, busy)
        # Every holder holds its share again after each person: the count never drifts.
        assert row["pending"] == row["pending_at_end"] == row["per_agent"] * agents > 0
        assert row["per_agent"] == size["pending"] // agents
        check_latency(row["admission"], samples=humans)  # one admission per person measured
    # Busy agents' turns during the measured window: how many depends on timing, none without busy agents.
    assert finite(rows["spread+busy"]["busy_turns_per_s"]) and rows["spread+busy"]["busy_turns_per_s"] >= 0
    assert rows["spread"]["busy_turns_per_s"] == rows["one-agent"]["busy_turns_per_s"] == 0

    peer = results["peer"]
    if peer_ok:
        assert peer["status"] == "ok"
        assert positive(peer["sequential"]["mean_us"])
        for row in peer["rows"]:
            assert positive(row["msgs_per_s"]) and row["p99_ms"] >= row["p50_ms"] > 0
        assert all(positive(r["throughput_vs_peer"]) for r in results["ratios"]["per_n"])
    else:
        assert peer["status"] == "not installed"
        assert all(r["throughput_vs_peer"] is None for r in results["ratios"]["per_n"])

    ratios = results["ratios"]
    one = next(r for r in results["many"] if r["n"] == min(ns))
    assert ratios["step_cpu_vs_floor_hop_cpu"] == pytest.approx(one["cpu_us_per_step"] / hop["cpu_us"])
    assert ratios["step_vs_floor_hop"] == pytest.approx(one["us_per_step"] / hop["mean_us"])
    check_targets(results, table)
    check_bridge(results, saved)

    for heading in ("Many agents", "Latency, ms", "Memory", "Human priority", "Targets", "Bridge:", "pre-step -> verdict", "GoalBar"):
        assert heading in table
    png = out_dir / "bench-quick.png"
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert results["files"]["png_skipped"] and not png.exists()
    else:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_quick_bench_as_loopdock_bench_quick_runs_it(tmp_path, monkeypatch):
    """Every phase is handed to a child process, as `loopdock bench --quick` does. The
    many-agents phase (the one whose memory figures the isolation keeps clean) really runs
    in a fresh interpreter; to keep the suite quick, the other phases run in this process
    behind the same call (they keep no state of their own to keep apart)."""
    real_child, handed = _run._in_child, []

    def in_child(phase, params, progress):
        handed.append(phase)
        if phase == "many":
            return real_child(phase, params, progress)
        return _run.run_phase(phase, params, progress)

    monkeypatch.setattr(_run, "_in_child", in_child)
    peer_ok = _peer_autogen.available()
    out, progress = io.StringIO(), io.StringIO()
    results = _run.run(
        "quick", tmp_path, isolate=True, config={**TINY, "ns": [1, 8]}, stdout=out, progress_stream=progress
    )
    peer = ["peer"] if peer_ok else []
    assert handed == ["floor", *peer, "many", "many", "priority", "bridge"]
    check_results(results, tmp_path, out.getvalue(), ns=[1, 8], peer_ok=peer_ok)
    if not peer_ok:
        assert "not installed" in out.getvalue()
    # The progress reporter ran (non-tty form): one line per phase, in order.
    done = re.findall(r"^bench: done (.+?) \[", progress.getvalue(), re.MULTILINE)
    assert done == ["floor: trio channels", *(["peer: autogen-core"] if peer_ok else []),
                    "agents: N=1", "agents: N=8", "human priority", "bridge: websocket"]


def test_in_process_runs_the_phases_here(tmp_path, monkeypatch):
    """`--in-process` (isolate=False): loopdock's phases run in this process, no child."""

    class Stop(Exception):
        pass

    ran = []

    def run_phase(phase, params, progress):
        ran.append(phase)
        raise Stop  # the first phase is enough to see where it runs

    def no_child(phase, params, progress):
        raise AssertionError(f"phase {phase} was handed to a child process")

    monkeypatch.setattr(_peer_autogen, "available", lambda: False)
    monkeypatch.setattr(_run, "run_phase", run_phase)
    monkeypatch.setattr(_run, "_in_child", no_child)
    with pytest.raises(Stop):
        _run.run("quick", tmp_path, isolate=False, config={**TINY, "ns": [1]}, stdout=io.StringIO(), show_progress=False)
    assert ran == ["floor"]


@pytest.mark.parametrize("argv", [["bench", "--help"]])
def test_bench_is_a_loopdock_command(argv, capsys):
    from loopdock._cli import main

    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 0
    assert "--quick" in capsys.readouterr().out
