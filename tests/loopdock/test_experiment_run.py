"""Running experiments: every rollout one session, results only in the session logs, a
rerun that skips what is scored and retries the rest, limits, the budget, scorers.

Offline only: the ping model and scripted stand-ins (tests/loopdock/experiment_models.py).
"""

from __future__ import annotations

import attrs
import pytest
import trio

from loopdock import Runtime
from loopdock.experiment import ExperimentError, load_experiment, parse_experiment, run_in_runtime
from loopdock.experiment._history import read_run
from loopdock.experiment._report import build_report, cells_json
from loopdock.experiment._text import render_text
from loopdock.experiment._workdir import work_root
from loopdock.runtime import ModelError
from loopdock.runtime._store import SessionStore
from loopdock.runtime.models import Reply, ScriptedAdapter, ToolCall, Usage

from .experiment_models import FIX_FILES, deepseek_stand_in

SMALLEST = {
    "tasks": [{"id": "greet", "input": "hello", "target": "pong"}],
    "scorer": "includes",
    "models": [{"provider": "ping", "model": "ping-1"}],
    "loops": ["standard", "minimal-first"],
    "repeats": 2,
}


async def run(home, experiment, **kwargs):
    async with Runtime.open(home) as rt:
        return await run_in_runtime(rt, experiment, **kwargs)


def history(home, name):
    with SessionStore.open(home / "sessions.db") as store:
        return read_run(store, name)


def session_ids(home):
    with SessionStore.open(home / "sessions.db") as store:
        return {h.id: store.last_seq(h.id) for h in store.list_headers()}


def without_latency(report):
    cells = tuple(attrs.evolve(c, latency_p50_ms=0.0, latency_p95_ms=0.0) for c in report.cells)
    return attrs.evolve(report, cells=cells)


EXPECTED_FIX_FILES = """\
experiment fix-files: 60 rollouts planned, 60 scored, 0 failed, 0 not run yet; cost in CNY

model                       loop            n  samples  success  rate  95% CI        score  turns  in tok  out tok  cost/rollout    cost  p50 ms  p95 ms  failed  pending
deepseek/deepseek-v4-flash  standard       15        5    15/15  1.00  [0.57, 1.00]   1.00    2.0   30000     1500        0.0048  0.0720       0       0       0        0
deepseek/deepseek-v4-flash  minimal-first  15        5     0/15  0.00  [0.00, 0.43]   0.00    1.0   15000      750        0.0024  0.0360       0       0       0        0
deepseek/deepseek-v4-pro    standard       15        5    15/15  1.00  [0.57, 1.00]   1.00    2.0   60000     3000        0.0414  0.6210       0       0       0        0
deepseek/deepseek-v4-pro    minimal-first  15        5    15/15  1.00  [0.57, 1.00]   1.00    3.0   90000     4500        0.0621  0.9315       0       0       0        0

n: finished rollouts (a failed one scores 0); rate and score: means over samples of each sample's mean over its repeats; 95% CI: Wilson, over samples

paired deltas per sample (a - b; score and cost per rollout; 95% t interval; p: exact sign-flip test, Holm-adjusted over all deltas; *: Holm p < 0.05)

kind     a - b                                                                                    pairs  score  95% CI      p  p (Holm)       cost  95% CI
loop     deepseek/deepseek-v4-flash x minimal-first  -  deepseek/deepseek-v4-flash x standard         5  -1.00  -       0.062     0.312    -0.0024  -
loop     deepseek/deepseek-v4-pro x minimal-first  -  deepseek/deepseek-v4-pro x standard             5  +0.00  -       1.000     1.000    +0.0207  -
model    deepseek/deepseek-v4-pro x standard  -  deepseek/deepseek-v4-flash x standard                5  +0.00  -       1.000     1.000    +0.0366  -
model    deepseek/deepseek-v4-pro x minimal-first  -  deepseek/deepseek-v4-flash x minimal-first      5  +1.00  -       0.062     0.312    +0.0597  -
compare  deepseek/deepseek-v4-flash x standard  -  deepseek/deepseek-v4-pro x minimal-first           5  +0.00  -       1.000     1.000    -0.0573  -
"""


