"""``loopdock experiment bench`` runs both workloads and prints its ratios (a small run:
what it measures is the benchmark's business, not a test's)."""

from __future__ import annotations

import re


def test_the_bench_runs_bare_agents_and_the_runner_and_prints_ratios(capsys, main):
    assert main(["experiment", "bench", "--rollouts", "20", "--latency", "0.01"]) == 0
    out, err = capsys.readouterr()
    # Only its progress: the bare agents' list_dir calls once ran inside their runtime's home,
    # were all refused (a warning each), and the bare side measured refusals, not work.
    assert err.splitlines() == ["bench: 20 bare agents at once ...", "bench: 20 rollouts of an experiment at once ..."]
    assert out.startswith("experiment runner bench: 20 rollouts at once, 2 model calls each, 0.01 s per call\n")
    assert re.search(r"^load average: [\d.]+ before, [\d.]+ after \(\d+ CPUs\)$", out, re.M)
    assert re.search(r"^bare agents +[\d.]+ +[\d.]+ +[\d.]+ +[\d.]+$", out, re.M)
    assert re.search(r"^experiment runner +[\d.]+ +[\d.]+ +[\d.]+ +[\d.]+$", out, re.M)
    assert re.search(r"^runner CPU per rollout: [\d.]+x a bare agent's \(\+-?[\d.]+ ms per rollout\)$", out, re.M)
    assert re.search(r"^runner rollouts/s: [\d.]+x the bare agents' \(the floor is 1000/s\)$", out, re.M)


def test_the_bench_refuses_nonsense(capsys, main):
    assert main(["experiment", "bench", "--rollouts", "0"]) == 2
    assert "--rollouts and --turns must be >= 1" in capsys.readouterr().err
