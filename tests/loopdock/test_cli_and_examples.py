"""The command line and the shipped examples, run as a user runs them.

The founding demo runs in a subprocess (``python -m loopdock._cli``: the interpreter's
own entry into the CLI); the other commands and the examples run in this process
(``main(argv)``, and each example as ``__main__``), which is the same code without an
interpreter start per case."""

import argparse
import os
import re
import sys
from pathlib import Path

import pytest
import trio

ROOT = Path(__file__).resolve().parents[2]


async def run(*argv, cwd, env=None):
    with trio.fail_after(60):
        result = await trio.run_process(
            [sys.executable, "-P", *argv],
            cwd=cwd,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env={**os.environ, **(env or {})},
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


async def test_version_help_and_v_anywhere(tmp_path):
    code, out, err = await run("-m", "loopdock._cli", "--version", cwd=tmp_path)
    assert code == 0 and re.fullmatch(r"loopdock \S+\n", out), (out, err)
    code, out, err = await run("-m", "loopdock._cli", "--help", cwd=tmp_path)
    assert code == 0 and "``" not in out and "loopdock serve --port 8765" in out
    for sub in ("serve", "run", "sessions", "dsh-install", "goal"):
        code, out, err = await run("-m", "loopdock._cli", sub, "--help", cwd=tmp_path)
        assert code == 0 and "``" not in out and "-v, --verbose" in out, (sub, out)
    # -v after the subcommand (and before it) turns on info logs, on stderr only
    home = str(tmp_path / "h")
    for argv in (["run", "x", "-v", "--home", home], ["-v", "run", "x", "--home", home]):
        code, out, err = await run("-m", "loopdock._cli", *argv, cwd=tmp_path)
        assert code == 0, err
        assert "agent published" in err and "agent published" not in out
    code, out, err = await run("-m", "loopdock._cli", "run", "x", "--home", home, cwd=tmp_path)
    assert code == 0 and err == "" and "pong: x" in out  # quiet without -v


def _commands(parser, path=()):
    """Every command and verb of the parser (``("sessions", "list")``...), with its parser."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*path, name))


def test_every_command_and_verb_takes_v(loopdock_cli, tmp_path):
    from loopdock._cli import _parser

    commands = dict(_commands(_parser()))
    assert ("experiment", "report") in commands and ("sessions", "tail") in commands  # the walk sees verbs
    without = [" ".join(path) for path, parser in commands.items()
               if not any("-v" in action.option_strings for action in parser._actions)]
    assert without == []
    # after an experiment's action too (it once said: unrecognized arguments: -v)
    code, out, err = loopdock_cli("experiment", "report", "nothing-yet", "--home", str(tmp_path / "h"), "-v")
    assert code == 2 and err.strip().splitlines()[-1].startswith("loopdock: UNKNOWN_RUN: "), err


async def test_a_failed_turn_is_exit_1_with_one_line_saying_why(tmp_path):
    # the deepseek adapter (a key is set) on a closed loopback port: the turn ends `error`
    env = {"DEEPSEEK_API_KEY": "test-key", "DEEPSEEK_BASE_URL": "http://127.0.0.1:9/v1"}
    code, out, err = await run("-m", "loopdock._cli", "run", "hi", "--provider", "deepseek", "--model", "m",
                               "--home", str(tmp_path / "h"), cwd=tmp_path, env=env)
    assert code == 1
    assert "(turn 1 error)" in out
    last = err.strip().splitlines()[-1]
    assert last.startswith("loopdock: TURN_FAILED: a turn ended with an error:") and "MODEL_ERROR" in last
    assert "Traceback" not in err


async def test_the_deepseek_provider_without_a_key_says_to_set_it(tmp_path):
    code, out, err = await run("-m", "loopdock._cli", "run", "hi", "--provider", "deepseek",
                               "--home", str(tmp_path / "h"), cwd=tmp_path)
    assert code == 2
    assert err.strip() == ("loopdock: UNKNOWN_ADAPTER: no model adapter named 'deepseek'; registered: 'ping'; "
                           "set DEEPSEEK_API_KEY to register it")


async def test_an_embedded_runtime_prints_nothing(tmp_path):
    program = tmp_path / "quiet.py"
    program.write_text(
        "import trio\nfrom loopdock import Runtime\n"
        "async def main():\n"
        "    async with Runtime.open('home') as rt:\n"
        "        h = await rt.create_agent(session_id='q1')\n"
        "        h.agent.followup('hi')\n"
        "        await h.agent.wait_idle()\n"
        "trio.run(main)\n"
    )
    code, out, err = await run(str(program), cwd=tmp_path)
    assert (code, out, err) == (0, "", "")


@pytest.mark.parametrize("command", [["worker", "--cluster", "redis://127.0.0.1:1/0"],
                                     ["serve", "--no-loopx", "--cluster", "redis://127.0.0.1:1/0"]])
def test_the_cluster_without_coredis_says_what_to_install(command, monkeypatch, capsys, tmp_path):
    from loopdock._cli import main

    # As after `pip install loopdock` without the [cluster] extra: coredis cannot be imported.
    for name in [m for m in sys.modules if m.split(".")[0] == "coredis" or ".cluster" in m or m.endswith("_worker")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "coredis", None)
    assert main([*command, "--home", str(tmp_path / "home")]) == 2
    assert capsys.readouterr().err.strip() == "loopdock: the cluster needs coredis: pip install 'loopdock[cluster]'"


def test_a_worker_passivates_after_300_seconds_unless_told_otherwise(capsys):
    from loopdock._cli import _parser

    def parse(*extra):
        return _parser().parse_args(["worker", "--cluster", "redis://127.0.0.1:1/0", *extra]).passivate_after

    assert parse() == 300.0
    assert parse("--passivate-after", "2.5") == 2.5
    assert parse("--passivate-after", "never") is None
    for bad in ("0", "-1", "soon"):
        with pytest.raises(SystemExit):
            parse("--passivate-after", bad)
        assert f"a positive number of seconds or 'never', not '{bad}'" in capsys.readouterr().err


async def test_a_cluster_client_without_coredis_is_told_what_to_install(monkeypatch):
    from loopdock import open_cluster

    for name in [m for m in sys.modules if m.split(".")[0] == "coredis" or ".cluster" in m or m.endswith("_cluster")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "coredis", None)
    with pytest.raises(ModuleNotFoundError, match=r"^open_cluster\(url\) needs coredis: "
                                                  r"pip install 'loopdock\[cluster\]'$") as caught:
        async with open_cluster("redis://127.0.0.1:1/0"):
            pass
    assert caught.value.name == "coredis"  # as the CLI's handler expects
