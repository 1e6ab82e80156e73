"""The LoopX CLI client: fixed argv, no shell, JSON on stdout, typed results.

LoopX is the only authority for goals, agent lanes, todos, thread bindings, quota,
heartbeat receipts, lifecycle and progress; this module only calls its CLI (the commands
and answers listed below, checked against the real CLI by the tests) and turns each answer
into a typed value. It never reads or writes ``.loopx/`` itself.

Every call is ``[*command, --registry .loopx/registry.json, [--runtime-root R,]
--format json, SUB, ...]`` run with ``cwd=project`` through :func:`runtime._process.run_child`
inside the caller's cancel scope. A per-attempt timeout is a ``trio.move_on_after``;
cancellation (the timeout's or the caller's) terminates the child's process group, then
kills everything it started -- loopx is a Python process that starts Node children -- and
waits for all of it before returning. A call that ends by itself leaves LoopX's own
effect-runtime server running for the next call, as LoopX intends. The child sees only :func:`loopx_env` of the given
environment (never the runtime's API keys), and its output is capped
(``MAX_STDOUT_BYTES``, ``MAX_STDERR_BYTES``): past a cap the child is stopped and the
call is a :class:`MalformedOutput` of kind ``too-large``.

One call ends in exactly one of four results:

- :class:`LoopxOk`: exit 0 and a JSON object with ``ok: true``.
- :class:`LoopxFailure`: a non-zero exit with a JSON object with ``ok: false``. LoopX's
  typed answer: authoritative, never retried.
- :class:`TransportFailure`: a timeout, a spawn failure, or a non-zero exit without a JSON
  object. The only result that is ever retried, and only when the call asked for it.
- :class:`MalformedOutput`: exit 0 without a JSON object, JSON whose ``ok`` disagrees with
  the exit code, or more output than the caps allow; the typed command methods also
  return it when an answer breaks its
  schema (a wrong turn id, a task body without exactly one ``LOOPX_TURN``, ...). Never
  retried.

``reason`` strings are safe to show to a model or a UI: they are built from fixed phrases
and numbers only, never from the child's output, and never contain a local path.

Facts about the real CLI (loopx 2.1.1 with Node 22.23.3), checked by
``tests/runtime/test_loopx_cli.py``:

- Global options go before the subcommand. ``--registry .loopx/registry.json`` is relative
  to the cwd; ``--runtime-root`` moves the global registry, authority and goal runtime
  state out of ``$HOME``. Both are echoed into every command template LoopX hands back
  (the settlement plan, ``next_cli_actions``, the thin task body), with the runtime root
  and the registry made absolute in the task body.
- Exit code 0 iff ``ok: true`` held for every command we call; an ``ok: false`` answer
  exits 1. An argparse usage error exits 2 with usage text on stderr and nothing on
  stdout. A typed refusal names itself in ``error_kind`` (bindings) or ``error_code``
  (quota), sometimes in neither (``heartbeat-prompt``, ``todo list``, ``goal-lifecycle``
  only have ``error``).
- ``--version`` prints ``loopx 2.1.1`` (not JSON).
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, cast

import attrs
import trio

from .. import _process as process
from .._errors import LoopdockError

__all__ = [
    "ATTEMPT_BACKOFF",
    "HOST_SURFACE",
    "MAX_ATTEMPTS",
    "MAX_TASK_BODY_CHARS",
    "LOOPX_TURN_PATTERN",
    "LoopxClient",
    "LoopxFailure",
    "LoopxFailureResult",
    "LoopxOk",
    "LoopxRequestError",
    "LoopxResult",
    "LoopxVersion",
    "MalformedOutput",
    "Recovery",
    "SchedulerHint",
    "ShouldRun",
    "SkillsResult",
    "TaskBody",
    "ThreadBinding",
    "TodoProgress",
    "TransportFailure",
    "LifecycleResult",
    "check_agent_id",
    "check_goal_id",
    "check_thread_id",
    "check_turn_id",
    "is_agent_id",
    "is_goal_id",
    "loopx_env",
]

#: The host surface of a visible, same-session DSH integration.
HOST_SURFACE = "deepseek-harness-native"
#: The retry policy (the one LoopX's reference DSH plugin uses): at most three
#: attempts in all, waiting ~0.2 s and then ~0.75 s, for transport failures only.
MAX_ATTEMPTS = 3
ATTEMPT_BACKOFF = (0.2, 0.75)
#: A thin task body must be at most this long ...
MAX_TASK_BODY_CHARS = 32_000
#: ... and contain exactly one match of this, naming the requested turn id.
LOOPX_TURN_PATTERN = re.compile(r"\bLOOPX_TURN=([^\s`'\";]+)")

HEARTBEAT_SCHEMAS = frozenset({"heartbeat_agent_input_v1", "loopx_heartbeat_prompt_v0"})
BINDING_RESOLUTION_SCHEMA = "loopx_thread_agent_binding_resolution_v0"
SKILL_INSTALL_SCHEMA = "loopx_workflow_skill_install_v0"
RECEIPT_STATUSES = frozenset({"committed", "replayed", "upgraded", "write_failed"})

# After SIGTERM to the child's process group, how long before SIGKILL.
_KILL_GRACE = 2.0
#: The most output one call may produce. The largest real answers (a status, a skills
#: install) are tens of kilobytes; past a cap the child is stopped, never read further.
MAX_STDOUT_BYTES = 4 * 1024 * 1024
MAX_STDERR_BYTES = 1024 * 1024
#: What a LoopX child sees of the environment it is given, beyond the base set every
#: child gets (PATH, which must reach Node >= 22.22.3; HOME; the locale): LoopX's own
#: settings, DSH's folders and the XDG folders. Never an API key or a token.
LOOPX_ENV_NAMES = process.BASE_ENV | {
    "DSH_HOME",
    "DSH_AGENTS_HOME",
    "XDG_CONFIG_HOME",
    "XDG_STATE_HOME",
    "XDG_DATA_HOME",
    "XDG_CACHE_HOME",
}
LOOPX_ENV_PREFIXES = ("LOOPX_",)
_REGISTRY = ".loopx/registry.json"
# LoopX's own agent-id rule (``AGENT_ID_PATTERN`` of its control plane; ``register-agent``
# normalizes every id it stores to it, so a binding never names anything else).
_AGENT_ID = re.compile(r"^[a-z][a-z0-9_.:@-]{0,79}$")
#: LoopX keeps a goal in a directory named after its id: the file system's name limit
#: (255 bytes) is the only length limit it has (a 150-character id works, 400 fail).
MAX_GOAL_ID_BYTES = 255
# What a LoopX error kind/code looks like; anything else is not passed on.
_KIND = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$")
# LoopX's own turn-id rule (loopx.turn_identity.TURN_INSTANCE_ID_RE).
_TURN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
_VERSION_LINE = re.compile(r"^loopx (\d+)\.(\d+)\.(\d+)\S*$")


class LoopxRequestError(LoopdockError):
    """Raised before any CLI call when a request is invalid: an identity (thread, goal,
    agent or turn id) breaks LoopX's rules, or an argument is out of range."""

    code = "INVALID_LOOPX_REQUEST"


