"""``loopdock bench --tracing``: what tracing costs a turn, off against on.

The ``turns`` workload (N agents on the ``standard`` loop, K turns each: ping calls the
in-memory ``bench_echo`` tool, then answers its result; 15 events persisted per turn), run
twice per repeat, each run a fresh process:

- **off**: the runtime as it opens by default, without a tracer provider (OpenTelemetry
  is not even imported);
- **on**: ``Runtime.open(tracer_provider=...)`` with the SDK's ``TracerProvider`` and a
  ``BatchSpanProcessor``, as ``loopdock serve --otlp`` sets them up, whose exporter counts
  the spans and drops them: what the spans cost the runtime, without the network and the
  protobuf encoding (which the processor's thread does off trio's thread, but on the same
  cores). The spans are flushed before the clock stops, so the processor's work is in.

Which goes first alternates from one repeat to the next. The figure is the whole
process's CPU time per turn (every thread); the ratio on / off is taken run by run
(repeat r against repeat r), then summarised as median (min-max).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from ._common import Progress, ProgressBar, load_average, machine

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

CONFIGS: dict[str, dict[str, Any]] = {
    "full": {"n": 500, "k": 10, "repeats": 5},
    "quick": {"n": 20, "k": 2, "repeats": 1},
}
#: The spans of one of the workload's turns: the turn, two model calls, one tool call.
SPANS_PER_TURN = 4


class SpanCount:
    """How many spans the provider's exporter was handed."""

    def __init__(self) -> None:
        self.spans = 0


def counting_provider() -> tuple[TracerProvider, SpanCount]:
    """An SDK tracer provider whose batch processor exports to an exporter that only
    counts. Imports OpenTelemetry (``loopdock[otel]``): called only with tracing on."""
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    count = SpanCount()

    class CountingExporter(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            batch: list[ReadableSpan] = list(spans)
            count.spans += len(batch)
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(CountingExporter()))
    return provider, count


def _stats(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"median": None, "min": None, "max": None, "runs": 0, "values": []}
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": len(values),
            "values": values}


def compute(results: dict[str, Any]) -> None:
    """``figures``: CPU per turn off and on, and on / off and on - off run by run."""
    off = [run["cpu_us_per_turn"] for run in results["runs"]["off"]]
    on = [run["cpu_us_per_turn"] for run in results["runs"]["on"]]
    results["figures"] = {
        "off_cpu_us_per_turn": _stats(off),
        "on_cpu_us_per_turn": _stats(on),
        "on_vs_off": _stats([b / a for a, b in zip(off, on, strict=True) if a]),
        "added_cpu_us_per_turn": _stats([b - a for a, b in zip(off, on, strict=True)]),
        "spans_per_turn": _stats([run["spans_per_turn"] for run in results["runs"]["on"]]),
    }


def run_tracing(
    mode: str = "quick",
    out_dir: Path | None = None,
    stdout: TextIO | None = None,
    *,
    config: dict[str, Any] | None = None,
    isolate: bool = True,
    progress_stream: TextIO | None = None,
    show_progress: bool = True,
) -> dict[str, Any]:
    """Run off and on ``repeats`` times each, alternating; returns the results (also
    written to ``out_dir/bench-tracing-<mode>.json`` when given). ``isolate``: each run in
    a fresh process (tests run them here)."""
    from ._worker import in_child, run_phase

    cfg = {**CONFIGS[mode], **(config or {})}
    params = {"n": cfg["n"], "k": cfg["k"]}
    bar = ProgressBar(2 * cfg["repeats"], progress_stream, enabled=show_progress)
    started = time.monotonic()
    results: dict[str, Any] = {"schema": 1, "mode": mode, "config": cfg, "machine": machine(),
                               "runs": {"off": [], "on": []}}
    try:
        for repeat in range(cfg["repeats"]):
            order = ("off", "on") if repeat % 2 == 0 else ("on", "off")
            for side in order:
                run_params = {**params, "tracing": side == "on"}
                progress: Progress = bar.phase(f"tracing {side} (run {repeat + 1}/{cfg['repeats']})", 1.0)
                try:
                    result = (in_child("turns", run_params, progress) if isolate
                              else run_phase("turns", run_params, progress))
                finally:
                    bar.end_phase()
                result["repeat"], result["order"] = repeat, sum(map(len, results["runs"].values()))
                result["load_average"] = load_average()
                results["runs"][side].append(result)
    finally:
        bar.close()
    results["seconds"] = time.monotonic() - started
    results["machine"]["load_average_at_end"] = load_average()
    compute(results)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / f"bench-tracing-{mode}.json"
        path.write_text(json.dumps(results, indent=2) + "\n")
        results["file"] = str(path)
    _print(results, stdout if stdout is not None else sys.stdout)
    return results


def _print(results: dict[str, Any], out: TextIO) -> None:
    from ._tables import tracing_table

    print(tracing_table(results), file=out)
    if results.get("file"):
        print(f"\nwritten: {results['file']}", file=out)
    print(f"took {results['seconds']:.0f} s", file=out)
