"""ClusterRuntime: a harness process's view of agents anywhere in a cluster.

    async with loopdock.open_cluster("redis://127.0.0.1:6379/0") as rt:
        handle = await rt.create_agent(session_id="a1", loop="minimal-first")
        handle.agent.followup("hello")
        await handle.agent.wait_idle()
        async for event in handle.agent.events():
            ...

Messages go to the agent's shard as inbox entries (``followup`` returns at once, like the
embedded agent's; a sender task writes them in order; ``reserve`` returns a reservation
whose settlement ``wait()`` reads from the log), and events are read from the
session's log in Redis, so any process can watch any agent. A message the agent's worker
refuses is told to this client on its own stream (``refused:<client>``), which the log
watcher reads with the logs. Approval questions are folded from the log too; an answer is
a request to the agent's worker, replied on its reply key once durable (as create's).
Nothing here runs agents: ``loopdock worker --cluster`` does.
"""

from __future__ import annotations

import json
import math
import secrets
from collections.abc import AsyncIterator, Collection, Mapping
from contextlib import asynccontextmanager
from typing import Any

import attrs
import coredis
import trio

from loopdock.actors import (
    AgentReservation,
    Decision,
    InvalidReservationError,
    Placement,
    ReservationState,
    check_answer,
)
from loopdock.runtime import (
    MESSAGE_IDS,
    ApprovalClosedError,
    ClusterRequestError,
    Event,
    Message,
    MessageRefusedError,
    NoWorkerError,
    ProducerSource,
    SessionHeader,
    check_session_id,
    get_logger,
    is_human,
    message_to_wire,
    user_message,
)
from loopdock.runtime.cluster import (
    CONSUMING_TYPES,
    RETRYABLE,
    ClusterUnreachableError,
    InboxMessage,
    Ownership,
    RedisReplyError,
    RedisSessionStore,
    RespConnection,
    cluster_shards,
    connect,
    consumed_ids,
    decode_event,
    keys,
    live_workers,
)

log = get_logger(__name__)

_SEND_BATCH = 512
#: How long the log watcher blocks before it looks for sessions newly waited on.
_WATCH_BLOCK_MS = 20

#: How long ``create_agent``, ``resume_agent``, ``fork_session`` and ``dispose`` wait for
#: a worker's answer by default (their ``reply_timeout``; then NoWorkerError).
REPLY_TIMEOUT = 30.0
#: What ``wait_idle`` reads of a log: turns opening and closing, and messages consumed.
_IDLE_TYPES = CONSUMING_TYPES | {"turn/start"}
#: What the open approval questions are folded from.
_APPROVAL_TYPES = frozenset({"approval/requested", "approval/answered"})


def _fields(values: Mapping[Any, Any]) -> dict[str, str]:
    return {str(k): str(v) for k, v in values.items()}




@attrs.define(eq=False)
class _Outgoing:
    stream: str
    fields: dict[str, str]
    sent: trio.Event = attrs.field(factory=trio.Event)


@attrs.frozen
class Refusal:
    """A worker refused a message for an agent: its code and reason."""

    session_id: str
    code: str
    reason: str


@attrs.define(eq=False)
class _Waiter:
    session_id: str
    cursor: int
    types: Collection[str] | None
    #: Follows the session's marks (``runtime.cluster.mark_of``), not its log.
    marks: bool = False
    ready: trio.Event = attrs.field(factory=trio.Event)
    events: list[Event] = attrs.field(factory=list)
    read_marks: list[dict[str, Any]] = attrs.field(factory=list)
    next_cursor: int = 0


