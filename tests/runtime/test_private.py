"""Files only their owner may read: the home directory and the files in it."""

from __future__ import annotations

import os
import stat

import pytest
from structlog.testing import capture_logs

from loopdock.runtime._private import private_dir, private_file


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("mask", [0o000, 0o022, 0o277])
def test_a_new_directory_is_0700_and_a_new_file_0600_whatever_the_umask(tmp_path, mask):
    old = os.umask(mask)
    try:
        private_dir(tmp_path / "a" / "home")
        private_file(tmp_path / "a" / "home" / "f", create=True)
    finally:
        os.umask(old)
    assert mode(tmp_path / "a" / "home") == 0o700
    assert mode(tmp_path / "a" / "home" / "f") == 0o600


def test_an_open_directory_is_tightened_with_a_warning(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    home.chmod(0o755)
    with capture_logs() as logs:
        private_dir(home)
        private_dir(home)  # already private: nothing to say
    assert mode(home) == 0o700
    assert [(e["event"], e["mode"]) for e in logs] == [("home.tightened", "0o755")]


def test_a_missing_file_is_left_missing_unless_asked_to_create(tmp_path):
    private_file(tmp_path / "none", create=False)
    assert not (tmp_path / "none").exists()
    (tmp_path / "f").write_text("keep")
    (tmp_path / "f").chmod(0o644)
    private_file(tmp_path / "f", create=True)
    assert mode(tmp_path / "f") == 0o600
    assert (tmp_path / "f").read_text() == "keep"  # never truncated
