"""The LoopX continuation's own logic against a fake LoopX client (no process), on the
autojump clock: one evaluation at a time, one timer, contained failures, the hold a
Pause uses, and the session-log fold (activation, latch, continuation turns) for both
log formats. The same behaviours on the real CLI: ``test_loopx_trust.py``.

Nothing sleeps to synchronise: tests wait on the continuation's own signals
(``wait_quiescent``, ``wait_checkpoint``) or on events the fake client sets."""

from __future__ import annotations

from itertools import pairwise

import pytest
import trio
from fake_loopx import (
    AdmitOnce,
    FakeLoopx,
    Polls,
    admitted,
    continuation_turns,
    faults,
    new_agent,
    open_runtime,
    stopped,
    waiting,
    write_loopx_skill,
)

from loopdock.actors.loopx import ContinuationHistory
from loopdock.runtime._events import Event
from loopdock.runtime.loopx import ShouldRun, ThreadBinding
from loopdock.runtime.models import Reply

SOURCE = {"kind": "loopx-continuation"}


async def test_a_scheduler_wake_up_and_an_idle_checkpoint_make_one_evaluation_at_a_time(tmp_path, autojump_clock):
    write_loopx_skill(tmp_path)
    fake = FakeLoopx(tmp_path)
    async with open_runtime(tmp_path, tmp_path) as rt:
        handle, driver = await new_agent(rt, tmp_path, "one", fake)
        fake.gate = trio.Event()
        with trio.fail_after(60):
            handle.agent.followup("/loopx go")
            await fake.entered.wait()  # the idle checkpoint after the person's turn is in should-run
            for _ in range(3):
                driver.request()  # what a timer does when it fires
            fake.gate.set()
            await driver.wait_quiescent()
        assert fake.max_in_flight == 1
        # One admission, admitted once; the coalesced requests found it pending or served.
        assert len(driver.admitted) == 1 and await continuation_turns(handle.agent) == driver.admitted
        await handle.dispose()


async def test_arming_the_timer_disarms_the_last_one(tmp_path, autojump_clock):
    write_loopx_skill(tmp_path)
    fake = FakeLoopx(tmp_path, answer=waiting)
    async with open_runtime(tmp_path, tmp_path) as rt:
        handle, driver = await new_agent(rt, tmp_path, "timed", fake)
        with trio.fail_after(60):
            handle.agent.followup("/loopx go")
            await driver.wait_quiescent()
            first = driver.timer
            assert first is not None and driver.status.state == "waiting"
            await driver.checkpoint()  # an evaluation before the timer fired: a new wait
        assert driver.timer is not None and driver.timer is not first and first.cancel_called
        # One attempt while LoopX admits nothing: the same turn id, its receipt replayed.
        assert len(fake.should_runs) == 2 and fake.should_runs[0] == fake.should_runs[1]
        await handle.dispose()


async def waits_between_polls(tmp_path, polls: Polls, session_id: str) -> tuple[list[float], object]:
    write_loopx_skill(tmp_path)
    fake = FakeLoopx(tmp_path, answer=polls)
    async with open_runtime(tmp_path, tmp_path) as rt:
        handle, driver = await new_agent(rt, tmp_path, session_id, fake)
        with trio.fail_after(30 * 24 * 3600):
            handle.agent.followup("/loopx go")
            await polls.done.wait()
            await driver.wait_quiescent()
        status = driver.status
        await handle.dispose()
    return [round(b - a) for a, b in pairwise(polls.times)], status


async def test_waits_follow_the_progression_with_and_without_a_limit(tmp_path, autojump_clock):
    # No limit and after_limit "continue": the progression, then its last interval on.
    hint = {"progression_minutes": (1.0, 2.0, 4.0), "unchanged_poll_limit": None, "after_limit": "continue",
            "reset_token": "t1"}
    waits, status = await waits_between_polls(tmp_path, Polls(6, hint), "endless")
    assert waits == [60, 120, 240, 240, 240, 240]
    assert status.state == "stopped" and status.reason == "should-run: skip"


