"""The publication transaction every driver runs to bring an agent to life.

prepare session -> construct agent -> setups -> commits -> enter registries -> publish
session -> announce -> start. Any failure on the way (a setup or commit raising,
cancellation, the owner shutting down) rolls everything back: no registry entry, no
scoped registration, nothing persisted.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Literal

from runtime._driver import AgentHandle, Setup
from runtime._errors import LoopdockError, SetupError

from ._agent import AgentActor
from ._agent_context import AgentContext
from ._supervisor import Supervisor, agent_dispose


async def run_setups(ctx: AgentContext, setups: Sequence[Setup | None]) -> None:
    """Run setups in order, collect their commits, then run the commits in order."""
    commits = []
    for setup in setups:
        if setup is None:
            continue
        result = setup(ctx)
        if inspect.isawaitable(result):
            result = await result
        if result is not None:
            commits.append(result)
    for commit in commits:
        if callable(getattr(commit, "commit", None)):
            commit.commit()
        elif callable(commit):
            commit()
        else:
            raise SetupError(f"a setup returned {commit!r}: expected a commit or nothing")


async def publish_agent(
    owner: Supervisor,
    agent: AgentActor,
    setups: Sequence[Setup | None],
    *,
    source: Literal["startup", "resume"],
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
        owner.check_open()
        owner.enter(agent)
        entered = True
        agent.session.publish()
        owner.announce("agent/created", agent.id, {"source": source})
        await owner.nursery.start(agent.run)
    except BaseException:
        agent.dispose_scoped()
        if entered:
            owner.leave(agent)
        if not agent.session.published:
            agent.session.discard()
        raise
    agent.log.info("agent published", source=source)
    return AgentHandle(agent, agent_dispose(owner, agent))
