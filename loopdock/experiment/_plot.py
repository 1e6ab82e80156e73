"""The success-vs-cost plot: one point per cell with its 95% interval, and the Pareto
front (the cells no other cell beats on both success and cost). matplotlib is optional
(``pip install 'loopdock[bench]'``); without it there is no plot, and the report says so.

Without a price for every cell the x axis is tokens per rollout instead of cost.
"""

from __future__ import annotations

import io

from ._errors import ExperimentError
from ._report import Cell, Report


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indexes of the points (cost, success) that no other point dominates (no more
    costly and no less successful, better in one), cheapest first."""
    front = []
    for i, (cost, success) in enumerate(points):
        dominated = any(
            c <= cost and s >= success and (c < cost or s > success) for j, (c, s) in enumerate(points) if j != i
        )
        if not dominated:
            front.append(i)
    return sorted(front, key=lambda i: points[i])


def _x(cell: Cell, by_cost: bool) -> float:
    if by_cost:
        return cell.cost_per_rollout or 0.0
    return cell.tokens_per_rollout


def render_png(report: Report) -> bytes:
    """The plot as PNG bytes; MISSING_EXTRA without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display: the plot is a file
        import matplotlib.pyplot as plt
    except ImportError:
        raise ExperimentError(
            "MISSING_EXTRA", "the plot needs matplotlib: pip install 'loopdock[bench]'"
        ) from None
    cells = [c for c in report.cells if c.samples]
    # Free cells (the offline ping model) all sit at 0: tokens then tell them apart.
    by_cost = all(c.cost is not None for c in cells) and any(c.cost for c in cells)
    points = [(_x(c, by_cost), c.success_rate) for c in cells]
    figure, axes = plt.subplots(figsize=(9, 4.5), dpi=110)
    try:
        # Cells are named in a legend beside the axes: labels next to points would overlap
        # wherever cells are close (and cells often are).
        for cell, (x, y) in zip(cells, points, strict=True):
            axes.errorbar([x], [y], yerr=[[y - cell.success_low], [cell.success_high - y]], fmt="o", capsize=4,
                          label=cell.label)  # fmt: skip
        front = pareto_front(points)
        if len(front) > 1:
            axes.plot([points[i][0] for i in front], [points[i][1] for i in front], "--", color="grey",
                      label="Pareto front")  # fmt: skip
        axes.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8, borderaxespad=0)
        axes.set_xlabel(f"cost per rollout ({report.currency})" if by_cost else "tokens per rollout")
        axes.set_ylabel("success rate (95% Wilson interval)")
        axes.set_ylim(-0.05, 1.05)
        axes.set_title(f"experiment {report.run}: success vs {'cost' if by_cost else 'tokens'}")
        axes.grid(alpha=0.3)
        figure.tight_layout()
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png")
        return buffer.getvalue()
    finally:
        plt.close(figure)
