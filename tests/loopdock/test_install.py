"""``dsh-install``'s check of what DSH reads back, and its parse of DSH's composed tree."""

from __future__ import annotations

import pytest

from loopdock._install import InstallError, composed_rows, merged_layer, verify
from loopdock.bridge._patch import PLUGIN_ID


def test_verify_names_what_dsh_does_not_read_back(tmp_path):
    plugin = tmp_path / "index.mjs"
    good = [{"id": PLUGIN_ID, "name": f"file://{plugin}", "config": {"url": "ws://h:1/dsh"}},
            {"id": "agent-loop", "disabled": True}]
    assert len(verify(good, plugin, "ws://h:1", dock=True, ping=False)) == 2
    with pytest.raises(InstallError, match="not from"):
        verify([{**good[0], "name": "/site-packages/bridge/dsh_plugin/index.mjs"}], plugin, "ws://h:1", dock=False, ping=False)
    with pytest.raises(InstallError, match="still enabled"):
        verify([good[0], {"id": "agent-loop"}], plugin, "ws://h:1", dock=True, ping=False)
    with pytest.raises(InstallError, match="0 loopdock-bridge rows"):
        verify([], plugin, "ws://h:1", dock=False, ping=False)
    # DSH's dump: sections of rows under comments, with !!js expressions
    dump = "# == base\n- id: a\n  disabled: !!js '!ctx.get(''x'')'\n# == mine\n- id: b\n"
    assert composed_rows(dump) == [{"id": "a", "disabled": "!ctx.get('x')"}, {"id": "b"}]


def test_a_reinstall_replaces_only_loopdocks_rows():
    mine = [{"id": "session-title", "config": {"x": 1}}, {"id": "agent-loop", "disabled": True, "config": {}}]
    old = [{"id": "agent-default-model", "config": {"provider": "ping", "model": "ping-1"}},
           {"id": "agent-loop", "disabled": True}, {"insert": [{"id": PLUGIN_ID, "name": "/old/index.mjs"}]}]
    new = [{"insert": [{"id": PLUGIN_ID, "name": "/new/index.mjs"}]}]
    assert merged_layer([*mine, *old], new) == [*mine, *new]
    assert merged_layer(None, new) == new  # DSH's fresh layer is an empty list or nothing
