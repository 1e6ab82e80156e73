"""``/loopx-init`` and start-up initialisation (the seed's Verification bullets).

The real loopx 2.1.1 CLI (and one real ``pip install --target``) drives the healthy,
install, status and readback paths; a logging wrapper around the real executables counts
calls without changing what they do. Stand-in executables are used only to inject faults:
an old CLI, a failing pip, unknown skill statuses, a readback that is not ready, a hang.
"""

import json
import os
import re
import shlex
import stat
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
import structlog
import trio
import trio.testing

from loopdock import CommandContext, CommandResult, Runtime
from loopdock.actors.loopx import (
    INIT_SOURCE_KIND,
    InitOutcome,
    InitSettings,
    _init,
    initialize,
    loopx_init_command,
    startup_initialize,
)
from loopdock.runtime._errors import AgentClosedError
from loopdock.runtime._messages import ProducerSource, is_human
from loopdock.runtime._serde import message_from_wire
from loopdock.runtime.loopx._client import SKILL_INSTALL_SCHEMA, SkillsResult
from loopdock.runtime.models import Reply, ScriptedAdapter
from loopdock.runtime.skills import SkillCatalog

PY = sys.executable
REAL_LOOPX = str(Path(PY).parent / "loopx")
HOST = "deepseek-harness-native"
SCRIPTED = {"provider": "scripted", "model": "script-1"}
PIP_ARGV_TAIL = ["-m", "pip", "install", "--upgrade", "--target"]
REAL_TIMEOUT = 120  # a few real loopx calls, ~1 s each
FAST_TIMEOUT = 30  # stand-ins only
NOISE = "NOISY-OUTPUT"

# -- Executables written into tmp_path ---------------------------------------------------------


def write_script(path: Path, body: str) -> Path:
    # -I -S: the scripts need only the standard library, and start faster without site.
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!{PY} -IS\n{body}", encoding="utf-8")
    path.chmod(0o755)
    return path


async def fresh_python(venv: Path, *, pip: bool = True) -> str:
    """A real Python of its own (a new virtual environment: with pip, or without), with no
    LoopX in it; its interpreter's path."""
    with trio.fail_after(300):
        await trio.run_process([PY, "-m", "venv", *([] if pip else ["--without-pip"]), str(venv)])
    return str(venv / "bin" / "python")


def read_log(path: Path) -> list:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


# A wrapper that logs its argv and then becomes the real program: counts real calls.
WRAPPER = """
import json, os, sys
with open(LOG, "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
os.execv(REAL, [REAL, *sys.argv[1:]])
"""


def wrapper(path: Path, real: str, log: Path) -> Path:
    return write_script(path, f"LOG = {str(log)!r}\nREAL = {real!r}\n{WRAPPER}")


# A fault-injecting python: answers `-c` version probes and `-m pip --version` (it has
# pip unless `pip_version_exit` says otherwise), has no `loopx.cli` module (unless
# `loopx_exit` says otherwise), fails (or fakes) `-m pip install`, and makes noise on
# stderr (with its own absolute path) that must never surface.
PYTHON_STANDIN = """
import json, os, sys
config = json.load(open(CONFIG))
with open(config["log"], "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
args = sys.argv[1:]
sys.stderr.write("NOISY-OUTPUT from " + os.path.abspath(__file__) + "\\n")
if args[:1] == ["-c"]:
    print(config.get("version", "3.12"))
    sys.exit(0)
if args == ["-m", "pip", "--version"]:
    print("pip 24.0 NOISY-OUTPUT from " + os.path.abspath(__file__))
    sys.exit(config.get("pip_version_exit", 0))
if args[:2] == ["-m", "loopx.cli"]:
    sys.stderr.write("No module named loopx\\n")
    sys.exit(config.get("loopx_exit", 1))
if args[:2] == ["-m", "pip"]:
    print("NOISY-OUTPUT pip says " + os.path.abspath(__file__))
    sys.exit(config.get("pip_exit", 1))
sys.exit(config.get("other_exit", 0))
"""


def python_standin(path: Path, log: Path, **config) -> Path:
    cfg = path.with_name(path.name + ".json")
    path.parent.mkdir(parents=True, exist_ok=True)
    cfg.write_text(json.dumps({"log": str(log), **config}))
    return write_script(path, f"CONFIG = {str(cfg)!r}\n{PYTHON_STANDIN}")


# A fault-injecting loopx. `answers` maps a step (version, probe, install, readback) to
# {exit, stdout (str or JSON object), hang}; the readback is any inspection after an install.
LOOPX_STANDIN = """
import json, os, sys, time
config = json.load(open(CONFIG))
with open(config["log"], "a") as f:
    f.write(json.dumps({"argv": sys.argv[1:], "pid": os.getpid()}) + "\\n")
args = sys.argv[1:]
installed = config["log"] + ".installed"
if args == ["--version"]:
    step = "version"
else:
    while args and args[0] in ("--registry", "--runtime-root", "--format"):
        args = args[2:]
    if args[:1] != ["workflow-skills"]:
        step = "other"
    elif "--install" in args:
        step = "install"
        open(installed, "w").close()
    else:
        step = "readback" if os.path.exists(installed) else "probe"
answer = config["answers"].get(step, {"exit": 2, "stdout": ""})
sys.stderr.write("NOISY-OUTPUT from " + os.path.abspath(__file__) + "\\n")
if answer.get("hang"):
    with open(config["fifo"], "w") as f:
        f.write(step + "\\n")
    time.sleep(3600)
out = answer.get("stdout", "")
sys.stdout.write(out if isinstance(out, str) else json.dumps(out))
sys.stdout.write("\\n")
sys.exit(answer.get("exit", 0))
"""


def skills_payload(operation: str, **fields) -> dict:
    return {"ok": True, "schema_version": SKILL_INSTALL_SCHEMA, "operation": operation, "host_surface": HOST, **fields}


PROBE_OK = skills_payload("inspect", install_required=True, before={"ready": False}, entry={"skill_id": "loopx", "status": "would_create"})
INSTALL_OK = skills_payload(
    "install",
    installed={"loopx-project": "created", "loopx-pr-review": "unchanged"},
    entry={"skill_id": "loopx", "status": "created"},
    after={"ready": True},
)
READBACK_OK = skills_payload("inspect", install_required=False, before={"ready": True}, entry={"skill_id": "loopx", "status": "unchanged"})
HEALTHY = {
    "version": {"stdout": "loopx 2.1.1"},
    "probe": {"stdout": PROBE_OK},
    "install": {"stdout": INSTALL_OK},
    "readback": {"stdout": READBACK_OK},
}


