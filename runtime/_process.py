"""Child processes: the one way this runtime runs a program.

Fixed argv, no shell, exactly the environment the caller chose, output read while it
streams and capped, and nothing left running afterwards. Used by the shell tool, the
LoopX client and ``/loopx-init``: all three run programs on a model's or a CLI's behalf.

Every program runs under the launcher (``runtime/_launcher.py``), a small process that
is a child subreaper: whatever the program starts -- in the background, under ``setsid``,
double-forked -- is reparented to the launcher, which kills and reaps all of it when the
program exits or when the runtime asks it to stop (a timeout, an output limit, the
caller's cancellation, or the runtime's own death, which closes the launcher's socket).
The launcher gets only the program's environment, over that socket, so neither it nor
the program can read the runtime's variables from their own ``/proc/<pid>/environ``.
"""

from __future__ import annotations

import codecs
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Literal

import attrs
import trio

from ._logging import get_logger

_log = get_logger(__name__)

LAUNCHER = Path(__file__).with_name("_launcher.py")
#: How long the launcher may take, past a stop request and the caller's grace period, to
#: kill and reap the program's tree before it is killed itself (with what it still holds).
LAUNCHER_GRACE = 5.0
_CHUNK = 65_536
_STATUS_LIMIT = 4_096


@attrs.frozen
class Completed:
    """How a program ended. ``returncode`` is negative (``-signal``) when it was killed.
    ``overflow`` names the stream that passed its limit (``stdout`` or ``stderr``): the
    program and everything it started were then killed, and each stream holds at most
    its limit."""

    returncode: int
    stdout: bytes
    stderr: bytes
    overflow: Literal["stdout", "stderr"] | None = None


def decode(data: bytes, *, cut: bool) -> str:
    """UTF-8 text of captured output; ``cut``: it was truncated, so an incomplete
    character at the end is dropped rather than shown as a replacement character."""
    return codecs.getincrementaldecoder("utf-8")("replace").decode(data, final=not cut)


