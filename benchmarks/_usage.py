"""Memory per agent as a user measures it, through the public API only.

``python -m loopdock.benchmarks._usage --n 2000 --marks 10,100 [--trace] [--out FILE]``

The sequence is the one a user runs to size a machine: ``Runtime.open(home)`` with its
defaults, ``n`` agents created with ``create_agent``, then rounds of one ``followup`` to
every agent and ``wait_idle`` on each, the handles kept; at each mark (turns done) the
RSS after a full collection, minus the RSS before the first agent, per agent. Nothing
is seeded, nothing is tuned (no GC threshold, no smaller history budget): the memory
phase of ``loopdock bench`` resumes seeded histories with a tuned collector, so it
measures something users do not do, and this is the figure they get.

``--trace`` also takes tracemalloc snapshots (slow: several times the run) and reports
the ten biggest differences by allocation site, and the live Python memory beside the
RSS, which tells the heap's fragmentation apart from what is held.

``loopdock bench --usage`` runs it for every size of ``SIZES`` (each in a fresh process,
so one size's heap does not carry into the next) and once more, smaller, with
``--trace`` for the breakdown; it writes ``bench-usage-<mode>.json``, from which
``loopdock bench --tables`` writes benchmarks/PROFILE.md's table.
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any, TextIO

import trio

from loopdock import Runtime

from ._common import Progress, load_average, machine, rss_bytes

#: The sizes ``loopdock bench --usage`` measures: agents, the marks (turns), and the
#: size of the traced run (tracemalloc multiplies the time several times).
SIZES: dict[str, dict[str, Any]] = {
    "full": {"ns": [2000, 10_000], "marks": [10, 100], "traced_n": 500},
    "quick": {"ns": [20], "marks": [2, 4], "traced_n": 10},
}
#: What a user may expect to pay per agent after 100 turns, RSS, defaults (issue #31).
TARGET_KB_PER_AGENT = 50


def _settled_rss() -> int:
    gc.collect()
    return rss_bytes()


def _top(before: tracemalloc.Snapshot, after: tracemalloc.Snapshot, n: int) -> list[dict[str, Any]]:
    rows = []
    for stat in after.compare_to(before, "lineno")[:10]:
        frame = stat.traceback[0]
        site = f"{Path(frame.filename).name}:{frame.lineno}"
        rows.append({"site": site, "bytes_per_agent": stat.size_diff / n, "objects_per_agent": stat.count_diff / n})
    return rows


async def run_usage(params: dict[str, Any], progress: Progress) -> dict[str, Any]:
    """``params``: ``n`` agents, ``marks`` (ascending turn counts to measure at),
    ``trace`` (tracemalloc breakdown)."""
    n, marks, trace = params["n"], sorted(params["marks"]), params.get("trace", False)
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="loopdock-usage-") as scratch:
        async with Runtime.open(Path(scratch) / "home") as rt:
            before = _settled_rss()
            if trace:
                tracemalloc.start()
                snapshot0 = tracemalloc.take_snapshot()
                traced0 = tracemalloc.get_traced_memory()[0]
            cpu0 = time.process_time()
            handles = [await rt.create_agent(session_id=f"u{i}") for i in range(n)]
            done = 0
            for mark in marks:
                for turn in range(done, mark):
                    for handle in handles:
                        handle.agent.followup(f"question {turn}: how are you today?")
                    for handle in handles:
                        await handle.agent.wait_idle()
                    progress((turn + 1) / marks[-1], f"usage: {turn + 1}/{marks[-1]} turns of {n} agents")
                done = mark
                row: dict[str, Any] = {
                    "turns": mark, "kb_per_agent": (_settled_rss() - before) / n / 1024,
                    "cpu_us_per_turn": (time.process_time() - cpu0) / (n * mark) * 1e6,
                    "warm_agents": len(rt.supervisor.history), "warm_mb": rt.supervisor.history.held / 2**20,
                }
                if trace:
                    row["traced_kb_per_agent"] = (tracemalloc.get_traced_memory()[0] - traced0) / n / 1024
                    row["top"] = _top(snapshot0, tracemalloc.take_snapshot(), n)
                results.append(row)
            # Events stay readable: the last agent's log is whole, read back from the store.
            events = await handles[-1].agent.session.read_events()
            turns = sum(1 for event in events if event.type == "turn/start")
            for handle in handles:
                await handle.dispose()
    if trace:
        tracemalloc.stop()
    return {"n": n, "marks": results, "last_agent_turns_read": turns}


def _one_run(n: int, marks: list[int], trace: bool, stderr: TextIO) -> dict[str, Any]:
    """One size in a fresh process (its progress goes to ``stderr``)."""
    command = [sys.executable, "-P", "-m", "loopdock.benchmarks._usage", "--n", str(n),
               "--marks", ",".join(map(str, marks))] + (["--trace"] if trace else [])  # fmt: skip
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=stderr, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the usage run of {n} agents failed (exit {done.returncode})")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def run_usage_phase(mode: str, out_dir: Path, stderr: TextIO = sys.stderr) -> dict[str, Any]:
    """``loopdock bench --usage``: every size of ``SIZES[mode]``, then the traced run;
    writes and returns ``bench-usage-<mode>.json``."""
    cfg = SIZES[mode]
    load_start, ran_on = load_average(), machine()  # the commit as the runs start
    runs = [_one_run(n, cfg["marks"], False, stderr) for n in cfg["ns"]]
    traced = _one_run(cfg["traced_n"], cfg["marks"], True, stderr)
    results = {
        "mode": mode, "config": cfg, "runs": runs, "traced": traced,
        "target_kb_per_agent": TARGET_KB_PER_AGENT,
        "machine": {**ran_on, "load_average_at_start": load_start, "load_average_at_end": load_average()},
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"bench-usage-{mode}.json").write_text(json.dumps(results, indent=1) + "\n")
    return results


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"a positive number of agents, not {text!r}")
    return value


def _marks(text: str) -> list[int]:
    try:
        marks = [int(mark) for mark in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"marks are turn counts separated by commas, e.g. 10,100 (not {text!r})") from None
    if any(mark <= 0 for mark in marks):
        raise argparse.ArgumentTypeError(f"marks must be positive turn counts (not {text!r})")
    return sorted(set(marks))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loopdock.benchmarks._usage", description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=_positive, default=2000, help="agents (default 2000)")
    parser.add_argument("--marks", type=_marks, default=[10, 100], help="turn counts to measure at (default 10,100)")
    parser.add_argument("--trace", action="store_true", help="tracemalloc breakdown (slow)")
    parser.add_argument("--out", help="write the figures as JSON here")
    args = parser.parse_args(argv)

    def progress(fraction: float, label: str) -> None:
        sys.stderr.write(f"\r{label} ({fraction:.0%})")

    params = {"n": args.n, "marks": args.marks, "trace": args.trace}
    result = trio.run(run_usage, params, progress)
    sys.stderr.write("\n")
    result["machine"] = machine()
    text = json.dumps(result, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    sys.stdout.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