def loopx_standin(bin_dir: Path, log: Path, fifo: Path | None = None, **answers) -> Path:
    cfg = bin_dir / "loopx-standin.json"
    bin_dir.mkdir(parents=True, exist_ok=True)
    cfg.write_text(json.dumps({"log": str(log), "fifo": str(fifo) if fifo else None, "answers": {**HEALTHY, **answers}}))
    return write_script(bin_dir / "loopx", f"CONFIG = {str(cfg)!r}\n{LOOPX_STANDIN}")


def pip_installs(log: Path) -> list[list[str]]:
    """The `-m pip install` calls a (logging) python was asked to run: the installs."""
    return [argv for argv in read_log(log) if argv[:3] == ["-m", "pip", "install"]]


def asked(log: Path) -> list[str]:
    """What a logging python was asked, one word per call: its version, whether it has pip,
    `-m loopx.cli`, a pip install (else the first two arguments)."""
    names = []
    for argv in read_log(log):
        if argv[:1] == ["-c"]:
            names.append("version")
        elif argv[:3] == ["-m", "pip", "--version"]:
            names.append("pip")
        elif argv[:3] == ["-m", "pip", "install"]:
            names.append("install")
        elif argv[:2] == ["-m", "loopx.cli"]:
            names.append("loopx")
        else:
            names.append(" ".join(argv[:2]))
    return names


def steps(log: Path) -> list[str]:
    """What a logging wrapper or stand-in was asked to do, one word per call."""
    names = []
    for entry in read_log(log):
        argv = entry["argv"] if isinstance(entry, dict) else entry
        if argv == ["--version"]:
            names.append("version")
        elif "workflow-skills" in argv:
            names.append("install" if "--install" in argv else "inspect")
        else:
            names.append(" ".join(argv[:3]))
    return names


@contextmanager
def fifo_stream(path: Path):
    """A named pipe the test reads and a stand-in writes when it starts hanging (an extra
    write end keeps the read end from seeing EOF before the stand-in opens it)."""
    os.mkfifo(path)
    read_fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    keep = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    stream = trio.lowlevel.FdStream(read_fd)
    try:
        yield stream
    finally:
        os.close(keep)
        stream.close()


# -- Environments and settings ------------------------------------------------------------------


@pytest.fixture
def jump_clock():
    """Real time, except that a test moves it past a timeout once it knows a stand-in hangs."""
    return trio.testing.MockClock(rate=1.0)



def child_env(loopx_env, *dirs, system: bool = True, **extra) -> dict[str, str]:
    """loopx_env or loopx_standin_env (tmp HOME, no usage ping) with PATH = dirs (+ /usr/bin:/bin), which never
    hold a loopx; PYTHON_BIN and DSH_AGENTS_HOME only when given."""
    env = dict(loopx_env)
    env.pop("PYTHON_BIN", None)
    env.pop("DSH_AGENTS_HOME", None)
    path = [str(d) for d in dirs] + (["/usr/bin", "/bin"] if system else [])
    env["PATH"] = os.pathsep.join(path)
    env.update(extra)
    return env


def make_settings(agents: Path, env, project: Path, *, python_bin=None, timeout=60.0) -> InitSettings:
    return InitSettings(
        agents_home=agents, env=env, project=project, python_bin=python_bin, timeout=timeout, pip_timeout=240.0
    )


_ABSOLUTE = re.compile(r"(?<![\w.])/(tmp|home|root|usr|opt|var|etc|bin)\b")


def assert_safe(text: str, *roots) -> None:
    """No local absolute path and no raw subprocess output in a user/model-facing text."""
    assert text
    for root in (*roots, PY, REAL_LOOPX, str(Path.home())):
        assert str(root) not in text, (root, text)
    assert not _ABSOLUTE.search(text), text
    assert NOISE not in text and "Traceback" not in text, text


async def init_messages(agent):
    """The (recorded) user messages of an agent's session, in order."""
    return [message_from_wire(e.data) for e in (await agent.session.read_events()) if e.type == "user/message"]


async def start_agent(rt, adapter, session_id="a1"):
    rt.register_adapter("scripted", adapter)
    return await rt.create_agent(session_id=session_id, agent_options=SCRIPTED)


# -- Settings --------------------------------------------------------------------------------------


def test_settings_from_env_follow_dsh_agents_home_then_home(tmp_path):
    project = tmp_path / "p"
    home_env = {"HOME": str(tmp_path / "h"), "PATH": "/usr/bin"}
    plain = InitSettings.from_env(home_env, project)
    assert plain.agents_home == tmp_path / "h" / ".agents"
    assert plain.skills_dir == tmp_path / "h" / ".agents" / "skills"
    assert plain.site_packages == tmp_path / "h" / ".agents" / "runtime" / "dsh-loopx-plugin" / "site-packages"
    assert plain.launcher == tmp_path / "h" / ".agents" / "runtime" / "dsh-loopx-plugin" / "bin" / "loopx"
    assert plain.python_bin is None and plain.project == project and plain.env == home_env

    dsh = InitSettings.from_env({**home_env, "DSH_AGENTS_HOME": str(tmp_path / "dsh"), "PYTHON_BIN": "python3.12"}, project)
    assert dsh.skills_dir == tmp_path / "dsh" / "skills"
    assert dsh.python_bin == "python3.12"
    with pytest.raises(ValueError):
        InitSettings(agents_home=tmp_path, env={}, project=project, timeout=0)


# -- Skill status projection (pure) ---------------------------------------------------------------


def skills_result(installed, entry, operation="install"):
    return SkillsResult(operation, installed, entry, None, True, {})


@pytest.mark.parametrize(
    ("installed", "entry", "expected"),
    [
        ({"loopx-project": "unchanged", "b": "unchanged"}, "unchanged", False),
        ({"loopx-project": "unchanged", "b": "created"}, "unchanged", True),
        ({"loopx-project": "updated"}, "unchanged", True),
        ({"loopx-project": "unchanged"}, "created", True),
        ({"loopx-project": "unchanged"}, "updated", True),
        ({"loopx-project": "unchanged"}, "upgraded_legacy_managed", True),
        ({"loopx-project": "unchanged"}, "skipped_user_file", "unknown_status"),
        ({"loopx-project": "would_create"}, "unchanged", "unknown_status"),
        ({"loopx-project": "unchanged", "b": "retired"}, "created", "unknown_status"),
        ({}, "created", "missing_status"),
        ({"loopx-project": "created"}, None, "missing_status"),
        # Every status known, but not the one for the skill the entry sends the model to.
        ({"loopx-pr-review": "created", "loopx-self-repair": "unchanged"}, "created", "missing_status"),
    ],
)
def test_every_status_is_validated_and_projected_to_skills_changed(installed, entry, expected):
    assert _init._install_statuses(skills_result(installed, entry)) == expected


def test_an_inspection_answer_to_an_install_is_missing_its_statuses():
    assert _init._install_statuses(skills_result({"loopx-project": "created"}, "created", operation="inspect")) == "missing_status"