async def test_the_shipped_experiment_with_loop_sensitive_stand_ins_gives_the_exact_report(tmp_path):
    experiment = load_experiment(FIX_FILES / "experiment.yml")
    model = deepseek_stand_in()
    home = tmp_path / "home"
    with trio.fail_after(120):
        summary = await run(home, experiment, adapters={"deepseek": model})
    assert (summary.total, summary.skipped, summary.scored, summary.failed, summary.not_started) == (60, 0, 60, 0, 0)
    # 15 rollouts per cell: flash x standard 2 calls, flash x minimal-first 1, pro 2 and 3.
    assert len(model.requests) == 15 * (2 + 1 + 2 + 3)
    report = build_report(history(home, "fix-files"))
    assert render_text(without_latency(report)) == EXPECTED_FIX_FILES
    # The python scorer read the files the agents wrote in their own working directories.
    [sample] = [r for r in report.rollouts if r.sample == "sum" and r.model == "deepseek-v4-pro" and r.loop == "minimal-first" and r.repeat == 1]
    assert (sample.value, sample.explanation) == (1.0, "sum.txt is right")
    workdir = work_root(home, "fix-files") / sample.key
    assert (workdir / "sum.txt").read_text() == "42\n"
    assert (workdir / "data" / "numbers.txt").read_text() == "7\n12\n23\n"
    [failed] = [r for r in report.rollouts if r.sample == "sum" and r.model == "deepseek-v4-flash" and r.loop == "minimal-first" and r.repeat == 1]
    assert (failed.value, failed.answer, failed.explanation) == (0.0, "I cannot change files with these tools.", "sum.txt was not written")


async def test_a_rerun_makes_no_model_call_for_scored_rollouts_and_changes_no_session(tmp_path):
    experiment = load_experiment(FIX_FILES / "experiment.yml")
    home = tmp_path / "home"
    with trio.fail_after(120):
        await run(home, experiment, adapters={"deepseek": deepseek_stand_in()})
        before = session_ids(home)
        again = deepseek_stand_in()
        summary = await run(home, experiment, adapters={"deepseek": again})
    assert again.requests == []
    assert (summary.skipped, summary.scored) == (60, 0)
    after = session_ids(home)
    run_session = "exp.fix-files"
    assert {k: v for k, v in after.items() if k != run_session} == {k: v for k, v in before.items() if k != run_session}
    # The run's own session gained one plan record: what this invocation was asked to do.
    plans = history(home, "fix-files").plans
    assert [(p["rollouts"], p["pending"]) for p in plans] == [(60, 60), (60, 0)]


async def test_the_smallest_file_runs_offline_and_is_fully_derived_from_the_logs(tmp_path):
    experiment = parse_experiment(SMALLEST, base=tmp_path, default_name="smallest")
    home = tmp_path / "home"
    with trio.fail_after(60):
        summary = await run(home, experiment)
    assert summary.complete and summary.scored == 4
    cells = cells_json(build_report(history(home, "smallest")))["cells"]
    for cell in cells:
        del cell["latencyMs"]
    expected = {"rollouts": 2, "samples": 1, "successes": 2, "successRate": 1.0, "successInterval": [pytest.approx(0.20655, abs=1e-5), 1.0],
                "score": 1.0, "scoreInterval": [pytest.approx(0.20655, abs=1e-5), 1.0], "failed": 0, "pending": 0, "limitHits": 0, "turns": 1.0, "inputTokens": 22,
                "outputTokens": 4, "cost": 0.0, "costPerRollout": 0.0}  # fmt: skip
    assert cells == [{"model": "ping/ping-1", "loop": "standard", **expected},
                     {"model": "ping/ping-1", "loop": "minimal-first", **expected}]  # fmt: skip
    ids = set(session_ids(home))
    assert len(ids) == 5 and "exp.smallest" in ids  # four rollouts and the run itself: nothing else


