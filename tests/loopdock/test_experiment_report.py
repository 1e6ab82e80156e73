"""The report: its statistics, cells and paired deltas on hand-made results (exact), the
plot's Pareto front, the HTML page, ``--json``, and the CLI end to end."""

from __future__ import annotations

import json
import math
from html.parser import HTMLParser

import pytest

from loopdock.experiment._history import RunHistory, read_run
from loopdock.experiment._html import render_html
from loopdock.experiment._plot import pareto_front, render_png
from loopdock.experiment._records import RolloutResult
from loopdock.experiment._report import build_report, cells_json
from loopdock.experiment._spec import Price
from loopdock.experiment._stats import mean_interval, percentile, t975, wilson
from loopdock.runtime._store import SessionStore


def test_wilson_interval_known_values():
    # The closed form at n = 10; the interval stays inside [0, 1] at 0 successes.
    low, high = wilson(5, 10)
    assert (round(low, 4), round(high, 4)) == (0.2366, 0.7634)
    assert wilson(0, 10)[0] == 0.0 and round(wilson(0, 10)[1], 4) == 0.2775
    assert wilson(0, 0) == (0.0, 1.0)


def test_t_interval_and_percentiles():
    mean, low, high = mean_interval([1.0, 2.0, 3.0, 4.0])
    assert mean == 2.5 and round(low, 4) == round(2.5 - 3.182 * math.sqrt(1.6666667 / 4), 4) and high > mean
    assert math.isnan(mean_interval([1.0])[1])
    assert (t975(1), t975(30), t975(45), t975(1000)) == (12.706, 2.042, 2.000, pytest.approx(1.96, abs=1e-3))
    assert percentile([10, 20, 30, 40], 50) == 25 and percentile([10, 20, 30, 40], 95) == pytest.approx(38.5)
    assert math.isnan(percentile([], 50))


def result(task, sample, model, loop, repeat, value, *, tokens=(100, 10), latency=1000, status="scored", attempt=1):
    provider, name = model.split("/")
    return RolloutResult(
        session_id=f"exp.r.{task}{sample}{name}{loop}{repeat}.{attempt}", run="r",
        key=f"{task}-{sample}-{model}-{loop}-{repeat}", task=task, sample=sample, provider=provider, model=name,
        loop=loop, driver=None, repeat=repeat, attempt=attempt, status=status,
        value=value if status == "scored" else None, steps=2, input_tokens=tokens[0], output_tokens=tokens[1],
        latency_ms=latency, ended={"kind": "completed"},
    )  # fmt: skip


def plan(results, models, loops, **extra):
    return {"run": "r", "models": [{"label": m, "price": None} for m in models], "loops": loops,
            "tasks": [{"id": "t", "samples": 3, "scorer": "exact"}], "repeats": 2, "currency": "USD",
            "keys": [r.key for r in results], **extra}  # fmt: skip


def test_cells_count_scored_failed_and_pending_rollouts_and_price_them():
    results = [
        result("t", "1", "p/a", "std", 1, 1.0, latency=100),
        result("t", "1", "p/a", "std", 2, 0.0, latency=300),
        result("t", "2", "p/a", "std", 1, 1.0, latency=200),
        result("t", "2", "p/a", "std", 2, 0.0, status="error"),
    ]
    history = RunHistory("r", (plan(results, ["p/a"], ["std"], keys=[r.key for r in results] + ["never-run"]),),
                         tuple(results), {})  # fmt: skip
    report = build_report(history, {"p/a": Price(1000, 2000)})
    [cell] = report.cells
    # The failed rollout counts (as a score of 0, with its tokens and cost); the one never
    # run is pending. Two samples are the unit: sample 1 passes 1 of 2, sample 2 1 of 2.
    assert (cell.rollouts, cell.samples, cell.successes, cell.failed, cell.pending) == (4, 2, 2, 1, 1)
    assert (cell.success_rate, cell.score) == (0.5, 0.5)
    assert (cell.input_tokens, cell.output_tokens, cell.turns) == (400, 40, 2.0)
    assert cell.cost == pytest.approx(4 * (100 * 1000 + 10 * 2000) / 1e6)
    assert (cell.latency_p50_ms, cell.latency_p95_ms) == (250.0, pytest.approx(895.0))
    assert cells_json(report)["cells"][0]["costPerRollout"] == pytest.approx(0.12)
    # Without a price there is no cost, rather than a cost of 0.
    assert build_report(history).cells[0].cost is None