async def test_the_unchanged_poll_limit_ends_the_polling_and_a_new_token_starts_it_again(tmp_path, autojump_clock):
    limited = {"progression_minutes": (1.0, 2.0, 4.0, 8.0), "unchanged_poll_limit": 2, "after_limit": "stop_tick_loop"}
    # Token A twice (two waits), then token B: counted from the start again, to its limit.
    hints = [{**limited, "reset_token": "A"}] * 2 + [{**limited, "reset_token": "B"}]
    polls = Polls(100, *hints)
    write_loopx_skill(tmp_path)
    fake = FakeLoopx(tmp_path, answer=polls)
    async with open_runtime(tmp_path, tmp_path) as rt:
        handle, driver = await new_agent(rt, tmp_path, "limited", fake)
        with trio.fail_after(30 * 24 * 3600):
            handle.agent.followup("/loopx go")
            await driver.wait_quiescent()
            while driver.timer is not None:  # the autojump clock fires each timer
                await driver.wait_checkpoint(driver.checkpoints)
            await trio.sleep(7 * 24 * 3600)  # a week: nothing polls any more
        waits = [round(b - a) for a, b in pairwise(polls.times)]
        assert waits == [60, 120, 60, 120]  # A: 1, 2 min; B: 1, 2 min; B's third poll is the last
        assert len(polls.times) == 5 and driver.timer is None
        assert (driver.status.state, driver.status.reason) == (
            "stopped", "LoopX's scheduler: unchanged after 2 polls (wait); a person's message or Start asks again")
        # Start counts from the start again.
        await driver.start()
        assert driver.status.state == "waiting" and driver.stopped == "waiting 60s"
        await handle.dispose()


async def test_a_wait_is_capped_at_a_day_and_at_least_a_minute(tmp_path, autojump_clock):
    days = {"progression_minutes": (3 * 24 * 60.0,), "max_interval_minutes": 4 * 24 * 60.0}
    waits, _ = await waits_between_polls(tmp_path / "a", Polls(2, days), "days")
    assert waits == [24 * 3600, 24 * 3600]
    zero = {"progression_minutes": (0.0,)}
    waits, _ = await waits_between_polls(tmp_path / "b", Polls(2, zero), "zero")
    assert waits == [60, 60]


async def test_a_hint_that_says_stop_arms_no_timer(tmp_path, autojump_clock):
    write_loopx_skill(tmp_path)
    fake = FakeLoopx(tmp_path, answer=lambda turn_id: waiting(turn_id, local="stop"))
    async with open_runtime(tmp_path, tmp_path) as rt:
        handle, driver = await new_agent(rt, tmp_path, "told-to-stop", fake)
        with trio.fail_after(60):
            handle.agent.followup("/loopx go")
            await driver.wait_quiescent()
        assert driver.timer is None and driver.status.state == "stopped" and len(fake.should_runs) == 1
        await handle.dispose()


async def test_a_failing_evaluation_is_recorded_shown_and_retried_at_the_next_checkpoint(tmp_path, autojump_clock):
    write_loopx_skill(tmp_path)
    fake = FakeLoopx(tmp_path)
    fake.fail["resolve"] = RuntimeError("boom /home/secret")
    async with open_runtime(tmp_path, tmp_path) as rt:
        handle, driver = await new_agent(rt, tmp_path, "shaky", fake)
        bystander, _ = await new_agent(rt, tmp_path, "bystander", FakeLoopx(tmp_path))
        with trio.fail_after(60):
            handle.agent.followup("/loopx go")
            await driver.wait_quiescent()
            assert driver.status.state == "failed"
            assert driver.status.reason == "the evaluation failed: RuntimeError"  # no text of the error
            (fault,) = await faults(handle.agent)
            assert fault["actor"] == "loopx-continuation" and fault["action"] == "retried at the next checkpoint"
            # Nothing else ended: the other agent works, this agent works.
            bystander.agent.followup("hello")
            await rt.loopx.continuations["bystander"].wait_quiescent()
            handle.agent.followup("go on")
            await driver.wait_quiescent()
        assert driver.admitted and await continuation_turns(handle.agent) == driver.admitted
        assert len(await faults(handle.agent)) == 1
        await handle.dispose()
        await bystander.dispose()


