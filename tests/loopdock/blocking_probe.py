"""The public API under a watch for blocking calls on trio's thread (run by
tests/loopdock/test_no_blocking_io.py as ``python -P blocking_probe.py WORKDIR``; prints
one JSON report).

Two watches, both only while a trio task step runs on the loop thread:

- what blocks, by kind: a file opened or listed, a directory made, a process started
  (audit events ``BLOCKING_EVENTS``) or an SQL statement run on the session store's
  connection, from a task step: each is reported with its stack, whatever it took;
- what blocks, by time: a step's wall time minus its CPU time minus the time the thread
  waited runnable for a CPU (``/proc/thread-self/schedstat``) is time spent asleep in
  the kernel. Steps asleep longer than ``LIMIT`` are reported with that time. It cannot
  tell a blocking read from waiting for the GIL while the store's writer thread holds it
  (and is itself preempted, on a loaded machine), so the test asserts the kinds and uses
  the time only to check that the watch sees a real sleep.
"""

from __future__ import annotations

import gc
import json
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import trio

from loopdock import Runtime

LIMIT = 0.001  # seconds asleep in one task step
BLOCKING_EVENTS = frozenset({
    "open", "os.listdir", "os.scandir", "os.mkdir", "os.rmdir", "os.remove", "os.rename", "os.chmod",
    "os.truncate", "sqlite3.connect", "subprocess.Popen", "os.system",
})


def _schedstat_wait() -> int:
    with open("/proc/thread-self/schedstat", "rb") as f:  # read outside the watched window
        return int(f.read().split()[1])


class Watch(trio.abc.Instrument):
    def __init__(self) -> None:
        self.thread = threading.get_ident()
        self.in_step = False
        self.steps = 0
        self.blocked: list[dict[str, Any]] = []
        self.calls: list[dict[str, Any]] = []
        self._start = (0, 0, 0)

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self._start = (time.perf_counter_ns(), time.thread_time_ns(), _schedstat_wait())
        self.in_step = True

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        self.in_step = False
        wall0, cpu0, wait0 = self._start
        wall, cpu, wait = time.perf_counter_ns() - wall0, time.thread_time_ns() - cpu0, _schedstat_wait() - wait0
        self.steps += 1
        asleep = wall - cpu - wait
        if asleep > LIMIT * 1e9:
            self.blocked.append({"task": task.name, "asleep_ms": asleep / 1e6, "wall_ms": wall / 1e6})

    def watching(self) -> bool:
        return self.in_step and threading.get_ident() == self.thread

    def call(self, what: str) -> None:
        if self.watching():
            self.in_step = False  # formatting the stack opens source files itself
            try:
                self.calls.append({"call": what[:200], "stack": traceback.format_stack(limit=12)[:-2]})
            finally:
                self.in_step = True


async def scenario(work: Path, watch: Watch) -> dict[str, Any]:
    home = work / "home"
    read_call = 'call: read_file {"path": "notes.txt"}'
    seen: dict[str, Any] = {}
    # warm_history_bytes=0: every idle agent's history is evicted, so reads go to the store.
    async with Runtime.open(home, config=work / "agents.yml", warm_history_bytes=0) as rt:
        store = rt.supervisor.store
        store._conn.set_trace_callback(lambda sql: watch.call(f"sql: {sql}"))
        handles = [
            await rt.create_agent(session_id=f"a{i}", agent_options={"cwd": str(work)}) for i in range(8)
        ]
        for round_ in range(3):
            for handle in handles:
                handle.agent.followup(read_call if round_ == 1 else f"turn {round_}")
            for handle in handles:
                await handle.agent.wait_idle()
        agent = handles[0].agent
        await agent.session.flush()
        seen["events"] = len(await agent.session.read_events())
        seen["transcript"] = len(await agent.read_transcript())
        seen["bindings"] = len(await agent.session.read_history(["agent-preset/selected"]))
        seen["sessions"] = len(await rt.list_sessions())
        await rt.fork_session("a1", "fork-1")
        for handle in handles[4:]:
            await handle.dispose()
    async with Runtime.open(home, warm_history_bytes=0) as rt:
        rt.supervisor.store._conn.set_trace_callback(lambda sql: watch.call(f"sql: {sql}"))
        resumed = await rt.resume_agent(resume_session_id="a0")
        fork = await rt.resume_agent(resume_session_id="fork-1")
        seen["resumed_transcript"] = len(await resumed.agent.read_transcript())
        for handle in (resumed, fork):
            handle.agent.followup("after the restart")
        for handle in (resumed, fork):
            await handle.agent.wait_idle()
        seen["resumed_events"] = len(await resumed.agent.session.read_events())
    # The watch itself: a step that sleeps 5 ms in the kernel is seen asleep that long.
    async def sleeps_for_real() -> None:
        time.sleep(0.005)  # noqa: ASYNC251  (the point: a blocking call)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(sleeps_for_real, name="sleeps for real")
    return seen


def main(work: Path) -> None:
    (work / "notes.txt").write_text("some notes\n")
    (work / "agents.yml").write_text("agents: []\n")
    watch = Watch()
    def audit(event: str, args: tuple[Any, ...]) -> None:
        if event in BLOCKING_EVENTS:
            watch.call(f"{event}: {args[0] if args else ''}")

    sys.addaudithook(audit)
    gc.disable()  # a collection in the writer thread would hold the GIL the loop waits for
    seen = trio.run(scenario, work, watch, instruments=[watch])
    print(json.dumps({"steps": watch.steps, "blocked": watch.blocked, "calls": watch.calls, "seen": seen}))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
