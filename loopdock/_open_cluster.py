"""``open_cluster``: a harness process's entry to the agents of a Redis cluster.

    async with loopdock.open_cluster("redis://127.0.0.1:6379/0") as rt:
        handle = await rt.create_agent(session_id="a1", loop="minimal-first")
        handle.agent.followup("hello")
        await handle.agent.wait_idle()

Its own module, apart from ``_cluster``: ``loopdock`` exports it, and importing
``loopdock`` must not need coredis (``pip install 'loopdock[cluster]'``), which only
opening a cluster does.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._cluster import ClusterRuntime


@asynccontextmanager
async def open_cluster(url: str) -> AsyncIterator[ClusterRuntime]:
    """Connect to the cluster at ``url`` (``redis://[:PASSWORD@]HOST:PORT/DB``) and yield
    a ``ClusterRuntime``: the agent API (``create_agent``, ``resume_agent``,
    ``fork_session``, ``get_agent``, ...) for agents that its workers (``loopdock worker
    --cluster``) run; this process runs none. Each agent is a ``RemoteAgent``, which keeps
    the ``loopdock.Agent`` contract (docs/cluster.md).

    Raises ClusterUnreachableError (``CLUSTER_UNREACHABLE``) if its Redis does not answer,
    ModuleNotFoundError naming the extra if coredis is not installed. Closing waits until
    every message posted is in Redis (a body that raised drops what was not written yet);
    it stops no agent.
    """
    try:
        from ._cluster import ClusterRuntime
    except ModuleNotFoundError as exc:  # installed without the extra
        if exc.name != "coredis":
            raise
        raise ModuleNotFoundError(
            "open_cluster(url) needs coredis: pip install 'loopdock[cluster]'", name="coredis"
        ) from exc

    async with ClusterRuntime.open(url) as rt:
        yield rt
