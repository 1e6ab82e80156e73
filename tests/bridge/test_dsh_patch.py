"""The DSH patch (`loopdock dsh-patch`), `LoopDock.decide` and the `DockSelectHandler`,
without a DSH (tests/bridge/test_dsh_dock_e2e.py runs them against the real one)."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from loopdock._runtime import Runtime
from loopdock.actors.dock import DockError, Route, StrategyLoop
from loopdock.bridge import DockSelectHandler, Select
from loopdock.bridge._messages import StoredBinding
from loopdock.bridge._patch import PLUGIN_PATH, patch_rows, stable_plugin, write_patch

PEER = SimpleNamespace(id="c1")  # the connection a select came on (the handler counts what each one makes it keep)


def test_the_plugin_file_ships_beside_the_patch_writer():
    assert PLUGIN_PATH.is_file() and PLUGIN_PATH.suffix == ".mjs"
    assert (PLUGIN_PATH.parent / "package.json").is_file()


def test_patch_rows_in_dock_mode_disable_dsh_agent_loop_and_insert_the_plugin():
    rows = patch_rows("ws://127.0.0.1:5", "tok", dock=True, drivers=("default", "alt"), ping=True)
    assert rows[0] == {"id": "agent-default-model", "config": {"provider": "ping", "model": "ping-1"}}
    assert rows[1] == {"id": "agent-loop", "disabled": True}
    (plugin,) = rows[2]["insert"]
    assert plugin["name"] == str(PLUGIN_PATH)
    assert plugin["config"] == {
        "url": "ws://127.0.0.1:5/dsh",
        "token": "tok",
        "dock": True,
        "drivers": ["default", "alt"],
        "ping": True,
        "ownedKinds": ["loopx-continuation"],
    }


def test_patch_rows_without_dock_or_ping_only_insert_the_plugin():
    rows = patch_rows("ws://127.0.0.1:5/dsh", "tok")
    assert len(rows) == 1 and rows[0]["insert"][0]["config"]["url"] == "ws://127.0.0.1:5/dsh"
    with pytest.raises(ValueError):
        patch_rows("http://127.0.0.1:5", "tok")


def test_dsh_patch_command_writes_a_private_patch_with_the_home_token(tmp_path, loopdock_cli):
    home = tmp_path / "home"
    out = tmp_path / "out"
    code, stdout, stderr = loopdock_cli(
        "dsh-patch", "--url", "ws://127.0.0.1:9999", "--out", str(out),
        "--dock", "--drivers", "default,alt", "--ping", "--home", str(home),
    )  # fmt: skip
    assert code == 0, stderr
    patch = out / "patch.yml"
    assert stat.S_IMODE(patch.stat().st_mode) == 0o600
    config = yaml.safe_load(patch.read_text())[-1]["insert"][0]["config"]
    assert config["token"] == (home / "bridge.token").read_text().strip()
    assert config["drivers"] == ["default", "alt"] and config["dock"] is True
    assert f"--patch {patch}" in stdout
    assert f"DSH_HOME={os.environ['DSH_HOME']} " in stdout  # the real value, not "..."
    # the patch loads the copy under the runtime home, never the package's own path
    plugin = Path(yaml.safe_load(patch.read_text())[-1]["insert"][0]["name"])
    assert plugin == home / "dsh-plugin" / "index.mjs"
    assert plugin.read_bytes() == PLUGIN_PATH.read_bytes()
    assert (plugin.parent / "package.json").read_bytes() == (PLUGIN_PATH.parent / "package.json").read_bytes()


def test_the_stable_plugin_copy_is_refreshed_only_when_the_shipped_one_changed(tmp_path):
    copy = stable_plugin(tmp_path)
    assert copy.read_bytes() == PLUGIN_PATH.read_bytes()
    copy.write_text("// an older plugin")
    before = copy.stat().st_ino
    assert stable_plugin(tmp_path) == copy and copy.read_bytes() == PLUGIN_PATH.read_bytes()
    assert copy.stat().st_ino != before  # replaced whole, not rewritten in place
    same = copy.stat().st_ino
    stable_plugin(tmp_path)
    assert copy.stat().st_ino == same  # unchanged: left alone


def test_write_patch_in_place(tmp_path):
    out = tmp_path / "out"
    patch = write_patch(out, "ws://127.0.0.1:1", "first")
    assert write_patch(out, "ws://127.0.0.1:1", "other") == patch  # rewritten in place
    assert "other" in patch.read_text()


async def _noop(ctx) -> None:
    pass


class _Placeholder:
    async def create_agent(self, owner, options):
        raise AssertionError

    resume = create_agent


async def test_decide_and_the_select_handler_follow_the_dock_rules(tmp_path):
    config = {"sessionLoops": {"s-b": {"loop": "alt-loop", "driver": "alt"}}}
    async with Runtime.open(tmp_path / "rt", config=config) as rt:
        rt.dock.register(StrategyLoop(id="alt-loop", setup=_noop, driver="alt", provider="ping", model="pinned"))
        rt.register_driver("alt", _Placeholder())
        choice = rt.dock.decide("create", "s-a", {"provider": "ping", "model": "m", "reasoningEffort": "high"})
        assert (choice.loop, choice.driver, choice.provider) == ("standard", "default", None)
        assert choice.agent_options.reasoning_effort == "high"
        pinned = rt.dock.decide("create", "s-b", {"reasoningEffort": "high"})
        assert (pinned.loop, pinned.driver, pinned.model) == ("alt-loop", "alt", "pinned")
        assert pinned.agent_options.model == "pinned" and pinned.agent_options.reasoning_effort is None
        with pytest.raises(DockError) as err:
            rt.dock.decide("resume", "s-b", {"loop": "standard"}, persisted=Route("alt-loop", "alt"))
        assert err.value.code == "LOOP_SWITCH"

        handler = DockSelectHandler(rt.dock)
        # DSH's own option keys are not the dock's business
        selection = await handler.on_select(PEER, Select("create", "s-b", {"provider": "ping", "dshOnly": 1}))
        assert (selection.loop, selection.driver, selection.parts.model) == ("alt-loop", "alt", "pinned")
        assert handler.bindings["s-b"] == Route("alt-loop", "alt")
        resumed = await handler.on_select(PEER, Select("resume", "s-b"))
        assert (resumed.loop, resumed.driver) == ("alt-loop", "alt")
        with pytest.raises(DockError) as err:
            await handler.on_select(PEER, Select("resume", "s-b", {"loop": "standard"}))
        assert err.value.code == "LOOP_SWITCH"


async def test_the_select_handler_judges_a_resume_by_the_hosts_binding_first(tmp_path):
    async with Runtime.open(tmp_path / "rt") as rt:
        rt.dock.register(StrategyLoop(id="loopx-alt", setup=_noop, driver="alt"))
        rt.register_driver("alt", _Placeholder())
        handler = DockSelectHandler(rt.dock)
        # nothing anywhere: a session without a binding resumes on the default loop
        assert (await handler.on_select(PEER, Select("resume", "s1"))).loop == "standard"
        # the host's binding, with nothing in memory
        handler.bindings.clear()
        resumed = await handler.on_select(PEER, Select("resume", "s2", binding=StoredBinding("loopx-alt", "alt")))
        assert (resumed.loop, resumed.driver) == ("loopx-alt", "alt")
        assert handler.bindings["s2"] == Route("loopx-alt", "alt")
        # memory says standard, DSH's log says loopx-alt: the log wins
        handler.bindings["s3"] = Route("standard", "default")
        resumed = await handler.on_select(PEER, Select("resume", "s3", binding=StoredBinding("loopx-alt", "alt")))
        assert (resumed.loop, resumed.driver) == ("loopx-alt", "alt")
        assert handler.bindings["s3"] == Route("loopx-alt", "alt")
        with pytest.raises(DockError) as err:
            await handler.on_select(PEER, Select("resume", "s3", {"loop": "standard"}, binding=StoredBinding("loopx-alt", "alt")))
        assert err.value.code == "LOOP_SWITCH"
        # no binding from the host: memory is the fallback
        handler.bindings["s4"] = Route("loopx-alt", "alt")
        with pytest.raises(DockError) as err:
            await handler.on_select(PEER, Select("resume", "s4", {"loop": "standard"}))
        assert err.value.code == "LOOP_SWITCH"
        # a binding outside the dock's id grammar counts as none (memory, then nothing)
        handler.bindings["s5"] = Route("loopx-alt", "alt")
        resumed = await handler.on_select(PEER, Select("resume", "s5", binding=StoredBinding("Not A Loop")))
        assert (resumed.loop, resumed.driver) == ("loopx-alt", "alt")
        resumed = await handler.on_select(PEER, Select("resume", "s6", binding=StoredBinding("loopx-alt", "BAD DRIVER")))
        assert (resumed.loop, resumed.driver) == ("standard", "default")
        # a create never looks at memory or a binding
        handler.bindings["s7"] = Route("loopx-alt", "alt")
        created = await handler.on_select(PEER, Select("create", "s7"))
        assert (created.loop, created.driver) == ("standard", "default")
        assert handler.bindings["s7"] == Route("standard", "default")
