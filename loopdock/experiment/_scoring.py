"""Scorers: how a rollout's answer (and its working directory) becomes a value in 0..1.

- ``exact``: the answer, stripped, equals a target; ``includes``: it contains one;
  ``regex``: ``pattern`` (or a target used as one) is found in it. Case is ignored
  unless ``ignore_case: false``.
- ``python``: ``module:function`` receives a ``ScoreInput`` and returns a bool, a number
  in 0..1, or a ``Score``; it may be ``async``. A plain function runs in a worker thread
  (it may read files or run a test), so it never stalls the other rollouts. The module is
  looked up beside the experiment file first, then on the import path.
- ``judge``: a model grades the answer against the target and ends its reply with
  ``GRADE: C`` (correct), ``GRADE: P`` (partly, 0.5) or ``GRADE: I`` (incorrect).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
import trio

from loopdock.runtime import user_message
from loopdock.runtime.models import AdapterRegistry, ModelRequest, TextDelta, Usage

from ._errors import ExperimentError
from ._spec import Judge, Scorer


@attrs.frozen
class ScoreInput:
    """What a python scorer is given about one rollout."""

    task: str
    sample: str
    input: str
    target: tuple[str, ...]
    answer: str  # the text of the agent's last assistant message
    workdir: Path  # the rollout's working directory, as the agent left it
    metadata: Mapping[str, Any]
    model: str  # "provider/model"
    loop: str


@attrs.frozen
class Score:
    """A scorer's verdict: ``value`` in 0..1 (1 is success) and why."""

    value: float
    explanation: str = ""
    judge_usage: Mapping[str, Any] | None = None


class ScorerFailed(Exception):
    """A scorer raised or returned something that is not a score; the attempt is an error."""


def _norm(text: str, ignore_case: bool) -> str:
    text = " ".join(text.split())
    return text.casefold() if ignore_case else text


def _text_score(scorer: Scorer, answer: str, targets: tuple[str, ...]) -> Score:
    flags = re.IGNORECASE if scorer.ignore_case else 0
    if scorer.kind == "regex":
        patterns = (scorer.pattern,) if scorer.pattern is not None else targets
        hit = next((p for p in patterns if re.search(p, answer, flags)), None)
        return Score(1.0 if hit is not None else 0.0, f"matched {hit!r}" if hit is not None else "no match")
    said = _norm(answer, scorer.ignore_case)
    for target in targets:
        wanted = _norm(target, scorer.ignore_case)
        if (said == wanted) if scorer.kind == "exact" else (wanted in said):
            return Score(1.0, f"{scorer.kind} {target!r}")
    return Score(0.0, f"not {scorer.kind} any target")


def load_function(reference: str, base: Path) -> Callable[..., Any]:
    """The function ``module:function``, from ``base/module.py`` if there is one (loaded
    under a private name, so it cannot shadow an installed module), else imported."""
    module_name, _, attribute = reference.partition(":")
    local = base.joinpath(*module_name.split(".")).with_suffix(".py")
    try:
        if local.is_file():
            private = f"_loopdock_experiment_scorer_{abs(hash(str(local)))}"
            module = sys.modules.get(private)
            if module is None:
                spec = importlib.util.spec_from_file_location(private, local)
                if spec is None or spec.loader is None:
                    raise ImportError(f"cannot load {local}")
                module = importlib.util.module_from_spec(spec)
                sys.modules[private] = module
                spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
        function = getattr(module, attribute)
    except Exception as exc:  # an import runs arbitrary code: any failure is the reference's
        raise ExperimentError(
            "INVALID_EXPERIMENT", f"scorer function {reference!r} cannot be loaded: {type(exc).__name__}: {exc}"
        ) from None
    if not callable(function):
        raise ExperimentError("INVALID_EXPERIMENT", f"scorer function {reference!r} is not callable")
    return function  # type: ignore[no-any-return]  # getattr gives Any; checked callable just above


