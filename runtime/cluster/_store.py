"""RedisSessionStore: the session log where any worker of the cluster can continue it.

The same SessionLog interface as the SQLite store, so the actors cannot tell them apart:
a session's header is a key, its log a stream whose entry ids are ``0-<seq + 1>`` (so a
range of seqs is a range of ids), and every session is in one sorted set by creation.

Its methods block like SQLite's and are called the same way, in a worker thread; each
runs its Redis commands back on the trio thread (``trio.from_thread.run``), so one
async client serves both. Redis persists with its append-only file (see docs/cluster.md).

Fencing: appending to a session needs the lease of its shard, the very lease its live
agent was activated under (``Ownership.active``); the check and the append are one Lua
script. Creating a session needs no lease, only that the session not exist yet (a fork
may create a session on a shard another worker owns). A commit also records the ids of
the messages its events consumed and acknowledges their inbox entries, in the same
script: a message is acknowledged exactly when its effect is durable.

A lost connection (Redis restarting, say) is retried for ``retry_for`` seconds before the
store gives up with StoreError; a retried commit that had in fact landed is recognised.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import Any, TypeVar

import attrs
import coredis
import trio

from .._events import Event, SessionHeader
from .._logging import get_logger
from .._messages import Message
from .._serde import header_from_wire, header_to_wire, message_from_wire
from .._store import StoreError, Write, encode_json
from . import keys
from ._connect import RETRYABLE
from ._ownership import Ownership, Pending
from ._resp import RedisReplyError, RespConnection
from ._scripts import COMMIT

log = get_logger(__name__)

T = TypeVar("T")

#: The most log entries one read returns (the rest come with the next).
_READ_CHUNK = 2_000
#: Sessions per multi-key command (one ``XREAD`` or ``MGET`` for this many).
_SESSIONS_PER_COMMAND = 500


class _ScriptGone(Exception):
    """The commit script is no longer in Redis's cache: load it and try again."""


#: The only types ``consumed_ids`` looks at.
CONSUMING_TYPES = frozenset({"user/message", "agent/inbox/spliced", "turn/end"})


def consumed_ids(events: Sequence[Event]) -> list[str]:
    """Ids of the messages whose effect these events make durable: a ``user/message``
    (the message entered the log), a discard from the inbox, or a turn that ended
    ``blocked`` because a pre-step listener vetoed them (its ``messageIds``)."""
    ids: list[str] = []
    for event in events:
        if event.type == "user/message":
            found = [event.data.get("id")]
        elif event.type == "agent/inbox/spliced" and event.data.get("op") == "discard":
            found = [event.data.get("messageId")]
        elif event.type == "turn/end" and isinstance(reason := event.data.get("reason"), dict):
            vetoed = reason.get("messageIds") if reason.get("kind") == "blocked" else None
            found = vetoed if isinstance(vetoed, list) else []
        else:
            continue
        ids.extend(i for i in found if isinstance(i, str))
    return ids


def mark_of(events: Sequence[Event], consumed: Sequence[str]) -> str:
    """What a client waiting for its agent to be idle needs of these events (one commit's;
    ``consumed``: their ``consumed_ids``), so that it need not read the events: a JSON
    object of ``c`` the ids of the messages they consumed, ``i`` those of the messages
    they queued as injections (an injection wakes nobody: nothing more to wait for), and
    ``o`` whether a turn is open after them (true or false), null if none began or ended.
    Empty for no events."""
    if not events:
        return ""
    injected: list[str] = []
    open_turn: bool | None = None
    for event in events:
        if event.type == "turn/start":
            open_turn = True
        elif event.type == "turn/end":
            open_turn = False
        elif event.type == "agent/inbox/spliced" and event.data.get("op") == "insert" \
                and event.data.get("placement") == "inject":
            injected.append(str(event.data.get("messageId")))
    return encode_json({"c": list(consumed), "i": injected, "o": open_turn})


def decode_event(seq: int, fields: dict[str, str]) -> Event:
    """An event from its log stream entry's fields."""
    return Event(type=fields["t"], seq=seq, time=int(fields["m"]), data=json.loads(fields["d"]))


