"""The report as one static HTML page: no script, no external file (the plot is
embedded), so it can be mailed or attached to a pull request as it is."""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Collection, Mapping, Sequence

from loopdock.runtime import Event

from ._records import RolloutResult
from ._report import Report
from ._text import fmt, interval, money, p_value, rate_interval, signed

_STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; padding: 0 1em; }
h1 { font-size: 1.4em; } h2 { font-size: 1.1em; margin-top: 2em; }
table { border-collapse: collapse; margin: .5em 0; }
th, td { padding: .25em .6em; border-bottom: 1px solid #ddd; text-align: left; vertical-align: top; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
th { background: #f4f4f4; }
.good { color: #176117; } .bad { color: #9b1c1c; } .muted { color: #777; }
details { margin: .3em 0; } pre { white-space: pre-wrap; margin: 0; max-width: 60em; }
"""


def _e(value: object) -> str:
    return html.escape(str(value))


def _row(cells: list[str], numeric: Collection[int] = ()) -> str:
    return "<tr>" + "".join(f'<td class="n">{c}</td>' if i in numeric else f"<td>{c}</td>"
                            for i, c in enumerate(cells)) + "</tr>"  # fmt: skip


def _head(names: list[str]) -> str:
    return "<tr>" + "".join(f"<th>{_e(n)}</th>" for n in names) + "</tr>"


def transcript_path(session_id: str) -> str:
    """Where a rollout's transcript page is, relative to report.html."""
    return f"transcripts/{session_id}.html"


def _event_body(data: object) -> str:
    content = data.get("content") if isinstance(data, Mapping) else None
    if isinstance(content, list):
        parts = [str(b.get("text", "")) if isinstance(b, Mapping) and b.get("type") == "text" else json.dumps(b, indent=1)
                 for b in content]  # fmt: skip
        rest = {k: v for k, v in data.items() if k != "content"} if isinstance(data, Mapping) else {}
        return "\n\n".join(parts) + (f"\n\n{json.dumps(rest, indent=1)}" if rest else "")
    return json.dumps(dict(data) if isinstance(data, Mapping) else data, indent=1)


def render_transcript(result: RolloutResult, events: Sequence[Event]) -> str:
    """One rollout's session as a static page: every event, in order."""
    score = "-" if result.value is None else f"{result.value:g}"
    out = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{_e(result.session_id)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>task {_e(result.task)} sample {_e(result.sample)}: {_e(result.model_label)} x {_e(result.loop_label)}</h1>",
        f"<p>repeat {result.repeat}, attempt {result.attempt}, {_e(result.status)}, score {score}"
        f"{', ' + _e(result.error) if result.error else ''}. Session <code>{_e(result.session_id)}</code>.</p>",
        "<table>", _head(["seq", "event", ""]),
    ]
    for event in events:
        out.append(_row([str(event.seq), _e(event.type), f"<pre>{_e(_event_body(event.data))}</pre>"], numeric={0}))
    out.append("</table></body></html>")
    return "\n".join(out) + "\n"


def _per_sample(report: Report, transcripts: Collection[str]) -> list[str]:
    """Rows (task, sample), columns cells: each finished rollout's score, linked to its
    transcript where one was written."""
    labels = [c.label for c in report.cells]
    grid: dict[tuple[str, str], dict[str, list[RolloutResult]]] = {}
    for r in report.rollouts:
        grid.setdefault((r.task, r.sample), {}).setdefault(f"{r.model_label} x {r.loop_label}", []).append(r)
    out = ["<h2>Per sample</h2><p>Each finished rollout's score (a failed one is 0), repeat by repeat, "
           "linked to its transcript.</p><table>", _head(["task", "sample", *labels])]  # fmt: skip
    for (task, sample), by_cell in grid.items():
        entries = []
        for label in labels:
            shown = []
            for r in sorted(by_cell.get(label, []), key=lambda r: r.repeat):
                if not r.finished:
                    shown.append("<span class='muted'>pending</span>")
                    continue
                text = f"{r.score:g}" if r.done else "0 (failed)"
                tone = "" if r.done else " class='bad'"
                link = transcript_path(r.session_id)
                shown.append(f"<a href='{_e(link)}'{tone}>{text}</a>" if r.session_id in transcripts else text)
            entries.append(" ".join(shown) or "-")
        out.append(_row([_e(task), _e(sample), *entries]))
    out.append("</table>")
    return out


def render_html(report: Report, png: bytes | None, plot_note: str = "", transcripts: Collection[str] = ()) -> str:
    """``transcripts``: the session ids whose transcript pages are written next to the
    page (``transcript_path``), for the per-sample table to link to."""
    out = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>experiment {_e(report.run)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>experiment {_e(report.run)}</h1>",
        f"<p>{report.planned} rollouts planned, {report.scored} scored, "
        f"{sum(c.failed for c in report.cells)} failed, {sum(c.pending for c in report.cells)} not run yet. "
        f"Cost in {_e(report.currency)}. n counts finished rollouts, a failed one as a score of 0. Success "
        f"is a score of 1; rate and score are means over samples of each sample's mean over its repeats, "
        f"with a 95% Wilson interval over the samples; latency is per rollout, on the runner's clock.</p>",
        "<h2>Cells</h2><table>",
        _head(["model", "loop", "n", "samples", "success", "rate", "95% CI", "score", "turns", "in tok", "out tok",
               "cost/rollout", "cost", "p50 ms", "p95 ms", "limit hits", "failed", "pending"]),  # fmt: skip
    ]
    for c in report.cells:
        out.append(_row([
            _e(c.model), _e(c.loop), str(c.rollouts), str(c.samples), f"{c.successes}/{c.rollouts}",
            fmt(c.success_rate), rate_interval(c.success_low, c.success_high), fmt(c.score), fmt(c.turns, 1),
            str(c.input_tokens), str(c.output_tokens), money(c.cost_per_rollout), money(c.cost),
            fmt(c.latency_p50_ms, 0), fmt(c.latency_p95_ms, 0), str(c.limit_hits), str(c.failed), str(c.pending),
        ], numeric=set(range(2, 18)) - {6}))  # fmt: skip
    out.append("</table>")
    if png is not None:
        data = base64.b64encode(png).decode()
        out.append(f"<h2>Success vs cost</h2><img alt='success vs cost per cell' src='data:image/png;base64,{data}'>")
    elif plot_note:
        out.append(f"<p class='muted'>{_e(plot_note)}</p>")
    if report.deltas:
        out += ["<h2>Paired deltas (a &minus; b, per sample)</h2>",
                "<p>For every (task, sample) both cells finished: the mean score over repeats on one side "
                "minus the other's, then the mean of those differences with a 95% t interval. p: the exact "
                "sign-flip (paired permutation) test; Holm: adjusted for all the comparisons on this page. "
                "Coloured only where the Holm-adjusted p is below 0.05.</p><table>",
                _head(["kind", "a", "b", "pairs", "score", "95% CI", "p", "p (Holm)", "cost per rollout",
                       "95% CI"])]  # fmt: skip
        for d in report.deltas:
            tone = ("good" if d.success > 0 else "bad") if d.significant else ""
            out.append(_row([
                _e(d.kind), _e(d.a), _e(d.b), str(d.pairs), f"<span class='{tone}'>{signed(d.success)}</span>",
                interval(d.success_low, d.success_high), p_value(d.p_value), p_value(d.p_holm), signed(d.cost, 4),
                interval(d.cost_low, d.cost_high, 4),
            ], numeric={3, 4, 6, 7, 8}))  # fmt: skip
        out.append("</table>")
    if report.tasks:
        labels = [label for label, _, _ in report.tasks[0][1]]
        out += ["<h2>Success per task</h2><table>", _head(["task", *labels])]
        for task, row in report.tasks:
            out.append(_row([_e(task), *(f"{s}/{n}" for _, s, n in row)], numeric=set(range(1, len(row) + 1))))
        out.append("</table>")
    out += _per_sample(report, transcripts)
    out += ["<h2>Rollouts</h2><table>",
            _head(["task", "sample", "cell", "repeat", "attempt", "status", "score", "turns", "tokens",
                   "ms", "ended", "answer", "session"])]  # fmt: skip
    for r in report.rollouts:
        ended = r.ended or {}
        why = ended.get("reason") or ended.get("cause") or ""
        ended_text = f"{ended.get('kind', '')}{': ' + str(why) if why else ''}" if ended else ""
        if r.error:  # why it failed comes first: a scorer fails after a turn that completed
            ended_text = f"{r.error}{' (turn ' + ended_text + ')' if ended_text else ''}"
        answer = f"<details><summary>{_e(r.answer[:60])}</summary><pre>{_e(r.answer)}\n\n{_e(r.explanation)}</pre></details>" \
            if r.answer else ""  # fmt: skip
        out.append(_row([
            _e(r.task), _e(r.sample), _e(f"{r.model_label} x {r.loop_label}"), str(r.repeat), str(r.attempt),
            _e(r.status), "-" if r.value is None else f"{r.value:g}", str(r.steps),
            str(r.input_tokens + r.output_tokens), "-" if r.latency_ms is None else str(r.latency_ms),
            _e(ended_text), answer, f"<code>{_e(r.session_id)}</code>",
        ], numeric={3, 4, 6, 7, 8, 9}))  # fmt: skip
    out.append("</table></body></html>")
    return "\n".join(out) + "\n"