async def test_an_errored_rollout_is_retried_within_the_run_as_a_new_attempt(tmp_path, autojump_clock):
    calls = []

    async def respond(request):
        calls.append(request)
        if len(calls) == 1:
            raise ModelError("HTTP 503: overloaded")
        return "pong"

    experiment = parse_experiment({**SMALLEST, "models": ["flaky/f1"], "loops": ["standard"], "repeats": 1},
                                  base=tmp_path, default_name="flaky")  # fmt: skip
    home = tmp_path / "home"
    # No fail_after under the autojump clock: while the store's thread works, the clock
    # would jump straight to its deadline.
    summary = await run(home, experiment, adapters={"flaky": ScriptedAdapter(respond)})
    assert (summary.scored, summary.failed) == (1, 0)
    results = sorted(history(home, "flaky").results, key=lambda r: r.attempt)
    assert [(r.attempt, r.status) for r in results] == [(1, "error"), (2, "scored")]
    assert results[0].error == "MODEL_ERROR: HTTP 503: overloaded"
    assert results[1].session_id.endswith(".2")


async def test_a_rollout_that_keeps_failing_is_left_for_the_next_run_which_retries_only_it(tmp_path):
    broken = {"on": True}

    async def respond(request):
        text = request.messages[-1].text
        if broken["on"] and text == "second":
            raise ModelError("HTTP 500")
        return f"pong: {text}"

    experiment = parse_experiment(
        {**SMALLEST, "tasks": [{"id": "t", "samples": [{"input": "first", "target": "first"}, {"input": "second", "target": "second"}]}],
         "models": ["s/m"], "loops": ["standard"], "repeats": 1, "retries": 0},
        base=tmp_path, default_name="retry",
    )  # fmt: skip
    home = tmp_path / "home"
    adapter = ScriptedAdapter(respond)
    with trio.fail_after(60):
        first = await run(home, experiment, adapters={"s": adapter})
    assert (first.scored, first.failed, first.complete) == (1, 1, False)
    report = build_report(history(home, "retry"))
    assert (report.cells[0].rollouts, report.cells[0].failed) == (2, 1)
    broken["on"] = False
    adapter.requests.clear()
    with trio.fail_after(60):
        second = await run(home, experiment, adapters={"s": adapter})
    assert (second.skipped, second.scored, second.complete) == (1, 1, True)
    assert [r.messages[-1].text for r in adapter.requests] == ["second"]
    latest = history(home, "retry").latest()
    assert sorted((r.sample, r.attempt, r.status) for r in latest.values()) == [("1", 1, "scored"), ("2", 2, "scored")]


async def test_turn_and_token_limits_end_a_rollout_at_a_step_boundary_and_it_is_scored(tmp_path):
    # A model that lists the directory forever.
    def respond(request):
        return Reply(tool_calls=[ToolCall("list_dir", {"path": "."})], usage=Usage(40, 10))

    spec = {**SMALLEST, "models": ["loopy/l"], "loops": ["standard"], "repeats": 1}
    home = tmp_path / "home"
    with trio.fail_after(60):
        await run(home, parse_experiment({**spec, "limits": {"turns": 3}}, base=tmp_path, default_name="turns"),
                  adapters={"loopy": ScriptedAdapter(respond)})  # fmt: skip
        await run(home, parse_experiment({**spec, "limits": {"tokens": 120}}, base=tmp_path, default_name="tokens"),
                  adapters={"loopy": ScriptedAdapter(respond)})  # fmt: skip
    [by_turns] = history(home, "turns").results
    assert (by_turns.status, by_turns.value, by_turns.steps) == ("scored", 0.0, 3)
    assert by_turns.ended == {"kind": "blocked", "reason": "turn limit 3 reached"}
    [by_tokens] = history(home, "tokens").results
    # A ceiling: after two steps of 50 the next would send at least 50 + 10 again; 160 > 120
    # stops it before it starts (a floor let a third step run to 150).
    assert (by_tokens.steps, by_tokens.input_tokens + by_tokens.output_tokens) == (2, 100)
    assert by_tokens.ended == {"kind": "blocked", "reason": "token limit 120 reached (100 used, the next step about 60 more)"}
    assert build_report(history(home, "turns")).cells[0].limit_hits == 1