# -- Raw results ----------------------------------------------------------------------------


@attrs.frozen
class LoopxOk:
    """Exit 0 with a JSON object whose ``ok`` is true."""

    payload: Mapping[str, Any]


@attrs.frozen
class LoopxFailure:
    """A non-zero exit with a JSON object whose ``ok`` is false: LoopX's authoritative,
    typed answer. Never retried. ``error_kind`` is LoopX's ``error_kind`` (or
    ``error_code``) when it is a plain token, else ``None``."""

    payload: Mapping[str, Any]
    error_kind: str | None

    @property
    def reason(self) -> str:
        return f"loopx refused: {self.error_kind}" if self.error_kind else "loopx refused"


@attrs.frozen
class TransportFailure:
    """The call did not produce an answer: ``kind`` is ``timeout``, ``spawn`` or ``exit``
    (a non-zero exit without a JSON object). The only retryable result."""

    reason: str
    kind: Literal["timeout", "spawn", "exit"]


@attrs.frozen
class MalformedOutput:
    """An answer this client cannot trust; never retried. ``kind`` is ``not-json``,
    ``ok-mismatch``, ``schema`` (the typed methods' checks) or ``too-large`` (the output
    passed its cap and the child was stopped)."""

    reason: str
    kind: Literal["not-json", "ok-mismatch", "schema", "too-large"] = "schema"


LoopxResult = Union[LoopxOk, LoopxFailure, TransportFailure, MalformedOutput]
_R = TypeVar("_R")
LoopxFailureResult = Union[LoopxFailure, TransportFailure, MalformedOutput]


# -- Parsed results -------------------------------------------------------------------------


@attrs.frozen
class LoopxVersion:
    """``loopx --version``: the first line ``loopx X.Y.Z``."""

    version: str
    parts: tuple[int, int, int]


@attrs.frozen
class ThreadBinding:
    """``resolve-agent-thread``: ``missing`` (no ids), ``bound`` (exactly one goal/agent),
    ``ambiguous`` (more than one) or ``unavailable`` (an invalid request or a LoopX failure).
    The last two come from LoopX as ``ok: false`` answers; ``error_kind`` then says which."""

    status: Literal["missing", "bound", "ambiguous", "unavailable"]
    goal_id: str | None = None
    agent_id: str | None = None
    error_kind: str | None = None


@attrs.frozen
class Recovery:
    """``unsettled_host_turn_recovery`` of a should-run answer: an earlier admitted turn of
    this agent lane (``prior_turn_id``) has no legal closeout. ``repair`` is LoopX's typed
    repair lane: ``resume_prior_turn`` (re-enter that turn's own guard and settle it under
    its identity), or one that needs judgement (``lifecycle``, ``dependency``,
    ``monitor_poll``, ``blocked_writeback``, ...). ``binding_id``: the prior turn's todo."""

    repair: str | None
    prior_turn_id: str | None
    binding_id: str | None
    reason_code: str | None


