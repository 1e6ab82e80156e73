"""``loopdock bench``: runs every workload, then prints the table and writes JSON and PNG."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from . import _peer_autogen
from ._common import (
    PROGRESS_PREFIX,
    Progress,
    ProgressBar,
    load_average,
    machine,
    waves_for,
)
from ._report import compute, plot, print_table
from ._worker import run_phase

# The sizes. `quick` must stay well under two minutes on a 2-core machine.
CONFIGS: dict[str, dict[str, Any]] = {
    "full": {
        "ns": [1, 100, 1000, 10000],
        "k": 10,  # turns per agent, one tool call each
        "min_turns": 2000,  # small N repeats in waves of fresh agents until this many turns
        "tracemalloc_agents": 1000,
        "sequential_hops": 50000,
        "peer_sequential": 5000,
        # busy: agents each starting an automatic tool-call turn every busy_interval s
        "priority": {
            "agents": 1000, "pending": 10000, "humans": 1000, "busy": 100, "busy_interval": 0.2, "one_agent_humans": 20,
        },
        # The bridge (benchmarks/_bridge.py): round trips one at a time and in bursts, host
        # events ingested, relayed to a GoalBar page (at most relay_window in flight), and
        # GoalBar wakes one at a time and under a flood. timeout: the client's whole run.
        "bridge": {
            "sequential": 5000, "warmup": 200, "bursts": 50, "burst_size": 200, "agents": 8,
            "ingest_events": 200000, "ingest_sessions": 20, "relay_events": 100000, "relay_window": 2000,
            "goalbar_wakes": 1000, "goalbar_flood": 50000, "timeout": 600,
        },
    },
    "quick": {
        "ns": [1, 10, 100],
        "k": 5,
        "min_turns": 300,
        "tracemalloc_agents": 100,
        "sequential_hops": 20000,
        "peer_sequential": 2000,
        "priority": {
            "agents": 100, "pending": 1000, "humans": 200, "busy": 10, "busy_interval": 0.02, "one_agent_humans": 20,
        },
        "bridge": {
            "sequential": 1000, "warmup": 100, "bursts": 10, "burst_size": 100, "agents": 8,
            "ingest_events": 50000, "ingest_sessions": 10, "relay_events": 20000, "relay_window": 2000,
            "goalbar_wakes": 300, "goalbar_flood": 10000, "timeout": 90,
        },
    },
}


class PhaseError(RuntimeError):
    pass


def _in_child(phase: str, params: dict[str, Any], progress: Progress) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="loopdock-bench-out-") as scratch:
        out = Path(scratch, "result.json")
        env = dict(os.environ)
        env.setdefault("AUTOGEN_DISABLE_RUNTIME_TRACING", "true")  # the peer at its fastest
        # The child imports this very copy of the package, installed or not.
        package_parent = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
        process = subprocess.Popen(
            [sys.executable, "-m", "benchmarks._worker", phase, json.dumps(params), str(out)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        tail: deque[str] = deque(maxlen=40)
        assert process.stderr is not None
        for line in process.stderr:
            if line.startswith(PROGRESS_PREFIX):
                fraction, _, label = line[len(PROGRESS_PREFIX):].strip().partition(" ")
                progress(float(fraction), label)
            else:
                tail.append(line.rstrip())
        code = process.wait()
        if code != 0 or not out.exists():
            raise PhaseError(f"phase {phase} failed (exit {code}):\n" + "\n".join(tail))
        return json.loads(out.read_text())


def run(
    mode: str = "quick",
    out_dir: str | os.PathLike[str] = "benchmarks/results",
    *,
    isolate: bool = True,
    config: dict[str, Any] | None = None,
    peer: bool = True,
    stdout: TextIO | None = None,
    progress_stream: TextIO | None = None,
    show_progress: bool = True,
) -> dict[str, Any]:
    """Run the benchmark; returns every figure (also written to ``out_dir``).

    ``config`` overrides the sizes of ``mode`` (tests use tiny ones); ``isolate`` runs
    each phase in a fresh process (the autogen-core peer always runs in its own).
    """
    stdout = stdout if stdout is not None else sys.stdout
    cfg = json.loads(json.dumps(CONFIGS[mode]))
    cfg.update(config or {})
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ns, k, min_turns = cfg["ns"], cfg["k"], cfg["min_turns"]

    # Phase weights: a rough guess of each phase's duration, for the progress bar only.
    many_weights = [1.0 + n * k * waves_for(n, k, min_turns) / 2000 for n in ns]
    have_peer = peer and _peer_autogen.available()
    weights = {
        "floor": 1.0,
        "peer": 2.0 if have_peer else 0.0,
        "priority": 2.0 + cfg["priority"]["pending"] / 2000,
        "bridge": 1.0 + cfg["bridge"]["ingest_events"] / 100000 + cfg["bridge"]["sequential"] / 2000,
    }
    bar = ProgressBar(sum(many_weights) + sum(weights.values()), progress_stream, enabled=show_progress)

    def phase(name: str, label: str, weight: float, params: dict[str, Any], child: bool) -> dict[str, Any]:
        progress = bar.phase(label, weight)
        try:
            if child:
                return _in_child(name, params, progress)
            return run_phase(name, params, progress)
        finally:
            bar.end_phase()

    started = time.monotonic()
    results: dict[str, Any] = {"schema": 1, "mode": mode, "machine": machine(), "config": cfg}
    try:
        results["floor"] = phase(
            "floor", "floor: trio channels", weights["floor"],
            {"ns": ns, "k": k, "min_turns": min_turns, "sequential_hops": cfg["sequential_hops"]}, isolate,
        )
        if have_peer:
            peer_result = phase(
                "peer", "peer: autogen-core", weights["peer"],
                {"ns": ns, "k": k, "min_turns": min_turns, "sequential_messages": cfg["peer_sequential"]}, True,
            )
            results["peer"] = {"name": _peer_autogen.NAME, "status": "ok", **peer_result}
        else:
            results["peer"] = {
                "name": _peer_autogen.NAME,
                "status": "not installed" if peer else "skipped",
                "hint": "pip install 'loopdock[bench]'",
            }
        results["many"] = []
        for n, weight in zip(ns, many_weights):
            params = {
                "n": n, "k": k, "waves": waves_for(n, k, min_turns), "tracemalloc_agents": cfg["tracemalloc_agents"],
            }
            results["many"].append(phase("many", f"agents: N={n}", weight, params, isolate))
        results["priority"] = phase("priority", "human priority", weights["priority"], cfg["priority"], isolate)
        # The bridge's client always runs in a process of its own (its own trio loop).
        results["bridge"] = phase("bridge", "bridge: websocket", weights["bridge"], cfg["bridge"], isolate)
    finally:
        bar.close()
    results["seconds"] = time.monotonic() - started
    results["machine"]["load_average_at_end"] = load_average()
    compute(results)

    stem = f"bench-{mode}"
    json_path = out / f"{stem}.json"
    png_path = out / f"{stem}.png"
    results["files"] = {"json": str(json_path), "png": None}
    plotted = plot(results, png_path)
    if plotted is None:
        results["files"]["png"] = str(png_path)
    else:
        results["files"]["png_skipped"] = plotted
    json_path.write_text(json.dumps(results, indent=2) + "\n")
    print_table(results, stdout)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="loopdock bench", description=__doc__)
    add_arguments(parser)
    return run_from_args(parser.parse_args(argv))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="small sizes (N = 1, 10, 100); under two minutes")
    parser.add_argument("--out", default="benchmarks/results", help="where to write bench-<mode>.json/.png")
    parser.add_argument("--in-process", action="store_true", help="run loopdock's phases in this process")
    parser.add_argument("--no-peer", action="store_true", help="skip the autogen-core peer")


def run_from_args(args: argparse.Namespace) -> int:
    try:
        run(
            "quick" if args.quick else "full",
            args.out,
            isolate=not args.in_process,
            peer=not args.no_peer,
        )
    except PhaseError as exc:
        print(f"loopdock bench: {exc}", file=sys.stderr)
        return 1
    return 0
