"""A real DSH host in dock mode, against a real runtime over the bridge (issue 5, test 1).

`dsh headless` (deepseek-harness-runtime-bin, installed by scripts/test next to the Python
that runs the tests) loads bridge/dsh_plugin through the patch `loopdock dsh-patch` writes.
The plugin creates two agents whose loops the runtime's dock selects differently; DSH's own
session logs must show each binding once. A second DSH run resumes both: the one the runtime
still routes to its loop resumes (its binding is not recorded again); the one it now routes
to another loop gets LOOP_SWITCH from the dock, and DSH refuses that resume.

A third test restarts the runtime: the session created through runtime A resumes
through a fresh runtime B (an empty handler, no route for it) on the binding DSH's log
holds, which the plugin reads and sends with ``select``; asking B for another loop is
LOOP_SWITCH.

Offline and quiet: DSH_HOME and HOME in a temporary directory, telemetry disabled, the
plugin's `ping` model, loopback only. `dsh headless` exits once its own agent is idle, so
its task says HOLD: the ping model holds that call until the runtime sends a wake.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import attrs
import pytest
import trio

from loopdock import LoopdockError
from loopdock._runtime import Runtime
from loopdock.actors import LiveEvent
from loopdock.actors.dock import Route, StrategyLoop
from loopdock.bridge import DockSelectHandler, Wake, serve_bridge
from loopdock.bridge._dsh_binding import BINDING_RECORD
from loopdock.bridge._dsh_files import dsh_process, quiet_env, session_log
from loopdock.bridge._messages import StoredBinding
from loopdock.bridge._patch import write_patch

DSH = Path(sys.executable).parent / "dsh"
TOKEN = "e2e-token-" + "x" * 20


class RecordingHandler(DockSelectHandler):
    """The dock's answers, plus a record of what the host sent."""

    def __init__(self, rt: Runtime) -> None:
        super().__init__(rt.dock)
        self.conns: list = []
        self.live: list[LiveEvent] = []
        self.events: list = []
        self.selects: list = []  # (request, Selection or error code)
        self._changed = trio.Event()

    def _poke(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def connected(self, conn) -> None:
        self.conns.append(conn)
        self._poke()

    async def on_events(self, conn, items) -> None:
        self.events.extend(items)
        self._poke()

    async def on_live(self, conn, items) -> None:
        self.live.extend(items)
        self._poke()

    async def on_select(self, conn, request):
        try:
            selection = await super().on_select(conn, request)
        except LoopdockError as exc:
            self.selects.append((request, exc.code))
            self._poke()
            raise
        self.selects.append((request, selection))
        self._poke()
        return selection

    async def wait_for(self, predicate, what: str, proc) -> None:
        while not predicate():
            if proc.returncode is not None:
                pytest.fail(f"dsh exited ({proc.returncode}) before {what}")
            changed = self._changed
            with trio.move_on_after(0.5):
                await changed.wait()


class Placeholder:
    """The runtime's stand-in for DSH's driver ``alt``: the runtime only decides, DSH runs."""

    async def create_agent(self, owner, options):
        raise AssertionError("the runtime never runs a DSH agent itself")

    resume = create_agent


async def _noop_setup(ctx) -> None:
    pass


def _dsh_env(tmp: Path) -> dict[str, str]:
    return quiet_env(tmp / "dsh-home", tmp / "home")


def _bindings(log: list[dict]) -> list[dict]:
    """The bindings recorded in a DSH log (plugin records: see bridge/_dsh_binding.py)."""
    return [e["data"] for e in log if e.get("type") == BINDING_RECORD and e.get("ignorable") is True]


async def _run_dsh(
    tmp: Path, handler: RecordingHandler, patch: Path, task: str, ready, out_name: str,
    agents: tuple[str, ...] = ("s-a", "s-b"),
):
    """Run `dsh headless`; once ``ready()`` holds, wake its headless agent (the one not in
    ``agents``, releasing the ping hold) and return its exit status and stderr."""
    seen_before = {item.agent_id for item in handler.live if item.type == "agent/created"}
    work = tmp / "work"
    work.mkdir(exist_ok=True)
    async with dsh_process(DSH, ["headless", "--patch", str(patch), task], cwd=work, env=_dsh_env(tmp),
                           output=tmp / f"{out_name}.err") as proc:
        def headless_agent():
            for item in handler.live:
                if (
                    item.type == "agent/created"
                    and item.agent_id not in seen_before
                    and item.agent_id not in agents
                ):
                    return item.agent_id
            return None

        await handler.wait_for(lambda: headless_agent() is not None and ready(), "it was ready", proc)
        ack = await handler.conns[-1].request(Wake(headless_agent()))
        assert ack.ok, ack
        with trio.fail_after(60):
            code = await proc.wait()
    return code, (tmp / f"{out_name}.err").read_text(errors="replace")


async def test_two_dsh_agents_land_on_two_loops_and_a_loop_switch_on_resume_is_refused(tmp_path):
    if not DSH.exists():
        pytest.fail(f"no dsh next to {sys.executable}: scripts/test installs deepseek-harness-runtime-bin")
    config = {
        "sessionLoops": {"s-a": "standard", "s-b": {"loop": "loopx-alt", "driver": "alt"}},
    }
    with trio.fail_after(120):
        async with Runtime.open(tmp_path / "runtime", config=config) as rt:
            rt.dock.register(StrategyLoop(id="loopx-alt", setup=_noop_setup, driver="alt"))
            rt.register_driver("alt", Placeholder())
            handler = RecordingHandler(rt)
            async with trio.open_nursery() as nursery:
                port = await nursery.start(functools.partial(serve_bridge, handler, token=TOKEN))
                url = f"ws://127.0.0.1:{port}"
                dsh_home = tmp_path / "dsh-home"

                # 1. two agents created through the bridge, on two loops and two drivers
                patch = write_patch(
                    tmp_path / "p1", url, TOKEN, dock=True, drivers=("default", "alt"), ping=True,
                    extra={"createAgents": [{"sessionId": "s-a"}, {"sessionId": "s-b"}]},
                )

                def both_created():
                    ids = {i.agent_id for i in handler.live if i.type == "agent/created"}
                    return {"s-a", "s-b"} <= ids

                code, err = await _run_dsh(tmp_path, handler, patch, "HOLD first run", both_created, "run1")
                assert code == 0, err
                answered = {r.session_id: s for r, s in handler.selects if r.op == "create"}
                assert (answered["s-a"].loop, answered["s-a"].driver) == ("standard", "default")
                assert (answered["s-b"].loop, answered["s-b"].driver) == ("loopx-alt", "alt")
                assert _bindings(session_log(dsh_home, "s-a")) == [{"loop": "standard", "driver": "default"}]
                assert _bindings(session_log(dsh_home, "s-b")) == [{"loop": "loopx-alt", "driver": "alt"}]
                # the binding reached the runtime too (backfilled: it was logged before publication)
                streamed = [
                    e.event.data for e in handler.events
                    if e.session_id == "s-b" and e.event.type == BINDING_RECORD
                ]
                assert [e.event.seq for e in handler.events if e.session_id == "s-b"][:4] == [0, 1, 2, 3]
                assert streamed == [{"loop": "loopx-alt", "driver": "alt"}]

                # 2. resuming s-b while the runtime now routes it to another loop: LOOP_SWITCH
                rt.dock.config = attrs.evolve(
                    rt.dock.config, session_loops={"s-a": Route("standard"), "s-b": Route("standard")}
                )
                patch = write_patch(
                    tmp_path / "p2", url, TOKEN, dock=True, drivers=("default", "alt"), ping=True,
                    extra={"resumeAgents": [{"sessionId": "s-a"}, {"sessionId": "s-b"}]},
                )
                live_before = len(handler.live)

                def refused():
                    resumed_a = any(
                        i.type == "agent/created" and i.agent_id == "s-a" and i.data.get("source") == "resume"
                        for i in handler.live[live_before:]
                    )
                    return resumed_a and any(r.op == "resume" and r.session_id == "s-b" for r, _ in handler.selects)

                code, err = await _run_dsh(tmp_path, handler, patch, "HOLD second run", refused, "run2")
                assert code == 0, err
                resumes = {r.session_id: s for r, s in handler.selects if r.op == "resume"}
                assert (resumes["s-a"].loop, resumes["s-a"].driver) == ("standard", "default")
                assert resumes["s-b"] == "LOOP_SWITCH"
                # s-a resumed on its own loop: its binding is not recorded a second time
                assert _bindings(session_log(dsh_home, "s-a")) == [{"loop": "standard", "driver": "default"}]
                assert "resume s-b failed" in err and "LOOP_SWITCH" in err, err
                assert not [i for i in handler.live[live_before:] if i.agent_id == "s-b"]
                assert _bindings(session_log(dsh_home, "s-b")) == [{"loop": "loopx-alt", "driver": "alt"}]
                nursery.cancel_scope.cancel()


async def _serve_runtime(rt: Runtime, handler, nursery, tmp: Path, name: str, **patch) -> Path:
    """Serve ``handler`` on a fresh port; the patch (in ``tmp/name``) that reaches it."""
    port = await nursery.start(functools.partial(serve_bridge, handler, token=TOKEN))
    return write_patch(tmp / name, f"ws://127.0.0.1:{port}", TOKEN, dock=True, drivers=("default", "alt"), ping=True, **patch)


def _alt(rt: Runtime) -> None:
    rt.dock.register(StrategyLoop(id="loopx-alt", setup=_noop_setup, driver="alt"))
    rt.register_driver("alt", Placeholder())


async def test_a_binding_in_dshs_log_outlives_the_runtime_that_chose_it(tmp_path):
    if not DSH.exists():
        pytest.fail(f"no dsh next to {sys.executable}: scripts/test installs deepseek-harness-runtime-bin")
    dsh_home = tmp_path / "dsh-home"
    session = "s-d"
    agents = (session,)

    def created(handler, source: str):
        return lambda: any(
            i.type == "agent/created" and i.agent_id == session and i.data.get("source") == source
            for i in handler.live
        )

    with trio.fail_after(180):
        # runtime A routes the preset `reviewer` to loopx-alt on driver alt; DSH creates the
        # session with that preset in its header
        config = {"presetLoops": {"reviewer": {"loop": "loopx-alt", "driver": "alt"}}}
        async with Runtime.open(tmp_path / "runtime-a", config=config) as rt:
            _alt(rt)
            handler = RecordingHandler(rt)
            async with trio.open_nursery() as nursery:
                patch = await _serve_runtime(
                    rt, handler, nursery, tmp_path, "pa",
                    extra={"createAgents": [{"sessionId": session, "agentPreset": "reviewer"}]},
                )
                code, err = await _run_dsh(tmp_path, handler, patch, "HOLD run A", created(handler, "startup"), "runA", agents)
                assert code == 0, err
                nursery.cancel_scope.cancel()
        [(request, selection)] = [(r, s) for r, s in handler.selects if r.session_id == session]
        assert (request.op, request.agent_preset, request.binding) == ("create", "reviewer", None)
        assert (selection.loop, selection.driver) == ("loopx-alt", "alt")
        log = session_log(dsh_home, session)
        assert log[0]["type"] == "session" and log[0].get("agentPreset") == "reviewer"
        # the binding is a plugin record: DSH's preset (in the header) is left alone
        assert not [e for e in log if e.get("type") == "agent-preset/selected"]
        assert _bindings(log) == [{"loop": "loopx-alt", "driver": "alt"}]

        # runtime B: a new home, a new handler (nothing in memory), no route for the session;
        # without the binding from DSH's log it would resume on standard/default
        async with Runtime.open(tmp_path / "runtime-b") as rt:
            _alt(rt)
            assert rt.dock.decide("resume", session).loop == "standard"
            handler = RecordingHandler(rt)
            assert handler.bindings == {}
            async with trio.open_nursery() as nursery:
                patch = await _serve_runtime(rt, handler, nursery, tmp_path, "pb", extra={"resumeAgents": [{"sessionId": session}]})
                code, err = await _run_dsh(tmp_path, handler, patch, "HOLD run B", created(handler, "resume"), "runB", agents)
                assert code == 0, err
                [(request, selection)] = [(r, s) for r, s in handler.selects if r.session_id == session]
                assert (request.op, request.agent_preset) == ("resume", "reviewer")
                assert request.binding == StoredBinding("loopx-alt", "alt")
                assert (selection.loop, selection.driver) == ("loopx-alt", "alt")
                assert handler.bindings[session] == Route("loopx-alt", "alt")
                # resumed on its binding: not recorded a second time
                assert _bindings(session_log(dsh_home, session)) == [{"loop": "loopx-alt", "driver": "alt"}]

                # B now routes the session to another loop: the stored binding refuses it
                handler.bindings.clear()  # the refusal must come from DSH's log, not from memory
                rt.dock.config = attrs.evolve(rt.dock.config, session_loops={session: Route("standard")})
                patch = await _serve_runtime(rt, handler, nursery, tmp_path, "pc", extra={"resumeAgents": [{"sessionId": session}]})
                selects_before = len(handler.selects)
                live_before = len(handler.live)

                def asked_again():
                    return any(r.session_id == session for r, _ in handler.selects[selects_before:])

                code, err = await _run_dsh(tmp_path, handler, patch, "HOLD run C", asked_again, "runC", agents)
                assert code == 0, err
                [(request, refusal)] = [(r, s) for r, s in handler.selects[selects_before:] if r.session_id == session]
                assert request.binding == StoredBinding("loopx-alt", "alt")
                assert refusal == "LOOP_SWITCH"
                assert f"resume {session} failed" in err and "LOOP_SWITCH" in err, err
                assert not [i for i in handler.live[live_before:] if i.agent_id == session]
                nursery.cancel_scope.cancel()
    assert _bindings(session_log(dsh_home, session)) == [{"loop": "loopx-alt", "driver": "alt"}]
