"""Export a run to Inspect AI's log format (``.eval``), so ``inspect view`` opens it.

One log per (task, model, loop), as Inspect keeps one per task and model: the loop is
the log's solver, each finished rollout a sample whose epoch is its repeat, with the
transcript from its session log, its score, its token usage and cost; a failed rollout
is a sample with its error and a score of 0 (as the report counts it). The log's stderr
treats samples, not epochs, as the unit (the mean over a sample's epochs first). Built with inspect_ai's
own log classes and written with its own writer, so the files are what its reader
expects; inspect_ai is an optional extra (``pip install 'loopdock[inspect]'``).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from loopdock.runtime import Event, SessionStore

from ._budget import rollout_cost
from ._errors import ExperimentError
from ._history import RunHistory
from ._records import RolloutResult
from ._report import Report, plan_prices
from ._spec import Price

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat()


def _text(data: Mapping[str, Any]) -> str:
    return "".join(b.get("text", "") for b in data.get("content", ()) if b.get("type") == "text")


def _messages(events: Sequence[Event]) -> list[Any]:
    from inspect_ai.model import ChatMessageAssistant, ChatMessageTool, ChatMessageUser
    from inspect_ai.tool import ToolCall, ToolCallError

    names: dict[str, str] = {}
    messages: list[Any] = []
    for event in events:
        data = event.data
        if event.type == "user/message":
            messages.append(ChatMessageUser(content=_text(data)))
        elif event.type == "assistant/message":
            calls = []
            for block in data.get("content", ()):
                if block.get("type") == "tool-call":
                    names[block["callId"]] = block["name"]
                    try:
                        arguments = json.loads(block.get("arguments") or "{}")
                    except ValueError:
                        arguments = {}
                    calls.append(ToolCall(id=block["callId"], function=block["name"],
                                          arguments=arguments if isinstance(arguments, dict) else {}))  # fmt: skip
            messages.append(ChatMessageAssistant(content=_text(data), tool_calls=calls or None))
        elif event.type == "tool/result":
            for block in data.get("content", ()):
                if block.get("type") == "tool-result":
                    error = ToolCallError("unknown", block["content"]) if block.get("isError") else None
                    messages.append(ChatMessageTool(content=block["content"], tool_call_id=block["callId"],
                                                    function=names.get(block["callId"]), error=error))  # fmt: skip
    return messages


def _sample(result: RolloutResult, events: Sequence[Event], sample_input: str, cost: float | None) -> Any:
    from inspect_ai.log import EvalError, EvalSample
    from inspect_ai.model import ChatCompletionChoice, ChatMessageAssistant, ModelOutput, ModelUsage
    from inspect_ai.scorer import Score

    usage = ModelUsage(input_tokens=result.input_tokens, output_tokens=result.output_tokens,
                       total_tokens=result.input_tokens + result.output_tokens, total_cost=cost)  # fmt: skip
    output = ModelOutput(
        model=result.model,
        choices=[ChatCompletionChoice(message=ChatMessageAssistant(content=result.answer), stop_reason="stop")],
        usage=usage,
    )
    latency = (result.latency_ms or 0) / 1000
    return EvalSample(
        id=result.sample,
        epoch=result.repeat,
        input=sample_input,
        target=list(result.target) if len(result.target) != 1 else result.target[0],
        messages=_messages(events),
        output=output,
        scores={result.scorer.split(" ")[0] or "score": Score(value=result.score, answer=result.answer,
                                                              explanation=result.explanation or result.error)},  # fmt: skip
        error=EvalError(message=result.error or "", traceback="", traceback_ansi="") if result.failed else None,
        metadata={"loopdock": {"session": result.session_id, "attempt": result.attempt, "turns": result.steps,
                               "ended": dict(result.ended or {})}},  # fmt: skip
        model_usage={result.model_label: usage},
        total_time=latency,
        working_time=latency,
        uuid=str(uuid.uuid5(uuid.NAMESPACE_URL, f"loopdock:{result.session_id}")),
    )


def _first_user_text(events: Sequence[Event]) -> str:
    return next((_text(e.data) for e in events if e.type == "user/message"), "")


def _sample_means(group: Sequence[tuple[RolloutResult, list[Event]]]) -> list[float]:
    by_sample: dict[str, list[float]] = {}
    for result, _ in group:
        by_sample.setdefault(result.sample, []).append(result.score)
    return [sum(v) / len(v) for v in by_sample.values()]


def _log(run: str, group: list[tuple[RolloutResult, list[Event]]], planned: int, repeats: int,
         prices: Mapping[str, Price]) -> Any:  # fmt: skip
    from inspect_ai.log import EvalConfig, EvalDataset, EvalLog, EvalMetric, EvalResults, EvalScore, EvalSpec, EvalStats
    from inspect_ai.model import ModelUsage

    first = group[0][0]
    costs = [rollout_cost(r, prices) for r, _ in group]
    samples = [_sample(r, events, _first_user_text(events), c) for (r, events), c in zip(group, costs, strict=True)]
    values = _sample_means(group)
    mean = sum(values) / len(values)
    stderr = (sum((v - mean) ** 2 for v in values) / (len(values) - 1) / len(values)) ** 0.5 if len(values) > 1 else 0.0
    scorer = next((r.scorer for r, _ in group if r.scorer), "").split(" ")[0] or "score"
    started = min(r.started_ms for r, _ in group)
    finished = max(e[-1].time for _, e in group if e)
    usage = ModelUsage(input_tokens=sum(r.input_tokens for r, _ in group),
                       output_tokens=sum(r.output_tokens for r, _ in group),
                       total_cost=None if any(c is None for c in costs) else sum(c for c in costs if c is not None))  # fmt: skip
    usage.total_tokens = usage.input_tokens + usage.output_tokens
    eval_id = str(uuid.uuid5(uuid.NAMESPACE_URL, f"loopdock:{run}:{first.task}:{first.model_label}:{first.loop_label}"))
    spec = EvalSpec(
        eval_id=eval_id,
        run_id=run,
        created=_iso(started),
        task=first.task,
        task_id=eval_id,
        dataset=EvalDataset(name=first.task, samples=planned // max(repeats, 1)),
        model=first.model_label,
        solver=first.loop_label,
        config=EvalConfig(epochs=repeats),
        metadata={"loopdock": {"run": run, "loop": first.loop, "driver": first.driver}},
    )
    return EvalLog(
        status="success" if len(group) == planned else "started",
        eval=spec,
        results=EvalResults(
            total_samples=planned,
            completed_samples=len(group),
            scores=[EvalScore(name=scorer, scorer=scorer, scored_samples=sum(1 for r, _ in group if r.done), metrics={
                "accuracy": EvalMetric(name="accuracy", value=mean),
                "stderr": EvalMetric(name="stderr", value=stderr),
            })],
        ),  # fmt: skip
        stats=EvalStats(started_at=_iso(started), completed_at=_iso(finished), model_usage={first.model_label: usage}),
        samples=samples,
    )


def export_inspect(store: SessionStore, history: RunHistory, report: Report, out: Path) -> list[Path]:
    """Blocking: write one ``.eval`` per (task, model, loop) of ``report`` into ``out``;
    returns the files. MISSING_EXTRA without inspect_ai. Call it outside any trio run
    (inspect_ai's synchronous writer refuses to run inside one)."""
    try:
        from inspect_ai.log import write_eval_log
    except ImportError:
        raise ExperimentError("MISSING_EXTRA", "the export needs inspect_ai: pip install 'loopdock[inspect]'") from None
    plan = history.plan or {}
    prices = plan_prices(history)
    repeats = int(plan.get("repeats") or max((r.repeat for r in report.rollouts), default=1))
    groups: dict[tuple[str, str, str], list[tuple[RolloutResult, list[Event]]]] = {}
    planned: dict[tuple[str, str, str], int] = {}
    for result in report.rollouts:
        key = (result.task, result.model_label, result.loop_label)
        planned[key] = planned.get(key, 0) + 1
        if result.finished:
            loaded = store.load(result.session_id)
            groups.setdefault(key, []).append((result, loaded[1] if loaded else []))
    tasks = {t["id"]: t["samples"] for t in plan.get("tasks", ())}
    out.mkdir(parents=True, exist_ok=True)
    files = []
    for (task, model, loop), group in groups.items():
        total = int(tasks.get(task, 0)) * repeats or planned[(task, model, loop)]
        name = _UNSAFE.sub("-", f"{history.run}_{task}_{model}_{loop}") + ".eval"
        path = out / name
        write_eval_log(_log(history.run, group, total, repeats, prices), str(path))
        files.append(path)
    return sorted(files)
