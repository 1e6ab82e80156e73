"""``loopdock serve --cluster``: the cluster's agents on the console, and a serve whose
dock differs from the workers' refused; against a real redis-server and real workers."""

from __future__ import annotations

import functools
import json
import math
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio
from line_reader import Lines
from structlog.testing import capture_logs
from trio_websocket import open_websocket

from loopdock import Runtime, open_cluster
from loopdock._serve import serve_command
from loopdock._serve_cluster import ClusterFollower
from loopdock._worker import run_worker
from loopdock.actors import LiveEvent
from loopdock.bridge import Hello
from loopdock.bridge._console import CONSOLE_CAPABILITY, ConsoleHandler

ROOT = Path(__file__).resolve().parents[2]
READY = re.compile(r"^loopdock serve: ws://127\.0\.0\.1:(\d+) \(token in (.+)\)$")
EXTRA_LOOPS = """\
from loopdock import StrategyLoop


def setup(ctx):
    return None


LOOPS = [StrategyLoop(id="extra", setup=setup)]
"""


class _ConsolePage:
    """A console page as the console handler sees one: every row it is sent, in order."""

    role = "goalbar"
    id = "test-page"
    hello = Hello("", "goalbar", 1, (CONSOLE_CAPABILITY,))

    def __init__(self) -> None:
        self._sent, self._rows = trio.open_memory_channel[dict](math.inf)

    def publish_live(self, item: LiveEvent) -> bool:
        self._sent.send_nowait(dict(item.data))
        return True

    async def until(self, predicate) -> dict:
        """The first row sent from now on for which ``predicate`` holds."""
        async for row in self._rows:
            if predicate(row):
                return row
        raise AssertionError("unreachable: the page's channel stays open")


async def _console_rows(ws, agent_id):
    """The console rows of ``agent_id`` in the next frame a console page receives."""
    frame = json.loads(await ws.get_message())
    items = frame["data"].get("items", []) if frame["type"] == "live" else []
    return [i["data"] for i in items if i["type"] == "console/agent" and i["agentId"] == agent_id]


@pytest.fixture
async def worker(redis_server, tmp_path, nursery):
    return await nursery.start(functools.partial(
        run_worker, redis_server.url, home=tmp_path / "w1", shards=4, lease_ttl=2.0, worker_id="w1"))


@pytest.fixture
async def serve_dock(tmp_path):
    """The dock of a serve process with no loop package: the same loops as the workers'."""
    async with Runtime.open(tmp_path / "serve-home") as rt:
        yield rt.dock


async def test_the_console_shows_a_cluster_agent_its_turns_and_its_disposal(redis_server, worker, tmp_path, serve_dock):
    console = ConsoleHandler()
    with trio.fail_after(30):
        async with open_cluster(redis_server.url) as rt:
            follower = ClusterFollower(rt, serve_dock)
            handle = await rt.create_agent(session_id="c1", loop="minimal-first", cwd=str(tmp_path))
            with capture_logs() as logs:
                await follower.look(console)
            # serve's line for it names its loop (it once said loop=None: the log was read after)
            (started,) = [e for e in logs if e["event"] == "session start"]
            assert (started["session_id"], started["loop"], started["driver"]) == ("c1", "minimal-first", "default")
            row = console.rows["c1"]
            assert (row.origin, row.session_id, row.cwd) == ("cluster", "c1", str(tmp_path))
            assert (row.loop, row.turns, row.status) == ("minimal-first", 0, "idle")
            assert follower.cwd_of("c1") == str(tmp_path)

            for text in ("one", "two"):
                handle.agent.followup(text)
                await handle.agent.wait_idle()
            await follower.look(console)
            assert (row.turns, row.last_turn, row.status) == (2, "completed", "idle")

            await handle.dispose()
            await follower.look(console)
            assert "c1" not in console.rows and follower.cwd_of("c1") is None

            # back on resume, with the whole history counted again
            await rt.resume_agent(resume_session_id="c1")
            await follower.look(console)
            assert (console.rows["c1"].turns, console.rows["c1"].loop) == (2, "minimal-first")


