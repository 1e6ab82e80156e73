"""`loopdock bench` at a tiny size: it completes and every figure is there and sane.

No timing is asserted (times vary on shared machines): only that figures exist, are
positive where they must be, and are consistent (p99 >= p50, max >= median >= min),
that a quick run judges no target, that the JSON, the tables and the plot are written,
and that the committed docs' tables are exactly what the committed JSON generates.
autogen-core is optional: without it the peer says "not installed".
"""

import io
import json
import math
from pathlib import Path

import pytest

from loopdock.benchmarks import _peer_autogen, _run, _tables

ROOT = Path(__file__).resolve().parents[2]

TINY = {
    "repeats": 2,
    "turns": {"n": 6, "k": 2},
    "bare": {"n": 6, "k": 2},
    "priority": {
        # drain 0: whoever waits at the last arrival's time counts with the wait so far
        "holders": 4, "rate": 20, "seconds": 0.4, "drain": 0,
        "scenarios": {"idle": [0, 0], "busy": [2, 0.01], "saturated": [4, 0], "saturated-ungated": [4, 0]},
    },
    "history": {"turns": 20, "block": 10},
    "loops": {"n": 2, "k": 2},
    "memory": {"n": 12, "history": 3, "wave": 5},
    "idle": {"n": 20},
    "latency": {"n": 10, "low": 0.02, "high": 0.2, "alpha": 1.2},
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
    assert summary["max_ms"] >= summary["p99_ms"] >= summary["p50_ms"] >= 0


def check_results(results, out_dir, *, peer_ok, repeats) -> None:
    saved = json.loads((out_dir / "bench-quick.json").read_text())
    assert saved["figures"] == results["figures"] and saved["targets"] == results["targets"]
    for key in ("platform", "cpu_count", "python", "trio", "date"):
        assert saved["machine"][key]
    runs = results["runs"]
    repeated = ["turns", "bare", "floor-bare", "history", "loops"] + [f"priority:{s}" for s in TINY["priority"]["scenarios"]]
    if peer_ok:
        repeated += ["peer-turns", "peer-bare"]
    for key in repeated:
        assert len(runs[key]) == repeats, key
    for key in ("memory", "idle", "latency", "bridge"):
        assert len(runs[key]) == 1, key
    for run in runs["turns"]:
        assert run["turns"] == 6 * 2 and run["steps"] == 2 * run["turns"]  # a tool call: two steps a turn
        assert positive(run["turns_per_s"]) and positive(run["cpu_us_per_turn"])
        check_latency(run["turn"])
    for key in ("bare", "floor-bare"):
        assert all(positive(run["turns_per_s"]) for run in runs[key])
    for scenario in TINY["priority"]["scenarios"]:
        for run in runs[f"priority:{scenario}"]:
            # every person counted once: admitted, or still waiting when the drain ran out
            assert run["people"] > 0 and run["admission"]["samples"] == run["people"]
            assert 0 <= run["admission"]["censored"] <= run["people"] and run["drain"] == 0
            check_latency(run["admission"])
            if run["automatic_agents"]:
                assert positive(run["automatic_turns_per_s_alone"])
    for run in runs["history"]:
        assert len(run["cpu_us_per_turn_by_block"]) == 2 and positive(run["last_vs_first"])
        assert run["transcript_messages"] == 4 * 20  # person, call, result, answer per turn
    loops = {row["loop"]: row for row in runs["loops"][0]["rows"]}
    assert loops["chain of 4 calls (react-b)"]["steps_per_turn"] == 5
    assert loops["fake driver: no model"]["steps_per_turn"] == 1
    assert loops["minimal-first: 3 parallel calls"]["steps_per_turn"] == 2
    memory = runs["memory"][0]
    assert memory["n"] == 12 and memory["history_turns"] == 4 and memory["events_per_session"] > 4 * 6
    # A pause's CPU time (the collecting thread's) is never more than its wall time.
    gc_pauses = memory["gc"]
    assert 0 <= gc_pauses["cpu_p99_ms"] <= gc_pauses["p99_ms"] + 0.01
    assert 0 <= gc_pauses["cpu_max_ms"] <= gc_pauses["max_ms"] + 0.01
    assert positive(runs["idle"][0]["cpu_us_per_agent"])
    latency = runs["latency"][0]
    assert latency["calls"] == 10 and positive(latency["cpu_us_per_call"]) and latency["late_ms"]["samples"] == 10
    assert runs["bridge"][0]["status"] == "ok"
    # Medians and spreads over the repeats.
    for key in repeated:
        for path, figure in results["figures"][key].items():
            assert figure["runs"] == repeats, (key, path)
            assert figure["max"] >= figure["median"] >= figure["min"], (key, path)
    if peer_ok:
        assert results["peer"]["status"] == "ok"
        assert positive(results["ratios"]["turns_vs_peer"]["median"])
        assert positive(results["ratios"]["bare_vs_peer"]["median"])
    else:
        assert results["peer"]["status"] == "not installed" and "turns_vs_peer" not in results["ratios"]
    # A quick run labels the size it measured and judges no target.
    ids = [t["id"] for t in results["targets"]]
    assert ids == ["human-priority", "automatic-kept", "memory", "gc", "step-cost", "idle-agents", "same-work", "bare"]
    for target in results["targets"]:
        assert target["passed"] is None and target["note"].startswith("quick run at ")
    png = out_dir / "bench-quick.png"
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert results["files"]["png_skipped"]
    else:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_quick_bench_in_fresh_processes(tmp_path):
    """Each phase in its own process, as `loopdock bench --quick` runs them (one repeat:
    a process costs a second or two to start)."""
    out = io.StringIO()
    config = {**TINY, "repeats": 1}
    results = _run.run("quick", tmp_path, isolate=True, config=config, stdout=out, show_progress=False)
    check_results(results, tmp_path, peer_ok=_peer_autogen.available(), repeats=1)
    table = out.getvalue()
    for heading in ("Targets", "Same work", "People first", "CPU per turn against history", "Loops", "Memory", "Bridge"):
        assert heading in table
    assert "not judged" in table


def test_quick_bench_in_process_without_the_peer(tmp_path, monkeypatch):
    """In this process, with autogen-core missing: the peer says so."""
    monkeypatch.setattr(_peer_autogen, "available", lambda: False)
    out, progress = io.StringIO(), io.StringIO()
    results = _run.run("quick", tmp_path, isolate=False, config=TINY, stdout=out, progress_stream=progress)
    check_results(results, tmp_path, peer_ok=False, repeats=2)
    same = next(t for t in results["targets"] if t["id"] == "same-work")
    assert same["measured"] is None and "not installed" in same["note"]
    assert "bench: done" in progress.getvalue()  # the progress reporter ran (non-tty form)


def test_the_default_output_is_outside_the_source_tree():
    root = Path(_run.__file__).resolve().parent.parent
    assert root not in _run.DEFAULT_OUT.resolve().parents


def test_the_committed_docs_tables_are_generated_from_the_committed_results(tmp_path):
    """README.md, benchmarks/README.md, PROFILE.md and docs/cluster.md carry exactly what
    `loopdock bench --tables` generates from the committed JSON: nothing copied by hand."""
    results = json.loads((ROOT / "benchmarks/results/bench-full.json").read_text())
    cluster = json.loads((ROOT / "benchmarks/results/bench-cluster-full.json").read_text())
    generated = {**_tables.blocks(results), "cluster": _tables.cluster_table(cluster)}
    for doc, names in {**_tables.DOCS, **_tables.CLUSTER_DOCS}.items():
        text = (ROOT / doc).read_text()
        for name in names:
            assert f"<!-- bench:{name} -->\n{generated[name]}\n<!-- /bench:{name} -->" in text, (doc, name)


def test_tables_replace_only_their_blocks():
    text = "before\n<!-- bench:summary -->\nold\n<!-- /bench:summary -->\nafter\n"
    assert _tables.replace_blocks(text, {"summary": "new"}) == "before\n<!-- bench:summary -->\nnew\n<!-- /bench:summary -->\nafter\n"
    with pytest.raises(ValueError):
        _tables.replace_blocks("<!-- bench:summary -->\nno end", {"summary": "x"})


@pytest.mark.parametrize("argv", [["bench", "--help"]])
def test_bench_is_a_loopdock_command(argv, capsys):
    from loopdock._cli import main

    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "--quick" in out and "--tables" in out
