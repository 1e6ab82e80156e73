"""Supervision: a failing actor is reported and restarted or stopped by its owner; it never
ends a sibling or the runtime. Only the store writer's failure ends the runtime."""

import itertools

import pytest
import trio
from structlog.testing import capture_logs

from loopdock import Runtime
from loopdock.actors import COMPANION_POLICY, FAULT_KIND, AdmissionGate, Policy, StoreWriter, supervised
from loopdock.runtime import StoreUnusableError
from loopdock.runtime.skills import SkillCatalog


async def _faults(session) -> list[dict]:
    return [
        e.data["source"]
        for e in await session.read_events()
        if e.type == "system/message" and e.data.get("source", {}).get("kind") == FAULT_KIND
    ]


# -- supervised() itself -------------------------------------------------------------


async def test_a_failing_actor_is_restarted_with_backoff_then_stopped(autojump_clock):
    policy = Policy("restart", max_restarts=2, window=100.0, backoff=(1.0, 5.0))
    starts: list[float] = []
    reports: list[tuple[str, str]] = []

    async def actor(task_status=trio.TASK_STATUS_IGNORED):
        starts.append(trio.current_time())
        task_status.started()
        raise ValueError(f"attempt {len(starts)}")

    async with trio.open_nursery() as nursery:
        await nursery.start(
            lambda task_status: supervised(actor, name="x", policy=policy, task_status=task_status,
                                           report=lambda exc, action: reports.append((str(exc), action)))
        )
    assert reports == [("attempt 1", "restarted"), ("attempt 2", "restarted"), ("attempt 3", "stopped")]
    # Backoff between attempts: 1 s, then 5 s (the last value repeats).
    assert [round(b - a, 3) for a, b in itertools.pairwise(starts)] == [1.0, 5.0]


async def test_failures_outside_the_window_do_not_count(autojump_clock):
    policy = Policy("restart", max_restarts=1, window=10.0, backoff=(20.0,))
    actions: list[str] = []
    attempts = 0

    async def actor(task_status=trio.TASK_STATUS_IGNORED):
        nonlocal attempts
        attempts += 1
        task_status.started()
        if attempts < 4:
            raise ValueError("again")

    await supervised(actor, name="x", policy=policy, report=lambda exc, action: actions.append(action))
    # Each failure comes 20 s after the previous one: never two within 10 s.
    assert actions == ["restarted", "restarted", "restarted"] and attempts == 4


async def test_started_is_reported_once_and_a_stopped_actor_never_leaves_its_caller_waiting():
    async def fails_before_started(task_status=trio.TASK_STATUS_IGNORED):
        raise ValueError("early")

    async with trio.open_nursery() as nursery:
        with trio.fail_after(5):
            await nursery.start(
                lambda task_status: supervised(fails_before_started, name="x", policy=Policy("stop"),
                                               report=lambda exc, action: None, task_status=task_status)
            )

    started_values = []

    async def restarts_after_started(task_status=trio.TASK_STATUS_IGNORED):
        task_status.started("ready")
        raise ValueError("later")

    async with trio.open_nursery() as nursery:
        started_values.append(await nursery.start(
            lambda task_status: supervised(restarts_after_started, name="x",
                                           policy=Policy("restart", max_restarts=3, window=1.0),
                                           report=lambda exc, action: None, task_status=task_status)
        ))
    assert started_values == ["ready"]


async def test_cancellation_goes_through_and_is_never_reported(autojump_clock):
    reports = []

    async def actor(task_status=trio.TASK_STATUS_IGNORED):
        task_status.started()
        await trio.sleep_forever()

    with trio.move_on_after(1) as scope:
        await supervised(actor, name="x", policy=COMPANION_POLICY, report=lambda *a: reports.append(a))
    assert scope.cancelled_caught and reports == []


