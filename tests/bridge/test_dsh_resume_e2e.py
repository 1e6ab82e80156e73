"""A dock-bound DSH session resumes through DSH's own entry points (real `dsh` 0.2.1rc2).

The runtime's dock picks the loop of a session `dsh headless` creates; the plugin records
that binding in DSH's log as a ``plugin:loopdock/binding`` record. Then the same session
comes back

1. through ``dsh headless --session-id`` (DSH's one-shot runner refuses any session whose
   log holds ``agent-preset/selected`` without a preset: the record is what it accepts),
   the plugin sending the stored binding with its ``select``;
2. through the Python SDK's ``resume_session`` (``dsh --profile sdk``);
3. and refused (LOOP_SWITCH) when the runtime now routes it to another loop.

A session bound the old way (on ``agent-preset/selected``) is refused by the headless
runner; ``loopdock dsh-migrate`` moves its binding into a record, after which it resumes
on that binding.

Offline: temporary DSH_HOME and HOME, telemetry off, the plugin's ``ping`` model, loopback.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path

import attrs
import pytest
import trio

from loopdock._cli import main as loopdock_main
from loopdock._runtime import Runtime
from loopdock.actors.dock import Route, StrategyLoop
from loopdock.bridge import DockSelectHandler, serve_bridge
from loopdock.bridge._dsh_binding import BINDING_RECORD, _rows, _write
from loopdock.bridge._dsh_files import SESSION_FILE, dsh_process, quiet_env, session_log, split_turns, turn_end
from loopdock.bridge._patch import write_patch

DSH = Path(sys.executable).parent / "dsh"
TOKEN = "e2e-token-" + "r" * 20


class Recording(DockSelectHandler):
    def __init__(self, rt: Runtime) -> None:
        super().__init__(rt.dock)
        self.selects: list = []

    async def on_select(self, conn, request):
        try:
            selection = await super().on_select(conn, request)
        except Exception as exc:
            self.selects.append((request, getattr(exc, "code", repr(exc))))
            raise
        self.selects.append((request, selection))
        return selection


async def _noop(ctx) -> None:
    pass


def _records(log: list[dict]) -> list[dict]:
    return [e["data"] for e in log if e.get("type") == BINDING_RECORD]


def _ends(log: list[dict]) -> list[str | None]:
    return [(turn_end(t) or {}).get("kind") for t in split_turns([e for e in log if "seq" in e])]


async def _headless(tmp: Path, patch: Path, *args: str, name: str) -> tuple[int, str, str]:
    out = tmp / f"{name}.out"
    work = tmp / "work"
    work.mkdir(exist_ok=True)
    async with dsh_process(DSH, ["headless", "--patch", str(patch), *args], cwd=work,
                           env=quiet_env(tmp / "dsh-home", tmp / "home"), output=out) as proc:
        with trio.fail_after(90):
            code = await proc.wait()
    text = out.read_text(errors="replace")
    return code, text, text


def _session_id(output: str) -> str:
    for line in output.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            if row.get("type") == "session":
                return row["sessionId"]
    raise AssertionError(f"no session line in {output!r}")


def _sdk_run(tmp: Path, patch: Path, session_id: str, text: str) -> str:
    from deepseek_harness import DeepSeekHarness, DeepSeekHarnessConfig

    env = quiet_env(tmp / "dsh-home", tmp / "home")
    config = DeepSeekHarnessConfig(
        provider="ping", model="ping-1", cwd=str(tmp / "work"), dsh_bin=str(DSH), patches=(str(patch),),
        dsh_home=env["DSH_HOME"], env=env, initialize_timeout_seconds=90, request_timeout_seconds=90,
    )
    with DeepSeekHarness(config) as harness:
        return harness.resume_session(session_id).run(text).finish_reason or ""


async def test_a_dock_bound_session_resumes_headless_and_through_the_sdk_and_refuses_a_loop_switch(tmp_path):
    if not DSH.exists():
        pytest.fail(f"no dsh next to {sys.executable}: scripts/test installs deepseek-harness-runtime-bin")
    dsh_home = tmp_path / "dsh-home"
    with trio.fail_after(400):
        async with Runtime.open(tmp_path / "runtime", config={"defaultLoop": "minimal-first"}) as rt:
            handler = Recording(rt)
            async with trio.open_nursery() as nursery:
                port = await nursery.start(functools.partial(serve_bridge, handler, token=TOKEN))
                patch = write_patch(tmp_path / "patch", f"ws://127.0.0.1:{port}", TOKEN, dock=True, ping=True)

                code, out, _ = await _headless(tmp_path, patch, "--json", "first", name="create")
                assert code == 0, out
                session = _session_id(out)
                log = session_log(dsh_home, session)
                assert _records(log) == [{"loop": "minimal-first", "driver": "default"}]
                assert not [e for e in log if e.get("type") == "agent-preset/selected"]

                # 1. DSH's one-shot runner adopts it; the plugin sends the stored binding
                handler.bindings.clear()  # judged by DSH's log, not by the runtime's memory
                code, out, _ = await _headless(tmp_path, patch, "--session-id", session, "second", name="headless")
                assert code == 0, out
                [(request, selection)] = [(r, s) for r, s in handler.selects if r.op == "resume"]
                assert request.session_id == session and request.binding is not None
                assert (request.binding.loop, request.binding.driver) == ("minimal-first", "default")
                assert (selection.loop, selection.driver) == ("minimal-first", "default")
                log = session_log(dsh_home, session)
                assert _records(log) == [{"loop": "minimal-first", "driver": "default"}]  # recorded once
                assert _ends(log) == ["completed", "completed"]

                # 2. the SDK's resume_session (dsh --profile sdk), same patch
                finish = await trio.to_thread.run_sync(_sdk_run, tmp_path, patch, session, "third")
                assert finish == "completed"
                resumes = [s for r, s in handler.selects if r.op == "resume"]
                assert len(resumes) == 2 and resumes[-1].loop == "minimal-first"
                assert _ends(session_log(dsh_home, session)) == ["completed"] * 3

                # 3. routed elsewhere now: the stored binding refuses the resume
                rt.dock.config = attrs.evolve(rt.dock.config, session_loops={session: Route("standard")})
                code, out, _ = await _headless(tmp_path, patch, "--session-id", session, "fourth", name="switch")
                assert code != 0
                assert "LOOP_SWITCH" in out, out
                assert handler.selects[-1][1] == "LOOP_SWITCH"
                assert _ends(session_log(dsh_home, session)) == ["completed"] * 3
                nursery.cancel_scope.cancel()


async def test_a_session_bound_the_old_way_resumes_headless_after_dsh_migrate(tmp_path, capsys):
    if not DSH.exists():
        pytest.fail(f"no dsh next to {sys.executable}: scripts/test installs deepseek-harness-runtime-bin")
    dsh_home = tmp_path / "dsh-home"
    with trio.fail_after(300):
        async with Runtime.open(tmp_path / "runtime") as rt:
            rt.dock.register(StrategyLoop(id="kept-loop", setup=_noop))
            handler = Recording(rt)
            async with trio.open_nursery() as nursery:
                port = await nursery.start(functools.partial(serve_bridge, handler, token=TOKEN))
                patch = write_patch(tmp_path / "patch", f"ws://127.0.0.1:{port}", TOKEN, dock=True, ping=True)
                code, out, _ = await _headless(tmp_path, patch, "--json", "first", name="create")
                assert code == 0, out
                session = _session_id(out)

                # What an earlier plugin wrote: the binding on agent-preset/selected.
                (path,) = dsh_home.glob(f"sessions/*/{session}/{SESSION_FILE}")
                rows = [
                    {**row, "type": "agent-preset/selected", "data": {"agentLoopDock": {"loop": "kept-loop", "driver": "default"}}}
                    if row.get("type") == BINDING_RECORD else row
                    for row in _rows(path)
                ]
                rows = [{k: v for k, v in row.items() if k != "ignorable"} if row.get("type") == "agent-preset/selected" else row for row in rows]
                _write(path, rows)
                code, out, _ = await _headless(tmp_path, patch, "--session-id", session, "refused", name="old")
                assert code != 0 and "malformed agent-preset/selected" in out, out

                assert loopdock_main(["dsh-migrate", "--dsh-home", str(dsh_home)]) == 0
                said = capsys.readouterr().out
                assert f"migrated {session}: loop kept-loop on driver default" in said, said
                log = session_log(dsh_home, session)
                assert not [e for e in log if e.get("type") == "agent-preset/selected"]
                assert _records(log) == [{"loop": "kept-loop", "driver": "default"}]

                handler.bindings.clear()
                code, out, _ = await _headless(tmp_path, patch, "--session-id", session, "again", name="migrated")
                assert code == 0, out
                (request, selection) = handler.selects[-1]
                assert (request.op, request.binding.loop) == ("resume", "kept-loop")
                assert selection.loop == "kept-loop"
                assert _ends(session_log(dsh_home, session)) == ["completed", "completed"]
                # a second run finds nothing left to move
                assert loopdock_main(["dsh-migrate", "--dsh-home", str(dsh_home)]) == 0
                assert "nothing to migrate" in capsys.readouterr().out
                nursery.cancel_scope.cancel()
    assert os.environ["DSH_TELEMETRY_MODE"] == "DISABLED"
