"""An embedded runtime leaves its host process alone; serve owns its process and hardens it.

A harness that embeds loopdock (``Runtime.open()``) keeps its environment block, its
collector settings and its signal handlers exactly as they were, while agents run and
after the runtime closes. ``loopdock serve`` (and ``loopdock worker``, in
tests/cluster/test_cluster_api.py) hides its initial environment from the programs its
agents run."""

from __future__ import annotations

import functools
import gc
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio
from line_reader import Lines

from loopdock import Runtime

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")

SECRET = "sk-host-secret-0123456789"


def _process_state() -> dict[str, object]:
    return {
        "os.environ": dict(os.environ),
        "/proc/self/environ": Path("/proc/self/environ").read_bytes(),
        "gc threshold": gc.get_threshold(),
        "gc frozen": gc.get_freeze_count(),
        "gc callbacks": list(gc.callbacks),
        "gc enabled": gc.isenabled(),
        "signals": {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD)},
    }


async def test_an_embedded_runtime_changes_nothing_process_wide(tmp_path):
    before = _process_state()
    with trio.fail_after(60):
        async with Runtime.open(tmp_path / "home") as rt:
            assert rt.gc_governor is None
            handles = [await rt.create_agent(session_id=f"a{i}") for i in range(20)]
            for round_ in range(3):
                for handle in handles:
                    handle.agent.followup(f"turn {round_}")
                for handle in handles:
                    await handle.agent.wait_idle()
            for handle in handles[:10]:
                await handle.dispose()
            during = _process_state()
    after = _process_state()
    assert during == before
    assert after == before


async def test_serve_hides_its_environment_from_what_its_agents_run(tmp_path):
    env = {**os.environ, "DEEPSEEK_API_KEY": SECRET, "HOME": str(tmp_path)}
    argv = [sys.executable, "-P", "-m", "loopdock", "serve", "--port", "0", "--no-loopx", "--home", str(tmp_path / "h")]
    async with trio.open_nursery() as nursery:
        serve = await nursery.start(functools.partial(
            trio.run_process, argv, env=env, cwd=tmp_path, stdout=subprocess.PIPE, check=False))
        # Printed once the runtime is open, its block hidden.
        await Lines(serve.stdout, deadline=60).until(r"^loopdock serve: ws://")
        shown = await trio.Path(f"/proc/{serve.pid}/environ").read_bytes()
        serve.send_signal(signal.SIGINT)
        with trio.fail_after(60):
            assert await serve.wait() == 0
    assert SECRET.encode() not in shown
    assert b"PATH=" in shown  # what every child gets anyway stays
