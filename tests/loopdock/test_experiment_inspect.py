"""Export to Inspect AI's log format, read back with inspect_ai's own reader (the
``inspect`` extra; the test extra installs it, so CI runs this)."""

from __future__ import annotations

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