def _as_score(value: object, where: str) -> Score:
    if isinstance(value, Score):
        result = value
    elif isinstance(value, bool):
        result = Score(1.0 if value else 0.0)
    elif isinstance(value, (int, float)):
        result = Score(float(value))
    else:
        raise ScorerFailed(f"{where} returned {value!r}; a scorer returns a bool, a number in 0..1 or a Score")
    if not 0.0 <= result.value <= 1.0:
        raise ScorerFailed(f"{where} returned the value {result.value!r}; values are in 0..1")
    return result


DEFAULT_JUDGE_PROMPT = """You are grading the answer to a task.

[Task]
{input}

[Reference answer]
{target}

[Submitted answer]
{answer}

Does the submitted answer accomplish the task as the reference describes? Explain briefly, then end
with a last line that is exactly 'GRADE: C' if it is correct, 'GRADE: P' if it is partly correct, or
'GRADE: I' if it is incorrect."""

_GRADE = re.compile(r"GRADE:\s*([CPI])\b")
_GRADE_VALUE = {"C": 1.0, "P": 0.5, "I": 0.0}


async def _judge(judge: Judge, adapters: AdapterRegistry, score_input: ScoreInput) -> Score:
    template = judge.prompt or DEFAULT_JUDGE_PROMPT
    prompt = template.format(
        input=score_input.input, target="\n".join(score_input.target), answer=score_input.answer
    )
    request = ModelRequest(
        provider=judge.provider, model=judge.model, system="", messages=(user_message(prompt),),
        max_tokens=judge.max_tokens,
    )  # fmt: skip
    text: list[str] = []
    usage = Usage(0, 0)
    async for chunk in adapters.get(judge.provider).stream(request):
        if isinstance(chunk, TextDelta):
            text.append(chunk.text)
        elif isinstance(chunk, Usage):
            usage = chunk
    reply = "".join(text)
    grades = _GRADE.findall(reply)
    judge_usage = {"provider": judge.provider, "model": judge.model,
                   "inputTokens": usage.input_tokens, "outputTokens": usage.output_tokens}  # fmt: skip
    if not grades:
        raise ScorerFailed(f"the judge {judge.provider}/{judge.model} gave no GRADE line: {reply[-200:]!r}")
    return Score(_GRADE_VALUE[grades[-1]], reply.strip(), judge_usage)


class Scoring:
    """Scores rollouts; python functions are loaded once, at construction, so a bad
    reference fails the run before any rollout starts."""

    def __init__(self, scorers: list[Scorer], base: Path, adapters: AdapterRegistry) -> None:
        self._adapters = adapters
        self._functions = {s.function: load_function(s.function, base) for s in scorers if s.function is not None}
        # Scorer functions may be CPU-bound: no more of them at once than threads help.
        self._threads = trio.CapacityLimiter(4)

    async def score(self, scorer: Scorer, score_input: ScoreInput) -> Score:
        """Raises ScorerFailed when the scorer fails (the attempt is then an error)."""
        if scorer.kind in ("exact", "includes", "regex"):
            return _text_score(scorer, score_input.answer, score_input.target)
        if scorer.kind == "judge" and scorer.judge is not None:
            try:
                return await _judge(scorer.judge, self._adapters, score_input)
            except ScorerFailed:
                raise
            except Exception as exc:
                raise ScorerFailed(f"the judge failed: {type(exc).__name__}: {exc}") from exc
        assert scorer.function is not None
        function = self._functions[scorer.function]
        where = f"scorer {scorer.function}"
        try:
            if inspect.iscoroutinefunction(function):
                value = await function(score_input)
            else:
                value = await trio.to_thread.run_sync(function, score_input, limiter=self._threads)
        except Exception as exc:
            raise ScorerFailed(f"{where} raised {type(exc).__name__}: {exc}") from exc
        return _as_score(value, where)
