"""``Agent``: the one contract of every agent a caller talks to.

Three kinds keep it, with the same meaning for each operation: the in-process
``AgentActor`` (``Runtime.create_agent``), a cluster's ``RemoteAgent``
(``open_cluster(url).create_agent``; the agent runs on a worker) and a DSH host's
``DshAgent`` (the runtime's proxy of a live DSH agent). Where an agent runs elsewhere,
its operations return before the host has carried them out; ``wait_idle`` is where a
caller learns how they went.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from loopdock.runtime import Message

from ._inbox import Placement, ReservationState


@runtime_checkable
class AgentReservation(Protocol):
    """An automatic message's claim on an agent, settled exactly once: ``admitted`` (it
    entered a model step), ``rejected`` (vetoed at pre-step; ``reason`` is the veto's) or
    ``cancelled`` (a person's input came first, a cancel, a withdrawal, the agent went
    away, or its host refused the message; ``reason`` says which)."""

    @property
    def message(self) -> Message: ...

    @property
    def state(self) -> ReservationState:
        """``pending`` until settled; then the final state."""

    @property
    def reason(self) -> str | None: ...

    async def wait(self) -> ReservationState:
        """Wait until the reservation is settled; its final state."""


@runtime_checkable
class Agent(Protocol):
    """What every agent offers its callers (see the module docstring for the kinds).

    A ``str`` given as a message is always a person's message (``user_message(text)``:
    source ``user``), whichever the kind. Messages whose source is a person's are taken
    before automatic ones. Sending to an agent known to be gone raises AgentClosedError
    (``AGENT_CLOSED``) at once; a message the agent's host refuses later (a cluster worker
    that cannot activate the session, a DSH host that answers an error) makes the next
    ``wait_idle`` raise MessageRefusedError (``MESSAGE_REFUSED``).
    """

    @property
    def id(self) -> str:
        """The agent's id, which is its session's id."""

    def followup(self, message: str | Message) -> Message:
        """Queue ``message`` for the agent's next turn and wake it; returns the message
        queued (its ``id`` is how the session log names it)."""

    def steer(self, message: str | Message) -> Message:
        """Queue ``message`` for the next step (the running turn's, else a new turn's)
        and wake the agent."""

    def inject(self, message: str | Message) -> Message:
        """Queue ``message`` for the next step without waking an idle agent: it enters
        the running turn's next step, or the first step of whatever turn comes next."""

    def cancel(self, cause: str = "cancelled", *, keep_inbox: bool = True) -> None:
        """End the running turn ``aborted`` with ``cause``; with ``keep_inbox=False``
        also discard every queued message (queued reservations settle ``cancelled``)."""

    def reserve(self, message: Message, placement: Placement = "followup") -> AgentReservation:
        """Queue an automatic message (its source a ``ProducerSource``, else
        InvalidReservationError) at ``placement`` and return its reservation, admitted
        when the message enters a model step and cancelled if a person's input comes
        first."""

    def withdraw(self, reservation: AgentReservation, reason: str = "withdrawn") -> bool | None:
        """Cancel ``reservation`` if it is still queued (it settles ``cancelled`` with
        ``reason``; ``await reservation.wait()`` says how it ended either way). Returns
        whether it was still queued where the agent can tell at once (in-process and DSH
        agents), None where it cannot (a cluster agent)."""

    async def wait_idle(self) -> None:
        """Wait until every message sent through this object has reached the agent's
        inbox or been refused, and the agent is idle with nothing queued that would wake
        it (or it is gone): whatever was sent to wake it has run. Then raise
        MessageRefusedError for the oldest refusal not raised yet, if there is one.
        Always a checkpoint."""
