"""The bridge token file: made once, private, reused."""

import os
import stat

import pytest

from loopdock.bridge import TokenFileError, load_or_create_token


def test_the_token_is_created_private_and_reused(tmp_path):
    home = tmp_path / "home"  # not there yet: the first serve makes it
    token = load_or_create_token(home)
    path = home / "bridge.token"
    assert len(token) >= 40  # token_urlsafe(32): 256 bits
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_or_create_token(home) == token
    assert [p.name for p in home.iterdir()] == ["bridge.token"]  # no draft left behind


def test_a_token_file_others_can_read_is_made_private_again(tmp_path):
    token = load_or_create_token(tmp_path)
    path = tmp_path / "bridge.token"
    path.chmod(0o644)
    assert load_or_create_token(tmp_path) == token
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_two_homes_get_two_tokens(tmp_path):
    assert load_or_create_token(tmp_path / "a") != load_or_create_token(tmp_path / "b")


def test_an_empty_token_file_is_an_error_not_an_empty_secret(tmp_path):
    (tmp_path / "bridge.token").write_text("\n")
    with pytest.raises(TokenFileError):
        load_or_create_token(tmp_path)


@pytest.mark.parametrize("mask", [0o000, 0o277])
def test_the_token_and_its_home_are_private_whatever_the_umask(tmp_path, mask):
    home = tmp_path / "home"
    old = os.umask(mask)
    try:
        load_or_create_token(home)
    finally:
        os.umask(old)
    assert stat.S_IMODE((home / "bridge.token").stat().st_mode) == 0o600
    assert stat.S_IMODE(home.stat().st_mode) == 0o700


def test_a_home_others_may_enter_is_made_private(tmp_path):
    home = tmp_path / "home"
    home.mkdir(mode=0o755)
    home.chmod(0o755)
    load_or_create_token(home)
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
