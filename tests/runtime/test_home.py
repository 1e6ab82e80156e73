"""Where the runtime's home is when nobody says: outside every agent's cwd."""

from __future__ import annotations

from pathlib import Path

from loopdock.runtime._home import default_home, resolve_home


def test_the_default_home_is_the_xdg_data_directory(monkeypatch, tmp_path):
    monkeypatch.delenv("LOOPDOCK_HOME")
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "me"))
    monkeypatch.chdir(tmp_path)
    assert resolve_home(None) == tmp_path / "me" / ".local" / "share" / "loopdock"
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert resolve_home(None) == tmp_path / "data" / "loopdock"
    # The spec says a relative XDG_DATA_HOME is invalid and ignored; it never means ./
    monkeypatch.setenv("XDG_DATA_HOME", "relative/data")
    assert resolve_home(None) == tmp_path / "me" / ".local" / "share" / "loopdock"
    assert not str(resolve_home(None)).startswith(str(tmp_path / ".loopdock"))


def test_loopdock_home_and_an_explicit_home_still_win(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("LOOPDOCK_HOME", str(tmp_path / "from-env"))
    assert resolve_home(None) == tmp_path / "from-env"
    assert resolve_home(tmp_path / "explicit") == tmp_path / "explicit"
    monkeypatch.chdir(tmp_path)
    assert resolve_home("relative") == tmp_path / "relative"  # made absolute


def test_default_home_reads_a_given_environment():
    assert default_home({"HOME": "/h"}) == Path("/h/.local/share/loopdock")
    assert default_home({"HOME": "/h", "XDG_DATA_HOME": "/d"}) == Path("/d/loopdock")
