"""A program the shell tool runs cannot read the runtime's secrets from /proc.

The runtime is a fresh interpreter started with an API key in its environment (as a real
one is); an agent's shell call runs a script that walks its ancestors up to pid 1 and
prints each one's ``/proc/<pid>/environ``. None may show the key: not the launcher (it
has no environment of its own), not the runtime (``Runtime.open(hide_environment=True)``,
as serve and worker open it, zeroed its block), and
not the ones above (they never had it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")

SECRET = "sk-runtime-secret-0123456789"

WALK = r"""
import os
pid = os.getpid()
while pid > 1:
    stat = open("/proc/%d/stat" % pid).read()
    parent = int(stat.rsplit(")", 1)[1].split()[1])
    try:
        shown = open("/proc/%d/environ" % pid, "rb").read().replace(b"\0", b"\n").decode("utf-8", "replace")
    except OSError as exc:
        shown = "unreadable: %s" % exc.strerror
    print("=== pid %d parent %d" % (pid, parent))
    print(shown)
    pid = parent
"""

RUNTIME = r"""
import json, os, sys, trio
from loopdock import Runtime, ShellPolicy
from loopdock.runtime.models import Reply, ScriptedAdapter, ToolCall

async def main(home, work, python_dir):
    policy = ShellPolicy(allow=frozenset({"python3"}), env={"PATH": python_dir + ":/usr/bin:/bin"}, max_output=1_000_000)
    async with Runtime.open(home, shell=policy, hide_environment=True) as rt:
        call = ToolCall("shell", {"command": "python3 walk.py"}, call_id="walk")
        rt.register_adapter("scripted", ScriptedAdapter([Reply(tool_calls=[call]), "done"]))
        handle = await rt.create_agent(session_id="walker", agent_options={"provider": "scripted", "model": "m"}, cwd=work)
        handle.agent.followup("walk")
        await handle.agent.wait_idle()
        [result] = [b for e in (await handle.agent.session.read_events()) if e.type == "tool/result" for b in e.data["content"]]
        print(json.dumps({"pid": os.getpid(), "result": result}))

trio.run(main, *sys.argv[1:4])
"""


def test_no_ancestor_of_a_shell_call_shows_the_runtimes_secret(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "walk.py").write_text(WALK)
    python_dir = tmp_path / "bin"
    python_dir.mkdir()
    (python_dir / "python3").symlink_to(sys.executable)
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "DEEPSEEK_API_KEY": SECRET,  # as a real runtime gets it: in its initial environment
        "SOME_SERVICE_TOKEN": SECRET,
    }
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-P", "-c", RUNTIME, str(tmp_path / "home"), str(work), str(python_dir)],
        env=env, cwd=root, capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.splitlines()[-1])
    result = report["result"]
    assert not result.get("isError"), result
    text = result["content"]
    assert SECRET not in text
    chain = []  # (pid, parent, environ) from the walker itself up to below pid 1
    for block in text.split("=== pid ")[1:]:
        head, _, environ = block.partition("\n")
        pid, _, parent = head.split()
        chain.append((int(pid), int(parent), environ))
    walker, launcher, runtime = chain[:3]
    assert "DSH_SESSION_ID=walker" in walker[2]  # reading an environ works
    assert walker[1] == launcher[0] and launcher[1] == runtime[0] == report["pid"]
    assert "PATH=" not in launcher[2]  # the launcher has no environment of its own
    assert "PATH=" in runtime[2]  # the runtime's was read, and kept what is harmless
    assert "DEEPSEEK_API_KEY" not in runtime[2] and "SOME_SERVICE_TOKEN" not in runtime[2]
    assert len(chain) >= 4  # and on above the runtime (this test, its runner, ...)