async def test_a_time_limit_cancels_the_turn_and_the_rollout_is_scored_on_what_it_did(tmp_path, autojump_clock):
    async def respond(request):
        await trio.sleep(3600)
        return "too late"

    experiment = parse_experiment({**SMALLEST, "models": ["slow/s"], "loops": ["standard"], "repeats": 1,
                                   "limits": {"time": 30}}, base=tmp_path, default_name="slow")  # fmt: skip
    summary = await run(tmp_path / "home", experiment, adapters={"slow": ScriptedAdapter(respond)})
    assert summary.scored == 1
    [result] = history(tmp_path / "home", "slow").results
    assert result.ended == {"kind": "aborted", "cause": "time limit 30 s reached"}
    assert (result.value, result.latency_ms is not None and result.latency_ms >= 30_000) == (0.0, True)


async def test_an_estimate_over_the_budget_starts_nothing(tmp_path):
    experiment = parse_experiment(
        {**SMALLEST, "models": [{"provider": "paid", "model": "p", "price": {"input": 10, "output": 10}}],
         "limits": {"tokens": 100_000, "budget": 3}},
        base=tmp_path, default_name="costly",
    )  # fmt: skip
    adapter = ScriptedAdapter(["never"])
    home = tmp_path / "home"
    with pytest.raises(ExperimentError) as info:
        await run(home, experiment, adapters={"paid": adapter})
    assert info.value.code == "BUDGET_EXCEEDED"
    assert str(info.value) == (
        "the 4 rollouts left to run are estimated at 4 USD, over limits.budget 3 USD; nothing was started. "
        "Estimate: 4 x 1 (paid/p: limits.tokens at its higher price). Raise the budget, or lower repeats or limits.tokens"
    )
    assert adapter.requests == [] and session_ids(home) == {}


async def test_a_budget_without_a_price_is_refused(tmp_path):
    experiment = parse_experiment({**SMALLEST, "models": ["paid/p"], "limits": {"budget": 3}},
                                  base=tmp_path, default_name="unpriced")  # fmt: skip
    with pytest.raises(ExperimentError, match=r"model paid/p has no price, and limits.budget needs one"):
        await run(tmp_path / "home", experiment, adapters={"paid": ScriptedAdapter(["x"])})


async def test_the_budget_stops_the_run_and_a_larger_one_finishes_it(tmp_path):
    # Each rollout costs 0.5 (one call of 50,000 input tokens at 10 per million), five
    # times what limits.tokens lets the first estimate assume: the budget of 2 must stop
    # the run while it goes, after four rollouts.
    def respond(request):
        return Reply(text="pong", usage=Usage(50_000, 0))

    priced = [{"provider": "paid", "model": "p", "price": {"input": 10, "output": 10}}]
    spec = {**SMALLEST, "models": priced, "loops": ["standard"], "repeats": 6, "concurrency": 1,
            "limits": {"tokens": 10_000, "budget": 2.0}}  # fmt: skip
    home = tmp_path / "home"
    adapter = ScriptedAdapter(respond)
    with trio.fail_after(60):
        first = await run(home, parse_experiment(spec, base=tmp_path, default_name="budget"), adapters={"paid": adapter})
    assert first.spent == pytest.approx(2.0)
    assert (first.scored, first.not_started, first.complete, len(adapter.requests)) == (4, 2, False, 4)
    # Now the estimate comes from what the scored rollouts cost: 2 more at 0.5 do not fit.
    with pytest.raises(ExperimentError) as info:
        await run(home, parse_experiment(spec, base=tmp_path, default_name="budget"), adapters={"paid": adapter})
    assert "the 2 rollouts left to run are estimated at 1 USD (already spent: 2), over limits.budget 2 USD" in str(info.value)
    assert "the mean of its 4 scored rollouts" in str(info.value)
    larger = {**spec, "limits": {"tokens": 10_000, "budget": 3.0}}
    with trio.fail_after(60):
        second = await run(home, parse_experiment(larger, base=tmp_path, default_name="budget"), adapters={"paid": adapter})
    assert (second.skipped, second.scored, second.complete, second.spent) == (4, 2, True, pytest.approx(3.0))
    assert len(adapter.requests) == 6


