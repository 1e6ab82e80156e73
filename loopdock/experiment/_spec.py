"""An experiment, as values: tasks and their samples, scorers, models, loops, limits.

Built by ``load_experiment`` from a file (``_config``); frozen, so a run can never change
the plan it was given.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import attrs

from loopdock.runtime.models import Price as Price
from loopdock.runtime.models import ProviderSpec

ScorerKind = Literal["exact", "includes", "regex", "python", "judge"]


@attrs.frozen
class FileSource:
    """One file a sample's working directory starts with: copied from ``path`` (a file
    or a directory), or written from ``text``."""

    path: Path | None = None
    text: str | None = None


@attrs.frozen
class Sample:
    id: str
    input: str
    target: tuple[str, ...]  # any one of them counts as the right answer
    files: Mapping[str, FileSource] = attrs.field(factory=dict)
    metadata: Mapping[str, Any] = attrs.field(factory=dict)


@attrs.frozen
class Judge:
    """A model that grades an answer against the target (``GRADE: C`` or ``GRADE: I``)."""

    provider: str
    model: str
    max_tokens: int = 1024
    prompt: str | None = None  # a template with {input}, {target}, {answer}


@attrs.frozen
class Scorer:
    kind: ScorerKind
    ignore_case: bool = True
    pattern: str | None = None  # regex: the pattern (default: the target)
    function: str | None = None  # python: "module:function"
    judge: Judge | None = None

    @property
    def label(self) -> str:
        if self.kind == "python":
            return f"python {self.function}"
        if self.kind == "judge" and self.judge is not None:
            return f"judge {self.judge.provider}/{self.judge.model}"
        return self.kind


@attrs.frozen
class Task:
    id: str
    samples: tuple[Sample, ...]
    scorer: Scorer | None = None  # None: the experiment's scorer




@attrs.frozen
class Model:
    provider: str
    model: str
    max_tokens: int | None = None
    reasoning_effort: str | None = None
    system_prompt: str | None = None
    price: Price | None = None
    adapter: str | None = None  # "module:factory" registering the provider for this run

    @property
    def label(self) -> str:
        return f"{self.provider}/{self.model}"

    def agent_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"provider": self.provider, "model": self.model}
        for name in ("max_tokens", "reasoning_effort", "system_prompt"):
            if getattr(self, name) is not None:
                options[name] = getattr(self, name)
        return options


@attrs.frozen
class Loop:
    loop: str
    driver: str | None = None

    @property
    def label(self) -> str:
        return self.loop if self.driver is None else f"{self.loop}@{self.driver}"


@attrs.frozen
class Limits:
    """Per rollout: model turns (steps), tokens (input + output), wall time in seconds;
    and the run's total ``budget`` in the experiment's currency."""

    turns: int | None = None
    tokens: int | None = None
    time: float | None = None
    budget: float | None = None


DEFAULT_CONCURRENCY = 16


@attrs.frozen
class Concurrency:
    """How many rollouts run at once, per provider (``providers``) or otherwise (``default``)."""

    default: int = DEFAULT_CONCURRENCY
    providers: Mapping[str, int] = attrs.field(factory=dict)

    def limit(self, provider: str) -> int:
        return self.providers.get(provider, self.default)


@attrs.frozen
class Experiment:
    name: str
    tasks: tuple[Task, ...]
    scorer: Scorer
    models: tuple[Model, ...]
    loops: tuple[Loop, ...]
    repeats: int = 1
    limits: Limits = Limits()
    concurrency: Concurrency = Concurrency()
    retries: int = 2  # more attempts of an errored rollout within one run
    currency: str = "USD"
    compare: tuple[tuple[str, str], ...] = ()  # extra paired comparisons, "model:loop" each
    providers: Mapping[str, ProviderSpec] = attrs.field(factory=dict)  # registered for the run, by name
    base: Path = attrs.field(factory=Path.cwd)  # where relative paths (datasets, scorers) start

    def scorer_for(self, task: Task) -> Scorer:
        return task.scorer or self.scorer
