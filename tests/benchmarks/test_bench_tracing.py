"""`loopdock bench --tracing` at a tiny size: off and on alternate, every figure is there
and consistent with the runs, the traced runs export every span of every turn, and the
committed docs quote the committed JSON. No speed is asserted."""

import io
import json
import math
from pathlib import Path

import pytest

from loopdock.benchmarks import _tables, _tracing

ROOT = Path(__file__).resolve().parents[2]


def check_figures(results, repeats):
    runs = results["runs"]
    assert [len(runs["off"]), len(runs["on"])] == [repeats, repeats]
    # Alternating: off first in even repeats, on first in odd ones.
    orders = sorted((run["order"], side) for side in ("off", "on") for run in runs[side])
    expected = [side for r in range(repeats) for side in (("off", "on") if r % 2 == 0 else ("on", "off"))]
    assert [side for _, side in orders] == expected
    for side in ("off", "on"):
        for run in runs[side]:
            assert run["tracing"] is (side == "on")
            assert run["steps"] == 2 * run["turns"]  # the same tool-call turns either way
            assert math.isfinite(run["cpu_us_per_turn"]) and run["cpu_us_per_turn"] > 0
    # Every turn's four spans reached the exporter (none dropped, none left in the batch).
    assert [run["spans_per_turn"] for run in runs["on"]] == [_tracing.SPANS_PER_TURN] * repeats
    assert all("spans_per_turn" not in run for run in runs["off"])
    figures = results["figures"]
    off = [run["cpu_us_per_turn"] for run in runs["off"]]
    on = [run["cpu_us_per_turn"] for run in runs["on"]]
    assert figures["on_vs_off"]["values"] == pytest.approx([b / a for a, b in zip(off, on, strict=True)])
    assert figures["added_cpu_us_per_turn"]["values"] == pytest.approx([b - a for a, b in zip(off, on, strict=True)])
    for figure in figures.values():
        assert figure["runs"] == repeats and figure["max"] >= figure["median"] >= figure["min"]


def test_tracing_cost_in_process_alternates_and_counts_every_span(tmp_path):
    out = io.StringIO()
    results = _tracing.run_tracing("quick", tmp_path, out, config={"n": 4, "k": 2, "repeats": 3}, isolate=False,
                                   show_progress=False)
    check_figures(results, 3)
    saved = json.loads((tmp_path / "bench-tracing-quick.json").read_text())
    assert saved["figures"] == results["figures"] and saved["config"]["repeats"] == 3
    table = out.getvalue()
    assert "| tracing off (the default: no provider) |" in table and "Spans exported per turn: 4.0" in table


def test_tracing_cost_in_fresh_processes(tmp_path):
    results = _tracing.run_tracing("quick", tmp_path, io.StringIO(), config={"n": 3, "k": 1, "repeats": 1},
                                   show_progress=False)
    check_figures(results, 1)


def test_bench_tracing_is_a_loopdock_bench_option(capsys):
    from loopdock._cli import main

    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    assert "--tracing" in capsys.readouterr().out



def test_the_committed_tracing_figures_are_generated_from_the_committed_json():
    results = json.loads((ROOT / "benchmarks/results/bench-tracing-full.json").read_text())
    check_figures(results, results["config"]["repeats"])
    assert results["mode"] == "full" and results["config"]["repeats"] >= 5
    generated = {"tracing": _tables.tracing_table(results), "tracing-summary": _tables.tracing_summary(results)}
    for doc, names in _tables.TRACING_DOCS.items():
        text = (ROOT / doc).read_text()
        for name in names:
            assert f"<!-- bench:{name} -->\n{generated[name]}\n<!-- /bench:{name} -->" in text, (doc, name)
