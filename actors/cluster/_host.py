"""ShardHost: the actor that runs a worker's agents from its shards' inboxes.

One reader task serves every shard the worker owns: it reads both lanes of all of them
with one ``XREADGROUP`` and handles the ``human`` entries of a batch before the ``auto``
ones, one entry at a time, so a session's messages keep their order. Which entries of a
batch were done already is asked of Redis once for the whole batch, and the agents its
messages go to are made live before any is handed over; then handing over the messages
of the ``auto`` lane awaits nothing (a withdrawal is settled in the background, a
duplicate acknowledged after the batch; only a message refused with an error is answered
at once), so they are all in their agents' inboxes before any agent runs: a withdrawal
read with its reservation finds it queued. Agents are
activated on demand (Orleans' virtual actors): a message for a session with no live agent
resumes it on its bound loop and driver.

Agents idle for ``passivate_after`` are passivated as in one process, by the same policy
(the runtime's ``Lifecycle``: only a quiescent agent, and when it is due), but let go of
here (``release``): the agent is disposed (its session flushed), then its session is
marked passivated on its shard (``passive:<shard>``) by a script fenced on the lease.
Its next message activates it again through ``_activate``, which unmarks it, fenced
likewise, before the agent is rebuilt: a session marked passivated has no agent anywhere
and no turn open in its log.

Taking over a shard (``acquired``), before reading anything new from it, the host resumes
every session that was live on it and not passivated (``live:<shard>`` minus
``passive:<shard>``: a turn that was running goes on, or is closed ``interrupted``, by
the resume) and claims the entries the previous owner had read but not acknowledged
(``XAUTOCLAIM``). It reclaims stranded entries every lease period too, e.g. ones a paused
ex-owner read after it lost the shard.

Delivery is at least once; processing is once per message id: an id the session has
recorded as done (``done``), or one already handed to a live agent, is dropped. A
followup/steer/inject is acknowledged by the commit that makes its ``user/message`` (or
its discard) durable, a control message once its effect is (see runtime.cluster).

A message for an agent that cannot be handed over (its session cannot be activated, the
message is malformed) is refused: recorded as done, and told to its sender, whose
``wait_idle`` reads it (the client names itself in the message: ``client``), in the
same script, so a refusal is told exactly when the message is done (never for a message
a next owner still processes). Create/resume/fork/dispose, and a person's answer to an
approval question (``answer``), are answered on their reply key.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, cast, get_args

import coredis
import trio

from loopdock.runtime import (
    LoopdockError,
    SessionExistsError,
    SessionNotFoundError,
    get_logger,
    message_from_wire,
    safe_message,
)
from loopdock.runtime.cluster import (
    DONE,
    RETRYABLE,
    SETTLE,
    BadInboxMessageError,
    InboxMessage,
    Ownership,
    Pending,
    RedisReplyError,
    RedisSessionStore,
    RespConnection,
    keys,
)

from .._driver import AgentHandle, CreateAgentOptions, ResumeAgentOptions
from .._inbox import Placement
from .._supervisor import Supervisor
from ..dock import LoopDock

log = get_logger(__name__)

#: How long the reader blocks on Redis before it looks at its shards again.
READ_BLOCK_MS = 200
READ_COUNT = 256
#: The least time from one read of the inboxes to the next while messages keep coming
#: (seconds): under load one read (and one duplicate check) serves the messages of
#: several turns. A message waits at most this much longer; a full batch is followed at once.
READ_WINDOW = 0.004
#: How long a reply to ``create``/``resume`` waits in Redis for its requester.
REPLY_TTL_MS = 60_000
#: The kinds of message handed to an agent, which is activated for them if need be.
_TO_AGENTS = frozenset({"followup", "steer", "inject", "reserve"})
#: The kinds that make a session live or not themselves.
_CONTROLS_ACTIVATION = frozenset({"create", "resume", "fork", "dispose"})
#: How long a client's refusal stream waits in Redis for it to read it, and how many
#: refusals it keeps (about: trimmed with ``MAXLEN ~``).
REFUSAL_TTL_MS = 24 * 3600 * 1000
REFUSALS_KEPT = 10_000
#: What a client id may be (it is part of a key).
_CLIENT_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


class ShardHost:
    def __init__(
        self,
        redis: coredis.Redis[str],
        store: RedisSessionStore,
        supervisor: Supervisor,
        dock: LoopDock,
        *,
        ttl: float,
        url: str | None = None,
    ) -> None:
        self._redis = redis
        #: With the cluster's ``url``: the inbox reads and the duplicate checks, a turn's
        #: round trips, go over a connection of their own (see runtime.cluster._resp).
        self._reads = RespConnection(url) if url is not None else None
        self._done_sha: str | None = None
        self.store = store
        self.ownership: Ownership = store.ownership
        self.supervisor = supervisor
        self.dock = dock
        self.ttl = ttl
        self._settle = redis.register_script(SETTLE)
        self._done_script = redis.register_script(DONE)
        self.handles: dict[str, AgentHandle] = {}
        self._fresh: list[int] = []  # acquired, not yet taken over
        self._ready: set[int] = set()  # taken over: read from
        self._draining: set[int] = set()
        self._disposing: dict[str, trio.Event] = {}  # session -> set once its agent has stopped
        self._wake = trio.Event()
        self._nursery: trio.Nursery | None = None

    # -- called by the lease keeper ------------------------------------------------------

    async def acquired(self, shard: int) -> None:
        for lane in keys.LANES:
            try:
                await self._redis.xgroup_create(keys.inbox(shard, lane), keys.GROUP, identifier="0", mkstream=True)
            except coredis.exceptions.StreamDuplicateConsumerGroupError:
                pass  # made by an earlier owner
        self._fresh.append(shard)
        self._wake.set()

    async def drain(self, shard: int) -> None:
        """Stop reading ``shard``, give its agents up to a quarter lease to go idle, then
        dispose them (their sessions stay live on the shard for the next owner). With
        passivation on, a quiescent one is passivated instead: the next owner does not
        resume it until its next message."""
        self._draining.add(shard)
        self._ready.discard(shard)
        try:
            agents = self._agents_of(shard)
            with trio.move_on_after(self.ttl / 4):
                for session_id in agents:
                    handle = self.handles.get(session_id)
                    if handle is not None:
                        await handle.agent.wait_idle()
            lifecycle = self.supervisor.lifecycle
            for session_id in agents:
                handle = self.handles.get(session_id)
                if handle is not None and lifecycle.passivate_after is not None \
                        and lifecycle.why_active(handle.agent) is None:
                    # Even during a batch: the shard is read no more, and disposing it does no better.
                    await self._release(handle.agent)
                await self._dispose(session_id)  # if it is still here
        finally:
            self._draining.discard(shard)
            self.ownership.forget(shard)

    def lost(self, shard: int) -> None:
        """The lease is gone: stop the shard's agents at once (their writes are fenced)."""
        self._ready.discard(shard)
        self.ownership.forget(shard)
        if shard in self._fresh:
            self._fresh.remove(shard)
        for session_id in self._agents_of(shard):
            # At once, before they stop: nothing they write from now on is durable, even
            # if this worker takes the shard again before they have stopped.
            self.ownership.active.pop(session_id, None)
            if self._nursery is None:
                continue
            begun = self._begin_dispose(session_id)
            if begun is not None:
                self._nursery.start_soon(self._finish_dispose, session_id, *begun)

    # -- the reader ---------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            delay = 0.05
            while True:
                try:
                    await self._read()
                except RETRYABLE as exc:
                    # Redis restarting or out of reach: the entries stay in their streams.
                    log.warning("redis unreachable; reading again soon", error=repr(exc))
                    await trio.sleep(delay)
                    delay = min(delay * 2, 1.0)

    async def _read(self) -> None:
        next_reclaim = trio.current_time() + self.ttl
        while True:
            while self._fresh:
                shard = self._fresh[0]
                await self._take_over(shard)
                self._fresh.pop(0)
                if shard in self.ownership.tokens:
                    self._ready.add(shard)
            if trio.current_time() >= next_reclaim:
                for shard in self._reading():
                    await self._claim(shard, min_idle_ms=round(self.ttl * 1000))
                next_reclaim = trio.current_time() + self.ttl
            reading = self._reading()
            if not reading:
                self._wake = trio.Event()
                with trio.move_on_after(READ_BLOCK_MS / 1000):
                    await self._wake.wait()
                continue
            streams = {keys.inbox(shard, lane): ">" for lane in keys.LANES for shard in reading}
            started = trio.current_time()
            try:
                batch = await self._read_group(streams)
            except (coredis.exceptions.StreamConsumerGroupError, _NoGroupError):
                # Redis lost its data (restarted without its append-only file):
                # make the groups again.
                for shard in reading:
                    await self.acquired(shard)
                continue
            if batch:
                await self._handle_batch(batch)
                if max(len(entries) for entries in batch.values()) < READ_COUNT:
                    await trio.sleep_until(started + READ_WINDOW)

    async def _read_group(self, streams: dict[str, str]) -> dict[str, list[tuple[str, dict[str, str]]]]:
        """New entries of ``streams`` for this worker's consumer: stream -> (entry id,
        fields); empty after ``READ_BLOCK_MS`` without any."""
        if self._reads is None:
            reply = await self._redis.xreadgroup(
                keys.GROUP, self.ownership.worker, streams, count=READ_COUNT, block=READ_BLOCK_MS
            )
            return {str(stream): [(str(e.identifier), _fields(e.field_values)) for e in entries]
                    for stream, entries in (reply or {}).items()}
        try:
            raw = await self._reads.call(
                "XREADGROUP", "GROUP", keys.GROUP, self.ownership.worker, "COUNT", READ_COUNT,
                "BLOCK", READ_BLOCK_MS, "STREAMS", *streams, *streams.values(),
            )
        except RedisReplyError as exc:
            if str(exc).startswith("NOGROUP"):
                raise _NoGroupError(str(exc)) from None
            raise
        return {stream: [(entry_id, _pairs(flat or [])) for entry_id, flat in entries] for stream, entries in raw or ()}

    def _reading(self) -> list[int]:
        return [s for s in sorted(self.ownership.tokens) if s in self._ready and s not in self._draining]

    async def _handle_batch(self, batch: Mapping[str, list[tuple[str, dict[str, str]]]]) -> None:
        by_lane: dict[str, list[tuple[int, tuple[str, dict[str, str]]]]] = {lane: [] for lane in keys.LANES}
        for stream, entries in batch.items():
            _, _, rest = stream.partition(keys.PREFIX + "inbox:")
            shard_text, _, lane = rest.partition(":")
            by_lane[lane].extend((int(shard_text), entry) for entry in entries)
        await self._handle_entries([(shard, lane, *entry) for lane in keys.LANES for shard, entry in by_lane[lane]])

    async def _handle_entries(self, entries: Sequence[tuple[int, str, str, dict[str, str]]]) -> None:
        """Handle inbox entries ``(shard, lane, entry id, fields)`` in order (see the module doc)."""
        parsed: list[tuple[int, str, str, InboxMessage | BadInboxMessageError]] = []
        for shard, lane, entry_id, fields in entries:
            try:
                message = InboxMessage.from_fields(fields)
                if self.ownership.shard(message.session) != shard:
                    raise BadInboxMessageError(f"message for session {message.session[:80]!r} is on shard {shard}")
            except BadInboxMessageError as exc:
                parsed.append((shard, lane, entry_id, exc))
            else:
                parsed.append((shard, lane, entry_id, message))
        # What this worker settles from here on is remembered: the done set read below
        # would not show it, and a message settled meanwhile is no longer pending.
        self.ownership.settled_since = set()
        try:
            done = await self._done([m for *_, m in parsed if isinstance(m, InboxMessage)])
            await self._activate_for([m for *_, m in parsed if isinstance(m, InboxMessage) and m.id not in done])
            dropped: dict[str, list[str]] = {}  # stream -> entries to acknowledge as they are
            for shard, lane, entry_id, item in parsed:
                await self._handle(shard, lane, entry_id, item, done, dropped)
            for stream, entry_ids in dropped.items():  # after the batch: nothing waits in it
                await self._redis.xack(stream, keys.GROUP, entry_ids)
        finally:
            self.ownership.settled_since = None

    async def _activate_for(self, messages: Sequence[InboxMessage]) -> None:
        """Make live, before any message of the batch is handed over, the agents its
        messages go to, so that handing them over awaits nothing. Best effort: an agent
        that cannot be activated is tried again, and refused, at its message. Not for a
        session the batch also creates, resumes, forks or disposes: those messages
        activate it themselves, in order (a resume checks the loop it names)."""
        wanted: dict[str, None] = {}
        for message in messages:
            if message.kind in _TO_AGENTS and message.id not in self.ownership.pending:
                wanted[message.session] = None
        for message in messages:
            if message.kind in _CONTROLS_ACTIVATION:
                wanted.pop(message.session, None)
        now = trio.current_time()
        for session_id in wanted:
            live = self.handles.get(session_id)
            if live is not None and not live.agent.closed:
                continue
            if self.ownership.holds(self.ownership.shard(session_id), now) is None:
                continue
            try:
                await self._activate(session_id)
            except Exception:  # its messages are refused when handled, with the reason
                continue

    async def _done(self, messages: Sequence[InboxMessage]) -> set[str]:
        """The ids of ``messages`` their sessions have recorded as done, in one call."""
        if not messages:
            return set()
        done_keys = [keys.done(m.session) for m in messages]
        ids = [m.id for m in messages]
        answer: Any
        if self._reads is None:
            answer = await self._done_script(keys=done_keys, args=ids)
        else:
            if self._done_sha is None:
                self._done_sha = str(await self._reads.call("SCRIPT", "LOAD", DONE))
            try:
                answer = await self._reads.call("EVALSHA", self._done_sha, len(done_keys), *done_keys, *ids)
            except RedisReplyError as exc:
                if not exc.no_script:
                    raise
                self._done_sha = None  # Redis restarted: its script cache is empty
                return await self._done(messages)
        return {m.id for m, done in zip(messages, answer, strict=True) if int(done)}  # one answer per message

    async def _take_over(self, shard: int) -> None:
        if shard not in self.ownership.tokens:
            return
        # Not the passivated ones: their logs have no turn open, and their next message
        # activates them (a million idle agents cost a takeover nothing).
        resumed = 0
        for session_id in sorted(await self._redis.sdiff([keys.live(shard), keys.passive(shard)])):
            if self.ownership.shard(session_id) == shard and session_id not in self.handles:
                try:
                    await self._activate(session_id)
                except Exception as exc:
                    log.warning("could not resume a session of an acquired shard", session=session_id, error=repr(exc))
                else:
                    resumed += 1
        await self._claim(shard, min_idle_ms=0)
        log.info("shard taken over", shard=shard, resumed=resumed)

    async def _claim(self, shard: int, *, min_idle_ms: int) -> None:
        for lane in keys.LANES:
            start = "0-0"
            while shard in self.ownership.tokens:
                reply = await self._redis.xautoclaim(
                    keys.inbox(shard, lane), keys.GROUP, self.ownership.worker, min_idle_ms, start, count=READ_COUNT
                )
                start, entries = str(reply[0]), reply[1]
                await self._handle_entries(
                    [(shard, lane, str(entry.identifier), _fields(entry.field_values)) for entry in entries])
                if start == "0-0":
                    break

    async def _handle(
        self, shard: int, lane: str, entry_id: str, message: InboxMessage | BadInboxMessageError, done: set[str],
        dropped: dict[str, list[str]],
    ) -> None:
        """``done``: which of the batch's ids were done when it was read (what was settled
        since is in ``ownership.settled_since``); entries dropped as they are (bad ones,
        duplicates) go to ``dropped``, acknowledged after the batch."""
        token = self.ownership.holds(shard, trio.current_time())
        if token is None:
            return  # lost meanwhile: the entry stays pending, and the next owner reclaims it
        stream = keys.inbox(shard, lane)
        if isinstance(message, BadInboxMessageError):
            log.warning("dropping a bad inbox entry", stream=stream, entry=entry_id, error=str(message))
            dropped.setdefault(stream, []).append(entry_id)
            return
        handed = self.ownership.pending.get(message.id)
        if handed is not None:
            # Handed to its agent already (its commit acknowledges that entry); another
            # entry with the same id is a producer's retry.
            if handed.entry_id != entry_id:
                dropped.setdefault(stream, []).append(entry_id)
            return
        if message.id in done or message.id in (self.ownership.settled_since or ()):
            dropped.setdefault(stream, []).append(entry_id)
            return
        try:
            await self._dispatch(message, token, lane, entry_id)
        except Exception as exc:
            if message.kind == "answer" and self.ownership.holds(shard, trio.current_time()) is None:
                # The shard moved meanwhile: whether the answer is durable is the log's to
                # say, and the next owner, which gets this request again, says it.
                log.info("answer left to the next owner", session=message.session, error=repr(exc))
                return
            # One bad message never stops the shard: it is answered (if asked) or its
            # refusal told to its sender, and dropped.
            log.warning("inbox message failed", kind=message.kind, session=message.session, error=repr(exc))
            await self._reply(message, exc)
            await self._settled(token, shard, message, stream, entry_id, refused=exc)

    async def _dispatch(self, message: InboxMessage, token: str, lane: str, entry_id: str) -> None:
        shard = self.ownership.shard(message.session)
        stream = keys.inbox(shard, lane)
        body = message.body
        if message.kind == "create":
            await self._check_new(message.session)
            await self._disposed(message.session)
            self.ownership.active[message.session] = token
            try:
                handle = await self.dock.create_agent(self.supervisor, CreateAgentOptions(
                    session_id=message.session, agent_options=body.get("agent_options"), loop=body.get("loop"),
                    driver=body.get("driver"), cwd=body.get("cwd"), meta=body.get("meta"),
                    agent_preset=body.get("agent_preset"),
                ))
            except BaseException:
                self.ownership.active.pop(message.session, None)
                raise
            self.handles[message.session] = handle
            await handle.agent.session.flush()
            await self._settled(token, shard, message, stream, entry_id, live="add")
            await self._reply(message, None)
        elif message.kind == "fork":  # sent to the new session's shard: its owner creates it
            await self._check_new(message.session)
            upto = body.get("upto_seq")
            await self.supervisor.fork_session(
                str(body.get("source")), message.session, upto_seq=upto if isinstance(upto, int) else None)
            await self._settled(token, shard, message, stream, entry_id)
            await self._reply(message, None)
        elif message.kind == "resume":
            await self._activate(message.session, loop=body.get("loop"), driver=body.get("driver"))
            await self._settled(token, shard, message, stream, entry_id)
            await self._reply(message, None)
        elif message.kind in _TO_AGENTS:
            agent = await self._activate(message.session)
            wire = message_from_wire(body.get("message"))
            if wire.id != message.id:
                raise _Refused("BAD_INBOX_MESSAGE", "an inbox message's id must be its message's id")
            self.ownership.add_pending(message.id, Pending(shard, lane, entry_id))
            try:
                if message.kind == "reserve":  # its settlement is read from the log by whoever waits
                    agent.reserve(wire, _placement(body.get("placement")))
                else:
                    getattr(agent, message.kind)(wire)
            except BaseException:
                self.ownership.drop_pending(message.id)
                raise
        elif message.kind == "withdraw":
            live = self.handles.get(message.session)
            target, reason = body.get("message_id"), body.get("reason")
            reason = reason[:500] if isinstance(reason, str) and reason else "withdrawn"
            withdrawn = live is not None and isinstance(target, str) and live.agent.withdraw(target, reason)
            # Settled in the background, not to hold up the batch: a withdrawal further on
            # must find its reservation before the agent runs. Once the discard is durable
            # (it acknowledges the reservation's entry), so that a takeover meanwhile gets
            # this withdrawal again, right behind the reservation.
            assert self._nursery is not None
            self._nursery.start_soon(
                self._settle_withdrawal, live.agent if withdrawn and live is not None else None,
                token, shard, message, stream, entry_id,
            )
        elif message.kind == "cancel":
            live = self.handles.get(message.session)
            cause = body.get("cause")
            cause = cause[:500] if isinstance(cause, str) and cause else "cancelled"
            if live is not None:
                live.agent.cancel(cause, keep_inbox=bool(body.get("keep_inbox", True)))
            await self._settled(token, shard, message, stream, entry_id)
        elif message.kind == "answer":
            await self._answer(message)
            await self._reply(message, None)
            # Replied before it is settled: a worker that dies between the two leaves the
            # request to the next owner, which finds the answer logged under this
            # request's id and replies the same again.
            await self._settled(token, shard, message, stream, entry_id)
        elif message.kind == "dispose":
            await self._dispose(message.session)
            await self._settled(token, shard, message, stream, entry_id, live="remove")
            await self._reply(message, None)

    async def _answer(self, message: InboxMessage) -> None:
        """Give a person's answer to an approval question of the session's agent
        (activated for it if need be, as for a followup); returns once it is durable.
        Raises ApprovalClosedError when the question is not open, unless the answer that
        closed it is this request's own (the same request again, after a takeover)."""
        body = message.body
        approval_id, decision = body.get("approval"), body.get("decision")
        reason, arguments = body.get("reason"), body.get("arguments")
        if not isinstance(approval_id, str) or not isinstance(decision, str):
            raise _Refused("BAD_INBOX_MESSAGE", "an answer names its approval and its decision")
        agent = await self._activate(message.session)
        if agent.approvals.answered_by(approval_id) == message.id:
            await agent.session.flush()
            return
        try:
            await agent.approvals.answer(
                approval_id, decision, reason=reason, arguments=arguments, request_id=message.id)
        except ValueError as exc:
            raise _Refused("INVALID_ANSWER", str(exc)) from None

    async def _settle_withdrawal(
        self, agent: Any, token: str, shard: int, message: InboxMessage, stream: str, entry_id: str
    ) -> None:
        try:
            if agent is not None:
                await agent.session.flush()
            await self._settled(token, shard, message, stream, entry_id)
        except Exception as exc:  # unsettled, it is delivered again: withdrawing twice is harmless
            log.warning("a withdrawal was not settled", session=message.session, error=repr(exc))

    async def _check_new(self, session_id: str) -> None:
        if session_id in self.handles or await self.store.aexists(session_id):
            raise _Refused(SessionExistsError.code, f"session {session_id!r} already exists")

    async def _activate(self, session_id: str, *, loop: str | None = None, driver: str | None = None) -> Any:
        handle = self.handles.get(session_id)
        if handle is not None and not handle.agent.closed:
            return handle.agent  # its loop and driver were checked when it was activated
        if not await self.store.aexists(session_id):
            raise _Refused(SessionNotFoundError.code, f"no session {session_id!r} in the cluster")
        # An earlier activation still stopping (its shard was lost, or it is being
        # passivated: then its mark is written before the unmark below) must be gone first:
        # from here on, the session's writes are fenced with the new lease's token.
        await self._disposed(session_id)
        shard = self.ownership.shard(session_id)
        token = self.ownership.tokens.get(shard)
        if token is None:
            raise _Refused("NOT_OWNER", f"this worker no longer owns shard {shard}")
        self.ownership.active[session_id] = token
        try:
            # Unmarked before the agent exists: no agent of a session marked passivated
            # ever runs, so a takeover that skips it skips no open turn.
            if await self._set_op(token, session_id, "wake") != "OK":
                raise _Refused("NOT_OWNER", f"this worker no longer owns shard {shard}")
            resumed = await self.dock.resume(
                self.supervisor, ResumeAgentOptions(resume_session_id=session_id, loop=loop, driver=driver)
            )
        except BaseException:
            self.ownership.active.pop(session_id, None)
            raise
        self.handles[session_id] = resumed
        await self._set_op(token, session_id, "add")
        return resumed.agent

    async def _set_op(self, token: str, session_id: str, op: str) -> str:
        """Update the session's membership of its shard's live and passive sets (see
        runtime.cluster's SETTLE), fenced on the lease ``token``: OK or FENCED."""
        shard = self.ownership.shard(session_id)
        answer: Any = await self._settle(
            keys=[keys.lease(shard), keys.done(session_id), keys.inbox(shard, "human"), keys.live(shard),
                  keys.passive(shard)],
            args=[token, "", keys.GROUP, "", op, session_id])
        return str(answer)

    async def _settled(
        self, token: str, shard: int, message: InboxMessage, stream: str, entry_id: str, live: str = "",
        refused: BaseException | None = None,
    ) -> None:
        """Record ``message`` as done and acknowledge it (with ``refused``: a message for
        an agent that failed, told to its sender)."""
        settle_keys = [keys.lease(shard), keys.done(message.session), stream, keys.live(shard),
                       keys.passive(shard)]
        args: list[str | int] = [token, message.id, keys.GROUP, entry_id, live, message.session]
        client = message.body.get("client")
        if refused is not None and message.kind in _TO_AGENTS and isinstance(client, str) \
                and _CLIENT_ID.fullmatch(client):
            settle_keys.append(keys.refused(client))
            # Only our own errors' text: another's may carry paths or secrets.
            if isinstance(refused, LoopdockError):
                code, reason = refused.code, str(refused)
            else:
                code, reason = "ERROR", type(refused).__name__
            args += [code, reason[:2000], REFUSAL_TTL_MS, REFUSALS_KEPT]
        answer: Any = await self._settle(keys=settle_keys, args=args)
        if answer != "OK":
            log.warning("inbox message not settled: the shard moved", shard=shard, answer=str(answer))
        else:
            self.ownership.settled(message.id)

    async def _reply(self, message: InboxMessage, error: BaseException | None) -> None:
        if message.kind not in ("create", "resume", "fork", "dispose", "answer"):
            return
        if error is None:
            answer: dict[str, Any] = {"ok": True}
        else:
            code = getattr(error, "code", None) or "ERROR"
            answer = {"ok": False, "code": code, "error": safe_message(error)[:2000]}
        key = keys.reply(message.id)
        await self._redis.lpush(key, [json.dumps(answer)])
        await self._redis.pexpire(key, REPLY_TTL_MS)

    def _agents_of(self, shard: int) -> list[str]:
        return [s for s in self.handles if self.ownership.shard(s) == shard]

    async def _dispose(self, session_id: str) -> None:
        begun = self._begin_dispose(session_id)
        if begun is not None:
            await self._finish_dispose(session_id, *begun)

    def _begin_dispose(self, session_id: str) -> tuple[AgentHandle, trio.Event] | None:
        # Synchronous: from here the session has no live agent here, and a new activation
        # waits for ``done``.
        handle = self.handles.pop(session_id, None)
        if handle is None:
            return None
        done = self._disposing[session_id] = trio.Event()
        return handle, done

    async def release(self, agent: Any) -> bool:
        """Passivate ``agent``, found quiescent by the runtime's lifecycle (its ``release``),
        with no checkpoint since; not while a batch of entries is being handed over (the
        lifecycle looks again later). See ``_release``."""
        if self.ownership.settled_since is not None:
            # A batch is being handed over (``_handle_entries``): its agents were made live
            # for it, and handing its messages over must await nothing. Later, then.
            return False
        return await self._release(agent)

    async def _release(self, agent: Any) -> bool:
        """Dispose ``agent``, quiescent, then mark its session passivated, fenced on the
        lease it was activated under. True if it was. Not if it is not this host's live
        agent of a shard it still trusts its lease of; and if its log could not be
        flushed, or the mark written, it is disposed but not marked (its next message, or
        a takeover, resumes it as any live session)."""
        session_id = agent.id
        handle = self.handles.get(session_id)
        token = self.ownership.active.get(session_id)
        shard = self.ownership.shard(session_id)
        if handle is None or handle.agent is not agent or token is None \
                or self.ownership.holds(shard, trio.current_time()) != token:
            return False
        begun = self._begin_dispose(session_id)
        assert begun is not None
        # Until ``_finish_dispose`` is done a message for the session waits (``_disposed``)
        # and activates it after: the mark is in Redis before the unmark.
        return await self._finish_dispose(session_id, *begun, passivate=token)

    async def _finish_dispose(
        self, session_id: str, handle: AgentHandle, done: trio.Event, passivate: str | None = None
    ) -> bool:
        """Dispose ``handle``; with ``passivate`` (a lease token), then mark the session
        passivated if the disposal flushed its log. True if it was marked."""
        marked = False
        try:
            # Short, and never left half done (as a passivation in one process): a
            # cancelled mark leaves the session unmarked, which is safe.
            scope = trio.CancelScope()
            if passivate is not None:
                scope = trio.CancelScope(shield=True, deadline=trio.current_time() + self.ttl)
            with scope:
                await handle.dispose()
                if passivate is not None:
                    marked = await self._set_op(passivate, session_id, "passive") == "OK"
                    log.info("agent passivated" if marked else "agent not passivated: the shard moved",
                             session=session_id)
        except Exception as exc:  # its last writes fenced off: the next owner resumes it
            log.info("agent disposed without its last writes", session=session_id, error=repr(exc))
        finally:
            if session_id not in self.handles:
                self.ownership.active.pop(session_id, None)
            if self._disposing.get(session_id) is done:
                del self._disposing[session_id]
            done.set()
        return marked

    async def _disposed(self, session_id: str) -> None:
        """Wait until an earlier activation of the session has stopped, if one is stopping."""
        stopping = self._disposing.get(session_id)
        if stopping is not None:
            await stopping.wait()

    async def aclose(self) -> None:
        for session_id in list(self.handles):
            await self._dispose(session_id)
        if self._reads is not None:
            await self._reads.aclose()


def _fields(values: Mapping[Any, Any]) -> dict[str, str]:
    return {str(k): str(v) for k, v in values.items()}


def _pairs(flat: Sequence[str]) -> dict[str, str]:
    """A stream entry's fields from RESP's flat ``[field, value, ...]``."""
    return dict(zip(flat[0::2], flat[1::2], strict=True))


class _NoGroupError(Exception):
    """The inbox streams' consumer group is gone (Redis lost its data)."""


class _Refused(LoopdockError):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def _placement(value: object) -> Placement:
    if value not in get_args(Placement):
        raise _Refused("BAD_INBOX_MESSAGE", f"a reservation's placement must be one of {get_args(Placement)}")
    return cast(Placement, value)
