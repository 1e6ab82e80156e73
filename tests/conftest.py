"""Test rules (as in trio-websocket): loopback only, port 0, ``autojump_clock`` for any
sleep, an absolute ``trio.fail_after`` on every I/O test, temporary homes everywhere."""

import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, settings
from leak_check import assert_no_leaked_agent_tasks

# Property tests: few examples by default, so that the suite stays quick (hypothesis keeps
# every failure it finds in .hypothesis/ and tries it first next time); many for a
# deliberate search: HYPOTHESIS_PROFILE=thorough scripts/test -m "not e2e" -k ...
# No deadline and no too-slow check in either: both measure this machine, not the code.
_MACHINE_INDEPENDENT = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow], "print_blob": True}
settings.register_profile("quick", max_examples=30, **_MACHINE_INDEPENDENT)
settings.register_profile("thorough", max_examples=1000, **_MACHINE_INDEPENDENT)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "quick"))

# Tests that start real external components, and only those, are e2e: the LoopX CLI (it
# runs on Node 22: every test using these fixtures), a DSH host (the *_e2e.py modules, and
# tests marked e2e by hand elsewhere), Chromium (the browser test), the package index (the
# fresh venvs of test_installed_commands.py). Stand-ins, loopback servers and our own
# subprocesses are not. ``scripts/test -m "not e2e"`` runs the rest.
_E2E_FIXTURES = frozenset({"node22_bin", "loopx_env", "loopx_command"})
_E2E_MODULES = frozenset({"test_goalbar_browser.py", "test_console_browser.py", "test_serve_cli.py",
                          "test_installed_commands.py"})


def pytest_collection_modifyitems(config, items):
    for item in items:
        module = item.path.name
        if module.endswith("_e2e.py") or module in _E2E_MODULES or _E2E_FIXTURES & set(item.fixturenames):
            item.add_marker(pytest.mark.e2e)


ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def wheel_file(tmp_path_factory) -> Path:
    """The loopdock wheel the suite tests: ``$LOOPDOCK_TEST_WHEEL`` (scripts/test builds it
    and installs it into the test venv), else one built here from a clean copy of the tree
    (setuptools reuses a build/ folder, whose stale files would be shipped)."""
    built = os.environ.get("LOOPDOCK_TEST_WHEEL")
    if built:
        return Path(built)
    source, out = tmp_path_factory.mktemp("source") / "loopdock", tmp_path_factory.mktemp("wheel")
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".*", "build", "*.egg-info", "__pycache__", "tests", "examples", "docs", "results"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--wheel-dir", str(out), str(source)], check=True, timeout=300)
    (path,) = out.glob("loopdock-*.whl")
    return path


@pytest.fixture(autouse=True)
def _isolated_env(tmp_path_factory, monkeypatch):
    # No test may leave this machine or write into a real home.
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("LOOPDOCK_HOME", str(home / ".loopdock"))
    monkeypatch.setenv("LOOPX_USAGE_PING", "0")
    monkeypatch.setenv("DSH_TELEMETRY_MODE", "DISABLED")
    monkeypatch.setenv("DSH_HOME", str(home / ".dsh"))
    monkeypatch.delenv("DEEPSEEK_API_KEY", raising=False)
    monkeypatch.setenv("SE_AVOID_STATS", "true")  # selenium: no usage statistics
    yield


@pytest.fixture
async def rt(tmp_path):
    """A runtime on a temporary home; closed (and checked for leftovers) after the test."""
    from loopdock import Runtime

    async with Runtime.open(tmp_path / "home") as runtime:
        yield runtime
        assert_no_leaked_agent_tasks(runtime)


@pytest.fixture
def autojump_clock(monkeypatch):
    """pytest-trio's ``autojump_clock``, except that the clock stands still while a worker
    thread started through ``trio.to_thread.run_sync`` runs (the store's reads and
    commits, file tools). trio's autojump jumps as soon as every *task* is blocked, and a
    task waiting for a thread is blocked: virtual minutes would pass during a few real
    milliseconds of SQLite, firing whatever deadline comes next (a test's ``fail_after``,
    a scheduler wait) before the thread is done, more often the busier the machine. Here
    time passes only when everything, threads included, waits for it.

    A thread that never ends (a hung mount) therefore stops the clock: tests of such
    threads use real time (``rt``), not this clock."""
    clock = trio.testing.MockClock(autojump_threshold=0)
    run_sync = trio.to_thread.run_sync
    running = 0

    async def counted(*args, **kwargs):
        nonlocal running
        running += 1
        clock.autojump_threshold = math.inf
        try:
            return await run_sync(*args, **kwargs)
        finally:
            running -= 1
            if not running:
                clock.autojump_threshold = 0

    monkeypatch.setattr(trio.to_thread, "run_sync", counted)
    return clock


