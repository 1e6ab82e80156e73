"""Test rules (as in trio-websocket): loopback only, port 0, ``autojump_clock`` for any
sleep, an absolute ``trio.fail_after`` on every I/O test, temporary homes everywhere."""

import os

import pytest


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
    yield


@pytest.fixture
async def rt(tmp_path):
    """A runtime on a temporary home; closed (and checked for leftovers) after the test."""
    from runtime import Runtime

    async with Runtime.open(tmp_path / "home") as runtime:
        yield runtime
        assert_no_leaked_agent_tasks(runtime)



def assert_no_leaked_agent_tasks(runtime):
    """Every live agent owns exactly one task in the supervisor's nursery; the store
    writer owns the other one. Anything more is a task that outlived its owner."""
    expected = 1 + len(runtime.list_agents())
    tasks = runtime.supervisor.nursery.child_tasks
    assert len(tasks) == expected, [t.name for t in tasks]


@pytest.fixture
def no_leaks():
    """The leak check, for tests that dispose agents mid-test."""
    return assert_no_leaked_agent_tasks
