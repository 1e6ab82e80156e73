"""A tool: a name, a JSON-schema description for the model, and an async body."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
import trio

from ..models._adapter import ToolSpec


@attrs.frozen
class ToolContext:
    """What a running tool may know about the agent that called it."""

    session_id: str
    cwd: Path
    call_id: str
    #: The limiter for worker threads the call starts (``trio.to_thread.run_sync(...,
    #: limiter=ctx.threads)``): the runtime's pool for tools, apart from the threads its
    #: store commits in, so calls stuck on a hung filesystem cannot stop persistence.
    #: None outside a runtime: trio's default limiter.
    threads: trio.CapacityLimiter | None = None


@attrs.frozen
class Tool:
    """``run(arguments, ctx)`` returns the text the model sees.

    Raise ``ToolError`` for a failure the model should read as the result; any other
    exception is reported to the model as an internal error and logged.
    """

    name: str
    description: str
    parameters: Mapping[str, Any]
    run: Callable[[Mapping[str, Any], ToolContext], Awaitable[str]] = attrs.field(eq=False)
    #: Declares that the tool changes nothing: an approval policy's ``hints`` default
    #: lets such calls run without asking (runtime._approval_policy).
    read_only: bool = False
    #: Declares that running the call again with the same arguments does no more than
    #: running it once. A call of a ``read_only`` or ``idempotent`` tool that a crash cut
    #: runs again on resume unasked; any other such call may have run, and a person is
    #: asked whether to run it again (actors._step_resume).
    idempotent: bool = False

    @functools.cached_property
    def spec(self) -> ToolSpec:
        # Built once: a tool is frozen, and its spec goes into every model request.
        return ToolSpec(self.name, self.description, self.parameters)