class LogWatcher:
    """One task that follows every session some caller waits on, with one blocking
    ``XREAD`` over all their logs (not one connection and one read per waiting agent),
    and, with ``refused`` (a client's refusal stream), the refusals workers tell the
    client: each is kept in ``refusals`` (message id -> Refusal, until its sender takes
    it) and wakes the waiters of its session."""

    def __init__(self, redis: coredis.Redis[str], refused: str | None = None, *, url: str | None = None) -> None:
        self._redis = redis
        #: With the cluster's ``url``, the reads go over a connection of their own (see
        #: runtime.cluster._resp); without, through coredis.
        self._reads = RespConnection(url) if url is not None else None
        self._waiters: dict[str, list[_Waiter]] = {}
        self._added = trio.Event()
        self._refused = refused
        self._refused_cursor = "0-0"
        self.refusals: dict[str, Refusal] = {}

    async def follow(
        self, session_id: str, cursor: int, types: Collection[str] | None = None
    ) -> tuple[list[Event], int]:
        """Once the session's log has entries from seq ``cursor`` on: those events (only
        those of ``types`` if given: the others are not even decoded), and the seq after
        the last entry read."""
        waiter = await self._wait(_Waiter(session_id, cursor, types), keys.log(session_id))
        return waiter.events, waiter.next_cursor

    async def follow_marks(self, session_id: str, cursor: int) -> tuple[list[dict[str, Any]], int]:
        """Once commits have added to the session's log from seq ``cursor`` on: their marks
        (``runtime.cluster.mark_of``: what a caller waiting for the agent to be idle needs
        of them, without their events), and the seq after the last event they added."""
        waiter = await self._wait(_Waiter(session_id, cursor, None, marks=True), keys.marks(session_id))
        return waiter.read_marks, waiter.next_cursor

    async def _wait(self, waiter: _Waiter, stream: str) -> _Waiter:
        self._waiters.setdefault(stream, []).append(waiter)
        self._added.set()
        try:
            await waiter.ready.wait()
        finally:
            self._forget(stream, waiter)  # cancelled; a served waiter is gone already
        return waiter

    def watched(self) -> set[str]:
        """The sessions some caller waits on now."""
        return {waiter.session_id for waiters in self._waiters.values() for waiter in waiters}

    def _forget(self, stream: str, waiter: _Waiter) -> None:
        waiting = self._waiters.get(stream, [])
        if waiter in waiting:
            waiting.remove(waiter)
        if not waiting:
            self._waiters.pop(stream, None)

    async def run(self) -> None:
        delay = 0.05
        while True:
            if not self._waiters:
                self._added = trio.Event()
                await self._added.wait()
                continue
            streams = {
                stream: keys.log_id(low - 1) if (low := min(w.cursor for w in waiters)) else "0-0"
                for stream, waiters in self._waiters.items()
            }
            if self._refused is not None:
                streams[self._refused] = self._refused_cursor
            try:
                reply = await self._xread(streams)
            except RETRYABLE as exc:  # Redis restarting: the waiters wait a little longer
                log.warning("redis unreachable; following the logs again soon", error=repr(exc))
                await trio.sleep(delay)
                delay = min(delay * 2, 1.0)
                continue
            delay = 0.05
            refused: set[str] = set()
            for stream, entries in reply.items():
                if stream == self._refused:
                    refused.update(self._take_refusals(entries))
                    continue
                # A log's entry ids are its events' (``log_id``); a mark's, its commit's
                # last event's.
                read = [(keys.seq_of(entry_id), fields) for entry_id, fields in entries]
                for waiter in list(self._waiters.get(stream, [])):
                    mine = [(seq, fields) for seq, fields in read if seq >= waiter.cursor]
                    if mine:
                        types = waiter.types
                        if waiter.marks:
                            waiter.read_marks = [json.loads(fields["k"]) for _, fields in mine]
                        else:
                            waiter.events = [decode_event(seq, fields) for seq, fields in mine
                                             if types is None or fields["t"] in types]
                        waiter.next_cursor = mine[-1][0] + 1
                        waiter.ready.set()
                        # Out of the watch at once: left in until its task runs, it
                        # would make the next XREAD return these entries again at once.
                        self._forget(stream, waiter)
            for session_id in refused:  # nothing new in the log: the waiters look again
                for stream in (keys.log(session_id), keys.marks(session_id)):
                    for waiter in list(self._waiters.get(stream, [])):
                        waiter.next_cursor = waiter.cursor
                        waiter.ready.set()
                        self._forget(stream, waiter)

    async def _xread(self, streams: dict[str, str]) -> dict[str, list[tuple[str, dict[str, str]]]]:
        """What ``streams`` have after their cursors (stream -> entry id and fields),
        waiting up to ``_WATCH_BLOCK_MS`` for something; empty if nothing came."""
        if self._reads is None:
            reply = await self._redis.xread(streams, block=_WATCH_BLOCK_MS)
            return {str(stream): [(str(e.identifier), _fields(e.field_values)) for e in entries]
                    for stream, entries in (reply or {}).items()}
        raw = await self._reads.call("XREAD", "BLOCK", _WATCH_BLOCK_MS, "STREAMS", *streams, *streams.values())
        return {stream: [(entry_id, dict(zip(flat[0::2], flat[1::2], strict=True))) for entry_id, flat in entries]
                for stream, entries in raw or ()}

    def _take_refusals(self, entries: list[tuple[str, dict[str, str]]]) -> set[str]:
        """Keep the refusals of the stream's ``entries``; the sessions they are for."""
        sessions = set()
        for entry_id, fields in entries:
            message_id, session_id = fields.get("id"), fields.get("session")
            if message_id and session_id:
                self.refusals[message_id] = Refusal(session_id, fields.get("code", "ERROR"), fields.get("reason", ""))
                sessions.add(session_id)
            self._refused_cursor = entry_id
        return sessions

    async def aclose(self) -> None:
        if self._reads is not None:
            await self._reads.aclose()


