"""Built-in tools: confinement to cwd, file round trips, and the opt-in shell."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path

import pytest
import trio

from loopdock.runtime._errors import ToolError
from loopdock.runtime.tools import (
    ShellPolicy,
    ToolContext,
    builtin_tools,
    list_dir,
    read_file,
    shell_tool,
    write_file,
)

SESSION = "sess-42.x@y"


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    # cwd is a subdirectory so that tmp_path itself is a real "outside" to escape to.
    cwd = tmp_path / "work"
    cwd.mkdir()
    (tmp_path / "secret.txt").write_text("top secret")
    return cwd


def ctx_for(cwd: Path) -> ToolContext:
    return ToolContext(session_id=SESSION, cwd=cwd, call_id="call-1")


async def call(tool, cwd: Path, **arguments) -> str:
    return await tool.run(arguments, ctx_for(cwd))


# -- file round trip ------------------------------------------------------------------


async def test_write_read_list_round_trip(workdir: Path):
    note = "sub/deeper/note.txt"
    confirmation = await call(write_file(), workdir, path=note, content="héllo\n")
    assert confirmation == "wrote 7 bytes to sub/deeper/note.txt"  # é is two bytes
    assert (workdir / "sub/deeper/note.txt").read_text(encoding="utf-8") == "héllo\n"

    assert await call(read_file(), workdir, path="sub/deeper/note.txt") == "héllo\n"

    await call(write_file(), workdir, path="b.txt", content="")
    (workdir / "a-dir").mkdir()
    assert await call(list_dir(), workdir) == "a-dir/\nb.txt\nsub/"
    assert await call(list_dir(), workdir, path="sub") == "deeper/"
    assert await call(list_dir(), workdir, path="a-dir") == "a-dir: (empty directory)"


async def test_write_replaces_existing_file(workdir: Path):
    await call(write_file(), workdir, path="f.txt", content="first version")
    await call(write_file(), workdir, path="f.txt", content="2nd")
    assert await call(read_file(), workdir, path="f.txt") == "2nd"


async def test_absolute_path_inside_cwd_is_allowed(workdir: Path):
    await call(write_file(), workdir, path=str(workdir / "abs.txt"), content="x")
    assert await call(read_file(), workdir, path=str(workdir / "abs.txt")) == "x"


async def test_read_offset_and_limit_are_in_lines(workdir: Path):
    (workdir / "lines.txt").write_text("l0\nl1\nl2\nl3")
    assert await call(read_file(), workdir, path="lines.txt", offset=1, limit=2) == "l1\nl2\n"
    assert await call(read_file(), workdir, path="lines.txt", offset=3) == "l3"
    past_end = await call(read_file(), workdir, path="lines.txt", offset=9)
    assert "the file has 4 lines" in past_end


async def test_read_is_bounded_with_a_note(workdir: Path):
    line = "x" * 999 + "\n"
    (workdir / "big.txt").write_text(line * 250)  # 250_000 characters
    text = await call(read_file(), workdir, path="big.txt")
    body, note = text.rsplit("\n", 1)
    assert len(body) + 1 == 200_000
    assert "truncated" in note
    assert "offset=200" in note
    rest = await call(read_file(), workdir, path="big.txt", offset=200)
    assert rest == line * 50


async def test_builtin_tools_are_the_three_file_tools_without_shell():
    tools = builtin_tools()
    assert sorted(t.name for t in tools) == ["list_dir", "read_file", "write_file"]
    for tool in tools:
        assert tool.parameters["type"] == "object"
        assert set(tool.parameters["required"]) <= set(tool.parameters["properties"])


# -- confinement ----------------------------------------------------------------------


def assert_no_outside_path(message: str, workdir: Path) -> None:
    assert str(workdir.parent) not in message
    assert "secret" not in message


@pytest.mark.parametrize(
    "tool, extra",
    [(read_file, {}), (write_file, {"content": "pwned"}), (list_dir, {})],
    ids=["read_file", "write_file", "list_dir"],
)
@pytest.mark.parametrize("path", ["../secret.txt", "sub/../../secret.txt", "ABSOLUTE"])
async def test_escapes_are_refused(workdir: Path, tool, extra, path):
    if path == "ABSOLUTE":
        path = str(workdir.parent / "secret.txt")
    with pytest.raises(ToolError, match="outside the working directory") as info:
        await call(tool(), workdir, path=path, **extra)
    assert_no_outside_path(str(info.value), workdir)
    assert (workdir.parent / "secret.txt").read_text() == "top secret"


@pytest.mark.parametrize(
    "tool, extra",
    [(read_file, {}), (write_file, {"content": "pwned"}), (list_dir, {})],
    ids=["read_file", "write_file", "list_dir"],
)
@pytest.mark.parametrize("path", ["home", "home/bridge.token", "home/sessions.db", "./sub/../home/x", "ABSOLUTE"])
async def test_the_runtimes_home_is_refused_even_inside_cwd(workdir: Path, tool, extra, path):
    home = workdir / "home"
    home.mkdir()
    (home / "bridge.token").write_text("tok-SECRET")
    (home / "sessions.db").write_text("db")
    if path == "ABSOLUTE":
        path = str(home / "sessions.db")
    with pytest.raises(ToolError, match="inside the runtime's home") as info:
        await call(tool(home=home), workdir, path=path, **extra)
    assert "tok-SECRET" not in str(info.value) and str(home) not in str(info.value)
    assert (home / "sessions.db").read_text() == "db" and sorted(os.listdir(home)) == ["bridge.token", "sessions.db"]


async def test_only_the_home_is_refused_not_its_neighbours(workdir: Path):
    (workdir / "home").mkdir()
    (workdir / "homework.txt").write_text("mine")  # a prefix of the name is not the home
    assert await call(read_file(home=workdir / "home"), workdir, path="homework.txt") == "mine"
    assert await call(list_dir(home=workdir / "home"), workdir) == "home/\nhomework.txt"


async def test_symlink_to_outside_file_is_refused(workdir: Path):
    (workdir / "link.txt").symlink_to(workdir.parent / "secret.txt")
    with pytest.raises(ToolError, match="outside") as info:
        await call(read_file(), workdir, path="link.txt")
    assert_no_outside_path(str(info.value), workdir)
    with pytest.raises(ToolError, match="outside"):
        await call(write_file(), workdir, path="link.txt", content="pwned")
    assert (workdir.parent / "secret.txt").read_text() == "top secret"


async def test_symlinked_directory_to_outside_is_refused(workdir: Path):
    outside = workdir.parent / "elsewhere"
    outside.mkdir()
    (workdir / "door").symlink_to(outside)
    with pytest.raises(ToolError, match="outside"):
        await call(list_dir(), workdir, path="door")
    with pytest.raises(ToolError, match="outside"):
        await call(write_file(), workdir, path="door/new.txt", content="x")
    assert list(outside.iterdir()) == []


async def test_dangling_symlink_to_outside_is_refused_for_write(workdir: Path):
    target = workdir.parent / "not-yet.txt"
    (workdir / "dangling").symlink_to(target)
    with pytest.raises(ToolError, match="outside"):
        await call(write_file(), workdir, path="dangling", content="x")
    assert not target.exists()


async def test_symlink_inside_cwd_is_followed(workdir: Path):
    (workdir / "real.txt").write_text("inside")
    (workdir / "alias.txt").symlink_to(workdir / "real.txt")
    assert await call(read_file(), workdir, path="alias.txt") == "inside"


# -- file errors ----------------------------------------------------------------------


@pytest.mark.parametrize(("tool", "extra"), [
    (read_file, {"path": "a.txt"}), (write_file, {"path": "a.txt", "content": "x"}), (list_dir, {}),
    # A program named by a path is checked against the one PATH finds: that resolves it.
    (lambda: shell_tool(policy("ls")), {"command": "./ls"}),
], ids=["read_file", "write_file", "list_dir", "shell"])
async def test_a_hung_filesystem_holds_up_the_call_not_the_event_loop(workdir: Path, monkeypatch, tool, extra):
    import threading

    (workdir / "a.txt").write_text("a")
    entered, released, waits = threading.Event(), threading.Event(), []
    realpath = os.path.realpath

    def hung_realpath(path, *args, **kwargs):  # a stat on a mount that does not answer
        entered.set()
        waits.append(released.wait(timeout=2))
        return realpath(path, *args, **kwargs)

    monkeypatch.setattr(os.path, "realpath", hung_realpath)
    results = []

    async def run_tool() -> None:
        try:
            results.append(await call(tool(), workdir, **extra))
        except ToolError as exc:  # the shell refuses ./ls, once it could tell
            results.append(exc)

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_tool)
            await trio.to_thread.run_sync(entered.wait)  # the tool is in its filesystem call
            # Only an event loop that runs meanwhile gets here before that call times out:
            # in the trio thread, the call stopped every agent of the runtime with it.
            released.set()
    assert waits and all(waits)
    assert len(results) == 1


async def test_missing_file_error_is_relative(workdir: Path):
    with pytest.raises(ToolError) as info:
        await call(read_file(), workdir, path="nope/missing.txt")
    message = str(info.value)
    assert "nope/missing.txt" in message
    assert "no such file" in message
    assert str(workdir) not in message


async def test_read_directory_and_list_file_are_errors(workdir: Path):
    (workdir / "d").mkdir()
    (workdir / "f").write_text("x")
    with pytest.raises(ToolError, match="d: is a directory"):
        await call(read_file(), workdir, path="d")
    with pytest.raises(ToolError, match="f: not a directory"):
        await call(list_dir(), workdir, path="f")
    with pytest.raises(ToolError, match="d: is a directory"):
        await call(write_file(), workdir, path="d", content="x")
    with pytest.raises(ToolError, match="no such file"):
        await call(list_dir(), workdir, path="missing")


@pytest.mark.parametrize(
    "tool, arguments, fragment",
    [
        (read_file, {}, "missing required argument 'path'"),
        (read_file, {"path": 3}, "'path' must be a string"),
        (read_file, {"path": "a", "offset": -1}, "'offset' must be an integer >= 0"),
        (read_file, {"path": "a", "limit": True}, "'limit' must be an integer >= 1"),
        (read_file, {"path": "a", "mode": "rb"}, "unexpected argument(s) mode"),
        (write_file, {"path": "a"}, "missing required argument 'content'"),
        (write_file, {"path": "a", "content": b"x"}, "'content' must be a string"),
        (list_dir, {"path": None, "depth": 2}, "unexpected argument(s) depth"),
    ],
)
async def test_bad_arguments_are_tool_errors(workdir: Path, tool, arguments, fragment):
    with pytest.raises(ToolError) as info:
        await tool().run(arguments, ctx_for(workdir))
    assert fragment in str(info.value)
    assert await trio.to_thread.run_sync(os.listdir, workdir) == []


# -- shell ----------------------------------------------------------------------------


def policy(*allow: str, **kwargs) -> ShellPolicy:
    return ShellPolicy(allow=frozenset(allow), **kwargs)


async def test_shell_runs_allowed_program_in_cwd(workdir: Path):
    (workdir / "marker.txt").write_text("")
    with trio.fail_after(10):
        out = await call(shell_tool(policy("ls", "echo")), workdir, command="ls")
    assert out.startswith("exit code 0\n--- stdout ---\nmarker.txt\n")
    assert out.endswith("--- stderr ---\n(empty)")


async def test_shell_reports_nonzero_exit_code_and_stderr(workdir: Path):
    with trio.fail_after(10):
        out = await call(shell_tool(policy("ls")), workdir, command="ls no-such-entry")
    assert out.startswith("exit code 2\n")
    stderr = out.split("--- stderr ---\n", 1)[1]
    assert "no-such-entry" in stderr


async def test_shell_quoting_passes_arguments_verbatim(workdir: Path):
    with trio.fail_after(10):
        command = "echo 'a  b' \"$HOME\" 'x;y'"
        out = await call(shell_tool(policy("echo")), workdir, command=command)
    assert "--- stdout ---\na  b $HOME x;y\n" in out  # no expansion, no splitting


@pytest.mark.parametrize("command", ["rm -rf x", "python -c 1", "/bin/rm x"])
async def test_shell_refuses_programs_not_allowed(workdir: Path, command):
    with pytest.raises(ToolError) as info:
        await call(shell_tool(policy("ls", "echo")), workdir, command=command)
    message = str(info.value)
    assert f"'{os.path.basename(command.split()[0])}' is not allowed" in message
    assert "allowed: echo, ls" in message


async def test_shell_with_empty_allow_list_refuses_everything(workdir: Path):
    with pytest.raises(ToolError, match=r"allowed: \(none\)"):
        await call(shell_tool(ShellPolicy()), workdir, command="echo hi")


@pytest.mark.parametrize(
    "command",
    [
        "echo hi | wc",
        "echo hi|wc",
        "echo hi > out.txt",
        "echo hi>out.txt",
        "echo a && echo b",
        "echo a; echo b",
        "echo a & echo b",
        "echo $(touch out.txt)",
        "echo hi 2>&1",
        "echo < out.txt",
    ],
)
async def test_shell_refuses_shell_operators(workdir: Path, command):
    with pytest.raises(ToolError, match="not supported"):
        await call(shell_tool(policy("echo", "wc", "touch")), workdir, command=command)
    assert not (workdir / "out.txt").exists()


async def test_shell_refuses_an_allowed_name_at_another_path(workdir: Path):
    fake = workdir / "ls"
    fake.write_text("#!/bin/sh\ntouch pwned\n")
    fake.chmod(0o755)
    with pytest.raises(ToolError, match="by name"):
        await call(shell_tool(policy("ls")), workdir, command="./ls")
    assert not (workdir / "pwned").exists()


async def test_shell_accepts_the_path_that_path_lookup_gives(workdir: Path):
    echo = shutil.which("echo")
    assert echo is not None
    with trio.fail_after(10):
        out = await call(shell_tool(policy("echo")), workdir, command=f"{echo} via-path")
    assert "--- stdout ---\nvia-path\n" in out


async def test_shell_exports_the_session_id_exactly(workdir: Path):
    # The policy's env may add variables but must not override the session id.
    tool = shell_tool(policy("printenv", env={"DSH_SESSION_ID": "spoofed", "EXTRA_VAR": "1"}))
    with trio.fail_after(10):
        out = await call(tool, workdir, command="printenv DSH_SESSION_ID EXTRA_VAR")
    assert out.startswith(f"exit code 0\n--- stdout ---\n{SESSION}\n1\n")


async def test_shell_children_do_not_inherit_the_runtimes_secrets(workdir: Path, monkeypatch):
    monkeypatch.setenv("DEEPSEEK_API_KEY", "sk-secret")
    monkeypatch.setenv("LANG", "C.UTF-8")
    with trio.fail_after(30):
        out = await call(shell_tool(policy("printenv")), workdir, command="printenv")
    names = {line.split("=", 1)[0] for line in out.splitlines() if "=" in line}
    assert "DEEPSEEK_API_KEY" not in names and "sk-secret" not in out
    assert {"PATH", "LANG", "DSH_SESSION_ID"} <= names
    # a variable the policy names explicitly is inherited
    with trio.fail_after(30):
        out = await call(shell_tool(policy("printenv", inherit={"PATH", "DEEPSEEK_API_KEY"})), workdir, command="printenv")
    assert "DEEPSEEK_API_KEY=sk-secret" in out and "LANG=" not in out


async def test_shell_path_comes_from_the_merged_env(workdir: Path, tmp_path: Path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    tool_script = bindir / "loopx"
    tool_script.write_text('#!/bin/sh\necho "loopx $1 session=$DSH_SESSION_ID"\n')
    tool_script.chmod(0o755)
    env = {"PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', os.defpath)}"}
    with trio.fail_after(10):
        out = await call(shell_tool(policy("loopx", env=env)), workdir, command="loopx status")
    assert f"--- stdout ---\nloopx status session={SESSION}\n" in out


async def test_shell_missing_program_is_a_tool_error(workdir: Path):
    with pytest.raises(ToolError, match="not found on PATH"):
        name = "no-such-program-xyz"
        await call(shell_tool(policy(name)), workdir, command=name)


async def test_shell_output_is_truncated_to_max_output(workdir: Path):
    with trio.fail_after(10):
        tool = shell_tool(policy("echo", max_output=10))
        out = await call(tool, workdir, command="echo " + "y" * 100)
    assert out.startswith("killed: stdout passed its limit of 10 bytes, so the program was stopped\n")
    stdout = out.split("--- stdout ---\n", 1)[1].split("\n--- stderr ---", 1)[0]
    assert stdout == "y" * 10 + "\n[truncated at 10 bytes]"


async def test_shell_output_exactly_at_the_limit_is_not_truncated(workdir: Path):
    with trio.fail_after(10):
        out = await call(shell_tool(policy("echo", max_output=10)), workdir, command="echo " + "y" * 9)
    assert out.startswith("exit code 0\n--- stdout ---\n" + "y" * 9 + "\n\n--- stderr ---")


async def test_shell_truncation_never_splits_a_character(workdir: Path):
    # "é" is two bytes: a limit of 4 keeps "aé" and drops the half "é" after it.
    with trio.fail_after(10):
        out = await call(shell_tool(policy("echo", max_output=4)), workdir, command="echo aéé")
    stdout = out.split("--- stdout ---\n", 1)[1].split("\n--- stderr ---", 1)[0]
    assert stdout == "aé\n[truncated at 4 bytes]"


async def test_shell_stops_an_endless_producer_at_max_output(workdir: Path):
    with trio.fail_after(20):  # the policy's timeout (60 s) would blow this
        out = await call(shell_tool(policy("yes", max_output=50_000, timeout=60)), workdir, command="yes")
    assert out.startswith("killed: stdout passed its limit of 50000 bytes, so the program was stopped\n")
    stdout = out.split("--- stdout ---\n", 1)[1].split("\n--- stderr ---", 1)[0]
    assert stdout == "y\n" * 25_000 + "\n[truncated at 50000 bytes]"


def sleeping(marker: str) -> list[int]:
    """Live processes whose command line holds ``marker`` (pids may be reused; markers not)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and marker.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                found.append(int(entry))
        except OSError:
            pass
    return found


