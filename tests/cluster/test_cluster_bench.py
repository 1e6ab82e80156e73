"""``loopdock bench --cluster --quick``: sanity of the figures, never timings."""

from __future__ import annotations

import io
import json
import os

import pytest

from loopdock.benchmarks._cluster import run_cluster
from loopdock.benchmarks._common import process_cpu_seconds


def test_the_quick_cluster_benchmark_reports_consistent_figures(tmp_path):
    out = io.StringIO()
    result = run_cluster("quick", tmp_path, out)
    assert json.loads((tmp_path / "bench-cluster-quick.json").read_text()) == result
    f = result["figures"]
    for name in ("embedded", "cluster-1", "cluster-2"):
        assert [run["turns_per_s"] > 0 for run in result["runs"][name]] == [True]
    assert result["failover"]["lost_turns"] == result["failover"]["doubled_turns"] == 0

    for run in result["runs"]["cluster-1"] + result["runs"]["cluster-2"]:
        cpu = run["cpu_us_per_turn"]
        parts = [cpu["workers"], cpu["client"], cpu["redis"]]
        assert all(part >= 0 for part in parts)
        assert cpu["all"] == pytest.approx(sum(parts))
        turns = run["n"] * run["k"]
        assert run["cores_busy"] == pytest.approx(cpu["all"] * 1e-6 * turns / (turns / run["turns_per_s"]))
    # The client's and the workers' turns cost CPU, whatever the clock's resolution: over
    # the quick run's turns neither can round to nothing.
    assert f["cluster_1_cpu_us_per_turn"]["all"] > 0
    assert f["workers_ceiling_vs_one"] == pytest.approx(os.cpu_count() / f["cluster_1_cores_busy"])
    assert "more workers at most" in out.getvalue()


def test_cpu_time_of_a_process_that_is_gone_is_unknown():
    import subprocess
    import sys

    child = subprocess.run([sys.executable, "-P", "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    assert process_cpu_seconds(int(child.stdout)) is None
    mine = process_cpu_seconds(os.getpid())
    assert mine is not None and mine > 0
