"""Fixtures of the loopdock (public face) tests: ``main``, loopdock's main in this process."""

from __future__ import annotations

import pytest
import structlog

from loopdock._cli import main as _main


@pytest.fixture
def main():
    """``loopdock``'s main. It configures structlog to print to the stderr of the moment
    (capsys's, closed after the test): the configuration is put back afterwards, so that
    later tests' warnings do not go to a closed file."""
    saved = structlog.get_config()
    yield _main
    structlog.configure(**saved)