@pytest.mark.parametrize(
    "command",
    [
        "sh -c 'sleep {m} & echo started'",  # backgrounded
        "setsid -f sleep {m}",  # a new session, forked
        "sh -c '(setsid sleep {m} &)'",  # double-forked into a new session
    ],
    ids=["background", "setsid", "double-fork"],
)
async def test_shell_children_that_escape_the_process_group_do_not_survive(workdir: Path, command):
    # Each escapee holds the output pipe, so before the launcher the call hung until its
    # timeout; a unique fractional sleep marks it in /proc.
    marker = f"1000.{os.getpid()}{id(command)}"
    with trio.fail_after(20):
        out = await call(shell_tool(policy("sh", "setsid", timeout=600)), workdir, command=command.format(m=marker))
    assert out.startswith("exit code 0\n"), out
    assert sleeping(marker) == []


@pytest.mark.parametrize(
    "policy_timeout, requested", [(30.0, 0.2), (0.2, 100)], ids=["model-lowers", "cannot-raise"]
)
async def test_shell_timeout_kills_the_program(workdir: Path, policy_timeout, requested):
    tool = shell_tool(policy("sleep", timeout=policy_timeout))
    with trio.fail_after(10):  # sleep 30 would blow this if the child were not killed
        with pytest.raises(ToolError, match=r"timed out after 0\.2s"):
            await call(tool, workdir, command="sleep 30", timeout=requested)