@attrs.frozen
class SchedulerHint:
    """What a should-run answer's ``scheduler_hint`` tells a local scheduler (a host that
    polls LoopX itself, as the continuation does), as LoopX 2.1.1 projects it with
    ``--include-detail scheduler``:

    - ``action``: ``scheduler_hint.action`` (``run_now``, ``backoff_until_reassigned``,
      ``backoff_waiting_for_user``, ``stop_until_explicit_resume``, ...);
    - ``local``: ``scheduler_hint.unchanged_poll.local_scheduler`` when LoopX gives it as a
      directive instead of a cadence (``stop`` for a stopped or finished goal,
      ``stop_until_context_repaired``, ``continue``);
    - ``interval_minutes``, ``max_interval_minutes``, ``progression_minutes``,
      ``unchanged_poll_limit``, ``after_limit``: ``scheduler_hint.cold_path_detail
      .local_scheduler``'s ``recommended_interval_minutes``, ``max_interval_minutes``,
      ``example_progression_minutes``, ``unchanged_poll_limit`` (``None``: no limit) and
      ``after_limit`` (``stop_tick_loop`` or ``continue``); the limit and ``after_limit``
      fall back to ``scheduler_hint.unchanged_poll.limits/after_limits.local_scheduler``;
    - ``reset_token``: ``scheduler_hint.reset_policy.reset_token``, a digest of the
      decision's identity: the same token means nothing LoopX tracks has changed (an
      *unchanged poll*); a new one means start the progression again.
    """

    action: str | None = None
    local: str | None = None
    interval_minutes: float | None = None
    max_interval_minutes: float | None = None
    progression_minutes: tuple[float, ...] = ()
    unchanged_poll_limit: int | None = None
    after_limit: str | None = None
    reset_token: str | None = None

    @property
    def stops(self) -> bool:
        """LoopX tells a local scheduler to stop polling (not to back off)."""
        return self.local is not None and self.local.startswith("stop")

    def interval_after(self, unchanged_polls: int) -> float | None:
        """Minutes to wait after ``unchanged_polls`` polls with this reset token: the
        progression's entry for it (its last once past its end), else the recommended
        interval; never past ``max_interval_minutes``. ``None``: no cadence was given."""
        if self.progression_minutes:
            minutes = self.progression_minutes[min(unchanged_polls, len(self.progression_minutes) - 1)]
        elif self.interval_minutes is not None:
            minutes = self.interval_minutes
        else:
            return None
        if self.max_interval_minutes is not None:
            minutes = min(minutes, self.max_interval_minutes)
        return minutes


@attrs.frozen
class ShouldRun:
    """``quota should-run`` with a turn id: LoopX's admission decision and its receipt.

    ``wait_minutes`` is ``scheduler_hint.cold_path_detail.local_scheduler
    .recommended_interval_minutes`` (only present with ``--include-detail scheduler``, and
    absent when LoopX says stop); ``scheduler_action`` is ``scheduler_hint.action``
    (``run_now``, ``stop_until_explicit_resume``, ...). ``effect_id`` and ``todo_id`` come
    from the receipt's settlement identity, which a skip has none of.
    ``settlement_plan`` is ``interaction_contract.cli_channel.settlement_plan`` as given.
    ``settlement_owed``: LoopX admitted a turn with no settlement identity yet
    (``heartbeat_receipt.settlement_binding_owed``; seen with the decision
    ``unsettled_host_turn_recovery`` while an earlier admitted turn of the agent is not
    settled): such a turn cannot be settled under its own exact identity.
    ``scheduler``: the scheduler hint (:class:`SchedulerHint`), when the answer has one.
    """

    should_run: bool
    decision: str
    turn_id: str
    wait_minutes: float | None
    scheduler_action: str | None
    receipt_status: str
    effect_id: str | None
    todo_id: str | None
    settlement_plan: Mapping[str, Any] | None
    payload: Mapping[str, Any]
    settlement_owed: bool = False
    recovery: Recovery | None = None
    pause_cause: str | None = None
    scheduler: SchedulerHint | None = None

    @property
    def goal_stopped(self) -> bool:
        """LoopX says the goal is stopped by its owner. A recovery turn is still admitted
        then (``should_run`` true), but nothing may continue until the goal is resumed."""
        return self.pause_cause == "goal_stopped" or self.scheduler_action == "stop_until_explicit_resume"


@attrs.frozen
class TaskBody:
    """The canonical thin task body for one exact turn (``heartbeat-prompt --thin``)."""

    text: str
    turn_id: str
    schema_version: str


@attrs.frozen
class LifecycleResult:
    """``goal-lifecycle``: ``readback_status`` is ``verified`` after an executed, read-back
    mutation, ``not_executed`` for a preview."""

    operation: str
    before_state: str
    after_state: str
    changed: bool
    written: bool
    readback_status: str | None
    readback_verified: bool
    payload: Mapping[str, Any]


@attrs.frozen
class TodoProgress:
    """An agent lane's todo counts (``todo list ... --limit 1`` -> ``agent_todos``)."""

    done: int
    open: int
    total: int


@attrs.frozen
class SkillsResult:
    """``workflow-skills``: ``operation`` is ``install`` or ``inspect`` (LoopX reports a
    ``--install --dry-run`` as an inspection). ``installed`` maps each packaged skill to
    ``created|updated|unchanged`` (install only); ``entry_status`` is the ``loopx`` entry
    skill's status; ``ready`` is the managed readback's ``ready`` (after an install, before
    it for an inspection)."""

    operation: str
    installed: Mapping[str, str]
    entry_status: str | None
    install_required: bool | None
    ready: bool | None
    payload: Mapping[str, Any]


# -- Identity checks ------------------------------------------------------------------------

_FORBIDDEN_IN_THREAD = frozenset("/\\\"'")


def check_thread_id(value: object) -> str:
    """A thread id: 1-128 chars, no whitespace, control chars, ``/``, ``\\``, ``"`` or ``'``."""
    if not isinstance(value, str) or not value or len(value) > 128:
        raise LoopxRequestError("a thread id must be a string of 1-128 characters")
    for ch in value:
        if ch.isspace() or ord(ch) < 32 or ord(ch) == 127 or ch in _FORBIDDEN_IN_THREAD:
            raise LoopxRequestError(
                "a thread id may not contain whitespace, control characters, / \\ \" or '"
            )
    return value


