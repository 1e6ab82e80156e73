"""Every Python block of README.md runs as pasted: each alone in a new empty directory, as a
new interpreter, offline. The LoopX block runs with the real loopx CLI and Node 22 on PATH,
as the README's Install says; the embedded bridge block needs a DSH host and runs in
test_readme_embedded_bridge_e2e.py (``readme_blocks.runner`` gives every block exactly one
of the three)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
from readme_blocks import README, blocks, blocks_for, python_blocks, runner

from loopdock import DockConfig
from loopdock.actors.dock import load_config, parse_config

OFFLINE = blocks_for("offline")
LOOPX = blocks_for("loopx")


def run_block(block: str, folder: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    assert not any(folder.iterdir()), "a block runs in an empty directory"
    (folder / "block.py").write_text(block)
    return subprocess.run([sys.executable, "block.py"], cwd=folder, capture_output=True, text=True, timeout=240,
                          env={**env})


def test_every_python_block_is_run_by_one_test():
    kinds = [runner(block) for block in python_blocks()]
    assert kinds.count("dsh") == 1 and kinds.count("loopx") == 1 and kinds.count("offline") >= 4, kinds
    assert len(OFFLINE) + len(LOOPX) + len(blocks_for("dsh")) == len(python_blocks())


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
    models = next(outputs[i] for i, block in enumerate(OFFLINE) if "openrouter" in block)
    assert models.startswith("('claude', 'openai-compatible', 'openrouter', "), models
    traced = next(outputs[i] for i, block in enumerate(OFFLINE) if "tracer_provider" in block)
    assert traced.splitlines() == ["chat ping-1 chat", "invoke_agent traced invoke_agent"], traced


def test_the_dock_blocks_config_is_the_agents_yml_the_readme_shows(tmp_path):
    """The dock block carries its config inline (it runs in an empty directory); the YAML
    file the README shows next to it, for ``config="agents.yml"`` and ``--config``, must say
    the same."""
    (dock,) = [block for block in OFFLINE if "config=CONFIG" in block]
    (assign,) = [node for node in ast.parse(dock).body
                 if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "CONFIG"]
    inline = ast.literal_eval(assign.value)
    text = next(b for b in blocks("yaml", "## The loop dock") if "defaultLoop" in b)
    (tmp_path / "agents.yml").write_text(text)
    from_file = load_config(tmp_path / "agents.yml")
    assert isinstance(from_file, DockConfig) and from_file.agents
    assert from_file == parse_config(inline)
    assert 'config="agents.yml"' in README


def test_the_loopx_block_runs_with_loopx_and_node_22(tmp_path, loopx_env):
    [block] = LOOPX
    done = run_block(block, tmp_path, loopx_env)
    assert done.returncode == 0, done.stderr
    assert "InitOutcome(ok=True" in done.stdout, done.stdout


def test_the_approvals_block_asks_and_runs_the_edited_call(tmp_path):
    (block,) = [block for block in OFFLINE if "wait_approvals" in block]
    done = run_block(block, tmp_path, dict(os.environ))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "write_file write_file is not declared read-only",
        "hello, edited",
        "pong: wrote 13 bytes to notes.txt",
    ]
    assert (tmp_path / "notes.txt").read_text() == "hello, edited"
