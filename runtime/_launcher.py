"""The launcher: a small process between the runtime and every program it runs.

Run as ``python -I -S _launcher.py GRACE ON_EXIT CWD [STDIN_FD] -- PROGRAM ARG...`` with its stdin on a Unix
socket to the runtime (``runtime._process``), an empty environment, and stdout/stderr on
the pipes the runtime reads. It exists so that a program cannot outlive its call:

- It makes itself a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``), so every orphan
  in the program's tree -- a backgrounded job, a ``setsid`` child, a double-forked daemon
  -- is reparented to it instead of to init, where no one would kill it.
- When the program exits, or the runtime asks it to stop (a byte or EOF on the socket,
  also when the runtime dies), it kills every process it has become the parent of and
  reaps them until it has no child left; only then does it report the program's status
  on the socket and exit. Nothing else in the tree can survive that sweep: a descendant
  that is not its child has a living ancestor that is, and that ancestor's death hands it
  over. With ON_EXIT ``leave`` (a trusted program's own daemons, see ``runtime._process``)
  a program's own exit sweeps nothing; a stop still sweeps everything.
- The program's environment comes over the socket, not through the launcher's own, so
  ``/proc/<launcher>/environ`` shows nothing. The program's stdin is ``/dev/null``, or
  the pipe inherited as STDIN_FD when the runtime talks to the program (``open_child``).

The subreaper is this process and never the runtime: the runtime would otherwise inherit
every orphan of every program and have to reap them itself.

Protocol on the socket: the runtime sends an 8-byte big-endian length and then the
environment as ``KEY=VALUE\\0`` entries; later, EOF (or any byte) means "stop". The
launcher answers with one line, ``exit N``, ``signal N`` or ``error ERRNO``, then closes.

Only the standard library, imported lazily where it is heavy: this starts for every
shell-tool call and every LoopX call. Linux only (``prctl``, ``pidfd_open``, ``/proc``).
"""

from __future__ import annotations

import ctypes
import errno
import os
import select
import signal
import sys

PR_SET_CHILD_SUBREAPER = 36
# How often the final sweep rescans for children even without a SIGCHLD: a safety net for
# the kernel's children list, which is documented as best effort while tasks exit.
_RESCAN = 0.05
# Signals Python (or this launcher) sets to "ignore": ignored dispositions survive exec,
# so the program would start with them ignored (``yes`` could not die of SIGPIPE).
_RESET_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD)


def _read_exactly(fd: int, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            raise EOFError("the runtime closed the socket before sending the environment")
        data += chunk
    return bytes(data)


def _read_env(fd: int) -> dict[bytes, bytes]:
    size = int.from_bytes(_read_exactly(fd, 8), "big")
    env = {}
    for entry in _read_exactly(fd, size).split(b"\0"):
        if entry:
            key, _, value = entry.partition(b"=")
            env[key] = value
    return env


def _resolve(program: str, env: dict[bytes, bytes]) -> str:
    """``program`` looked up on the *program's* PATH (posix_spawnp would use ours)."""
    if "/" in program:
        return program
    path = env.get(b"PATH", os.defpath.encode()).decode("utf-8", "surrogateescape")
    for folder in path.split(os.pathsep):
        candidate = os.path.join(folder or ".", program)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)


def _children() -> list[int]:
    pid = os.getpid()
    try:
        with open(f"/proc/{pid}/task/{pid}/children", "rb") as f:
            return [int(p) for p in f.read().split()]
    except FileNotFoundError:  # a kernel without CONFIG_PROC_CHILDREN: ask every process
        found = []
        for entry in os.listdir("/proc"):
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    parent = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if parent == pid:
                found.append(int(entry))
        return found


