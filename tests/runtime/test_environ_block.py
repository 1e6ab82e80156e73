"""Hiding the initial environment block: checked in a fresh interpreter started with a
secret in its environment (this test process's own block is whatever pytest got)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")

PROBE = r"""
import ctypes, json, os
from loopdock.runtime._environ_block import hide_environment_block

def shown():
    return open("/proc/self/environ", "rb").read()

libc = ctypes.CDLL(None)
libc.getenv.restype = ctypes.c_char_p
before = shown()
del os.environ["GONE_BEFORE"]  # unsetenv drops the pointer, never the bytes
still_there = b"gone-value" in shown()
zeroed = hide_environment_block()
after = shown()
print(json.dumps({
    "before": b"sk-probe-secret" in before,
    "unset_still_shown": still_there,
    "zeroed": zeroed,
    "after": b"sk-probe-secret" in after or b"gone-value" in after,
    "same_size": len(after) == len(before),
    "kept": [e.decode() for e in after.split(b"\0") if e],
    "getenv": libc.getenv(b"PROBE_API_KEY").decode(),
    "getenv_gone": libc.getenv(b"GONE_BEFORE"),
    "os_environ": os.environ["PROBE_API_KEY"],
    "again": hide_environment_block(),
    "child_sees": os.popen("printenv PROBE_API_KEY").read().strip(),
}))
"""


def test_the_block_is_zeroed_but_getenv_and_os_environ_still_work(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PROBE_API_KEY": "sk-probe-secret", "GONE_BEFORE": "gone-value"}
    root = __file__.rsplit("/tests/", 1)[0]
    out = subprocess.run([sys.executable, "-P", "-c", PROBE], env=env, cwd=root, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    facts = json.loads(out.stdout.splitlines()[-1])
    assert facts["before"] and facts["unset_still_shown"]  # the leak, as it was
    assert not facts["after"]  # gone from /proc/self/environ, the unset one too
    assert facts["same_size"]  # zeroed in place, nothing moved
    assert facts["zeroed"] >= 2 and facts["again"] == 0
    assert sorted(entry.split("=", 1)[0] for entry in facts["kept"]) == ["HOME", "PATH"]
    # The runtime itself loses nothing: C getenv, os.environ and its children's inherit.
    assert facts["getenv"] == facts["os_environ"] == facts["child_sees"] == "sk-probe-secret"
    assert facts["getenv_gone"] is None