async def test_a_broken_report_does_not_take_the_supervisor_down():
    async def actor(task_status=trio.TASK_STATUS_IGNORED):
        raise ValueError("x")

    def report(exc, action):
        raise RuntimeError("the report itself is broken")

    await supervised(actor, name="x", policy=Policy("stop"), report=report)  # returns normally


# -- companions ---------------------------------------------------------------------


async def test_a_failing_companion_is_recorded_and_restarted_and_its_agent_goes_on(rt, autojump_clock):
    runs = 0
    restarted = trio.Event()

    async def companion(task_status=trio.TASK_STATUS_IGNORED):
        nonlocal runs
        runs += 1
        task_status.started()
        if runs == 1:
            raise ValueError("loopx said no")
        restarted.set()
        await trio.sleep_forever()

    a = await rt.create_agent(session_id="a")
    b = await rt.create_agent(session_id="b")
    await a.agent.start_companion(companion, name="loopx-continuation")
    with trio.fail_after(30):
        await restarted.wait()
    assert await _faults(a.agent.session) == [
        {"kind": FAULT_KIND, "actor": "loopx-continuation", "error": "ValueError", "action": "restarted"}
    ]
    for handle in (a, b):  # both agents still work
        handle.agent.followup("hello")
        await handle.agent.wait_idle()
        assert (await handle.agent.session.read_events())[-1].data["reason"]["kind"] == "completed"
    assert await _faults(b.agent.session) == []
    # The restarted companion is the agent's, and leaves with it.
    companions = a.agent._companions
    assert companions is not None and len(companions.child_tasks) == 1
    await a.dispose()
    assert not companions.child_tasks


async def test_a_companion_that_keeps_failing_is_stopped_and_the_runtime_closes_cleanly(tmp_path, autojump_clock):
    attempts = 0
    last = trio.Event()

    async def companion(task_status=trio.TASK_STATUS_IGNORED):
        nonlocal attempts
        attempts += 1
        task_status.started()
        if attempts == COMPANION_POLICY.max_restarts + 1:
            last.set()  # the supervisor records this failure as it catches it, before any other task runs
        raise ValueError("always")

    async with Runtime.open(tmp_path / "home") as rt:
        handle = await rt.create_agent(session_id="a")
        await handle.agent.start_companion(companion, name="flaky")
        with trio.fail_after(COMPANION_POLICY.window):
            await last.wait()
        actions = [f["action"] for f in await _faults(handle.agent.session)]
        assert actions == ["restarted"] * COMPANION_POLICY.max_restarts + ["stopped"]
        handle.agent.followup("still here")
        await handle.agent.wait_idle()
        assert (await handle.agent.session.read_events())[-1].data["reason"]["kind"] == "completed"
    # The faults are durable: they are in the log a restart reads back.
    async with Runtime.open(tmp_path / "home") as rt:
        resumed = await rt.resume_agent(resume_session_id="a")
        assert [f["action"] for f in await _faults(resumed.agent.session)][-1] == "stopped"


# -- agents -------------------------------------------------------------------------


async def test_an_agent_whose_evaluator_fails_is_retired_and_its_siblings_go_on(tmp_path, monkeypatch):
    async with Runtime.open(tmp_path / "home") as rt:
        live = rt.subscribe_live()
        a = await rt.create_agent(session_id="a")
        b = await rt.create_agent(session_id="b")
        original = type(a.agent)._run_turn

        async def broken(self, *args):
            if self.id == "a":
                raise RuntimeError("a bug outside any turn")
            await original(self, *args)

        monkeypatch.setattr(type(a.agent), "_run_turn", broken)
        a.agent.followup("go")
        seen = []
        with trio.fail_after(10):
            async for item in live:
                if item.agent_id == "a" and item.type in ("agent/error", "agent/disposed"):
                    seen.append((item.type, dict(item.data)))
                    if item.type == "agent/disposed":
                        break
        assert seen == [("agent/error", {"error": "RuntimeError"}), ("agent/disposed", {})]
        assert rt.list_agents() == ["b"] and a.agent.closed
        b.agent.followup("hello")
        await b.agent.wait_idle()
        assert (await b.agent.session.read_events())[-1].data["reason"]["kind"] == "completed"
    async with Runtime.open(tmp_path / "home") as rt:  # the retirement is in the log
        resumed = await rt.resume_agent(resume_session_id="a")
        assert (await _faults(resumed.agent.session))[-1] == {
            "kind": FAULT_KIND, "actor": "agent", "error": "RuntimeError", "action": "retired"
        }


