"""The report as plain text, for a terminal: the cells, the paired deltas, per task."""

from __future__ import annotations

import math

from ._report import Cell, Delta, Report

MAX_FAILURE_LINES = 20


def cut(text: str, width: int) -> str:
    """``text`` on one line, at most ``width`` characters."""
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 3] + "..."


def fmt(value: float | None, digits: int = 2) -> str:
    if value is None or math.isnan(value):
        return "-"
    return f"{value:.{digits}f}"


def money(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.4f}" if value < 100 else f"{value:,.2f}"


def signed(value: float | None, digits: int = 2) -> str:
    if value is None or math.isnan(value):
        return "-"
    return f"{value:+.{digits}f}"


def interval(low: float | None, high: float | None, digits: int = 2) -> str:
    if low is None or high is None or math.isnan(low) or math.isnan(high):
        return "-"
    return f"[{low:+.{digits}f}, {high:+.{digits}f}]"


def _table(headers: list[str], rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        parts = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))]
        return "  ".join(parts).rstrip()

    return [line(headers), *(line(r) for r in rows)]


def p_value(value: float) -> str:
    if math.isnan(value):
        return "-"
    return "<0.001" if value < 0.001 else f"{value:.3f}"


def rate_interval(low: float, high: float) -> str:
    return f"[{low:.2f}, {high:.2f}]"


def _cell_row(cell: Cell) -> list[str]:
    rate = fmt(cell.success_rate)
    return [
        cell.model, cell.loop, str(cell.rollouts), str(cell.samples), f"{cell.successes}/{cell.rollouts}", rate,
        rate_interval(cell.success_low, cell.success_high), fmt(cell.score), fmt(cell.turns, 1),
        str(cell.input_tokens), str(cell.output_tokens), money(cell.cost_per_rollout), money(cell.cost),
        fmt(cell.latency_p50_ms, 0), fmt(cell.latency_p95_ms, 0), str(cell.failed), str(cell.pending),
    ]  # fmt: skip


def _delta_row(delta: Delta) -> list[str]:
    return [
        delta.kind, f"{delta.a}  -  {delta.b}", str(delta.pairs), signed(delta.success),
        interval(delta.success_low, delta.success_high), p_value(delta.p_value), p_value(delta.p_holm),
        "*" if delta.significant else "", signed(delta.cost, 4), interval(delta.cost_low, delta.cost_high, 4),
    ]  # fmt: skip


def render_text(report: Report) -> str:
    failed = sum(c.failed for c in report.cells)
    pending = sum(c.pending for c in report.cells)
    lines = [
        f"experiment {report.run}: {report.planned} rollouts planned, {report.scored} scored, "
        f"{failed} failed, {pending} not run yet; cost in {report.currency}",
        "",
    ]
    headers = ["model", "loop", "n", "samples", "success", "rate", "95% CI", "score", "turns", "in tok", "out tok",
               "cost/rollout", "cost", "p50 ms", "p95 ms", "failed", "pending"]  # fmt: skip
    lines += _table(headers, [_cell_row(c) for c in report.cells], right=set(range(2, 17)) - {6})
    lines += ["", "n: finished rollouts (a failed one scores 0); rate and score: means over samples of each "
              "sample's mean over its repeats; 95% CI: Wilson, over samples"]  # fmt: skip
    if report.deltas:
        lines += ["", "paired deltas per sample (a - b; score and cost per rollout; 95% t interval; p: exact "
                  "sign-flip test, Holm-adjusted over all deltas; *: Holm p < 0.05)", ""]  # fmt: skip
        headers = ["kind", "a - b", "pairs", "score", "95% CI", "p", "p (Holm)", "", "cost", "95% CI"]
        lines += _table(headers, [_delta_row(d) for d in report.deltas], right={2, 3, 5, 6, 8})
    if len(report.tasks) > 1:
        lines += ["", "success per task", ""]
        labels = [label for label, _, _ in report.tasks[0][1]]
        rows = [[task, *(f"{s}/{n}" for _, s, n in row)] for task, row in report.tasks]
        lines += _table(["task", *labels], rows, right=set(range(1, len(labels) + 1)))
    failures = [r for r in report.rollouts if r.failed]
    if failures:
        lines += ["", f"failed rollouts ({len(failures)}; each counts as a score of 0)", ""]
        rows = [[f"{r.model_label} x {r.loop_label}", r.task, r.sample, str(r.repeat), str(r.attempt),
                 cut(r.error or "", 120)] for r in failures[:MAX_FAILURE_LINES]]  # fmt: skip
        lines += _table(["cell", "task", "sample", "repeat", "attempt", "why"], rows, right={3, 4})
        if len(failures) > MAX_FAILURE_LINES:
            lines.append(f"... and {len(failures) - MAX_FAILURE_LINES} more (report.html lists them all)")
    if report.judge_input_tokens or report.judge_output_tokens:
        lines += ["", f"judge: {report.judge_input_tokens} input and {report.judge_output_tokens} output tokens"]
    return "\n".join(lines) + "\n"
