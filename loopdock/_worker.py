"""A cluster worker: a runtime whose sessions live in the cluster's Redis, running the
agents of the shards it holds leases on (``loopdock worker --cluster redis://...``).

    async with trio.open_nursery() as nursery:
        worker = await nursery.start(run_worker, "redis://127.0.0.1:6379/0")

See docs/cluster.md for the design and its guarantees.
"""

from __future__ import annotations

import functools
import os
import secrets
import signal
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TextIO

import attrs
import trio

from loopdock.actors import PASSIVATE_AFTER, WATCHER_POLICY, Action, check_passivate_after, supervised
from loopdock.actors.cluster import LeaseKeeper, ShardHost
from loopdock.actors.dock import LoopDock
from loopdock.runtime import GC_THRESHOLD, LoopdockError, RegistryMismatchError, get_logger, resolve_home
from loopdock.runtime.cluster import (
    ClusterConfigError,
    ClusterUnreachableError,
    Ownership,
    RedisSessionStore,
    cluster_shards,
    connect,
    redact,
)
from loopdock.runtime.tools import ShellPolicy

from ._runtime import Runtime, dock_config_of

log = get_logger(__name__)

#: A lease's default time to live: a dead worker's shards move within about this long.
DEFAULT_LEASE_TTL = 10.0


class WorkerStoppedError(LoopdockError):
    """One of the worker's own actors kept failing: the worker leaves the cluster (its
    shards move to the other workers)."""

    code = "WORKER_STOPPED"


async def essential(
    actor: Callable[..., Awaitable[Any]], name: str, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """Run one of the worker's own actors, restarted as the runtime's watchers are
    (``WATCHER_POLICY``); if it stops for good, so does the worker: a worker that holds
    leases but no longer reads its shards, or reads them with nobody renewing the leases,
    would only stand in the way of a takeover."""

    def report(error: Exception, action: Action) -> None:
        log.warning("worker actor failed", actor=name, error=repr(error), action=action)

    await supervised(actor, name=name, policy=WATCHER_POLICY, report=report, task_status=task_status)
    raise WorkerStoppedError(f"the worker's {name} kept failing; the worker leaves the cluster")


@attrs.define(eq=False)
class Worker:
    """What ``run_worker`` hands to ``task_status`` once it is serving."""

    id: str
    runtime: Runtime
    ownership: Ownership
    keeper: LeaseKeeper
    host: ShardHost


def fingerprint(dock: LoopDock) -> str:
    """The loops and drivers a worker offers; every worker of a cluster must agree."""
    loops = ",".join(f"{info.id}:{info.kind}" for info in dock.list_loops())
    return f"loops={loops};drivers={','.join(dock.list_drivers())}"


async def run_worker(
    url: str,
    *,
    home: str | os.PathLike[str] | None = None,
    config: Mapping[str, Any] | str | os.PathLike[str] | None = None,
    shards: int | None = None,
    lease_ttl: float = DEFAULT_LEASE_TTL,
    worker_id: str | None = None,
    shell: ShellPolicy | None = None,
    passivate_after: float | None = PASSIVATE_AFTER,
    task_status: trio.TaskStatus[Worker] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve as a worker of the cluster at ``url`` until cancelled, then hand every shard
    back (agents disposed, leases deleted) so that others take over at once.

    ``home`` holds the worker's own files (default: ``workers/<id>`` under the default
    home); its sessions are in Redis. ``config`` is the dock's config (loop packages:
    every worker must load the same ones). The first worker fixes the cluster's shard
    count (``shards``, default 32). ``shell`` enables the shell tool under that policy.
    ``passivate_after``: an agent idle this many seconds (default 300) is passivated, as
    by ``Runtime.open``, and activated again by its next message; None keeps every agent
    in memory (docs/cluster.md, "Passivation").
    """
    if lease_ttl <= 0:
        raise ClusterConfigError(f"the lease ttl must be positive, got {lease_ttl}")
    passivate_after = check_passivate_after(passivate_after)
    dock_config = await trio.to_thread.run_sync(dock_config_of, config)  # a bad file: one line, before joining
    if dock_config.agents:
        raise ClusterConfigError(
            "the worker's config names agents; every worker would start them outside its shards: "
            "create them on the cluster instead (loopdock.open_cluster(url), then create_agent)"
        )
    name = worker_id or f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
    worker_home = Path(home) if home is not None else resolve_home(None) / "workers" / name
    refused: Exception | None = None
    redis = connect(url)
    # The client's connections are its own tasks under this call: a cancellation that
    # reached them made the leave below fail ("Connection lost") and left the shards to
    # expire. So the client runs shielded from the caller's cancellation, which stops the
    # worker through ``stop`` instead, and closes after the leave.
    async with _shielded_from_caller() as stop, redis:
        with stop:
            try:
                ownership = Ownership(name, await cluster_shards(redis, shards))
                store = RedisSessionStore(redis, ownership, retry_for=lease_ttl, url=url)
                # A worker owns its process, as serve does (see loopdock._serve).
                async with store_closed(store), Runtime.open(
                    worker_home, config=dock_config, shell=shell, store=store, hide_environment=True,
                    gc_threshold=GC_THRESHOLD, passivate_after=passivate_after,
                ) as rt:
                    host = ShardHost(redis, store, rt.supervisor, rt.dock, ttl=lease_ttl, url=url)
                    # The runtime's policy says which agents are due; the host lets them go
                    # (no agent exists before it: the host makes them all).
                    rt.supervisor.lifecycle.release = host.release
                    keeper = LeaseKeeper(
                        redis, ownership, ttl=lease_ttl, fingerprint=fingerprint(rt.dock),
                        acquired=host.acquired, drain=host.drain, lost=host.lost,
                    )
                    await keeper.check_registry()
                    try:
                        async with trio.open_nursery() as nursery:
                            await nursery.start(essential, host.run, "shard host")
                            await nursery.start(essential, keeper.run, "lease keeper")
                            log.info("worker serving", worker=name, shards=ownership.shards)
                            task_status.started(Worker(name, rt, ownership, keeper, host))
                    except* WorkerStoppedError as group:
                        refused = group.exceptions[0]
                    finally:
                        with trio.CancelScope(shield=True), trio.move_on_after(lease_ttl):
                            await keeper.leave()
                            await host.aclose()
            except (ClusterConfigError, ClusterUnreachableError, RegistryMismatchError) as exc:
                refused = exc  # raised below, outside the client's task group, as itself
    if refused is not None:
        raise refused


@asynccontextmanager
async def store_closed(store: RedisSessionStore) -> AsyncIterator[None]:
    """Close the store's own connection once the runtime that commits through it is closed."""
    try:
        yield
    finally:
        await store.aclose()


