"""Slash commands: a registry, and running one against one agent.

``await rt.execute_command(agent_id, "/name args")`` parses the line, withdraws the agent's
unadmitted automatic work (a command may change what that work was based on), logs
``command/run {name, args}``, runs the command and logs ``command/done {name, ok,
message}`` on the agent's session. A command that raises does not take the agent down:
the caller gets ``CommandResult(ok=False, ...)`` with a safe message, and the agent keeps
working. The same path will serve the bridge's commands.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping
from types import MappingProxyType
from typing import Any

import attrs
import trio

from loopdock.runtime import LoopdockError, get_logger, is_cancellation, safe_message

from ._agent import AgentActor
from ._session import SessionClosedError
from ._supervisor import Supervisor

log = get_logger(__name__)

COMMAND_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")
# Reservations withdrawn because a command ran settle ``cancelled`` with this reason.
WITHDRAW_REASON = "command"


class DuplicateCommandError(LoopdockError):
    """Raised when a command name is registered twice."""

    code = "DUPLICATE_COMMAND"


class InvalidCommandError(LoopdockError):
    """Raised when registering a command with a malformed name or no callable ``run``."""

    code = "INVALID_COMMAND"


class UnknownCommandError(LoopdockError):
    """Raised when a command line does not start with ``/`` or names no registered command."""

    code = "UNKNOWN_COMMAND"


class UnknownAgentError(LoopdockError):
    """Raised when a command targets an agent that is not live in this runtime."""

    code = "UNKNOWN_AGENT"


def _freeze(value: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(value))


@attrs.frozen
class CommandResult:
    """What a command reports: ``ok``, a short human-readable ``message``, and ``data``."""

    ok: bool
    message: str
    data: Mapping[str, Any] = attrs.field(factory=dict, converter=_freeze, hash=False)


@attrs.frozen
class CommandContext:
    """What a running command may use.

    ``cancel_scope`` is the scope the command runs in: it is cancelled when the target
    agent stops (disposed, or its runtime closing), so a command never outlives its agent.
    The caller's own cancellation reaches the command as usual.
    """

    name: str
    agent: AgentActor
    owner: Supervisor
    cancel_scope: trio.CancelScope = attrs.field(eq=False)

    @property
    def session_id(self) -> str:
        return self.agent.id


@attrs.frozen
class Command:
    """``run(ctx, args)`` does the work; ``args`` is the rest of the line, stripped."""

    name: str
    description: str
    run: Callable[[CommandContext, str], Awaitable[CommandResult]] = attrs.field(eq=False)


@attrs.define(eq=False)
class _Slot:
    # Disposers compare slots by identity, so an old disposer never removes a later
    # registration of the same name.
    command: Command


class CommandRegistry:
    """The runtime's slash commands, by unique name."""

    def __init__(self) -> None:
        self._slots: dict[str, _Slot] = {}

    def register(self, command: Command) -> Callable[[], None]:
        """Add ``command``; the returned disposer removes exactly this registration
        (calling it again, or after the name was registered anew, does nothing)."""
        if not isinstance(command, Command):
            raise InvalidCommandError(f"expected a Command, got {type(command).__name__}")
        if not isinstance(command.name, str) or not COMMAND_NAME.fullmatch(command.name):
            raise InvalidCommandError(
                f"command name {command.name!r} must match {COMMAND_NAME.pattern} (no leading '/')"
            )
        if not callable(command.run):
            raise InvalidCommandError(f"command {command.name!r} has no callable run")
        if command.name in self._slots:
            raise DuplicateCommandError(f"command {command.name!r} is already registered")
        slot = _Slot(command)
        self._slots[command.name] = slot

        def dispose() -> None:
            if self._slots.get(command.name) is slot:
                del self._slots[command.name]

        return dispose

    def get(self, name: str) -> Command | None:
        slot = self._slots.get(name)
        return slot.command if slot is not None else None

    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self._slots))

    def __contains__(self, name: object) -> bool:
        return name in self._slots

    def __len__(self) -> int:
        return len(self._slots)

    def parse(self, line: str) -> tuple[Command, str]:
        """``"/name args"`` -> (the command, ``"args"``); raises UnknownCommandError."""
        available = ", ".join(f"/{n}" for n in self.names()) or "none"
        if not isinstance(line, str) or not line.strip().startswith("/"):
            raise UnknownCommandError(f"a command line starts with '/'; commands: {available}")
        head, _, args = line.strip()[1:].partition(" ")
        command = self.get(head)
        if command is None:
            shown = head[:64] or "(empty)"
            raise UnknownCommandError(f"unknown command /{shown}; commands: {available}")
        return command, args.strip()


async def run_command(owner: Supervisor, agent: AgentActor, command: Command, args: str) -> CommandResult:
    """Run one parsed command against ``agent`` (active) and log it on the agent's session."""
    with agent.keep_active():  # never passivated while a command runs against it
        return await _run_command(owner, agent, command, args)


async def _run_command(owner: Supervisor, agent: AgentActor, command: Command, args: str) -> CommandResult:
    def log_event(event_type: str, data: Mapping[str, Any]) -> None:
        try:
            agent.session.append(event_type, data)
        except SessionClosedError:  # the agent went away meanwhile: nothing left to log on
            pass

    name = command.name
    log_event("command/run", {"name": name, "args": args})
    withdrawn = agent.withdraw_reservations(WITHDRAW_REASON)
    bound = log.bind(agent_id=agent.id, command=name)
    bound.info("command started", withdrawn=withdrawn)
    result = CommandResult(False, f"/{name} was cancelled: the agent stopped")
    async with trio.open_nursery() as nursery:
        with trio.CancelScope() as scope:

            async def cancel_when_agent_stops() -> None:
                await agent.wait_stopped()
                scope.cancel()

            nursery.start_soon(cancel_when_agent_stops)
            try:
                outcome = await command.run(CommandContext(name, agent, owner, scope), args)
                if isinstance(outcome, CommandResult):
                    result = outcome
                else:
                    bound.warning("command returned no CommandResult", returned=type(outcome).__name__)
                    result = CommandResult(False, f"/{name} returned no result")
            except Exception as exc:
                bound.warning("command failed", error=repr(exc))
                result = CommandResult(False, f"/{name} failed: {safe_message(exc)}")
            except BaseException as exc:
                # trio may wrap Cancelled in a group (e.g. out of trio.run_process).
                if is_cancellation(exc) and not scope.cancel_called:
                    # The caller cancelled us: the log still says how the command ended.
                    log_event("command/done", {"name": name, "ok": False, "message": f"/{name} was cancelled"})
                raise
            finally:
                nursery.cancel_scope.cancel()  # stop the watcher, however we leave
    log_event("command/done", {"name": name, "ok": result.ok, "message": result.message})
    bound.info("command done", ok=result.ok)
    return result