async def test_a_failing_agent_started_hook_is_recorded_and_the_agent_runs(rt):
    async def hook(agent):
        raise KeyError("hook bug")

    rt.supervisor.agent_started.append(hook)
    handle = await rt.create_agent(session_id="h")
    assert [f["actor"] for f in await _faults(handle.agent.session)] == ["agent-started hook"]
    handle.agent.followup("hi")
    await handle.agent.wait_idle()
    assert (await handle.agent.session.read_events())[-1].data["reason"]["kind"] == "completed"


async def test_a_failing_pre_step_listener_rejects_the_step_and_is_recorded(rt):
    async def broken(pre, next_):
        raise ValueError("listener bug")

    def setup(ctx):
        ctx.on("agent/pre-step", broken)

    handle = await rt.create_agent(session_id="p", setup=setup)
    sent = handle.agent.followup("hi")
    await handle.agent.wait_idle()
    assert (await handle.agent.session.read_events())[-1].data["reason"] == {
        "kind": "blocked", "reason": "pre-step listener failed", "messageIds": [sent.id]}
    assert [f["actor"] for f in await _faults(handle.agent.session)] == ["pre-step listener"]


# -- the store writer ---------------------------------------------------------------


async def test_a_failing_store_writer_ends_the_runtime_with_a_clear_error(tmp_path, monkeypatch):
    async def broken_run(self, *, task_status=trio.TASK_STATUS_IGNORED):
        task_status.started()
        await self._wakeup.wait()
        raise OSError("the disk went away")

    monkeypatch.setattr(StoreWriter, "run", broken_run)
    with pytest.raises(StoreUnusableError, match="OSError") as caught:
        async with Runtime.open(tmp_path / "home") as rt:
            handle = await rt.create_agent(session_id="s")
            handle.agent.followup("hello")
            with trio.fail_after(10):
                await trio.sleep_forever()  # the runtime ends this, not the timeout
    assert isinstance(caught.value.__cause__, OSError)


# -- the runtime's own watchers ---------------------------------------------------------


async def test_the_runtimes_watchers_are_restarted_and_agents_go_on(tmp_path, monkeypatch, autojump_clock):
    runs = {"gate": 0, "skills": 0}
    both_restarted = trio.Event()

    def failing_once(kind, real):
        async def run(self, *, task_status=trio.TASK_STATUS_IGNORED):
            runs[kind] += 1
            if min(runs.values()) >= 2:
                both_restarted.set()
            if runs[kind] == 1:
                task_status.started()
                raise ValueError(f"{kind} broke")
            await real(self, task_status=task_status)

        return run

    monkeypatch.setattr(AdmissionGate, "run", failing_once("gate", AdmissionGate.run))
    monkeypatch.setattr(SkillCatalog, "watch", failing_once("skills", SkillCatalog.watch))
    with capture_logs() as logs:
        async with Runtime.open(tmp_path / "home") as rt:
            handle = await rt.create_agent(session_id="a")
            with trio.fail_after(30):
                await both_restarted.wait()
            handle.agent.followup("hello")
            await handle.agent.wait_idle()
            assert (await handle.agent.session.read_events())[-1].data["reason"]["kind"] == "completed"
    failed = sorted((e["event"], e["action"]) for e in logs if e["event"].endswith("failed") and "action" in e)
    assert failed == [
        ("admission gate's stall watcher failed", "restarted"),
        ("skill catalog watcher failed", "restarted"),
    ]
