"""Every Python block of README.md runs as pasted: each in a fresh directory holding the
files the README shows (a block after ``<!-- file: NAME -->`` is written to NAME), as a
new interpreter, offline. The LoopX block runs with the real loopx CLI and Node 22 on
PATH, as the README's Install says."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"^```python\n(.*?)^```", README, flags=re.S | re.M)
FILES = dict(re.findall(r"^<!-- file: (\S+) -->\n```\w*\n(.*?)^```", README, flags=re.S | re.M))
OFFLINE = [b for b in BLOCKS if "LoopxSettings" not in b]
LOOPX = [b for b in BLOCKS if "LoopxSettings" in b]


def run_block(block: str, tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    for name, text in FILES.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "block.py").write_text(block)
    return subprocess.run([sys.executable, "block.py"], cwd=tmp_path, capture_output=True, text=True, timeout=240,
                          env={**env})


def test_the_readme_has_the_blocks_this_test_runs():
    assert len(OFFLINE) >= 4 and len(LOOPX) == 1
    assert "agents.yml" in FILES and "config=\"agents.yml\"" in README


@pytest.mark.parametrize("block", OFFLINE, ids=[f"block{i}" for i in range(len(OFFLINE))])
def test_a_readme_block_runs_as_pasted(block, tmp_path):
    done = run_block(block, tmp_path, dict(os.environ))
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", done.stderr  # a quiet library: nothing on stderr without a warning
    assert done.stdout.strip(), "each block prints what it shows"


def test_the_readme_blocks_print_what_their_comments_say(tmp_path):
    outputs = {}
    for i, block in enumerate(OFFLINE):
        work = tmp_path / f"b{i}"
        work.mkdir()
        outputs[i] = run_block(block, work, dict(os.environ)).stdout
    embedded, reviewer, shell, dock = (outputs[i] for i in range(4))
    assert shell.strip() == "['git', 'pytest'] 30.0"
    assert "pong: Summarise the README." in embedded and "turn/end" in embedded
    assert "'kind': 'blocked'" in reviewer
    lines = set(dock.splitlines())
    assert {"a1 standard default", "a2 loop2.reviewer loop2", "a3 minimal-first loop2",
            "flash standard default", "pro minimal-first default"} <= lines, dock


def test_the_loopx_block_runs_with_loopx_and_node_22(tmp_path, loopx_env):
    [block] = LOOPX
    done = run_block(block, tmp_path, loopx_env)
    assert done.returncode == 0, done.stderr
    assert "InitOutcome(ok=True" in done.stdout, done.stdout
