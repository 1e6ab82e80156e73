"""`loopdock bench` at a tiny size: it completes and every figure is there and sane.

No timing is asserted (times vary on shared machines): only that figures exist, are
positive where they must be, and are consistent (p99 >= p50), and that the JSON, the
table and the plot are written. autogen-core is optional: without it the peer says
"not installed".
"""

import io
import json
import math

import pytest

from benchmarks import _peer_autogen, _run

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


def check_latency(summary) -> None:
    assert summary["samples"] > 0
    assert positive(summary["p50_ms"])
    assert summary["max_ms"] >= summary["p99_ms"] >= summary["p50_ms"] > 0


def check_bridge(results, saved) -> None:
    """The bridge workload: every figure there, non-zero, p50 <= p99, counts add up."""
    bridge = results["bridge"]
    assert saved["bridge"] == bridge and bridge["status"] == "ok"
    size = TINY["bridge"]
    for key in ("ping", "pre_step_sequential"):
        check_latency(bridge[key])
        assert bridge[key]["samples"] == size["sequential"]
    burst = bridge["pre_step_burst"]
    check_latency(burst)
    assert burst["samples"] == size["bursts"] * size["burst_size"] and positive(burst["verdicts_per_s"])
    ingest = bridge["ingest"]
    assert ingest["events"] == 450 and ingest["frames"] == 4  # 225 per session: 200 + 25
    for key in ("events_per_s", "frames_per_s", "mb_per_s", "chars_per_event"):
        assert positive(ingest[key]), key
    relay = bridge["relay"]
    assert relay["events"] == size["relay_events"] and relay["page_frames"] >= 3
    assert positive(relay["events_per_s"])
    check_latency(relay["latency"])
    assert relay["latency"]["samples"] == size["relay_events"]
    goalbar = bridge["goalbar"]
    check_latency(goalbar["wake_to_frame"])
    assert goalbar["wake_to_frame"]["samples"] == size["goalbar_wakes"]
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
    for key in ("pre_step_p50_vs_floor_hop_p50", "pre_step_p99_vs_floor_hop_p99", "pre_step_p50_vs_ws_ping_p50",
                "ws_ping_p50_vs_floor_hop_p50", "goalbar_wake_p50_vs_floor_hop_p50"):
        assert positive(ratios[key]), key


def check_results(results, out_dir, *, ns, peer_ok, rss_n=None) -> None:
    # The JSON on disk is the same, complete, parseable document.
    saved = json.loads((out_dir / "bench-quick.json").read_text())
    assert saved["many"] == results["many"]
    for key in ("platform", "cpu_count", "python", "trio", "date"):
        assert saved["machine"][key]

    floor = results["floor"]
    assert positive(floor["hop"]["mean_us"]) and positive(floor["hop"]["cpu_us"])
    assert floor["hop"]["p99_us"] >= floor["hop"]["p50_us"] > 0
    assert [r["n"] for r in floor["rows"]] == ns
    for row in floor["rows"]:
        assert positive(row["hops_per_s"]) and row["p99_ms"] >= row["p50_ms"] > 0

    assert [r["n"] for r in results["many"]] == ns
    for row in results["many"]:
        assert row["steps"] >= row["turns"] == row["n"] * row["k"] * row["waves"] > 0
        for key in ("steps_per_s", "us_per_step", "cpu_us_per_step", "peak_rss_mb", "tracemalloc_per_agent_kb"):
            assert positive(row[key]), key
        assert isinstance(row["mem_per_idle_agent_kb"], float)
        check_latency(row["admission"])
        check_latency(row["turn"])
    largest = results["many"][-1]
    assert len(largest["loops"]) >= 3  # several loops and drivers at once
    if rss_n is not None:
        # RSS can stay flat over a few hundred small agents (they fit in pages the
        # allocator already holds), so only tracemalloc's figure must be positive.
        assert largest["n"] == rss_n and largest["mem_per_idle_agent_kb"] >= 0
        assert positive(largest["tracemalloc_per_agent_kb"])

    rows = {r["scenario"]: r for r in results["priority"]["rows"]}
    assert set(rows) == {"spread", "spread+busy", "one-agent"}
    for row in rows.values():
        assert row["pending"] == row["pending_at_end"] > 0
        check_latency(row["admission"])

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

    assert positive(results["ratios"]["step_vs_floor_hop"])
    assert positive(results["ratios"]["step_cpu_vs_floor_hop_cpu"])
    assert [t["id"] for t in results["targets"]] == ["step-cost", "throughput", "memory", "human-priority"]
    for target in results["targets"]:
        assert target["passed"] in (True, False, None)
        if target["id"] == "throughput" and not peer_ok:
            assert target["measured"] is None
        elif target["id"] == "memory":
            # An RSS delta over a handful of agents inside a long-lived process can be 0
            # (freed pages get reused); tracemalloc is the figure that must be positive.
            assert target["measured"] >= 0 and positive(largest["tracemalloc_per_agent_kb"])
        else:
            assert positive(target["measured"]), target["id"]
    check_bridge(results, saved)

    png = out_dir / "bench-quick.png"
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert results["files"]["png_skipped"]
    else:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_quick_bench_in_fresh_processes(tmp_path):
    """Each phase in its own process, as `loopdock bench --quick` runs them."""
    out = io.StringIO()
    results = _run.run(
        "quick", tmp_path, isolate=True, config={**TINY, "ns": [1, 200]}, stdout=out, show_progress=False
    )
    check_results(results, tmp_path, ns=[1, 200], peer_ok=_peer_autogen.available(), rss_n=200)
    table = out.getvalue()
    for heading in ("Many agents", "Latency, ms", "Memory", "Human priority", "Targets", "Bridge"):
        assert heading in table
    assert "Bridge:" in table and "pre-step -> verdict" in table and "GoalBar" in table


def test_quick_bench_in_process_without_the_peer(tmp_path, monkeypatch):
    """In this process, with autogen-core missing: the peer column says so."""
    monkeypatch.setattr(_peer_autogen, "available", lambda: False)
    out, progress = io.StringIO(), io.StringIO()
    results = _run.run(
        "quick", tmp_path, isolate=False, config={**TINY, "ns": [1, 8]}, stdout=out, progress_stream=progress
    )
    check_results(results, tmp_path, ns=[1, 8], peer_ok=False)
    assert "not installed" in out.getvalue()
    throughput = next(t for t in results["targets"] if t["id"] == "throughput")
    assert throughput["passed"] is None and "not installed" in throughput["note"]
    assert "bench: done" in progress.getvalue()  # the progress reporter ran (non-tty form)


@pytest.mark.parametrize("argv", [["bench", "--help"]])
def test_bench_is_a_loopdock_command(argv, capsys):
    from loopdock._cli import main

    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 0
    assert "--quick" in capsys.readouterr().out
