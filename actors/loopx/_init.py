"""LoopX initialisation: the ``/loopx-init`` repair command and the start-up check.

One bounded sequence, shared by both entry points:

1. ``probe_cli``: find a usable CLI, in this order (the first usable one wins):

   a. an earlier managed install (``<agents-home>/runtime/dsh-loopx-plugin/bin/loopx``),
      run by the selected Python (see 2): the seed keeps the selected interpreter and
      launcher for every later call, so a healthy managed runtime wins over whatever
      ``loopx`` happens to be first on ``PATH``;
   b. ``loopx`` on the children's ``PATH``;
   c. ``<python> -m loopx.cli`` for ``PYTHON_BIN``, else for each ``python3``,
      ``python3.11`` ... ``python3.14`` on ``PATH`` (a LoopX installed into a Python
      whose scripts directory is not on ``PATH``).

   Usable means ``--version`` prints ``loopx X.Y.Z`` with X.Y.Z >= 0.5.4 *and* the
   read-only ``workflow-skills --skills-dir D --host-surface deepseek-harness-native``
   inspection answers the install schema. A usable CLI is kept as it is, never upgraded.
   A probe that times out fails here: a slow CLI is no evidence of a broken one, so it
   does not trigger an install.
2. ``install_cli`` (only when no usable CLI was found): one fixed-argv private install
   ``<python> -m pip install --upgrade --target <site-packages> loopx>=0.5.4`` and a
   managed launcher beside it. The interpreter is ``PYTHON_BIN`` when set, else the first
   of ``python3``, ``python3.11`` ... ``python3.14`` on ``PATH`` that reports Python >=
   3.11 *and* runs ``-m pip --version`` (a Python without pip cannot install anything:
   it is passed over, and when none is left the outcome says so: ``no_pip``). Never
   ``--break-system-packages``; never retried.
3. ``resolve_cli``: probe the managed launcher again; fail if it is still unusable.
4. ``install_skills``: ``workflow-skills --install --skills-dir <agents-home>/skills
   --host-surface deepseek-harness-native`` (with ``--cli-bin`` naming the CLI that was
   found, shell-quoted -- the managed launcher, or ``<python> -m loopx.cli`` -- so
   generated skill commands run the same CLI). Every packaged-skill status must be
   ``created|updated|unchanged``, ``loopx-project`` (the skill the generated entry sends
   the model to for everything advanced) must be among them, and the entry's status
   must be ``created|updated|unchanged|upgraded_legacy_managed``; anything missing or
   unknown fails closed. Never retried.
5. ``readback``: the read-only inspection must report the managed install ready with
   nothing left to install.

At most one package install and one skill install run per execution. Cancellation is
never swallowed: every child runs in the caller's cancel scope through the runtime's child
runner (``runtime._process``), and it and everything it started are killed and waited for.
Every child gets a LoopX child's environment (``runtime.loopx._client.loopx_env``),
never the runtime's API keys; the package install also gets pip's settings, proxies and
CA bundles.

Everything an :class:`InitOutcome` says is built from fixed phrases, stage and kind tokens
and a parsed version number: no subprocess output and no local paths reach a summary, a
followup or a log line.
"""

from __future__ import annotations

import functools
import math
import os
import re
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar, TypeVarTuple, Unpack

import attrs
import trio

from loopdock.runtime import Completed, Message, ProducerSource, TextBlock, get_logger, pick_env, run_child
from loopdock.runtime.loopx import (
    MAX_STDERR_BYTES,
    MAX_STDOUT_BYTES,
    LoopxClient,
    LoopxFailure,
    LoopxVersion,
    MalformedOutput,
    SkillsResult,
    TransportFailure,
    loopx_env,
)

from .._commands import Command, CommandContext, CommandResult

__all__ = [
    "INIT_COMMAND_NAME",
    "INIT_SOURCE_KIND",
    "INIT_USAGE",
    "MIN_LOOPX_VERSION",
    "LOOPX_REQUIREMENT",
    "InitOutcome",
    "InitSettings",
    "initialize",
    "loopx_init_command",
    "run_loopx_init",
    "startup_initialize",
]

