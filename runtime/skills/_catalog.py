"""Skill discovery: ``<root>/<name>/SKILL.md`` files found in ranked roots, hot-reloaded.

Roots, highest rank first, as DSH orders them: ``<project>/.dsh/skills``,
``<project>/.agents/skills``, custom dirs, ``$DSH_HOME/skills``, ``$DSH_AGENTS_HOME/skills``
(default ``~/.agents/skills``). A higher-ranked root shadows a lower one by skill name.

Lookups (``get``, ``list``, ``names``) never touch the disk: they answer from the last
scan. A refresh brings that up to date: it computes a cheap signature (a few ``stat``
calls: each root, each skill folder, each ``SKILL.md``) and rescans only when it differs
from the last scan. ``await refreshed()`` does so in a worker thread, never on trio's
thread; the runtime awaits it before every model step, so a change on disk is seen by the
very next step. ``refresh()`` is the same, synchronous, for worker threads and programs
without trio.

Both can skip even the signature: while a ``watch()`` task runs (the runtime starts one in
its nursery), an inotify signal on the roots says when the disk changed, and a refresh
looks at the disk only then. Without a watcher (or without inotify) it checks every time.

Nothing the model can see carries an absolute path: a ``Skill`` names its root by a label
(``project-dsh``, ``dsh-home``, ...), and the warnings for skipped skills do the same.
"""

from __future__ import annotations

import builtins
import os
import re
import select
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import attrs
import trio
import yaml

from .._errors import LoopdockError
from .._logging import get_logger
from ._watch import open_watches, watch_supported

log = get_logger(__name__)

SKILL_FILE = "SKILL.md"
# A skill's body goes to the model whole; a runaway file must not fill its context.
MAX_SKILL_BYTES = 256 * 1024
# Names travel as ``/name`` tokens and as tool arguments: no spaces, no slashes.
SKILL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_FRONT_MATTER = re.compile(r"\A---[ \t]*\r?\n(.*?)^---[ \t]*(?:\r?\n|\Z)", re.DOTALL | re.MULTILINE)


def _freeze(value: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(value))


@attrs.frozen
class Skill:
    """One loaded skill. ``rank`` 0 is the highest-ranked root; ``root`` is its label.

    ``metadata`` holds the front matter's other fields (everything but name/description).
    """

    name: str
    description: str
    body: str
    rank: int
    root: str
    # Excluded from hashing: YAML values may be lists or mappings.
    metadata: Mapping[str, Any] = attrs.field(factory=dict, converter=_freeze, hash=False)


@attrs.frozen
class SkillRoot:
    label: str
    path: Path


class InvalidSkillError(LoopdockError):
    """Raised by ``parse_skill`` for a SKILL.md that is not a valid skill (the catalog logs
    it and skips that skill; it never reaches a catalog caller)."""

    code = "INVALID_SKILL"


def parse_skill(text: str, folder: str, *, rank: int = 0, root: str = "") -> Skill:
    """Parse a SKILL.md's text; raises InvalidSkillError when it is not a valid skill.

    The front matter must be a YAML mapping; ``name`` defaults to the folder name and
    must equal it when given (a skill is invoked by the name its folder shows).
    """
    match = _FRONT_MATTER.match(text)
    if match is None:
        raise InvalidSkillError("no front matter (the file must start with a '---' block)")
    try:
        meta = yaml.safe_load(match.group(1))
    except yaml.YAMLError as exc:
        raise InvalidSkillError(f"front matter is not valid YAML ({type(exc).__name__})") from None
    if meta is None:
        meta = {}
    if not isinstance(meta, dict):
        raise InvalidSkillError("front matter is not a mapping")
    name = meta.get("name", folder)
    if not isinstance(name, str):
        raise InvalidSkillError("front matter 'name' is not a string")
    if name != folder:
        raise InvalidSkillError(f"front matter name {name!r} does not match its folder {folder!r}")
    if not SKILL_NAME.fullmatch(name):
        raise InvalidSkillError(f"skill name {name!r} must match {SKILL_NAME.pattern}")
    description = meta.get("description", "")
    if not isinstance(description, str):
        raise InvalidSkillError("front matter 'description' is not a string")
    body = text[match.end():].lstrip("\r\n").rstrip()
    extra = {k: v for k, v in meta.items() if k not in ("name", "description")}
    return Skill(name, description.strip(), body, rank, root, extra)


def _readable(fds: Iterable[int]) -> bool:
    """Whether a change signal waits on any of ``fds`` (a poll that never blocks)."""
    if not fds:
        return False
    readable, _, _ = select.select(list(fds), [], [], 0)
    return bool(readable)


