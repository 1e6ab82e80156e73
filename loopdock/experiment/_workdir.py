"""A rollout's working directory: fresh for every attempt, holding the sample's files.

They live under ``<home>-work/experiments/<run>/<key>``, beside the runtime home and
never inside it (the file tools refuse every path in the home, which holds every
session's transcript): the agent's sandbox (its file tools are confined to it) and what
a python scorer reads. They are kept after the run so
a person can look at what an agent left behind; the results themselves are in the
session logs, so deleting these loses nothing a report needs.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from ._spec import Sample


def work_root(home: Path, run: str) -> Path:
    return home.with_name(home.name + "-work") / "experiments" / run


def prepare(root: Path, key: str, sample: Sample) -> Path:
    """Blocking (run it in a thread): an empty directory with the sample's files."""
    workdir = root / key
    if workdir.exists():
        shutil.rmtree(workdir)  # an earlier attempt's leftovers must not help this one
    workdir.mkdir(parents=True)
    for dest, source in sample.files.items():
        target = workdir / dest
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.text is not None:
            target.write_text(source.text, encoding="utf-8")
        elif source.path is not None and source.path.is_dir():
            shutil.copytree(source.path, target, dirs_exist_ok=True)
        elif source.path is not None:
            shutil.copyfile(source.path, target)
    return workdir
