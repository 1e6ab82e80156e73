"""The publication transaction every driver runs to bring an agent to life.

prepare session -> construct agent -> setups -> commits -> enter registries -> publish
session -> announce -> start. Any failure on the way (a setup or commit raising,
cancellation, the owner shutting down) rolls everything back: no registry entry, no
scoped registration, nothing persisted.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any, Literal

from loopdock.runtime import LoopdockError, SetupError
from loopdock.runtime.mcp import McpServer, require_sdk

from ._agent import AgentActor
from ._agent_context import AgentContext
from ._driver import AgentHandle, CreateAgentOptions, ResumeAgentOptions, Setup
from ._faults import record_fault
from ._supervisor import Supervisor, agent_dispose
from ._turn import TurnBody


async def collect_setups(ctx: AgentContext, setups: Sequence[Setup | None]) -> list[Callable[[], Any]]:
    """Run setups in order; return their commits (as plain callables), in the same order.

    A setup that raises stops the rest, and no commit runs.
    """
    commits: list[Callable[[], Any]] = []
    for setup in setups:
        if setup is None:
            continue
        result = setup(ctx)
        if inspect.isawaitable(result):
            result = await result
        if result is None:
            continue
        commit = getattr(result, "commit", None)
        if callable(commit):
            commits.append(commit)
        elif callable(result):
            commits.append(result)
        else:
            raise SetupError(f"a setup returned {result!r}: expected a commit or nothing")
    return commits


def compose_setups(setups: Sequence[Setup | None]) -> Setup | None:
    """One setup running ``setups`` in order, whose commit runs all their commits in order."""
    active = [s for s in setups if s is not None]
    if not active:
        return None
    if len(active) == 1:
        return active[0]

    async def composed(ctx: AgentContext) -> Callable[[], None] | None:
        commits = await collect_setups(ctx, active)
        if not commits:
            return None

        def commit_all() -> None:
            for commit in commits:  # a commit that raises stops the later ones
                commit()

        return commit_all

    return composed


async def run_setups(ctx: AgentContext, setups: Sequence[Setup | None]) -> None:
    """Run setups in order, then their commits in order."""
    for commit in await collect_setups(ctx, setups):
        commit()


async def publish_agent(
    owner: Supervisor,
    agent: AgentActor,
    setups: Sequence[Setup | None],
    *,
    source: Literal["startup", "resume", "reactivation"],
) -> AgentHandle:
    ctx = AgentContext(owner, agent)
    entered = False
    try:
        try:
            await run_setups(ctx, setups)
        except LoopdockError:
            raise
        except Exception as exc:
            raise SetupError(f"setup of agent {agent.id!r} failed: {exc!r}") from exc
        if agent.options.mcp_servers:
            require_sdk()  # one clear line, before anything is published
        owner.check_open()
        owner.enter(agent)
        entered = True
        agent.session.publish()
        if source != "reactivation":  # the same agent, back: announced once it runs
            owner.announce("agent/created", agent.id, {"source": source})
        await owner.nursery.start(owner.run_agent, agent)
        for spec in agent.options.mcp_servers:
            # Each server is the agent's companion: stopped with it. This returns once the
            # server's tools are registered, or once its first start failed (its tools then
            # appear on a later start; its fault is logged).
            server = McpServer(spec, agent.tools, agent.cwd)
            await agent.start_companion(server.run, name=f"mcp:{spec.name}")
    except BaseException:
        agent.dispose_scoped()
        if entered:
            owner.leave(agent)
        if not agent.session.published:
            agent.session.discard()
        raise
    agent.log.info("agent published", source=source)
    for hook in list(owner.agent_started):
        try:
            await hook(agent)
        except Exception as exc:  # the agent is published: a hook cannot undo that
            record_fault(agent.session, "agent-started hook", exc, action="skipped")
    return AgentHandle(agent, agent_dispose(owner, agent))


async def create_with_body(owner: Supervisor, options: CreateAgentOptions, body: TurnBody) -> AgentHandle:
    """A driver's whole ``create_agent`` when its only difference is the turn body."""
    owner.adapters.get(options.agent_options.provider)  # fail before anything is made
    session = await owner.new_session(
        options.session_id,
        cwd=options.cwd or options.agent_options.cwd,
        parent_session=options.parent_session,
        agent_preset=options.agent_preset,
    )
    try:
        agent = AgentActor(owner, session, options.agent_options, body)
    except BaseException:
        session.discard()
        raise
    agent.revivable = True
    return await publish_agent(owner, agent, [options.setup], source="startup")


async def resume_with_body(owner: Supervisor, options: ResumeAgentOptions, body: TurnBody) -> AgentHandle:
    """A driver's whole ``resume`` when its only difference is the turn body. With
    ``options.into`` (a passivated agent being reactivated) the agent is rebuilt in that
    same object, which its callers hold (actors._lifecycle)."""
    owner.adapters.get(options.agent_options.provider)
    # A body that can finish a step (actors._step_resume) gets the open turn to continue.
    session = await owner.load_session(
        options.resume_session_id, resumes_steps=getattr(body, "resumes_steps", False), into=options.into,
        outline=options.outline,
    )
    try:
        if options.into is not None:
            agent = options.into
            agent._revive(owner, session, options.agent_options, body)
        else:
            agent = AgentActor(owner, session, options.agent_options, body)
    except BaseException:
        session.discard()
        raise
    agent.revivable = True
    source: Literal["resume", "reactivation"] = "resume" if options.into is None else "reactivation"
    return await publish_agent(owner, agent, [options.setup], source=source)
