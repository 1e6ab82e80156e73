"""Test rules (as in trio-websocket): loopback only, port 0, ``autojump_clock`` for any
sleep, an absolute ``trio.fail_after`` on every I/O test, temporary homes everywhere."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

# Tests that start real external components: the LoopX CLI (Node 22), a DSH host, Chromium.
# ``scripts/test -m "not e2e"`` runs everything else, quickly.
_E2E_FIXTURES = frozenset({"node22_bin", "loopx_env", "loopx_command"})
_E2E_MODULES = frozenset({"test_goalbar_browser.py", "test_serve_cli.py"})


def pytest_collection_modifyitems(config, items):
    for item in items:
        module = item.path.name
        if module.endswith("_e2e.py") or module in _E2E_MODULES or _E2E_FIXTURES & set(item.fixturenames):
            item.add_marker(pytest.mark.e2e)



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



def assert_no_leaked_agent_tasks(runtime):
    """Every live agent owns exactly one task in the supervisor's nursery, and so does
    every configured agent still waiting to start; the store writer, the skill catalog's
    watcher and the admission gate's stall watcher own the other three. Anything more is a
    task that outlived its owner."""
    expected = 3 + len(runtime.list_agents()) + len(runtime.dock.starting)
    tasks = runtime.supervisor.nursery.child_tasks
    assert len(tasks) == expected, [t.name for t in tasks]


@pytest.fixture
def no_leaks():
    """The leak check, for tests that dispose agents mid-test."""
    return assert_no_leaked_agent_tasks


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
