"""What a user gets from the wheel: a fresh virtual environment per extra (``loopdock``,
``loopdock[dsh]``, ``loopdock[cluster]``), made with the standard library's ``venv`` and
``pip install`` of the wheel the suite tests (``wheel_file``: ``$LOOPDOCK_TEST_WHEEL``,
else built from the tree), then every command of the installed ``loopdock`` script.

The wheel once shipped without the cluster's subpackages, so ``loopdock worker`` died
with ModuleNotFoundError while every test passed on the source tree. Here nothing runs
from the tree: each child is the fresh venv's own ``bin/loopdock`` or ``bin/python -P``,
in a folder outside the checkout, with a temporary HOME, LOOPDOCK_HOME and DSH_HOME, and
a PATH without the test venv (so neither its ``dsh`` nor its ``loopx`` is found by
accident; the tests that need LoopX put exactly its CLI and Node 22 on PATH).

- every command and verb, walked from the installed argparse parser, answers ``--help``
  in every venv (a new command is covered without a change here), and each has at least
  one real invocation below (``test_every_command_has_a_real_invocation_here``);
- every module of the package imports in every venv but the cluster's, which need
  ``[cluster]``; the commands that need it say so in one line instead of a traceback;
- ``[dsh]`` gives a ``dsh`` that ``dsh-install`` finds beside the venv's Python;
- ``[cluster]`` runs ``loopdock worker`` against a real redis-server on a free loopback
  port, a client in the same venv gets its answer, ``serve --cluster`` shows the agent on
  the console, and both stop cleanly on a signal.

The venvs are made once per session, pip's cache in the checkout (``.cache/pip``: every
test has a temporary HOME); each says on the terminal how long it took. Measured on a
2-core machine: 7 s for ``loopdock``, 10 s for ``loopdock[cluster]``, 13 s for
``loopdock[dsh]`` (DSH's 95 MB binary), about twice that with other test runs beside.
The module is e2e: pip installs from the package index, and LoopX, DSH and redis-server
run for real.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio
import yaml
from line_reader import Lines
from terminal import ctrl_c_as_at_a_terminal
from trio_websocket import open_websocket

from loopdock._cli import _parser
from loopdock._goal import default_agent_id
from loopdock.benchmarks._redis import RedisServer
from loopdock.bridge._dsh_binding import BINDING_RECORD, _write
from loopdock.bridge._dsh_files import SESSION_FILE, session_log
from loopdock.bridge._patch import PLUGIN_ID

ROOT = Path(__file__).resolve().parents[2]
#: The extras a user installs, "" for plain ``loopdock``.
EXTRAS = ("", "dsh", "cluster", "mcp", "otel")
#: The modules that need coredis (``loopdock[cluster]``); everything else imports without it.
CLUSTER_MODULES = {"loopdock._cluster", "loopdock._serve_cluster", "loopdock._worker",
                   "loopdock.actors.cluster", "loopdock.runtime.cluster"}
NEEDS_CLUSTER = "loopdock: the cluster needs coredis: pip install 'loopdock[cluster]'"
READY = re.compile(r"^loopdock serve: ws://127\.0\.0\.1:(\d+) \(token in (.+)\)$")
STARTUP = 120  # seconds: an interpreter start, a runtime open, LoopX's start-up, on a busy machine


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], bool]]:
    """Every command and verb of the parser, and whether it is a leaf (runs something)."""
    subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    yield path, not subparsers
    for action in subparsers:
        for name, sub in action.choices.items():
            yield from _commands(sub, (*path, name))


#: From the installed loopdock (the wheel under test): ``()`` is ``loopdock`` itself.
COMMANDS = dict(_commands(_parser()))
INVOKED: set[str] = set()


def invokes(*commands: str):
    """Declares the commands a test runs for real (checked against COMMANDS)."""
    INVOKED.update(commands)
    return lambda test: test


# -- fresh venvs -------------------------------------------------------------------------


@dataclass(frozen=True)
class Venv:
    extra: str
    path: Path
    seconds: float  # how long making it took

    @property
    def name(self) -> str:
        return f"loopdock[{self.extra}]" if self.extra else "loopdock"

    def loopdock(self, *args: str | Path) -> list[str]:
        return [str(self.path / "bin" / "loopdock"), *map(str, args)]

    def python(self, *args: str | Path) -> list[str]:
        return [str(self.path / "bin" / "python"), "-P", *map(str, args)]


def _path_without_test_venv() -> str:
    mine = Path(sys.executable).parent
    return os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p and Path(p) != mine)


def _clean_env() -> dict[str, str]:
    """This process's environment without what points into the test venv or a home."""
    drop = ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "DEEPSEEK_API_KEY", "LOOPDOCK_TEST_WHEEL")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("XDG_")}
    env["PATH"] = _path_without_test_venv()
    return env


