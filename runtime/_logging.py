"""Logging for loopdock's own modules, and a set-up for programs built on it.

A library leaves logging to the program: every loopdock logger is a structlog logger over
the standard library's ``logging.getLogger("loopdock.<module>")``, rendered as one
``key=value`` line. A program that configures nothing sees warnings and errors only, on
stderr (``logging``'s last-resort handler); one that configures ``logging`` (or calls
``configure_logging``) decides the level and the destination, as for any library. A
program that configures structlog itself (``structlog.configure``, or structlog's
``capture_logs`` in tests) gets loopdock's events through its own processors instead.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator, Sequence
from typing import Any, overload

import structlog

ROOT_LOGGER = "loopdock"

_RENDER = structlog.processors.KeyValueRenderer(key_order=["event"], drop_missing=True)


def _render(logger: Any, method: str, event: dict[str, Any]) -> tuple[tuple[str], dict[str, Any]]:
    # A traceback is the logging handler's to format (once), not a field of the line.
    exc_info = event.pop("exc_info", None)
    return (_RENDER(logger, method, event),), ({"exc_info": exc_info} if exc_info else {})


_PROCESSORS: list[Any] = [
    structlog.stdlib.filter_by_level,  # first: a dropped level costs one isEnabledFor
    _render,
]


class _Processors(Sequence[Any]):
    """The program's structlog processors if it configured structlog, else ours; read
    at every event, so a configuration made after import (or a test's) applies."""

    def _current(self) -> Sequence[Any]:
        return structlog.get_config()["processors"] if structlog.is_configured() else _PROCESSORS

    def __iter__(self) -> Iterator[Any]:
        return iter(self._current())

    def __len__(self) -> int:
        return len(self._current())

    @overload
    def __getitem__(self, index: int) -> Any: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Any]: ...
    def __getitem__(self, index: int | slice) -> Any:
        return self._current()[index]


_CHOSEN = _Processors()


def get_logger(name: str) -> Any:
    """The logger of module ``name`` (under ``loopdock.``); bind fields with ``.bind``."""
    qualified = name if name == ROOT_LOGGER or name.startswith(ROOT_LOGGER + ".") else f"{ROOT_LOGGER}.{name}"
    return structlog.wrap_logger(
        logging.getLogger(qualified), processors=_CHOSEN, wrapper_class=structlog.stdlib.BoundLogger
    )


def configure_logging(*, verbose: bool = False) -> None:
    """For programs: loopdock's logs on stderr, warnings and errors only, or everything
    from info on with ``verbose``. Other libraries' loggers are left as they are."""
    logger = logging.getLogger(ROOT_LOGGER)
    logger.setLevel(logging.INFO if verbose else logging.WARNING)
    if not any(getattr(h, "_loopdock", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("loopdock %(levelname)s %(name)s: %(message)s"))
        handler._loopdock = True  # type: ignore[attr-defined]  # our mark, so a second call adds no second handler
        logger.addHandler(handler)
    logger.propagate = False
