"""``loopdock bench``: runs every workload (repeated, alternating loopdock and the peer),
then prints the table and writes JSON and PNG."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from . import _peer_autogen
from ._common import ProgressBar, load_average, machine
from ._report import compute, plot, print_table
from ._worker import PhaseError, in_child, run_phase

#: Where results go unless ``--out`` says otherwise: outside the source tree, so that a
#: run never overwrites the committed results (benchmarks/results, written on purpose).
DEFAULT_OUT = Path(tempfile.gettempdir()) / "loopdock-bench"

# The sizes. `quick` must stay well under a minute or two on a 2-core machine; `full`
# under ten minutes.
CONFIGS: dict[str, dict[str, Any]] = {
    "full": {
        "repeats": 5,
        "turns": {"n": 1000, "k": 5},
        "bare": {"n": 1000, "k": 10},
        "priority": {
            # drain: people still waiting 5 s after the last arrival count with their wait
            # so far (only the gate-off scenario gets there; waiting it out took a minute).
            "holders": 200, "rate": 50, "seconds": 3, "drain": 5,
            # automatic agents and their think time (s) between turns
            "scenarios": {"idle": [0, 0], "busy": [100, 0.25], "saturated": [200, 0], "saturated-ungated": [200, 0]},
        },
        "history": {"turns": 2000, "block": 100},
        "loops": {"n": 50, "k": 4},
        "memory": {"n": 10000, "history": 100, "wave": 1000},
        "idle": {"n": 100000},
        "latency": {"n": 10000, "low": 0.5, "high": 30.0, "alpha": 1.2},
        # The bridge (benchmarks/_bridge.py); one run.
        "bridge": {
            "sequential": 5000, "warmup": 200, "bursts": 50, "burst_size": 200, "agents": 8,
            "ingest_events": 200000, "ingest_sessions": 20, "relay_events": 100000, "relay_window": 2000,
            "goalbar_wakes": 1000, "goalbar_flood": 50000, "timeout": 600,
        },
    },
    "quick": {
        "repeats": 2,
        "turns": {"n": 100, "k": 3},
        "bare": {"n": 100, "k": 5},
        "priority": {
            "holders": 20, "rate": 40, "seconds": 1, "drain": 5,
            "scenarios": {"idle": [0, 0], "busy": [10, 0.05], "saturated": [30, 0], "saturated-ungated": [30, 0]},
        },
        "history": {"turns": 200, "block": 50},
        "loops": {"n": 10, "k": 2},
        "memory": {"n": 200, "history": 20, "wave": 100},
        "idle": {"n": 1000},
        "latency": {"n": 200, "low": 0.05, "high": 1.0, "alpha": 1.2},
        "bridge": {
            "sequential": 1000, "warmup": 100, "bursts": 10, "burst_size": 100, "agents": 8,
            "ingest_events": 50000, "ingest_sessions": 10, "relay_events": 20000, "relay_window": 2000,
            "goalbar_wakes": 300, "goalbar_flood": 10000, "timeout": 90,
        },
    },
}


def plan(cfg: dict[str, Any], have_peer: bool) -> list[tuple[str, str, dict[str, Any], int | None]]:
    """Every phase to run, in order: (key, phase, params, repeat). Repeated figures
    alternate loopdock and the peer (and which goes first) from one repeat to the next."""
    steps: list[tuple[str, str, dict[str, Any], int | None]] = []
    for r in range(cfg["repeats"]):
        pairs = [("turns", "turns", cfg["turns"]), ("peer-turns", "peer-turns", cfg["turns"])]
        bare = [("bare", "bare", cfg["bare"]), ("peer-bare", "peer-bare", cfg["bare"]),
                ("floor-bare", "floor-bare", cfg["bare"])]
        if not have_peer:
            pairs, bare = pairs[:1], [bare[0], bare[2]]
        if r % 2:
            pairs, bare = pairs[::-1], bare[::-1]
        steps += [(key, phase, params, r) for key, phase, params in pairs + bare]
        prio = cfg["priority"]
        for scenario, (automatic, think) in prio["scenarios"].items():
            params = {"scenario": scenario, "holders": prio["holders"], "automatic": automatic, "think": think,
                      "rate": prio["rate"], "seconds": prio["seconds"], "drain": prio.get("drain"), "seed": r + 1}
            steps.append((f"priority:{scenario}", "priority", params, r))
        steps.append(("history", "history", cfg["history"], r))
        steps.append(("loops", "loops", cfg["loops"], r))
    for key in ("memory", "idle", "latency", "bridge"):
        steps.append((key, key, cfg[key], None))
    return steps


def run(
    mode: str = "quick",
    out_dir: str | os.PathLike[str] = DEFAULT_OUT,
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
    have_peer = peer and _peer_autogen.available()
    steps = plan(cfg, have_peer)
    bar = ProgressBar(len(steps), progress_stream, enabled=show_progress)
    started = time.monotonic()
    results: dict[str, Any] = {"schema": 2, "mode": mode, "machine": machine(), "config": cfg, "runs": {}}
    results["peer"] = {"name": _peer_autogen.NAME, "status": "ok" if have_peer else
                       ("not installed" if peer else "skipped"), "hint": "pip install 'loopdock[bench]'"}
    try:
        for key, phase, params, repeat in steps:
            label = key if repeat is None else f"{key} (run {repeat + 1}/{cfg['repeats']})"
            progress = bar.phase(label, 1.0)
            try:
                child = isolate or phase.startswith("peer-") or phase == "bridge"
                result = in_child(phase, params, progress) if child else run_phase(phase, params, progress)
            finally:
                bar.end_phase()
            result["load_average"] = load_average()
            results["runs"].setdefault(key, []).append(result)
    finally:
        bar.close()
    results["seconds"] = time.monotonic() - started
    results["machine"]["load_average_at_end"] = load_average()
    compute(results)

    stem = f"bench-{mode}"
    json_path, png_path = out / f"{stem}.json", out / f"{stem}.png"
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
    parser.add_argument("--quick", action="store_true", help="small sizes; about a minute, judges no target")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help=f"where to write bench-<mode>.json/.png (default {DEFAULT_OUT})")
    parser.add_argument("--in-process", action="store_true", help="run loopdock's phases in this process")
    parser.add_argument("--no-peer", action="store_true", help="skip the autogen-core peer")
    parser.add_argument("--cluster", action="store_true",
                        help="only the cluster benchmark: embedded vs 1 and 2 workers on a private redis-server, "
                        "and failover after kill -9 (needs redis-server and loopdock[cluster])")
    parser.add_argument("--tracing", action="store_true",
                        help="only what tracing costs: CPU per turn with spans off and on, alternating "
                        "(needs loopdock[otel])")
    parser.add_argument("--usage", action="store_true",
                        help="only memory per agent as a user measures it: 2,000 and 10,000 agents with "
                        "Runtime.open's defaults, RSS after 10 and 100 turns each (about an hour)")
    parser.add_argument("--lifecycle", action="store_true",
                        help="only the agent lifecycle at scale: RSS of N registered agents (all but 1,000 "
                        "passivated), first message to a passivated agent -> admission (open loop), reactivation "
                        "CPU, and 100,000 agents touched 1%% per second for 10 minutes (about 30 minutes)")
    parser.add_argument(
        "--tables", metavar="JSON", nargs="*",
        help="run nothing: regenerate the docs' tables from these results (default: the committed full runs, "
        "benchmarks/results/bench-full.json, bench-cluster-full.json, bench-tracing-full.json, "
        "bench-usage-full.json and bench-lifecycle-full.json)",
    )


def run_from_args(args: argparse.Namespace) -> int:
    if args.tables is not None:
        from ._tables import COMMITTED, write_docs

        # The docs it rewrites are a checkout's, not the installed package's: the current folder.
        checkout = Path.cwd()
        if not (checkout / "benchmarks" / "results").is_dir():
            print("loopdock bench: --tables rewrites a loopdock checkout's docs; run it from the checkout's top folder",
                  file=sys.stderr)
            return 2
        for source in args.tables or [checkout / path for path in COMMITTED]:
            for path in write_docs(Path(source), checkout):
                print(f"loopdock bench: tables written to {path} (from {source})")
        return 0
    if args.cluster:
        from ._cluster import run_cluster

        run_cluster("quick" if args.quick else "full", Path(args.out), sys.stdout)
        return 0
    if args.usage:
        from ._usage import run_usage_phase

        try:
            run_usage_phase("quick" if args.quick else "full", Path(args.out))
        except RuntimeError as exc:
            print(f"loopdock bench: {exc}", file=sys.stderr)
            return 1
        return 0
    if args.lifecycle:
        from ._lifecycle import run_lifecycle

        try:
            results = run_lifecycle("quick" if args.quick else "full", Path(args.out))
        except RuntimeError as exc:
            print(f"loopdock bench: {exc}", file=sys.stderr)
            return 1
        verdicts = {True: "met", False: "MISSED", None: "not judged"}
        for target in results["targets"]:
            print(f"{target['target']}: {target['measured']:,.2f} {target['unit']} at {target['at']} "
                  f"[{verdicts[target['passed']]}]" + (f"; {target['note']}" if target.get("note") else ""))
        print(f"loopdock bench: results written to {Path(args.out) / ('bench-lifecycle-' + results['mode'] + '.json')}")
        return 0
    if args.tracing:
        from ._tracing import run_tracing

        try:
            run_tracing("quick" if args.quick else "full", Path(args.out), isolate=not args.in_process)
        except PhaseError as exc:
            print(f"loopdock bench: {exc}", file=sys.stderr)
            return 1
        return 0
    try:
        run("quick" if args.quick else "full", args.out, isolate=not args.in_process, peer=not args.no_peer)
    except PhaseError as exc:
        print(f"loopdock bench: {exc}", file=sys.stderr)
        return 1
    return 0
