"""LeaseKeeper: the actor that owns a worker's shards.

Every ``ttl / 3`` it heartbeats (joining the set of live workers), renews the leases it
holds, and moves towards its fair share, ``ceil(shards / live workers)``: it releases
what it holds beyond that (after the host drains those shards) and acquires free shards
up to it. A new worker therefore gets shards as the others let go of theirs, and the
shards of a dead worker are free once its leases expire (``ttl``).

A lease is the worker's only as long as Redis says so; locally the keeper assumes it
for ``ttl * SAFETY`` after a renewal was *sent*, and drops a shard it could not renew by
then, even with Redis out of reach. Writes are fenced regardless (runtime.cluster).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Awaitable, Callable
from typing import Any

import coredis
import trio

from loopdock.runtime import RegistryMismatchError, get_logger
from loopdock.runtime.cluster import ACQUIRE, HEARTBEAT, LEAVE, RELEASE, RENEW, RETRYABLE, Ownership, keys

log = get_logger(__name__)

#: The share of a lease's ttl for which a worker trusts a renewal it sent.
SAFETY = 0.8



class LeaseKeeper:
    def __init__(
        self,
        redis: coredis.Redis[str],
        ownership: Ownership,
        *,
        ttl: float,
        fingerprint: str,
        acquired: Callable[[int], Awaitable[None]],
        drain: Callable[[int], Awaitable[None]],
        lost: Callable[[int], None],
    ) -> None:
        self._redis = redis
        self.ownership = ownership
        self.ttl = ttl
        self.fingerprint = fingerprint
        self._acquired = acquired
        self._drain = drain
        self._lost = lost
        self._acquire = redis.register_script(ACQUIRE)
        self._renew = redis.register_script(RENEW)
        self._release = redis.register_script(RELEASE)
        self._heartbeat = redis.register_script(HEARTBEAT)
        self._leave = redis.register_script(LEAVE)
        self.valid_until = ownership.valid_until

    @property
    def ttl_ms(self) -> int:
        return max(1, round(self.ttl * 1000))

    async def check_registry(self) -> None:
        """Join the live workers; RegistryMismatchError if a live one has other loops."""
        others = await self._beat()
        for worker, theirs in others.items():
            if worker != self.ownership.worker and theirs and theirs != self.fingerprint:
                await self._leave(keys=[keys.WORKERS], args=[self.ownership.worker])
                raise RegistryMismatchError(
                    f"worker {worker!r} has loops and drivers {theirs!r}, this one {self.fingerprint!r}: "
                    "every worker of a cluster must have the same loop packages installed"
                )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._expire)
            while True:
                try:
                    await self.tick()
                except RETRYABLE as exc:
                    log.warning("redis unreachable; leases not renewed", error=repr(exc))
                await trio.sleep(self.ttl / 3)

    async def tick(self) -> None:
        sent = trio.current_time()
        live = await self._beat()
        await self._renew_held(sent)
        target = math.ceil(self.ownership.shards / max(1, len(live)))
        held = sorted(self.ownership.tokens)
        if len(held) > target:  # one shard per tick: a gradual handoff
            await self.release(held[-1])
        if len(self.ownership.tokens) < target:
            await self._acquire_up_to(target, sent)

    async def release(self, shard: int) -> None:
        """Hand ``shard`` back: the host drains it, then the lease is deleted."""
        await self._drain(shard)
        self.valid_until.pop(shard, None)
        token = self.ownership.drop_token(shard)
        if token is not None:
            await self._release(keys=[keys.lease(shard)], args=[token])
            log.info("shard released", shard=shard)

    async def leave(self) -> None:
        """Release every shard and leave the live workers (a clean shutdown)."""
        for shard in sorted(self.ownership.tokens):
            await self.release(shard)
        await self._leave(keys=[keys.WORKERS], args=[self.ownership.worker])

    async def _beat(self) -> dict[str, str]:
        reply: Any = await self._heartbeat(keys=[keys.WORKERS], args=[self.ownership.worker, self.ttl_ms, self.fingerprint])
        items = [str(x) for x in reply][:-1]
        return dict(zip(items[0::2], items[1::2], strict=True))  # worker, fingerprint pairs

    async def _renew_held(self, sent: float) -> None:
        held = sorted(self.ownership.tokens.items())
        if not held:
            return
        answer: Any = await self._renew(
            keys=[keys.lease(shard) for shard, _ in held], args=[self.ttl_ms, *(token for _, token in held)]
        )
        for (shard, token), still in zip(held, answer, strict=True):  # one answer per lease
            if int(still) and self.ownership.tokens.get(shard) == token:
                self.valid_until[shard] = sent + self.ttl * SAFETY
            elif self.ownership.tokens.get(shard) == token:
                log.warning("lease lost", shard=shard)
                self._drop(shard)

    async def _acquire_up_to(self, target: int, sent: float) -> None:
        shards = self.ownership.shards
        # Workers start their search at different shards, so they seldom race for one.
        start = zlib.crc32(self.ownership.worker.encode()) % shards
        for offset in range(shards):
            if len(self.ownership.tokens) >= target:
                return
            shard = (start + offset) % shards
            if shard in self.ownership.tokens:
                continue
            token: Any = await self._acquire(keys=[keys.lease(shard), keys.epoch(shard)], args=[self.ownership.worker, self.ttl_ms])
            if not token:
                continue
            self.valid_until[shard] = sent + self.ttl * SAFETY
            self.ownership.add_token(shard, str(token))
            log.info("shard acquired", shard=shard, token=str(token))
            try:
                await self._acquired(shard)
            except BaseException:
                self._drop(shard)
                raise

    async def _expire(self) -> None:
        """Drop every shard whose lease this worker can no longer vouch for."""
        while True:
            now = trio.current_time()
            for shard, until in list(self.valid_until.items()):
                if now >= until:
                    log.warning("lease expired locally", shard=shard)
                    self._drop(shard)
            await trio.sleep(self.ttl / 20)

    def _drop(self, shard: int) -> None:
        self.valid_until.pop(shard, None)
        if self.ownership.drop_token(shard) is not None:
            self._lost(shard)