class ClusterRuntime:
    """A client of the cluster (``loopdock.open_cluster``): it creates, resumes and forks
    sessions on the workers and hands out ``RemoteAgent`` objects; it runs no agent."""

    def __init__(self, redis: coredis.Redis[str], shards: int, nursery: trio.Nursery, url: str | None = None) -> None:
        self._redis = redis
        #: With the cluster's ``url``, messages are written over a connection of their
        #: own (see runtime.cluster._resp); without, through coredis.
        self._sends = RespConnection(url) if url is not None else None
        self.shards = shards
        #: names this client to the workers, which tell it the messages they refuse
        self.client_id = secrets.token_hex(8)
        # Reads only: a client owns no shard, so it can never append to a log.
        self.store = RedisSessionStore(redis, Ownership("client", shards))
        self._send, receive = trio.open_memory_channel[_Outgoing](math.inf)
        self._last_sent = trio.Event()
        self._last_sent.set()
        self.watcher = LogWatcher(redis, keys.refused(self.client_id), url=url)
        nursery.start_soon(self._sender, receive)
        nursery.start_soon(self.watcher.run)

    @classmethod
    @asynccontextmanager
    async def open(cls, url: str) -> AsyncIterator[ClusterRuntime]:
        redis = connect(url)
        body_error: BaseException | None = None
        rt: ClusterRuntime | None = None
        try:
            async with redis, trio.open_nursery() as nursery:
                try:
                    shards = await cluster_shards(redis, None)
                except ClusterUnreachableError as exc:
                    body_error = exc  # raised below, as the body's own errors
                else:
                    rt = cls(redis, shards, nursery, url)
                    try:
                        yield rt
                        await rt.wait_sent()
                    except BaseException as exc:
                        # Re-raised below, outside the task groups, so that the caller sees its
                        # own exception rather than an ExceptionGroup around it.
                        body_error = exc
                    finally:
                        nursery.cancel_scope.cancel()
        finally:
            if rt is not None:  # its tasks are gone: nothing uses its connections any more
                await rt._aclose()
        if body_error is not None:
            raise body_error

    # -- agents ---------------------------------------------------------------------------

    async def create_agent(
        self,
        *,
        session_id: str,
        loop: str | None = None,
        driver: str | None = None,
        agent_options: Mapping[str, Any] | None = None,
        agent_preset: str | None = None,
        cwd: str | None = None,
        meta: Mapping[str, Any] | None = None,
        reply_timeout: float = REPLY_TIMEOUT,
    ) -> RemoteHandle:
        """Create an agent on the worker owning its shard; raises the worker's refusal
        (e.g. UNKNOWN_LOOP, SESSION_EXISTS) as ClusterRequestError."""
        body = {"loop": loop, "driver": driver, "agent_options": dict(agent_options or {}) or None,
                "agent_preset": agent_preset, "cwd": cwd, "meta": dict(meta) if meta else None}
        await self._request("create", check_session_id(session_id), body, reply_timeout)
        return RemoteHandle(RemoteAgent(self, session_id), self)

    async def resume_agent(
        self, *, resume_session_id: str, loop: str | None = None, driver: str | None = None,
        reply_timeout: float = REPLY_TIMEOUT,
    ) -> RemoteHandle:
        """Make a persisted session live again on its owner (LOOP_SWITCH if ``loop`` or
        ``driver`` is not the bound one)."""
        session_id = check_session_id(resume_session_id, what="resume session id")
        await self._request("resume", session_id, {"loop": loop, "driver": driver}, reply_timeout)
        return RemoteHandle(RemoteAgent(self, session_id), self)

    async def fork_session(
        self, source_id: str, new_id: str, *, upto_seq: int | None = None, reply_timeout: float = REPLY_TIMEOUT
    ) -> str:
        """Copy the longest prefix of a session that ends at a turn boundary (at or before
        ``upto_seq``) into a new one, as the embedded ``fork_session``; the worker owning
        the new session's shard makes it, durable when this returns. ``resume_agent``
        makes it live."""
        body = {"source": check_session_id(source_id, what="source session id"), "upto_seq": upto_seq}
        await self._request("fork", check_session_id(new_id), body, reply_timeout)
        return new_id

    def get_agent(self, agent_id: str) -> RemoteAgent:
        """A handle on ``agent_id``'s inbox and log (no check that it exists)."""
        return RemoteAgent(self, check_session_id(agent_id))

    async def list_sessions(self) -> list[SessionHeader]:
        return await self.store.alist_headers()

    async def read_events(self, session_id: str, start: int = 0) -> list[Event]:
        return await self.store.aload_events(session_id, start)

    async def _log_end(self, session_id: str) -> int:
        """The seq after the last event of the session's log now (0 for none)."""
        last = await self._redis.xrevrange(keys.log(session_id), "+", "-", count=1)
        return keys.seq_of(str(last[0].identifier)) + 1 if last else 0

    async def live_sessions(self) -> set[str]:
        """The sessions live in the cluster now: created or resumed, and not disposed
        (a session whose worker died stays live: the shard's next owner resumes it)."""
        return set(await self._redis.sunion([keys.live(shard) for shard in range(self.shards)]))

    async def workers(self) -> dict[str, str]:
        """The live workers, each with its registry fingerprint (its loops and drivers)."""
        return await live_workers(self._redis)

    # -- sending --------------------------------------------------------------------------

    def post(self, message: InboxMessage) -> trio.Event:
        """Queue ``message`` for its shard's inbox (written in order by the sender task);
        the event is set once it is in Redis."""
        shard = keys.shard_of(message.session, self.shards)
        outgoing = _Outgoing(keys.inbox(shard, message.lane), message.to_fields())
        self._send.send_nowait(outgoing)
        self._last_sent = outgoing.sent
        return outgoing.sent

    async def wait_sent(self) -> None:
        """Wait until everything posted so far is in Redis."""
        await self._last_sent.wait()

    async def _sender(self, receive: trio.MemoryReceiveChannel[_Outgoing]) -> None:
        async for first in receive:
            batch = [first]
            while len(batch) < _SEND_BATCH:
                try:
                    batch.append(receive.receive_nowait())
                except trio.WouldBlock:
                    break
            delay = 0.05
            while True:
                try:
                    await self._write(batch)
                    break
                except RETRYABLE as exc:
                    # Redis restarting: the batch waits, in order. Some of it may have
                    # landed already; the owner drops the second copy of a message id.
                    log.warning("redis unreachable; sending again soon", error=repr(exc))
                    await trio.sleep(delay)
                    delay = min(delay * 2, 1.0)
            for outgoing in batch:
                outgoing.sent.set()

    async def _write(self, batch: list[_Outgoing]) -> None:
        """Append ``batch`` to its streams, in order, in one round trip."""
        if self._sends is None:
            async with self._redis.pipeline(transaction=False) as pipe:
                for outgoing in batch:
                    pipe.xadd(outgoing.stream, outgoing.fields)
            return
        commands = [("XADD", o.stream, "*", *(x for pair in o.fields.items() for x in pair)) for o in batch]
        for reply in await self._sends.pipeline(commands):
            if isinstance(reply, RedisReplyError):
                raise reply

    async def _aclose(self) -> None:
        with trio.CancelScope(shield=True):
            await self.watcher.aclose()
            if self._sends is not None:
                await self._sends.aclose()

    async def _request(self, kind: str, session_id: str, body: Mapping[str, Any], reply_timeout: float) -> None:
        """Post a control message and wait for its worker's reply: a blocking pop on the
        reply key, for at most ``reply_timeout`` seconds (Redis's own deadline, in whole
        seconds), then NoWorkerError."""
        message = InboxMessage(MESSAGE_IDS.new(), kind, session_id, body)  # type: ignore[arg-type]
        self.post(message)
        await self.wait_sent()
        reply = await self._redis.blpop([keys.reply(message.id)], timeout=max(1, math.ceil(reply_timeout)))
        if reply is None:
            raise NoWorkerError(f"no worker answered {kind} {session_id!r} within {reply_timeout:g} s")
        answer = json.loads(reply[1])
        if not answer.get("ok"):
            raise ClusterRequestError(str(answer.get("code")), str(answer.get("error")))


