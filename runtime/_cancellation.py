"""Recognising cancellation, which trio may deliver wrapped in exception groups."""

from __future__ import annotations

import trio


def is_cancellation(exc: BaseException) -> bool:
    """True for ``trio.Cancelled``, bare or grouped (as out of a nursery or run_process)."""
    if isinstance(exc, BaseExceptionGroup):
        return all(is_cancellation(e) for e in exc.exceptions)
    return isinstance(exc, trio.Cancelled)