async def test_a_turn_open_in_the_log_shows_running_with_the_inbox_and_a_dead_workers_agent_stays(
    redis_server, tmp_path, nursery, serve_dock
):
    from cluster_workers import start_worker, until_event

    console = ConsoleHandler()
    with trio.fail_after(60):
        a = await start_worker(nursery, redis_server.url, tmp_path / "a", "a")
        async with open_cluster(redis_server.url) as rt:
            follower = ClusterFollower(rt, serve_dock)
            handle = await rt.create_agent(session_id="r1", loop="minimal-first")
            handle.agent.followup('call: shell {"command": "sleep 30"}')
            await until_event(handle.agent, lambda e: e.type == "tool/started")
            queued = handle.agent.followup("after the sleep")
            await until_event(handle.agent, lambda e: e.type == "agent/inbox/spliced"
                              and e.data["messageId"] == queued.id)
            await follower.look(console)
            row = console.rows["r1"]
            assert (row.status, row.turns, row.inbox) == ("running", 1, 1)
            a.signal(signal.SIGKILL)  # the session stays live for the shard's next owner
            await a.process.wait()
            await follower.look(console)
            assert (row.status, row.inbox) == ("running", 1)
            b = await start_worker(nursery, redis_server.url, tmp_path / "b", "b")
            [again] = await handle.agent.wait_approvals()  # the turn goes on: its cut call may have run
            await again.answer("refuse", reason="enough")
            await handle.agent.wait_idle()  # the turn completes; the queued message runs once
            await follower.look(console)
            assert (row.status, row.turns, row.last_turn, row.inbox) == ("idle", 2, "completed", 0)
            await b.stop()


async def test_a_serve_whose_dock_differs_from_the_workers_is_refused(redis_server, worker, tmp_path):
    (tmp_path / "extra_loops.py").write_text(EXTRA_LOOPS)
    config = tmp_path / "serve.yml"
    config.write_text("loopPackages: [extra_loops]\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    with trio.fail_after(60):
        done = await trio.run_process(
            [sys.executable, "-P", "-m", "loopdock", "serve", "--no-loopx", "--home", str(tmp_path / "home"),
             "--config", str(config), "--cluster", redis_server.url],
            cwd=tmp_path, env=env, capture_stdout=True, capture_stderr=True, check=False,
        )
    assert done.returncode == 2
    last = done.stderr.decode().strip().splitlines()[-1]
    assert last.startswith("loopdock: REGISTRY_MISMATCH: worker 'w1' has loops and drivers")
    assert "extra" in last and done.stdout == b""


async def test_serve_refuses_configured_agents_with_a_cluster_and_so_does_a_worker(redis_server, tmp_path):
    from loopdock.runtime._errors import InvalidOptionsError
    from loopdock.runtime.cluster import ClusterConfigError

    config = tmp_path / "agents.yml"
    config.write_text("agents:\n  - id: helper\n    model: ping-1\n")
    with pytest.raises(InvalidOptionsError, match="outside the cluster"):
        await serve_command(str(tmp_path / "home"), None, 0, sys.stdout, False, config=config,
                            cluster=redis_server.url)
    with pytest.raises(ClusterConfigError, match="outside its shards"):
        await run_worker(redis_server.url, home=tmp_path / "w", config=config, worker_id="w")
    assert not (tmp_path / "home").exists() and not (tmp_path / "w").exists()


async def test_serve_with_a_cluster_shows_its_agents_to_a_console_page(redis_server, worker, tmp_path):
    env = {**os.environ}
    with trio.fail_after(90):
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-P", "-m", "loopdock", "serve", "--no-loopx", "--port", "0", "--home",
             str(tmp_path / "home"), "--cluster", redis_server.url],
            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
        )
        try:
            out = Lines(proc.stdout)
            match = READY.match(await out.until(r"^loopdock serve: "))
            port, token = int(match[1]), (await trio.Path(match[2]).read_text()).strip()
            assert (await out.until(r"cluster: ")).strip() == f"cluster: {redis_server.url} (1 live worker)"
            async with open_cluster(redis_server.url) as rt:
                handle = await rt.create_agent(session_id="p1", loop="minimal-first")
                handle.agent.followup("hello")
                await handle.agent.wait_idle()
                async with open_websocket("127.0.0.1", port, "/goalbar", use_ssl=False) as ws:
                    hello = {"token": token, "role": "goalbar", "protocol": 1, "capabilities": ["live", "console"]}
                    await ws.send_message(json.dumps({"v": 1, "type": "hello", "data": hello}))
                    assert json.loads(await ws.get_message())["type"] == "welcome"
                    while True:  # rows come as the follower sees the cluster (every second)
                        rows = await _console_rows(ws, "p1")
                        if rows and rows[-1]["turns"] == 1:
                            break
                    assert (rows[-1]["origin"], rows[-1]["loop"], rows[-1]["lastTurn"]) == (
                        "cluster", "minimal-first", "completed")
                    await handle.dispose()
                    while not any(r.get("gone") for r in rows):
                        rows = await _console_rows(ws, "p1")
            proc.send_signal(signal.SIGTERM)
            assert await proc.wait() == 0
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


