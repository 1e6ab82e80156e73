"""A real redis-server (Debian's, installed by scripts/test) per test, on a free loopback
port, with its append-only file in the test's temporary directory."""

from __future__ import annotations

import signal

import pytest

from loopdock.benchmarks._redis import RedisServer


@pytest.fixture
def redis_server(tmp_path):
    server = RedisServer(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop(signal.SIGKILL)