async def test_a_revalidation_that_raises_rejects_the_step_and_the_agent_goes_on(tmp_path, autojump_clock):
    write_loopx_skill(tmp_path)
    fake = FakeLoopx(tmp_path)
    async with open_runtime(tmp_path, tmp_path) as rt:
        handle, driver = await new_agent(rt, tmp_path, "gate", fake)

        class RaiseOnReplay:
            def __init__(self):
                self.calls = 0

            def __call__(self, turn_id):
                self.calls += 1
                if self.calls == 2:  # the pre-step replay
                    raise ValueError("replay broke")
                return admitted(turn_id) if self.calls == 1 else stopped(turn_id)

        fake.answer = RaiseOnReplay()
        with trio.fail_after(60):
            handle.agent.followup("/loopx go")
            await driver.wait_quiescent()
        ends = [e.data["reason"] for e in (await handle.agent.session.read_events()) if e.type == "turn/end"]
        vetoed = ends[1].pop("messageIds")  # the continuation's message, which never entered the log
        assert ends[1] == {"kind": "blocked", "reason": "loopx continuation: revalidation failed: ValueError"}
        assert len(vetoed) == 1 and vetoed[0] not in {e.data["id"] for e in (await handle.agent.session.read_events())
                                                      if e.type == "user/message"}
        assert driver.admitted == [] and await continuation_turns(handle.agent) == []
        assert [f["error"] for f in await faults(handle.agent)] == ["revalidation failed: ValueError"]
        # The blocked turn latches it: quiet, without a CLI call, until a person acts.
        assert driver.status.state == "quiet" and len(fake.should_runs) == 2  # admission, replay; none after
        await handle.dispose()


async def test_its_own_pre_step_veto_does_not_silence_it_the_next_idle_checkpoint_evaluates(
    tmp_path, autojump_clock
):
    """The binding changes between the reservation and the pre-step (LoopX now binds the
    session to another agent lane): the continuation's own check vetoes the step, the turn
    ends blocked, and the idle checkpoint right after evaluates again, on the binding as it
    is now. It is not latched quiet until a person acts."""
    write_loopx_skill(tmp_path)

    class AdmitTwo:
        def __init__(self):
            self.turn_ids: list[str] = []

        def __call__(self, turn_id):
            if turn_id not in self.turn_ids and len(self.turn_ids) < 2:
                self.turn_ids.append(turn_id)
            return admitted(turn_id) if turn_id in self.turn_ids else stopped(turn_id)

    fake = FakeLoopx(tmp_path, answer=AdmitTwo())
    # The evaluation resolves g1/a1; from the pre-step on, the session is bound to g1/a2.
    fake.bindings = [ThreadBinding("bound", "g1", "a1"), ThreadBinding("bound", "g1", "a2")]
    async with open_runtime(tmp_path, tmp_path) as rt:
        handle, driver = await new_agent(rt, tmp_path, "rebound", fake)
        with trio.fail_after(60):
            handle.agent.followup("/loopx go")
            await driver.wait_quiescent()
        events = await handle.agent.session.read_events()
        ends = [e.data["reason"] for e in events if e.type == "turn/end"]
        assert [end["kind"] for end in ends] == ["completed", "blocked", "completed"]
        assert ends[1]["reason"] == "loopx continuation: binding changed (bound)"
        first, second = fake.answer.turn_ids
        # The vetoed turn was never asked about again; the next idle checkpoint resolved the
        # new binding and admitted a turn on it, which entered a model step.
        assert fake.should_runs[:3] == [first, second, second]  # admission; admission, replay
        sources = [e.data["source"] for e in events
                   if e.type == "user/message" and e.data["source"]["kind"] == "loopx-continuation"]
        assert [(s["agentId"], s["turnInstanceId"]) for s in sources] == [("a2", second)]
        assert driver.admitted == [second] and driver.history.latch is None
        assert driver.status.state == "stopped"  # LoopX had nothing more: it said so, not a latch
        await handle.dispose()


