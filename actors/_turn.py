"""Turn: one turn of one agent, as a driver's turn body sees it.

A driver brings a ``TurnBody``; the agent's evaluator calls ``run_turn(turn)`` once per
turn, and the body asks the turn for each step (``begin_step`` / ``end_step``), records
what the model said (``record``) and logs the rest (``log``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from loopdock.runtime import AgentOptions, Event, Message, Transcript, Waterfall, message_to_wire
from loopdock.runtime.models import ModelRequest, RetryNotice, Usage
from loopdock.runtime.tools import AgentTools

from ._admission import Slot
from ._approvals import Approvals
from ._faults import record_fault
from ._inbox import Entry, ReservationState
from ._owner import AgentOwner
from ._pre_step import ENTER, PreStep, Reject, Verdict, enter
from ._session import SessionActor
from ._step_resume import ResumePoint

if TYPE_CHECKING:
    from opentelemetry.trace import Span


class TurnBlocked(Exception):
    """A pre-step listener rejected the step's messages: the turn ends ``blocked``, and
    its ``turn/end`` names them (``messageIds``: their effect, none, is then durable)."""

    def __init__(self, reason: str, message_ids: Sequence[str] = ()) -> None:
        super().__init__(reason)
        self.reason = reason
        self.message_ids = list(message_ids)


class TurnAgent(Protocol):
    """The part of an agent that its turns (and the drivers' turn bodies) use."""

    id: str
    session: SessionActor
    options: AgentOptions
    owner: AgentOwner
    tools: AgentTools
    prompt_sections: dict[str, str]
    pre_step: Waterfall[PreStep, Verdict]
    request: Waterfall[ModelRequest, ModelRequest]
    log: structlog.stdlib.BoundLogger
    approvals: Approvals

    @property
    def cwd(self) -> Path: ...

    @property
    def stopping(self) -> bool:
        """True once the agent is being stopped (disposed, or its runtime closing)."""

    @property
    def cancel_cause(self) -> str | None:
        """The cause given to ``cancel`` while the running turn is being cancelled."""

    @property
    def transcript(self) -> Transcript: ...

    async def acquire_slot(self) -> Slot | None:
        """An admission slot to compute again (None: a person's message is queued)."""

    def claim_step(self, held: Sequence[Entry] = ()) -> list[Entry]:
        """Claim ``held`` and every message queued for the next step; log the claims."""

    def has_step_input(self) -> bool:
        """True when messages wait for the next step (steer/inject)."""


class TurnBody(Protocol):
    """A driver's turn body. Returns the turn's end reason (``completed``, ``max-tokens``...)."""

    async def run_turn(self, turn: Turn) -> str: ...


class Turn:
    def __init__(self, agent: TurnAgent, number: int, first: list[Entry], slot: Slot | None = None) -> None:
        self.agent = agent
        self.number = number
        self.step = 0
        self._entries = first  # claimed but not yet through pre-step
        # An automatic turn's admission slot (actors._admission); a person's turn has none.
        self._slot = slot
        # The turn's ``invoke_agent`` span, parent of its model and tool calls' spans;
        # None when the runtime does not trace (runtime._tracing).
        self.span: Span | None = None
        #: The step a resumed turn finishes before its next model step (actors._step_resume),
        #: while it runs; None otherwise.
        self.resumed: ResumePoint | None = None
        #: Log ``tool/started`` (durable) before a call that is not read-only or idempotent
        #: starts: set when the agent's body resumes steps (actors._step_resume).
        self.marks_starts = False

    @property
    def holds_slot(self) -> bool:
        return self._slot is not None

    def outside(self) -> Outside:
        """``async with turn.outside():`` around a wait on the outside world (a model
        call, a tool, a network or CLI call): an automatic turn gives its admission slot
        back meanwhile and takes one again afterwards, so that waiting turns do not keep
        others (or people) from the CPU. A turn body that waits without it keeps its slot
        until the gate's stall limit uncounts it."""
        return Outside(self)

    def release_slot(self) -> None:
        slot, self._slot = self._slot, None
        if slot is not None:
            slot.release()

    @property
    def session(self) -> SessionActor:
        return self.agent.session

    def log(self, event_type: str, data: Mapping[str, Any]) -> Event:
        return self.agent.session.append(event_type, data)

    def has_step_input(self) -> bool:
        """True when messages wait for the next step (steer/inject): the turn goes on."""
        return self.agent.has_step_input()

    async def begin_step(self) -> tuple[Message, ...]:
        """Claim the step's inbox messages, run ``agent/pre-step``, then open the step.

        Each admitted message is passed through the owner's expanders (``/name`` skill
        invocations, ...) and what they return is recorded; returns the recorded messages.
        Raises TurnBlocked when a listener rejects (the claimed messages are consumed).
        """
        agent = self.agent
        # May wait on a worker thread: before the claim, so what arrives meanwhile enters too.
        await agent.owner.prepare_step()
        entries = agent.claim_step(self._entries)
        self._entries = entries
        messages = tuple(e.message for e in entries)
        verdict: Verdict = ENTER  # what the waterfall answers when nobody listens
        if agent.pre_step:
            pre = PreStep(agent.id, agent.id, self.number, self.step + 1, messages)
            try:
                verdict = await agent.pre_step.run(pre, enter)
            except Exception as exc:  # a broken gate fails closed
                record_fault(agent.session, "pre-step listener", exc, action="the step was rejected")
                verdict = Reject("pre-step listener failed")
        if isinstance(verdict, Reject):
            _settle(entries, "rejected", verdict.reason)
            self._entries = []
            raise TurnBlocked(verdict.reason, [m.id for m in messages])
        _settle(entries, "admitted", None)
        self._entries = []
        self.step += 1
        self.log("step/start", {"turn": self.number, "step": self.step})
        # Expanded only after admission: listeners judge what the person sent, and a
        # vetoed message must not leave an injected skill body behind.
        recorded = tuple(m for message in messages for m in agent.owner.expand(message))
        for message in recorded:
            self.record("user/message", message)
        return recorded

    def end_step(self) -> None:
        self.log("step/end", {"turn": self.number, "step": self.step})

    def record(self, event_type: str, message: Message, *, usage: Usage | None = None) -> Event:
        """Log a message event and add the message to the model-visible transcript.

        ``usage`` (what the model call that produced ``message`` cost) is kept beside the
        message as ``data.usage = {inputTokens, outputTokens}``, where DSH's log keeps it
        too: token counts and costs are then derivable from the log alone."""
        self.agent.transcript.append(message)
        data = message_to_wire(message)
        if usage is not None:
            data["usage"] = {"inputTokens": usage.input_tokens, "outputTokens": usage.output_tokens}
            if usage.cost is not None:
                data["usage"]["costUsd"] = usage.cost
        return self.log(event_type, data)

    def model_request(self) -> ModelRequest:
        agent, options = self.agent, self.agent.options

        async def on_retry(notice: RetryNotice) -> None:
            self.log(
                "llm/retry",
                {"turn": self.number, "attempt": notice.attempt, "delay": notice.delay, "error": notice.error},
            )

        system = "\n\n".join(
            part for part in [options.system_prompt, *agent.prompt_sections.values()] if part
        )
        return ModelRequest(
            provider=options.provider,
            model=options.model,
            system=system,
            messages=agent.transcript.snapshot(),
            tools=agent.tools.specs(),
            max_tokens=options.max_tokens,
            reasoning_effort=options.reasoning_effort,
            on_retry=on_retry,
        )

    def settle_unadmitted(self, reason: str) -> None:
        _settle(self._entries, "cancelled", reason)
        self._entries = []


class Outside:
    """See ``Turn.outside``."""

    __slots__ = ("_turn", "_had_slot")

    def __init__(self, turn: Turn) -> None:
        self._turn = turn
        self._had_slot = False

    async def __aenter__(self) -> None:
        self._had_slot = self._turn.holds_slot
        self._turn.release_slot()

    async def __aexit__(self, *exc_info: object) -> None:
        if self._had_slot and exc_info[0] is None:
            self._turn._slot = await self._turn.agent.acquire_slot()


def _settle(entries: list[Entry], state: ReservationState, reason: str | None) -> None:
    for entry in entries:
        if entry.reservation is not None:
            entry.reservation.settle(state, reason)
