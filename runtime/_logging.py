"""Logging set-up for programs built on loopdock (the CLI, examples, your harness).

The library only logs through ``structlog.get_logger``; configuring where logs go is the
program's choice, so this is a function to call, not something done on import.
"""

from __future__ import annotations

import logging
import sys

import structlog


def configure_logging(*, verbose: bool = False) -> None:
    """Structured logs on stderr: warnings and errors, or everything from info with ``verbose``."""
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO if verbose else logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
    )
