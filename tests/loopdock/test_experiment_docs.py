"""docs/experiments.md's authoring example runs as written: saved under the name it gives,
in an empty directory, as a new interpreter, offline."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

DOC = (Path(__file__).resolve().parents[2] / "docs" / "experiments.md").read_text()


def test_the_authoring_example_runs_and_prints_what_the_doc_says(tmp_path):
    section = DOC.split("## Authoring a loop and an adapter for an experiment", 1)[1]
    [block] = re.findall(r"^```python\n(.*?)^```", section.split("\n## ", 1)[0], flags=re.S | re.M)
    (tmp_path / "author_example.py").write_text(block)
    done = subprocess.run([sys.executable, "author_example.py"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, env=dict(os.environ))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == "2 of 2 rollouts scored: standard 1, read-only 0\n"
    assert "It prints `2 of 2 rollouts scored: standard 1, read-only 0`" in section
