"""Export to Inspect AI's log format, read back with inspect_ai's own reader (the
``inspect`` extra; the test extra installs it, so CI runs this)."""

from __future__ import annotations

import pytest
import trio

from loopdock import Runtime
from loopdock.experiment import load_experiment, run_in_runtime
from loopdock.experiment._history import read_run
from loopdock.experiment._inspect import export_inspect
from loopdock.experiment._report import build_report
from loopdock.runtime._store import SessionStore

from .experiment_models import FIX_FILES, deepseek_stand_in


async def _run(home):
    async with Runtime.open(home) as rt:
        with trio.fail_after(120):
            await run_in_runtime(rt, load_experiment(FIX_FILES / "experiment.yml"), adapters={"deepseek": deepseek_stand_in()})


def test_the_export_reads_back_with_inspect_ais_reader(tmp_path):
    # A plain test, not a trio one: inspect_ai's synchronous reader and writer refuse to
    # run inside a trio event loop (as the CLI's export never does).
    from inspect_ai.log import list_eval_logs, read_eval_log

    home = tmp_path / "home"
    trio.run(_run, home)
    with SessionStore.open(home / "sessions.db") as store:
        history = read_run(store, "fix-files")
        files = export_inspect(store, history, build_report(history), tmp_path / "logs")
    assert len(files) == 4  # one task x two models x two loops
    assert len(list_eval_logs(str(tmp_path / "logs"))) == 4
    logs = {(log.eval.model, log.eval.solver): log for log in map(lambda f: read_eval_log(str(f)), files)}
    assert set(logs) == {(m, lp) for m in ("deepseek/deepseek-v4-flash", "deepseek/deepseek-v4-pro")
                         for lp in ("standard", "minimal-first")}  # fmt: skip
    pro = logs[("deepseek/deepseek-v4-pro", "minimal-first")]
    assert (pro.status, pro.eval.task, pro.eval.config.epochs) == ("success", "fix-files", 3)
    assert pro.results.total_samples == 15 and pro.results.completed_samples == 15
    assert pro.results.scores[0].metrics["accuracy"].value == 1.0
    assert len(pro.samples) == 15
    sample = next(s for s in pro.samples if s.id == "sum" and s.epoch == 2)
    assert sample.scores["python"].value == 1.0
    assert [m.role for m in sample.messages] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert sample.messages[1].tool_calls[0].function == "list_dir"
    assert sample.messages[3].tool_calls[0].arguments == {"path": "sum.txt", "content": "42\n"}
    assert sample.model_usage["deepseek/deepseek-v4-pro"].input_tokens == 6000
    flash = logs[("deepseek/deepseek-v4-flash", "minimal-first")]
    assert flash.results.scores[0].metrics["accuracy"].value == 0.0
    assert flash.samples[0].output.completion == "I cannot change files with these tools."


def test_a_failure_says_why_on_the_progress_line_the_report_the_page_and_the_export(tmp_path):
    # The reason used to be only in the database: "attempt 1 failed", an empty cell, no sample.
    import io

    from inspect_ai.log import read_eval_log

    from loopdock.experiment import parse_experiment
    from loopdock.experiment._html import render_html
    from loopdock.experiment._progress import ProgressDisplay
    from loopdock.experiment._text import render_text

    (tmp_path / "bad_scorer.py").write_text("def score(state):\n    return 3\n")
    experiment = parse_experiment(
        {"tasks": [{"id": "greet", "input": "hello", "target": "pong"}], "models": [{"provider": "ping", "model": "ping-1",
         "price": {"input": 1000, "output": 1000}}], "loops": ["standard"],
         "scorer": {"kind": "python", "function": "bad_scorer:score"}},
        base=tmp_path, default_name="bad")  # fmt: skip
    why = "scorer failed: scorer bad_scorer:score returned the value 3.0; values are in 0..1"
    progress = io.StringIO()
    home = tmp_path / "home"

    async def main():
        async with Runtime.open(home) as rt:
            with trio.fail_after(60):
                await run_in_runtime(rt, experiment, on_progress=ProgressDisplay(progress, tty=False, currency="USD"))

    trio.run(main)
    assert f"attempt 1 failed ({why}): task greet sample 1" in progress.getvalue()
    with SessionStore.open(home / "sessions.db") as store:
        history = read_run(store, "bad")
        report = build_report(history)
        [file] = export_inspect(store, history, report, tmp_path / "logs")
    text = render_text(report)
    assert "failed rollouts (1; each counts as a score of 0)" in text and why in text
    assert why in render_html(report, None)
    log = read_eval_log(str(file))
    [sample] = log.samples
    assert sample.error is not None and sample.error.message == why
    assert sample.scores["score"].value == 0.0
    assert sample.model_usage["ping/ping-1"].total_cost == pytest.approx(report.cells[0].cost)
    assert log.results.completed_samples == 1 and log.results.scores[0].scored_samples == 0
