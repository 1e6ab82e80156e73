"""Reading a run back from the session store: its plans and every rollout attempt.

Blocking (SQLite): call these in a worker thread. A report reads the store while a run
may still be writing it (SQLite's WAL lets readers and one writer work at once).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from loopdock.runtime import SessionLog, SessionStore

from ._errors import ExperimentError
from ._records import RolloutResult, experiment_fields, fold_rollout
from ._rollouts import SESSION_PREFIX, parse_rollout_session_id, run_session_id


@attrs.frozen
class RunHistory:
    run: str
    plans: tuple[Mapping[str, Any], ...]  # oldest first
    results: tuple[RolloutResult, ...]  # every attempt of every rollout
    attempts: Mapping[str, int]  # key -> the highest attempt number a session has

    @property
    def plan(self) -> Mapping[str, Any] | None:
        return self.plans[-1] if self.plans else None

    def refuse_mid_rescore(self, command: str) -> None:
        """Raise RESCORE_INTERRUPTED if the newest plan is a rescore's that did not finish:
        its rollouts then hold the new scorers' scores and the old ones, mixed."""
        if self.plan is not None and self.plan.get("rescoring"):
            raise ExperimentError(
                "RESCORE_INTERRUPTED",
                f"the last rescore of run {self.run!r} did not finish, so its rollouts' scores mix the old "
                f"scorers and the new ones: run `loopdock experiment rescore` with the same file again "
                f"before {command}",
            )

    def latest(self) -> dict[str, RolloutResult]:
        """Per rollout key: its scored attempt if it has one, else its newest attempt."""
        chosen: dict[str, RolloutResult] = {}
        for result in self.results:
            held = chosen.get(result.key)
            if held is None or (not held.done and (result.done or result.attempt > held.attempt)):
                chosen[result.key] = result
        return chosen


def read_run(store: SessionLog, run: str) -> RunHistory:
    headers = store.list_headers()
    plans: list[Mapping[str, Any]] = []
    results: list[RolloutResult] = []
    attempts: dict[str, int] = {}
    for header in headers:
        if header.id == run_session_id(run):
            loaded = store.load(header.id)
            if loaded is not None:
                plans.extend(f for e in loaded[1] if (f := experiment_fields(e)) and f.get("record") == "plan")
            continue
        parsed = parse_rollout_session_id(run, header.id)
        if parsed is None:
            continue
        key, attempt = parsed
        attempts[key] = max(attempt, attempts.get(key, 0))
        loaded = store.load(header.id)
        if loaded is not None and (result := fold_rollout(header.id, loaded[1])) is not None:
            results.append(result)
    return RunHistory(run, tuple(plans), tuple(results), attempts)


def open_store(home: Path) -> SessionStore:
    """The home's session store for reading; UNKNOWN_RUN if the home has none."""
    path = home / "sessions.db"
    if not path.is_file():
        raise ExperimentError("UNKNOWN_RUN", f"{home} holds no session store (sessions.db): no run was made there")
    return SessionStore.open(path)


def read_run_at(home: Path, run: str) -> RunHistory:
    """Blocking: the run ``run`` from the store under ``home``; UNKNOWN_RUN if it has none,
    RESCORE_INTERRUPTED if a rescore of it did not finish."""
    with open_store(home) as store:
        history = read_run(store, run)
        if not history.plans and not history.results:
            runs = sorted(list_runs(store))
            known = ", ".join(runs) if runs else "none"
            raise ExperimentError("UNKNOWN_RUN", f"no experiment run {run!r} in {home}; runs there: {known}")
    history.refuse_mid_rescore("reading it")
    return history


def list_runs(store: SessionLog) -> set[str]:
    """The names of the runs whose plans the store holds."""
    names = set()
    for header in store.list_headers():
        rest = header.id[len(SESSION_PREFIX) :] if header.id.startswith(SESSION_PREFIX) else ""
        if rest and "." not in rest:
            names.add(rest)
    return names
