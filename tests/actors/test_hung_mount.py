"""Tool calls stuck on a filesystem that does not answer (an NFS mount gone away): they
hold threads of the tools' own pool, never the event loop or the threads the store
commits in; a cancel ends a stuck read at once, and waits for a stuck write."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
import trio
import trio.testing

READ = 'call: read_file {"path": "a.txt"}'


class HungMount:
    """Fault injection: resolving a path under ``root`` blocks until ``release()``, as
    a stat on a mount that does not answer would. A call from the event loop's own
    thread does not block (it would stop the test itself) but is recorded."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, root: Path) -> None:
        self.root = str(root)
        self.released = threading.Event()
        self.inside = 0  # threads in a hung call now
        self.changed = trio.Event()
        self.from_event_loop: list[str] = []
        self.loop_thread = threading.get_ident()
        realpath = os.path.realpath

        def hung_realpath(path, *args, **kwargs):
            if str(path).startswith(self.root):
                if threading.get_ident() == self.loop_thread:
                    self.from_event_loop.append(str(path))
                else:
                    trio.from_thread.run_sync(self._enter)
                    self.released.wait(timeout=60)
            return realpath(path, *args, **kwargs)

        monkeypatch.setattr(os.path, "realpath", hung_realpath)

    def _enter(self) -> None:
        self.inside += 1
        self.changed.set()
        self.changed = trio.Event()

    async def wait_inside(self, n: int) -> None:
        while self.inside < n:
            await self.changed.wait()

    def release(self) -> None:
        self.released.set()


@pytest.fixture
def mount(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    root = tmp_path / "mount"
    root.mkdir()
    (root / "a.txt").write_text("from the mount")
    hung = HungMount(monkeypatch, root)
    yield root, hung
    hung.release()  # whatever the test did: no thread stays blocked past it
    assert hung.from_event_loop == []


async def tool_results(agent) -> list[dict]:
    return [e.data for e in (await agent.session.read_events()) if e.type == "tool/result"]


async def test_calls_hung_on_a_mount_leave_every_other_agent_durable(rt, tmp_path, mount):
    root, hung = mount
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # As many stuck calls as trio's default pool has threads: the store commits in that
    # pool, so with the tools in it too no event of any agent could be written.
    n = trio.to_thread.current_default_thread_limiter().total_tokens
    with trio.fail_after(30):
        stuck = [(await rt.create_agent(session_id=f"stuck-{i}", agent_options={"cwd": str(root)})).agent
                 for i in range(n)]
        for agent in stuck:
            agent.followup(READ)
        await hung.wait_inside(n)

        other = (await rt.create_agent(session_id="other", agent_options={"cwd": str(elsewhere)})).agent
        other.followup("hello")
        await other.wait_idle()
        await other.session.flush()
        assert other.session.committed_count == other.session.event_count
        assert all(agent.status == "running" for agent in stuck)

        hung.release()
        for agent in stuck:
            await agent.wait_idle()
    assert all([(await tool_results(a))[-1]["content"][0]["content"] == "from the mount" for a in stuck])


async def test_cancel_ends_a_read_stuck_on_a_mount_without_waiting_for_it(rt, mount):
    root, hung = mount
    agent = (await rt.create_agent(session_id="reader", agent_options={"cwd": str(root)})).agent
    with trio.fail_after(30):
        agent.followup(READ)
        await hung.wait_inside(1)
        agent.cancel("the mount does not answer")
        await agent.wait_idle()  # the thread is still blocked: abandoned, not waited for
    assert not hung.released.is_set()
    [result] = await tool_results(agent)
    assert result["content"][0] == {"type": "tool-result", "callId": result["source"]["callId"],
                                    "content": "cancelled", "isError": True}
    # The agent goes on; the abandoned thread's late answer goes nowhere.
    with trio.fail_after(30):
        agent.followup("still there?")
        await agent.wait_idle()
    assert agent.transcript[-1].role == "assistant"
    assert len(await tool_results(agent)) == 1


async def test_cancel_waits_for_a_write_stuck_on_a_mount_and_reports_what_it_did(rt, mount):
    root, hung = mount
    agent = (await rt.create_agent(session_id="writer", agent_options={"cwd": str(root)})).agent
    with trio.fail_after(30):
        agent.followup('call: write_file {"path": "b.txt", "content": "written"}')
        await hung.wait_inside(1)
        agent.cancel("the mount does not answer")
        await trio.testing.wait_all_tasks_blocked()
        # A write reported as cancelled must not land afterwards: the turn waits for it.
        assert agent.status == "running"
        assert not (root / "b.txt").exists()
        hung.release()
        await agent.wait_idle()
    assert (root / "b.txt").read_text() == "written"
    assert (await tool_results(agent))[-1]["content"][0]["content"] == "wrote 7 bytes to b.txt"
    ends = [e.data for e in (await agent.session.read_events()) if e.type == "turn/end"]
    assert ends[-1]["reason"]["kind"] == "aborted"