def _decoded(entries: Sequence[Any], types: Collection[str] | None) -> list[Event]:
    """The events of log stream ``entries`` whose type is in ``types`` (None: all); only
    those are JSON-decoded."""
    events = []
    for entry in entries:
        fields = {str(k): str(v) for k, v in entry.field_values.items()}
        if types is None or fields["t"] in types:
            events.append(decode_event(keys.seq_of(str(entry.identifier)), fields))
    return events


class RedisSessionStore:
    #: How long a worker's store writer gathers writes before a commit (seconds; the
    #: embedded store's is 1 ms): a commit is a round trip, and wakes the clients
    #: waiting on those logs, so gathering longer makes fewer, larger commits.
    commit_window = 0.004

    def __init__(
        self, redis: coredis.Redis[str], ownership: Ownership, *, retry_for: float = 10.0, url: str | None = None
    ) -> None:
        self._redis = redis
        #: With the cluster's ``url`` (a worker's store), commits go over a connection of
        #: their own (see _resp); without (a client's, which reads only), through coredis.
        self._commits = RespConnection(url) if url is not None else None
        self.ownership = ownership
        self.retry_for = retry_for
        # Loaded once and called by digest: a Script object would ask SCRIPT EXISTS first
        # on every pipelined call.
        self._commit_sha: str | None = None
        self._closed = False

    # -- the SessionLog interface (blocking; call in a worker thread) -----------------

    def exists(self, session_id: str) -> bool:
        return self._blocking(self.aexists, session_id)

    def load(self, session_id: str) -> tuple[SessionHeader, list[Event]] | None:
        return self._blocking(self.aload, session_id)

    def load_events(
        self, session_id: str, start: int = 0, stop: int | None = None, types: Collection[str] | None = None
    ) -> list[Event]:
        return self._blocking(self.aload_events, session_id, start, stop, types)

    def load_messages(self, session_id: str, start: int, stop: int, types: Collection[str]) -> list[Message]:
        return [message_from_wire(event.data) for event in self.load_events(session_id, start, stop, types)]

    def load_outline(
        self, session_id: str, types: Collection[str]
    ) -> tuple[SessionHeader, int, int, list[Event]] | None:
        return self._blocking(self.aload_outline, session_id, types)

    def commit(self, batch: Sequence[Write]) -> dict[str, StoreError]:
        return self._blocking(self.acommit, batch)

    def list_headers(self) -> list[SessionHeader]:
        return self._blocking(self.alist_headers)

    def close(self) -> None:
        self._closed = True

    async def aclose(self) -> None:
        """Close the commits' connection (the coredis client is its owner's to close)."""
        self._closed = True
        if self._commits is not None:
            await self._commits.aclose()

    # -- the same, from the trio thread ------------------------------------------------

    async def aexists(self, session_id: str) -> bool:
        return bool(await self._retrying("check a session", lambda: self._redis.exists([keys.header(session_id)])))

    async def aheader(self, session_id: str) -> SessionHeader | None:
        raw = await self._retrying("read a header", lambda: self._redis.get(keys.header(session_id)))
        return None if raw is None else header_from_wire(json.loads(raw))

    async def aload(self, session_id: str) -> tuple[SessionHeader, list[Event]] | None:
        header = await self.aheader(session_id)
        if header is None:
            return None
        return header, await self.aload_events(session_id)

    async def aload_events(
        self, session_id: str, start: int = 0, stop: int | None = None, types: Collection[str] | None = None
    ) -> list[Event]:
        events: list[Event] = []
        low = keys.log_id(max(start, 0))
        high = "+" if stop is None else keys.log_id(stop - 1)
        if stop is not None and stop <= start:
            return events
        while True:
            chunk = await self._retrying(
                "read events", functools.partial(self._redis.xrange, keys.log(session_id), low, high, count=_READ_CHUNK)
            )
            events.extend(_decoded(chunk, types))
            if len(chunk) < _READ_CHUNK:
                return events
            low = keys.log_id(keys.seq_of(str(chunk[-1].identifier)) + 1)

    async def aread_after(
        self, cursors: Mapping[str, int], types: Collection[str]
    ) -> dict[str, tuple[int, list[Event]]]:
        """What each session's log added from seq ``cursors[session]`` on: the seq after
        the last entry read, and the events among them of ``types``. At most
        ``_READ_CHUNK`` entries per session (the rest comes at the next call), one
        ``XREAD`` per 500 sessions; a session with nothing new is left out."""
        found: dict[str, tuple[int, list[Event]]] = {}
        ids = list(cursors)
        step = _SESSIONS_PER_COMMAND
        for start in range(0, len(ids), step):
            streams = {keys.log(s): keys.log_id(cursors[s] - 1) if cursors[s] else "0-0" for s in ids[start : start + step]}
            reply = await self._retrying("read logs", functools.partial(self._redis.xread, streams, count=_READ_CHUNK))
            for stream, entries in (reply or {}).items():
                last = keys.seq_of(str(entries[-1].identifier))
                found[keys.session_of_log(str(stream))] = (last + 1, _decoded(entries, types))
        return found

    async def aload_outline(
        self, session_id: str, types: Collection[str]
    ) -> tuple[SessionHeader, int, int, list[Event]] | None:
        header = await self.aheader(session_id)
        if header is None:
            return None
        last = await self._retrying(
            "read the last event", lambda: self._redis.xrevrange(keys.log(session_id), "+", "-", count=1)
        )
        count, last_time = (0, 0) if not last else (keys.seq_of(str(last[0].identifier)) + 1, int(last[0].field_values["m"]))
        return header, count, last_time, await self.aload_events(session_id, 0, None, types)

    async def alist_headers(self) -> list[SessionHeader]:
        ids = await self._retrying("list sessions", lambda: self._redis.zrange(keys.SESSIONS, 0, -1))
        headers = await self.aheaders([str(i) for i in ids])
        return sorted(headers.values(), key=lambda h: (h.created_at, h.id))

    async def aheaders(self, session_ids: Sequence[str]) -> dict[str, SessionHeader]:
        """The headers of those of ``session_ids`` that exist, one ``MGET`` per 500."""
        headers: dict[str, SessionHeader] = {}
        step = _SESSIONS_PER_COMMAND
        for start in range(0, len(session_ids), step):
            part = session_ids[start : start + step]
            header_keys = [keys.header(i) for i in part]
            raws = await self._retrying("read headers", functools.partial(self._redis.mget, header_keys))
            for session_id, raw in zip(part, raws, strict=True):  # MGET answers each key, in order
                if raw is not None:
                    headers[session_id] = header_from_wire(json.loads(raw))
        return headers

    async def acommit(self, batch: Sequence[Write]) -> dict[str, StoreError]:
        """Every session's part in one call of one script (one round trip), each part fenced."""
        if self._closed:
            raise StoreError("cannot commit: the cluster store is closed")
        refused: dict[str, StoreError] = {}
        calls: list[_Call] = []
        for write in _merge(batch):
            try:
                calls.append(self._prepare(write))
            except StoreError as exc:
                refused[write.session_id] = exc
        attempts = 0

        async def run() -> list[Any]:
            nonlocal attempts
            attempts += 1
            script_keys = [key for call in calls for key in call.keys]
            args: list[str | int] = [len(calls)]
            for call in calls:
                args += call.args
            answers: Any
            try:
                if self._commits is not None:
                    if self._commit_sha is None:
                        self._commit_sha = str(await self._commits.call("SCRIPT", "LOAD", COMMIT))
                    answers = await self._commits.call(
                        "EVALSHA", self._commit_sha, len(script_keys), *script_keys, *args)
                else:
                    if self._commit_sha is None:
                        self._commit_sha = str(await self._redis.script_load(COMMIT))
                    answers = await self._redis.evalsha(self._commit_sha, script_keys, args)
                return list(answers)
            except (coredis.exceptions.NoScriptError, RedisReplyError) as exc:
                if isinstance(exc, RedisReplyError) and not exc.no_script:
                    raise StoreError(f"the cluster's Redis refused a commit: {exc}") from exc
                # Redis restarted (its script cache is not persisted): load it again.
                self._commit_sha = None
                raise _ScriptGone() from None

        answers = await self._retrying("commit", run) if calls else []
        for call, raw in zip(calls, answers, strict=True):  # one answer per call
            answer = str(raw)
            if answer.startswith("SEQ:") and attempts > 1 and call.last_seq is not None:
                # A retry after a lost reply: if our events are there, the first attempt landed.
                if int(answer[4:]) == call.last_seq + 1:
                    answer = "OK"
            if answer != "OK":
                refused[call.session_id] = StoreError(
                    f"session {call.session_id!r}: the cluster refused the write ({answer})")
                continue
            for message_id in call.acked:
                self.ownership.drop_pending(message_id)
                self.ownership.settled(message_id)
        return refused

    # -- internals -----------------------------------------------------------------------

    def _prepare(self, write: Write) -> _Call:
        session_id = write.session_id
        own = self.ownership
        # Appending needs the token this session's live agent was activated under;
        # creating needs no lease (see the module doc), but uses the shard's if held.
        token = own.active.get(session_id) if write.header is None else own.token(session_id)
        if write.header is None and token is None:
            raise StoreError(f"session {session_id!r}: no live activation on this worker (FENCED)")
        args: list[str | int] = []
        try:
            header = "" if write.header is None else encode_json(header_to_wire(write.header))
            for i, event in enumerate(write.events):
                if i and event.seq != write.events[i - 1].seq + 1:
                    raise StoreError(f"session {session_id!r}: events are not consecutive at seq {event.seq}")
                args += [event.seq, event.type, event.time, encode_json(event.data)]
        except (TypeError, ValueError, RecursionError) as exc:
            raise StoreError(f"session {session_id!r}: value is not JSON: {exc}") from exc
        ids = consumed_ids(write.events)
        acks = [(i, own.pending[i]) for i in ids if i in own.pending]
        created = write.header.created_at if write.header is not None else 0
        argv: list[str | int] = [
            token or "", header, created, session_id, keys.GROUP, len(write.events), *args, len(ids), *ids, len(acks),
        ]
        for _, pending in acks:
            argv += [pending.lane, pending.entry_id]
        argv.append(mark_of(write.events, ids))
        shard = own.shard(session_id)
        script_keys = [
            keys.lease(shard), keys.header(session_id), keys.log(session_id), keys.SESSIONS, keys.done(session_id),
            keys.inbox(shard, "human"), keys.inbox(shard, "auto"), keys.marks(session_id),
        ]
        last = write.events[-1].seq if write.events else None
        return _Call(session_id, script_keys, argv, [i for i, _ in acks], last)

    async def _retrying(self, what: str, op: Callable[[], Awaitable[T]]) -> T:
        deadline = trio.current_time() + self.retry_for
        delay = 0.05
        while True:
            try:
                return await op()
            except _ScriptGone:
                continue
            except RETRYABLE as exc:
                if trio.current_time() + delay > deadline:
                    raise StoreError(f"cannot {what}: the cluster's Redis is unreachable ({exc})") from exc
                log.info("redis unreachable, retrying", what=what, error=repr(exc))
                await trio.sleep(delay)
                delay = min(delay * 2, 1.0)

    def _blocking(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        if self._closed:
            raise StoreError("the cluster store is closed")
        return trio.from_thread.run(fn, *args)


@attrs.frozen
class _Call:
    session_id: str
    keys: list[str]
    args: list[str | int]
    acked: list[str]
    last_seq: int | None


def _merge(batch: Sequence[Write]) -> list[Write]:
    """One Write per session (a batch may hold several of one session, in order)."""
    merged: dict[str, Write] = {}
    for write in batch:
        before = merged.get(write.session_id)
        if before is None:
            merged[write.session_id] = write
        else:
            merged[write.session_id] = Write(write.session_id, before.header or write.header, (*before.events, *write.events))
    return list(merged.values())


__all__ = ["Pending", "RedisSessionStore", "consumed_ids"]
