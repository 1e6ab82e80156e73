"""``loopdock serve --cluster``: what the serve process adds when agents run on workers.

The serve process runs no agent of the cluster; it answers DSH hosts from its own dock,
so that dock must offer what the workers offer (``check_registry``), and it shows the
cluster's agents on the console next to DSH's (``ClusterFollower``).

The follower looks every ``period`` seconds: which sessions are live in the cluster (the
shards' live sets: created or resumed, not disposed; a session whose worker died stays
live, as the shard's next owner resumes it), and what each live session's log added since
it last looked (one ``XREAD`` per 500 sessions, only the turn, binding and inbox events
decoded). Each live session is a console row of origin ``cluster``: its loop and driver,
its turns, how the last one ended, ``running`` while a turn is open in its log, else
``idle``, and its inbox (the messages its log shows inserted and not yet claimed or
discarded). The row goes when the session is disposed. Redis out of reach only delays
the rows: the follower logs it and looks again.

Serve is refused at its start if a live worker's loops and drivers differ from its dock's.
A worker that joins later with other ones (it is refused only by live workers, so it
joins a cluster whose workers all stopped) is seen by the follower's next look: logged
once as an error (``REGISTRY_MISMATCH``) and kept in ``mismatched`` until it leaves.
"""

from __future__ import annotations

import attrs
import trio

from loopdock.actors import LiveEvent
from loopdock.actors.dock import BINDING_EVENT, LoopDock, Route, read_binding
from loopdock.bridge import ConsoleHandler, RuntimeView
from loopdock.runtime import Event, RegistryMismatchError, StoreError, get_logger
from loopdock.runtime.cluster import RETRYABLE

from ._cluster import ClusterRuntime
from ._worker import fingerprint

log = get_logger(__name__)

ORIGIN = "cluster"
#: How often the console looks at the cluster by default.
FOLLOW_PERIOD = 1.0
_FOLLOWED_TYPES = frozenset({"turn/start", "turn/end", "agent/inbox/spliced", BINDING_EVENT})


async def check_registry(cluster: ClusterRuntime, dock: LoopDock) -> int:
    """How many workers are live; RegistryMismatchError if one of them offers other loops
    or drivers than ``dock`` (DSH hosts would be told of loops the workers do not run)."""
    mine = fingerprint(dock)
    workers = await cluster.workers()
    for worker, theirs in sorted(workers.items()):
        if theirs and theirs != mine:
            raise RegistryMismatchError(
                f"worker {worker!r} has loops and drivers {theirs!r}, this serve {mine!r}: serve and "
                "every worker of a cluster must have the same loop packages installed"
            )
    return len(workers)


@attrs.define
class _Followed:
    cwd: str | None
    cursor: int = 0  # the next seq of the log not read yet
    turns: int = 0
    open_turn: bool = False
    last_turn: str | None = None
    binding: Route | None = None
    inbox: set[str] = attrs.field(factory=set)  # ids inserted and not claimed or discarded yet

    def fold(self, event: Event) -> None:
        if event.type == "agent/inbox/spliced":
            message_id = str(event.data.get("messageId"))
            if event.data.get("op") == "insert":
                self.inbox.add(message_id)  # (again, for a message a takeover delivers again)
            else:
                self.inbox.discard(message_id)
        elif event.type == "turn/start":
            self.turns += 1
            self.open_turn = True
        elif event.type == "turn/end":
            self.open_turn = False
            reason = event.data.get("reason")
            self.last_turn = str(reason.get("kind")) if isinstance(reason, dict) else None
        else:
            self.binding = read_binding([event]) or self.binding


class ClusterFollower:
    """See the module docstring. ``sessions``: what is known of each live session."""

    def __init__(self, cluster: ClusterRuntime, dock: LoopDock, *, period: float = FOLLOW_PERIOD) -> None:
        self._cluster = cluster
        self._fingerprint = fingerprint(dock)
        self.period = period
        self.sessions: dict[str, _Followed] = {}
        #: Live workers whose loops and drivers differ from this serve's, each with its own.
        self.mismatched: dict[str, str] = {}

    def cwd_of(self, session_id: str) -> str | None:
        """The working directory a live cluster session was created with."""
        followed = self.sessions.get(session_id)
        return followed.cwd if followed is not None else None

    async def run(self, console: ConsoleHandler) -> None:
        """Keep ``console``'s cluster rows up to date until cancelled. Nothing here ends
        ``serve``: a look that fails is logged, and the next one tries again."""
        while True:
            try:
                await self.look(console)
            except (StoreError, *RETRYABLE) as exc:
                log.warning("cannot read the cluster; its console rows wait", error=repr(exc))
            except Exception as exc:  # contained: the rows may be stale, serve goes on
                log.error("could not follow the cluster's agents", error=repr(exc))
            await trio.sleep(self.period)

    async def look(self, console: ConsoleHandler) -> None:
        """Check the live workers' registries and bring every row up to date with the
        cluster, once."""
        await self._check_workers()
        live = await self._cluster.live_sessions()
        for session_id in sorted(self.sessions.keys() - live):
            del self.sessions[session_id]
            console.apply_live(ORIGIN, LiveEvent("agent/disposed", session_id, {}))
        headers = await self._cluster.store.aheaders(sorted(live - self.sessions.keys()))
        # one live before its header shows comes next time; a new one is followed (and its
        # row made) only once its log was read, so that its row starts with its loop
        fresh = {session_id: _Followed(header.cwd) for session_id, header in headers.items()}
        cursors = {session_id: followed.cursor for session_id, followed in (self.sessions | fresh).items()}
        news = await self._cluster.store.aread_after(cursors, _FOLLOWED_TYPES)
        for session_id, (cursor, events) in news.items():
            followed = self.sessions[session_id] if session_id in self.sessions else fresh[session_id]
            followed.cursor = cursor
            for event in events:
                followed.fold(event)
        for session_id, followed in fresh.items():
            self.sessions[session_id] = followed
            created = LiveEvent("agent/created", session_id, {"sessionId": session_id, "cwd": followed.cwd})
            console.apply_live(ORIGIN, created, RuntimeView(followed.binding, followed.turns, followed.last_turn))
        for session_id in news:
            followed = self.sessions[session_id]
            view = RuntimeView(followed.binding, followed.turns, followed.last_turn)
            row = console.rows.get(session_id)
            if row is not None:
                row.inbox = len(followed.inbox)  # published with the status below
            status = LiveEvent("agent/status", session_id, {"status": "running" if followed.open_turn else "idle"})
            console.apply_live(ORIGIN, status, view)

    async def _check_workers(self) -> None:
        workers = await self._cluster.workers()
        mismatched = {w: theirs for w, theirs in workers.items() if theirs and theirs != self._fingerprint}
        for worker, theirs in sorted(mismatched.items()):
            if self.mismatched.get(worker) != theirs:
                log.error(
                    "a live worker has other loops and drivers than this serve: DSH hosts are offered loops "
                    "the cluster does not run; install the same loop packages everywhere",
                    code=RegistryMismatchError.code, worker=worker, theirs=theirs, mine=self._fingerprint,
                )
        self.mismatched = mismatched