log = get_logger(__name__)

#: The producer-owned source of both init followups (never the driver's
#: ``loopx-continuation``, never a human kind): ordinary competing input, no reservation.
INIT_SOURCE_KIND = "dsh-loopx-plugin/init-command"
INIT_COMMAND_NAME = "loopx-init"
INIT_USAGE = "usage: /loopx-init (takes no arguments)"
#: The first release whose workflow skills survive a ``pip --target`` install.
MIN_LOOPX_VERSION = (0, 5, 4)
LOOPX_REQUIREMENT = "loopx>=0.5.4"
PYTHON_CANDIDATES = ("python3", "python3.11", "python3.12", "python3.13", "python3.14")
MIN_PYTHON = (3, 11)
#: The packaged skill the generated ``loopx`` entry depends on ("use the installed
#: loopx-project Skill for advanced operations"): an install that does not report it
#: has not installed what the entry needs.
REQUIRED_SKILLS = frozenset({"loopx-project"})

PACKAGED_STATUSES = frozenset({"created", "updated", "unchanged"})
ENTRY_STATUSES = frozenset({"created", "updated", "unchanged", "upgraded_legacy_managed"})
_CHANGED_PACKAGED = frozenset({"created", "updated"})
_CHANGED_ENTRY = frozenset({"created", "updated", "upgraded_legacy_managed"})

Stage = Literal["probe_cli", "install_cli", "resolve_cli", "install_skills", "readback"]

# How many interpreters (python3, python3.11, ... on PATH) an initialisation considers.
_MAX_PYTHON_PROBES = 8
# What pip needs on top of a LoopX child's environment to reach its index: its own
# settings, proxies and CA bundles. Only the package install gets these.
_PIP_ENV_NAMES = frozenset(
    {
        "http_proxy", "https_proxy", "no_proxy", "all_proxy",
        "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY",
        "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE",
    }
)
_PIP_ENV_PREFIXES = ("PIP_",)
_PYTHON_VERSION = re.compile(r"^(\d+)\.(\d+)$")
_PLUGIN_DIR = ("runtime", "dsh-loopx-plugin")

_T = TypeVar("_T")
_Args = TypeVarTuple("_Args")


# -- Settings and outcome ---------------------------------------------------------------------