# -- The real CLI: healthy skip, skills, statuses, readback -----------------------------------------


async def test_a_healthy_cli_is_kept_and_skills_install_and_hot_load(loopx_env, node22_bin, loopx_project, tmp_path):
    calls, pip_calls = tmp_path / "loopx.log", tmp_path / "python.log"
    bin_dir = tmp_path / "bin"
    loopx = wrapper(bin_dir / "loopx", REAL_LOOPX, calls)
    # PYTHON_BIN is a stand-in that fails: any install attempt would show up in its log.
    python = python_standin(tmp_path / "py" / "python", pip_calls)
    agents = tmp_path / "agents"
    settings = make_settings(agents, child_env(loopx_env, node22_bin, bin_dir), loopx_project, python_bin=str(python))
    catalog = SkillCatalog(None, agents_home=agents)
    await catalog.refreshed()
    assert catalog.names() == []

    with trio.fail_after(REAL_TIMEOUT):
        first = await initialize(settings)
    assert first == InitOutcome(
        ok=True,
        stage=None,
        kind=None,
        skills_changed=True,
        installed_cli=False,
        command=(str(loopx),),
        summary=first.summary,
        version="2.1.1",
    )
    assert steps(calls) == ["version", "inspect", "install", "inspect"]
    assert read_log(pip_calls) == []  # kept, not upgraded: no interpreter was even started
    assert not (agents / "runtime").exists()
    assert "2.1.1" in first.summary and "installed or updated" in first.summary
    assert_safe(first.summary, tmp_path, loopx_project)
    # The same catalog object sees the new skills at its next refresh (a model step's):
    # hot loading, no restart.
    await catalog.refreshed()
    names = catalog.names()
    assert {"loopx", "loopx-project", "loopx-pr-review", "loopx-self-repair"} <= set(names)
    entry = (agents / "skills" / "loopx" / "SKILL.md").read_text()
    assert f"--host-surface {HOST}" in entry and '--thread-id "$DSH_SESSION_ID"' in entry
    # The goal text comes from the visible task; $ARGUMENTS is only named to say DSH lacks it.
    assert "--goal-text=" in entry
    assert [line for line in entry.splitlines() if "$ARGUMENTS" in line] == [
        line for line in entry.splitlines() if "does not substitute a `$ARGUMENTS` placeholder" in line
    ]

    with trio.fail_after(REAL_TIMEOUT):
        second = await startup_initialize(settings)
    assert (second.ok, second.skills_changed, second.installed_cli, second.stage, second.kind) == (True, False, False, None, None)
    assert "up to date" in second.summary
    assert steps(calls)[4:] == ["version", "inspect", "install", "inspect"]
    assert read_log(pip_calls) == []


async def test_real_updated_and_legacy_statuses_count_as_changes_and_a_user_file_fails_closed(
    loopx_env, node22_bin, loopx_project, tmp_path
):
    calls = tmp_path / "loopx.log"
    bin_dir = tmp_path / "bin"
    wrapper(bin_dir / "loopx", REAL_LOOPX, calls)
    agents = tmp_path / "agents"
    skills = agents / "skills"
    settings = make_settings(agents, child_env(loopx_env, node22_bin, bin_dir), loopx_project)
    catalog = SkillCatalog(None, agents_home=agents)
    with trio.fail_after(REAL_TIMEOUT):
        assert (await initialize(settings)).skills_changed is True

        # A drifted packaged skill comes back `updated` (entry `unchanged`).
        project_skill = skills / "loopx-project" / "SKILL.md"
        pristine = project_skill.read_text()
        project_skill.write_text(pristine + "\nlocal drift\n")
        updated = await initialize(settings)
        assert (updated.ok, updated.skills_changed) == (True, True)
        assert project_skill.read_text() == pristine

        # A legacy LoopX entry without the managed marker is `upgraded_legacy_managed`.
        entry = skills / "loopx" / "SKILL.md"
        managed = entry.read_text()
        entry.write_text("---\nname: loopx\ndescription: old goal mode\n---\nRun goalmode_cmd.py\n")
        await catalog.refreshed()
        assert "goalmode_cmd.py" in catalog.get("loopx").body
        legacy = await initialize(settings)
        assert (legacy.ok, legacy.skills_changed) == (True, True)
        assert entry.read_text() == managed
        await catalog.refreshed()
        assert "goalmode_cmd.py" not in catalog.get("loopx").body  # reloaded without restart

        # A user-owned entry is left alone and the install fails closed.
        mine = "---\nname: loopx\ndescription: mine\n---\nMy own loopx notes.\n"
        entry.write_text(mine)
        before = len(steps(calls))
        refused = await initialize(settings)
    assert (refused.ok, refused.stage, refused.kind, refused.skills_changed) == (
        False, "install_skills", "user_skill_file", False,
    )
    assert refused.command == (str(bin_dir / "loopx"),)
    assert steps(calls)[before:] == ["version", "inspect", "install"]  # no readback, no retry
    assert entry.read_text() == mine
    assert_safe(refused.summary, tmp_path, loopx_project)


# -- The one real private install: missing CLI, kept managed CLI, incompatible CLI ------------------