def _make_venv(extra: str, tmp_path_factory: pytest.TempPathFactory, wheel: Path, config: pytest.Config) -> Venv:
    where = tmp_path_factory.mktemp(f"venv-{extra or 'plain'}")
    env = {**_clean_env(), "HOME": str(tmp_path_factory.mktemp("pip-home")),
           "PIP_CACHE_DIR": str(ROOT / ".cache" / "pip")}
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", str(where)], env=env, check=True, capture_output=True, timeout=300)
    spec = f"{wheel}[{extra}]" if extra else str(wheel)
    done = subprocess.run(
        [str(where / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", spec],
        env=env, capture_output=True, text=True, timeout=1200, check=False,
    )
    if done.returncode != 0:
        pytest.fail(f"pip install {spec} into a fresh venv failed ({done.returncode}):\n{done.stderr[-4000:]}")
    venv = Venv(extra, where, time.monotonic() - started)
    reporter, capture = (config.pluginmanager.get_plugin(name) for name in ("terminalreporter", "capturemanager"))
    if reporter is not None and capture is not None:  # on the terminal as it happens, not captured
        with capture.global_and_fixture_disabled():
            reporter.write_line(f"fresh venv with {venv.name}: {venv.seconds:.1f} s (venv + pip install)")
    return venv


@pytest.fixture(scope="session")
def plain_venv(tmp_path_factory, wheel_file, pytestconfig) -> Venv:
    return _make_venv("", tmp_path_factory, wheel_file, pytestconfig)


@pytest.fixture(scope="session")
def dsh_venv(tmp_path_factory, wheel_file, pytestconfig) -> Venv:
    return _make_venv("dsh", tmp_path_factory, wheel_file, pytestconfig)


@pytest.fixture(scope="session")
def cluster_venv(tmp_path_factory, wheel_file, pytestconfig) -> Venv:
    return _make_venv("cluster", tmp_path_factory, wheel_file, pytestconfig)


@pytest.fixture(scope="session")
def mcp_venv(tmp_path_factory, wheel_file, pytestconfig) -> Venv:
    return _make_venv("mcp", tmp_path_factory, wheel_file, pytestconfig)


@pytest.fixture(scope="session")
def otel_venv(tmp_path_factory, wheel_file, pytestconfig) -> Venv:
    return _make_venv("otel", tmp_path_factory, wheel_file, pytestconfig)


@pytest.fixture(params=EXTRAS, ids=lambda extra: extra or "plain")
def venv(request) -> Venv:
    return request.getfixturevalue(f"{request.param or 'plain'}_venv")


# -- a user of one venv -------------------------------------------------------------------


@dataclass(frozen=True)
class Done:
    code: int
    out: str
    err: str


@dataclass
class User:
    """Someone at a shell: a folder outside the checkout, and an environment with its own
    HOME, LOOPDOCK_HOME and DSH_HOME."""

    cwd: Path
    home: Path
    env: dict[str, str]

    @property
    def loopdock_home(self) -> Path:
        return Path(self.env["LOOPDOCK_HOME"])

    @property
    def dsh_home(self) -> Path:
        return Path(self.env["DSH_HOME"])

    def with_path_first(self, *dirs: Path) -> None:
        self.env["PATH"] = os.pathsep.join([*map(str, dirs), self.env["PATH"]])

    async def run(
        self,
        argv: Sequence[str],
        *,
        # A caller's own fail_after could only shorten the 60 s bound inside, never raise it.
        timeout: float = 60,  # noqa: ASYNC109 - a default bound on every command, raised for slow ones
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> Done:
        with trio.fail_after(timeout):
            done = await trio.run_process(list(argv), cwd=cwd or self.cwd, env=env or self.env,
                                          capture_stdout=True, capture_stderr=True, check=False)
        return Done(done.returncode, done.stdout.decode(), done.stderr.decode())

    async def start(self, argv: Sequence[str], stderr: Path, *, cwd: Path | None = None) -> trio.Process:
        """A long-running command, its stdout piped (read it with ``Lines``), its stderr in a file."""
        async with await trio.open_file(stderr, "wb") as err:
            return await trio.lowlevel.open_process(list(argv), cwd=cwd or self.cwd, env=self.env,
                                                    stdout=subprocess.PIPE, stderr=err.wrapped,
                                                    preexec_fn=ctrl_c_as_at_a_terminal)


@pytest.fixture
def user(tmp_path) -> User:
    assert not tmp_path.resolve().is_relative_to(ROOT)  # the tree's partial loopdock/ must not be in reach
    home, cwd = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    cwd.mkdir()
    env = {**_clean_env(), "HOME": str(home), "LOOPDOCK_HOME": str(home / ".loopdock"),
           "DSH_HOME": str(home / ".dsh"), "LOOPX_USAGE_PING": "0", "DSH_TELEMETRY_MODE": "DISABLED"}
    return User(cwd, home, env)


@pytest.fixture
def loopx_on_path(user, node22_bin, loopx_command, tmp_path) -> None:
    """Node 22 and the LoopX CLI (the test extra's loopx 2.1.1) first on the user's PATH,
    and nothing else of the test venv: as README's Install has a user set it up."""
    bin_dir = tmp_path / "loopx-bin"
    bin_dir.mkdir()
    (bin_dir / "loopx").symlink_to(loopx_command[0])
    user.with_path_first(node22_bin, bin_dir)


async def stop(process: trio.Process, sig: int) -> int:
    process.send_signal(sig)
    with trio.fail_after(60):
        return await process.wait()


async def reap(process: trio.Process) -> None:
    """Kill a process a failing test left running (ours: started by this test)."""
    if process.returncode is None:
        process.kill()
        with trio.move_on_after(30):
            await process.wait()


# -- every command, every venv -------------------------------------------------------------


def test_the_walk_sees_every_command_and_verb():
    leaves = {" ".join(path) for path, leaf in COMMANDS.items() if leaf}
    assert {"demo", "serve", "worker", "sessions tail", "goal bind", "experiment export", "bench"} <= leaves
    assert COMMANDS[("sessions",)] is False and COMMANDS[()] is False


def test_every_command_has_a_real_invocation_here():
    leaves = {" ".join(path) for path, leaf in COMMANDS.items() if leaf}
    assert sorted(leaves - INVOKED) == [], "a command no test here runs: give it a real invocation"
    assert sorted(INVOKED - leaves) == []


async def test_every_command_answers_help_from_outside_the_checkout(venv, user):
    limiter = trio.CapacityLimiter(4)
    results: list[tuple[tuple[str, ...], Done]] = []

    async def one(path: tuple[str, ...]) -> None:
        async with limiter:
            results.append((path, await user.run(venv.loopdock(*path, "--help"))))

    with trio.fail_after(240):
        async with trio.open_nursery() as nursery:
            for path in COMMANDS:
                nursery.start_soon(one, path)
    wrong = []
    for path, done in sorted(results):
        usage = done.out.split("\n\n")[0]
        if done.code != 0 or done.err or not usage.startswith(" ".join(["usage: loopdock", *path]) + " ") \
                or "[-v]" not in usage:  # README: every command takes -v
            wrong.append((" ".join(path), done.code, usage[:300], done.err[-500:]))
    assert wrong == []
    # the top level lists exactly the commands the parser has
    (top,) = [done.out for path, done in results if path == ()]
    listed = set(re.findall(r"^    ([a-z][a-z-]*) ", top, re.M))
    assert listed == {path[0] for path in COMMANDS if len(path) == 1}


async def test_the_version_is_the_wheels_and_loopdock_is_the_venvs_own(venv, user, wheel_file):
    version = wheel_file.name.split("-")[1]
    for argv in (venv.loopdock("--version"), venv.python("-m", "loopdock", "--version")):
        done = await user.run(argv)
        assert (done.code, done.out, done.err) == (0, f"loopdock {version}\n", "")
    done = await user.run(venv.python("-c", "import loopdock; print(loopdock.__file__)"))
    assert Path(done.out.strip()).is_relative_to(venv.path), done


IMPORT_ALL = """
import importlib, json, pkgutil, loopdock
names = sorted(m.name for m in pkgutil.walk_packages(loopdock.__path__, "loopdock.") if not m.name.endswith("__main__"))
failed = {}
for name in names:
    try:
        importlib.import_module(name)
    except Exception as exc:
        failed[name] = [type(exc).__name__, getattr(exc, "name", None)]
print(json.dumps({"names": names, "failed": failed}))
"""


async def test_every_module_imports_with_its_extra(venv, user, wheel_file):
    done = await user.run(venv.python("-c", IMPORT_ALL))
    assert done.code == 0, done.err
    found = json.loads(done.out)
    if venv.extra == "cluster":
        assert found["failed"] == {}
        with zipfile.ZipFile(wheel_file) as wheel:  # and that is every module the wheel has
            modules = {n[:-3].removesuffix("/__init__").replace("/", ".") for n in wheel.namelist()
                       if n.startswith("loopdock/") and n.endswith(".py") and not n.endswith("__main__.py")}
        assert set(found["names"]) == modules - {"loopdock"}
    else:  # only the cluster's modules fail, and only for coredis
        assert found["failed"] == {name: ["ModuleNotFoundError", "coredis"] for name in CLUSTER_MODULES}


# -- loopdock: no extra -----------------------------------------------------------------------


@invokes("demo")
async def test_demo_runs_its_two_agents(plain_venv, user):
    done = await user.run(plain_venv.loopdock("demo"))
    assert done.code == 0, done.err
    assert re.search(r"^== flash-\d+  \[ping/deepseek-v4-flash, loop standard on driver default\]$", done.out, re.M)
    assert re.search(r"^== pro-\d+  \[ping/deepseek-v4-pro, loop minimal-first on driver default\]$", done.out, re.M)
    assert done.out.count("tool: README.md | notes.txt") == 2  # each agent listed the demo's files
    assert done.out.endswith("2 agents, 2 loops, one runtime.\n") and done.err == ""
    assert not user.loopdock_home.exists() and list(user.cwd.iterdir()) == []  # a temporary home, nothing left


@invokes("run", "sessions list", "sessions show", "sessions tail", "sessions approve")
async def test_run_then_the_sessions_commands_read_it_back(plain_venv, user):
    done = await user.run(plain_venv.loopdock("run", "hello from the wheel", "--session-id", "smoke-1"))
    assert done.code == 0, done.err
    assert done.out.splitlines() == [
        "== smoke-1  [ping/ping-1, loop standard on driver default]",
        "       user: hello from the wheel",
        "  assistant: pong: hello from the wheel",
        "             (turn 1 completed)",
    ]
    assert (user.loopdock_home / "sessions.db").is_file()  # LOOPDOCK_HOME, not the cwd
    assert list(user.cwd.iterdir()) == []

    done = await user.run(plain_venv.loopdock("run", "and again", "--session-id", "smoke-1"))
    assert done.code == 0 and "(turn 2 completed)" in done.out and "pong: hello from the wheel" in done.out

    done = await user.run(plain_venv.loopdock("sessions", "list"))
    assert done.code == 0, done.err
    header, row = done.out.splitlines()
    assert header.split()[:7] == ["SESSION", "FROM", "LOOP", "DRIVER", "STATUS", "TURNS", "LAST"]
    assert row.split()[:7] == ["smoke-1", "runtime", "standard", "default", "completed", "2", "turn/end"]
    done = await user.run(plain_venv.loopdock("sessions", "list", "-q"))
    assert (done.code, done.out) == (0, "smoke-1\n")

    done = await user.run(plain_venv.loopdock("sessions", "show", "smoke-1"))
    assert done.code == 0, done.err
    assert done.out.startswith("smoke-1 (runtime): loop standard on driver default; completed; 2 turns\n")
    assert "[user] hello from the wheel" in done.out and "pong: and again" in done.out
    done = await user.run(plain_venv.loopdock("sessions", "show", "no-such-session"))
    assert done.code == 2 and done.err.startswith("loopdock: SESSION_NOT_FOUND: no session 'no-such-session'")
    # No question was asked in this session: an answer to one is refused, the log untouched.
    done = await user.run(plain_venv.loopdock("sessions", "approve", "smoke-1", "no-such-question"))
    assert (done.code, done.out) == (2, "")
    assert done.err.startswith("loopdock: APPROVAL_CLOSED: approval 'no-such-question' of session smoke-1 is not open")

    done = await user.run(plain_venv.loopdock("sessions", "tail", "smoke-1", "-n", "2", "--no-follow"))
    assert done.code == 0 and len(done.out.splitlines()) == 2
    assert re.search(r"turn/end +turn 2 completed$", done.out.splitlines()[-1])

    # Following: the events of a turn run meanwhile come as they are written; ^C ends it.
    tail = await user.start(plain_venv.loopdock("sessions", "tail", "smoke-1", "-n", "1"), user.cwd.parent / "tail.err")
    try:
        lines = Lines(tail.stdout, deadline=60)
        await lines.until(r"turn/end +turn 2 completed$")
        done = await user.run(plain_venv.loopdock("run", "while followed", "--session-id", "smoke-1"))
        assert done.code == 0, done.err
        await lines.until(r"pong: while followed")
        await lines.until(r"turn/end +turn 3 completed$")
        assert await stop(tail, signal.SIGINT) == 130
    finally:
        await reap(tail)
    assert (user.cwd.parent / "tail.err").read_text() == ""


@invokes("dsh-patch")
async def test_dsh_patch_writes_a_patch_for_the_plugin_under_the_home(plain_venv, user):
    done = await user.run(plain_venv.loopdock("dsh-patch", "--out", "patch", "--url", "ws://127.0.0.1:8799", "--dock"))
    assert done.code == 0, done.err
    plugin = user.loopdock_home / "dsh-plugin" / "index.mjs"
    assert done.out.splitlines()[0] == f"wrote patch/patch.yml (plugin: {plugin})"
    assert plugin.is_file() and (user.loopdock_home / "dsh-plugin" / "package.json").is_file()
    rows = yaml.safe_load((user.cwd / "patch" / "patch.yml").read_text())
    inserted = [item for row in rows for item in row.get("insert", [])]
    (ours,) = [item for item in inserted if item.get("id") == PLUGIN_ID]
    assert ours["name"] == str(plugin) and ours["config"]["url"] == "ws://127.0.0.1:8799/dsh"
    assert ours["config"]["token"] == (user.loopdock_home / "bridge.token").read_text().strip()
    assert ours["config"]["dock"] is True


@invokes("dsh-migrate")
async def test_dsh_migrate_moves_an_old_binding_into_a_record(plain_venv, user):
    old = {"type": "agent-preset/selected", "seq": 0, "time": 1000,
           "data": {"agentLoopDock": {"loop": "kept", "driver": "default"}}}
    log = user.dsh_home / "sessions" / "--w--" / "s1" / SESSION_FILE
    log.parent.mkdir(parents=True)
    header = {"type": "session", "version": 4, "id": "s1", "createdAt": 1, "cwd": "/w", "isSeeded": False,
              "delegationDepth": 0}
    _write(log, [header, old, {"type": "turn/start", "seq": 1, "time": 1001, "data": {"turn": 1}}])

    done = await user.run(plain_venv.loopdock("dsh-migrate"))
    assert (done.code, done.out, done.err) == (0, "migrated s1: loop kept on driver default\n", "")
    rows = session_log(user.dsh_home, "s1")
    assert rows[1] == {"type": BINDING_RECORD, "seq": 0, "time": 1000, "data": {"loop": "kept", "driver": "default"},
                       "ignorable": True}
    done = await user.run(plain_venv.loopdock("dsh-migrate"))
    assert (done.code, done.out) == (0, "nothing to migrate\n")

    no_home = {k: v for k, v in user.env.items() if k != "DSH_HOME"}
    done = await user.run(plain_venv.loopdock("dsh-migrate"), env=no_home)
    assert done.code == 2 and done.err.startswith("loopdock: INVALID_OPTIONS: DSH needs a home folder: set DSH_HOME")


async def test_dsh_install_without_the_dsh_extra_says_what_to_install(plain_venv, user):
    done = await user.run(plain_venv.loopdock("dsh-install", "--profile", "headless"))
    assert (done.code, done.out) == (2, "")
    assert done.err == "loopdock: DSH_INSTALL: no dsh command: install it with pip install 'loopdock[dsh]'\n"


@invokes("bench")
async def test_bench_tables_rewrites_a_checkouts_docs_and_refuses_elsewhere(plain_venv, user):
    done = await user.run(plain_venv.loopdock("bench", "--tables"))
    assert (done.code, done.out) == (2, "")
    assert done.err == ("loopdock bench: --tables rewrites a loopdock checkout's docs; "
                        "run it from the checkout's top folder\n")

    # In a copy of a checkout's docs and results, with some tables gone stale.
    checkout = user.cwd / "checkout"
    docs = ["README.md", "benchmarks/README.md", "benchmarks/PROFILE.md", "docs/cluster.md", "docs/lifecycle.md",
            "benchmarks/results/bench-full.json", "benchmarks/results/bench-cluster-full.json",
            "benchmarks/results/bench-tracing-full.json", "benchmarks/results/bench-usage-full.json",
            "benchmarks/results/bench-lifecycle-full.json"]
    for doc in docs:
        (checkout / doc).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / doc, checkout / doc)
    for doc, block in (("README.md", "summary"), ("docs/cluster.md", "cluster"), ("benchmarks/PROFILE.md", "tracing"),
                       ("benchmarks/PROFILE.md", "usage"), ("benchmarks/PROFILE.md", "lifecycle"),
                       ("docs/lifecycle.md", "lifecycle-summary")):
        text = (checkout / doc).read_text()
        stale = re.sub(rf"(<!-- bench:{block} -->\n).*?(<!-- /bench:{block} -->)", r"\1stale\n\2", text, flags=re.S)
        assert stale != text
        (checkout / doc).write_text(stale)
    done = await user.run(plain_venv.loopdock("bench", "--tables"), cwd=checkout)
    assert done.code == 0, done.err
    assert f"loopdock bench: tables written to {checkout / 'README.md'}" in done.out
    assert f"loopdock bench: tables written to {checkout / 'docs/cluster.md'}" in done.out
    assert f"loopdock bench: tables written to {checkout / 'docs/lifecycle.md'}" in done.out
    for doc in docs[:5]:  # regenerated from the committed results: as committed
        assert (checkout / doc).read_text() == (ROOT / doc).read_text(), doc


@invokes("experiment run", "experiment rescore", "experiment report", "experiment export", "experiment bench")
async def test_experiment_runs_reports_and_says_what_export_needs(plain_venv, user):
    smallest = user.cwd / "smallest.yml"
    shutil.copyfile(ROOT / "examples" / "experiments" / "smallest.yml", smallest)
    done = await user.run(plain_venv.loopdock("experiment", "run", "smallest.yml"))
    assert done.code == 0, done.err
    assert done.out.splitlines()[0] == ("experiment smallest: 4 rollouts, 0 scored before, 4 scored now, 0 failed, "
                                        "0 not run (budget)")
    assert done.err.splitlines()[0] == "experiment: 4 rollouts, 4 to run, 0 already scored"
    done = await user.run(plain_venv.loopdock("experiment", "run", "smallest.yml"))
    assert done.code == 2 and "pass --resume to go on with it" in done.err
    done = await user.run(plain_venv.loopdock("experiment", "run", "smallest.yml", "--resume"))
    assert done.code == 0 and "4 rollouts, 4 scored before, 0 scored now" in done.out
    done = await user.run(plain_venv.loopdock("experiment", "rescore", "smallest.yml"))
    assert done.code == 0, done.err
    assert done.out.splitlines() == ["experiment smallest: rescored 4 rollouts (0 changed), 0 failed",
                                     "report: loopdock experiment report smallest"]

    done = await user.run(plain_venv.loopdock("experiment", "report", "smallest", "-v"))
    assert done.code == 0, done.err
    rows = [line.split() for line in done.out.splitlines() if line.startswith("ping/ping-1")]
    assert [row[:6] for row in rows] == [["ping/ping-1", "standard", "2", "1", "2/2", "1.00"],
                                         ["ping/ping-1", "minimal-first", "2", "1", "2/2", "1.00"]]
    html = user.loopdock_home / "reports" / "smallest" / "report.html"
    # no matplotlib without an extra: the report says so, and still writes its page
    assert "no plot: the plot needs matplotlib: pip install 'loopdock[bench]'" in done.out
    assert f"html: {html}" in done.out and "<html" in html.read_text().lower()
    assert not (html.parent / "success-vs-cost.png").exists()

    done = await user.run(plain_venv.loopdock("experiment", "export", "smallest"))
    assert (done.code, done.out) == (2, "")
    assert done.err == "loopdock: MISSING_EXTRA: the export needs inspect_ai: pip install 'loopdock[inspect]'\n"

    done = await user.run(plain_venv.loopdock("experiment", "bench", "--rollouts", "10", "--latency", "0.01"))
    assert done.code == 0, done.err
    assert done.out.startswith("experiment runner bench: 10 rollouts at once, 2 model calls each, 0.01 s per call\n")
    assert re.search(r"^experiment runner +[\d.]+ +[\d.]+ +[\d.]+ +[\d.]+$", done.out, re.M)
    assert done.err.splitlines() == ["bench: 10 bare agents at once ...", "bench: 10 rollouts of an experiment at once ..."]


@invokes("serve", "goal bind")
async def test_serve_answers_and_shows_the_goal_that_goal_bind_made(plain_venv, user, loopx_on_path):
    project = user.cwd  # serve's default LoopX project: the folder it starts in
    err = user.cwd.parent / "serve.err"
    serve = await user.start(plain_venv.loopdock("serve", "--port", "0", "-v"), err)
    try:
        lines = Lines(serve.stdout, deadline=STARTUP)
        ready = READY.match(await lines.until(r"^loopdock serve: "))
        assert ready, lines.lines
        port, token_file = int(ready[1]), Path(ready[2])
        assert token_file == user.loopdock_home / "bridge.token"
        token = (await trio.Path(token_file).read_text()).strip()
        assert await lines.until(r"console: ") == f"  console: http://127.0.0.1:{port}/console#token={token}"
        await lines.until(r"goalbar: ")

        with trio.fail_after(30):
            status, body = await http_get(port, "/console")
        assert status == "HTTP/1.1 200 OK" and b"<title>loopdock console</title>" in body

        session, goal = "smoke-goal-session", "smoke-goal"
        done = await user.run(plain_venv.loopdock(
            "goal", "bind", "--session", session, "--goal-id", goal, "--objective", "Check the installed wheel",
            "--todo", "[P0] Run every command"), timeout=STARTUP, cwd=project)
        assert done.code == 0, done.err
        lane = default_agent_id(session)
        assert done.out == f"bound session {session} to goal {goal} (agent lane {lane}) in {project}\n"
        assert json.loads((project / ".loopx" / "registry.json").read_text())["goals"][0]["id"] == goal

        with trio.fail_after(STARTUP):
            async with open_websocket("127.0.0.1", port, "/goalbar", use_ssl=False) as ws:
                await hello(ws, token, ["goalbar"])
                await ws.send_message(json.dumps({"v": 1, "type": "goalbarRead", "id": "r1",
                                                  "data": {"sessionId": session}}))
                reply = await answer(ws, "r1")
        assert reply["data"] == {"state": {
            "kind": "visible", "sessionId": session, "goalId": goal, "agentId": lane,
            "goalText": "Check the installed wheel", "lifecycleState": "active",
            "processed": 0, "remaining": 1, "total": 1, "pending": False, "agentRunning": False,
        }, "outcome": "read"}

        assert await stop(serve, signal.SIGINT) == 0
    finally:
        await reap(serve)
    logged = err.read_text()
    # LoopX's start-up went through on the CLI it found on PATH (it installs none), and
    # nothing went wrong
    assert re.search(r"loopx startup init finished' ok=True .*installed_cli=False", logged), logged
    assert not re.search(r"WARNING|ERROR|Traceback", logged), logged


@invokes("dsh-install")
async def test_dsh_install_finds_the_extras_dsh_and_verifies_the_profile(dsh_venv, user):
    # The venv is not activated: dsh is found beside the venv's Python.
    assert shutil.which("dsh", path=user.env["PATH"]) is None
    done = await user.run(dsh_venv.loopdock("dsh-install", "--profile", "headless", "--dock", "--ping",
                                            "--url", "ws://127.0.0.1:8798"), timeout=300)
    assert done.code == 0, done.err
    plugin = user.loopdock_home / "dsh-plugin" / "index.mjs"
    layer = user.dsh_home / "profiles" / "headless" / "cordis.patch.yml"
    assert done.out.splitlines() == [
        f"installed loopdock into DSH profile 'headless' ({layer})",
        f"  verified with dsh --dump-config: plugin row {PLUGIN_ID}: loads {plugin}, connects to ws://127.0.0.1:8798/dsh",
        "  verified with dsh --dump-config: dock mode: DSH's agent-loop row is disabled (the plugin hosts it as "
        "driver 'default')",
        "  verified with dsh --dump-config: default model: ping/ping-1 (offline)",
        # what to run next, as typed at this shell: dsh is not on its PATH
        f"next: loopdock serve --port 8798   then   DSH_HOME={user.dsh_home} {dsh_venv.path / 'bin' / 'dsh'} headless",
    ]
    assert plugin.is_file()


# -- the cluster -------------------------------------------------------------------------------


@pytest.fixture
def redis_server(tmp_path) -> Iterator[RedisServer]:
    """Debian's redis-server on a free loopback port (as tests/cluster/conftest.py)."""
    server = RedisServer(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop(signal.SIGKILL)


async def test_the_cluster_commands_without_the_extra_say_what_to_install(plain_venv, user, redis_server):
    for command in (["worker", "--cluster", redis_server.url],
                    ["serve", "--no-loopx", "--port", "0", "--cluster", redis_server.url]):
        done = await user.run(plain_venv.loopdock(*command))
        assert (done.code, done.out, done.err) == (2, "", NEEDS_CLUSTER + "\n"), command
    done = await user.run(plain_venv.python("-c", CLIENT, redis_server.url))
    assert done.code == 1
    assert done.err.splitlines()[-1] == ("ModuleNotFoundError: open_cluster(url) needs coredis: "
                                         "pip install 'loopdock[cluster]'")


CLIENT = """
import sys
import trio
from loopdock import open_cluster

async def main():
    async with open_cluster(sys.argv[1]) as rt:
        handle = await rt.create_agent(session_id="smoke-cluster", loop="minimal-first")
        handle.agent.followup("hello from a cluster client")
        await handle.agent.wait_idle()
        async for event in handle.agent.events():
            if event.type == "assistant/message":
                print("assistant:", event.data["content"][0]["text"])
            if event.type == "turn/end":
                print("turn/end:", event.data["reason"]["kind"])
                break

trio.run(main)
"""


@invokes("worker")
async def test_a_worker_answers_a_client_and_serve_shows_its_agent(cluster_venv, user, redis_server):
    url = redis_server.url
    worker = await user.start(cluster_venv.loopdock("worker", "--cluster", url, "--shards", "4"),
                              user.cwd.parent / "worker.err")
    serve: trio.Process | None = None
    try:
        line = await Lines(worker.stdout, deadline=STARTUP).until(r"^loopdock worker ")
        assert re.fullmatch(rf"loopdock worker \S+: serving {re.escape(url)} \(4 shards\)", line), line

        # A client in the same venv, through the public API: the worker runs the agent.
        done = await user.run(cluster_venv.python("-c", CLIENT, url))
        assert (done.code, done.out) == (0, "assistant: pong: hello from a cluster client\nturn/end: completed\n"), \
            done.err

        # serve --cluster shows it on the console.
        serve = await user.start(cluster_venv.loopdock("serve", "--no-loopx", "--port", "0", "--cluster", url),
                                 user.cwd.parent / "serve.err")
        lines = Lines(serve.stdout, deadline=STARTUP)
        ready = READY.match(await lines.until(r"^loopdock serve: "))
        assert ready, lines.lines
        assert (await lines.until(r"cluster: ")) == f"  cluster: {url} (1 live worker)"
        port, token = int(ready[1]), (await trio.Path(ready[2]).read_text()).strip()
        with trio.fail_after(60):
            async with open_websocket("127.0.0.1", port, "/goalbar", use_ssl=False) as ws:
                await hello(ws, token, ["live", "console"])
                row: dict[str, object] = {}
                while row.get("turns") != 1:  # the follower looks every second
                    frame = json.loads(await ws.get_message())
                    items = frame["data"].get("items", []) if frame["type"] == "live" else []
                    for item in items:
                        if item["type"] == "console/agent" and item["agentId"] == "smoke-cluster":
                            row = item["data"]
        assert (row["origin"], row["loop"], row["lastTurn"]) == ("cluster", "minimal-first", "completed")

        assert await stop(serve, signal.SIGTERM) == 0
        assert await stop(worker, signal.SIGINT) == 0  # ^C: it hands its shards back and ends
    finally:
        for process in (serve, worker):
            if process is not None:
                await reap(process)
    assert (user.cwd.parent / "worker.err").read_text() == ""
    logged = (user.cwd.parent / "serve.err").read_text()
    assert "Traceback" not in logged
    # serve's line for the cluster's agent (logged at info without -v, as serve does)
    assert re.search(r"session start' origin='cluster' session_id='smoke-cluster' .*loop='minimal-first'", logged), \
        logged


# -- the bridge, as a page or a client talks to it --------------------------------------------


async def http_get(port: int, path: str) -> tuple[str, bytes]:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        data = b""
        while chunk := await stream.receive_some():
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return head.decode().split("\r\n")[0], body


async def hello(ws, token: str, capabilities: list[str]) -> None:
    data = {"token": token, "role": "goalbar", "protocol": 1, "capabilities": capabilities}
    await ws.send_message(json.dumps({"v": 1, "type": "hello", "data": data}))
    welcome = json.loads(await ws.get_message())
    assert welcome["type"] == "welcome", welcome


async def answer(ws, request_id: str) -> dict:
    while True:  # pushed frames come in between
        reply = json.loads(await ws.get_message())
        if reply.get("re") == request_id:
            return reply


# -- loopdock[mcp] and loopdock[otel] ----------------------------------------------------------

MCP_TURN = """
import sys, trio
from loopdock import Runtime
from loopdock.runtime.models import Reply, ScriptedAdapter, ToolCall

async def main():
    async with Runtime.open("home") as rt:
        rt.register_adapter("scripted", ScriptedAdapter([Reply(tool_calls=[ToolCall("t__echo", {"text": "hi"})]), "done"]))
        server = {"name": "t", "command": [sys.executable, "mcp_server.py", "stdio"]}
        handle = await rt.create_agent(session_id="m", agent_options={"provider": "scripted", "model": "s", "mcp_servers": [server]})
        handle.agent.followup("go")
        await handle.agent.wait_idle()
        for event in await handle.agent.session.read_events():
            if event.type == "tool/result":
                print(event.data["content"][0]["content"])
        await handle.dispose()

trio.run(main)
"""


async def test_an_agent_calls_an_mcp_server_s_tool_from_the_mcp_extra(mcp_venv, user):
    shutil.copyfile(ROOT / "tests" / "mcp_server.py", user.cwd / "mcp_server.py")
    done = await user.run(mcp_venv.python("-c", MCP_TURN), timeout=120)
    assert (done.code, done.out) == (0, "echo: hi\n"), done.err


async def test_the_readme_s_tracing_example_runs_from_the_otel_extra(otel_venv, user):
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## Tracing", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    done = await user.run(otel_venv.python("-c", block), timeout=120)
    assert (done.code, done.out.splitlines()) == (0, ["chat ping-1 chat", "invoke_agent traced invoke_agent"]), done.err