async def test_a_hold_withdraws_the_queued_continuation_and_disarms_the_timer(tmp_path, autojump_clock):
    write_loopx_skill(tmp_path)
    fake = FakeLoopx(tmp_path, answer=waiting)
    async with open_runtime(tmp_path, tmp_path) as rt:
        handle, driver = await new_agent(rt, tmp_path, "held", fake)
        with trio.fail_after(60):
            handle.agent.followup("/loopx go")
            await driver.wait_quiescent()
            timer = driver.timer
            assert timer is not None
            async with driver.hold("a Pause is in progress"):
                assert timer.cancel_called and driver.timer is None
                assert driver.status.state == "paused"
                await driver.checkpoint()  # held: an evaluation does nothing
                assert len(fake.should_runs) == 1
        await handle.dispose()


def goal_stopped(turn_id: str) -> ShouldRun:
    """What LoopX answers for a goal its owner stopped (the GoalBar's Pause)."""
    return ShouldRun(
        should_run=False, decision="skip", turn_id=turn_id, wait_minutes=None,
        scheduler_action="stop_until_explicit_resume", receipt_status="committed", effect_id=None,
        todo_id=None, settlement_plan=None, payload={}, pause_cause="goal_stopped",
    )


@pytest.mark.parametrize("goal_paused", [True, False], ids=["pause-then-start", "pause-not-written"])
async def test_a_pause_between_admission_and_its_watcher_does_not_offer_the_turn_again(
    tmp_path, autojump_clock, goal_paused
):
    """The GoalBar's Pause (``hold``) lands after a continuation was admitted into a model
    step but before the task that watches its reservation has taken that in (the watcher
    parks exactly there). The admitted turn must be recorded as admitted, not kept as an
    open attempt that a later evaluation asks about and offers to the model again: not
    after Start (``pause-then-start``: LoopX stopped the goal meanwhile), and not at the
    idle checkpoint after the turn (``pause-not-written``: LoopX's stop failed, the
    goal stayed active, as ``bridge._goalbar`` then re-requests an evaluation)."""
    write_loopx_skill(tmp_path)
    admit_once = AdmitOnce()
    paused = False
    fake = FakeLoopx(tmp_path, answer=lambda turn_id: goal_stopped(turn_id) if paused else admit_once(turn_id))
    model_gate = trio.Event()

    def respond(request):
        last = request.messages[-1]
        if last.source is not None and last.source.kind == "loopx-continuation":
            return Reply("working on it", block=model_gate)  # the continuation's turn runs until released
        return Reply("ok")

    async with open_runtime(tmp_path, tmp_path) as rt:
        handle, driver = await new_agent(rt, tmp_path, "race", fake, respond)
        admitted_seen = trio.Event()
        release_watcher = trio.Event()

        async def parked_watcher(pending):
            # The watcher wakes when its reservation settles and parks right there: the
            # continuation is in a model step, and the watcher has not recorded that yet.
            await pending.reservation.wait()
            admitted_seen.set()
            await release_watcher.wait()
            driver._settled(pending)

        driver._settle = parked_watcher
        with trio.fail_after(60):
            handle.agent.followup("/loopx go")
            await admitted_seen.wait()
            pending = driver.pending
            assert pending is not None and pending.reservation.state == "admitted"
            assert handle.agent.status == "running"  # no idle checkpoint has evaluated since
            async with driver.hold("a Pause is in progress"):  # Pause lands right here
                paused = goal_paused
                release_watcher.set()
            model_gate.set()
            await driver.wait_quiescent()  # the turn ends; its idle checkpoint evaluates
            if goal_paused:
                assert driver.status.state == "paused"
                paused = False
                await driver.start()  # Start: the goal is resumed, the continuation re-armed
                await driver.wait_quiescent()
        turn = pending.turn_id
        assert driver.admitted == [turn]
        assert await continuation_turns(handle.agent) == [turn]  # offered once, never again
        assert fake.should_runs[:2] == [turn, turn]  # admission, pre-step replay
        assert turn not in fake.should_runs[2:]  # later evaluations asked about new attempts only
        await handle.dispose()


