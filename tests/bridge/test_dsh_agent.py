"""``DshAgent`` and ``DshAgentMirror`` without DSH: a ``HostHandler`` fed live events by
hand (``on_live``/``on_pre_step`` called directly, as the bridge server would) and a fake
host connection that records the commands it is sent and answers them (its only purpose
is to inject faults: negative acks, no host).

Every wait is bounded by ``trio.fail_after`` on the autojump clock; "nothing happens"
is checked with ``trio.move_on_after`` on the same clock (it fires only once every task is
blocked, so a task that could still act has acted)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from loopdock import MessageRefusedError
from loopdock.actors import CommandResult, LiveEvent, PreStep, Reject
from loopdock.actors._agent import InvalidReservationError
from loopdock.bridge import (
    Ack,
    Cancel,
    CommandDone,
    DshAgent,
    DshAgentMirror,
    ErrorNotice,
    Followup,
    HostHandler,
    NotServedError,
    RemoteError,
    RunCommand,
    Verdict,
    Wake,
)
from loopdock.bridge import PreStep as WirePreStep
from loopdock.bridge._dsh_agent import DshAgentClosedError
from loopdock.bridge._handler import Disconnect
from loopdock.runtime import AgentClosedError
from loopdock.runtime._messages import (
    Message,
    ProducerSource,
    SkillInvocationSource,
    TextBlock,
    UserSource,
)
from loopdock.runtime._serde import message_to_wire

OWNED = "loopx-continuation"
OWNED_KINDS = frozenset({OWNED})
NOT_PENDING = "not a pending reservation of this runtime"


class FakeHost:
    """A DSH-host connection: records every command, answers with ``replies[type]`` (an
    ``Ack``, or an exception to raise), ``Ack(True)`` by default; while ``held`` is set
    to an unset event, answers wait for it."""

    role = "dsh-host"

    def __init__(self, conn_id: str = "c1") -> None:
        self.id = conn_id
        self.closed = None
        self.sent: list = []
        self.replies: dict[type, object] = {}
        self.held: trio.Event | None = None
        self._changed = trio.Event()

    async def request(self, message, reply_timeout=10.0):
        self.sent.append(message)
        self._changed.set()
        self._changed = trio.Event()
        if self.held is not None:
            await self.held.wait()
        reply = self.replies.get(type(message), Ack(True))
        if isinstance(reply, BaseException):
            raise reply
        return reply

    def of(self, kind: type) -> list:
        return [m for m in self.sent if isinstance(m, kind)]

    async def wait_sent(self, kind: type, count: int = 1) -> None:
        while len(self.of(kind)) < count:
            await self._changed.wait()


async def live(handler: HostHandler, conn: FakeHost, *items: tuple[str, str, dict]) -> None:
    await handler.on_live(conn, [LiveEvent(kind, agent_id, data) for kind, agent_id, data in items])


def created(agent_id: str, source: str = "startup") -> tuple[str, str, dict]:
    return ("agent/created", agent_id, {"source": source, "sessionId": agent_id})


def status(agent_id: str, value: str) -> tuple[str, str, dict]:
    return ("agent/status", agent_id, {"status": value})


def inbox(kind: str, agent_id: str, message: dict) -> tuple[str, str, dict]:
    return (f"agent/inbox/{kind}", agent_id, {"message": message})


def human(message_id: str, kind: str = "user") -> dict:
    source = {"kind": "user"} if kind == "user" else {"kind": "skill-invocation", "name": "loopx", "form": "instructions"}
    return {"id": message_id, "role": "user", "content": [{"type": "text", "text": "hi"}], "source": source}


def continuation(turn: str = "t1", kind: str = OWNED) -> Message:
    source = ProducerSource(kind, {"schemaVersion": "loopx_dsh_continuation_v0", "goalId": "g1", "turnInstanceId": turn})
    return Message("user", (TextBlock(f"continue {turn}"),), source)


def pre_step(agent_id: str, *messages: dict, turn: int = 1) -> WirePreStep:
    return WirePreStep(agent_id, agent_id, turn, 1, tuple(messages))


async def still_blocked(async_fn, *args, seconds: float = 1) -> bool:
    """True if ``async_fn(*args)`` is still waiting once everything else has settled."""
    with trio.move_on_after(seconds) as scope:
        await async_fn(*args)
    return scope.cancelled_caught


async def open_host(rt, *agents: str) -> tuple[HostHandler, FakeHost]:
    handler = HostHandler(rt.dock)
    conn = FakeHost()
    handler.connected(conn)
    await live(handler, conn, *[created(a) for a in agents])
    return handler, conn


async def start_proxy(nursery: trio.Nursery, handler: HostHandler, agent_id: str, cwd: Path) -> DshAgent:
    proxy = DshAgent(handler, handler.agents[agent_id], cwd, OWNED_KINDS)
    await nursery.start(proxy.run)
    return proxy


class Recorder:
    """A pre-step listener: records what it saw, then answers ``verdict`` (or enters)."""

    def __init__(self, verdict=None, error: BaseException | None = None) -> None:
        self.seen: list[PreStep] = []
        self.verdict = verdict
        self.error = error

    async def __call__(self, pre: PreStep, next_):
        self.seen.append(pre)
        if self.error is not None:
            raise self.error
        if self.verdict is not None:
            return self.verdict
        return await next_(pre)


# -- what a driver reads ------------------------------------------------------------------


async def test_status_and_waits_follow_the_host(rt, tmp_path, autojump_clock):
    handler, conn = await open_host(rt, "a1")
    with trio.fail_after(600):
        async with trio.open_nursery() as nursery:
            proxy = await start_proxy(nursery, handler, "a1", tmp_path)
            assert (proxy.id, proxy.cwd, proxy.closed) == ("a1", tmp_path, False)
            assert (proxy.status, proxy.status_version) == ("idle", 0)  # no agent/status yet

            # wait_status_change wakes on the host's change, not on a repeat
            assert await still_blocked(proxy.wait_status_change, 0)
            await live(handler, conn, status("a1", "running"))
            await proxy.wait_status_change(0)
            assert (proxy.status, proxy.status_version) == ("running", 1)
            await live(handler, conn, status("a1", "running"))
            assert proxy.status_version == 1
            assert await still_blocked(proxy.wait_status_change, 1)

            woke: list[str] = []

            async def waiter(fn, *args):
                await fn(*args)
                woke.append(fn.__name__)

            nursery.start_soon(waiter, proxy.wait_status_change, 1)
            nursery.start_soon(waiter, proxy.wait_idle)
            message = human("h1")
            await live(handler, conn, inbox("inserted", "a1", message))
            assert await still_blocked(trio.sleep_forever) and woke == []
            # idle, but something is queued: not yet idle for wait_idle
            await live(handler, conn, status("a1", "idle"))
            assert await still_blocked(trio.sleep_forever) and woke == ["wait_status_change"]
            assert (proxy.status, proxy.status_version) == ("idle", 2)
            await live(handler, conn, inbox("claimed", "a1", message))
            assert await still_blocked(trio.sleep_forever) and woke == ["wait_status_change", "wait_idle"]
            await proxy.wait_idle()  # returns at once when already idle and empty

            # a disposed agent wakes every waiter
            await live(handler, conn, status("a1", "running"))
            nursery.start_soon(waiter, proxy.wait_idle)
            assert await still_blocked(trio.sleep_forever) and len(woke) == 2
            await live(handler, conn, ("agent/disposed", "a1", {}))
            await proxy.wait_status_change(proxy.status_version)
            assert await still_blocked(trio.sleep_forever) and woke[-1] == "wait_idle" and len(woke) == 3
            assert proxy.closed


async def test_human_input_and_inbox_size_come_from_the_host_inbox(rt, tmp_path, autojump_clock):
    handler, conn = await open_host(rt, "a1")
    with trio.fail_after(600):
        async with trio.open_nursery() as nursery:
            proxy = await start_proxy(nursery, handler, "a1", tmp_path)
            assert (proxy.has_pending_human_input(), proxy.inbox_size) == (False, 0)

            # DSH's own automatic kinds and other producers' messages are not human input
            other = {"id": "o1", "role": "user", "content": [], "source": {"kind": "runtime-context"}}
            await live(handler, conn, inbox("inserted", "a1", other))
            assert (proxy.has_pending_human_input(), proxy.inbox_size) == (False, 1)
            for message_id, kind in (("u1", "user"), ("s1", "skill-invocation")):
                message = human(message_id, kind)
                await live(handler, conn, inbox("inserted", "a1", message))
                assert (proxy.has_pending_human_input(), proxy.inbox_size) == (True, 2)
                await live(handler, conn, inbox("discarded", "a1", message))
                assert (proxy.has_pending_human_input(), proxy.inbox_size) == (False, 1)

            # a reservation counts from the moment it is sent, once (not again when inserted)
            reservation = proxy.reserve(continuation())
            assert proxy.inbox_size == 2
            await conn.wait_sent(Followup)
            wire_message = message_to_wire(reservation.message)
            await live(handler, conn, inbox("inserted", "a1", wire_message))
            assert proxy.inbox_size == 2 and not proxy.has_pending_human_input()
            await live(handler, conn, inbox("claimed", "a1", wire_message))
            verdict = await handler.on_pre_step(conn, pre_step("a1", wire_message))
            assert verdict == Verdict("enter") and reservation.state == "admitted"
            assert proxy.inbox_size == 1
            nursery.cancel_scope.cancel()


# -- reserve ----------------------------------------------------------------------------------


async def test_reserve_sends_a_followup_with_the_wire_form(rt, tmp_path, autojump_clock):
    handler, conn = await open_host(rt, "a1")
    with trio.fail_after(600):
        async with trio.open_nursery() as nursery:
            proxy = await start_proxy(nursery, handler, "a1", tmp_path)
            message = continuation("t1")
            reservation = proxy.reserve(message)
            assert (reservation.state, reservation.message, reservation.placement) == ("pending", message, "followup")
            await conn.wait_sent(Followup)
            assert conn.sent == [
                Followup(
                    "a1",
                    {
                        "role": "user",
                        "content": [{"type": "text", "text": "continue t1"}],
                        "source": {
                            "kind": OWNED,
                            "schemaVersion": "loopx_dsh_continuation_v0",
                            "goalId": "g1",
                            "turnInstanceId": "t1",
                        },
                        "id": message.id,
                    },
                    "followup",
                )
            ]
            steer = proxy.reserve(continuation("t2"), "steer")
            await conn.wait_sent(Followup, 2)
            assert conn.sent[-1].placement == "steer" and conn.sent[-1].message["id"] == steer.message.id
            # a positive ack does not settle it: only the pre-step does
            assert await still_blocked(reservation.wait) and reservation.state == "pending"
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    "source",
    [
        UserSource(),
        SkillInvocationSource("loopx", "instructions"),
        None,
        ProducerSource("someone-else", {"goalId": "g1"}),
    ],
    ids=["user", "skill-invocation", "no-source", "kind-not-owned"],
)
async def test_reserve_refuses_human_sources_and_kinds_the_bridge_does_not_own(rt, tmp_path, autojump_clock, source):
    handler, conn = await open_host(rt, "a1")
    with trio.fail_after(600):
        async with trio.open_nursery() as nursery:
            proxy = await start_proxy(nursery, handler, "a1", tmp_path)
            with pytest.raises(InvalidReservationError):
                proxy.reserve(Message("user", (TextBlock("x"),), source))
            assert await still_blocked(trio.sleep_forever)
            assert conn.sent == [] and proxy.inbox_size == 0
            nursery.cancel_scope.cancel()


async def test_a_refused_or_unsendable_reservation_settles_cancelled(rt, tmp_path, autojump_clock):
    handler, conn = await open_host(rt, "a1")
    with trio.fail_after(600):
        async with trio.open_nursery() as nursery:
            proxy = await start_proxy(nursery, handler, "a1", tmp_path)
            conn.replies[Followup] = Ack(False, ErrorNotice("NOT_LIVE", "no live agent a1"))
            refused = proxy.reserve(continuation("t1"))
            assert await refused.wait() == "cancelled"
            assert "NOT_LIVE" in refused.reason
            assert proxy.inbox_size == 0 and len(conn.of(Followup)) == 1

            handler.disconnected(conn, Disconnect("peer-closed", "bye"))
            assert not proxy.closed  # the agent outlives its connection
            unsent = proxy.reserve(continuation("t2"))
            assert await unsent.wait() == "cancelled"
            assert "NO_HOST" in unsent.reason
            assert proxy.inbox_size == 0 and len(conn.of(Followup)) == 1
            nursery.cancel_scope.cancel()


# -- messages: the Agent contract ----------------------------------------------------------


def _wire_of(message: Message) -> dict:
    return message_to_wire(message)


async def test_followup_steer_and_inject_send_a_persons_text_at_their_placement(rt, tmp_path, autojump_clock):
    handler, conn = await open_host(rt, "a1")
    with trio.fail_after(600):
        async with trio.open_nursery() as nursery:
            proxy = await start_proxy(nursery, handler, "a1", tmp_path)
            sent = [proxy.followup("next turn"), proxy.steer("next step"), proxy.inject("quietly")]
            await conn.wait_sent(Followup, 3)
            assert conn.of(Followup) == [
                Followup("a1", _wire_of(sent[0]), "followup"),
                Followup("a1", _wire_of(sent[1]), "steer"),
                Followup("a1", _wire_of(sent[2]), "inject"),
            ]
            assert all(m.source == UserSource() for m in sent)
            assert [m.text for m in sent] == ["next turn", "next step", "quietly"]
            with pytest.raises(InvalidReservationError):  # an owned kind is only ever reserved
                proxy.steer(continuation("t1"))
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("reply", "code"),
    [
        (Ack(False, ErrorNotice("NOT_LIVE", "no live agent a1")), "NOT_LIVE"),
        (RemoteError("BAD_DATA", "followup needs a message with a source kind"), "BAD_DATA"),
    ],
    ids=["negative-ack", "error-frame"],
)
async def test_a_message_the_host_refuses_is_raised_by_the_next_wait_idle(rt, tmp_path, autojump_clock, reply, code):
    handler, conn = await open_host(rt, "a1")
    with trio.fail_after(600):
        async with trio.open_nursery() as nursery:
            proxy = await start_proxy(nursery, handler, "a1", tmp_path)
            conn.replies[Followup] = reply
            refused = proxy.followup("are you there?")
            with pytest.raises(MessageRefusedError) as caught:
                await proxy.wait_idle()
            await proxy.wait_idle()  # raised once
            del conn.replies[Followup]
            taken = proxy.inject("this one is taken")
            await live(handler, conn, inbox("inserted", "a1", _wire_of(taken)))
            await proxy.wait_idle()
            nursery.cancel_scope.cancel()
    error = caught.value
    assert (error.code, error.message_id, error.host_code) == ("MESSAGE_REFUSED", refused.id, code)
    assert isinstance(error.reason, str) and error.reason


async def test_a_message_sent_with_no_host_connected_is_refused(rt, tmp_path, autojump_clock):
    handler, conn = await open_host(rt, "a1")
    with trio.fail_after(600):
        async with trio.open_nursery() as nursery:
            proxy = await start_proxy(nursery, handler, "a1", tmp_path)
            handler.disconnected(conn, Disconnect("peer-closed", "bye"))
            first, second = proxy.steer("one"), proxy.followup("two")
            with pytest.raises(MessageRefusedError) as one:
                await proxy.wait_idle()
            with pytest.raises(MessageRefusedError) as two:
                await proxy.wait_idle()
            nursery.cancel_scope.cancel()
    assert [(e.value.message_id, e.value.host_code) for e in (one, two)] == [(first.id, "NO_HOST"), (second.id, "NO_HOST")]
    assert conn.sent == []


async def test_wait_idle_waits_for_the_answer_and_for_what_wakes_the_agent_not_for_an_inject(
    rt, tmp_path, autojump_clock
):
    handler, conn = await open_host(rt, "a1")
    with trio.fail_after(600):
        async with trio.open_nursery() as nursery:
            proxy = await start_proxy(nursery, handler, "a1", tmp_path)
            await live(handler, conn, status("a1", "idle"))
            conn.held = trio.Event()
            message = proxy.followup("wake up")
            await conn.wait_sent(Followup)
            assert await still_blocked(proxy.wait_idle)  # not answered yet
            await proxy.wait_quiescent()  # an observer's wait does not wait for it
            # answered: the plugin sent the inbox insert before its ack
            await live(handler, conn, inbox("inserted", "a1", _wire_of(message)))
            conn.held.set()
            assert await still_blocked(proxy.wait_idle)  # queued, and it wakes the agent
            await live(handler, conn, status("a1", "running"), inbox("claimed", "a1", _wire_of(message)))
            assert await still_blocked(proxy.wait_idle)
            await live(handler, conn, status("a1", "idle"))
            await proxy.wait_idle()

            quiet = proxy.inject("for later")
            await live(handler, conn, inbox("inserted", "a1", _wire_of(quiet)))
            await proxy.wait_idle()  # an injected message wakes nobody
            await proxy.wait_quiescent()
            # a person's message in the host's inbox is not this proxy's inject: it wakes
            await live(handler, conn, inbox("inserted", "a1", human("h1")))
            assert await still_blocked(proxy.wait_idle)
            assert await still_blocked(proxy.wait_quiescent)
            nursery.cancel_scope.cancel()


async def test_cancel_sends_its_cause_and_keep_inbox_and_a_refusal_is_not_raised(rt, tmp_path, autojump_clock):
    handler, conn = await open_host(rt, "a1")
    with trio.fail_after(600):
        async with trio.open_nursery() as nursery:
            proxy = await start_proxy(nursery, handler, "a1", tmp_path)
            proxy.cancel("the person changed their mind", keep_inbox=False)
            proxy.cancel()
            await conn.wait_sent(Cancel, 2)
            assert conn.of(Cancel) == [Cancel("a1", "the person changed their mind", False), Cancel("a1", "cancelled", True)]
            conn.replies[Cancel] = Ack(False, ErrorNotice("NOT_LIVE", "no live agent a1"))
            proxy.cancel("again")
            await proxy.wait_idle()  # a cancel is not a message: its refusal is only logged
            await live(handler, conn, ("agent/disposed", "a1", {}))
            await proxy.wait_idle()
            proxy.cancel()  # gone: nothing to cancel, nothing sent
            with pytest.raises(AgentClosedError):  # what an agent of this process raises too
                proxy.followup("too late")
            assert len(conn.of(Cancel)) == 3
            nursery.cancel_scope.cancel()


async def test_a_cancel_that_keeps_the_inbox_wakes_the_agent_once_the_cancelled_turn_ended(
    rt, tmp_path, autojump_clock
):
    handler, conn = await open_host(rt, "a1")
    with trio.fail_after(600):
        async with trio.open_nursery() as nursery:
            proxy = await start_proxy(nursery, handler, "a1", tmp_path)
            await live(handler, conn, status("a1", "running"), inbox("inserted", "a1", human("h1")))
            proxy.cancel("stop this turn")
            await conn.wait_sent(Cancel)
            assert await still_blocked(conn.wait_sent, Wake)  # not before the turn has ended
            await live(handler, conn, status("a1", "idle"))
            await conn.wait_sent(Wake)  # DSH would leave the person's message stalled
            await live(handler, conn, status("a1", "running"), inbox("claimed", "a1", human("h1")))

            # only what this proxy injected is left: it wakes nobody
            quiet = proxy.inject("for the next turn")
            await live(handler, conn, inbox("inserted", "a1", _wire_of(quiet)))
            proxy.cancel("stop again")
            await conn.wait_sent(Cancel, 2)
            await live(handler, conn, status("a1", "idle"))
            # dropping the inbox leaves nothing to wake for either
            await live(handler, conn, status("a1", "running"), inbox("inserted", "a1", human("h2")))
            proxy.cancel("drop it all", keep_inbox=False)
            await conn.wait_sent(Cancel, 3)
            await live(handler, conn, inbox("discarded", "a1", human("h2")), status("a1", "idle"))
            assert await still_blocked(conn.wait_sent, Wake, 2)
            await proxy.wait_idle()
            nursery.cancel_scope.cancel()


# -- the pre-step gate ---------------------------------------------------------------------


async def test_pre_step_enter_admits_the_reservation(rt, tmp_path, autojump_clock):
    handler, conn = await open_host(rt, "a1")
    with trio.fail_after(600):
        async with trio.open_nursery() as nursery:
            proxy = await start_proxy(nursery, handler, "a1", tmp_path)
            listener = Recorder()
            proxy.pre_step.add(listener)
            reservation = proxy.reserve(continuation("t1"))
            await conn.wait_sent(Followup)
            wire_message = conn.sent[0].message
            await live(handler, conn, status("a1", "running"))
            verdict = await handler.on_pre_step(conn, pre_step("a1", wire_message, turn=3))
            assert verdict == Verdict("enter")
            assert await reservation.wait() == "admitted"
            (seen,) = listener.seen
            assert (seen.agent_id, seen.session_id, seen.turn, seen.step) == ("a1", "a1", 3, 1)
            assert seen.messages == (reservation.message,)
            assert seen.messages[0].source.fields["turnInstanceId"] == "t1"
            # settled: the same message at a later pre-step is no longer ours
            again = await handler.on_pre_step(conn, pre_step("a1", wire_message))
            assert again == Verdict("reject", NOT_PENDING) and len(listener.seen) == 1
            # an admitted turn sends no wake
            await live(handler, conn, status("a1", "idle"))
            assert await still_blocked(trio.sleep_forever) and conn.of(Wake) == []
            nursery.cancel_scope.cancel()


async def test_a_reject_wakes_the_agent_after_the_blocked_turn_only_if_input_is_queued(rt, tmp_path, autojump_clock):
    handler, conn = await open_host(rt, "a1")
    with trio.fail_after(600):
        async with trio.open_nursery() as nursery:
            proxy = await start_proxy(nursery, handler, "a1", tmp_path)
            listener = Recorder(Reject("quota says no"))
            proxy.pre_step.add(listener)

            # 1. something is queued behind the vetoed continuation: one wake, once idle
            first = proxy.reserve(continuation("t1"))
            await conn.wait_sent(Followup)
            await live(handler, conn, status("a1", "running"), inbox("inserted", "a1", human("h1")))
            verdict = await handler.on_pre_step(conn, pre_step("a1", conn.sent[-1].message))
            assert verdict == Verdict("reject", "quota says no")
            assert (await first.wait(), first.reason) == ("rejected", "quota says no")
            assert len(listener.seen) == 1
            assert await still_blocked(trio.sleep_forever) and conn.of(Wake) == []  # still running
            await live(handler, conn, status("a1", "idle"))
            await conn.wait_sent(Wake)
            assert conn.of(Wake) == [Wake("a1")]
            assert await still_blocked(trio.sleep_forever) and len(conn.of(Wake)) == 1

            # 2. nothing queued: the turn ends and no wake is sent
            await live(handler, conn, status("a1", "running"), inbox("claimed", "a1", human("h1")))
            second = proxy.reserve(continuation("t2"))
            await conn.wait_sent(Followup, 2)
            verdict = await handler.on_pre_step(conn, pre_step("a1", conn.sent[-1].message))
            assert verdict == Verdict("reject", "quota says no") and second.state == "rejected"
            await live(handler, conn, status("a1", "idle"))
            assert await still_blocked(trio.sleep_forever)
            assert len(conn.of(Wake)) == 1 and proxy.live.inbox == {}

            # 3. a wake the host refuses does not take the proxy down
            conn.replies[Wake] = Ack(False, ErrorNotice("NOT_LIVE", "gone"))
            third = proxy.reserve(continuation("t3"))
            await conn.wait_sent(Followup, 3)
            await live(handler, conn, status("a1", "running"), inbox("inserted", "a1", human("h2")))
            await handler.on_pre_step(conn, pre_step("a1", conn.sent[-1].message))
            await live(handler, conn, status("a1", "idle"))
            await conn.wait_sent(Wake, 2)
            assert third.state == "rejected" and not proxy.closed
            nursery.cancel_scope.cancel()


async def test_a_pre_step_for_a_message_that_is_not_pending_is_rejected_without_the_waterfall(rt, tmp_path, autojump_clock):
    handler, conn = await open_host(rt, "a1")
    with trio.fail_after(600):
        async with trio.open_nursery() as nursery:
            proxy = await start_proxy(nursery, handler, "a1", tmp_path)
            listener = Recorder()
            proxy.pre_step.add(listener)

            # an owned kind this runtime never reserved
            stranger = message_to_wire(continuation("t-x"))
            assert await handler.on_pre_step(conn, pre_step("a1", stranger)) == Verdict("reject", NOT_PENDING)

            # a withdrawn reservation whose message still reaches a pre-step
            reservation = proxy.reserve(continuation("t1"))
            await conn.wait_sent(Followup)
            assert proxy.withdraw(reservation, "driver stopped") is True
            assert (reservation.state, reservation.reason) == ("cancelled", "driver stopped")
            assert proxy.withdraw(reservation) is False and proxy.inbox_size == 0
            verdict = await handler.on_pre_step(conn, pre_step("a1", conn.sent[-1].message))
            assert verdict == Verdict("reject", NOT_PENDING)
            assert reservation.state == "cancelled"
            assert listener.seen == []
            nursery.cancel_scope.cancel()


async def test_a_batch_with_a_foreign_owned_message_settles_the_pending_one_rejected(rt, tmp_path, autojump_clock):
    """DSH consumes the whole batch it rejects (it puts back only what the runtime does not
    own): a pending reservation in it must not stay pending forever."""
    handler, conn = await open_host(rt, "a1")
    with trio.fail_after(600):
        async with trio.open_nursery() as nursery:
            proxy = await start_proxy(nursery, handler, "a1", tmp_path)
            listener = Recorder()
            proxy.pre_step.add(listener)
            mine = proxy.reserve(continuation("t1"))
            await conn.wait_sent(Followup)
            stranger = message_to_wire(continuation("t-x"))
            verdict = await handler.on_pre_step(conn, pre_step("a1", conn.sent[-1].message, stranger))
            assert verdict == Verdict("reject", NOT_PENDING) and listener.seen == []
            assert mine.state == "rejected" and mine.reason == NOT_PENDING
            assert proxy.inbox_size == 0
            nursery.cancel_scope.cancel()


async def test_every_reject_wakes_a_stalled_inbox_not_only_a_listeners(rt, tmp_path, autojump_clock):
    """After any reject (not pending, or failed closed) DSH leaves the inbox stalled just the
    same: the proxy wakes the agent once idle if anything is queued."""
    handler, conn = await open_host(rt, "a1")
    with trio.fail_after(600):
        async with trio.open_nursery() as nursery:
            proxy = await start_proxy(nursery, handler, "a1", tmp_path)
            await live(handler, conn, status("a1", "running"), inbox("inserted", "a1", human("h1")))
            stranger = message_to_wire(continuation("t-x"))
            assert await handler.on_pre_step(conn, pre_step("a1", stranger)) == Verdict("reject", NOT_PENDING)
            await live(handler, conn, status("a1", "idle"))
            await conn.wait_sent(Wake)

            proxy.pre_step.add(Recorder(error=RuntimeError("listener bug")))
            reservation = proxy.reserve(continuation("t1"))
            await conn.wait_sent(Followup)
            await live(handler, conn, status("a1", "running"))
            with pytest.raises(RuntimeError):
                await handler.on_pre_step(conn, pre_step("a1", conn.sent[-1].message))
            assert reservation.state == "rejected"
            await live(handler, conn, status("a1", "idle"))
            await conn.wait_sent(Wake, 2)
            assert conn.of(Wake) == [Wake("a1"), Wake("a1")]
            nursery.cancel_scope.cancel()


async def test_a_listener_that_raises_fails_the_pre_step_and_rejects_the_reservation(rt, tmp_path, autojump_clock):
    handler, conn = await open_host(rt, "a1")
    with trio.fail_after(600):
        async with trio.open_nursery() as nursery:
            proxy = await start_proxy(nursery, handler, "a1", tmp_path)
            boom = Recorder(error=ValueError("listener bug"))
            dispose = proxy.pre_step.add(boom)
            reservation = proxy.reserve(continuation("t1"))
            await conn.wait_sent(Followup)
            with pytest.raises(ValueError, match="listener bug"):
                await handler.on_pre_step(conn, pre_step("a1", conn.sent[-1].message))
            assert (reservation.state, reservation.reason) == ("rejected", "pre-step failed")
            assert len(boom.seen) == 1 and proxy.inbox_size == 0
            # the proxy goes on: the next reservation is judged normally
            dispose()
            later = proxy.reserve(continuation("t2"))
            await conn.wait_sent(Followup, 2)
            assert await handler.on_pre_step(conn, pre_step("a1", conn.sent[-1].message)) == Verdict("enter")
            assert later.state == "admitted" and not proxy.closed
            nursery.cancel_scope.cancel()


# -- the proxy's end ---------------------------------------------------------------------------


async def test_a_disposed_agent_closes_its_proxy(rt, tmp_path, autojump_clock):
    handler, conn = await open_host(rt, "a1")
    companion_cancelled = trio.Event()
    finished = trio.Event()

    async def companion(*, task_status=trio.TASK_STATUS_IGNORED):
        task_status.started()
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            companion_cancelled.set()
            raise

    with trio.fail_after(600):
        async with trio.open_nursery() as nursery:
            proxy = DshAgent(handler, handler.agents["a1"], tmp_path, OWNED_KINDS)

            async def run_proxy(task_status=trio.TASK_STATUS_IGNORED):
                await proxy.run(task_status=task_status)
                finished.set()

            await nursery.start(run_proxy)
            await proxy.start_companion(companion)
            proxy.pre_step.add(Recorder(Reject("no")))
            reservation = proxy.reserve(continuation("t1"))
            await conn.wait_sent(Followup)
            wire_message = conn.sent[-1].message
            assert await handler.on_pre_step(conn, pre_step("a1", message_to_wire(continuation("t-x")))) == Verdict(
                "reject", NOT_PENDING
            )

            await live(handler, conn, ("agent/disposed", "a1", {}))
            await finished.wait()
            assert companion_cancelled.is_set()
            assert (reservation.state, reservation.reason) == ("cancelled", "agent gone")
            assert proxy.closed and proxy.inbox_size == 0
            # the gate is gone: the handler's default answers
            assert await handler.on_pre_step(conn, pre_step("a1", wire_message)) == Verdict("enter")
            with pytest.raises(DshAgentClosedError):
                proxy.reserve(continuation("t2"))
            with pytest.raises(DshAgentClosedError):
                await proxy.start_companion(companion)
            await proxy.wait_idle()
            assert len(conn.of(Followup)) == 1


async def test_status_before_created_on_the_same_connection_is_one_agent_one_proxy(rt, tmp_path, autojump_clock):
    handler = HostHandler(rt.dock)
    conn = FakeHost()
    handler.connected(conn)
    started: list[DshAgent] = []

    async def on_agent(proxy: DshAgent) -> None:
        started.append(proxy)

    mirror = DshAgentMirror(handler, on_agent, lambda _: tmp_path, OWNED_KINDS)
    with trio.fail_after(600):
        async with trio.open_nursery() as nursery:
            await nursery.start(mirror.run)
            await live(handler, conn, status("a1", "running"))
            assert await still_blocked(trio.sleep_forever)
            (proxy,) = started
            await live(handler, conn, created("a1"))
            assert await still_blocked(trio.sleep_forever)
            assert started == [proxy] and mirror.proxies == {"a1": proxy}
            assert not proxy.closed and proxy.live.source == "startup" and proxy.status == "running"
            nursery.cancel_scope.cancel()


async def test_an_agent_announced_again_gets_a_fresh_proxy(rt, tmp_path, autojump_clock):
    handler = HostHandler(rt.dock)
    old_conn, new_conn = FakeHost("c1"), FakeHost("c2")
    handler.connected(old_conn)
    started: list[DshAgent] = []
    cancelled: list[DshAgent] = []

    async def companion(proxy, *, task_status=trio.TASK_STATUS_IGNORED):
        task_status.started()
        try:
            await trio.sleep_forever()
        finally:
            cancelled.append(proxy)

    async def on_agent(proxy: DshAgent) -> None:
        started.append(proxy)
        await proxy.start_companion(companion, proxy)

    mirror = DshAgentMirror(handler, on_agent, lambda session_id: tmp_path / session_id, OWNED_KINDS)
    with trio.fail_after(600):
        async with trio.open_nursery() as nursery:
            await nursery.start(mirror.run)
            await live(handler, old_conn, created("a1"))
            assert await still_blocked(trio.sleep_forever)
            (first,) = started
            assert mirror.proxies == {"a1": first} and first.cwd == tmp_path / "a1"
            old_listener = Recorder()
            first.pre_step.add(old_listener)
            reservation = first.reserve(continuation("t1"))
            await old_conn.wait_sent(Followup)
            old_message = old_conn.sent[-1].message

            # the host comes back on a new connection and announces the agent again (a resume)
            handler.connected(new_conn)
            await live(handler, new_conn, created("a1", "resume"))
            assert await still_blocked(trio.sleep_forever)
            assert first.closed and cancelled == [first]
            assert (reservation.state, reservation.reason) == ("cancelled", "agent gone")
            assert len(started) == 2
            second = started[1]
            assert second is not first and mirror.proxies == {"a1": second}
            assert second.live is handler.agents["a1"] and second.live.source == "resume" and not second.closed
            # the new proxy gates the agent; the old one's reservation is nobody's now
            assert await handler.on_pre_step(new_conn, pre_step("a1", old_message)) == Verdict("reject", NOT_PENDING)
            assert old_listener.seen == []
            fresh = second.reserve(continuation("t2"))
            await new_conn.wait_sent(Followup)
            assert await handler.on_pre_step(new_conn, pre_step("a1", new_conn.sent[-1].message)) == Verdict("enter")
            assert fresh.state == "admitted"

            # disposed: the proxy ends and the mirror forgets it, without starting another
            await live(handler, new_conn, ("agent/disposed", "a1", {}))
            assert await still_blocked(trio.sleep_forever)
            assert second.closed and cancelled == [first, second]
            assert mirror.proxies == {} and len(started) == 2
            assert await handler.on_pre_step(new_conn, pre_step("a1", old_message)) == Verdict("enter")
            nursery.cancel_scope.cancel()


async def test_on_agent_raising_does_not_take_the_mirror_down(rt, tmp_path, autojump_clock):
    handler, conn = await open_host(rt)
    calls: list[str] = []

    async def on_agent(proxy: DshAgent) -> None:
        calls.append(proxy.id)
        if proxy.id == "bad":
            raise RuntimeError("driver failed to start")

    mirror = DshAgentMirror(handler, on_agent, lambda _: tmp_path, OWNED_KINDS)
    with trio.fail_after(600):
        async with trio.open_nursery() as nursery:
            await nursery.start(mirror.run)
            await live(handler, conn, created("bad"))
            assert await still_blocked(trio.sleep_forever)
            await live(handler, conn, created("good"))
            assert await still_blocked(trio.sleep_forever)
            assert calls == ["bad", "good"] and set(mirror.proxies) == {"bad", "good"}
            bad = mirror.proxies["bad"]
            # the proxy itself still serves its agent
            assert not bad.closed
            bad.pre_step.add(Recorder(Reject("vetoed")))
            reservation = bad.reserve(continuation("t1"))
            await conn.wait_sent(Followup)
            assert await handler.on_pre_step(conn, pre_step("bad", conn.sent[-1].message)) == Verdict("reject", "vetoed")
            assert reservation.state == "rejected"
            await live(handler, conn, ("agent/disposed", "bad", {}))
            assert await still_blocked(trio.sleep_forever)
            assert set(mirror.proxies) == {"good"} and bad.closed
            nursery.cancel_scope.cancel()


async def test_the_mirror_of_closed_sessions_is_bounded(rt, monkeypatch):
    from loopdock.bridge import _host_handler
    from loopdock.bridge._messages import SessionEvent
    from loopdock.runtime._events import Event

    monkeypatch.setattr(_host_handler, "RETAINED_CLOSED_SESSIONS", 2)
    handler = HostHandler(rt.dock)
    conn = FakeHost()
    handler.connected(conn)
    for n in range(4):
        await handler.on_live(conn, [LiveEvent("agent/created", f"a{n}", {"source": "startup", "sessionId": f"s{n}"})])
        await handler.on_events(conn, [SessionEvent(f"s{n}", Event("turn/start", 0, 1, {"turn": 1}))])
    await handler.on_live(conn, [LiveEvent("agent/disposed", f"a{n}", {}) for n in range(3)])
    # the two most recently closed keep their mirror; the live one is never let go
    assert sorted(handler.sessions) == ["s1", "s2", "s3"]
    # a closed session announced again is live again: it is not let go
    await handler.on_live(conn, [LiveEvent("agent/created", "a1b", {"source": "resume", "sessionId": "s1"}),
                                 LiveEvent("agent/disposed", "a3", {})])
    assert sorted(handler.sessions) == ["s1", "s2", "s3"]
    await handler.on_live(conn, [LiveEvent("agent/created", "a4", {"source": "startup", "sessionId": "s4"})])
    await handler.on_events(conn, [SessionEvent("s4", Event("turn/start", 0, 1, {"turn": 1}))])
    await handler.on_live(conn, [LiveEvent("agent/disposed", "a4", {})])
    assert sorted(handler.sessions) == ["s1", "s3", "s4"]  # s2 closed longest ago


# -- the mirror as a handler layer: discards and host commands ------------------------------


async def test_a_message_the_host_discards_retires_its_reservation(rt, tmp_path, autojump_clock):
    handler = HostHandler(rt.dock)
    conn = FakeHost()
    handler.connected(conn)

    async def on_agent(proxy: DshAgent) -> None:
        pass

    mirror = DshAgentMirror(handler, on_agent, lambda _: tmp_path, OWNED_KINDS)
    with trio.fail_after(600):
        async with trio.open_nursery() as nursery:
            await nursery.start(mirror.run)
            await mirror.on_live(conn, [LiveEvent(*created("a1")), LiveEvent(*status("a1", "running"))])
            assert await still_blocked(trio.sleep_forever)
            proxy = mirror.proxies["a1"]
            reservation = proxy.reserve(continuation())
            await conn.wait_sent(Followup)
            wire_message = message_to_wire(reservation.message)
            await mirror.on_live(conn, [LiveEvent(*inbox("inserted", "a1", wire_message))])
            assert proxy.inbox_size == 1 and reservation.state == "pending"
            # DSH dropped the agent's inbox (a cancel with keepInbox false): never a pre-step.
            await mirror.on_live(conn, [LiveEvent(*inbox("discarded", "a1", wire_message))])
            assert (reservation.state, reservation.reason) == ("cancelled", "discarded by the host")
            assert proxy.inbox_size == 0
            # Another agent's discard of an unknown message changes nothing.
            await mirror.on_live(conn, [LiveEvent(*inbox("discarded", "a1", human("m-x")))])
            nursery.cancel_scope.cancel()


async def test_host_commands_run_for_the_exact_proxy_and_fail_contained(rt, tmp_path, autojump_clock):
    handler = HostHandler(rt.dock)
    conn = FakeHost()
    handler.connected(conn)
    ran: list[tuple[str, str]] = []

    async def init(proxy: DshAgent, args: str) -> CommandResult:
        ran.append((proxy.id, args))
        proxy.followup(Message("user", (TextBlock("checking LoopX"),), ProducerSource("dsh-loopx-plugin/init-command")))
        return CommandResult(True, "LoopX is ready", {"skillsChanged": False})

    async def broken(proxy: DshAgent, args: str) -> CommandResult:
        raise RuntimeError("boom /home/secret")

    async def on_agent(proxy: DshAgent) -> None:
        pass

    mirror = DshAgentMirror(handler, on_agent, lambda _: tmp_path, OWNED_KINDS,
                            commands={"loopx-init": init, "broken": broken})
    with trio.fail_after(600):
        async with trio.open_nursery() as nursery:
            await nursery.start(mirror.run)
            await mirror.on_live(conn, [LiveEvent(*created("a1"))])
            # The command may arrive right after the agent's announcement: it waits for its proxy.
            done = await mirror.on_command(conn, RunCommand("a1", "loopx-init", ""))
            assert done == CommandDone(True, "LoopX is ready", {"skillsChanged": False})
            assert ran == [("a1", "")]
            await conn.wait_sent(Followup)
            (sent,) = conn.of(Followup)
            assert sent.agent_id == "a1" and sent.message["source"] == {"kind": "dsh-loopx-plugin/init-command"}
            failed = await mirror.on_command(conn, RunCommand("a1", "broken", ""))
            assert failed == CommandDone(False, "/broken failed: RuntimeError")
            with pytest.raises(NotServedError):
                await mirror.on_command(conn, RunCommand("a1", "export", ""))
            with pytest.raises(DshAgentClosedError):
                await mirror.on_command(conn, RunCommand("nobody", "loopx-init", ""))
            nursery.cancel_scope.cancel()


async def test_a_host_that_unloads_the_plugin_takes_its_agents_along(rt, tmp_path, autojump_clock):
    """The plugin closes the bridge itself (1000) only when DSH unloads it (`dsh headless`
    after its task, before DSH disposes its agents): the agents it announced are gone.
    Any other end of the connection keeps them for the host's reconnection."""
    handler, conn = await open_host(rt, "a1", "a2")
    other = FakeHost("c2")
    handler.connected(other)
    await live(handler, other, created("b1"))
    with trio.fail_after(600):
        async with trio.open_nursery() as nursery:
            a1, a2, b1 = [await start_proxy(nursery, handler, agent_id, tmp_path) for agent_id in ("a1", "a2", "b1")]
            handler.disconnected(other, Disconnect("peer-closed", "close code 1006: ", 1006))
            handler.disconnected(other, Disconnect("server-closing", "the bridge server is shutting down"))
            assert await still_blocked(b1.wait_closed)
            handler.disconnected(conn, Disconnect("peer-closed", "close code 1000: dsh unloading", 1000))
            await a1.wait_closed()
            await a2.wait_closed()
            assert set(handler.agents) == {"b1"} and not b1.closed
            assert [e.type for e in a1.session.events] == []  # (nothing mirrored; the view still reads)
            nursery.cancel_scope.cancel()


