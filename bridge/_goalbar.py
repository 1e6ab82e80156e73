"""The GoalBar service: a live projection of one session's bound LoopX goal, with Start/Pause.

LoopX is the only authority. Everything the bar shows is rebuilt from four read-only CLI
calls for the exact session id (:func:`project_goalbar`):

1. ``resolve-agent-thread`` -- no binding, more than one, or a failure hides the bar
   (:class:`GoalBarHidden` with the reason); it is never guessed;
2. ``goal-lifecycle --operation stop`` as a preview (writes nothing): its ``before_state``
   is the goal's lifecycle state;
3. ``todo list --role agent --agent-id A --limit 1``: processed = done, remaining = open,
   total;
4. ``status --goal-id G --limit 1`` (the status collector; it writes nothing unless asked
   to with ``--write-projection-cache``, which is never passed): the goal's text
   (:func:`read_goal_text`). It is the only read-only answer of loopx 2.1.1 that carries
   it: ``run_history.goals[].goal_objective`` (the current objective, public-safe, at most
   1,000 characters; LoopX fills it for active goals only) and ``display_name`` (the
   registry's public-safe title, at most 132 characters, also for stopped goals). LoopX
   leaves both out when the text looks like a local path or a secret. No text, or a
   failed status call, leaves ``goal_text`` ``None`` -- the page then shows the goal id
   -- and never hides a bar the other three calls justify.

The service keeps one actor per watched ``(session id, project)``, each in its own nursery
(cancelled with the service). An actor owns only process-local things: the last projection,
the watchers, the pending/error overlay and the read requests. It never stores business
state: after a restart a new service rebuilds the same projection from LoopX.

Reads are *requested*, and one read serves every request made before it started, so a
burst of wakes costs one re-read:

- :meth:`GoalBarService.wake` (a session event, an agent status change): a hint only. It
  requests a re-read of actors that already exist and does nothing else; the state that
  comes out is LoopX's, so a wake without a LoopX change yields the same state (and
  watchers get nothing new: a projection equal to the shown one is not republished).
- a change of the source files -- ``<project>/.loopx/registry.json`` (lifecycle, bindings)
  and the bound goal's ``<project>/.loopx/goals/<goal>/ACTIVE_GOAL_STATE.md`` (todos), by
  SHA-256 of their bytes, polled every ``poll_interval`` seconds -- forces an authoritative
  re-read even when no runtime event happened (the CLI used from a shell). The hashes are
  taken just before each read, so a change during a read causes one more read.
- :meth:`GoalBarService.read` requests a read and waits for it: always fresh.

Wakes and the source poll only concern watched actors (``watch``); an actor that nobody
watches is only read on request. Actors live as long as the service.

Start/Pause are ``goal-lifecycle --operation resume|stop --actor-kind owner --execute``,
and they control the session's LoopX continuation (``continuations``: the runtime's LoopX
integration) too:

- each runs to completion as a task of the service, whatever happens to the page that
  asked: a page that closes or reloads only stops waiting for the answer. A second click
  of the same action while it runs joins it (a double click is one mutation);
- serialized per ``(project, goal)`` by a lock that exists only while someone holds or
  waits for it (trio's lock is fair: clicks run in arrival order), and each runs its own
  binding check, mutation and readback;
- under the lock the binding is resolved again; if it is not exactly the goal/agent the
  bar showed (or the caller passed as ``expected``), the click is refused
  (``stale-binding``) and the bar is re-read;
- then LoopX's preview of the operation (``goal-lifecycle`` without ``--execute``: it
  writes nothing) says whether it would change the goal; one that would not is never
  executed. Pause on a goal LoopX has stopped already is refused (``already-paused``).
  Otherwise the continuation is *held* first -- its queued continuation withdrawn, its
  timer disarmed, a running evaluation cancelled -- and stays held until LoopX confirmed
  the stop, so no continuation enters after a confirmed Pause (LoopX's should-run says
  the goal is stopped from then on, which the continuation obeys even for a recovery
  turn);
- Start while the session's agent is running is refused (``agent-running``). Otherwise a
  stopped goal is resumed (an active one is not: nothing to execute), then the
  continuation is re-armed (a latch cleared, a recovery that needs a person given the
  go-ahead) and evaluated at once: an idle, activated agent continues within that one
  checkpoint. Start on an active goal with nothing to continue is refused
  (``nothing-to-start``);
- while the mutation runs the bar is ``pending``; afterwards LoopX's readback must say
  ``verified``, else the bar shows an ``error`` on top of a fresh read -- never the
  optimistic state. A verified mutation is followed by a fresh read, which is what is
  shown. The error stays until the next click on that goal (or another binding);
- what goes wrong after LoopX applied the mutation does not undo it: the action is
  ``done``, with a warning for each such thing (:data:`WARNINGS`): the session's
  continuation could not be told (``driver-sync-failed``), or the bar could not be read
  back afterwards (``post-read-failed``: the state is then the failed read's).

Failures are contained: a read that fails shows a hidden bar (``loopx-failure``), an action
that fails answers ``failed`` with a reason; neither ends the service or another bar.

:class:`GoalBarHandler` serves this over the bridge's ``/goalbar`` endpoint
(``goalbarRead``/``goalbarWatch``/``goalbarStart``/``goalbarPause`` answered by
``goalbarResult``; ``goalbar`` frames pushed to watchers) and wakes sessions on the session
events a DSH host streams, passing every other callback to an inner handler.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Hashable, Sequence
from contextlib import AbstractAsyncContextManager, aclosing, asynccontextmanager
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar, Union

import attrs
import trio

from loopdock.actors.loopx import ContinuationStatus, LoopxContinuation, LoopxIntegration
from loopdock.runtime import Changes, get_logger, safe_message
from loopdock.runtime.loopx import (
    LifecycleResult,
    LoopxClient,
    LoopxOk,
    LoopxRequestError,
    ThreadBinding,
    TodoProgress,
    check_thread_id,
)

from ._handler import BridgeHandler, Disconnect, HandlerLayer, Peer
from ._messages import (
    GoalbarPause,
    GoalbarRead,
    GoalbarResult,
    GoalbarStart,
    GoalbarView,
    GoalbarWatch,
    SessionEvent,
)

__all__ = [
    "HIDDEN_REASONS",
    "REFUSALS",
    "WARNINGS",
    "KeyedLocks",
    "GoalBarActionResult",
    "GoalBarHandler",
    "GoalBarHidden",
    "GoalBarService",
    "GoalBarState",
    "GoalBarVisible",
    "LOOPX_OFF_DETAIL",
    "MAX_GOAL_TEXT",
    "goal_state_file",
    "project_goalbar",
    "read_goal_text",
    "registry_file",
    "state_to_json",
]

log = get_logger(__name__)

#: Why the bar is hidden: no binding for the session, more than one, LoopX says the
#: binding is unavailable, a CLI call failed (transport, refusal, malformed answer), or
#: the runtime runs without its LoopX integration (``loopdock serve --no-loopx``).
HIDDEN_REASONS = ("unbound", "ambiguous", "unavailable", "loopx-failure", "loopx-off")
#: The longest goal text passed on (LoopX's own limit for ``goal_objective``); a longer
#: one is cut, ending in an ellipsis.
MAX_GOAL_TEXT = 1000


@attrs.frozen
class GoalBarHidden:
    """No bar: ``reason`` is one of :data:`HIDDEN_REASONS`; ``detail`` is a safe phrase
    (the client's ``reason``), never LoopX output or a path."""

    session_id: str
    reason: str
    detail: str | None = None

    kind = "hidden"


@attrs.frozen
class GoalBarVisible:
    """The bound goal: its lifecycle state (``active``, ``stopped``, ...) and the agent
    lane's progress; ``goal_text``: what LoopX says the goal is (``None`` when it gives no
    text: see :func:`read_goal_text`). ``pending``: a Start/Pause is running; ``error``:
    the last one failed or could not be verified (the other fields are still LoopX's, read
    afterwards). ``continuation``/``continuation_reason``: what the session's LoopX
    continuation does and why (``actors.loopx.ContinuationStatus``; ``None`` when the
    session has no live agent here), ``agent_running``: its agent is in a turn."""

    session_id: str
    goal_id: str
    agent_id: str
    lifecycle_state: str
    processed: int
    remaining: int
    total: int
    goal_text: str | None = None
    pending: bool = False
    error: str | None = None
    continuation: str | None = None
    continuation_reason: str | None = None
    agent_running: bool = False

    kind = "visible"


GoalBarState = Union[GoalBarHidden, GoalBarVisible]


#: Why a Start/Pause was not run (the page says each in words).
REFUSALS = ("stale-binding", "hidden", "already-paused", "agent-running", "nothing-to-start", "loopx-off")
#: What went wrong after LoopX applied a Start/Pause: the session's continuation was not
#: told (held, paused or re-armed), or the bar could not be read back.
WARNINGS = ("driver-sync-failed", "post-read-failed")


@attrs.frozen
class GoalBarActionResult:
    """A Start/Pause: ``done`` (mutated, verified and re-read), ``refused`` (not run; the
    reason is one of :data:`REFUSALS`) or ``failed`` (run, but not verified or not
    answered). ``state`` is the bar after it; ``warnings`` (of a ``done``): what went
    wrong after LoopX applied it (:data:`WARNINGS`)."""

    outcome: Literal["done", "refused", "failed"]
    state: GoalBarState
    reason: str | None = None
    warnings: tuple[str, ...] = ()


def state_to_json(state: GoalBarState) -> dict[str, Any]:
    """The state as a plain JSON object (for the wire and the page)."""
    return {"kind": state.kind, **attrs.asdict(state)}


def registry_file(project: Path) -> Path:
    """The project registry LoopX writes lifecycle and bindings to."""
    return Path(project) / ".loopx" / "registry.json"


def goal_state_file(project: Path, goal_id: str) -> Path:
    """Where LoopX 2.x keeps a goal's state (todos): the ``state_file`` a ``todo list``
    names (checked on the real CLI by the tests). Goal ids have no path separators."""
    return Path(project) / ".loopx" / "goals" / goal_id / "ACTIVE_GOAL_STATE.md"


def _digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _source_hashes(project: Path, goal_id: str | None) -> tuple[str | None, str | None]:
    # Two small files, read on the event loop: cheaper than a thread hop at this size.
    registry = _digest(registry_file(project))
    goal = _digest(goal_state_file(project, goal_id)) if goal_id is not None else None
    return registry, goal


def _goal_text(value: object) -> str | None:
    if not isinstance(value, str):
        return None
    text = " ".join(value.split())  # no control characters, no runs of white space
    if not text:
        return None
    return text if len(text) <= MAX_GOAL_TEXT else text[: MAX_GOAL_TEXT - 1] + "\u2026"


async def read_goal_text(client: LoopxClient, goal_id: str) -> str | None:
    """The goal's text from ``status --goal-id G --limit 1`` (read-only, retried like the
    other reads): the entry of ``run_history.goals`` whose ``id`` is ``goal_id``, its
    ``goal_objective`` if LoopX gives one, else its ``display_name``. ``None`` when LoopX
    gives neither or the call fails (the bar then shows the goal id)."""
    result = await client.run("status", "--goal-id", goal_id, "--limit", "1", retry=True)
    if not isinstance(result, LoopxOk):
        log.info("goalbar goal text unavailable", goal_id=goal_id, kind=type(result).__name__)
        return None
    history = result.payload.get("run_history")
    goals = history.get("goals") if isinstance(history, dict) else None
    for goal in goals if isinstance(goals, list) else ():
        if isinstance(goal, dict) and goal.get("id") == goal_id:
            return _goal_text(goal.get("goal_objective")) or _goal_text(goal.get("display_name"))
    return None


async def project_goalbar(client: LoopxClient, session_id: str) -> GoalBarState:
    """The bar for ``session_id``, from LoopX only (four read-only calls)."""
    binding = await client.resolve_thread(session_id)
    if not isinstance(binding, ThreadBinding):
        return GoalBarHidden(session_id, "loopx-failure", binding.reason)
    if binding.status == "missing":
        return GoalBarHidden(session_id, "unbound")
    if binding.status != "bound":
        return GoalBarHidden(session_id, binding.status, binding.error_kind)
    goal_id, agent_id = binding.goal_id, binding.agent_id
    assert goal_id is not None and agent_id is not None
    preview = await client.goal_lifecycle(goal_id, "stop", execute=False)
    if not isinstance(preview, LifecycleResult):
        return GoalBarHidden(session_id, "loopx-failure", preview.reason)
    progress = await client.todo_progress(goal_id, agent_id)
    if not isinstance(progress, TodoProgress):
        return GoalBarHidden(session_id, "loopx-failure", progress.reason)
    return GoalBarVisible(
        session_id=session_id,
        goal_id=goal_id,
        agent_id=agent_id,
        lifecycle_state=preview.before_state,
        processed=progress.done,
        remaining=progress.open,
        total=progress.total,
        goal_text=await read_goal_text(client, goal_id),
    )


_K = TypeVar("_K", bound=Hashable)


class KeyedLocks(Generic[_K]):
    """A fair ``trio.Lock`` per key that exists only while a task holds it or waits for
    it: keys a client names come and go without piling up."""

    def __init__(self) -> None:
        self._locks: dict[_K, tuple[trio.Lock, int]] = {}

    def __len__(self) -> int:
        return len(self._locks)

    @asynccontextmanager
    async def hold(self, key: _K) -> AsyncIterator[None]:
        lock, users = self._locks.get(key, (None, 0))
        if lock is None:
            lock = trio.Lock()
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            _, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)


