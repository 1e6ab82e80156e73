"""``loopdock dsh-install`` against the real ``dsh`` (its own ``--dump-config`` reads the
profile back): the user's rows stay, a second install replaces loopdock's rows instead of
adding more, the plugin loads from the runtime home (so reinstalling loopdock cannot break
the profile). What a wrong read-back says: tests/loopdock/test_install.py."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest
import yaml

from loopdock._install import install_command
from loopdock.bridge._patch import PLUGIN_ID, PLUGIN_PATH

DSH = Path(sys.executable).parent / "dsh"
USER_ROWS = "# my own patch layer\n- id: session-title\n  config:\n    fallbackMaxWords: 3\n"


def install(tmp_path: Path, **options) -> tuple[Path, str]:
    out = io.StringIO()
    layer = install_command(
        profile=options.get("profile", "headless"), url=options.get("url", "ws://127.0.0.1:8765"),
        home=str(tmp_path / "runtime-home"), dsh_home_arg=str(tmp_path / "dsh"), dock=options.get("dock", True),
        drivers=["default"], ping=options.get("ping", True), out=out,
    )
    return layer, out.getvalue()


def test_install_keeps_the_users_rows_reinstalls_in_place_and_verifies_with_dsh(tmp_path):
    if not DSH.exists():
        pytest.fail(f"no dsh next to {sys.executable}: scripts/test installs deepseek-harness-runtime-bin")
    layer, said = install(tmp_path)  # the profile does not exist yet: DSH makes it
    plugin = tmp_path / "runtime-home" / "dsh-plugin" / "index.mjs"
    assert f"plugin row {PLUGIN_ID}: loads {plugin}, connects to ws://127.0.0.1:8765/dsh" in said
    assert "dock mode: DSH's agent-loop row is disabled" in said and "default model: ping/ping-1" in said
    assert plugin.read_bytes() == PLUGIN_PATH.read_bytes()
    assert str(PLUGIN_PATH.parent) not in layer.read_text()  # never the package's own path

    layer.write_text(USER_ROWS + layer.read_text())
    layer2, said = install(tmp_path, url="ws://127.0.0.1:9999", ping=False)
    assert layer2 == layer
    rows = yaml.safe_load(layer.read_text())
    assert rows[0] == {"id": "session-title", "config": {"fallbackMaxWords": 3}}  # the user's row stays
    inserted = [r for r in rows if "insert" in r]
    assert len(inserted) == 1 and inserted[0]["insert"][0]["config"]["url"] == "ws://127.0.0.1:9999/dsh"
    assert not [r for r in rows if r.get("id") == "agent-default-model"]  # --ping was dropped
    assert [r for r in rows if r.get("id") == "agent-loop"] == [{"id": "agent-loop", "disabled": True}]
    assert "connects to ws://127.0.0.1:9999/dsh" in said
