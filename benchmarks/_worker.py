"""One benchmark phase, in this process or as ``python -m loopdock.benchmarks._worker PHASE PARAMS OUT``.

Running each phase in a fresh process (``in_child``) keeps the memory figures of one
phase clean of the others, and keeps asyncio (the autogen-core peer) apart from trio. A
child reports progress as ``@@progress <fraction> <label>`` lines on stderr and writes its result as
JSON to ``OUT``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

from ._common import PROGRESS_PREFIX, Progress

#: phase -> (module, function); ``peer-*`` phases run asyncio, the rest trio.
PHASES = {
    "turns": ("_agents", "run_turns"),
    "bare": ("_agents", "run_bare"),
    "priority": ("_agents", "run_priority"),
    "history": ("_agents", "run_history"),
    "memory": ("_agents", "run_memory"),
    "idle": ("_agents", "run_idle"),
    "usage": ("_usage", "run_usage"),
    "latency": ("_agents", "run_latency"),
    "loops": ("_agents", "run_loops"),
    "floor-bare": ("_floor", "run_floor_bare"),
    "floor": ("_floor", "run_floor"),
    "bridge": ("_bridge", "run_bridge"),
}


class PhaseError(RuntimeError):
    pass


def in_child(phase: str, params: dict[str, Any], progress: Progress) -> dict[str, Any]:
    """Run one phase in a fresh process (this module as its main); its progress lines
    go to ``progress``, its last stderr lines into the PhaseError of a failure."""
    with tempfile.TemporaryDirectory(prefix="loopdock-bench-out-") as scratch:
        out = Path(scratch, "result.json")
        env = dict(os.environ)
        env.setdefault("AUTOGEN_DISABLE_RUNTIME_TRACING", "true")  # the peer at its fastest
        process = subprocess.Popen(
            [sys.executable, "-P", "-m", "loopdock.benchmarks._worker", phase, json.dumps(params), str(out)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
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
        result: dict[str, Any] = json.loads(out.read_text())
        return result


def run_phase(phase: str, params: dict[str, Any], progress: Progress) -> dict[str, Any]:
    """Run one phase here and return its figures."""
    if phase.startswith("peer-"):  # asyncio only: trio is not even imported
        from ._peer_autogen import run_peer

        return run_peer(phase.removeprefix("peer-"), params, progress)
    if phase not in PHASES:
        raise ValueError(f"unknown phase {phase!r}; phases: {', '.join(PHASES)}, peer-turns, peer-bare")
    import importlib

    import trio

    module, function = PHASES[phase]
    run = getattr(importlib.import_module(f"loopdock.benchmarks.{module}"), function)
    result: dict[str, Any] = trio.run(run, params, progress)
    return result


def _child_progress() -> Progress:
    last = [0.0]

    def progress(fraction: float, label: str) -> None:
        now = time.monotonic()
        if now - last[0] >= 0.1 or fraction >= 1.0:
            last[0] = now
            sys.stderr.write(f"{PROGRESS_PREFIX}{fraction:.4f} {label}\n")
            sys.stderr.flush()

    return progress


def main(argv: list[str]) -> int:
    phase, params, out = argv
    if not phase.startswith("peer-"):
        from loopdock import configure_logging

        configure_logging(verbose=False)  # warnings only: progress lines own stderr
    result = run_phase(phase, json.loads(params), _child_progress())
    with open(out, "w") as file:
        json.dump(result, file)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