def is_goal_id(value: object) -> bool:
    """LoopX's goal-id rule as its CLI applies it: one path segment (no ``/`` or ``\\``,
    not ``.`` or ``..``) of at most 255 UTF-8 bytes. Two more refusals keep an argv safe:
    no NUL (an argv cannot carry it) and no leading ``-`` (argparse would read an option;
    LoopX's own ``--goal-id -x`` fails the same way)."""
    return (
        isinstance(value, str)
        and bool(value)
        and value not in (".", "..")
        and not value.startswith("-")
        and not any(ch in value for ch in "/\\\0")
        and len(value.encode("utf-8", "surrogatepass")) <= MAX_GOAL_ID_BYTES
    )


def is_agent_id(value: object) -> bool:
    """LoopX's agent-id rule: ``[a-z][a-z0-9_.:@-]{0,79}``."""
    return isinstance(value, str) and _AGENT_ID.fullmatch(value) is not None


def check_goal_id(value: object) -> str:
    if not is_goal_id(value):
        raise LoopxRequestError("a goal id must be one path segment of 1-255 bytes, not starting with '-'")
    assert isinstance(value, str)
    return value


def check_agent_id(value: object) -> str:
    if not is_agent_id(value):
        raise LoopxRequestError("an agent id must be 1-80 of a-z 0-9 _ . : @ - starting with a letter")
    assert isinstance(value, str)
    return value


def check_turn_id(value: object) -> str:
    """A turn id, by LoopX's own rule: 1-128 letters, digits or ``._:-``."""
    if not isinstance(value, str) or not _TURN_ID.fullmatch(value):
        raise LoopxRequestError(
            "a turn id must be 1-128 letters, digits or . _ : - starting with a letter or digit"
        )
    return value


def _token_or_none(value: object) -> str | None:
    return value if isinstance(value, str) and _KIND.fullmatch(value) else None


# -- The client -----------------------------------------------------------------------------


def loopx_env(source: Mapping[str, str]) -> dict[str, str]:
    """The environment of a LoopX child, picked from ``source``: ``LOOPX_ENV_NAMES``,
    every ``LOOPX_*`` variable, and always ``LOOPX_USAGE_PING=0``."""
    env = process.pick_env(source, LOOPX_ENV_NAMES, LOOPX_ENV_PREFIXES)
    # LoopX pings a usage endpoint daily unless told not to; this runtime never lets it.
    env["LOOPX_USAGE_PING"] = "0"
    return env


