"""The leak check run after every test that opens a runtime (``conftest.rt``, ``no_leaks``).

It names every task in the supervisor's nursery by the object it runs for (the ``self``
of the bound method a task runs), so a leftover is reported by what it is, not only by
how many tasks there are. Allowed, and nothing else:

- per live agent, exactly its own ``run`` task, and inside that agent's companions
  nursery exactly one task per companion the runtime registered for it (the LoopX
  continuation, when the runtime has the LoopX integration);
- the store writer, the skill catalog's watcher, the admission gate's stall watcher and
  the agent lifecycle (passivation), once each; the gc governor once if the runtime
  governs the collector;
- a reactivation per passivated agent being reactivated (a passivated agent has no
  task of its own);
- a starter per configured agent that is starting, or has not started yet.

A disposed agent has no task left: its ``run`` task ends only once everything in its
own nursery has ended, and a task of an agent no longer registered is reported.
"""

from __future__ import annotations

from typing import Any

import trio

from loopdock.actors._agent import AgentActor
from loopdock.actors._supervision import supervised
from loopdock.actors._supervisor import Supervisor


def _runs_for(task: trio.lowlevel.Task, supervisor: Supervisor) -> Any:
    """The object ``task`` runs for: the agent of ``Supervisor.run_agent``, the actor a
    ``supervised`` wrapper runs, else the ``self`` of the bound method (None for a plain
    function)."""
    frame = task.coro.cr_frame
    if frame is None:
        return None
    names = frame.f_locals
    if names.get("self") is supervisor and isinstance(names.get("agent"), AgentActor):
        return names["agent"]
    if names.get("writer") is supervisor.writer:  # the runtime's closure around writer.run
        return supervisor.writer
    if frame.f_code is supervised.__code__:
        return getattr(names["actor"], "__self__", None)
    return names.get("self")


def _companions_expected(runtime: Any, agent: AgentActor) -> int:
    loopx = runtime.loopx
    return 1 if loopx is not None and agent.id in loopx.continuations else 0


def assert_no_leaked_agent_tasks(runtime: Any) -> None:
    supervisor, dock = runtime.supervisor, runtime.dock
    live: dict[str, AgentActor] = {i: a for i, a in supervisor.agents.items() if not a.passivated}
    reactivating = {i for i, a in supervisor.agents.items() if a.passivated and a._passive.transition}
    runs: dict[str, trio.lowlevel.Task] = {}
    writers, watchers, gates, governors, starters, unexpected = [], [], [], [], [], []
    lifecycles, reactivations = [], []
    for task in supervisor.nursery.child_tasks:
        owner = _runs_for(task, supervisor)
        if isinstance(owner, AgentActor) and owner.id in reactivating:
            continue  # being rebuilt: its task starts before its messages are delivered
        if isinstance(owner, AgentActor):
            assert live.get(owner.id) is owner, f"a task of agent {owner.id!r}, which is not live: {task.name}"
            assert owner.id not in runs, f"two tasks of agent {owner.id!r}: {runs[owner.id].name}, {task.name}"
            runs[owner.id] = task
        elif owner is supervisor.writer:
            writers.append(task)
        elif owner is runtime.skills:
            watchers.append(task)
        elif owner is supervisor.admission:
            gates.append(task)
        elif owner is not None and owner is runtime.gc_governor:
            governors.append(task)
        elif owner is supervisor.lifecycle and task.name.startswith("reactivate agent "):
            reactivations.append(task.name.removeprefix("reactivate agent "))
        elif owner is supervisor.lifecycle:
            lifecycles.append(task)
        elif owner is dock and task.name.startswith("configured agent "):
            starters.append(task.name.removeprefix("configured agent "))
        else:
            unexpected.append(task.name)
    assert unexpected == [], f"tasks nobody owns: {unexpected}"
    assert (len(writers), len(watchers), len(gates)) == (1, 1, 1), (
        "the store writer, the skill watcher and the admission gate's stall watcher, once each"
    )
    assert len(governors) == (runtime.gc_governor is not None), f"{len(governors)} gc governor tasks"
    assert len(lifecycles) == 1, f"{len(lifecycles)} agent lifecycle tasks"
    assert set(reactivations) <= reactivating, f"reactivations of agents not being reactivated: {reactivations}"
    assert sorted(runs) == sorted(live), f"live agents without their run task: {sorted(set(live) - set(runs))}"
    not_started = {entry.id for entry in dock.config.agents} - set(dock.configured)
    assert len(starters) == len(set(starters)) and set(dock.starting) <= set(starters) <= not_started, (
        f"configured-agent starters {starters}; starting {sorted(dock.starting)}, not started {sorted(not_started)}"
    )
    for agent_id, task in runs.items():
        agent = live[agent_id]
        companions = agent._companions
        assert companions in task.child_nurseries, f"agent {agent_id!r} runs without its companions nursery"
        expected = _companions_expected(runtime, agent)
        assert len(companions.child_tasks) == expected, (
            f"agent {agent_id!r}: {[t.name for t in companions.child_tasks]}, expected {expected} companion(s)"
        )