async def test_missing_and_incompatible_cli_are_repaired_by_one_real_private_install(
    loopx_env, node22_bin, loopx_project, tmp_path
):
    pip_log = tmp_path / "python.log"
    # A real interpreter with pip and without LoopX (this one has LoopX: `-m loopx.cli`
    # would find it), counted.
    python = wrapper(tmp_path / "py" / "python", await fresh_python(tmp_path / "venv"), pip_log)
    old_log = tmp_path / "old-loopx.log"
    old_bin = tmp_path / "old-bin"
    loopx_standin(old_bin, old_log, version={"stdout": "loopx 0.4.0"})
    agents_a, agents_b = tmp_path / "agents-a", tmp_path / "agents-b"

    with trio.fail_after(300):
        # 1. No loopx anywhere on PATH: one pip install into the private target.
        missing = make_settings(agents_a, child_env(loopx_env, node22_bin), loopx_project, python_bin=str(python))
        first = await initialize(missing)
        launcher = agents_a / "runtime" / "dsh-loopx-plugin" / "bin" / "loopx"
        target = agents_a / "runtime" / "dsh-loopx-plugin" / "site-packages"
        assert (first.ok, first.installed_cli, first.skills_changed, first.stage) == (True, True, True, None)
        assert first.command == (str(python), str(launcher))
        assert "missing" in first.summary and "private copy" in first.summary
        assert_safe(first.summary, tmp_path, loopx_project)
        assert pip_installs(pip_log) == [[*PIP_ARGV_TAIL, str(target), "loopx>=0.5.4"]]
        # It had no LoopX of its own, it was checked for pip, and it installed (then it
        # ran the launcher).
        assert asked(pip_log)[:4] == ["loopx", "version", "pip", "install"]
        assert (target / "loopx" / "cli.py").is_file()
        assert stat.S_IMODE(launcher.stat().st_mode) == 0o755
        text = launcher.read_text()
        assert text.startswith(f"#!{python}\n") and 'runpy.run_module("loopx.cli", run_name="__main__")' in text
        with trio.fail_after(60):
            version = await trio.run_process(
                [str(python), str(launcher), "--version"], env=missing.env, capture_stdout=True, capture_stderr=True
            )
        assert version.stdout.decode().splitlines()[0] == "loopx 2.1.1"
        # Generated skill commands use the managed launcher.
        assert str(launcher) in (agents_a / "skills" / "loopx" / "SKILL.md").read_text()
        fresh = SkillCatalog(None, agents_home=agents_a)
        await fresh.refreshed()
        assert {"loopx", "loopx-project"} <= set(fresh.names())

        # 2. An old CLI on PATH now, but the managed install is healthy: kept, no pip.
        again = make_settings(agents_a, child_env(loopx_env, node22_bin, old_bin), loopx_project, python_bin=str(python))
        kept = await initialize(again)
        assert (kept.ok, kept.installed_cli, kept.skills_changed) == (True, False, False)
        assert kept.command == (str(python), str(launcher))
        assert len(pip_installs(pip_log)) == 1

        # 3. Only the old CLI (no managed install yet): incompatible -> one install.
        incompatible = make_settings(agents_b, again.env, loopx_project, python_bin=str(python))
        repaired = await initialize(incompatible)
    launcher_b = agents_b / "runtime" / "dsh-loopx-plugin" / "bin" / "loopx"
    assert (repaired.ok, repaired.installed_cli, repaired.skills_changed) == (True, True, True)
    assert repaired.command == (str(python), str(launcher_b))
    assert "incompatible" in repaired.summary
    pips = pip_installs(pip_log)
    assert pips[1:] == [[*PIP_ARGV_TAIL, str(agents_b / "runtime" / "dsh-loopx-plugin" / "site-packages"), "loopx>=0.5.4"]]
    assert "--break-system-packages" not in json.dumps(pips)
    # The old CLI was only ever asked its version: never used to install anything.
    assert set(steps(old_log)) == {"version"}


# -- Which CLI is used: the managed one, loopx on PATH, python -m loopx.cli -----------------------


async def test_a_healthy_managed_install_wins_over_a_loopx_on_path(loopx_env, node22_bin, loopx_project, tmp_path):
    # The seed keeps the selected interpreter and launcher for every later call: a managed
    # install that still works is used even with a healthy loopx first on PATH.
    calls = tmp_path / "loopx.log"
    bin_dir = tmp_path / "bin"
    on_path = wrapper(bin_dir / "loopx", REAL_LOOPX, calls)  # healthy, counted
    agents = tmp_path / "agents"
    settings = make_settings(agents, child_env(loopx_env, node22_bin, bin_dir), loopx_project, python_bin=PY)
    _init._write_launcher(PY, settings)  # a managed launcher; this interpreter has loopx
    with trio.fail_after(REAL_TIMEOUT):
        managed = await initialize(settings)
        assert (managed.ok, managed.installed_cli, managed.command) == (True, False, (PY, str(settings.launcher)))
        assert read_log(calls) == []  # the loopx on PATH was not even asked
        assert str(settings.launcher) in (agents / "skills" / "loopx" / "SKILL.md").read_text()

        # A managed launcher that no longer works is passed over: the loopx on PATH is kept.
        settings.launcher.write_text(f"#!{PY}\nraise SystemExit(3)\n")
        fallback = await initialize(settings)
    assert (fallback.ok, fallback.installed_cli, fallback.command) == (True, False, (str(on_path),))
    assert steps(calls) == ["version", "inspect", "install", "inspect"]


async def test_a_loopx_module_without_a_script_on_path_runs_as_python_m_loopx_cli(
    loopx_env, node22_bin, loopx_project, tmp_path
):
    # No `loopx` on PATH, but python3 has LoopX installed (its scripts directory is not on
    # PATH): `python3 -m loopx.cli` is that CLI, healthy, so nothing is installed. (An
    # install would fail here: pip may not reach any index.)
    log = tmp_path / "python.log"
    py_dir = tmp_path / "py"
    python3 = str(wrapper(py_dir / "python3", PY, log))  # this interpreter has loopx, counted
    agents = tmp_path / "agents"
    env = child_env(loopx_env, node22_bin, py_dir, PIP_NO_INDEX="1")
    with trio.fail_after(REAL_TIMEOUT):
        outcome = await initialize(make_settings(agents, env, loopx_project))
    assert (outcome.ok, outcome.stage, outcome.kind) == (True, None, None)
    assert (outcome.installed_cli, outcome.command, outcome.version) == (False, (python3, "-m", "loopx.cli"), "2.1.1")
    assert pip_installs(log) == [] and not (agents / "runtime").exists()
    assert "private copy" not in outcome.summary
    assert_safe(outcome.summary, tmp_path, loopx_project)
    # The generated skills run the same CLI, each word one shell word.
    skill = (agents / "skills" / "loopx" / "SKILL.md").read_text()
    commands = re.findall(r"`([^`]*start-goal[^`]*)`", skill)
    assert commands, skill
    for command in commands:
        assert shlex.split(command)[:4] == [python3, "-m", "loopx.cli", "start-goal"]


async def test_a_python_without_pip_is_passed_over_and_none_with_pip_is_said_plainly(
    loopx_standin_env, loopx_project, tmp_path
):
    nopip = Path(await fresh_python(tmp_path / "nopip", pip=False)).parent  # a real Python 3.11+ without pip
    pip_log = tmp_path / "python.log"
    with_pip = tmp_path / "with-pip"
    python_standin(with_pip / "python3.12", pip_log, version="3.12", pip_exit=1)
    agents = tmp_path / "agents"
    env = child_env(loopx_standin_env, nopip, with_pip, system=False)
    with trio.fail_after(FAST_TIMEOUT + 60):
        # python3 (the one without pip) comes first on PATH: checked, passed over.
        outcome = await initialize(make_settings(agents, env, loopx_project))
        assert (outcome.stage, outcome.kind) == ("install_cli", "pip_failed")
        assert asked(pip_log) == ["loopx", "version", "pip", "install"]

        # Only Pythons without pip, or PYTHON_BIN naming one: said as such, no install.
        alone = child_env(loopx_standin_env, nopip, system=False)
        none = await initialize(make_settings(agents, alone, loopx_project))
        named = await initialize(make_settings(agents, env, loopx_project, python_bin=str(nopip / "python3")))
    assert (none.ok, none.stage, none.kind) == (False, "install_cli", "no_pip")
    assert (named.ok, named.stage, named.kind) == (False, "install_cli", "no_pip")
    assert "pip" in none.summary and "PYTHON_BIN" in none.summary
    assert_safe(none.summary, tmp_path, loopx_project)
    assert len(pip_installs(pip_log)) == 1
    assert not (agents / "runtime" / "dsh-loopx-plugin" / "bin" / "loopx").exists()


