"""Child processes: fixed argv, no shell, each in its own process group that is killed
as a whole, and waited for, however the call ends (timeout, cancellation or exit).

Used by the shell tool and the LoopX client: both run programs on a model's or a CLI's
behalf and must not leave anything running behind them.
"""

from __future__ import annotations

import functools
import os
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

import attrs
import trio


@attrs.frozen
class Completed:
    returncode: int
    stdout: bytes
    stderr: bytes


def signal_group(pid: int, sig: int) -> None:
    """Send ``sig`` to the process group led by ``pid`` (gone already: nothing to do)."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


async def kill_group(process: trio.Process, *, grace: float = 0.0) -> None:
    """trio's ``deliver_cancel``: SIGTERM the child's group and, after ``grace`` seconds
    (or at once), SIGKILL it. The child leads its own group (``start_new_session``), so
    its children go with it; trio cancels this as soon as the child exits, and the
    SIGKILL in ``finally`` still reaches any grandchild that outlived it."""
    try:
        if grace > 0:
            signal_group(process.pid, signal.SIGTERM)
            await trio.sleep(grace)
    finally:
        signal_group(process.pid, signal.SIGKILL)


async def run_child(
    argv: list[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    timeout: float,
    stdin: bytes = b"",
    grace: float = 0.0,
) -> Completed | Literal["timeout"]:
    """Run ``argv`` in ``cwd`` with exactly ``env``, capturing its output, for at most
    ``timeout`` seconds (then its group is killed: ``"timeout"``). Cancelling the caller
    kills the group too. Raises OSError when the program cannot be started."""
    completed = None
    with trio.move_on_after(timeout):
        completed = await trio.run_process(
            argv,
            cwd=cwd,
            env=env,
            stdin=stdin,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            start_new_session=True,
            deliver_cancel=functools.partial(kill_group, grace=grace),
        )
    if completed is None:
        return "timeout"
    return Completed(completed.returncode, completed.stdout, completed.stderr)