Operation = Literal["stop", "resume"]


@attrs.define(eq=False)
class _Mutation:
    """One Start/Pause in flight; the clicks that joined it wait on ``done``."""

    key: tuple[Operation, tuple[str, str] | None]
    done: trio.Event = attrs.field(factory=trio.Event)
    result: GoalBarActionResult | None = None


class _GoalWatch:
    """One watched session in one project: reads, fan-out to watchers, mutations."""

    def __init__(self, service: GoalBarService, session_id: str, project: Path) -> None:
        self.service = service
        self.session_id = session_id
        self.project = project
        #: The last projection read from LoopX, and what is shown (with the overlay).
        self.base: GoalBarState | None = None
        self.state: GoalBarState | None = None
        self.changes = Changes()  # one per state shown (and one when it closes)
        self.closed = False
        #: Counters, for tests and diagnostics.
        self.reads = 0
        self.forced_reads = 0
        self.watchers = 0
        self.mutations = 0  # Start/Pause tasks run (a joined click runs none)
        self._pending = False
        self._error: tuple[str, str] | None = None  # (goal id, message)
        self._requested = 0
        self._completed = 0
        self._wake = trio.Event()
        self._done = trio.Event()
        self._hashes: tuple[str | None, str | None] | None = None
        self._last_forced: tuple[str | None, str | None] | None = None
        self._source_goal: str | None = None
        self._in_flight: dict[tuple[Operation, tuple[str, str] | None], _Mutation] = {}

    @property
    def client(self) -> LoopxClient:
        # Asked for on every use: a client factory that follows a repaired CLI (e.g. the
        # runtime's LoopX integration after /loopx-init) is followed at the next call.
        return self.service._client_for(self.project)

    @property
    def continuation(self) -> LoopxContinuation | None:
        return self.service.continuation_for(self.session_id)

    # -- Life ---------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._reader)
                nursery.start_soon(self._source_poller)
                nursery.start_soon(self._follow_continuation)
        finally:
            self.closed = True
            self.changes.notify()
            self._done.set()
            for mutation in list(self._in_flight.values()):
                mutation.done.set()  # the service closed under it: its waiters stop waiting

    # -- Reads --------------------------------------------------------------------------

    def request(self) -> int:
        """Ask for a read; every request made before a read starts is served by it."""
        self._requested += 1
        self._wake.set()
        return self._requested

    async def read(self) -> GoalBarState:
        """A read that started after this call, and the state shown after it."""
        target = self.request()
        while self._completed < target:
            if self.closed:
                raise trio.ClosedResourceError("the GoalBar service is closed")
            await self._done.wait()
        assert self.state is not None
        return self.state

    async def _reader(self) -> None:
        while True:
            if self._requested == self._completed:
                self._wake = trio.Event()
                await self._wake.wait()
                continue
            target = self._requested
            await self._read_once()
            self._completed = target
            done, self._done = self._done, trio.Event()
            done.set()

    async def _read_once(self) -> None:
        hashes = _source_hashes(self.project, self._source_goal)
        try:
            state = await project_goalbar(self.client, self.session_id)
        except LoopxRequestError:  # LoopX named an id the client refuses to pass back
            state = GoalBarHidden(self.session_id, "loopx-failure", "loopx named an invalid id")
        except Exception as exc:  # contained: this bar shows it, the service goes on
            log.warning("goalbar read failed", session_id=self.session_id, error=repr(exc))
            state = GoalBarHidden(self.session_id, "loopx-failure", f"the read failed: {safe_message(exc)}")
        goal = state.goal_id if isinstance(state, GoalBarVisible) else None
        if goal != self._source_goal:
            # Another goal's state file is watched from now on (hashed after the read: a
            # change in that window is caught by the next source change or wake).
            hashes = _source_hashes(self.project, goal)
            self._source_goal = goal
        self.reads += 1
        self._hashes = hashes
        self.base = state
        self._publish()

    async def _source_poller(self) -> None:
        while True:
            await trio.sleep(self.service.poll_interval)
            if self._hashes is None or not self.watchers:
                continue  # nobody to tell: the next read is fresh anyway
            current = _source_hashes(self.project, self._source_goal)
            if current != self._hashes and current != self._last_forced:
                self._last_forced = current
                self.forced_reads += 1
                self.request()

    async def _follow_continuation(self) -> None:
        """The continuation's status is process-local: shown as it changes, no CLI call."""
        changes = self.service.continuation_changes
        if changes is None:
            return
        while True:
            await changes.wait()
            self._publish()

    def _publish(self) -> None:
        base = self.base
        if base is None:
            return
        shown: GoalBarState = base
        if isinstance(base, GoalBarVisible):
            error = self._error[1] if self._error and self._error[0] == base.goal_id else None
            continuation = self.continuation
            status = self.service.continuation_status(self.session_id)
            shown = attrs.evolve(
                base,
                pending=self._pending,
                error=error,
                continuation=status.state if status is not None else None,
                continuation_reason=status.reason if status is not None else None,
                agent_running=continuation is not None and continuation.agent.status == "running",
            )
        if shown == self.state:
            return
        self.state = shown
        self.changes.notify()

    # -- Mutations ----------------------------------------------------------------------

    async def act(self, operation: Operation, expected: tuple[str, str] | None) -> GoalBarActionResult:
        """Start a mutation as a task of this actor (or join the same one in flight) and
        wait for its result. Cancelling the wait leaves the mutation running."""
        key = (operation, expected)
        mutation = self._in_flight.get(key)
        if mutation is None:
            if self.closed:
                raise trio.ClosedResourceError("the GoalBar service is closed")
            mutation = self._in_flight[key] = _Mutation(key)
            self.mutations += 1
            self.service._nursery.start_soon(self._run_mutation, mutation)
        await mutation.done.wait()
        if mutation.result is None:
            raise trio.ClosedResourceError("the GoalBar service closed during the action")
        return mutation.result

    async def _run_mutation(self, mutation: _Mutation) -> None:
        operation, expected = mutation.key
        try:
            mutation.result = await self._mutate(operation, expected)
        except Exception as exc:  # contained: this action fails, the service goes on
            log.warning("goalbar action failed", session_id=self.session_id, operation=operation, error=repr(exc))
            self._pending = False
            state = self.state if self.state is not None else GoalBarHidden(self.session_id, "loopx-failure")
            mutation.result = GoalBarActionResult("failed", state, f"{operation} failed: {safe_message(exc)}")
        finally:
            if self._in_flight.get(mutation.key) is mutation:
                del self._in_flight[mutation.key]
            mutation.done.set()

    async def _mutate(self, operation: Operation, expected: tuple[str, str] | None) -> GoalBarActionResult:
        if expected is None:
            shown = self.state if self.state is not None else await self.read()
            if not isinstance(shown, GoalBarVisible):
                return GoalBarActionResult("refused", shown, "hidden")
            expected = (shown.goal_id, shown.agent_id)
        goal_id, _ = expected
        client = self.client  # one CLI for the check, the mutation and the readback
        async with self.service.locks.hold((self.project, goal_id)):
            binding = await client.resolve_thread(self.session_id)
            if not (isinstance(binding, ThreadBinding) and binding.status == "bound"
                    and (binding.goal_id, binding.agent_id) == expected):
                return GoalBarActionResult("refused", await self.read(), "stale-binding")
            # LoopX's preview says whether the mutation would change the goal: one that
            # would not is not executed.
            preview = await client.goal_lifecycle(goal_id, operation, execute=False)
            if not isinstance(preview, LifecycleResult):
                return await self._failed(goal_id, f"{operation} failed: {preview.reason}")
            if operation == "stop" and not preview.changed:
                return GoalBarActionResult("refused", await self.read(), "already-paused")
            # A passivated agent comes back for the action (and stays for its length).
            async with self.service.live_continuation(self.session_id) as continuation:
                if operation == "stop":
                    return await self._pause(client, goal_id, continuation)
                return await self._start(client, goal_id, preview, continuation)

    async def _start(
        self, client: LoopxClient, goal_id: str, preview: LifecycleResult, continuation: LoopxContinuation | None
    ) -> GoalBarActionResult:
        if continuation is not None and continuation.agent.status == "running":
            return GoalBarActionResult("refused", await self.read(), "agent-running")
        if not preview.changed and (continuation is None or not continuation.activation.active):
            return GoalBarActionResult("refused", await self.read(), "nothing-to-start")
        if preview.changed:
            result = await self._execute(client, goal_id, "resume")
            if isinstance(result, str):
                return await self._failed(goal_id, result)
        warnings = []
        if continuation is not None:
            try:
                await continuation.start()
            except Exception as exc:  # LoopX resumed the goal: that stands, with a warning
                log.warning("goalbar start left the continuation unarmed", session_id=self.session_id,
                            error=repr(exc))
                warnings.append("driver-sync-failed")
        return await self._read_back(warnings)

    async def _pause(
        self, client: LoopxClient, goal_id: str, continuation: LoopxContinuation | None
    ) -> GoalBarActionResult:
        warnings = []
        if continuation is None:
            result = await self._execute(client, goal_id, "stop")
        else:
            async with continuation.hold():
                result = await self._execute(client, goal_id, "stop")
                if not isinstance(result, str):
                    try:
                        continuation.paused("the goal is paused")
                    except Exception as exc:  # LoopX stopped the goal: that stands, with a warning
                        # (the continuation obeys LoopX's should-run at its next check)
                        log.warning("goalbar pause left the continuation untold", session_id=self.session_id,
                                    error=repr(exc))
                        warnings.append("driver-sync-failed")
            if isinstance(result, str):
                continuation.request()  # not paused after all: it may go on
        if isinstance(result, str):
            return await self._failed(goal_id, result)
        if not result.changed:  # stopped by someone else since the preview
            return GoalBarActionResult("refused", await self.read(), "already-paused")
        return await self._read_back(warnings)

    async def _read_back(self, warnings: list[str]) -> GoalBarActionResult:
        """A verified mutation, and the fresh read that follows it; a read that fails is
        warned of (the mutation stands)."""
        state = await self.read()
        if isinstance(state, GoalBarHidden) and state.reason == "loopx-failure":
            warnings.append("post-read-failed")
        return GoalBarActionResult("done", state, warnings=tuple(warnings))

    async def _execute(self, client: LoopxClient, goal_id: str, operation: Operation) -> LifecycleResult | str:
        """The lifecycle mutation with its readback: LoopX's verified result, or why not."""
        self._error = None
        self._pending = True
        self._publish()
        try:
            result = await client.goal_lifecycle(goal_id, operation, execute=True)
        finally:
            self._pending = False
            self._publish()  # shows the last read (never the optimistic state) ...
        if not isinstance(result, LifecycleResult):
            return f"{operation} failed: {result.reason}"
        if not result.readback_verified:
            return f"{operation} was not verified by LoopX"
        return result

    async def _failed(self, goal_id: str, error: str) -> GoalBarActionResult:
        self._error = (goal_id, error)
        return GoalBarActionResult("failed", await self.read(), error)  # ... until this fresh read


