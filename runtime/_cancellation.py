"""Recognising cancellation, which trio may deliver wrapped in exception groups."""

from __future__ import annotations

import trio


def is_cancellation(exc: BaseException) -> bool:
    """True for ``trio.Cancelled``, bare or grouped (as out of a nursery or run_process)."""
    if isinstance(exc, BaseExceptionGroup):
        return all(is_cancellation(e) for e in exc.exceptions)
    return isinstance(exc, trio.Cancelled)


def split_cancellation(exc: BaseException) -> tuple[BaseException | None, BaseException | None]:
    """``exc`` as (its ``trio.Cancelled`` part, the rest), either None when empty; a
    group is split keeping its nesting."""
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(trio.Cancelled)
    if isinstance(exc, trio.Cancelled):
        return exc, None
    return None, exc