# -- What the children see ---------------------------------------------------------------------------

# Logs its argv and the names in its environment; as `loopx` it is too old, as python
# its pip fails: the initialisation runs exactly one of each.
ENV_LOGGER = """
import json, os, sys
with open(LOG, "a") as f:
    f.write(json.dumps({"argv": sys.argv[1:], "env": sorted(os.environ)}) + "\\n")
args = sys.argv[1:]
if args == ["--version"]:
    print("loopx 0.4.0")
elif args[:1] == ["-c"]:
    print("3.12")
elif args != ["-m", "pip", "--version"]:
    sys.exit(1)
"""


async def test_children_get_loopx_s_environment_and_only_pip_gets_pip_s(tmp_path):
    log = tmp_path / "env.jsonl"
    bin_dir = tmp_path / "bin"
    write_script(bin_dir / "loopx", f"LOG = {str(log)!r}\n{ENV_LOGGER}")
    python = write_script(tmp_path / "py" / "python", f"LOG = {str(log)!r}\n{ENV_LOGGER}")
    env = {
        "PATH": os.pathsep.join([str(bin_dir), "/usr/bin", "/bin"]),
        "HOME": str(tmp_path / "home"),
        "DEEPSEEK_API_KEY": "sk-secret",
        "BRIDGE_TOKEN": "secret",
        "LOOPX_RUNTIME_ROOT": str(tmp_path / "rt"),
        "PIP_INDEX_URL": "https://index.invalid/simple",
        "https_proxy": "http://proxy.invalid:3128",
    }
    settings = make_settings(tmp_path / "agents", env, tmp_path, python_bin=str(python), timeout=FAST_TIMEOUT)
    with trio.fail_after(60):
        outcome = await initialize(settings)
    assert (outcome.stage, outcome.kind) == ("install_cli", "pip_failed")
    version, module, python, has_pip, pip = read_log(log)
    assert version["argv"] == ["--version"] and module["argv"] == ["-m", "loopx.cli", "--version"]
    assert python["argv"][0] == "-c" and has_pip["argv"] == ["-m", "pip", "--version"]
    assert pip["argv"][:3] == ["-m", "pip", "install"]
    for call in (version, module, python, has_pip, pip):
        assert "DEEPSEEK_API_KEY" not in call["env"] and "BRIDGE_TOKEN" not in call["env"]
        assert {"PATH", "HOME", "LOOPX_RUNTIME_ROOT", "LOOPX_USAGE_PING"} <= set(call["env"])
    for call in (version, module, python):
        assert {"PIP_INDEX_URL", "https_proxy"} & set(call["env"]) == set()
    for call in (has_pip, pip):
        assert {"PIP_INDEX_URL", "https_proxy", "PIP_DISABLE_PIP_VERSION_CHECK"} <= set(call["env"])


# -- An agents home with a space ----------------------------------------------------------------------


async def test_cli_bin_is_one_quoted_shell_word_when_the_agents_home_has_a_space(tmp_path):
    # LoopX pastes --cli-bin verbatim into the shell commands of the skills it writes; it
    # used to be dropped here (skills then named a plain `loopx` that is not installed).
    agents = tmp_path / "my agents"
    settings = make_settings(
        agents, {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}, tmp_path, python_bin=PY, timeout=FAST_TIMEOUT
    )
    log = tmp_path / "loopx.log"
    loopx_standin(settings.launcher.parent, log)  # an earlier managed install, healthy
    with trio.fail_after(60):
        outcome = await initialize(settings)
    assert outcome.ok and outcome.command == (PY, str(settings.launcher))
    calls = [entry["argv"] for entry in read_log(log)]
    assert steps(log) == ["version", "inspect", "install", "inspect"]
    for argv in calls[1:]:
        cli_bin = argv[argv.index("--cli-bin") + 1]
        assert cli_bin == shlex.quote(str(settings.launcher)) and " " in cli_bin
        assert shlex.split(f"{cli_bin} start-goal --guided")[0] == str(settings.launcher)


async def test_real_loopx_writes_skills_that_run_the_launcher_from_a_home_with_a_space(
    loopx_env, node22_bin, loopx_project, tmp_path
):
    agents = tmp_path / "my agents"
    settings = make_settings(agents, child_env(loopx_env, node22_bin), loopx_project, python_bin=PY)
    _init._write_launcher(PY, settings)  # a managed launcher; this interpreter has loopx
    with trio.fail_after(REAL_TIMEOUT):
        outcome = await initialize(settings)
    assert (outcome.ok, outcome.installed_cli, outcome.command) == (True, False, (PY, str(settings.launcher)))
    skill = (agents / "skills" / "loopx" / "SKILL.md").read_text()
    commands = re.findall(r"`([^`]*start-goal[^`]*)`", skill)
    assert commands, skill
    for command in commands:
        # What the model's shell call will parse: the launcher, whole, as the program.
        assert shlex.split(command)[0] == str(settings.launcher)


# -- Fault injection ------------------------------------------------------------------------------


async def test_a_failed_package_install_is_one_pip_call_and_a_safe_install_cli_error(loopx_standin_env, loopx_project, tmp_path):
    pip_log = tmp_path / "python.log"
    python = python_standin(tmp_path / "py" / "python", pip_log, pip_exit=1)
    agents = tmp_path / "agents"
    settings = make_settings(agents, child_env(loopx_standin_env), loopx_project, python_bin=str(python))
    with trio.fail_after(FAST_TIMEOUT):
        outcome = await initialize(settings)
    assert (outcome.ok, outcome.stage, outcome.kind, outcome.installed_cli, outcome.command) == (
        False, "install_cli", "pip_failed", False, None,
    )
    assert pip_installs(pip_log) == [[*PIP_ARGV_TAIL, str(agents / "runtime" / "dsh-loopx-plugin" / "site-packages"), "loopx>=0.5.4"]]
    assert asked(pip_log) == ["loopx", "version", "pip", "install"]
    assert not (agents / "runtime" / "dsh-loopx-plugin" / "bin" / "loopx").exists()
    assert not (agents / "skills").exists()
    assert "pip" in outcome.summary and "/loopx-init" in outcome.summary
    assert_safe(outcome.summary, tmp_path, loopx_project)