async def test_the_budget_is_a_ceiling_the_run_does_not_cross(tmp_path):
    # Each rollout is one step of 0.3: after three (0.9), a fourth would end at 1.2 over the
    # budget of 1, so it is not started (the budget used to be checked as a floor: 0.9 < 1).
    def respond(request):
        return Reply(text="pong", usage=Usage(30_000, 0))

    priced = [{"provider": "paid", "model": "p", "price": {"input": 10, "output": 10}}]
    spec = {**SMALLEST, "models": priced, "loops": ["standard"], "repeats": 6, "concurrency": 1,
            "limits": {"tokens": 1_000, "budget": 1.0}}  # fmt: skip
    adapter = ScriptedAdapter(respond)
    with trio.fail_after(60):
        summary = await run(tmp_path / "home", parse_experiment(spec, base=tmp_path, default_name="ceiling"),
                            adapters={"paid": adapter})  # fmt: skip
    assert (summary.scored, summary.not_started, len(adapter.requests)) == (3, 3, 3)
    assert summary.spent == pytest.approx(0.9) and summary.spent <= 1.0


async def test_a_judge_grades_and_its_tokens_are_kept(tmp_path):
    def judge(request):
        prompt = request.messages[-1].text
        grade = "C" if "pong: hello" in prompt else "I"
        return Reply(text=f"It answers.\nGRADE: {grade}", usage=Usage(300, 7))

    experiment = parse_experiment(
        {**SMALLEST, "loops": ["standard"], "repeats": 1, "scorer": {"kind": "judge", "provider": "judge", "model": "j1"}},
        base=tmp_path, default_name="judged",
    )  # fmt: skip
    with trio.fail_after(60):
        await run(tmp_path / "home", experiment, adapters={"judge": ScriptedAdapter(judge)})
    [result] = history(tmp_path / "home", "judged").results
    assert (result.value, result.scorer, result.explanation) == (1.0, "judge judge/j1", "It answers.\nGRADE: C")
    assert (result.judge_input_tokens, result.judge_output_tokens) == (300, 7)


async def test_a_scorer_that_fails_is_an_error_not_a_zero(tmp_path):
    (tmp_path / "bad_scorer.py").write_text("def score(state):\n    return 3\n")
    experiment = parse_experiment({**SMALLEST, "loops": ["standard"], "repeats": 1,
                                   "scorer": {"kind": "python", "function": "bad_scorer:score"}},
                                  base=tmp_path, default_name="badscore")  # fmt: skip
    with trio.fail_after(60):
        summary = await run(tmp_path / "home", experiment)
    assert (summary.scored, summary.failed) == (0, 1)
    [result] = history(tmp_path / "home", "badscore").results
    assert result.status == "error"
    assert result.error == "scorer failed: scorer bad_scorer:score returned the value 3.0; values are in 0..1"


async def test_names_the_runtime_lacks_are_refused_before_anything_runs(tmp_path):
    home = tmp_path / "home"
    with pytest.raises(ExperimentError) as info:
        await run(home, parse_experiment({**SMALLEST, "models": ["deepseek/deepseek-v4-flash"]}, base=tmp_path, default_name="x"))
    assert str(info.value) == ("models[0] names provider 'deepseek', which has no model adapter (the deepseek adapter "
                               "is registered when DEEPSEEK_API_KEY is set); registered: ping")  # fmt: skip
    with pytest.raises(ExperimentError, match=r"loops\[1\] 'nope' is not a registered loop; loops: minimal-first, standard"):
        await run(home, parse_experiment({**SMALLEST, "loops": ["standard", "nope"]}, base=tmp_path, default_name="x"))
    with pytest.raises(ExperimentError, match=r"scorer function 'missing_module:f' cannot be loaded: ModuleNotFoundError"):
        await run(home, parse_experiment({**SMALLEST, "scorer": {"kind": "python", "function": "missing_module:f"}},
                                         base=tmp_path, default_name="x"))  # fmt: skip
    assert {k for k in session_ids(home)} == set()