def test_paired_deltas_pair_samples_and_average_repeats():
    results = []
    # Loop b beats a on samples 1 and 2 (by 1 and by 0.5 after averaging its repeats);
    # sample 3 ran only on a, so it is not paired.
    for repeat, (a1, a2, b1, b2) in enumerate([(0.0, 1.0, 1.0, 1.0), (0.0, 0.0, 1.0, 1.0)], start=1):
        results += [result("t", "1", "p/m", "a", repeat, a1), result("t", "2", "p/m", "a", repeat, a2),
                    result("t", "1", "p/m", "b", repeat, b1), result("t", "2", "p/m", "b", repeat, b2)]  # fmt: skip
    results.append(result("t", "3", "p/m", "a", 1, 1.0))
    report = build_report(RunHistory("r", (plan(results, ["p/m"], ["a", "b"]),), tuple(results), {}))
    [delta] = report.deltas
    assert (delta.kind, delta.a, delta.b, delta.pairs) == ("loop", "p/m x b", "p/m x a", 2)
    assert delta.success == pytest.approx(0.75)
    half = 12.706 * math.sqrt(((1 - 0.75) ** 2 + (0.5 - 0.75) ** 2) / 1 / 2)
    assert 0.75 - half < -1 and 0.75 + half > 1  # two pairs: t's interval is wider than the scale
    assert (delta.success_low, delta.success_high) == (-1.0, 1.0)
    assert report.tasks == (("t", (("p/m x a", 2, 5), ("p/m x b", 4, 4))),)


def test_the_pareto_front_keeps_the_cells_nothing_beats():
    points = [(1.0, 0.5), (2.0, 0.9), (2.0, 0.4), (0.5, 0.5), (3.0, 0.9)]
    assert pareto_front(points) == [3, 1]


def test_the_plot_is_a_png_and_the_html_page_embeds_it():
    results = [result("t", "1", "p/a", "std", 1, 1.0), result("t", "1", "p/b", "std", 1, 0.0, tokens=(50, 5))]
    report = build_report(RunHistory("r", (plan(results, ["p/a", "p/b"], ["std"]),), tuple(results), {}),
                          {"p/a": Price(1, 1), "p/b": Price(1, 1)})  # fmt: skip
    png = render_png(report)
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    page = render_html(report, png)
    assert page.count("data:image/png;base64,") == 1
    assert "<h2>Paired deltas" in page and "p/b x std" in page and "exp.r.t1astd1.1" in page
    assert "<script" not in page
    assert "no plot: the plot needs matplotlib" in render_html(report, None, "no plot: the plot needs matplotlib")