@asynccontextmanager
async def _shielded_from_caller() -> AsyncIterator[trio.CancelScope]:
    """Run the block shielded from the caller's cancellation, which cancels the scope this
    yields instead: what the block opens before entering that scope keeps running until
    the block ends. The caller's cancellation propagates afterwards; what the block raises
    comes out as itself."""
    stop = trio.CancelScope()
    failed: BaseException | None = None

    async def relay() -> None:
        try:
            await trio.sleep_forever()
        finally:
            stop.cancel()

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(relay)
            with trio.CancelScope(shield=True):
                try:
                    yield stop
                except BaseException as exc:  # raised below: not in a group of the relay's nursery
                    failed = exc
            nursery.cancel_scope.cancel()
    finally:
        if failed is not None:
            raise failed


async def worker_command(url: str, out: TextIO, **options: Any) -> None:
    """``loopdock worker``: print one readiness line, serve until SIGINT or SIGTERM, then
    hand the shards back."""
    refused: LoopdockError | None = None
    async with trio.open_nursery() as nursery:
        try:
            worker: Worker = await nursery.start(functools.partial(run_worker, url, **options))
        except LoopdockError as exc:  # raised below, outside the task group: one line, not a traceback
            refused = exc
        else:
            # Received before the ready line: a stop sent as soon as it shows is clean too.
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                print(f"loopdock worker {worker.id}: serving {redact(url)} ({worker.ownership.shards} shards)",
                      file=out, flush=True)
                async for _ in signals:
                    break
            nursery.cancel_scope.cancel()
    if refused is not None:
        raise refused