async def test_the_follower_outlives_failed_looks_and_a_redis_restart(
    redis_server, worker, nursery, monkeypatch, serve_dock
):
    console = ConsoleHandler()
    page = _ConsolePage()
    console.connected(page)
    with trio.fail_after(60):
        async with open_cluster(redis_server.url) as rt:
            handle = await rt.create_agent(session_id="g1", loop="minimal-first")
            real = rt.live_sessions
            failures = [ConnectionError("injected"), RuntimeError("injected")]

            async def failing_then_real():
                if failures:
                    raise failures.pop(0)
                return await real()

            monkeypatch.setattr(rt, "live_sessions", failing_then_real)
            follower = ClusterFollower(rt, serve_dock, period=0.02)
            nursery.start_soon(follower.run, console)
            await page.until(lambda row: row["id"] == "g1")  # after the failed looks
            assert not failures
            await trio.to_thread.run_sync(redis_server.restart)
            handle.agent.followup("after the restart")
            await handle.agent.wait_idle()
            await page.until(lambda row: row["id"] == "g1" and row["turns"] == 1 and row["lastTurn"] == "completed")
            assert (console.rows["g1"].turns, console.rows["g1"].last_turn) == (1, "completed")


async def test_a_worker_that_joins_later_with_other_loops_is_reported_until_it_leaves(
    redis_server, tmp_path, nursery, serve_dock
):
    import structlog

    console = ConsoleHandler()
    with trio.fail_after(60):
        async with open_cluster(redis_server.url) as rt:
            follower = ClusterFollower(rt, serve_dock)
            same, same_ended = trio.CancelScope(), trio.Event()

            async def run(scope, ended, *, task_status=trio.TASK_STATUS_IGNORED, **kwargs):
                try:
                    with scope:
                        await run_worker(redis_server.url, lease_ttl=2.0, task_status=task_status, **kwargs)
                finally:
                    ended.set()

            await nursery.start(functools.partial(run, same, same_ended, home=tmp_path / "same", worker_id="same"))
            with structlog.testing.capture_logs() as logs:
                await follower.look(console)
            assert follower.mismatched == {} and not [e for e in logs if e["log_level"] == "error"]
            same.cancel()  # the cluster's workers all stop: nothing refuses the next one
            await same_ended.wait()
            assert "same" not in await rt.workers()  # it left as it stopped

            other, other_ended = trio.CancelScope(), trio.Event()
            await nursery.start(functools.partial(
                run, other, other_ended, home=tmp_path / "other", worker_id="other",
                config={"loopPackages": ["gated_loops"]}))
            with structlog.testing.capture_logs() as logs:
                await follower.look(console)
                await follower.look(console)  # reported once, not at every look
            assert list(follower.mismatched) == ["other"] and "gated" in follower.mismatched["other"]
            [error] = [e for e in logs if e["log_level"] == "error"]
            assert (error["code"], error["worker"]) == ("REGISTRY_MISMATCH", "other")

            other.cancel()
            await other_ended.wait()
            assert "other" not in await rt.workers()
            await follower.look(console)
            assert follower.mismatched == {}