async def test_python_selection_skips_old_interpreters_and_needs_one(loopx_standin_env, loopx_project, tmp_path):
    pip_log = tmp_path / "python.log"
    old, new = tmp_path / "old", tmp_path / "new"
    python_standin(old / "python3", pip_log, version="3.10")
    python_standin(new / "python3.12", pip_log, version="3.12", pip_exit=1)
    agents = tmp_path / "agents"
    env = child_env(loopx_standin_env, old, new, system=False)
    with trio.fail_after(FAST_TIMEOUT):
        outcome = await initialize(make_settings(agents, env, loopx_project))
        assert (outcome.stage, outcome.kind) == ("install_cli", "pip_failed")
        # Neither has a LoopX (`-m loopx.cli`); python3 (3.10) was probed and passed over;
        # python3.12 was checked for pip and ran the one install.
        assert asked(pip_log) == ["loopx", "loopx", "version", "version", "pip", "install"]
        assert pip_installs(pip_log)[0][:5] == PIP_ARGV_TAIL

        nothing = await initialize(make_settings(agents, child_env(loopx_standin_env, old, system=False), loopx_project))
    assert (nothing.ok, nothing.stage, nothing.kind) == (False, "install_cli", "no_python")
    assert "PYTHON_BIN" in nothing.summary
    assert asked(pip_log)[6:] == ["loopx", "version"]  # one more version probe, no install


@pytest.mark.parametrize(
    ("version", "probe"),
    [
        ({"stdout": "loopx 0.5.3"}, {"stdout": PROBE_OK}),  # too old
        ({"stdout": "not loopx at all"}, {"stdout": PROBE_OK}),  # not a loopx
        ({"stdout": "loopx 2.1.1"}, {"exit": 2, "stdout": ""}),  # no DSH-native skills (argparse)
        ({"stdout": "loopx 2.1.1"}, {"exit": 1, "stdout": {"ok": False, "schema_version": SKILL_INSTALL_SCHEMA}}),
        ({"stdout": "loopx 2.1.1"}, {"stdout": {"ok": True, "schema_version": "something_else_v9"}}),
    ],
)
async def test_an_incompatible_cli_triggers_the_single_install(version, probe, loopx_standin_env, loopx_project, tmp_path):
    log, pip_log = tmp_path / "loopx.log", tmp_path / "python.log"
    loopx_standin(tmp_path / "bin", log, version=version, probe=probe)
    python = python_standin(tmp_path / "py" / "python", pip_log, pip_exit=1)
    settings = make_settings(tmp_path / "agents", child_env(loopx_standin_env, tmp_path / "bin"), loopx_project, python_bin=str(python))
    with trio.fail_after(FAST_TIMEOUT):
        outcome = await initialize(settings)
    assert (outcome.stage, outcome.kind) == ("install_cli", "pip_failed")
    assert len(pip_installs(pip_log)) == 1
    assert "install" not in steps(log)  # the incompatible CLI never installs skills


async def test_an_install_that_leaves_no_usable_cli_fails_at_resolve(loopx_standin_env, loopx_project, tmp_path):
    pip_log = tmp_path / "python.log"
    # pip "succeeds" without installing anything; the launcher then runs this stand-in too.
    python = python_standin(tmp_path / "py" / "python", pip_log, pip_exit=0, other_exit=0)
    agents = tmp_path / "agents"
    settings = make_settings(agents, child_env(loopx_standin_env), loopx_project, python_bin=str(python))
    with trio.fail_after(FAST_TIMEOUT):
        outcome = await initialize(settings)
    assert (outcome.ok, outcome.stage, outcome.kind, outcome.installed_cli, outcome.command) == (
        False, "resolve_cli", "incompatible", True, None,
    )
    launcher = str(agents / "runtime" / "dsh-loopx-plugin" / "bin" / "loopx")
    assert asked(pip_log) == ["loopx", "version", "pip", "install", f"{launcher} --version"]
    assert_safe(outcome.summary, tmp_path, loopx_project)


@pytest.mark.parametrize(
    ("install", "kind"),
    [
        ({"exit": 1, "stdout": {**INSTALL_OK, "ok": False}}, "refused"),
        ({"stdout": {**INSTALL_OK, "installed": {"loopx-project": "created", "loopx-pr-review": "mystery"}}}, "unknown_status"),
        ({"stdout": {**INSTALL_OK, "entry": {"skill_id": "loopx", "status": "skipped_user_file"}}}, "unknown_status"),
        ({"stdout": {k: v for k, v in INSTALL_OK.items() if k != "entry"}}, "missing_status"),
        ({"stdout": {**INSTALL_OK, "installed": {}}}, "missing_status"),
        # Every reported status is fine, but loopx-project (the skill the generated entry
        # sends the model to) is not among them: not installed as the entry needs.
        ({"stdout": {**INSTALL_OK, "installed": {"loopx-pr-review": "created", "loopx-self-repair": "created"}}},
         "missing_status"),
        ({"stdout": "/secret/path NOISY-OUTPUT not json"}, "malformed"),
        ({"exit": 1, "stdout": "NOISY-OUTPUT crashed"}, "transport"),
    ],
)
async def test_a_skill_install_failure_fails_closed_without_retry(install, kind, loopx_standin_env, loopx_project, tmp_path):
    log, pip_log = tmp_path / "loopx.log", tmp_path / "python.log"
    loopx = loopx_standin(tmp_path / "bin", log, install=install)
    python = python_standin(tmp_path / "py" / "python", pip_log)
    settings = make_settings(tmp_path / "agents", child_env(loopx_standin_env, tmp_path / "bin"), loopx_project, python_bin=str(python))
    with trio.fail_after(FAST_TIMEOUT):
        outcome = await initialize(settings)
    assert (outcome.ok, outcome.stage, outcome.kind, outcome.skills_changed) == (False, "install_skills", kind, False)
    assert outcome.command == (str(loopx),)
    assert steps(log) == ["version", "inspect", "install"]  # one install, no readback
    assert read_log(pip_log) == []
    assert_safe(outcome.summary, tmp_path, loopx_project)


@pytest.mark.parametrize(
    ("readback", "kind"),
    [
        ({"stdout": {**READBACK_OK, "before": {"ready": False}}}, "not_ready"),
        ({"stdout": {**READBACK_OK, "install_required": True}}, "not_ready"),
        ({"stdout": {k: v for k, v in READBACK_OK.items() if k != "before"}}, "not_ready"),
        ({"exit": 1, "stdout": {**READBACK_OK, "ok": False}}, "refused"),
    ],
)
async def test_a_readback_that_is_not_healthy_fails_at_readback(readback, kind, loopx_standin_env, loopx_project, tmp_path):
    log = tmp_path / "loopx.log"
    loopx_standin(tmp_path / "bin", log, readback=readback)
    settings = make_settings(tmp_path / "agents", child_env(loopx_standin_env, tmp_path / "bin"), loopx_project)
    with trio.fail_after(FAST_TIMEOUT):
        outcome = await initialize(settings)
    assert (outcome.ok, outcome.stage, outcome.kind) == (False, "readback", kind)
    assert outcome.skills_changed is False  # a change that does not read back is no success
    assert steps(log) == ["version", "inspect", "install", "inspect"]
    assert_safe(outcome.summary, tmp_path, loopx_project)


