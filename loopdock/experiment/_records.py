"""What the runner writes into the session logs, and how a rollout's result is read back.

Everything travels in ``system/message`` events (a type every DSH log has) whose message
has a producer-owned source ``loopdock-experiment``; the model never sees them (its
transcript holds user, assistant and tool messages only). ``record`` says which:

- ``rollout``: written at creation, inside the publication transaction, so a rollout's
  session exists only with its identity (run, key, task, sample, model, loop, repeat,
  attempt);
- ``score``: the rollout is done (value 0..1, the answer, why, how its turn ended, its
  latency on the runner's clock);
- ``error``: this attempt failed and the rollout is to be run again;
- ``plan``: in the run's own session, one per ``experiment run``: what was asked for.

A rollout's result is a fold of its events: there is no other copy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import attrs

from loopdock.runtime import Event, Message, ProducerSource, TextBlock, message_to_wire

from ._rollouts import Rollout

EXPERIMENT_KIND = "loopdock-experiment"
RECORD_EVENT = "system/message"
SCHEMA_VERSION = 1
BUDGET_REASON = "experiment budget exhausted"
_MAX_ANSWER = 4000

Status = Literal["scored", "error", "incomplete"]


def _record(kind: str, text: str, fields: Mapping[str, Any]) -> dict[str, Any]:
    source = ProducerSource(EXPERIMENT_KIND, {"record": kind, "schemaVersion": SCHEMA_VERSION, **fields})
    return message_to_wire(Message("system", (TextBlock(text),), source))


def rollout_record(run: str, rollout: Rollout, attempt: int) -> dict[str, Any]:
    fields = {
        "run": run,
        "key": rollout.key,
        "task": rollout.task.id,
        "sample": rollout.sample.id,
        "provider": rollout.model.provider,
        "model": rollout.model.model,
        "loop": rollout.loop.loop,
        "driver": rollout.loop.driver,
        "repeat": rollout.repeat,
        "attempt": attempt,
        "target": list(rollout.sample.target),
    }
    text = (
        f"experiment {run}: task {rollout.task.id} sample {rollout.sample.id} on {rollout.cell}, "
        f"repeat {rollout.repeat}, attempt {attempt}"
    )
    return _record("rollout", text, fields)


def score_record(
    value: float,
    answer: str,
    explanation: str,
    scorer: str,
    ended: Mapping[str, Any],
    latency_ms: int,
    judge_usage: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "value": value,
        "answer": answer[:_MAX_ANSWER],
        "explanation": explanation[:_MAX_ANSWER],
        "scorer": scorer,
        "ended": dict(ended),
        "latencyMs": latency_ms,
    }
    if judge_usage is not None:
        fields["judgeUsage"] = dict(judge_usage)
    return _record("score", f"scored {value:g} by {scorer}", fields)


def error_record(error: str, ended: Mapping[str, Any] | None, latency_ms: int) -> dict[str, Any]:
    fields: dict[str, Any] = {"error": error[:_MAX_ANSWER], "latencyMs": latency_ms}
    if ended is not None:
        fields["ended"] = dict(ended)
    return _record("error", f"attempt failed: {error}"[:1000], fields)


def plan_record(fields: Mapping[str, Any], text: str) -> dict[str, Any]:
    return _record("plan", text, fields)


def experiment_fields(event: Event) -> Mapping[str, Any] | None:
    """The record fields of one of the runner's events, else None."""
    if event.type != RECORD_EVENT:
        return None
    source = event.data.get("source")
    if not isinstance(source, Mapping) or source.get("kind") != EXPERIMENT_KIND:
        return None
    return source