class LoopxClient:
    """Runs the LoopX CLI for one project.

    ``command`` is the argv prefix that starts the CLI (``["loopx"]``, or
    ``[python, launcher]`` for a managed install); ``env`` is where the child's environment
    is picked from by :func:`loopx_env` (``None``: this process's, as of construction);
    ``timeout`` bounds each attempt in seconds; ``runtime_root`` is passed as
    ``--runtime-root`` when given.
    """

    def __init__(
        self,
        command: Sequence[str],
        *,
        project: Path,
        env: Mapping[str, str] | None = None,
        timeout: float = 60.0,
        runtime_root: Path | None = None,
    ) -> None:
        if isinstance(command, str) or not command or not all(isinstance(a, str) and a for a in command):
            raise LoopxRequestError("command must be a non-empty sequence of argv strings")
        if not (isinstance(timeout, (int, float)) and math.isfinite(timeout) and timeout > 0):
            raise LoopxRequestError("timeout must be a positive number of seconds")
        self.command: tuple[str, ...] = tuple(command)
        self.project = Path(project)
        self.env = loopx_env(os.environ if env is None else env)
        self.timeout = float(timeout)
        self.runtime_root = Path(runtime_root) if runtime_root is not None else None

    # -- Raw calls ---------------------------------------------------------------------

    def argv(self, *args: str) -> list[str]:
        """The full argv of ``run(*args)``: global options, then the subcommand."""
        glob = ["--registry", _REGISTRY]
        if self.runtime_root is not None:
            glob += ["--runtime-root", str(self.runtime_root)]
        glob += ["--format", "json"]
        return [*self.command, *glob, *args]

    async def run(self, *args: str, retry: bool = False) -> LoopxResult:
        """Run one subcommand (``args``) with the global options and classify the answer.

        With ``retry=True`` (read-only calls, and ``quota should-run`` repeated with the
        same turn id) a :class:`TransportFailure` is retried: at most ``MAX_ATTEMPTS``
        attempts in all, after ``ATTEMPT_BACKOFF`` seconds. Every other result is final.
        """
        argv = self.argv(*args)
        return await self._attempts(lambda: self._run_json(argv), retry)

    async def _attempts(self, attempt: Callable[[], Awaitable[_R]], retry: bool) -> _R:
        attempts = MAX_ATTEMPTS if retry else 1
        for number in range(attempts):
            result = await attempt()
            if not isinstance(result, TransportFailure) or number + 1 == attempts:
                return result
            await trio.sleep(ATTEMPT_BACKOFF[number])
        raise AssertionError("unreachable")  # pragma: no cover

    async def _exec(self, argv: list[str]) -> tuple[int, bytes] | TransportFailure | MalformedOutput:
        """One child: (exit code, stdout); its stderr is never shown."""
        try:
            with trio.move_on_after(self.timeout) as deadline:
                outcome = await process.run_child(
                    argv,
                    cwd=self.project,
                    env=self.env,
                    max_stdout=MAX_STDOUT_BYTES,
                    max_stderr=MAX_STDERR_BYTES,
                    grace=_KILL_GRACE,
                    # LoopX starts its effect-runtime server (Node) in a session of its own and
                    # reuses it across calls until it idles out; killing it after every call
                    # made each mutating call start and compile it again (2.5 times slower).
                    leave_on_exit=True,
                )
        except OSError:
            return TransportFailure("could not start the loopx command", "spawn")
        if deadline.cancelled_caught:
            return TransportFailure(f"timed out after {self.timeout:g}s", "timeout")
        if outcome.overflow is not None:
            limit = MAX_STDOUT_BYTES if outcome.overflow == "stdout" else MAX_STDERR_BYTES
            return MalformedOutput(f"{outcome.overflow} passed {limit} bytes; the command was stopped", "too-large")
        return outcome.returncode, outcome.stdout

    async def _run_json(self, argv: list[str]) -> LoopxResult:
        outcome = await self._exec(argv)
        if isinstance(outcome, (TransportFailure, MalformedOutput)):
            return outcome
        code, stdout = outcome
        payload = _json_object(stdout)
        if payload is None:
            if code == 0:
                return MalformedOutput("exit code 0 without a JSON object", "not-json")
            if code < 0:
                return TransportFailure(f"killed by signal {-code} without JSON", "exit")
            return TransportFailure(f"exit code {code} without JSON", "exit")
        ok = payload.get("ok")
        if not isinstance(ok, bool):
            return MalformedOutput("JSON answer without a boolean ok", "ok-mismatch")
        if ok and code == 0:
            return LoopxOk(payload)
        if not ok and code != 0:
            kind = _token_or_none(payload.get("error_kind")) or _token_or_none(payload.get("error_code"))
            return LoopxFailure(payload, kind)
        return MalformedOutput(f"ok is {str(ok).lower()} but the exit code is {code}", "ok-mismatch")

    # -- Typed commands ----------------------------------------------------------------

    async def version(self, *, retry: bool = True) -> LoopxVersion | TransportFailure | MalformedOutput:
        """``[*command, "--version"]`` (no global options) -> first line ``loopx X.Y.Z``."""
        argv = [*self.command, "--version"]

        async def attempt() -> LoopxVersion | TransportFailure | MalformedOutput:
            outcome = await self._exec(argv)
            if isinstance(outcome, (TransportFailure, MalformedOutput)):
                return outcome
            code, stdout = outcome
            if code != 0:
                return TransportFailure(f"exit code {code} from --version", "exit")
            first = stdout.decode("utf-8", "replace").strip().splitlines()[:1]
            match = _VERSION_LINE.fullmatch(first[0].strip()) if first else None
            if match is None:
                return MalformedOutput("--version did not print 'loopx X.Y.Z'", "not-json")
            parts = (int(match[1]), int(match[2]), int(match[3]))
            return LoopxVersion(".".join(map(str, parts)), parts)

        return await self._attempts(attempt, retry)

    async def resolve_thread(self, thread_id: str) -> ThreadBinding | TransportFailure | MalformedOutput | LoopxFailure:
        """``resolve-agent-thread --host-surface deepseek-harness-native --thread-id T``.

        Read-only, retried. ``missing``/``bound`` are ``ok: true``; ``ambiguous``
        (``error_kind: thread_agent_binding_ambiguous``, every match listed) and
        ``unavailable`` (e.g. ``thread_agent_binding_invalid_request``) are ``ok: false``
        with the same schema and still come back as a :class:`ThreadBinding`. Any other
        ``ok: false`` answer is returned as the :class:`LoopxFailure` itself.
        """
        check_thread_id(thread_id)
        result = await self.run(
            "resolve-agent-thread", "--host-surface", HOST_SURFACE, "--thread-id", thread_id, retry=True
        )
        if isinstance(result, TransportFailure | MalformedOutput):
            return result
        payload = result.payload
        if payload.get("schema_version") != BINDING_RESOLUTION_SCHEMA:
            if isinstance(result, LoopxFailure):
                return result
            return MalformedOutput("binding answer has an unknown schema")
        status = payload.get("status")
        matches = payload.get("matches")
        if not isinstance(matches, list):
            return MalformedOutput("binding answer has no matches list")
        if isinstance(result, LoopxOk):
            if payload.get("thread_id") != thread_id or payload.get("host_surface") != HOST_SURFACE:
                return MalformedOutput("binding answer is for another thread")
            if status == "missing":
                if matches or payload.get("goal_id") is not None or payload.get("agent_id") is not None:
                    return MalformedOutput("a missing binding came with ids")
                return ThreadBinding("missing")
            if status == "bound":
                goal_id, agent_id = payload.get("goal_id"), payload.get("agent_id")
                if not (is_goal_id(goal_id) and is_agent_id(agent_id)):
                    return MalformedOutput("a bound binding came without a valid goal id and agent id")
                if matches != [{"goal_id": goal_id, "agent_id": agent_id}]:
                    return MalformedOutput("a bound binding must have exactly its own match")
                return ThreadBinding("bound", goal_id, agent_id)
            return MalformedOutput("binding answer has an unknown ok status")
        if status in ("ambiguous", "unavailable"):
            if status == "ambiguous" and (len(matches) < 2 or payload.get("thread_id") != thread_id):
                return MalformedOutput("an ambiguous binding must list two or more matches for this thread")
            return ThreadBinding(status, error_kind=result.error_kind)
        return MalformedOutput("binding refusal has an unknown status")

    async def should_run(
        self, goal_id: str, agent_id: str, turn_id: str
    ) -> ShouldRun | TransportFailure | MalformedOutput | LoopxFailure:
        """``quota should-run --goal-id G --agent-id A --runtime-profile generic_cli
        --include-detail scheduler --turn-instance-id T``.

        Retried on transport failures: safe because every call with a turn id writes a
        heartbeat receipt and the same T replays it (``status: replayed``, the same event
        and effect id). The receipt must name T; a settlement identity, when present, must
        be T's too. A skip (e.g. a stopped goal) has a receipt without one.
        """
        check_goal_id(goal_id)
        check_agent_id(agent_id)
        check_turn_id(turn_id)
        result = await self.run(
            "quota", "should-run",
            "--goal-id", goal_id,
            "--agent-id", agent_id,
            "--runtime-profile", "generic_cli",
            "--include-detail", "scheduler",
            "--turn-instance-id", turn_id,
            retry=True,
        )
        if not isinstance(result, LoopxOk):
            return result
        payload = result.payload
        should, decision = payload.get("should_run"), payload.get("decision")
        if not isinstance(should, bool) or not isinstance(decision, str):
            return MalformedOutput("should-run answer without should_run/decision")
        if not _names_only(payload, goal_id, agent_id):
            return MalformedOutput("should-run answer is for another goal or agent")
        receipt = payload.get("heartbeat_receipt")
        if not isinstance(receipt, Mapping) or receipt.get("turn_instance_id") != turn_id:
            return MalformedOutput("should-run answer without a receipt for this turn")
        status = receipt.get("status")
        if status not in RECEIPT_STATUSES:
            return MalformedOutput("should-run receipt has an unknown status")
        if receipt.get("partial_write") is True or (should and status == "write_failed"):
            # An ok answer whose receipt did not fully persist: a retry with the same turn
            # id could not replay it, so nothing may be admitted on it.
            return MalformedOutput("should-run receipt was not written completely")
        identity = receipt.get("settlement_identity")
        effect_id = todo_id = None
        if identity is not None:
            if not isinstance(identity, Mapping) or identity.get("turn_instance_id") != turn_id:
                return MalformedOutput("settlement identity is for another turn")
            if identity.get("goal_id") != goal_id or identity.get("agent_id") != agent_id:
                return MalformedOutput("settlement identity is for another goal or agent")
            effect_id = identity.get("effect_id")
            todo_id = identity.get("todo_id")
            if not isinstance(effect_id, str) or not effect_id.endswith(f":{turn_id}"):
                return MalformedOutput("settlement identity has no effect id for this turn")
            if todo_id is not None and not isinstance(todo_id, str):
                return MalformedOutput("settlement identity has a malformed todo id")
        elif should and receipt.get("settlement_binding_owed") is not True:
            return MalformedOutput("an admitted turn came without a settlement identity")
        plan = _path(payload, "interaction_contract", "cli_channel", "settlement_plan")
        if plan is not None and not isinstance(plan, Mapping):
            return MalformedOutput("settlement plan is not an object")
        scheduler = _scheduler_hint(payload.get("scheduler_hint"))
        if isinstance(scheduler, MalformedOutput):
            return scheduler
        recovery = _recovery(payload.get("unsettled_host_turn_recovery"))
        if isinstance(recovery, MalformedOutput):
            return recovery
        return ShouldRun(
            should_run=should,
            decision=decision,
            turn_id=turn_id,
            wait_minutes=scheduler.interval_minutes if scheduler is not None else None,
            scheduler_action=scheduler.action if scheduler is not None else None,
            receipt_status=status,
            effect_id=effect_id,
            todo_id=todo_id,
            settlement_plan=plan,
            payload=payload,
            settlement_owed=identity is None and should,
            recovery=recovery,
            pause_cause=_token_or_none(payload.get("pause_cause")),
            scheduler=scheduler,
        )

    async def heartbeat_prompt(
        self, goal_id: str, agent_id: str, turn_id: str
    ) -> TaskBody | TransportFailure | MalformedOutput | LoopxFailure:
        """``heartbeat-prompt --thin --goal-id G --agent-id A --runtime-profile generic_cli
        --turn-instance-id T``: read-only, retried.

        Accepts 2.x ``heartbeat_agent_input_v1`` and 0.5.x ``loopx_heartbeat_prompt_v0``
        (both carry ``goal_id``, ``agent_id``, ``turn_instance_id`` and ``task_body``). The
        body is rejected (:class:`MalformedOutput`) unless it is at most 32,000 characters
        and has exactly one ``LOOPX_TURN=<T>`` naming T. 2.1.1's body embeds a shell block
        ``LOOPX_TURN=T`` + the should-run guard with the absolute runtime root and registry.
        """
        check_goal_id(goal_id)
        check_agent_id(agent_id)
        check_turn_id(turn_id)
        result = await self.run(
            "heartbeat-prompt", "--thin",
            "--goal-id", goal_id,
            "--agent-id", agent_id,
            "--runtime-profile", "generic_cli",
            "--turn-instance-id", turn_id,
            retry=True,
        )
        if not isinstance(result, LoopxOk):
            return result
        payload = result.payload
        schema = payload.get("schema_version")
        if schema not in HEARTBEAT_SCHEMAS:
            return MalformedOutput("heartbeat answer has an unknown schema")
        if payload.get("goal_id") != goal_id or payload.get("agent_id") != agent_id:
            return MalformedOutput("heartbeat answer is for another goal or agent")
        if payload.get("turn_instance_id") != turn_id:
            return MalformedOutput("heartbeat answer is for another turn")
        body = payload.get("task_body")
        if not isinstance(body, str) or not body.strip():
            return MalformedOutput("heartbeat answer has no task body")
        if len(body) > MAX_TASK_BODY_CHARS:
            return MalformedOutput(f"task body is longer than {MAX_TASK_BODY_CHARS} characters")
        turns = LOOPX_TURN_PATTERN.findall(body)
        if len(turns) != 1:
            return MalformedOutput(f"task body has {len(turns)} LOOPX_TURN markers, not exactly one")
        if turns[0] != turn_id:
            return MalformedOutput("task body's LOOPX_TURN names another turn")
        return TaskBody(body, turn_id, schema)

    async def goal_lifecycle(
        self, goal_id: str, operation: Literal["stop", "resume"], *, execute: bool
    ) -> LifecycleResult | TransportFailure | MalformedOutput | LoopxFailure:
        """``goal-lifecycle --goal-id G --operation stop|resume`` (a preview: writes nothing,
        ``readback.status: not_executed``) or, with ``execute``, ``... --actor-kind owner
        --execute`` (2.x refuses ``--execute`` without ``--actor-kind``). Never retried: an
        execution is a mutation, and a preview is cheap to ask again. Repeating an executed
        operation is a no-op (``changed: false``) that still reads back ``verified``."""
        check_goal_id(goal_id)
        if operation not in ("stop", "resume"):
            raise LoopxRequestError("operation must be 'stop' or 'resume'")
        args = ["goal-lifecycle", "--goal-id", goal_id, "--operation", operation]
        if execute:
            args += ["--actor-kind", "owner", "--execute"]
        result = await self.run(*args)
        if not isinstance(result, LoopxOk):
            return result
        payload = result.payload
        before, after = payload.get("before_state"), payload.get("after_state")
        changed, written = payload.get("changed"), payload.get("written")
        if not (isinstance(before, str) and isinstance(after, str)):
            return MalformedOutput("lifecycle answer without before/after states")
        if not (isinstance(changed, bool) and isinstance(written, bool)):
            return MalformedOutput("lifecycle answer without changed/written")
        readback = payload.get("readback")
        if readback is not None and not isinstance(readback, Mapping):
            return MalformedOutput("lifecycle readback is not an object")
        status = readback.get("status") if readback else None
        verified = readback.get("verified") is True if readback else False
        if not execute and written:
            return MalformedOutput("a lifecycle preview says it wrote")
        if payload.get("partial_write") is True:
            return MalformedOutput("the lifecycle change was written only in part")
        return LifecycleResult(
            operation=operation,
            before_state=before,
            after_state=after,
            changed=changed,
            written=written,
            readback_status=status if isinstance(status, str) else None,
            readback_verified=verified,
            payload=payload,
        )

    async def todo_progress(
        self, goal_id: str, agent_id: str
    ) -> TodoProgress | TransportFailure | MalformedOutput | LoopxFailure:
        """``todo list --goal-id G --role agent --agent-id A --limit 1`` ->
        ``agent_todos{done_count, open_count, total_count}``. Read-only, retried."""
        check_goal_id(goal_id)
        check_agent_id(agent_id)
        result = await self.run(
            "todo", "list", "--goal-id", goal_id, "--role", "agent", "--agent-id", agent_id, "--limit", "1",
            retry=True,
        )
        if not isinstance(result, LoopxOk):
            return result
        counts = result.payload.get("agent_todos")
        if not isinstance(counts, Mapping):
            return MalformedOutput("todo list answer without agent_todos")
        values = [counts.get(k) for k in ("done_count", "open_count", "total_count")]
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
            return MalformedOutput("todo counts are not non-negative integers")
        done, open_, total = cast(list[int], values)
        if done + open_ != total:
            return MalformedOutput("todo counts do not add up (done + open != total)")
        return TodoProgress(done, open_, total)

    async def workflow_skills(
        self,
        skills_dir: Path,
        *,
        install: bool,
        dry_run: bool = False,
        cli_bin: str | None = None,
        cli_argv: Sequence[str] | None = None,
    ) -> SkillsResult | TransportFailure | MalformedOutput | LoopxFailure:
        """``workflow-skills [--install] --skills-dir D --host-surface
        deepseek-harness-native [--cli-bin C] [--dry-run]``.

        ``cli_bin`` is passed as given and must be one shell word; ``cli_argv`` (instead)
        is a command of several words, e.g. ``(python, "-m", "loopx.cli")``, passed as
        ``shlex.join(cli_argv)`` so that every word stays one word in the skills' shell
        commands. An install is never retried (it mutates); an inspection or a dry run
        is. A user-owned ``loopx/SKILL.md`` makes an install answer ``ok: false``
        (``skipped_user_file``): that comes back as the :class:`LoopxFailure`.
        """
        args = ["workflow-skills"]
        if install:
            args.append("--install")
        args += ["--skills-dir", str(skills_dir), "--host-surface", HOST_SURFACE]
        if cli_argv is not None:
            if cli_bin is not None:
                raise LoopxRequestError("pass cli_bin or cli_argv, not both")
            if (isinstance(cli_argv, str) or not cli_argv
                    or not all(isinstance(w, str) and w for w in cli_argv)
                    or any(ord(c) < 32 or ord(c) == 127 for w in cli_argv for c in w)):
                raise LoopxRequestError("cli_argv must be non-empty words without control characters")
            args += ["--cli-bin", shlex.join(cli_argv)]
        if cli_bin is not None:
            # LoopX pastes it verbatim into the shell commands of the skills it writes:
            # exactly one POSIX shell word (``shlex.quote`` a path with a space).
            if not isinstance(cli_bin, str) or any(ord(c) < 32 or ord(c) == 127 for c in cli_bin):
                raise LoopxRequestError("cli_bin must be one shell word without control characters")
            try:
                words = shlex.split(cli_bin)
            except ValueError:
                words = []
            if len(words) != 1 or not words[0]:
                raise LoopxRequestError("cli_bin must be one shell word (quote a path with spaces)")
            args += ["--cli-bin", cli_bin]
        if dry_run:
            args.append("--dry-run")
        result = await self.run(*args, retry=not install or dry_run)
        if not isinstance(result, LoopxOk):
            return result
        payload = result.payload
        if payload.get("schema_version") != SKILL_INSTALL_SCHEMA:
            return MalformedOutput("workflow-skills answer has an unknown schema")
        operation = payload.get("operation")
        if not isinstance(operation, str):
            return MalformedOutput("workflow-skills answer without an operation")
        installed = payload.get("installed") or {}
        if not isinstance(installed, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in installed.items()
        ):
            return MalformedOutput("workflow-skills installed map is malformed")
        entry = payload.get("entry")
        entry_status = entry.get("status") if isinstance(entry, Mapping) else None
        readback = payload.get("after") if operation == "install" else payload.get("before")
        ready = readback.get("ready") if isinstance(readback, Mapping) else None
        required = payload.get("install_required")
        return SkillsResult(
            operation=operation,
            installed=dict(installed),
            entry_status=entry_status if isinstance(entry_status, str) else None,
            install_required=required if isinstance(required, bool) else None,
            ready=ready if isinstance(ready, bool) else None,
            payload=payload,
        )