def _positive(_: Any, attribute: attrs.Attribute[Any], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{attribute.name} must be a positive number of seconds")


def _frozen_env(value: Mapping[str, str]) -> Mapping[str, str]:
    return dict(value)


@attrs.frozen
class InitSettings:
    """Where and how to initialise LoopX.

    ``agents_home``: skills go to ``<agents_home>/skills``, the managed install to
    ``<agents_home>/runtime/dsh-loopx-plugin/site-packages`` with its launcher at
    ``.../dsh-loopx-plugin/bin/loopx``. ``env`` is where every child's environment is
    picked from (``PATH`` decides which ``loopx`` and which Python are found).
    ``python_bin`` is ``PYTHON_BIN``. ``project`` is the cwd of every call. ``timeout``
    bounds each CLI call, ``pip_timeout`` the package install.
    """

    agents_home: Path = attrs.field(converter=Path)
    env: Mapping[str, str] = attrs.field(converter=_frozen_env, hash=False)
    project: Path = attrs.field(converter=Path)
    python_bin: str | None = None
    timeout: float = attrs.field(default=60.0, validator=_positive)
    pip_timeout: float = attrs.field(default=600.0, validator=_positive)

    @classmethod
    def from_env(
        cls, env: Mapping[str, str], project: Path, *, timeout: float = 60.0, pip_timeout: float = 600.0
    ) -> InitSettings:
        """``agents_home`` from ``$DSH_AGENTS_HOME``, else ``$HOME/.agents`` (``HOME`` read
        from ``env``); ``python_bin`` from ``$PYTHON_BIN``."""
        raw = env.get("DSH_AGENTS_HOME") or ""
        if raw:
            agents_home = Path(raw).expanduser()
        else:
            home = env.get("HOME") or str(Path.home())
            agents_home = Path(home) / ".agents"
        return cls(
            agents_home=agents_home,
            env=env,
            project=project,
            python_bin=env.get("PYTHON_BIN") or None,
            timeout=timeout,
            pip_timeout=pip_timeout,
        )

    @property
    def skills_dir(self) -> Path:
        return self.agents_home / "skills"

    @property
    def plugin_dir(self) -> Path:
        return self.agents_home.joinpath(*_PLUGIN_DIR)

    @property
    def site_packages(self) -> Path:
        return self.plugin_dir / "site-packages"

    @property
    def launcher(self) -> Path:
        return self.plugin_dir / "bin" / "loopx"


@attrs.frozen
class InitOutcome:
    """The typed facts of one initialisation.

    ``stage`` and ``kind`` say where and why it failed (both ``None`` on success).
    ``command`` is the argv prefix to run LoopX with from now on (``(python, launcher)`` of
    the managed install, the healthy ``loopx`` found on ``PATH``, or ``(python, "-m",
    "loopx.cli")``), ``None`` when no usable CLI was established. ``summary`` is short and safe to show anywhere.
    """

    ok: bool
    stage: str | None
    kind: str | None
    skills_changed: bool
    installed_cli: bool
    command: tuple[str, ...] | None
    summary: str
    version: str | None = None

    def data(self) -> dict[str, Any]:
        """The command result's ``data``."""
        return {
            "stage": self.stage,
            "kind": self.kind,
            "skillsChanged": self.skills_changed,
            "installedCli": self.installed_cli,
        }


# -- Safe phrases -------------------------------------------------------------------------------

_STAGE_PHRASES = {
    "probe_cli": "checking the LoopX CLI",
    "install_cli": "installing a private LoopX CLI",
    "resolve_cli": "starting the newly installed LoopX CLI",
    "install_skills": "installing the DSH workflow skills",
    "readback": "reading back the installed workflow skills",
}
_KIND_HINTS = {
    "missing": "no LoopX CLI could be found",
    "incompatible": "the LoopX CLI is older than 0.5.4 or cannot install DSH-native workflow skills",
    "timeout": "a LoopX step did not finish in time",
    "transport": "the LoopX command ended without an answer",
    "malformed": "LoopX gave an answer that cannot be trusted",
    "refused": "LoopX refused the request",
    "user_skill_file": "a user-owned loopx skill file is in the way and was left untouched",
    "missing_status": "LoopX did not report a status for every skill",
    "unknown_status": "LoopX reported a skill status that is not recognised",
    "not_ready": "the workflow skills did not read back as ready",
    "no_python": "no Python 3.11 or newer was found; set PYTHON_BIN",
    "no_pip": (
        "no Python 3.11 or newer that can run pip was found ('python -m pip --version' failed); "
        "install pip for it or set PYTHON_BIN to a Python that has pip"
    ),
    "python_too_old": "the Python named by PYTHON_BIN is older than 3.11",
    "python_unavailable": "the selected Python could not be started",
    "pip_failed": "pip could not install loopx>=0.5.4; check Python, pip and network access",
    "launcher_failed": "the managed LoopX launcher could not be written",
    "no_project": "the project directory does not exist",
    "unexpected": "an unexpected error occurred",
}


def _failure_summary(stage: str, kind: str) -> str:
    phrase = _STAGE_PHRASES.get(stage, "initialising LoopX")
    hint = _KIND_HINTS.get(kind, "the step failed")
    return f"LoopX initialization failed while {phrase} ({kind}): {hint}. Run /loopx-init to try again."


def _success_summary(version: str, installed_reason: str | None, skills_changed: bool) -> str:
    cli = f"LoopX CLI {version} is ready"
    if installed_reason is not None:
        cli += f" (a private copy was installed because the CLI was {installed_reason})"
    skills = "were installed or updated" if skills_changed else "are up to date"
    return f"{cli}; the DSH workflow skills {skills}."


# -- Processes ----------------------------------------------------------------------------------


async def _run(argv: list[str], env: Mapping[str, str], cwd: Path) -> Completed | Literal["spawn"]:
    """One child through the runtime's child runner (its whole tree killed however it
    ends, output capped like a LoopX call's); callers bound it with ``move_on_after``."""
    try:
        return await run_child(argv, cwd=cwd, env=env, max_stdout=MAX_STDOUT_BYTES, max_stderr=MAX_STDERR_BYTES)
    except OSError:
        return "spawn"


def _child_env(settings: InitSettings) -> dict[str, str]:
    """A LoopX child's environment: never the runtime's API keys."""
    return loopx_env(settings.env)


def _pip_env(settings: InitSettings) -> dict[str, str]:
    return {
        **_child_env(settings),
        **pick_env(settings.env, _PIP_ENV_NAMES, _PIP_ENV_PREFIXES),
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }


def _which(name: str, settings: InitSettings) -> str | None:
    return shutil.which(name, path=settings.env.get("PATH", os.defpath))


def _candidates_on_path(name: str, settings: InitSettings) -> list[str]:
    """Every executable called ``name`` on the children's PATH, in PATH order."""
    found = []
    for folder in settings.env.get("PATH", os.defpath).split(os.pathsep):
        if not folder:
            continue
        candidate = os.path.join(folder, name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            found.append(candidate)
    return found


async def _lookup(function: Callable[[Unpack[_Args]], _T], *args: Unpack[_Args]) -> _T:
    """``function(*args)``, a look-up on the disk, in a worker thread; a cancelled caller
    does not wait for a filesystem that does not answer."""
    return await trio.to_thread.run_sync(function, *args, abandon_on_cancel=True)


async def _python_version(python: str, settings: InitSettings) -> tuple[int, int] | None:
    """``(major, minor)`` of ``python``, or ``None`` if it cannot be started or asked."""
    with trio.move_on_after(settings.timeout):  # one that does not answer in time is not usable
        outcome = await _run(
            [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            _child_env(settings),
            settings.project,
        )
        if isinstance(outcome, str) or outcome.returncode != 0 or outcome.overflow is not None:
            return None
        lines = outcome.stdout.decode("utf-8", "replace").strip().splitlines()
        match = _PYTHON_VERSION.fullmatch(lines[-1].strip()) if lines else None
        return (int(match[1]), int(match[2])) if match is not None else None
    return None


async def _has_pip(python: str, settings: InitSettings) -> bool:
    """``python -m pip --version`` works: this interpreter can run the install."""
    with trio.move_on_after(settings.timeout):
        outcome = await _run([python, "-m", "pip", "--version"], _pip_env(settings), settings.project)
        return not isinstance(outcome, str) and outcome.returncode == 0 and outcome.overflow is None
    return False


@attrs.frozen
class _NoPython:
    kind: str  # no_python | no_pip | python_unavailable | python_too_old


class _Pythons:
    """The interpreters one initialisation may use; the installer is chosen (probed) once."""

    def __init__(self, settings: InitSettings) -> None:
        self.settings = settings
        self._chosen: str | _NoPython | None = None

    async def named(self) -> list[str]:
        """:meth:`_named`, looked up in a worker thread."""
        return await _lookup(self._named)

    def _named(self) -> list[str]:
        """``PYTHON_BIN`` alone when it is set (resolved on ``PATH`` when it is a bare
        name; empty when it is not found there), else every ``python3`` /
        ``python3.11`` ... ``python3.14`` on ``PATH``, in that order, at most
        ``_MAX_PYTHON_PROBES``. Names in one directory for one interpreter (``python3``
        and ``python3.11`` in ``/usr/bin``) count once; the same interpreter in another
        directory (a virtual environment's ``bin``) is another environment, with its own
        packages (pip among them), so it counts on its own."""
        settings = self.settings
        if settings.python_bin:
            if os.sep in settings.python_bin:
                return [settings.python_bin]
            found = _which(settings.python_bin, settings)
            return [found] if found is not None else []
        named: list[str] = []
        seen: set[tuple[str, str]] = set()
        for name in PYTHON_CANDIDATES:
            for candidate in _candidates_on_path(name, settings):
                key = (os.path.dirname(os.path.abspath(candidate)), os.path.realpath(candidate))
                if key not in seen and len(named) < _MAX_PYTHON_PROBES:
                    seen.add(key)
                    named.append(candidate)
        return named

    async def installer(self) -> str | _NoPython:
        """The Python that installs (and runs) the managed CLI: ``PYTHON_BIN`` when set,
        else the first candidate that is 3.11 or newer and runs pip; or why there is
        none."""
        if self._chosen is None:
            self._chosen = await self._choose()
        return self._chosen

    async def _choose(self) -> str | _NoPython:
        settings = self.settings
        named = await self.named()
        if settings.python_bin:
            if not named:
                return _NoPython("python_unavailable")
            version = await _python_version(named[0], settings)
            if version is None:
                return _NoPython("python_unavailable")
            if version < MIN_PYTHON:
                return _NoPython("python_too_old")
            return named[0] if await _has_pip(named[0], settings) else _NoPython("no_pip")
        recent = False
        for candidate in named:
            version = await _python_version(candidate, settings)
            if version is None or version < MIN_PYTHON:
                continue
            recent = True
            if await _has_pip(candidate, settings):
                return candidate
            log.info("loopx init passes over a python without pip")
        return _NoPython("no_pip" if recent else "no_python")


# -- The CLI probe ------------------------------------------------------------------------------


@attrs.frozen
class _Cli:
    command: tuple[str, ...]
    version: LoopxVersion
    cli_argv: tuple[str, ...] | None  # the skills' command, as --cli-bin (None: LoopX's "loopx")


@attrs.frozen
class _Unusable:
    kind: str  # missing | incompatible | timeout


def _client(command: tuple[str, ...], settings: InitSettings) -> LoopxClient:
    return LoopxClient(command, project=settings.project, env=_child_env(settings), timeout=settings.timeout)


def _transport_kind(result: TransportFailure) -> str:
    return "timeout" if result.kind == "timeout" else "transport"


async def _probe(command: tuple[str, ...], cli_argv: tuple[str, ...] | None, settings: InitSettings) -> _Cli | _Unusable:
    client = _client(command, settings)
    version = await client.version(retry=False)
    if isinstance(version, TransportFailure):
        if version.kind == "timeout":
            return _Unusable("timeout")
        return _Unusable("missing" if version.kind == "spawn" else "incompatible")
    if isinstance(version, MalformedOutput) or version.parts < MIN_LOOPX_VERSION:
        return _Unusable("incompatible")
    inspection = await client.workflow_skills(settings.skills_dir, install=False, cli_argv=cli_argv)
    if isinstance(inspection, TransportFailure) and inspection.kind == "timeout":
        return _Unusable("timeout")
    if not isinstance(inspection, SkillsResult):
        return _Unusable("incompatible")
    host = inspection.payload.get("host_surface")
    if inspection.operation != "inspect" or inspection.install_required is None or host not in (None, "deepseek-harness-native"):
        return _Unusable("incompatible")
    return _Cli(command, version, cli_argv)


def _shell_words(argv: tuple[str, ...]) -> tuple[str, ...] | None:
    """``argv`` as the skills' command: LoopX pastes ``--cli-bin`` verbatim into the shell
    commands of the skills it writes, so the client passes it shell-quoted (an agents home
    with a space stays one word). ``None`` for a word no shell word can carry."""
    if any(ord(ch) < 32 or ord(ch) == 127 for word in argv for ch in word):
        return None
    return argv


def _launcher_text(python: str, site_packages: Path) -> str:
    shebang = f"#!{python}\n" if not any(ch.isspace() for ch in python) else "#!/usr/bin/env python3\n"
    return (
        shebang
        + "# Managed by loopdock's /loopx-init: runs the private LoopX install beside this directory.\n"
        + "import runpy\n"
        + "import sys\n\n"
        + f"sys.path.insert(0, {str(site_packages)!r})\n"
        + 'runpy.run_module("loopx.cli", run_name="__main__")\n'
    )


def _write_launcher(python: str, settings: InitSettings) -> None:
    launcher = settings.launcher
    launcher.parent.mkdir(parents=True, exist_ok=True)
    partial = launcher.with_name(f".{launcher.name}.{os.getpid()}.tmp")
    partial.write_text(_launcher_text(python, settings.site_packages), encoding="utf-8")
    os.chmod(partial, 0o755)
    os.replace(partial, launcher)


# -- The sequence -------------------------------------------------------------------------------


@attrs.define
class _Progress:
    stage: Stage = "probe_cli"
    installed_cli: bool = False
    command: tuple[str, ...] | None = None


def _fail(progress: _Progress, kind: str, stage: Stage | None = None) -> InitOutcome:
    stage = stage or progress.stage
    return InitOutcome(
        ok=False,
        stage=stage,
        kind=kind,
        skills_changed=False,
        installed_cli=progress.installed_cli,
        command=progress.command,
        summary=_failure_summary(stage, kind),
    )


def _skills_failure_kind(result: TransportFailure | MalformedOutput | LoopxFailure) -> str:
    if isinstance(result, TransportFailure):
        return _transport_kind(result)
    if isinstance(result, MalformedOutput):
        return "malformed"
    entry = result.payload.get("entry")
    if isinstance(entry, Mapping) and entry.get("status") == "skipped_user_file":
        return "user_skill_file"
    return "refused"


def _install_statuses(result: SkillsResult) -> str | bool:
    """skillsChanged when every status is known and every required skill has one; else
    the failure kind."""
    if result.operation != "install" or not result.installed or result.entry_status is None:
        return "missing_status"
    if not REQUIRED_SKILLS <= result.installed.keys():
        return "missing_status"
    if not set(result.installed.values()) <= PACKAGED_STATUSES or result.entry_status not in ENTRY_STATUSES:
        return "unknown_status"
    return bool(set(result.installed.values()) & _CHANGED_PACKAGED) or result.entry_status in _CHANGED_ENTRY


async def _initialize(settings: InitSettings, progress: _Progress) -> InitOutcome:
    progress.stage = "probe_cli"
    if not await _lookup(settings.project.is_dir):
        return _fail(progress, "no_project")

    pythons = _Pythons(settings)
    cli: _Cli | None = None
    reason = "missing"

    # a. An earlier managed install, run by the selected Python, wins when it is healthy.
    if await _lookup(settings.launcher.is_file):
        python = await pythons.installer()
        if isinstance(python, str):
            managed = (python, str(settings.launcher))
            probe = await _probe(managed, _shell_words((str(settings.launcher),)), settings)
            if isinstance(probe, _Unusable) and probe.kind == "timeout":
                return _fail(progress, "timeout")
            if isinstance(probe, _Cli):
                cli = probe

    # b. loopx on PATH.
    if cli is None:
        found = await _lookup(_which, "loopx", settings)
        if found is not None:
            probe = await _probe((found,), None, settings)
            if isinstance(probe, _Unusable) and probe.kind == "timeout":
                return _fail(progress, "timeout")
            if isinstance(probe, _Cli):
                cli = probe
            else:
                reason = probe.kind

    # c. python -m loopx.cli: a LoopX installed where no script of it is on PATH.
    if cli is None:
        for candidate in await pythons.named():
            module = (candidate, "-m", "loopx.cli")
            words = _shell_words(module)
            if words is None:
                continue  # the skills could not name it
            probe = await _probe(module, words, settings)
            if isinstance(probe, _Unusable) and probe.kind == "timeout":
                return _fail(progress, "timeout")
            if isinstance(probe, _Cli):
                cli = probe
                break

    installed_reason: str | None = None
    if cli is None:
        progress.stage = "install_cli"
        installed_reason = reason
        python = await pythons.installer()
        if isinstance(python, _NoPython):
            return _fail(progress, python.kind)
        try:
            await trio.to_thread.run_sync(functools.partial(settings.site_packages.mkdir, parents=True, exist_ok=True))
        except OSError:
            return _fail(progress, "launcher_failed")
        argv = [python, "-m", "pip", "install", "--upgrade", "--target", str(settings.site_packages), LOOPX_REQUIREMENT]
        log.info("loopx init installing the cli", reason=reason)
        with trio.move_on_after(settings.pip_timeout) as pip_deadline:
            outcome = await _run(argv, _pip_env(settings), settings.plugin_dir)
        if pip_deadline.cancelled_caught:
            return _fail(progress, "timeout")
        if outcome == "spawn":
            return _fail(progress, "python_unavailable")
        if outcome.returncode != 0 or outcome.overflow is not None:
            log.warning("loopx init pip install failed", returncode=outcome.returncode, overflow=outcome.overflow)
            return _fail(progress, "pip_failed")
        try:
            await trio.to_thread.run_sync(_write_launcher, python, settings)
        except OSError:
            return _fail(progress, "launcher_failed")
        progress.installed_cli = True

        progress.stage = "resolve_cli"
        probe = await _probe((python, str(settings.launcher)), _shell_words((str(settings.launcher),)), settings)
        if isinstance(probe, _Unusable):
            return _fail(progress, probe.kind)
        cli = probe

    progress.command = cli.command
    client = _client(cli.command, settings)

    progress.stage = "install_skills"
    installed = await client.workflow_skills(settings.skills_dir, install=True, cli_argv=cli.cli_argv)
    if not isinstance(installed, SkillsResult):
        return _fail(progress, _skills_failure_kind(installed))
    changed = _install_statuses(installed)
    if isinstance(changed, str):
        return _fail(progress, changed)

    progress.stage = "readback"
    readback = await client.workflow_skills(settings.skills_dir, install=False, cli_argv=cli.cli_argv)
    if not isinstance(readback, SkillsResult):
        return _fail(progress, _skills_failure_kind(readback))
    if readback.operation != "inspect" or readback.ready is not True or readback.install_required is not False:
        return _fail(progress, "not_ready")

    return InitOutcome(
        ok=True,
        stage=None,
        kind=None,
        skills_changed=changed,
        installed_cli=progress.installed_cli,
        command=cli.command,
        summary=_success_summary(cli.version.version, installed_reason, changed),
        version=cli.version.version,
    )


async def initialize(settings: InitSettings) -> InitOutcome:
    """Run the bounded sequence once and return its typed outcome. Raises only on
    cancellation (or on a bug: see :func:`startup_initialize` for the guarded form)."""
    outcome = await _initialize(settings, _Progress())
    _log_outcome("loopx init finished", outcome)
    return outcome


async def _guarded(settings: InitSettings) -> InitOutcome:
    progress = _Progress()
    try:
        outcome = await _initialize(settings, progress)
    except Exception as exc:  # trio.Cancelled is a BaseException: it goes through
        log.warning("loopx init failed unexpectedly", stage=progress.stage, error=type(exc).__name__)
        outcome = _fail(progress, "unexpected")
    return outcome


async def startup_initialize(settings: InitSettings) -> InitOutcome:
    """The same sequence at start-up: no followups, no model calls, never raises except
    on cancellation; any failure becomes a safe outcome with a stage and a kind."""
    outcome = await _guarded(settings)
    _log_outcome("loopx startup init finished", outcome)
    return outcome


def _log_outcome(event: str, outcome: InitOutcome) -> None:
    method = log.info if outcome.ok else log.warning
    method(
        event,
        ok=outcome.ok,
        stage=outcome.stage,
        kind=outcome.kind,
        skills_changed=outcome.skills_changed,
        installed_cli=outcome.installed_cli,
    )


# -- The /loopx-init command --------------------------------------------------------------------

_NO_TOOLS = (
    "Do not call tools, run commands, reinstall anything or expand on diagnostics; "
    "reply to the user in one or two short sentences."
)
START_TEXT = (
    "Welcome to LoopX. The LoopX CLI and the DSH workflow skills are being checked now, "
    "and installed if they are missing or out of date; a second message will report the result. "
    + _NO_TOOLS
)


def _result_text(outcome: InitOutcome) -> str:
    if outcome.ok:
        return (
            f"LoopX initialization finished: {outcome.summary} "
            "The user can now start work with /loopx followed by a task. " + _NO_TOOLS
        )
    return (
        f"LoopX initialization did not finish: {outcome.summary} "
        "The user can run /loopx-init again after fixing the cause. " + _NO_TOOLS
    )


def _init_message(text: str, fields: Mapping[str, object]) -> Message:
    return Message("user", (TextBlock(text),), ProducerSource(INIT_SOURCE_KIND, fields))


class InitTarget(Protocol):
    """The agent a ``/loopx-init`` runs for: a runtime ``AgentActor``, or the proxy of a
    DSH agent (``bridge.DshAgent``) when a DSH user runs the command through the plugin."""

    @property
    def id(self) -> str: ...

    def followup(self, message: Message) -> object: ...


def _queue_followup(target: InitTarget, message: Message, phase: str) -> None:
    # Queued once: a failure is logged and never retried, and never changes the result.
    try:
        target.followup(message)
    except Exception as exc:
        log.warning("loopx init followup not queued", phase=phase, agent_id=target.id, error=type(exc).__name__)


async def run_loopx_init(
    target: InitTarget,
    args: str,
    settings: Callable[[], InitSettings],
    *,
    on_success: Callable[[InitOutcome], None] | None = None,
) -> CommandResult:
    """One ``/loopx-init`` for ``target``: usage error for any argument (before any
    followup or probe); else a start followup, the sequence, and -- unless cancelled --
    one result followup built from the typed outcome. The returned :class:`CommandResult`
    is authoritative. ``settings()`` is asked for after the usage check. ``on_success`` receives a successful outcome (to adopt
    ``outcome.command``) before the result followup is queued."""
    if not isinstance(args, str) or args.strip():
        return CommandResult(
            False,
            INIT_USAGE,
            {"stage": None, "kind": "usage", "skillsChanged": False, "installedCli": False},
        )
    chosen = settings()
    _queue_followup(target, _init_message(START_TEXT, {"phase": "start"}), "start")
    outcome = await _guarded(chosen)
    _log_outcome("loopx init command finished", outcome)
    if outcome.ok and on_success is not None:
        try:
            on_success(outcome)
        except Exception as exc:
            log.warning("loopx init on_success failed", error=type(exc).__name__)
    _queue_followup(target, _init_message(_result_text(outcome), {"phase": "result", "ok": outcome.ok}), "result")
    return CommandResult(outcome.ok, outcome.summary, outcome.data())


def loopx_init_command(
    settings_for: Callable[[CommandContext], InitSettings],
    *,
    on_success: Callable[[InitOutcome], None] | None = None,
) -> Command:
    """``/loopx-init`` as a runtime command (see :func:`run_loopx_init`)."""

    async def run(ctx: CommandContext, args: str) -> CommandResult:
        return await run_loopx_init(ctx.agent, args, lambda: settings_for(ctx), on_success=on_success)

    return Command(
        INIT_COMMAND_NAME,
        "Check or install the LoopX CLI and the DSH workflow skills (takes no arguments)",
        run,
    )