def _stat_key(path: str) -> tuple[int, ...] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    # ctime and inode catch an atomic replace that keeps mtime and size.
    return (st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino)


def _folders(root: Path | str) -> list[str]:
    try:
        with os.scandir(root) as it:
            # DirEntry.is_dir() follows symlinks like Path.is_dir(), and needs no extra
            # stat where the file system reports the entry type.
            names = [e.name for e in it if not e.name.startswith(".") and e.is_dir()]
    except OSError:  # missing or unreadable root: simply no skills there
        return []
    return sorted(names)


class SkillCatalog:
    """The skills visible from one project, by name, highest-ranked root first."""

    def __init__(
        self,
        project: Path | None,
        *,
        dsh_home: Path | None = None,
        agents_home: Path | None = None,
        extra_dirs: Iterable[Path | str] = (),
    ) -> None:
        candidates: list[SkillRoot] = []
        if project is not None:
            project = Path(project)
            candidates.append(SkillRoot("project-dsh", project / ".dsh" / "skills"))
            candidates.append(SkillRoot("project-agents", project / ".agents" / "skills"))
        for index, extra in enumerate(extra_dirs, start=1):
            candidates.append(SkillRoot(f"custom-{index}", Path(extra)))
        if dsh_home is not None:
            candidates.append(SkillRoot("dsh-home", Path(dsh_home) / "skills"))
        if agents_home is not None:
            candidates.append(SkillRoot("agents-home", Path(agents_home) / "skills"))
        # The same directory reached twice (project == $HOME, say) keeps its higher rank.
        seen: set[Path] = set()
        self.roots: tuple[SkillRoot, ...] = ()
        for root in candidates:
            key = Path(os.path.abspath(root.path))
            if key not in seen:
                seen.add(key)
                self.roots += (SkillRoot(root.label, key),)
        # The signature is computed on every lookup: plain strings, no Path objects.
        self._root_paths = tuple((root.label, str(root.path)) for root in self.roots)
        self._signature: tuple[Any, ...] | None = None
        self._skills: dict[str, Skill] = {}
        #: Bumped on every rescan (a change on disk): caches of what the catalog
        #: shows (such as the ``skill`` tool's listing) key on it.
        self.generation = 0
        self._live_watches = 0  # watch() tasks whose inotify watches are in place
        self._signalled = True  # a watcher saw a change (or has just (re)started)
        self._refreshing = trio.Lock()
        self._watch_fds: set[int] = set()  # the inotify fds of live watch() tasks

    @classmethod
    def from_env(
        cls, project: Path | None, env: Mapping[str, str], *, extra_dirs: Iterable[Path | str] = ()
    ) -> SkillCatalog:
        """Roots from ``DSH_HOME``, ``DSH_AGENTS_HOME`` (default ``$HOME/.agents``)."""
        dsh_home = env.get("DSH_HOME") or None
        agents_home = env.get("DSH_AGENTS_HOME") or None
        if agents_home is None and env.get("HOME"):
            agents_home = str(Path(env["HOME"]) / ".agents")
        return cls(
            project,
            dsh_home=Path(dsh_home) if dsh_home else None,
            agents_home=Path(agents_home) if agents_home else None,
            extra_dirs=extra_dirs,
        )

    # -- lookups (as of the last refresh: no disk access) ----------------------------------

    def get(self, name: str) -> Skill | None:
        return self._skills.get(name)

    def list(self) -> list[Skill]:
        """Every visible skill, sorted by name."""
        return [self._skills[n] for n in sorted(self._skills)]

    def names(self) -> builtins.list[str]:
        return sorted(self._skills)

    # -- scanning -----------------------------------------------------------------------

    async def refreshed(self) -> int:
        """``refresh()`` in a worker thread (one at a time); no checkpoint when a
        ``watch()`` task runs and no change happened since the last look. A change the
        watcher has not handled yet counts: the kernel queues its signal before the write
        that made it returns, and this polls the watches (without waiting) for it."""
        if self._live_watches and not self._signalled and not _readable(self._watch_fds):
            return self.generation
        async with self._refreshing:
            return await trio.to_thread.run_sync(self.refresh)

    def refresh(self) -> int:
        """Rescan if anything changed on disk; returns ``generation``, which changes
        exactly when the visible skills may have. Looks at the disk (a few ``stat``
        calls) unless a ``watch()`` task runs and no change happened since the last look:
        call it from a worker thread, or ``await refreshed()``."""
        if self._live_watches and not self._signalled and not _readable(self._watch_fds):
            return self.generation
        self._signalled = False
        self._refresh()
        return self.generation

    async def watch(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep a change signal on the roots until cancelled (run it with ``nursery.start``).

        Each change (in a root, a skill folder, or the nearest existing parent of a
        missing root) reopens the watches for the tree as it is now, and this task
        rescans in a worker thread, so that the next ``refreshed()`` rarely has to. It
        reports started once the first watches are in place and the catalog scanned.
        Where inotify is missing it scans once and waits to be cancelled; if the watches
        cannot be set up it retries every second. Either way a refresh meanwhile checks
        the disk every time.
        """
        if not watch_supported():
            await self.refreshed()
            task_status.started()
            await trio.sleep_forever()
        started = False
        while True:
            # Walking the roots and adding the watches touch the disk: a worker thread.
            paths = await trio.to_thread.run_sync(self._watch_paths)
            fd = await trio.to_thread.run_sync(open_watches, paths)
            if fd is None:
                if not started:
                    await self.refreshed()
                    task_status.started()
                    started = True
                await trio.sleep(1.0)
                continue
            if await trio.to_thread.run_sync(self._watch_paths) != paths:
                # A folder came or went while the watches were being added: one of
                # them may be missing. Set them up again for the tree as it is now.
                os.close(fd)
                continue
            self._live_watches += 1
            self._watch_fds.add(fd)
            self._signalled = True  # whatever changed before the watches were in place
            try:
                await self.refreshed()
                if not started:
                    task_status.started()
                    started = True
                await trio.lowlevel.wait_readable(fd)
            finally:
                self._live_watches -= 1
                self._watch_fds.discard(fd)
                self._signalled = True
                trio.lowlevel.notify_closing(fd)
                os.close(fd)

    def _watch_paths(self) -> builtins.list[str]:
        paths: list[str] = []
        for _, root in self._root_paths:
            if os.path.isdir(root):
                paths.append(root)
                for folder in _folders(root):
                    path = os.path.join(root, folder)
                    paths.append(path)
                    skill_file = os.path.join(path, SKILL_FILE)
                    if os.path.islink(skill_file):  # its target may live anywhere
                        paths.append(skill_file)
            else:  # the root appears when an entry of its nearest existing parent does
                parent = os.path.dirname(root)
                while not os.path.isdir(parent) and os.path.dirname(parent) != parent:
                    parent = os.path.dirname(parent)
                paths.append(parent)
        return list(dict.fromkeys(paths))

    def _current_signature(self) -> tuple[Any, ...]:
        parts: list[Any] = []
        join = os.path.join
        for label, root in self._root_paths:
            # access() answers "missing" without raising: most roots usually are.
            key = _stat_key(root) if os.access(root, os.F_OK) else None
            parts.append((label, key))
            if key is None:  # a missing root has no folders: no scandir needed
                continue
            for folder in _folders(root):
                path = join(root, folder)
                parts.append((folder, _stat_key(path), _stat_key(join(path, SKILL_FILE))))
        return tuple(parts)

    def _refresh(self) -> None:
        signature = self._current_signature()
        if signature == self._signature:
            return
        self._skills = self._scan()
        self._signature = signature
        self.generation += 1

    def _scan(self) -> dict[str, Skill]:
        skills: dict[str, Skill] = {}
        for rank, root in enumerate(self.roots):
            for folder in _folders(root.path):
                if folder in skills:  # shadowed by a higher-ranked root
                    continue
                skill = self._load(root, rank, folder)
                if skill is not None:
                    skills[folder] = skill
        log.debug("skills.scanned", count=len(skills))
        return skills

    def _load(self, root: SkillRoot, rank: int, folder: str) -> Skill | None:
        path = root.path / folder / SKILL_FILE
        try:
            if not path.is_file():
                return None  # a folder without SKILL.md is not a skill (no warning)
            if path.stat().st_size > MAX_SKILL_BYTES:
                raise InvalidSkillError(f"{SKILL_FILE} is larger than {MAX_SKILL_BYTES} bytes")
            text = path.read_text(encoding="utf-8")
        except InvalidSkillError as exc:
            return self._skip(root, folder, str(exc))
        except UnicodeDecodeError:
            return self._skip(root, folder, f"{SKILL_FILE} is not UTF-8")
        except OSError as exc:
            return self._skip(root, folder, f"cannot read {SKILL_FILE} ({type(exc).__name__})")
        try:
            return parse_skill(text, folder, rank=rank, root=root.label)
        except InvalidSkillError as exc:
            return self._skip(root, folder, str(exc))

    @staticmethod
    def _skip(root: SkillRoot, folder: str, reason: str) -> None:
        # Root label and folder name locate the file for an operator without putting an
        # absolute path into logs that a bridge may forward.
        log.warning("skill skipped", root=root.label, skill=folder, reason=reason)
        return None