@attrs.frozen
class RolloutResult:
    """One attempt at a rollout, as its session tells it."""

    session_id: str
    run: str
    key: str
    task: str
    sample: str
    provider: str
    model: str
    loop: str
    driver: str | None
    repeat: int
    attempt: int
    status: Status
    target: tuple[str, ...] = ()
    value: float | None = None
    answer: str = ""
    explanation: str = ""
    scorer: str = ""
    ended: Mapping[str, Any] | None = None
    error: str | None = None
    steps: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    judge_input_tokens: int = 0
    judge_output_tokens: int = 0
    latency_ms: int | None = None
    started_ms: int = 0  # wall clock of the session's first event

    @property
    def model_label(self) -> str:
        return f"{self.provider}/{self.model}"

    @property
    def loop_label(self) -> str:
        return self.loop if self.driver is None else f"{self.loop}@{self.driver}"

    @property
    def done(self) -> bool:
        return self.status == "scored"

    @property
    def failed(self) -> bool:
        """The attempt ended without a score for a reason of its own (the model, the
        scorer, a limit), not because the run's budget stopped it before it began."""
        return self.status == "error" and self.error != BUDGET_REASON

    @property
    def finished(self) -> bool:
        """Counted in a report: scored, or failed (a score of 0). An attempt still
        running (or cut off by a kill) and one the budget stopped are not finished."""
        return self.done or self.failed

    @property
    def score(self) -> float:
        """The value a report counts: the score, 0 for a failed attempt."""
        return self.value if self.done and self.value is not None else 0.0


def usage_of(event: Event) -> tuple[int, int]:
    """(input, output) tokens an ``assistant/message`` event records, (0, 0) if none."""
    usage = event.data.get("usage") if event.type == "assistant/message" else None
    if not isinstance(usage, Mapping):
        return 0, 0
    return int(usage.get("inputTokens") or 0), int(usage.get("outputTokens") or 0)


def fold_rollout(session_id: str, events: Sequence[Event]) -> RolloutResult | None:
    """The result of one rollout attempt, or None if the session is not one."""
    identity: Mapping[str, Any] | None = None
    outcome: Mapping[str, Any] | None = None
    steps = input_tokens = output_tokens = 0
    for event in events:
        if event.type == "step/start":
            steps += 1
        elif event.type == "assistant/message":
            used_in, used_out = usage_of(event)
            input_tokens += used_in
            output_tokens += used_out
        else:
            fields = experiment_fields(event)
            if fields is None:
                continue
            if fields.get("record") == "rollout" and identity is None:
                identity = fields
            elif fields.get("record") in ("score", "error"):
                outcome = fields
    if identity is None:
        return None
    judge = outcome.get("judgeUsage") if outcome is not None else None
    judge = judge if isinstance(judge, Mapping) else {}
    status: Status = "incomplete"
    if outcome is not None:
        status = "scored" if outcome.get("record") == "score" else "error"
    return RolloutResult(
        session_id=session_id,
        run=str(identity["run"]),
        key=str(identity["key"]),
        task=str(identity["task"]),
        sample=str(identity["sample"]),
        provider=str(identity["provider"]),
        model=str(identity["model"]),
        loop=str(identity["loop"]),
        driver=identity.get("driver"),
        repeat=int(identity["repeat"]),
        attempt=int(identity["attempt"]),
        status=status,
        target=tuple(identity.get("target") or ()),
        value=float(outcome["value"]) if status == "scored" and outcome is not None else None,
        answer=str(outcome.get("answer", "")) if outcome is not None else "",
        explanation=str(outcome.get("explanation", "")) if outcome is not None else "",
        scorer=str(outcome.get("scorer", "")) if outcome is not None else "",
        ended=outcome.get("ended") if outcome is not None else None,
        error=str(outcome["error"]) if status == "error" and outcome is not None else None,
        steps=steps,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        judge_input_tokens=int(judge.get("inputTokens") or 0),
        judge_output_tokens=int(judge.get("outputTokens") or 0),
        latency_ms=int(outcome["latencyMs"]) if outcome is not None and "latencyMs" in outcome else None,
        started_ms=events[0].time if events else 0,
    )