async def _wait_gone(pid: int) -> None:
    """Return once ``pid`` has exited (event-driven via a pidfd, no polling)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return  # already exited and reaped
    try:
        await trio.lowlevel.wait_readable(fd)
    finally:
        os.close(fd)


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="needs Linux pidfd")
async def test_cancelling_shell_kills_the_child_and_its_children(workdir: Path, tmp_path: Path):
    fifo = tmp_path / "pids.fifo"
    os.mkfifo(fifo)
    python = Path(sys.executable)
    script = (
        "import os, subprocess, sys, time\n"
        "g = subprocess.Popen(['sleep', '30'])\n"
        f"with open({str(fifo)!r}, 'w') as f: f.write(f'{{os.getpid()}} {{g.pid}}')\n"
        "time.sleep(30)\n"
    )
    env = {"PATH": f"{python.parent}{os.pathsep}{os.environ.get('PATH', os.defpath)}"}
    tool = shell_tool(policy(python.name, env=env))
    finished: str | None = None
    text = ""

    async def run_tool(cancel_scope: trio.CancelScope) -> None:
        nonlocal finished
        finished = await call(tool, workdir, command=f"{python.name} -c {shlex.quote(script)}")
        cancel_scope.cancel()  # the program ended on its own: stop waiting on the fifo

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_tool, nursery.cancel_scope)
            text = await trio.to_thread.run_sync(fifo.read_text, abandon_on_cancel=True)
            nursery.cancel_scope.cancel()
        assert finished is None, f"the program was not cancelled: {finished}"
        child, grandchild = (int(p) for p in text.split())
        await _wait_gone(child)
        await _wait_gone(grandchild)


@pytest.mark.parametrize(
    "arguments, fragment",
    [
        ({}, "missing required argument 'command'"),
        ({"command": ["ls"]}, "'command' must be a string"),
        ({"command": "ls", "timeout": -1}, "'timeout' must be a number > 0"),
        ({"command": "ls", "timeout": True}, "'timeout' must be a number > 0"),
        ({"command": "   "}, "empty command"),
        ({"command": "echo 'unbalanced"}, "cannot parse command"),
        ({"command": "ls", "cwd": "/"}, "unexpected argument(s) cwd"),
    ],
)
async def test_shell_bad_arguments_are_tool_errors(workdir: Path, arguments, fragment):
    with pytest.raises(ToolError) as info:
        await shell_tool(policy("ls", "echo")).run(arguments, ctx_for(workdir))
    assert fragment in str(info.value)


def test_shell_policy_validation():
    assert ShellPolicy().allow == frozenset()
    assert ShellPolicy(allow=["ls"]).allow == frozenset({"ls"})
    with pytest.raises(ValueError):
        ShellPolicy(timeout=0)
    with pytest.raises(ValueError):
        ShellPolicy(max_output=-1)
    with pytest.raises(ValueError, match="not paths"):
        ShellPolicy(allow={"/bin/ls"})
    with pytest.raises(TypeError):
        ShellPolicy(env={"A": 1})
    # The policy is a value: a caller's dict mutated later does not change it.
    extra = {"A": "1"}
    frozen = ShellPolicy(env=extra)
    extra["A"] = "2"
    assert frozen.env["A"] == "1"
    assert frozen == ShellPolicy(env={"A": "1"})
    assert frozen != ShellPolicy(env={"A": "2"})
    assert {frozen: True}[ShellPolicy(env={"A": "1"})]  # hashable despite the mapping
