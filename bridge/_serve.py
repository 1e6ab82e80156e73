"""``loopdock serve``: the runtime and its bridge server, until interrupted."""

from __future__ import annotations

import functools
import signal
from typing import TextIO

import trio

from runtime._runtime import Runtime, resolve_home
from runtime.loopx import LoopxSettings

from ._dock_select import DockSelectHandler
from ._server import DEFAULT_HOST, serve_bridge
from ._token import TOKEN_FILE, load_or_create_token


async def serve_command(home: str | None, host: str | None, port: int, out: TextIO, loopx: bool = True) -> None:
    """Open the runtime on ``home``, serve the bridge (the runtime's loop dock answers
    DSH hosts' loop selection) on ``host`` (default loopback) and
    ``port`` (0: any free port), print one readiness line on ``out``, and run until SIGINT
    or SIGTERM; then close everything (sessions made durable). ``loopx``: enable the LoopX
    integration (continuation drivers, /loopx-init, start-up initialisation)."""
    host = host or DEFAULT_HOST
    # The LoopX integration is on for serve: start-up initialises the CLI and the skills
    # (a failure is a safe diagnostic in rt.loopx.startup; /loopx-init repairs it).
    async with Runtime.open(resolve_home(home), loopx=LoopxSettings() if loopx else None) as rt:
        token = await trio.to_thread.run_sync(load_or_create_token, rt.home)
        async with trio.open_nursery() as nursery:
            bound = await nursery.start(
                functools.partial(serve_bridge, DockSelectHandler(rt), token=token, host=host, port=port)
            )
            print(f"loopdock serve: ws://{host}:{bound} (token in {rt.home / TOKEN_FILE})", file=out, flush=True)
            # SIGTERM too: a supervisor stopping us should get the same clean close as ^C.
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for _ in signals:
                    break
            nursery.cancel_scope.cancel()
