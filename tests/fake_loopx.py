"""LoopX's typed answers without a process, for the continuation's logic tests
(tests/actors/test_loopx_continuation_logic.py, test_loopx_passivation.py): a fake
client, the answers LoopX 2.1.1 gives, and a runtime with an agent that uses it."""

from __future__ import annotations

from pathlib import Path

import trio

from loopdock import Runtime
from loopdock.actors._faults import FAULT_KIND
from loopdock.actors.loopx import LoopxSettings
from loopdock.runtime.loopx import LoopxClient, SchedulerHint, ShouldRun, TaskBody, ThreadBinding
from loopdock.runtime.models import Reply, ScriptedAdapter
from loopdock.runtime.skills import SkillCatalog


def admitted(turn_id: str) -> ShouldRun:
    return ShouldRun(
        should_run=True, decision="run", turn_id=turn_id, wait_minutes=None, scheduler_action="run_now",
        receipt_status="committed", effect_id=f"g1:a1:t1:{turn_id}", todo_id="t1", settlement_plan=None, payload={},
    )


def waiting(turn_id: str, minutes: float = 5, **hint) -> ShouldRun:
    """A wait as LoopX 2.1.1 answers it (``hint``: more of its scheduler hint)."""
    scheduler = SchedulerHint(action="backoff_until_state_change", interval_minutes=minutes, **hint)
    return ShouldRun(
        should_run=False, decision="wait", turn_id=turn_id, wait_minutes=minutes, scheduler_action=scheduler.action,
        receipt_status="committed", effect_id=None, todo_id=None, settlement_plan=None, payload={},
        scheduler=scheduler,
    )


def stopped(turn_id: str) -> ShouldRun:
    return ShouldRun(
        should_run=False, decision="skip", turn_id=turn_id, wait_minutes=None, scheduler_action="stop",
        receipt_status="committed", effect_id=None, todo_id=None, settlement_plan=None, payload={},
    )


class AdmitOnce:
    """LoopX with one todo: it admits one turn (and replays it), then has nothing more."""

    def __init__(self) -> None:
        self.turn_id: str | None = None

    def __call__(self, turn_id: str) -> ShouldRun:
        if self.turn_id in (None, turn_id):
            self.turn_id = turn_id
            return admitted(turn_id)
        return stopped(turn_id)


class FakeLoopx(LoopxClient):
    """LoopX's typed answers without a process: ``answer(turn_id)`` decides should-run;
    ``gate`` (when set) holds every should-run until it is set; ``fail`` raises once."""

    def __init__(self, project: Path, answer=None) -> None:
        super().__init__(["fake-loopx"], project=project, env={})
        self.answer = answer if answer is not None else AdmitOnce()
        self.should_runs: list[str] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.gate: trio.Event | None = None
        self.fail: dict[str, BaseException] = {}
        self.entered = trio.Event()
        #: what resolve answers, call by call (the last one repeats)
        self.bindings = [ThreadBinding("bound", "g1", "a1")]
        self.resolves = 0

    def _maybe_fail(self, what: str) -> None:
        error = self.fail.pop(what, None)
        if error is not None:
            raise error

    async def resolve_thread(self, thread_id):
        await trio.lowlevel.checkpoint()
        self._maybe_fail("resolve")
        self.resolves += 1
        return self.binding

    @property
    def binding(self) -> ThreadBinding:
        return self.bindings[min(self.resolves, len(self.bindings)) - 1]

    async def should_run(self, goal_id, agent_id, turn_id):
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            self.entered.set()
            if self.gate is not None:
                await self.gate.wait()
            await trio.lowlevel.checkpoint()
            self._maybe_fail("should-run")
            self.should_runs.append(turn_id)
            return self.answer(turn_id)
        finally:
            self.in_flight -= 1

    async def heartbeat_prompt(self, goal_id, agent_id, turn_id):
        await trio.lowlevel.checkpoint()
        return TaskBody(f"Advance g1.\nLOOPX_TURN={turn_id}\n", turn_id, "heartbeat_agent_input_v1")


def write_loopx_skill(project: Path) -> None:
    folder = project / ".agents" / "skills" / "loopx"
    folder.mkdir(parents=True)
    folder.joinpath("SKILL.md").write_text("---\nname: loopx\ndescription: test skill\n---\nUse loopx.\n")


def open_runtime(tmp_path: Path, project: Path, passivate_after: float | None = None):
    # One continuation object for the whole test (its fake client is set on it): no
    # passivation, which rebuilds it (that is tests/actors/test_loopx_passivation.py).
    return Runtime.open(
        tmp_path / "home",
        skills=SkillCatalog.from_env(project, {"HOME": str(tmp_path)}),
        loopx=LoopxSettings(command=("fake-loopx",), initialize=False),
        passivate_after=passivate_after,
    )


async def new_agent(rt, project: Path, session_id: str, fake: FakeLoopx, respond=None):
    rt.register_adapter(f"scripted-{session_id}", ScriptedAdapter(respond or (lambda request: Reply("ok"))))
    handle = await rt.create_agent(
        session_id=session_id,
        agent_options={"provider": f"scripted-{session_id}", "model": "m", "cwd": str(project)},
    )
    driver = rt.loopx.continuations[session_id]
    driver.clients = lambda: fake
    return handle, driver


async def continuation_turns(agent) -> list[str]:
    return [e.data["source"]["turnInstanceId"] for e in (await agent.session.read_events())
            if e.type == "user/message" and e.data.get("source", {}).get("kind") == "loopx-continuation"]


async def faults(agent) -> list[dict]:
    return [e.data["source"] for e in (await agent.session.read_events())
            if e.type == "system/message" and e.data.get("source", {}).get("kind") == FAULT_KIND]


class Polls:
    """LoopX answering "wait" with one scheduler hint (``hints`` by call: the last repeats)
    for ``answers`` calls, then "stop"; the clock time of every call is kept."""

    def __init__(self, answers: int, *hints: dict) -> None:
        self.answers, self.hints = answers, hints
        self.times: list[float] = []
        self.done = trio.Event()

    def __call__(self, turn_id: str) -> ShouldRun:
        self.times.append(trio.current_time())
        if len(self.times) > self.answers:
            self.done.set()
            return stopped(turn_id)
        return waiting(turn_id, **self.hints[min(len(self.times), len(self.hints)) - 1])