@attrs.define(eq=False)
class RemoteHandle:
    agent: RemoteAgent
    _rt: ClusterRuntime

    async def dispose(self, reply_timeout: float = REPLY_TIMEOUT) -> None:
        """Deactivate the agent on its worker (its session stays; resume brings it back)."""
        await self._rt._request("dispose", self.agent.id, {}, reply_timeout)


class RemoteAgent:
    """An agent some worker runs, as this client reaches it; it keeps the ``Agent``
    contract (``loopdock.Agent``). Every operation returns at once and is carried out by
    the agent's worker; ``wait_idle`` and ``reservation.wait()`` read from the session's
    log how it went, and learn from the worker the messages it refused. Each object
    follows what was sent through it (``get_agent`` gives a new one each time), and the
    approval questions of the log as far as it has read them (``wait_approvals``)."""

    def __init__(self, rt: ClusterRuntime, session_id: str) -> None:
        self.id = session_id
        self._rt = rt
        self._outstanding: dict[str, None] = {}  # sent, not yet in the log nor refused; oldest first
        self._reservations: dict[str, RemoteReservation] = {}  # message id -> unsettled reservation
        self._refused: list[MessageRefusedError] = []  # not raised yet, oldest first
        self._cursor = 0  # the next seq of the log not folded yet
        self._open_turn = False
        self._sent = trio.Event()
        self._sent.set()
        # The approval questions open in the log up to ``_approvals_cursor``, oldest first.
        self._approvals: dict[str, RemoteApproval] = {}
        self._approvals_cursor = 0

    def followup(self, message: str | Message) -> Message:
        """Queue for the next turn and wake the agent."""
        return self._queue("followup", message)

    def steer(self, message: str | Message) -> Message:
        """Queue for the next step and wake the agent."""
        return self._queue("steer", message)

    def inject(self, message: str | Message) -> Message:
        """Queue for the next step without waking an idle agent."""
        return self._queue("inject", message)

    def reserve(self, message: Message, placement: Placement = "followup") -> RemoteReservation:
        """Queue an automatic message and return its reservation, as the embedded agent's
        ``reserve``: admitted when it enters a model step, rejected at pre-step, or
        cancelled (a person's input came first, a cancel, a withdrawal, the worker refused
        it). Only producer sources reserve. Its state is read from the session's log
        (``await wait()``)."""
        if not isinstance(message.source, ProducerSource):
            raise InvalidReservationError(f"only producer-owned sources reserve; got {message.source!r}")
        cursor = self._cursor  # its id is new: nothing before this point of the log names it
        self._queue("reserve", message, placement)
        reservation = self._reservations[message.id] = RemoteReservation(message, placement, self, cursor)
        return reservation

    def withdraw(self, reservation: AgentReservation, reason: str = "withdrawn") -> None:
        """Cancel ``reservation`` if it is still queued when the agent's worker gets to
        this (after the reservation itself: both travel on the ``auto`` lane). Unlike the
        embedded ``withdraw`` this cannot tell at once whether it was still queued:
        ``await reservation.wait()`` says, ``cancelled`` with ``reason`` if it was,
        otherwise how it was settled before."""
        body = {"message_id": reservation.message.id, "reason": reason}
        self._sent = self._rt.post(InboxMessage(MESSAGE_IDS.new(), "withdraw", self.id, body, "auto"))

    def cancel(self, cause: str = "cancelled", *, keep_inbox: bool = True) -> None:
        """End the running turn ``aborted`` with ``cause`` when the worker gets to this;
        with ``keep_inbox=False`` also discard what is queued by then."""
        body = {"cause": cause, "keep_inbox": keep_inbox}
        self._sent = self._rt.post(InboxMessage(MESSAGE_IDS.new(), "cancel", self.id, body))

    async def wait_idle(self) -> None:
        """Wait until every message sent through this object has been taken (it entered
        the log, was discarded, or, an inject, was queued: it wakes nobody) or refused,
        and the agent's last turn has ended; then raise MessageRefusedError for the
        oldest refusal not raised yet."""
        await self._sent.wait()
        self._take_refusals()
        watcher = self._rt.watcher
        # With a message outstanding there is something to wait for: the watcher's read
        # brings everything from the cursor on, so a catch-up read first would only
        # read it twice. Otherwise the log may have moved on (a turn someone else
        # started): read it up to now.
        events: list[Event] = []
        marks: list[dict[str, Any]] = []
        if not self._outstanding:
            events = await self._rt.store.aload_events(self.id, self._cursor)
            cursor = events[-1].seq + 1 if events else self._cursor
        elif self._reservations:
            events, cursor = await watcher.follow(self.id, self._cursor, _IDLE_TYPES)
        else:
            marks, cursor = await watcher.follow_marks(self.id, self._cursor)
        while True:
            for event in events:
                self._fold(event)
            for mark in marks:
                self._fold_mark(mark)
            self._cursor = cursor
            self._take_refusals()
            if not self._outstanding and not self._open_turn:
                break
            # A reservation is settled from its events (admitted, rejected with the
            # listener's reason, ...): with one unsettled, follow the log itself;
            # otherwise its marks, one small entry per commit instead of every event.
            events, marks = [], []
            if self._reservations:
                events, cursor = await watcher.follow(self.id, self._cursor, _IDLE_TYPES)
            else:
                marks, cursor = await watcher.follow_marks(self.id, self._cursor)
        if self._refused:
            raise self._refused.pop(0)

    async def events(self, start: int = 0) -> AsyncIterator[Event]:
        """The session's events from seq ``start`` on, then each new one as it is durable."""
        events = await self._rt.store.aload_events(self.id, start)
        cursor = start
        while True:
            for event in events:
                yield event
                cursor = event.seq + 1
            events, _ = await self._rt.watcher.follow(self.id, cursor)

    def pending_approvals(self) -> list[RemoteApproval]:
        """The approval questions open in the session's log as far as this object has
        read it (``wait_approvals`` reads it up to now, and so does every ``answer``
        given through it), oldest first; ``await a.answer(...)`` each."""
        return list(self._approvals.values())

    async def wait_approvals(self) -> list[RemoteApproval]:
        """Wait until an approval question is open in the session's log; the open ones,
        oldest first. Always a checkpoint."""
        await self._read_approvals()
        while not self._approvals:
            events, cursor = await self._rt.watcher.follow(self.id, self._approvals_cursor, _APPROVAL_TYPES)
            self._fold_approvals(events, cursor)
        return self.pending_approvals()

    async def _read_approvals(self) -> None:
        """Fold the questions asked and answered in the log up to now."""
        stop = await self._rt._log_end(self.id)
        events = await self._rt.store.aload_events(self.id, self._approvals_cursor, stop, _APPROVAL_TYPES)
        self._fold_approvals(events, stop)

    def _fold_approvals(self, events: list[Event], cursor: int) -> None:
        """Fold ``events`` (the approval events of the log before seq ``cursor``); each
        event once, whichever read brings it first."""
        for event in events:
            if event.seq < self._approvals_cursor:
                continue
            data = event.data
            if event.type == "approval/requested":
                turn = data.get("turn")
                self._approvals[str(data.get("id"))] = RemoteApproval(
                    str(data.get("id")), str(data.get("callId")), str(data.get("tool")),
                    dict(data.get("arguments") or {}), str(data.get("reason", "")),
                    turn if isinstance(turn, int) else None, self,
                )
            elif event.type == "approval/answered":
                self._approvals.pop(str(data.get("id")), None)
            self._approvals_cursor = event.seq + 1
        self._approvals_cursor = max(self._approvals_cursor, cursor)

    def _queue(self, kind: str, message: str | Message, placement: Placement | None = None) -> Message:
        if isinstance(message, str):
            message = user_message(message)
        self._outstanding[message.id] = None
        # People's input on its own lane, taken first; everything else is a program's.
        lane = "human" if message.source is not None and is_human(message.source) else "auto"
        body: dict[str, Any] = {"message": message_to_wire(message), "client": self._rt.client_id}
        if placement is not None:
            body["placement"] = placement
        wire = InboxMessage(message.id, kind, self.id, body, lane)  # type: ignore[arg-type]
        self._sent = self._rt.post(wire)
        return message

    def _fold(self, event: Event) -> None:
        if event.type == "turn/start":
            self._open_turn = True
        elif event.type == "turn/end":
            self._open_turn = False
        elif event.type == "agent/inbox/spliced" and event.data.get("op") == "insert" \
                and event.data.get("placement") == "inject":
            # Queued, and it wakes nobody: nothing more to wait for (in a running turn,
            # the open turn is).
            self._outstanding.pop(str(event.data.get("messageId")), None)
        for message_id in consumed_ids([event]):
            self._outstanding.pop(message_id, None)
            reservation = self._reservations.pop(message_id, None)
            if reservation is not None:
                reservation._settle(event)

    def _fold_mark(self, mark: Mapping[str, Any]) -> None:
        """``_fold`` of a commit's events, from its mark (no reservation is unsettled)."""
        for message_id in (*mark.get("c", ()), *mark.get("i", ())):
            self._outstanding.pop(str(message_id), None)
        if mark.get("o") is not None:
            self._open_turn = bool(mark["o"])

    def _take_refusals(self) -> None:
        """Take the refusals of messages sent through this object from the watcher."""
        refusals = self._rt.watcher.refusals
        if not refusals:
            return
        for message_id in [m for m in self._outstanding if m in refusals]:
            refusal = refusals.pop(message_id)
            del self._outstanding[message_id]
            reservation = self._reservations.pop(message_id, None)
            if reservation is not None:
                reservation._refuse(refusal)
            else:
                self._refused.append(MessageRefusedError(message_id, refusal.code, refusal.reason))