async def test_followup_of_text_is_a_person_s_message_as_for_runtime_agents(rt, tmp_path, autojump_clock):
    handler, conn = await open_host(rt, "a1")
    with trio.fail_after(600):
        async with trio.open_nursery() as nursery:
            proxy = await start_proxy(nursery, handler, "a1", tmp_path)
            sent = proxy.followup("what next?")
            await conn.wait_sent(Followup)
            (followup,) = conn.of(Followup)
            assert (followup.agent_id, followup.placement) == ("a1", "followup")
            assert followup.message == message_to_wire(sent)
            assert (sent.text, sent.source) == ("what next?", UserSource())
            nursery.cancel_scope.cancel()


async def test_the_continuation_s_activation_is_the_log_s_as_it_is_now(rt, tmp_path, autojump_clock):
    """A DSH model's skill call, as DSH logs it, activates the continuation as soon as it
    is mirrored: no idle checkpoint needed (a `dsh headless` agent's last turn has none
    before the host unloads)."""
    from loopdock.actors.loopx import LoopxContinuation
    from loopdock.bridge import SessionEvent
    from loopdock.runtime._events import Event

    handler, conn = await open_host(rt, "a1")
    call = {"turn": 1, "step": 1, "callId": "c-1", "name": "skill", "arguments": '{"name": "loopx"}'}
    result = {"turn": 1, "step": 1, "message": {"role": "tool", "source": {"kind": "tool", "callId": "c-1"},
                                                 "toolCallId": "c-1", "content": [], "isError": False}}
    with trio.fail_after(600):
        async with trio.open_nursery() as nursery:
            proxy = await start_proxy(nursery, handler, "a1", tmp_path)
            await live(handler, conn, status("a1", "running"))
            continuation = LoopxContinuation(proxy, lambda: pytest.fail("no LoopX call before an idle checkpoint"))
            assert not continuation.activation.active
            await handler.on_events(conn, [SessionEvent("a1", Event("tool/call", 0, 1, call))])
            assert not continuation.activation.active  # a call without its result is not enough
            await handler.on_events(conn, [SessionEvent("a1", Event("tool/result", 1, 2, result))])
            assert continuation.activation.active
            nursery.cancel_scope.cancel()