async def test_a_probe_timeout_fails_at_probe_without_installing(loopx_standin_env, loopx_project, tmp_path, jump_clock):
    log, pip_log = tmp_path / "loopx.log", tmp_path / "python.log"
    timeout = 60.0  # reached by a jump of the clock once the stand-in hangs, not by waiting
    outcomes = []
    with fifo_stream(tmp_path / "hung") as hung:
        loopx_standin(tmp_path / "bin", log, fifo=tmp_path / "hung", version={"hang": True})
        python = python_standin(tmp_path / "py" / "python", pip_log)
        env = child_env(loopx_standin_env, tmp_path / "bin")
        settings = make_settings(tmp_path / "agents", env, loopx_project, python_bin=str(python), timeout=timeout)
        with trio.fail_after(timeout + FAST_TIMEOUT):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(lambda: _append(outcomes, initialize(settings)))
                assert await hung.receive_some() == b"version\n"
                assert outcomes == []  # still waiting for the hanging probe
                jump_clock.jump(timeout)
    [outcome] = outcomes
    assert (outcome.ok, outcome.stage, outcome.kind) == (False, "probe_cli", "timeout")
    assert read_log(pip_log) == []
    [call] = read_log(log)
    with pytest.raises(ProcessLookupError):  # killed and reaped
        os.kill(call["pid"], 0)


async def _append(results, call):
    results.append(await call)


# -- Start-up initialisation --------------------------------------------------------------------


async def test_startup_initialize_never_raises_and_reduces_failures_to_stage_and_kind(
    loopx_standin_env, loopx_project, tmp_path, monkeypatch
):
    loopx_standin(tmp_path / "bin", tmp_path / "loopx.log", version={"stdout": "garbage"})
    env = child_env(loopx_standin_env, tmp_path / "bin")
    broken = make_settings(tmp_path / "agents", env, loopx_project, python_bin=str(tmp_path / "no" / "python"))
    with trio.fail_after(FAST_TIMEOUT):
        with structlog.testing.capture_logs() as logs:
            outcome = await startup_initialize(broken)
        assert (outcome.ok, outcome.stage, outcome.kind) == (False, "install_cli", "python_unavailable")
        assert any(e["event"] == "loopx startup init finished" and e["kind"] == "python_unavailable" for e in logs)

        gone = make_settings(tmp_path / "agents", env, tmp_path / "no-such-project")
        assert (await startup_initialize(gone)).kind == "no_project"

        async def explode(*args):
            raise RuntimeError("/secret/path exploded")

        monkeypatch.setattr(_init, "_probe", explode)
        unexpected = await startup_initialize(broken)
    assert (unexpected.ok, unexpected.stage, unexpected.kind) == (False, "probe_cli", "unexpected")
    for result in (outcome, unexpected):
        assert_safe(result.summary, tmp_path, loopx_project)


async def test_startup_initialize_lets_cancellation_through(loopx_standin_env, loopx_project, tmp_path):
    log = tmp_path / "loopx.log"
    with fifo_stream(tmp_path / "hung") as hung:
        loopx_standin(tmp_path / "bin", log, fifo=tmp_path / "hung", install={"hang": True})
        settings = make_settings(tmp_path / "agents", child_env(loopx_standin_env, tmp_path / "bin"), loopx_project)
        returned = []
        with trio.fail_after(FAST_TIMEOUT):
            async with trio.open_nursery() as nursery:
                scope = trio.CancelScope()

                async def run():
                    with scope:
                        returned.append(await startup_initialize(settings))

                nursery.start_soon(run)
                assert await hung.receive_some() == b"install\n"
                scope.cancel()
    assert scope.cancelled_caught and returned == []
    with pytest.raises(ProcessLookupError):
        os.kill(read_log(log)[-1]["pid"], 0)


# -- /loopx-init through a real Runtime ------------------------------------------------------------


def counting(settings):
    asked = []

    def settings_for(ctx):
        asked.append(ctx)
        return settings

    return settings_for, asked


def assert_init_source(message, phase):
    source = message.source
    assert isinstance(source, ProducerSource)
    assert source.kind == INIT_SOURCE_KIND != "loopx-continuation"
    assert not is_human(source)
    assert source.fields["phase"] == phase
    assert message.role == "user"
    assert "Do not call tools, run commands, reinstall anything" in message.text


@pytest.mark.parametrize("line", ["/loopx-init now", "/loopx-init --force", "/loopx-init  a b "])
async def test_any_argument_is_a_usage_error_before_any_followup_or_probe(line, loopx_standin_env, loopx_project, tmp_path):
    log, pip_log = tmp_path / "loopx.log", tmp_path / "python.log"
    loopx_standin(tmp_path / "bin", log)
    python = python_standin(tmp_path / "py" / "python", pip_log)
    settings = make_settings(tmp_path / "agents", child_env(loopx_standin_env, tmp_path / "bin"), loopx_project, python_bin=str(python))
    settings_for, asked = counting(settings)
    adapter = ScriptedAdapter([])
    with trio.fail_after(FAST_TIMEOUT):
        async with Runtime.open(tmp_path / "home") as rt:
            rt.commands.register(loopx_init_command(settings_for))
            handle = await start_agent(rt, adapter)
            result = await rt.execute_command("a1", line)
            await handle.agent.wait_idle()
            assert result.ok is False and result.message == "usage: /loopx-init (takes no arguments)"
            assert result.data["kind"] == "usage"
            assert asked == [] and read_log(log) == [] and read_log(pip_log) == []
            assert handle.agent.inbox_size == 0 and await init_messages(handle.agent) == []
            assert adapter.requests == []
            assert not (tmp_path / "agents").exists()


