"""The report as plain text, for a terminal: the cells, the paired deltas, per task."""

from __future__ import annotations

import math

from ._report import Cell, Delta, Report


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


def _cell_row(cell: Cell) -> list[str]:
    rate = fmt(cell.success_rate)
    return [
        cell.model, cell.loop, str(cell.samples), f"{cell.successes}/{cell.samples}", rate,
        f"[{cell.success_low:.2f}, {cell.success_high:.2f}]", fmt(cell.turns, 1),
        str(cell.input_tokens), str(cell.output_tokens), money(cell.cost_per_rollout), money(cell.cost),
        fmt(cell.latency_p50_ms, 0), fmt(cell.latency_p95_ms, 0), str(cell.failed), str(cell.pending),
    ]  # fmt: skip


def _delta_row(delta: Delta) -> list[str]:
    return [
        delta.kind, f"{delta.a}  -  {delta.b}", str(delta.pairs), signed(delta.success),
        interval(delta.success_low, delta.success_high), signed(delta.cost, 4),
        interval(delta.cost_low, delta.cost_high, 4),
    ]  # fmt: skip


def render_text(report: Report) -> str:
    failed = sum(c.failed for c in report.cells)
    pending = sum(c.pending for c in report.cells)
    lines = [
        f"experiment {report.run}: {report.planned} rollouts planned, {report.scored} scored, "
        f"{failed} failed, {pending} not run yet; cost in {report.currency}",
        "",
    ]
    headers = ["model", "loop", "n", "success", "rate", "95% CI", "turns", "in tok", "out tok",
               "cost/rollout", "cost", "p50 ms", "p95 ms", "failed", "pending"]  # fmt: skip
    lines += _table(headers, [_cell_row(c) for c in report.cells], right=set(range(2, 15)) - {5})
    if report.deltas:
        lines += ["", "paired deltas per sample (a - b; success and cost per rollout; 95% t interval)", ""]
        headers = ["kind", "a - b", "pairs", "success", "95% CI", "cost", "95% CI"]
        lines += _table(headers, [_delta_row(d) for d in report.deltas], right={2, 3, 5})
    if len(report.tasks) > 1:
        lines += ["", "success per task", ""]
        labels = [label for label, _, _ in report.tasks[0][1]]
        rows = [[task, *(f"{s}/{n}" for _, s, n in row)] for task, row in report.tasks]
        lines += _table(["task", *labels], rows, right=set(range(1, len(labels) + 1)))
    if report.judge_input_tokens or report.judge_output_tokens:
        lines += ["", f"judge: {report.judge_input_tokens} input and {report.judge_output_tokens} output tokens"]
    return "\n".join(lines) + "\n"