async def test_each_attempt_starts_from_a_fresh_working_directory(tmp_path):
    seen = []

    def respond(request):
        if len(seen) == 0 and request.messages[-1].role == "user":
            seen.append("wrote")
            return Reply(tool_calls=[ToolCall("write_file", {"path": "leftover.txt", "content": "x"})])
        if request.messages[-1].role == "tool" and len(seen) == 1:
            seen.append("failed")
            raise ModelError("HTTP 502")
        seen.append("listed")
        return Reply(tool_calls=[ToolCall("list_dir", {"path": "."})]) if request.messages[-1].role == "user" else "done"

    experiment = parse_experiment(
        {**SMALLEST, "tasks": [{"id": "t", "input": "go", "target": "done", "files": {"seed.txt": {"text": "seed"}}}],
         "models": ["w/w"], "loops": ["standard"], "repeats": 1},
        base=tmp_path, default_name="fresh",
    )  # fmt: skip
    with trio.fail_after(60):
        await run(tmp_path / "home", experiment, adapters={"w": ScriptedAdapter(respond)})
    results = sorted(history(tmp_path / "home", "fresh").results, key=lambda r: r.attempt)
    assert [(r.attempt, r.status) for r in results] == [(1, "error"), (2, "scored")]
    workdir = work_root(tmp_path / "home", "fresh") / results[1].key
    assert sorted(p.name for p in workdir.iterdir()) == ["seed.txt"]
    assert not workdir.is_relative_to(tmp_path / "home")  # the file tools refuse the home


async def test_a_cancelled_run_leaves_its_rollouts_durable_and_unscored_and_resumes(tmp_path):
    held = trio.Event()
    calls = []

    async def respond(request):
        text = request.messages[-1].text
        calls.append(text)
        if text == "slow" and not held.is_set():
            held.set()
            await trio.sleep_forever()
        return f"pong: {text}"

    spec = {**SMALLEST, "tasks": [{"id": "t", "samples": [{"input": "quick", "target": "quick"}, {"input": "slow", "target": "slow"}]}],
            "models": ["h/h"], "loops": ["standard"], "repeats": 1, "concurrency": 2}  # fmt: skip
    experiment = parse_experiment(spec, base=tmp_path, default_name="cancelled")
    home = tmp_path / "home"
    adapter = ScriptedAdapter(respond)

    scored = trio.Event()

    def on_progress(progress):
        if progress.result is not None and progress.result.done:
            scored.set()

    async def first_run():
        await run(home, experiment, adapters={"h": adapter}, on_progress=on_progress)

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(first_run)
            await held.wait()  # "slow" is in its model call
            await scored.wait()  # "quick" is scored
            nursery.cancel_scope.cancel()
    latest = history(home, "cancelled").latest()
    assert sorted((r.sample, r.status) for r in latest.values()) == [("1", "scored"), ("2", "incomplete")]
    [slow] = [r for r in latest.values() if r.sample == "2"]
    assert slow.ended is None and slow.steps == 1  # its turn was closed, nothing was scored
    calls.clear()
    with trio.fail_after(60):
        summary = await run(home, experiment, adapters={"h": adapter})
    assert (summary.skipped, summary.scored, calls) == (1, 1, ["slow"])


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"limits": {"tokens": 500}}, "limits.tokens None -> 500"),
        ({"scorer": {"kind": "includes", "ignore_case": False}}, "the scorer of task greet (includes -> includes)"),
        ({"models": [{"provider": "ping", "model": "ping-1", "adapter": "loopdock.runtime.models:PingAdapter"}]},
         "the adapter of ping/ping-1 (loopdock.runtime.models._ping.PingAdapter -> loopdock.runtime.models:PingAdapter)"),
    ],
)
async def test_resume_refuses_a_plan_that_changes_what_results_depend_on(tmp_path, change, named):
    home = tmp_path / "home"
    first = parse_experiment({**SMALLEST, "repeats": 1, "loops": ["standard"]}, base=tmp_path, default_name="same")
    with trio.fail_after(60):
        assert (await run(home, first)).complete
        before = session_ids(home)
        changed = parse_experiment({**SMALLEST, "repeats": 2, "loops": ["standard"], **change}, base=tmp_path,
                                   default_name="same")  # fmt: skip
        with pytest.raises(ExperimentError) as info:
            await run(home, changed)
    assert info.value.code == "INVALID_EXPERIMENT"
    assert f"Changed: {named}." in str(info.value) and "give the experiment another name" in str(info.value)
    assert session_ids(home) == before  # nothing ran, nothing was recorded
    # A larger budget is what --resume is for: not a change of plan.
    with trio.fail_after(60):
        more = parse_experiment({**SMALLEST, "repeats": 2, "loops": ["standard"], "limits": {"budget": 5}},
                                base=tmp_path, default_name="same")  # fmt: skip
        assert (await run(home, more)).complete
