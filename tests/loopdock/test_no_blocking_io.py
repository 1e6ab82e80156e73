"""Nothing in the public API blocks trio's thread on the disk: a real runtime is driven
through it (create, turns with a file tool, evicted histories read back, events,
sessions, fork, dispose, restart, resume) under the watch of tests/loopdock/
blocking_probe.py, in a process of its own (it installs an audit hook and turns the
collector off). The probe writes its files before trio starts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/thread-self is Linux's")

PROBE = Path(__file__).with_name("blocking_probe.py")


def test_the_public_api_opens_no_file_and_runs_no_sql_on_the_event_loop(tmp_path):
    done = subprocess.run([sys.executable, "-P", str(PROBE), str(tmp_path)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    # The scenario did what it says (an empty run would pass the watch).
    seen = report["seen"]
    assert seen["events"] > 20 and seen["transcript"] == 8 and seen["sessions"] == 8
    assert seen["resumed_transcript"] == 8 and seen["resumed_events"] > seen["events"]
    calls = [f"{c['call']}\n{''.join(c['stack'][-4:])}" for c in report["calls"]]
    assert calls == []
    # The watch sees a blocking call for what it is: the probe's own 5 ms sleep.
    [sleep] = [b for b in report["blocked"] if b["task"] == "sleeps for real"]
    assert sleep["asleep_ms"] >= 4.5