def _names_only(payload: Mapping[str, Any], goal_id: str, agent_id: str) -> bool:
    """A should-run answer must name the goal and the agent it was asked about, and no
    other: 2.1.1 names them as ``goal_id`` and ``agent_identity.agent_id`` (a failure as
    ``agent_id``); the receipt's settlement identity names them too (checked with it)."""
    identity = payload.get("agent_identity")
    named = [payload.get("agent_id"), identity.get("agent_id") if isinstance(identity, Mapping) else None]
    agents = [a for a in named if a is not None]
    return payload.get("goal_id") == goal_id and bool(agents) and all(a == agent_id for a in agents)


def _minutes(value: object) -> float | None | MalformedOutput:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        return MalformedOutput("scheduler interval is not a non-negative number")
    return float(value)


def _scheduler_hint(hint: object) -> SchedulerHint | MalformedOutput | None:
    """``scheduler_hint`` of a should-run answer (see :class:`SchedulerHint`). A cadence
    that is not made of non-negative numbers, or a limit that is not a non-negative
    integer, breaks the contract: the answer is refused, never guessed at."""
    if hint is None:
        return None
    if not isinstance(hint, Mapping):
        return MalformedOutput("scheduler hint is not an object")
    unchanged = hint.get("unchanged_poll")
    unchanged = unchanged if isinstance(unchanged, Mapping) else {}
    directive = unchanged.get("local_scheduler")
    local = _path(hint, "cold_path_detail", "local_scheduler")
    local = local if isinstance(local, Mapping) else {}
    interval = _minutes(local.get("recommended_interval_minutes"))
    if isinstance(interval, MalformedOutput):
        return interval
    maximum = _minutes(local.get("max_interval_minutes"))
    if isinstance(maximum, MalformedOutput):
        return maximum
    raw_progression = local.get("example_progression_minutes", ())
    if not isinstance(raw_progression, (list, tuple)):
        return MalformedOutput("scheduler progression is not a list")
    progression: list[float] = []
    for entry in raw_progression:
        minutes = _minutes(entry)
        if not isinstance(minutes, float):
            return MalformedOutput("scheduler progression is not a list of non-negative numbers")
        progression.append(minutes)
    if "unchanged_poll_limit" in local:
        limit = local.get("unchanged_poll_limit")
        after = local.get("after_limit")
    else:
        limit = _path(unchanged, "limits", "local_scheduler")
        after = _path(unchanged, "after_limits", "local_scheduler")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        return MalformedOutput("scheduler unchanged-poll limit is not a non-negative integer")
    return SchedulerHint(
        action=_token_or_none(hint.get("action")),
        local=_token_or_none(directive),
        interval_minutes=interval,
        max_interval_minutes=maximum,
        progression_minutes=tuple(progression),
        unchanged_poll_limit=limit,
        after_limit=_token_or_none(after),
        reset_token=_token_or_none(_path(hint, "reset_policy", "reset_token")),
    )


def _recovery(value: object) -> Recovery | MalformedOutput | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        return MalformedOutput("unsettled turn recovery is not an object")
    prior = value.get("prior_turn_instance_id")
    if prior is not None and not (isinstance(prior, str) and _TURN_ID.fullmatch(prior)):
        return MalformedOutput("unsettled turn recovery names an invalid turn id")
    return Recovery(
        repair=_token_or_none(value.get("repair")),
        prior_turn_id=prior,
        binding_id=_token_or_none(value.get("binding_id")),
        reason_code=_token_or_none(value.get("reason_code")),
    )


def _json_object(stdout: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(stdout.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _path(payload: Mapping[str, Any], *keys: str) -> Any:
    value: Any = payload
    for key in keys:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value