def test_the_cli_runs_reports_and_prints_json(tmp_path, capsys, main):
    experiment = tmp_path / "tiny.yml"
    experiment.write_text("{tasks: [{id: greet, input: hello, target: pong}], scorer: includes, "
                          "models: [{provider: ping, model: ping-1}], loops: [standard, minimal-first], repeats: 2}\n")  # fmt: skip
    home = tmp_path / "home"
    assert main(["experiment", "run", str(experiment), "--home", str(home)]) == 0
    out = capsys.readouterr()
    assert "experiment tiny: 4 rollouts, 0 scored before, 4 scored now, 0 failed, 0 not run (budget)" in out.out
    assert out.err.count("scored 1: task greet sample 1 ping/ping-1") == 4
    assert main(["experiment", "run", str(experiment), "--home", str(home)]) == 2
    assert "already holds a run 'tiny' (4 rollouts scored): pass --resume" in capsys.readouterr().err
    assert main(["experiment", "report", "tiny", "--home", str(home), "--json"]) == 0
    cells = json.loads(capsys.readouterr().out)["cells"]
    assert [(c["model"], c["loop"], c["rollouts"], c["samples"], c["successes"], c["inputTokens"], c["cost"])
            for c in cells] == [("ping/ping-1", "standard", 2, 1, 2, 22, 0.0),
                                ("ping/ping-1", "minimal-first", 2, 1, 2, 22, 0.0)]  # fmt: skip
    assert set(cells[0]["latencyMs"]) == {"p50", "p95"}
    out_dir = tmp_path / "out"
    assert main(["experiment", "report", "tiny", "--home", str(home), "--out", str(out_dir)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("experiment tiny: 4 rollouts planned, 4 scored, 0 failed, 0 not run yet; cost in USD\n")
    assert (out_dir / "report.html").read_text().startswith("<!doctype html>")
    assert (out_dir / "success-vs-cost.png").read_bytes().startswith(b"\x89PNG")
    assert main(["experiment", "report", "nope", "--home", str(home)]) == 2
    assert "UNKNOWN_RUN: no experiment run 'nope' in" in capsys.readouterr().err


def test_cells_at_0_and_100_percent_have_intervals_on_the_scale_and_a_plot():
    # Rounding once put 10/10 at 0.9999999999999999 and 0/3 a hair above 0: the plot then
    # rejected a negative error bar and the report wrote no PNG and no HTML.
    for n in range(1, 200):
        assert wilson(n, n)[1] == 1.0 and wilson(0, n)[0] == 0.0
        for k in range(n + 1):
            low, high = wilson(k, n)
            assert 0.0 <= low <= k / n <= high <= 1.0
    results = [result("t", "1", "p/a", "std", r, 1.0) for r in range(1, 11)]
    results += [result("t", "1", "p/a", "min", r, 0.0) for r in range(1, 11)]
    report = build_report(RunHistory("r", (plan(results, ["p/a"], ["std", "min"]),), tuple(results), {}))
    assert [(c.success_low, c.success_high) for c in report.cells][0][1] == 1.0
    assert render_png(report).startswith(b"\x89PNG")


def test_a_zero_width_delta_is_not_shown_as_significant():
    # Four samples, loop b fails all four that a passes: every difference is -1, so the
    # t interval has no width; it says nothing, and the page must not paint it red.
    results = [result("t", str(s), "p/m", "a", 1, 1.0) for s in range(1, 5)]
    results += [result("t", str(s), "p/m", "b", 1, 0.0) for s in range(1, 5)]
    report = build_report(RunHistory("r", (plan(results, ["p/m"], ["a", "b"]),), tuple(results), {}))
    [delta] = report.deltas
    assert delta.success == -1.0 and math.isnan(delta.success_low) and math.isnan(delta.success_high)
    assert "class='bad'" not in render_html(report, None)


def test_limit_runs_the_first_samples_and_a_resume_runs_the_rest(tmp_path, capsys, main):
    experiment = tmp_path / "smoke.yml"
    experiment.write_text("{tasks: [{id: greet, samples: [{input: a, target: pong}, {input: b, target: pong}, "
                          "{input: c, target: pong}]}], scorer: includes, models: [ping/ping-1], "
                          "loops: [standard, minimal-first]}\n")  # fmt: skip
    home = tmp_path / "home"
    assert main(["experiment", "run", str(experiment), "--home", str(home), "--limit", "1"]) == 0
    assert "experiment smoke: 2 rollouts, 0 scored before, 2 scored now" in capsys.readouterr().out
    assert main(["experiment", "run", str(experiment), "--home", str(home), "--resume"]) == 0
    assert "experiment smoke: 6 rollouts, 2 scored before, 4 scored now" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["experiment", "run", str(experiment), "--home", str(home), "--limit", "0"])
    assert "--limit: must be a whole number >= 1, got '0'" in capsys.readouterr().err


def test_fail_under_gates_ci_on_every_cells_score(tmp_path, capsys, main):
    experiment = tmp_path / "gate.yml"
    experiment.write_text("{tasks: [{id: greet, input: hello, target: pong}], scorer: includes, "
                          "models: [ping/ping-1], loops: [standard]}\n")  # fmt: skip
    home = tmp_path / "home"
    assert main(["experiment", "run", str(experiment), "--home", str(home)]) == 0
    capsys.readouterr()
    report = ["experiment", "report", "gate", "--home", str(home), "--out", str(tmp_path / "out")]
    assert main([*report, "--fail-under", "1"]) == 0
    assert main(report) == 0
    capsys.readouterr()
    (tmp_path / "gate.yml").write_text("{name: gate2, tasks: [{id: greet, input: hello, target: nope}], "
                                       "scorer: includes, models: [ping/ping-1], loops: [standard]}\n")  # fmt: skip
    assert main(["experiment", "run", str(experiment), "--home", str(home)]) == 0
    capsys.readouterr()
    assert main(["experiment", "report", "gate2", "--home", str(home), "--json", "--fail-under", "0.5"]) == 1
    out = capsys.readouterr()
    assert "below --fail-under 0.5: ping/ping-1 x standard scores 0.00" in out.err
    assert json.loads(out.out)["cells"][0]["score"] == 0.0  # stdout stays JSON


def history(home, name):
    with SessionStore.open(home / "sessions.db") as store:
        return read_run(store, name)


class _PerSampleTable(HTMLParser):
    """The rows of the page's "Per sample" table: [(cells' texts, each cell's links)]."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[list[str], list[list[tuple[str, str]]]]] = []
        self._heading = self._inside = False
        self._link: str | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "h2":
            self._heading = True
        elif tag == "table" and self._inside is None:
            self._inside = True
        elif self._inside is True and tag == "tr":
            self.rows.append(([], []))
        elif self._inside is True and tag == "td":
            self.rows[-1][0].append("")
            self.rows[-1][1].append([])
        elif self._inside is True and tag == "a":
            self._link = dict(attrs)["href"]

    def handle_endtag(self, tag):
        if tag == "table" and self._inside is True:
            self._inside = False
        elif tag == "a":
            self._link = None

    def handle_data(self, data):
        if self._heading:
            self._heading = False
            if data == "Per sample":
                self._inside = None  # the next table is it
        elif self._inside is True and self.rows and self.rows[-1][0]:
            self.rows[-1][0][-1] += data
            if self._link is not None:
                self.rows[-1][1][-1].append((data, self._link))


def test_the_html_has_a_sample_by_cell_table_linking_each_rollout_to_its_transcript(tmp_path, capsys, main):
    experiment = tmp_path / "grid.yml"
    experiment.write_text("{tasks: [{id: greet, samples: [{input: hello, target: pong}, {input: bye, target: nope}]}], "
                          "scorer: includes, models: [{provider: ping, model: ping-1}], loops: [standard, minimal-first], "
                          "repeats: 2}\n")  # fmt: skip
    home, out_dir = tmp_path / "home", tmp_path / "out"
    assert main(["experiment", "run", str(experiment), "--home", str(home)]) == 0
    assert main(["experiment", "report", "grid", "--home", str(home), "--out", str(out_dir)]) == 0
    capsys.readouterr()
    table = _PerSampleTable()
    table.feed((out_dir / "report.html").read_text())
    body = [row for row in table.rows if row[0]]
    assert [texts[:2] for texts, _ in body] == [["greet", "1"], ["greet", "2"]]
    seen = {}
    for texts, links in body:
        assert len(texts) == 4  # task, sample, and the two cells
        for cell in links[2:]:
            assert len(cell) == 2  # one link per repeat
            for score, href in cell:
                page = (out_dir / href).read_text()
                assert "assistant/message" in page
                seen[href] = (texts[1], score, page)
    results = [r for r in history(home, "grid").results if r.finished]
    assert len(results) == len(seen) == 8
    for r in results:
        sample, score, page = seen[f"transcripts/{r.session_id}.html"]
        assert (sample, score) == (r.sample, f"{r.score:g}")
        assert ("pong: hello" if r.sample == "1" else "pong: bye") in page