@attrs.define(eq=False)
class RemoteApproval:
    """An approval question of an agent some worker runs, as ``pending_approvals()``
    lists it: the embedded ``Approval``'s fields, from the log's ``approval/requested``."""

    id: str
    call_id: str
    tool: str
    arguments: Mapping[str, Any]
    reason: str  # why the policy asks
    turn: int | None
    _agent: RemoteAgent = attrs.field(repr=False)

    async def answer(
        self, decision: Decision, *, reason: str | None = None, arguments: Mapping[str, Any] | None = None,
        reply_timeout: float = REPLY_TIMEOUT,
    ) -> None:
        """Answer the question, as the embedded ``approval.answer``: the agent's worker
        gives the answer, and this returns once it is durable. Raises
        ApprovalClosedError (``APPROVAL_CLOSED``) if the question is not open (another
        answer won, it was withdrawn, or never asked), ClusterRequestError with the
        worker's code if the agent cannot be reached (``SESSION_NOT_FOUND``, say), and
        NoWorkerError if no worker answered within ``reply_timeout`` seconds (then the
        answer may still be given when a worker gets to it: ``pending_approvals()``
        after ``wait_approvals``, or the log, tells)."""
        check_answer(decision, reason, arguments)
        agent = self._agent
        body: dict[str, Any] = {"approval": self.id, "decision": decision}
        if reason is not None:
            body["reason"] = reason
        if arguments is not None:
            body["arguments"] = dict(arguments)
        try:
            await agent._rt._request("answer", agent.id, body, reply_timeout)
        except ClusterRequestError as exc:
            if exc.code != ApprovalClosedError.code:
                raise
            await agent._read_approvals()
            raise ApprovalClosedError(str(exc)) from None
        await agent._read_approvals()