async def test_success_queues_start_then_result_and_returns_the_native_result(loopx_env, node22_bin, loopx_project, tmp_path):
    calls = tmp_path / "loopx.log"
    loopx = wrapper(tmp_path / "bin" / "loopx", REAL_LOOPX, calls)
    settings = make_settings(tmp_path / "agents", child_env(loopx_env, node22_bin, tmp_path / "bin"), loopx_project)
    settings_for, asked = counting(settings)
    adopted = []
    gate = trio.Event()
    adapter = ScriptedAdapter([Reply("Checking LoopX.", block=gate), "LoopX is ready."])
    with trio.fail_after(REAL_TIMEOUT):
        async with Runtime.open(tmp_path / "home") as rt:
            rt.commands.register(loopx_init_command(settings_for, on_success=adopted.append))
            handle = await start_agent(rt, adapter)
            agent = handle.agent
            result = await rt.execute_command("a1", "/loopx-init")

            # The start turn's model call is still held: the result waits as a followup.
            assert len(adapter.requests) == 1
            assert adapter.requests[0].messages[-1].source.fields == {"phase": "start"}
            gate.set()
            await agent.wait_idle()

            assert isinstance(result, CommandResult) and result.ok is True
            assert dict(result.data) == {"stage": None, "kind": None, "skillsChanged": True, "installedCli": False}
            assert [a.agent for a in asked] == [agent]
            [outcome] = adopted
            assert outcome.command == (str(loopx),) and result.message == outcome.summary
            start, done = await init_messages(agent)
            assert_init_source(start, "start")
            assert_init_source(done, "result")
            assert dict(done.source.fields) == {"phase": "result", "ok": True}
            assert "Welcome to LoopX" in start.text and "installed" in start.text
            assert outcome.summary in done.text
            for message in (start, done):
                assert_safe(message.text, tmp_path, loopx_project)
            # Two model turns, one per followup, in order; both ordinary (no reservation).
            assert len(adapter.requests) == 2
            assert adapter.requests[1].messages[-1].id == done.id
            spliced = [e.data for e in (await agent.session.read_events()) if e.type == "agent/inbox/spliced" and e.data["op"] == "insert"]
            assert [s["placement"] for s in spliced] == ["followup", "followup"]
            assert not any(e.type.startswith("reservation") for e in (await agent.session.read_events()))
            assert steps(calls) == ["version", "inspect", "install", "inspect"]


async def test_failure_still_queues_exactly_start_and_result(loopx_standin_env, loopx_project, tmp_path):
    pip_log = tmp_path / "python.log"
    python = python_standin(tmp_path / "py" / "python", pip_log, pip_exit=1)
    settings = make_settings(tmp_path / "agents", child_env(loopx_standin_env), loopx_project, python_bin=str(python))
    adopted = []
    adapter = ScriptedAdapter(["ok", "ok"])
    with trio.fail_after(FAST_TIMEOUT):
        async with Runtime.open(tmp_path / "home") as rt:
            rt.commands.register(loopx_init_command(lambda ctx: settings, on_success=adopted.append))
            handle = await start_agent(rt, adapter)
            result = await rt.execute_command("a1", "/loopx-init")
            await handle.agent.wait_idle()
            assert (result.ok, dict(result.data)) == (
                False, {"stage": "install_cli", "kind": "pip_failed", "skillsChanged": False, "installedCli": False},
            )
            assert adopted == []
            assert len(pip_installs(pip_log)) == 1
            start, done = await init_messages(handle.agent)
            assert_init_source(start, "start")
            assert_init_source(done, "result")
            assert dict(done.source.fields) == {"phase": "result", "ok": False}
            assert result.message in done.text and "did not finish" in done.text
            for text in (start.text, done.text, result.message):
                assert_safe(text, tmp_path, loopx_project)
            assert len(adapter.requests) == 2
            done_event = [e.data for e in (await handle.agent.session.read_events()) if e.type == "command/done"]
            assert done_event == [{"name": "loopx-init", "ok": False, "message": result.message}]


async def test_cancellation_leaves_only_the_start_followup_and_propagates(loopx_standin_env, loopx_project, tmp_path):
    log = tmp_path / "loopx.log"
    adapter = ScriptedAdapter(["ok"])
    returned = []
    with fifo_stream(tmp_path / "hung") as hung:
        loopx_standin(tmp_path / "bin", log, fifo=tmp_path / "hung", install={"hang": True})
        settings = make_settings(tmp_path / "agents", child_env(loopx_standin_env, tmp_path / "bin"), loopx_project)
        with trio.fail_after(FAST_TIMEOUT):
            async with Runtime.open(tmp_path / "home") as rt:
                rt.commands.register(loopx_init_command(lambda ctx: settings))
                handle = await start_agent(rt, adapter)
                async with trio.open_nursery() as nursery:
                    scope = trio.CancelScope()

                    async def run():
                        with scope:
                            returned.append(await rt.execute_command("a1", "/loopx-init"))

                    nursery.start_soon(run)
                    assert await hung.receive_some() == b"install\n"
                    scope.cancel()
                await handle.agent.wait_idle()
                assert scope.cancelled_caught and returned == []
                [start] = await init_messages(handle.agent)
                assert_init_source(start, "start")
                assert len(adapter.requests) == 1 and handle.agent.inbox_size == 0
                types = [e.type for e in (await handle.agent.session.read_events())]
                assert types.count("command/run") == 1 and types.count("user/message") == 1
    assert steps(log) == ["version", "inspect", "install"]
    with pytest.raises(ProcessLookupError):  # the hung install was killed and reaped
        os.kill(read_log(log)[-1]["pid"], 0)


async def test_followup_queue_failures_are_logged_once_and_keep_the_native_result(
    loopx_env, node22_bin, loopx_project, tmp_path
):
    calls = tmp_path / "loopx.log"
    wrapper(tmp_path / "bin" / "loopx", REAL_LOOPX, calls)
    settings = make_settings(tmp_path / "agents", child_env(loopx_env, node22_bin, tmp_path / "bin"), loopx_project)
    adapter = ScriptedAdapter([])
    command = loopx_init_command(lambda ctx: settings)
    with trio.fail_after(REAL_TIMEOUT):
        async with Runtime.open(tmp_path / "home") as rt:
            rt.commands.register(command)
            handle = await start_agent(rt, adapter)
            attempts = []

            def refuse(message):
                attempts.append(message)
                raise AgentClosedError("agent a1 is disposed")

            handle.agent.followup = refuse
            with structlog.testing.capture_logs() as logs:
                result = await rt.execute_command("a1", "/loopx-init")
            assert (result.ok, result.data["skillsChanged"], result.data["stage"]) == (True, True, None)
            assert [m.source.fields["phase"] for m in attempts] == ["start", "result"]  # never retried
            warnings = [e for e in logs if e["event"] == "loopx init followup not queued"]
            assert [(w["phase"], w["error"]) for w in warnings] == [("start", "AgentClosedError"), ("result", "AgentClosedError")]
            assert steps(calls) == ["version", "inspect", "install", "inspect"]  # one install mutation

            # A really disposed agent: the same command, run directly, keeps its result.
            other = await rt.create_agent(session_id="a2", agent_options=SCRIPTED)
            await other.dispose()
            ctx = CommandContext("loopx-init", other.agent, rt.supervisor, trio.CancelScope())
            with structlog.testing.capture_logs() as logs:
                again = await command.run(ctx, "")
            assert (again.ok, again.data["skillsChanged"]) == (True, False)
            assert [e["phase"] for e in logs if e["event"] == "loopx init followup not queued"] == ["start", "result"]
            assert adapter.requests == [] and await init_messages(handle.agent) == []