class GoalBarService:
    """The GoalBar host side. Open it with :meth:`open` (its nursery holds the actors and
    their Start/Pause tasks); ``client_for(project)`` gives the LoopX client for a
    project; ``continuations`` (the runtime's LoopX integration) the live continuation of
    a session, which the bar shows and Start/Pause control."""

    def __init__(
        self,
        client_for: Callable[[Path], LoopxClient],
        nursery: trio.Nursery,
        *,
        poll_interval: float = 0.25,
        continuations: LoopxIntegration | None = None,
    ) -> None:
        if not (isinstance(poll_interval, (int, float)) and math.isfinite(poll_interval) and poll_interval > 0):
            raise ValueError("poll_interval must be a positive number of seconds")
        self._client_for = client_for
        self._nursery = nursery
        self.poll_interval = float(poll_interval)
        self.continuations = continuations
        self._actors: dict[tuple[str, Path], _GoalWatch] = {}
        #: per (project, goal): held by one Start/Pause at a time, dropped when idle
        self.locks: KeyedLocks[tuple[Path, str]] = KeyedLocks()

    @classmethod
    def open(
        cls,
        client_for: Callable[[Path], LoopxClient],
        *,
        poll_interval: float = 0.25,
        continuations: LoopxIntegration | None = None,
    ) -> AbstractAsyncContextManager[GoalBarService]:
        """``async with GoalBarService.open(client_for) as service:``; leaving it cancels
        every actor (and a Start/Pause still running)."""

        @asynccontextmanager
        async def opened() -> AsyncIterator[GoalBarService]:
            async with trio.open_nursery() as nursery:
                service = cls(client_for, nursery, poll_interval=poll_interval, continuations=continuations)
                try:
                    yield service
                finally:
                    nursery.cancel_scope.cancel()

        return opened()

    def continuation_for(self, session_id: str) -> LoopxContinuation | None:
        return self.continuations.continuation(session_id) if self.continuations is not None else None

    def continuation_status(self, session_id: str) -> ContinuationStatus | None:
        """The continuation's status (a passivated agent's: as it was kept)."""
        return self.continuations.status(session_id) if self.continuations is not None else None

    @asynccontextmanager
    async def live_continuation(self, session_id: str) -> AsyncIterator[LoopxContinuation | None]:
        """The live continuation for an action, its agent brought back if passivated."""
        if self.continuations is None:
            yield None
            return
        async with self.continuations.live(session_id) as continuation:
            yield continuation

    @property
    def continuation_changes(self) -> Changes | None:
        return self.continuations.changes if self.continuations is not None else None

    def _actor(self, session_id: str, project: Path) -> _GoalWatch:
        check_thread_id(session_id)
        key = (session_id, Path(project).resolve())
        actor = self._actors.get(key)
        if actor is None:
            actor = self._actors[key] = _GoalWatch(self, session_id, key[1])
            self._nursery.start_soon(actor.run)
        return actor

    def actor_stats(self, session_id: str, project: Path) -> dict[str, int]:
        """Counters of one actor (``reads``, ``forced_reads``, ``watchers``, ``version``,
        ``mutations``)."""
        actor = self._actor(session_id, project)
        return {"reads": actor.reads, "forced_reads": actor.forced_reads, "watchers": actor.watchers,
                "version": actor.changes.version, "mutations": actor.mutations}

    async def read(self, session_id: str, project: Path) -> GoalBarState:
        """A fresh projection from LoopX (coalesced with other pending requests)."""
        return await self._actor(session_id, project).read()

    def wake(self, session_id: str) -> int:
        """A session event or agent status change for ``session_id``: request a re-read of
        its watched actors (no actor is created, and an unwatched one is not read: runtime
        events alone make no bar). Returns how many actors were woken."""
        woken = 0
        for (sid, _), actor in list(self._actors.items()):
            if sid == session_id and not actor.closed and actor.watchers:
                actor.request()
                woken += 1
        return woken

    async def watch(self, session_id: str, project: Path) -> AsyncGenerator[GoalBarState, None]:
        """The current state, then every change (latest state first: a slow watcher skips
        intermediate states). Ends when the service closes. Use with ``aclosing``."""
        actor = self._actor(session_id, project)
        actor.watchers += 1
        try:
            if actor.state is None:
                await actor.read()
            seen = -1
            while not actor.closed:
                if actor.changes.version != seen:
                    seen = actor.changes.version
                    assert actor.state is not None
                    yield actor.state
                else:
                    await actor.changes.wait()
        finally:
            actor.watchers -= 1

    async def start(
        self, session_id: str, project: Path, *, expected: tuple[str, str] | None = None
    ) -> GoalBarActionResult:
        """Start: resume the bound goal if it is stopped, then re-arm and evaluate the
        session's continuation (see the module docstring). ``expected``: the (goal,
        agent) the user saw; default the bar's current binding. The action runs as the
        service's task: cancelling this call only stops waiting for it."""
        return await self._actor(session_id, project).act("resume", expected)

    async def pause(
        self, session_id: str, project: Path, *, expected: tuple[str, str] | None = None
    ) -> GoalBarActionResult:
        """Pause: hold the session's continuation and stop the bound goal (see
        :meth:`start`)."""
        return await self._actor(session_id, project).act("stop", expected)


