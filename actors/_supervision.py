"""Supervision: what happens when an actor fails.

Every actor runs under an owner (a nursery) and a written policy, as in Erlang/OTP and Akka:
a failure is contained by the actor's supervisor, reported where a person will see it,
and then the actor is restarted (with backoff, at most so many times in a window) or
stopped. It never ends a sibling or the runtime. The policies in use (docs/supervision.md):

==========================  =======================  =====================================
actor                       owner                    on failure
==========================  =======================  =====================================
agent (its evaluator)       the supervisor           stop: the agent is retired, its
                                                     session closed; a fault is recorded
companion (e.g. the LoopX   its agent                restart (COMPANION_POLICY), then stop;
continuation)                                        each failure recorded in the session
skill catalog watcher       the runtime              restart (WATCHER_POLICY), then stop:
                                                     lookups check the disk every time
admission gate, gc governor the runtime              restart (WATCHER_POLICY), then stop:
                                                     stalls stay counted / nothing more is
                                                     frozen (long collector pauses again)
store writer                the runtime              the store is unusable: the runtime
                                                     ends with StoreUnusableError
==========================  =======================  =====================================

Cancellation is never a failure: it always goes through.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Literal

import attrs
import trio

from loopdock.runtime import get_logger

log = get_logger(__name__)

Action = Literal["restarted", "stopped"]


@attrs.frozen
class Policy:
    """``restart``: run the actor again after ``backoff[i]`` seconds (the last value
    repeats), unless it failed more than ``max_restarts`` times within ``window``
    seconds; then stop. ``stop``: never restart."""

    kind: Literal["restart", "stop"]
    max_restarts: int = 0
    window: float = 0.0
    backoff: tuple[float, ...] = (0.0,)

    def delay(self, attempt: int) -> float:
        return self.backoff[min(attempt, len(self.backoff) - 1)]


STOP = Policy("stop")
#: A companion (such as the LoopX continuation) is restarted up to 3 times in 10 minutes.
COMPANION_POLICY = Policy("restart", max_restarts=3, window=600.0, backoff=(1.0, 10.0, 60.0))
#: The skill catalog's change watcher: up to 5 restarts in 10 minutes.
WATCHER_POLICY = Policy("restart", max_restarts=5, window=600.0, backoff=(1.0, 5.0, 30.0))

#: ``report(error, action)``: told of every failure and what happens next. Must not raise.
Report = Callable[[Exception, Action], None]


class _Started:
    """The task status handed to each attempt: forwards the first ``started()`` only, so
    a restarted actor does not report started twice."""

    def __init__(self, outer: trio.TaskStatus[Any]) -> None:
        self._outer = outer
        self.done = False

    def started(self, value: Any = None) -> None:
        if not self.done:
            self.done = True
            self._outer.started(value)


async def supervised(
    actor: Callable[..., Awaitable[Any]],
    *args: Any,
    name: str,
    policy: Policy,
    report: Report,
    task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run ``actor(*args, task_status=...)`` under ``policy`` (use with ``nursery.start``).

    A failure (an ``Exception``, an exception group of them included) is reported and
    contained: the actor is restarted or stopped as the policy says, and this returns
    normally when it stops. An actor that stops before it reported started is treated as
    started, so the caller is never left waiting. Cancellation propagates untouched.
    """
    status = _Started(task_status)
    failures: list[float] = []  # times of recent failures (a list: most actors never fail)
    while True:
        try:
            await actor(*args, task_status=status)
            status.started()
            return
        except BaseException as raised:
            exc, rest = _split(raised)
            if exc is None:
                raise
            now = trio.current_time()
            failures.append(now)
            while failures and now - failures[0] > policy.window:
                del failures[0]
            restart = policy.kind == "restart" and len(failures) <= policy.max_restarts
            action: Action = "restarted" if restart else "stopped"
            try:
                report(exc, action)
            except Exception as broken:  # a report must not take the supervisor down
                log.error("failure report failed", actor=name, error=repr(broken))
            if rest is not None:  # cancelled (or interrupted) as it failed: that goes through
                # The failure in ``raised`` is reported above: only the rest propagates.
                raise rest from None
            if not restart:
                status.started()
                return
            await trio.sleep(policy.delay(len(failures) - 1))


def _split(raised: BaseException) -> tuple[Exception | None, BaseException | None]:
    """(the failure, what must propagate): a group is split into its ``Exception`` part
    and the rest (``Cancelled``, ``KeyboardInterrupt``)."""
    if isinstance(raised, BaseExceptionGroup):
        failures, rest = raised.split(Exception)
        failure: Exception | None = failures
        # One failure out of a nursery is reported as itself, not as a group of one.
        while isinstance(failure, ExceptionGroup) and len(failure.exceptions) == 1:
            failure = failure.exceptions[0]
        return failure, rest
    if isinstance(raised, Exception):
        return raised, None
    return None, raised