def _kill(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


class _Launcher:
    def __init__(self, control: int, wakeup: int) -> None:
        self.control = control
        self.wakeup = wakeup
        self.program: int | None = None
        self.status: int | None = None  # the program's wait status, once reaped

    def _reaped(self, pid: int, status: int) -> None:
        if pid == self.program:
            self.status = status

    def wait_program(self, pidfd: int) -> bool:
        """Block until the program exits (True) or the runtime asks to stop (False)."""
        while True:
            ready, _, _ = select.select([pidfd, self.control], [], [])
            if pidfd in ready:
                assert self.program is not None
                pid, status = os.waitpid(self.program, 0)
                self._reaped(pid, status)
                return True
            if self.control in ready:
                return False

    def grace(self, pidfd: int, seconds: float) -> None:
        """SIGTERM the program's process group and give it ``seconds`` to exit."""
        try:
            os.killpg(os.getpgid(0), signal.SIGTERM)  # this launcher ignores SIGTERM
        except ProcessLookupError:
            pass
        ready, _, _ = select.select([pidfd], [], [], seconds)
        if ready and self.program is not None:
            pid, status = os.waitpid(self.program, 0)
            self._reaped(pid, status)

    def reap(self) -> bool:
        """Reap every child that has exited; False once no child is left at all."""
        try:
            while True:
                pid, status = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    return True
                self._reaped(pid, status)
        except ChildProcessError:
            return False

    def sweep(self) -> None:
        """Kill every child (the program, and each orphan handed to this subreaper) and
        reap until none is left; a killed child's own children come back here, and the
        next round kills them."""
        while True:
            _kill(_children(), signal.SIGKILL)
            if not self.reap():
                return
            # Woken by SIGCHLD (the wakeup fd) or, at the latest, after _RESCAN.
            select.select([self.wakeup], [], [], _RESCAN)
            try:
                os.read(self.wakeup, 4096)
            except BlockingIOError:
                pass

    def report(self, line: str) -> None:
        try:
            os.write(self.control, line.encode() + b"\n")
        except OSError:
            pass  # the runtime is gone: nobody to tell


def _status_line(status: int | None) -> str:
    if status is None:
        return "signal 9"  # killed in the sweep before it could be waited for separately
    if os.WIFSIGNALED(status):
        return f"signal {os.WTERMSIG(status)}"
    return f"exit {os.waitstatus_to_exitcode(status)}"


def main(argv: list[str]) -> int:
    # An optional STDIN_FD before "--": an inherited pipe that becomes the program's stdin
    # (a long-lived child the runtime talks to, such as an MCP server), instead of /dev/null.
    stdin_fd = None
    if len(argv) >= 7 and argv[4].isdigit() and argv[5] == "--":
        stdin_fd = int(argv.pop(4))
    if len(argv) < 6 or argv[2] not in ("kill", "leave") or argv[4] != "--":
        raise SystemExit("usage: _launcher.py GRACE kill|leave CWD [STDIN_FD] -- PROGRAM [ARG...]")
    grace, on_exit, cwd, program_argv = float(argv[1]), argv[2], argv[3], argv[5:]

    control = os.dup(0)  # non-inheritable: the program never sees the socket
    stdin = os.open(os.devnull, os.O_RDWR) if stdin_fd is None else stdin_fd
    os.dup2(stdin, 0)
    os.close(stdin)
    env = _read_env(control)

    # Stay alive through a group SIGTERM (the grace period) and a terminal's signals, to
    # sweep afterwards; SIGCHLD writes to a wakeup fd so the sweep wakes when a child dies.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_read, False)
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda _signum, _frame: None)
    launcher = _Launcher(control, wake_read)

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        launcher.report(f"error {ctypes.get_errno()}")
        return 0
    try:
        # Here, not in the runtime's spawn: a working directory on a filesystem that does
        # not answer hangs this process, which the runtime waits for without a thread.
        os.chdir(cwd)
        path = _resolve(program_argv[0], env)
        pid = os.posix_spawn(
            path,
            program_argv,
            env,
            setsigdef=_RESET_SIGNALS,
            setsigmask=(),
        )
    except OSError as exc:
        launcher.report(f"error {exc.errno or errno.EIO}")
        return 0
    launcher.program = pid
    pidfd = os.pidfd_open(pid)

    exited = launcher.wait_program(pidfd)
    if not exited and grace > 0:
        launcher.grace(pidfd, grace)
    if exited and on_exit == "leave":
        launcher.reap()  # what the program left running goes on, handed to init
    else:
        launcher.sweep()
    launcher.report(_status_line(launcher.status))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
