"""Per-provider admission of rollouts that backs off when the provider pushes back.

Each provider has a gate: at most ``limit`` of its rollouts run at once. A retried model
call (the adapter saw a 429, a 5xx or a broken connection) or a rollout that failed
outright halves the gate's limit (never below 1) and makes new rollouts wait out a
cool-down that doubles with every further sign, up to ``MAX_COOL_DOWN``; each rollout
that succeeds afterwards adds one back, up to the configured limit, and resets the
cool-down. Rollouts already running go on: only admission slows down.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

FIRST_COOL_DOWN = 1.0  # seconds
MAX_COOL_DOWN = 60.0


class ProviderGate:
    def __init__(self, limit: int) -> None:
        self.max_limit = limit
        self._limiter = trio.CapacityLimiter(limit)
        self._cool_down = FIRST_COOL_DOWN
        self._not_before = 0.0  # trio clock
        self.throttles = 0  # how often it backed off, for the progress display

    @property
    def limit(self) -> int:
        return int(self._limiter.total_tokens)

    @property
    def running(self) -> int:
        return self._limiter.borrowed_tokens

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold one of the provider's slots; waits for a free one and any cool-down."""
        async with self._limiter:
            # Not a poll: each pass sleeps until the cool-down ends, and looks again only
            # because a throttle meanwhile may have pushed that end later.
            while (wait := self._not_before - trio.current_time()) > 0:  # noqa: ASYNC110 - a deadline that moves
                await trio.sleep(wait)
            yield

    def throttled(self) -> None:
        """The provider pushed back: admit fewer rollouts, after a pause."""
        self.throttles += 1
        self._limiter.total_tokens = max(1, self.limit // 2)
        self._not_before = max(self._not_before, trio.current_time() + self._cool_down)
        self._cool_down = min(self._cool_down * 2, MAX_COOL_DOWN)

    def succeeded(self) -> None:
        self._cool_down = FIRST_COOL_DOWN
        if self.limit < self.max_limit:
            self._limiter.total_tokens = self.limit + 1
