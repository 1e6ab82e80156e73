"""README.md's code blocks, for the tests that run them as written.

Every ```python block is run by exactly one test, chosen by ``runner``: ``dsh`` (the embedded
bridge, with a real DSH host: tests/loopdock/test_readme_embedded_bridge_e2e.py), ``loopx``
(with the real loopx CLI on Node 22) or ``offline`` (the others); both of the latter in
tests/loopdock/test_readme_snippets.py. A block matches one runner or the other by what it
uses, so a new block cannot go unrun."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()

Runner = Literal["dsh", "loopx", "offline"]


def python_blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", README, flags=re.S | re.M)


def runner(block: str) -> Runner:
    if "serve_bridge(" in block:
        return "dsh"
    if "LoopxSettings" in block:
        return "loopx"
    return "offline"


def blocks_for(kind: Runner) -> list[str]:
    return [block for block in python_blocks() if runner(block) == kind]


def blocks(language: str, after: str) -> list[str]:
    """The ```LANGUAGE blocks of the README after the first line holding ``after``."""
    section = README.split(after, 1)[1]
    return re.findall(rf"^```{language}\n(.*?)^```", section, flags=re.S | re.M)