@attrs.define(eq=False)
class RemoteReservation:
    """A reservation on an agent some worker runs. ``state`` and ``reason`` are the
    embedded ``Reservation``'s, known once ``wait()`` (or the agent's ``wait_idle``) has
    read them from the log: its ``user/message`` (admitted), the ``blocked``
    ``turn/end`` naming it (rejected, with the listener's reason), or its discard from the
    inbox (cancelled, with why); or from the worker's refusal (cancelled)."""

    message: Message
    placement: Placement
    _agent: RemoteAgent
    _cursor: int
    state: ReservationState = "pending"
    reason: str | None = None

    async def wait(self) -> ReservationState:
        """Wait until the reservation is settled; its final state."""
        agent = self._agent
        rt, session_id = agent._rt, agent.id
        agent._take_refusals()
        if self.state != "pending":
            return self.state
        events = await rt.store.aload_events(session_id, self._cursor)
        cursor = events[-1].seq + 1 if events else self._cursor
        while self.state == "pending":
            for event in events:
                self._settle(event)
            self._cursor = cursor
            agent._take_refusals()
            if self.state == "pending":
                events, cursor = await rt.watcher.follow(session_id, self._cursor, CONSUMING_TYPES)
        agent._reservations.pop(self.message.id, None)
        return self.state

    def _settle(self, event: Event) -> None:
        if self.state != "pending" or self.message.id not in consumed_ids([event]):
            return
        if event.type == "user/message":
            self.state = "admitted"
        elif event.type == "turn/end":
            self.state, self.reason = "rejected", str(event.data["reason"].get("reason"))
        else:
            reason = event.data.get("reason")
            self.state, self.reason = "cancelled", reason if isinstance(reason, str) else None

    def _refuse(self, refusal: Refusal) -> None:
        if self.state == "pending":
            self.state, self.reason = "cancelled", f"the host did not take it: {refusal.code}: {refusal.reason}"
