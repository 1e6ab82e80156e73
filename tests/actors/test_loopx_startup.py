"""The LoopX integration at start-up: initialise once before ready, never fail the runtime."""

import sys

import trio

from loopdock import LoopxSettings, Runtime
from loopdock.runtime.skills import SkillCatalog


async def test_startup_installs_skills_before_ready_and_registers_the_repair_command(
    tmp_path, loopx_env, loopx_command, loopx_project
):
    env = {**loopx_env, "DSH_AGENTS_HOME": str(tmp_path / "agents")}
    with trio.fail_after(180):
        async with Runtime.open(
            tmp_path / "home",
            env=env,
            skills=SkillCatalog.from_env(loopx_project, env),
            loopx=LoopxSettings(env=env, command=tuple(loopx_command), timeout=120),
        ) as rt:
            outcome = rt.loopx.startup
            assert outcome.ok and outcome.skills_changed and not outcome.installed_cli
            # Visible at once, without a restart; no agent and no model call was needed.
            assert rt.skills.get("loopx") is not None
            assert "loopx-init" in rt.commands.names()
            assert rt.list_agents() == []


async def test_a_broken_cli_at_startup_is_a_safe_diagnostic_and_the_runtime_stays_up(
    tmp_path, loopx_standin_env, loopx_project
):
    broken = tmp_path / "loopx"
    broken.write_text(f"#!{sys.executable}\nimport sys\nprint('not loopx at all')\nsys.exit(3)\n")
    broken.chmod(0o755)
    no_python = tmp_path / "no-python"
    # A Python 3.12 with pip (it says so) whose install fails.
    no_python.write_text(
        f"#!{sys.executable}\nimport sys\nargs = sys.argv[1:]\n"
        "if args[:1] == ['-c']: print('3.12')\n"
        "sys.exit(0 if args[:1] == ['-c'] or args == ['-m', 'pip', '--version'] else 1)\n"
    )
    no_python.chmod(0o755)
    env = {
        **loopx_standin_env,
        "DSH_AGENTS_HOME": str(tmp_path / "agents"),
        "PATH": f"{tmp_path}:/usr/bin:/bin",  # the broken loopx is the only one
        "PYTHON_BIN": str(no_python),
    }
    with trio.fail_after(120):
        async with Runtime.open(
            tmp_path / "home",
            env=env,
            skills=SkillCatalog.from_env(loopx_project, env),
            loopx=LoopxSettings(env=env, command=(str(broken),), timeout=60),
        ) as rt:
            outcome = rt.loopx.startup
            assert not outcome.ok
            assert outcome.stage == "install_cli" and outcome.kind == "pip_failed"
            assert str(tmp_path) not in outcome.summary
            assert "loopx-init" in rt.commands.names()  # the repair path stays
            handle = await rt.create_agent(session_id="still-works", agent_options={"cwd": str(loopx_project)})
            handle.agent.followup("hello")
            await handle.agent.wait_idle()
            assert handle.agent.transcript[-1].text == "pong: hello"