@pytest.fixture
def no_leaks():
    """The leak check, for tests that dispose agents mid-test."""
    return assert_no_leaked_agent_tasks


@pytest.fixture
def loopdock_cli(tmp_path, monkeypatch, capsys):
    """``loopdock ARGV`` in this process (no interpreter start), in ``tmp_path``: returns
    (exit code, stdout, stderr). ``.example(path)`` runs an example script as
    ``__main__`` (it raises if the script fails): (stdout, stderr). Both set up structlog
    for the whole process, as a command does; that is undone afterwards. Only from a
    synchronous test: a command runs its own ``trio.run``."""
    import runpy

    import structlog

    from loopdock._cli import main

    configured, saved = structlog.is_configured(), structlog.get_config()
    monkeypatch.chdir(tmp_path)

    def cli(*argv):
        code = main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    def example(path):
        runpy.run_path(str(path), run_name="__main__")
        return capsys.readouterr()

    cli.example = example
    yield cli
    if configured:
        structlog.configure(**saved)
    else:
        structlog.reset_defaults()


# -- The real LoopX CLI -------------------------------------------------------------------
# loopx 2.1.1 (from the test extra) runs a TypeScript runtime that needs Node >= 22.22.3;
# scripts/test installs it from the npm registry and exports LOOPDOCK_NODE22_BIN. These
# tests are never skipped: CI must run them.

_MIN_NODE = (22, 22, 3)


@pytest.fixture(scope="session")
def node22_bin() -> Path:
    """The directory holding Node 22 (``$LOOPDOCK_NODE22_BIN``), checked once per session."""
    raw = os.environ.get("LOOPDOCK_NODE22_BIN")
    if not raw:
        pytest.fail(
            "LOOPDOCK_NODE22_BIN is not set: run the tests through scripts/test, which "
            "installs Node 22 into .cache/node22 and exports it",
            pytrace=False,
        )
    bin_dir = Path(raw).resolve()
    try:
        out = subprocess.run(
            [str(bin_dir / "node"), "--version"], capture_output=True, text=True, timeout=30
        ).stdout.strip()
    except OSError as exc:
        pytest.fail(f"LOOPDOCK_NODE22_BIN={raw}: cannot run node ({exc}); rerun scripts/test", pytrace=False)
    try:
        version = tuple(int(part) for part in out.lstrip("v").split("."))
    except ValueError:
        version = ()
    if not version or version[0] != 22 or version < _MIN_NODE:
        pytest.fail(
            f"LOOPDOCK_NODE22_BIN={raw}: node --version says {out!r}, LoopX needs "
            "22.x >= 22.22.3; rerun scripts/test",
            pytrace=False,
        )
    return bin_dir


@pytest.fixture
def loopx_env(node22_bin, tmp_path_factory) -> dict[str, str]:
    """The environment for one test's loopx calls: Node 22 first on PATH, then this
    interpreter's bin directory (where the ``loopx`` script lives), a fresh HOME, and no
    usage ping."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join(
        [str(node22_bin), str(Path(sys.executable).parent), env.get("PATH", "")]
    )
    env["HOME"] = str(tmp_path_factory.mktemp("loopx-home"))
    env["LOOPX_USAGE_PING"] = "0"
    return env


@pytest.fixture
def loopx_standin_env(tmp_path_factory) -> dict[str, str]:
    """What loopx_env gives a loopx call (a fresh HOME, no usage ping), without Node 22 or
    the real loopx on PATH: for tests whose loopx (and python) are stand-ins only, which
    are therefore not e2e."""
    env = dict(os.environ)
    env["HOME"] = str(tmp_path_factory.mktemp("loopx-home"))
    env["LOOPX_USAGE_PING"] = "0"
    return env


@pytest.fixture
def loopx_command() -> list[str]:
    """The argv prefix that runs the installed loopx CLI."""
    script = Path(sys.executable).parent / "loopx"
    if not script.exists():
        pytest.fail(f"no loopx script next to {sys.executable}: rerun scripts/test", pytrace=False)
    return [str(script)]


@pytest.fixture
def loopx_project(tmp_path_factory) -> Path:
    """An empty project directory: the cwd of every loopx call in one test."""
    return tmp_path_factory.mktemp("loopx-project")


@pytest.fixture
def loopx_runtime_root(tmp_path_factory) -> Path:
    """A temporary LoopX runtime root (``--runtime-root``), outside the project."""
    return tmp_path_factory.mktemp("loopx-runtime") / "root"
