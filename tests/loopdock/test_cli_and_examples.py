"""The command line and the shipped examples, run as a user runs them.

The founding demo runs in a subprocess (``python -m loopdock._cli``: the interpreter's
own entry into the CLI); the other commands and the examples run in this process
(``main(argv)``, and each example as ``__main__``), which is the same code without an
interpreter start per case."""

import os
import sys
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[2]


async def run(*argv, cwd, env=None):
    with trio.fail_after(60):
        result = await trio.run_process(
            [sys.executable, *argv],
            cwd=cwd,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        )
    return result.returncode, result.stdout.decode(), result.stderr.decode()


async def test_demo_runs_two_agents_on_two_loops_offline(tmp_path):
    code, out, err = await run("-m", "loopdock._cli", "demo", cwd=tmp_path)
    assert code == 0, err
    assert "[ping/deepseek-v4-flash, loop standard on driver default]" in out
    assert "[ping/deepseek-v4-pro, loop minimal-first on driver default]" in out
    # Each agent really called the tool and saw the demo files.
    assert out.count("tool: README.md | notes.txt") == 2
    assert "2 agents, 2 loops, one runtime." in out
    assert list(tmp_path.iterdir()) == []  # the demo leaves nothing behind


def test_run_resumes_its_session_on_the_same_home(loopdock_cli, tmp_path):
    home = str(tmp_path / "home")
    code, out, err = loopdock_cli("run", "first", "--session-id", "s1", "--home", home)
    assert code == 0, err
    assert "pong: first" in out and "(turn 1 completed)" in out
    code, out, err = loopdock_cli("run", "second", "--session-id", "s1", "--home", home)
    assert code == 0, err
    assert "pong: first" in out and "pong: second" in out and "(turn 2 completed)" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home"]  # nothing outside the home


def test_bad_input_gives_a_typed_error_and_exit_code_2(loopdock_cli, tmp_path):
    code, out, err = loopdock_cli("run", "x", "--session-id", "has space", "--home", str(tmp_path / "h"))
    assert code == 2
    assert "INVALID_SESSION_ID" in err and "Traceback" not in err
    code, out, err = loopdock_cli("run", "x", "--provider", "nowloopdock_cli", "--home", str(tmp_path / "h"))
    assert code == 2
    assert "UNKNOWN_ADAPTER" in err and "nowloopdock_cli" in err


def test_fake_demos_put_two_agents_on_two_loops(loopdock_cli):
    out, err = loopdock_cli.example(ROOT / "examples" / "fake_two_loop.py")
    assert "planner: loop=planner-loop driver=fake reply='fake: hello from planner'" in out
    assert "coder: loop=coder-loop driver=fake reply='fake: hello from coder'" in out
    out, err = loopdock_cli.example(ROOT / "examples" / "fake_two_driver_loops.py")
    assert "agent-a: loop=loop-a reply='loop-a: ping'" in out
    assert "agent-b: loop=loop-b reply='loop-b: ping'" in out
    assert "Two agents, one dock, two different loops." in out
    assert "Traceback" not in err