# -- the session-log fold -----------------------------------------------------------------

def ev(seq: int, type_: str, data: dict) -> Event:
    return Event(type_, seq, 0, data)


def fold(*events: Event) -> ContinuationHistory:
    history = ContinuationHistory()
    for event in events:
        history.feed(event)
    return history


def continuation_message(turn_id: str) -> dict:
    return {"id": "m", "role": "user", "content": [], "source": {**SOURCE, "turnInstanceId": turn_id}}


def person() -> dict:
    return {"id": "p", "role": "user", "content": [], "source": {"kind": "user"}}


def test_the_latch_follows_turn_ends_in_both_log_formats():
    turn = [ev(0, "turn/start", {"turn": 1}), ev(1, "user/message", continuation_message("T1"))]
    # runtime: {kind: aborted, cause}; DSH: {kind: aborted, reason: {kind}}
    assert fold(*turn, ev(2, "turn/end", {"turn": 1, "reason": {"kind": "aborted", "cause": "stop"}})).latch
    assert fold(*turn, ev(2, "turn/end", {"turn": 1, "reason": {"kind": "aborted", "reason": {"kind": "user"}}})).latch
    for reason in ({"kind": "error", "message": "x"}, {"kind": "max-tokens"}, {"kind": "blocked"}):
        assert fold(*turn, ev(2, "turn/end", {"turn": 1, "reason": reason})).latch
    # A disposal or a crash is not a person's decision; a completed turn is not a stop.
    for reason in ({"kind": "aborted", "cause": "disposed"}, {"kind": "aborted", "reason": {"kind": "disposed"}},
                   {"kind": "interrupted"}, {"kind": "completed"}):
        assert fold(*turn, ev(2, "turn/end", {"turn": 1, "reason": reason})).latch is None


def test_a_person_or_an_admitted_continuation_re_arms_and_turn_outcomes_are_kept():
    aborted = ev(2, "turn/end", {"turn": 1, "reason": {"kind": "aborted", "cause": "stop"}})
    start = [ev(0, "turn/start", {"turn": 1}), ev(1, "user/message", continuation_message("T1")), aborted]
    history = fold(*start)
    assert history.turns == {"T1": "aborted"} and not history.completed("T1")
    # A producer's message (e.g. /loopx-init's) does not re-arm; a person's does.
    init = {"id": "i", "role": "user", "content": [], "source": {"kind": "dsh-loopx-plugin/init-command"}}
    assert fold(*start, ev(3, "user/message", init)).latch is not None
    assert fold(*start, ev(3, "user/message", person())).latch is None
    # A continuation that entered a model step later was re-armed by a person (Start).
    again = [ev(3, "turn/start", {"turn": 2}), ev(4, "user/message", continuation_message("T1")),
             ev(5, "turn/end", {"turn": 2, "reason": {"kind": "completed"}})]
    resumed = fold(*start, *again)
    assert resumed.latch is None and resumed.completed("T1")


def test_a_turn_its_own_check_vetoed_does_not_latch_and_people_are_counted():
    history = fold(ev(0, "turn/start", {"turn": 1}), ev(1, "user/message", person()))
    assert history.people == 1
    history.vetoed(2)
    history.feed(ev(2, "turn/start", {"turn": 2}))
    history.feed(ev(3, "turn/end", {"turn": 2, "reason": {"kind": "blocked", "reason": "r", "messageIds": ["m"]}}))
    assert history.latch is None  # its own veto: evaluated again at the next idle checkpoint
    # Only that turn: a later blocked turn (another listener's veto) latches as before.
    history.feed(ev(4, "turn/start", {"turn": 3}))
    history.feed(ev(5, "turn/end", {"turn": 3, "reason": {"kind": "blocked"}}))
    assert history.latch == "the last turn was blocked before the model ran"
    # A veto recorded for a turn that then ends otherwise changes nothing about that end.
    history = fold()
    history.vetoed(1)
    history.feed(ev(0, "turn/end", {"turn": 1, "reason": {"kind": "aborted", "cause": "stop"}}))
    assert history.latch == "the last turn was cancelled"
