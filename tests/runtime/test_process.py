"""The child runner (``runtime._process``) and its launcher.

Rules: real processes on this machine, no network; an absolute ``trio.fail_after`` on
every test; a process is "alive" only if ``/proc`` lists it with our marker in its
command line, so a recycled pid can never pass for a survivor. The launcher reaps what
it kills before the call returns, so "nothing alive" is checked at once, without waiting.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import uuid
from pathlib import Path

import pytest
import trio

from loopdock.runtime._process import BASE_ENV, Completed, pick_env, run_child

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the launcher is Linux-only")

PY = sys.executable
ROOT = Path(__file__).resolve().parents[2]
ENV = {"PATH": f"{Path(PY).parent}{os.pathsep}{os.environ.get('PATH', os.defpath)}"}


def marked(marker: str) -> list[int]:
    """Every live (non-zombie) process whose command line contains ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in cmdline and state not in ("Z", "X"):
            found.append(int(entry))
    return found


async def run(argv, tmp_path: Path, **kwargs) -> Completed:
    kwargs.setdefault("max_stdout", 1_000_000)
    kwargs.setdefault("max_stderr", 1_000_000)
    kwargs.setdefault("env", ENV)
    result = await run_child(argv, cwd=tmp_path, **kwargs)
    assert isinstance(result, Completed)
    return result


# -- what the program gets ----------------------------------------------------------------


async def test_the_program_gets_exactly_its_environment_cwd_and_an_empty_stdin(tmp_path):
    env = {**ENV, "ONLY_THIS": "1"}
    with trio.fail_after(30):
        printed = await run(["env"], tmp_path, env=env)
        cwd = await run(["pwd"], tmp_path)
        stdin = await run(["cat"], tmp_path)  # would wait forever on an open stdin
    # Nothing added (not even the LC_CTYPE that the launcher's Python sets for itself).
    assert sorted(printed.stdout.decode().splitlines()) == sorted(f"{k}={v}" for k, v in env.items())
    assert cwd.stdout.decode() == f"{tmp_path}\n"
    assert (stdin.returncode, stdin.stdout, stdin.overflow) == (0, b"", None)