#: What every child inherits from the runtime's environment unless its caller adds more:
#: enough to find programs and run in the user's locale, none of the runtime's credentials.
BASE_ENV = frozenset({"PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "TERM"})


def pick_env(source: Mapping[str, str], names: frozenset[str], prefixes: tuple[str, ...] = ()) -> dict[str, str]:
    """The variables of ``source`` named in ``names`` or starting with one of ``prefixes``."""
    return {key: value for key, value in source.items() if key in names or key.startswith(prefixes)}


def _env_block(env: Mapping[str, str]) -> bytes:
    entries = b"".join(os.fsencode(key) + b"=" + os.fsencode(value) + b"\0" for key, value in env.items())
    return len(entries).to_bytes(8, "big") + entries


def _launcher_argv(
    argv: list[str], cwd: Path, grace: float, leave_on_exit: bool, stdin_fd: int | None = None
) -> list[str]:
    # -I: no PYTHON* variables, no user site, no cwd on sys.path; -S: no site-packages.
    on_exit = "leave" if leave_on_exit else "kill"
    stdin = [] if stdin_fd is None else [str(stdin_fd)]
    return [sys.executable, "-I", "-S", str(LAUNCHER), repr(float(grace)), on_exit, os.fspath(cwd), *stdin, "--", *argv]


def _status(line: bytes) -> int:
    """The launcher's report as a returncode; ``error ERRNO`` raises that OSError."""
    word, _, number = line.decode("ascii", "replace").strip().partition(" ")
    if word == "exit" and number.lstrip("-").isdigit():
        return int(number)
    if word == "signal" and number.isdigit():
        return -int(number)
    if word == "error" and number.isdigit():
        code = int(number)
        raise OSError(code, os.strerror(code))
    raise OSError("the launcher ended without reporting the program's status")


def _kill_group(pgid: int) -> None:
    """SIGKILL the launcher's process group: the last resort when the launcher cannot
    sweep (a ``setsid`` escapee has left that group and survives it)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


@attrs.define
class _Capture:
    """One output stream, read until EOF or until it passes ``limit`` bytes."""

    limit: int
    data: bytearray = attrs.field(factory=bytearray)
    overflowed: bool = False

    async def read(self, stream: trio.abc.ReceiveStream, overflow: trio.Event) -> None:
        async with stream:
            while chunk := await stream.receive_some(_CHUNK):
                room = self.limit - len(self.data)
                if len(chunk) <= room:
                    self.data += chunk
                    continue
                self.data += chunk[:room]
                self.overflowed = True
                overflow.set()
                # Closing the read end (async with) makes further writes fail with
                # SIGPIPE/EPIPE: the producer cannot block while the launcher kills it.
                return


class _Run:
    """One launched program: its launcher process, socket, and captured output."""

    def __init__(self, process: trio.Process, control: trio.SocketStream, max_stdout: int, max_stderr: int) -> None:
        self.process = process
        self.control = control
        self.stdout = _Capture(max_stdout)
        self.stderr = _Capture(max_stderr)
        self.overflow = trio.Event()
        self.status = bytearray()
        self.stop_sent = False

    async def collect(self) -> None:
        """Read both streams and the launcher's report until the launcher is gone; past an
        output limit, ask it to stop."""
        assert self.process.stdout is not None and self.process.stderr is not None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._stop_on_overflow)
            # Each stream is read to EOF, which comes once the launcher has swept the
            # tree and exited: nothing that could still write to it is left.
            async with trio.open_nursery() as readers:
                readers.start_soon(self.stdout.read, self.process.stdout, self.overflow)
                readers.start_soon(self.stderr.read, self.process.stderr, self.overflow)
                readers.start_soon(self._read_status)
            nursery.cancel_scope.cancel()
        await self.process.wait()

    async def _stop_on_overflow(self) -> None:
        await self.overflow.wait()
        await self.stop()

    async def _read_status(self) -> None:
        try:
            while chunk := await self.control.receive_some(_STATUS_LIMIT):
                if len(self.status) < _STATUS_LIMIT:
                    self.status += chunk
        except trio.BrokenResourceError:
            pass
        if not self.status:
            # The launcher died without sweeping (killed itself, e.g. by the OOM killer):
            # kill what is left of its process group, which holds the output pipes.
            _kill_group(self.process.pid)

    async def stop(self) -> None:
        """Ask the launcher to kill and reap the program's tree (idempotent)."""
        if self.stop_sent:
            return
        self.stop_sent = True
        try:
            # EOF, not a byte: a byte the launcher never read would turn its close into
            # a connection reset, and its report would be lost.
            await self.control.send_eof()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the launcher is already gone

    async def finish(self, grace: float) -> None:
        """However the run ended: make sure the launcher has swept and exited, killing it
        (and its process group) if it does not within its grace; then release everything.
        Run shielded: this is the cleanup of a cancelled call."""
        try:
            if self.process.returncode is None:
                await self.stop()
                with trio.move_on_after(grace + LAUNCHER_GRACE):
                    await self.process.wait()
                if self.process.returncode is None:
                    _log.warning("process.launcher_unresponsive", pid=self.process.pid)
                    _kill_group(self.process.pid)
                    await self.process.wait()
        finally:
            await self.control.aclose()
            for stream in (self.process.stdout, self.process.stderr):
                if stream is not None:
                    await stream.aclose()

    def completed(self) -> Completed:
        returncode = _status(bytes(self.status))
        overflow: Literal["stdout", "stderr"] | None = None
        if self.stdout.overflowed:
            overflow = "stdout"
        elif self.stderr.overflowed:
            overflow = "stderr"
        return Completed(returncode, bytes(self.stdout.data), bytes(self.stderr.data), overflow)


async def run_child(
    argv: list[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    max_stdout: int,
    max_stderr: int,
    grace: float = 0.0,
    leave_on_exit: bool = False,
) -> Completed:
    """Run ``argv`` in ``cwd`` with exactly ``env`` (a bare program name is looked up on
    ``env``'s PATH) and stdin from ``/dev/null``, until it exits or the caller's
    cancellation: a time limit is the caller's cancel scope (``trio.move_on_after``).

    Output is read as it streams: past ``max_stdout`` or ``max_stderr`` bytes the run is
    stopped and :attr:`Completed.overflow` says which stream. A stop (an overflow, or the
    caller's cancellation, a time limit's too) sends SIGTERM to the program's process
    group, waits up to ``grace`` seconds for the program (shielded), then SIGKILLs every
    process in its tree; the program's own exit does the latter at once. Either way this
    returns (or raises ``Cancelled``) only after that tree is gone.

    ``leave_on_exit``: for a trusted program that starts a daemon of its own on purpose
    (LoopX's effect-runtime server, which later calls reuse): when the program exits by
    itself, what it left running is left alone (a stop still kills everything). What is
    left must not hold the program's stdout or stderr, or the call runs until cancelled.

    Raises OSError when the program cannot be started (missing, not executable, no such
    ``cwd``) or the launcher cannot be.
    """
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with child:
            # The launcher changes to ``cwd`` itself: trio spawns in a thread of its default
            # pool, which the store commits in, and a spawn into a directory on a hung
            # filesystem would hold that thread until the filesystem answered.
            process = await trio.lowlevel.open_process(
                _launcher_argv(argv, cwd, grace, leave_on_exit),
                stdin=child.fileno(),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env={},
                start_new_session=True,
            )
    except BaseException:
        parent.close()
        raise
    control = trio.SocketStream(trio.socket.from_stdlib_socket(parent))
    run = _Run(process, control, max_stdout, max_stderr)
    try:
        await control.send_all(_env_block(env))
        await run.collect()
    finally:
        with trio.CancelScope(shield=True):
            await run.finish(grace)
    return run.completed()


@attrs.define(eq=False)
class Child:
    """A program the runtime talks to while it runs (``open_child``): write its stdin, read
    its stdout and stderr (uncapped: the reader decides what to keep), ``wait`` for its end."""

    stdin: trio.abc.SendStream
    stdout: trio.abc.ReceiveStream
    stderr: trio.abc.ReceiveStream
    _run: _Run

    async def wait(self) -> int:
        """The program's returncode, once the launcher has swept its tree and reported."""
        await self._run._read_status()
        return _status(bytes(self._run.status))

    async def stop(self) -> None:
        """Ask the launcher to kill and reap the program's tree (idempotent)."""
        await self._run.stop()


@asynccontextmanager
async def open_child(argv: list[str], *, cwd: Path, env: Mapping[str, str], grace: float = 0.0) -> AsyncIterator[Child]:
    """Start ``argv`` under the launcher with a pipe for stdin (as ``run_child``: exactly
    ``env``, in ``cwd``); leaving the block, however it is left, stops it and returns only
    once its whole tree is gone. Raises OSError as ``run_child`` does."""
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    read_fd, write_fd = os.pipe()
    try:
        with child:
            process = await trio.lowlevel.open_process(
                _launcher_argv(argv, cwd, grace, False, stdin_fd=read_fd),
                stdin=child.fileno(),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env={},
                start_new_session=True,
                pass_fds=(read_fd,),
            )
    except BaseException:
        parent.close()
        os.close(write_fd)
        raise
    finally:
        os.close(read_fd)
    control = trio.SocketStream(trio.socket.from_stdlib_socket(parent))
    run = _Run(process, control, 0, 0)
    stdin = trio.lowlevel.FdStream(write_fd)
    assert process.stdout is not None and process.stderr is not None
    try:
        await control.send_all(_env_block(env))
        yield Child(stdin, process.stdout, process.stderr, run)
    finally:
        with trio.CancelScope(shield=True):
            await stdin.aclose()
            await run.finish(grace)