def state_to_view(state: GoalBarState) -> GoalbarView:
    """The state as the wire's ``GoalbarView``."""
    return GoalbarView(**state_to_json(state))


#: The detail of the ``loopx-off`` state.
LOOPX_OFF_DETAIL = "the LoopX integration is off in this runtime"


class GoalBarHandler(HandlerLayer):
    """A handler that serves GoalBar pages and passes everything else on to ``inner``.

    ``project_for(session_id)`` names the LoopX project of a session (``None``: the bar is
    hidden, reason ``unbound``). Session events from a DSH host wake the sessions they
    belong to (and go on to ``inner``); ``goalbarWatch`` starts a task in ``nursery`` that
    pushes every change to that page until it disconnects.

    ``service=None``: the runtime has no LoopX integration. Every page gets a hidden bar
    with the reason ``loopx-off`` (and a Start/Pause is ``refused`` with that reason); no
    CLI is called and nothing is guessed.
    """

    def __init__(
        self,
        service: GoalBarService | None,
        project_for: Callable[[str], Path | None],
        nursery: trio.Nursery,
        inner: BridgeHandler | None = None,
    ) -> None:
        super().__init__(inner)
        self.service = service
        self.project_for = project_for
        self._nursery = nursery
        self._watches: dict[Peer, list[trio.CancelScope]] = {}

    def disconnected(self, conn: Peer, reason: Disconnect) -> None:
        for scope in self._watches.pop(conn, []):
            scope.cancel()
        super().disconnected(conn, reason)

    async def on_events(self, conn: Peer, items: Sequence[SessionEvent]) -> None:
        if self.service is not None:
            for session_id in {item.session_id for item in items}:
                self.service.wake(session_id)
        await super().on_events(conn, items)

    async def on_goalbar(
        self, conn: Peer, request: GoalbarRead | GoalbarWatch | GoalbarStart | GoalbarPause
    ) -> GoalbarResult:
        session_id = check_thread_id(request.session_id)  # LoopxRequestError -> error frame
        if self.service is None:
            off = state_to_view(GoalBarHidden(session_id, "loopx-off", LOOPX_OFF_DETAIL))
            if isinstance(request, (GoalbarRead, GoalbarWatch)):
                return GoalbarResult(off)
            return GoalbarResult(off, "refused", "loopx-off")
        project = self.project_for(session_id)
        if project is None:
            return GoalbarResult(state_to_view(GoalBarHidden(session_id, "unbound")))
        if isinstance(request, GoalbarRead):
            return GoalbarResult(state_to_view(await self.service.read(session_id, project)))
        if isinstance(request, GoalbarWatch):
            state = await self.service.read(session_id, project)
            scope = trio.CancelScope()
            self._watches.setdefault(conn, []).append(scope)
            self._nursery.start_soon(self._pump, self.service, conn, scope, session_id, project)
            return GoalbarResult(state_to_view(state))
        expected = None
        if request.goal_id is not None and request.agent_id is not None:
            expected = (request.goal_id, request.agent_id)
        action = self.service.start if isinstance(request, GoalbarStart) else self.service.pause
        result = await action(session_id, project, expected=expected)
        return GoalbarResult(state_to_view(result.state), result.outcome, result.reason, result.warnings or None)

    async def _pump(
        self, service: GoalBarService, conn: Peer, scope: trio.CancelScope, session_id: str, project: Path
    ) -> None:
        try:
            with scope:
                if conn.closed is not None:
                    return
                async with aclosing(service.watch(session_id, project)) as states:
                    async for state in states:
                        if not conn.publish_goalbar(state_to_view(state)):
                            return
        except Exception as exc:  # contained: this page's pushes end, the bridge goes on
            log.warning("goalbar push failed", session_id=session_id, error=repr(exc))
        finally:
            scopes = self._watches.get(conn)
            if scopes is not None and scope in scopes:
                scopes.remove(scope)