async def test_exit_codes_and_signals_come_back_as_returncodes(tmp_path):
    with trio.fail_after(30):
        assert (await run([PY, "-c", "import sys; sys.exit(7)"], tmp_path)).returncode == 7
        killed = await run([PY, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"], tmp_path)
    assert killed.returncode == -signal.SIGTERM


async def test_a_program_that_cannot_start_raises_oserror(tmp_path):
    with trio.fail_after(30):
        with pytest.raises(FileNotFoundError):
            await run(["no-such-program-xyz"], tmp_path)
        with pytest.raises(FileNotFoundError):
            await run([PY, "-c", "pass"], tmp_path / "no-such-dir")
        not_executable = tmp_path / "plain.txt"
        not_executable.write_text("hello")
        with pytest.raises(PermissionError):
            await run([str(not_executable)], tmp_path)


async def test_the_launcher_shows_no_environment_of_its_own(tmp_path):
    # The program's environment reaches the launcher over its socket, never as its own.
    script = "import os, sys; sys.stdout.buffer.write(open('/proc/%d/environ' % os.getppid(), 'rb').read())"
    with trio.fail_after(30):
        result = await run([PY, "-c", script], tmp_path, env={**ENV, "SOMETHING_SECRET": "sk-123"})
    names = {entry.partition(b"=")[0] for entry in result.stdout.split(b"\0") if entry}
    assert names <= {b"LC_CTYPE"}  # at most what Python's start-up sets for itself
    assert b"sk-123" not in result.stdout


def test_pick_env_takes_names_and_prefixes_only():
    source = {"PATH": "/bin", "DEEPSEEK_API_KEY": "sk", "LOOPX_X": "1", "HOME": "/h", "XLOOPX_": "no"}
    assert pick_env(source, BASE_ENV, ("LOOPX_",)) == {"PATH": "/bin", "LOOPX_X": "1", "HOME": "/h"}


# -- output caps ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, stream",
    [
        (["yes"], "stdout"),
        (["cat", "/dev/zero"], "stdout"),
        # SIGPIPE as yes and cat have it (Python ignores it, and then could exit 120 on
        # the closed pipe before the kill lands).
        ([PY, "-c", "import signal, sys\nsignal.signal(signal.SIGPIPE, signal.SIG_DFL)\n"
                    "while True: sys.stderr.write('e' * 65536)"], "stderr"),
    ],
    ids=["yes", "cat-dev-zero", "stderr-flood"],
)
async def test_an_endless_producer_is_stopped_at_its_limit(tmp_path, argv, stream):
    marker = uuid.uuid4().hex
    with trio.fail_after(30):  # the limit stops it, not this
        result = await run([*argv, *([marker] if argv[0] == PY else [])], tmp_path,
                           max_stdout=100_000, max_stderr=20_000)
    assert result.overflow == stream
    # Held: at most the limit, never more (cat /dev/zero filled 2.5 GB in 5 s unbounded).
    assert len(result.stdout) == (100_000 if stream == "stdout" else 0)
    assert len(result.stderr) == (20_000 if stream == "stderr" else 0)
    assert result.returncode < 0  # killed (SIGPIPE or SIGKILL), not exited
    assert marked(marker) == []


async def test_output_within_the_limits_is_whole(tmp_path):
    script = "import sys; sys.stdout.write('o' * 100_000); sys.stderr.write('e' * 20_000)"
    with trio.fail_after(30):
        result = await run([PY, "-c", script], tmp_path, max_stdout=100_000, max_stderr=20_000)
    assert (result.overflow, len(result.stdout), len(result.stderr)) == (None, 100_000, 20_000)


# -- nothing outlives the call -------------------------------------------------------------

# Starts escapees by MODE ("all": one of each kind), waits until they run, writes their
# pids to the fifo READY, then exits (AFTER=exit) or sleeps (AFTER=sleep). Only escapees
# carry the marker in their command lines: everything else gets it reversed, so that no
# other process matches.
ESCAPE = r"""
import os, subprocess, sys, time
mode, reversed_marker, ready, after = sys.argv[1:5]
marker = reversed_marker[::-1]
sleeper = [sys.executable, "-P", "-c", "import time; time.sleep(1000)", marker]
modes = ["background", "setsid", "double-fork"] if mode == "all" else [mode]
for mode in modes:
    if mode == "background":
        quoted = " ".join("'%s'" % a for a in sleeper)
        subprocess.run(["sh", "-c", quoted + " &"], check=True)  # sh backgrounds it and exits
    elif mode == "setsid":
        subprocess.Popen(sleeper, start_new_session=True)
    elif mode == "double-fork":
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                null = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(null, fd)  # a daemon: it does not even hold our output pipes
                os.execv(sys.executable, sleeper)
            os._exit(0)
        os.wait()
def escapees():
    found = []
    for pid in os.listdir("/proc"):
        try:
            if pid.isdigit() and marker.encode() in open("/proc/%s/cmdline" % pid, "rb").read():
                found.append(pid)
        except OSError:
            pass
    return found
while len(pids := escapees()) < len(modes):  # forked, not yet exec'd: wait for the command lines
    time.sleep(0.01)
with open(ready, "w") as f:
    f.write(" ".join(pids))
if after == "sleep":
    time.sleep(1000)
print("escaped", *pids)
"""

MODES = ["background", "setsid", "double-fork"]


@pytest.fixture
def escape(tmp_path) -> Path:
    script = tmp_path / "escape.py"
    script.write_text(ESCAPE)
    return script


class Fifo:
    """A named pipe a child writes one message to, read here without blocking trio (an
    extra write end keeps the read end from seeing EOF before the child opens it)."""

    def __init__(self, path: Path) -> None:
        os.mkfifo(path)
        self.path = path
        self._read = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        self._keep = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        self.stream = trio.lowlevel.FdStream(self._read)

    async def message(self) -> str:
        return (await self.stream.receive_some(4096)).decode()

    async def aclose(self) -> None:
        os.close(self._keep)
        await self.stream.aclose()


@pytest.fixture
async def ready(tmp_path):
    fifo = Fifo(tmp_path / "ready.fifo")
    yield fifo
    await fifo.aclose()


def new_marker() -> tuple[str, str]:
    """(the marker, what to pass on the command line)."""
    marker = uuid.uuid4().hex
    return marker, marker[::-1]


@pytest.mark.parametrize("mode", MODES)
async def test_escapees_die_when_the_program_exits(tmp_path, escape, ready, mode):
    marker, passed = new_marker()
    with trio.fail_after(30):
        result = await run([PY, str(escape), mode, passed, str(ready.path), "exit"], tmp_path)
        pid = await ready.message()
    assert result.returncode == 0, result
    assert result.stdout.decode() == f"escaped {pid}\n"  # it was alive when the program exited
    assert marked(marker) == []


async def test_escapees_die_at_the_callers_time_limit(tmp_path, escape, ready):
    # The shell tool's and the LoopX client's time limit: a move_on_after around the call.
    # One run with all three kinds: the limit costs its full length in real time.
    marker, passed = new_marker()
    outcome: list[object] = []
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:

            async def call() -> None:
                # The limit is generous so the escapees surely start first; the message
                # on the fifo proves they did.
                with trio.move_on_after(8) as limit:
                    outcome.append(await run_child([PY, str(escape), "all", passed, str(ready.path), "sleep"],
                                                   cwd=tmp_path, env=ENV, max_stdout=1000, max_stderr=1000))
                if limit.cancelled_caught:
                    outcome.append("stopped at the limit")

            nursery.start_soon(call)
            pids = sorted(int(p) for p in (await ready.message()).split())
            assert len(pids) == 3 and sorted(marked(marker)) == pids  # running now ...
    assert outcome == ["stopped at the limit"]
    assert marked(marker) == []  # ... and gone with the call


@pytest.mark.parametrize("mode", MODES)
async def test_escapees_die_on_cancellation(tmp_path, escape, ready, mode):
    marker, passed = new_marker()
    finished = False
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:

            async def call() -> None:
                nonlocal finished
                await run([PY, str(escape), mode, passed, str(ready.path), "sleep"], tmp_path)
                finished = True

            nursery.start_soon(call)
            pid = await ready.message()
            assert marked(marker) == [int(pid)]
            nursery.cancel_scope.cancel()
    assert not finished
    assert marked(marker) == []


async def test_leave_on_exit_spares_a_daemon_only_when_the_program_exits_by_itself(tmp_path, escape, ready):
    # LoopX's case: its effect-runtime server, detached from the call's output, is meant
    # to serve the next call. A stop still takes everything.
    marker, passed = new_marker()
    with trio.fail_after(30):
        result = await run([PY, str(escape), "double-fork", passed, str(ready.path), "exit"], tmp_path,
                           leave_on_exit=True)
        pid = int(await ready.message())
    try:
        assert result.returncode == 0 and marked(marker) == [pid]
    finally:
        os.kill(pid, signal.SIGKILL)  # ours to end: this test started it
    await _gone(pid)

    marker, passed = new_marker()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(functools.partial(
                run, [PY, str(escape), "double-fork", passed, str(ready.path), "sleep"], tmp_path,
                leave_on_exit=True,
            ))
            pid = int(await ready.message())
            assert pid in marked(marker)  # (the launcher has the marker in its argv too)
            nursery.cancel_scope.cancel()
    assert marked(marker) == []


# The program says it is ready on the fifo, then waits; on SIGTERM it writes a file and exits.
TERMINABLE = r"""
import signal, sys, time
def bye(*_):
    open(sys.argv[2], "w").close()
    sys.exit(3)
signal.signal(signal.SIGTERM, bye)
with open(sys.argv[1], "w") as f:
    f.write("ready")
time.sleep(600)
"""


@pytest.mark.parametrize("grace, cleaned_up", [(20.0, True), (0.0, False)], ids=["grace", "no-grace"])
async def test_a_stop_gives_sigterm_its_grace_before_the_kill(tmp_path, ready, grace, cleaned_up):
    # The LoopX client's grace lets loopx clean up; the shell tool's none kills at once.
    done = tmp_path / "cleaned-up"
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(functools.partial(
                run_child, [PY, "-c", TERMINABLE, str(ready.path), str(done)], cwd=tmp_path, env=ENV,
                max_stdout=1000, max_stderr=1000, grace=grace,
            ))
            assert await ready.message() == "ready"
            nursery.cancel_scope.cancel()
    assert done.exists() == cleaned_up


# The program tells the fifo its parent (the launcher) and sleeps.
ORPHANED = r"""
import os, sys, time
with open(sys.argv[1], "w") as f:
    f.write(str(os.getppid()))
time.sleep(600)
"""


async def test_a_launcher_killed_outright_still_takes_its_process_group_along(tmp_path, ready):
    # The OOM killer's case: no sweep. The runtime kills the launcher's group instead, so
    # the call ends now, not when cancelled, and says the launcher did not report.
    marker, _ = new_marker()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:

            async def call() -> None:
                with pytest.raises(OSError, match="without reporting"):
                    await run([PY, "-c", ORPHANED, str(ready.path), marker], tmp_path)

            nursery.start_soon(call)
            launcher = int(await ready.message())
            running = marked(marker)  # the program, and the launcher (its argv holds the program's)
            assert len(running) == 2 and launcher in running
            [program] = [pid for pid in running if pid != launcher]
            os.kill(launcher, signal.SIGKILL)
        # Killed, though nobody of ours reaps it now (init does): wait for its exit itself.
        await _gone(program)


# -- the runtime's own death -------------------------------------------------------------------

RUNTIME = r"""
import sys, trio
from pathlib import Path
from loopdock.runtime._process import run_child
escape, mode, passed, ready = sys.argv[1:5]
trio.run(lambda: run_child([sys.executable, escape, mode, passed, ready, "sleep"], cwd=Path(ready).parent,
                           env={"PATH": "/usr/bin:/bin"}, max_stdout=1000, max_stderr=1000))
"""


async def _gone(pid: int) -> None:
    """Return once ``pid`` has exited (a pidfd turns readable: no polling)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        await trio.lowlevel.wait_readable(fd)
    finally:
        os.close(fd)


@pytest.mark.parametrize("mode", MODES)
async def test_escapees_die_when_the_runtime_is_killed(tmp_path, escape, ready, mode):
    # SIGKILL leaves the runtime no chance to clean up: the launcher sees its socket close.
    marker, passed = new_marker()
    runtime = await trio.lowlevel.open_process(
        [PY, "-P", "-c", RUNTIME, str(escape), mode, passed, str(ready.path)], cwd=ROOT
    )
    try:
        with trio.fail_after(30):
            pid = int(await ready.message())
            assert pid in marked(marker)  # (the launcher has the marker in its argv too)
            runtime.kill()
            await _gone(pid)
    finally:
        runtime.kill()
        with trio.CancelScope(shield=True):
            await runtime.wait()
    assert marked(marker) == []


# -- open_child: a program the runtime talks to -------------------------------------------


ECHO = "import os, sys\nfor line in sys.stdin:\n    sys.stdout.write(f'{os.getpid()} {line}'); sys.stdout.flush()\n"


async def test_open_child_pipes_stdin_to_the_program_and_stops_its_tree_on_exit(tmp_path):
    from line_reader import Lines

    from loopdock.runtime._process import open_child

    marker = f"echo-{uuid.uuid4().hex}"
    with trio.fail_after(30):
        async with open_child([PY, "-c", ECHO, marker], cwd=tmp_path, env=ENV) as child:
            await child.stdin.send_all(b"hello\n")
            lines = Lines(child.stdout)
            line = await lines.until(r"^\d+ hello$")
            pid = int(line.split()[0])
            assert pid in marked(marker)  # (the launcher has the marker in its argv too)
        # Leaving the block stopped the program and waited for its tree to be gone.
        assert marked(marker) == []


async def test_open_child_reports_the_programs_exit(tmp_path):
    from loopdock.runtime._process import open_child

    with trio.fail_after(30):
        async with open_child([PY, "-c", "import sys; sys.stdin.readline(); sys.exit(3)"], cwd=tmp_path, env=ENV) as child:
            await child.stdin.send_all(b"go\n")
            assert await child.wait() == 3
