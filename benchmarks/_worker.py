"""One benchmark phase, in this process or as ``python -m benchmarks._worker PHASE PARAMS OUT``.

Running each phase in a fresh process keeps the memory figures of one phase clean of
the others, and keeps asyncio (the autogen-core peer) apart from trio. A child reports
progress as ``@@progress <fraction> <label>`` lines on stderr and writes its result as
JSON to ``OUT``.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from ._common import PROGRESS_PREFIX, Progress

PHASES = ("floor", "many", "priority", "bridge", "peer")


def run_phase(phase: str, params: dict[str, Any], progress: Progress) -> dict[str, Any]:
    """Run one phase here and return its figures."""
    if phase == "peer":  # asyncio only: trio is not even imported
        from ._peer_autogen import run_peer

        return run_peer(params, progress)

    import trio

    if phase == "floor":
        from ._floor import run_floor

        return trio.run(run_floor, params, progress)
    if phase == "many":
        from ._agents import run_many

        return trio.run(run_many, params, progress)
    if phase == "priority":
        from ._agents import run_priority

        return trio.run(run_priority, params, progress)
    if phase == "bridge":
        from ._bridge import run_bridge

        return trio.run(run_bridge, params, progress)
    raise ValueError(f"unknown phase {phase!r}; phases: {', '.join(PHASES)}")


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
    if phase != "peer":
        from loopdock import configure_logging

        configure_logging(verbose=False)  # warnings only: progress lines own stderr
    result = run_phase(phase, json.loads(params), _child_progress())
    with open(out, "w") as file:
        json.dump(result, file)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
