"""``loopdock goal bind``: a LoopX goal bound to one session, for its GoalBar to show.

What the ``loopx`` skill sets up when a session runs ``/loopx <task>``, done from the
command line with the real LoopX CLI (``loopx`` on PATH, Node >= 22.22.3 for it): a goal
in the project (``bootstrap``), one agent lane (``register-agent``), optional todos
(``todo add``), and the session's thread bound to that lane (``bind-agent-thread`` on the
DSH-native host surface). LoopX stays the authority: loopdock stores nothing of it.

The project must be the session's: the GoalBar reads a DSH session's goal in the
directory DSH ran in (its header's ``cwd``), so run this there or pass ``--project``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Sequence
from typing import TextIO

import trio

from loopdock.runtime import LoopdockError
from loopdock.runtime.loopx import HOST_SURFACE, LoopxClient, LoopxOk, check_thread_id

from ._project import checked_project


class GoalBindError(LoopdockError):
    """Raised when a LoopX call of ``goal bind`` fails; names the step and LoopX's answer."""

    code = "GOAL_BIND"


def default_agent_id(session_id: str) -> str:
    """An agent lane id that is stable for the session and unique across sessions."""
    return "agent-" + hashlib.sha256(session_id.encode()).hexdigest()[:10]


async def _step(client: LoopxClient, what: str, *args: str) -> None:
    result = await client.run(*args)
    if not isinstance(result, LoopxOk):
        detail = getattr(result, "reason", type(result).__name__)
        payload = getattr(result, "payload", None)
        message = payload.get("message") or payload.get("error") if isinstance(payload, dict) else None
        raise GoalBindError(f"loopx {what} failed: {detail}" + (f" ({str(message)[:300]})" if message else ""))


async def bind_command(
    *,
    session_id: str,
    goal_id: str,
    objective: str,
    agent_id: str | None,
    todos: Sequence[str],
    project: str | None,
    out: TextIO,
) -> None:
    check_thread_id(session_id)  # LoopX's thread-id rules, before any call
    directory = await trio.to_thread.run_sync(checked_project, project or None, "--project")
    if await trio.to_thread.run_sync(shutil.which, "loopx") is None:
        raise GoalBindError("no loopx command on PATH: pip install loopx (LoopX also needs Node >= 22.22.3 on PATH)")
    lane = agent_id or default_agent_id(session_id)
    client = LoopxClient(["loopx"], project=directory, env=dict(os.environ), timeout=120)
    await _step(client, "bootstrap", "bootstrap", "--project", ".", "--goal-id", goal_id, "--objective", objective,
                "--adapter-kind", "read_only_project_map_v0", "--adapter-status", "connected-read-only")
    await _step(client, "register-agent", "register-agent", "--goal-id", goal_id, "--agent-id", lane,
                "--require-new", "--execute")
    for text in todos:
        await _step(client, "todo add", "todo", "add", "--goal-id", goal_id, "--project", ".", "--role", "agent",
                    "--claimed-by", lane, "--task-class", "advancement_task", "--text", text)
    await _step(client, "bind-agent-thread", "bind-agent-thread", "--goal-id", goal_id, "--thread-id", session_id,
                "--host-surface", HOST_SURFACE, "--agent-id", lane, "--execute")
    print(f"bound session {session_id} to goal {goal_id} (agent lane {lane}) in {directory}", file=out)
