"""The LoopX continuation: one actor per agent that keeps a bound agent working under
LoopX quota, in the same session.

It is passive until this exact session invoked the ``loopx`` skill (see
``runtime.loopx.Activation``): before that it makes no CLI call, arms no timer and
queues nothing, however often the agent goes idle. After activation, at every idle
checkpoint it

1. yields to pending human input;
2. resolves the session's binding in LoopX (missing, ambiguous or unhealthy: stop);
3. asks ``quota should-run`` with one fresh turn id (no: stop, or arm the scheduler's
   wake-up timer; a turn LoopX admits without a settlement identity because an earlier
   one is unsettled: stop);
4. fetches the thin task body for that same turn id;
5. reserves exactly one followup with a ``loopx-continuation`` source;
6. at ``agent/pre-step`` revalidates the exact reservation, competing human input and the
   binding, and replays should-run with the same turn id before the message may enter a
   model step; otherwise it rejects it.

LoopX is the only authority: the continuation keeps no durable state of its own, and its
in-memory state dies with the agent.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import attrs
import trio

from runtime._changes import Changes
from runtime._events import Event
from runtime._logging import get_logger
from runtime._messages import Message, ProducerSource, TextBlock, is_human
from runtime._waterfall import Next, Waterfall
from runtime.loopx import Activation, LoopxClient, ShouldRun, TaskBody, ThreadBinding

from .._inbox import Placement, Reservation
from .._pre_step import PreStep, Reject, Verdict

log = get_logger(__name__)

CONTINUATION_KIND = "loopx-continuation"
CONTINUATION_SCHEMA = "loopx_dsh_continuation_v0"


class ContinuedHeader(Protocol):
    @property
    def forked_events(self) -> int | None:
        """How many events a fork copied from its parent (history not to inherit)."""


class ContinuedSession(Protocol):
    @property
    def header(self) -> ContinuedHeader: ...

    def events_since(self, index: int) -> Sequence[Event]: ...


class ContinuedAgent(Protocol):
    """The part of an agent the continuation uses: a runtime ``AgentActor``, or a bridge
    proxy that carries it out on a DSH agent."""

    @property
    def id(self) -> str: ...

    @property
    def session(self) -> ContinuedSession: ...

    @property
    def pre_step(self) -> Waterfall[PreStep, Verdict]: ...

    @property
    def cwd(self) -> Path: ...

    @property
    def closed(self) -> bool: ...

    @property
    def status(self) -> str: ...

    @property
    def status_version(self) -> int: ...

    @property
    def inbox_size(self) -> int: ...

    def has_pending_human_input(self) -> bool: ...

    async def wait_idle(self) -> None: ...

    async def wait_status_change(self, since: int) -> None: ...

    def reserve(self, message: Message, placement: Placement = "followup") -> Reservation: ...

    def withdraw(self, reservation: Reservation, reason: str = "withdrawn") -> bool: ...

    async def start_companion(
        self, actor: Callable[..., Awaitable[Any]], *args: Any, name: str = ...
    ) -> None: ...


@attrs.frozen
class Pending:
    """The one automatic reservation the continuation has out, and its exact identity."""

    reservation: Reservation
    goal_id: str
    agent_id: str
    turn_id: str


def new_turn_id() -> str:
    return f"ld-{uuid.uuid4().hex}"


def continuation_message(body: str, goal_id: str, agent_id: str, turn_id: str) -> Message:
    source = ProducerSource(
        CONTINUATION_KIND,
        {"schemaVersion": CONTINUATION_SCHEMA, "goalId": goal_id, "agentId": agent_id, "turnInstanceId": turn_id},
    )
    return Message("user", (TextBlock(body),), source)


class LoopxContinuation:
    def __init__(self, agent: ContinuedAgent, client: LoopxClient) -> None:
        self.agent = agent
        self.client = client
        self.activation = Activation()
        # Only this exact session's own history activates: a fork skips what it copied.
        self._folded = agent.session.header.forked_events or 0
        self.pending: Pending | None = None
        self.stopped: str | None = None  # why the last evaluation stopped (for tests/UI)
        self.timer: trio.CancelScope | None = None
        self.admitted: list[str] = []  # turn ids admitted into a model step
        self._nursery: trio.Nursery | None = None
        self._checked = Changes()  # one change per idle checkpoint evaluated
        self.log = log.bind(agent_id=agent.id, session_id=agent.id)

    # -- the actor ----------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        dispose = self.agent.pre_step.add(self._pre_step, prepend=True)
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                self._fold()
                task_status.started()
                while not self.agent.closed:
                    await self.agent.wait_idle()
                    seen = self.agent.status_version
                    await self.checkpoint()
                    await self.agent.wait_status_change(seen)
        finally:
            dispose()
            self._invalidate("continuation stopped")

    @property
    def checkpoints(self) -> int:
        """Idle checkpoints evaluated so far (observers wait on it)."""
        return self._checked.version

    async def wait_checkpoint(self, after: int) -> None:
        """Wait until more than ``after`` idle checkpoints have been evaluated."""
        await self._checked.wait_until(lambda: self.checkpoints > after)

    def _fold(self) -> None:
        events = self.agent.session.events_since(self._folded)
        self._folded += len(events)
        for event in events:
            self.activation.feed(event)

    async def checkpoint(self) -> None:
        """One idle checkpoint (or a scheduler wake-up). Before activation this is pure
        bookkeeping. Observers can wait for it with ``wait_checkpoint``."""
        try:
            await self._evaluate()
        finally:
            self._checked.notify()

    async def _evaluate(self) -> None:
        self._fold()
        if not self.activation.active or self.pending is not None:
            return
        agent = self.agent
        if agent.closed or agent.has_pending_human_input() or agent.inbox_size:
            return  # anything queued goes first; we come back at the next idle
        self._cancel_timer()
        binding = await self.client.resolve_thread(agent.id)
        if not isinstance(binding, ThreadBinding):
            return self._stop(f"binding unavailable: {_why(binding)}")
        if binding.status != "bound":
            return self._stop(f"binding {binding.status}")
        assert binding.goal_id is not None and binding.agent_id is not None
        turn_id = new_turn_id()
        decision = await self.client.should_run(binding.goal_id, binding.agent_id, turn_id)
        if not isinstance(decision, ShouldRun):
            return self._stop(f"should-run failed: {_why(decision)}")
        if not decision.should_run:
            if decision.wait_minutes:
                return self._arm_timer(decision.wait_minutes * 60.0)
            return self._stop(f"should-run: {decision.decision}")
        if decision.settlement_owed:
            # An earlier admitted turn is not settled: a turn without its own settlement
            # identity could only be settled by guesswork. A person (or the model in a
            # human turn) settles or recovers it; the next idle asks again.
            return self._stop(f"should-run: {decision.decision} (settlement owed)")
        body = await self.client.heartbeat_prompt(binding.goal_id, binding.agent_id, turn_id)
        if not isinstance(body, TaskBody):
            return self._stop(f"no valid task body: {_why(body)}")
        if agent.closed or agent.has_pending_human_input() or agent.inbox_size or agent.status != "idle":
            return self._stop("competing input arrived")
        text = _relative_to(body.text, self.client.project)
        reservation = agent.reserve(continuation_message(text, binding.goal_id, binding.agent_id, turn_id))
        self.pending = Pending(reservation, binding.goal_id, binding.agent_id, turn_id)
        self.stopped = None
        assert self._nursery is not None
        self._nursery.start_soon(self._settle, self.pending)

    async def _settle(self, pending: Pending) -> None:
        state = await pending.reservation.wait()
        if state == "admitted":
            self.admitted.append(pending.turn_id)
        else:
            self.log.info("continuation not admitted", state=state, reason=pending.reservation.reason)
        if self.pending is pending:
            self.pending = None

    def _stop(self, reason: str) -> None:
        self.stopped = reason
        self.log.info("continuation stopped", reason=reason)

    def _arm_timer(self, seconds: float) -> None:
        assert self._nursery is not None
        self.stopped = f"waiting {seconds:.0f}s"
        scope = trio.CancelScope()
        self.timer = scope

        async def wake_up() -> None:
            with scope:
                await trio.sleep(seconds)
                if self.timer is scope:
                    self.timer = None
                await self.checkpoint()

        self._nursery.start_soon(wake_up)

    def _cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _invalidate(self, reason: str) -> None:
        self._cancel_timer()
        if self.pending is not None:
            self.agent.withdraw(self.pending.reservation, reason)
            self.pending = None

    # -- the pre-step gate ---------------------------------------------------------------

    async def _pre_step(self, pre: PreStep, next_: Next[PreStep, Verdict]) -> Verdict:
        mine = [m for m in pre.messages if m.source is not None and m.source.kind == CONTINUATION_KIND]
        if not mine:
            return await next_(pre)
        reason = self._exact(pre, mine)
        if reason is None and self.pending is not None:
            reason = await self._fresh(self.pending)
        if reason is not None:
            return Reject(f"loopx continuation: {reason}")
        verdict = await next_(pre)
        # Other listeners ran in between: the cheap checks once more.
        reason = self._exact(pre, mine)
        if reason is not None and getattr(verdict, "kind", None) == "enter":
            return Reject(f"loopx continuation: {reason}")
        return verdict

    def _exact(self, pre: PreStep, mine: list[Message]) -> str | None:
        pending = self.pending
        if pending is None:
            return "no reservation is pending"
        if len(mine) != 1 or mine[0].id != pending.reservation.message.id:
            return "not this continuation's reservation"
        source = mine[0].source
        fields = source.fields if isinstance(source, ProducerSource) else {}
        if (fields.get("goalId"), fields.get("agentId"), fields.get("turnInstanceId")) != (
            pending.goal_id,
            pending.agent_id,
            pending.turn_id,
        ):
            return "attribution does not match the reservation"
        if not (pre.agent_id == pre.session_id == self.agent.id):
            return "not this exact agent and session"
        if any(m.source is not None and is_human(m.source) for m in pre.messages):
            return "human input competes in this step"
        if self.agent.has_pending_human_input():
            return "human input is waiting"
        return None

    async def _fresh(self, pending: Pending) -> str | None:
        binding = await self.client.resolve_thread(self.agent.id)
        if not isinstance(binding, ThreadBinding):
            return f"binding unavailable: {_why(binding)}"
        if binding.status != "bound" or (binding.goal_id, binding.agent_id) != (pending.goal_id, pending.agent_id):
            return f"binding changed ({binding.status})"
        replay = await self.client.should_run(pending.goal_id, pending.agent_id, pending.turn_id)
        if not isinstance(replay, ShouldRun):
            return f"should-run replay failed: {_why(replay)}"
        if not replay.should_run:
            return "quota no longer admits this turn"
        if replay.settlement_owed:
            return "quota admits this turn without a settlement identity"
        return None


def _why(failure: Any) -> str:
    """A failure's safe reason (the client builds it from fixed phrases only)."""
    return getattr(failure, "reason", None) or getattr(failure, "error_kind", None) or type(failure).__name__


def _relative_to(text: str, project: Any) -> str:
    """LoopX writes the project's absolute path into its commands; the agent's shell runs
    in the project, so the relative form is the same command without a local path."""
    prefix = str(project).rstrip("/") + "/"
    return text.replace(prefix, "")
