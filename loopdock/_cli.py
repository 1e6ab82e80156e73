"""The ``loopdock`` command: ``demo``, ``run``, ``bench``, ``serve`` and ``dsh-patch``."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

import trio

from actors import AgentHandle
from actors.dock import read_binding
from benchmarks._run import add_arguments as add_bench_arguments
from benchmarks._run import run_from_args as run_bench
from bridge._patch import dsh_patch_command
from runtime._errors import LoopdockError
from runtime._events import Event
from runtime._home import resolve_home
from runtime._logging import configure_logging

from ._runtime import Runtime
from ._serve import serve_command
from .experiment._command import add_arguments as add_experiment_arguments
from .experiment._command import run_command as run_experiment_command

# loopdock's founding demo: two agents, two models, two loops, one runtime.
DEMO_AGENTS = (
    ("flash", "deepseek-v4-flash", "standard"),
    ("pro", "deepseek-v4-pro", "minimal-first"),
)
# On the offline ping model a `call:` line makes it call that tool; a real model reads
# the same text as an instruction.
DEMO_TASK = 'call: list_dir {"path": "."}\nList the files here, then say which one to read first.'


def format_transcript(events: Sequence[Event]) -> list[str]:
    """One entry per message or tool call, as a person wants to read it."""
    lines: list[str] = []
    for event in events:
        data = event.data
        if event.type in ("user/message", "assistant/message", "tool/result"):
            for block in data["content"]:
                if block["type"] == "text" and block["text"]:
                    who = "user" if event.type == "user/message" else "assistant"
                    lines.append(f"  {who:>9}: " + block["text"].replace("\n", "\n" + " " * 13))
                elif block["type"] == "tool-result":
                    lines.append(f"  {'tool':>9}: {block['content'].replace(chr(10), ' | ')}")
        elif event.type == "tool/call":
            lines.append(f"  {'call':>9}: {data['name']} {data['arguments']}")
        elif event.type == "turn/end":
            lines.append(f"  {'':>9}  (turn {data['turn']} {data['reason']['kind']})")
    return lines


def _print_agent(handle: AgentHandle, out: TextIO) -> None:
    agent = handle.agent
    binding = read_binding(agent.session.events)  # read back from the log, not assumed
    where = f"loop {binding.loop} on driver {binding.driver or '-'}" if binding else "no binding"
    print(f"== {agent.id}  [{agent.options.provider}/{agent.options.model}, {where}]", file=out)
    for line in format_transcript(agent.session.events):
        print(line, file=out)


async def _demo(home: str | None, out: TextIO) -> None:
    provider = "deepseek" if os.environ.get("DEEPSEEK_API_KEY") else "ping"
    with tempfile.TemporaryDirectory(prefix="loopdock-demo-") as scratch:
        work = Path(scratch, "work")
        work.mkdir()
        for name in ("README.md", "notes.txt"):
            (work / name).write_text(f"{name}: demo file\n")
        async with Runtime.open(home or Path(scratch, "home")) as rt:
            handles = []
            for name, model, loop in DEMO_AGENTS:
                handle = await rt.create_agent(
                    session_id=f"{name}-{time.time_ns()}",
                    loop=loop,
                    agent_options={"provider": provider, "model": model, "cwd": str(work)},
                )
                handle.agent.followup(DEMO_TASK)
                handles.append(handle)
            async with trio.open_nursery() as nursery:  # the agents work concurrently
                for handle in handles:
                    nursery.start_soon(handle.agent.wait_idle)
            for handle in handles:
                _print_agent(handle, out)
            print(f"{len(handles)} agents, {len(handles)} loops, one runtime.", file=out)


async def _run(task: str, session_id: str | None, home: str | None, provider: str, model: str, out: TextIO) -> None:
    async with Runtime.open(resolve_home(home)) as rt:
        options = {"provider": provider, "model": model}
        sid = session_id or f"run-{time.time_ns()}"
        persisted = {h.id for h in await rt.list_sessions()}
        if sid in persisted:
            handle = await rt.resume_agent(resume_session_id=sid, agent_options=options)
        else:
            handle = await rt.create_agent(session_id=sid, agent_options=options)
        handle.agent.followup(task)
        await handle.agent.wait_idle()
        _print_agent(handle, out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="loopdock", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log at info level")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="two agents on two loops at once (offline unless DEEPSEEK_API_KEY)")
    demo.add_argument("--home", help="runtime home (default: a temporary directory)")
    run = commands.add_parser("run", help="run one task on one agent and print its transcript")
    run.add_argument("task")
    run.add_argument("--session-id", help="resume this session if it exists, else create it")
    run.add_argument("--home", help="runtime home (default: $LOOPDOCK_HOME or ./.loopdock)")
    run.add_argument("--provider", default="ping")
    run.add_argument("--model", default="ping-1")
    bench = commands.add_parser("bench", help="measure many agents, human priority, floor and peer (benchmarks/)")
    add_bench_arguments(bench)
    serve = commands.add_parser(
        "serve",
        help="the websocket bridge for DSH hosts and GoalBar clients, until interrupted",
        description="Run the runtime and its websocket bridge (on 127.0.0.1 by default) until interrupted: DSH hosts "
        "connect to ws://HOST:PORT/dsh, and a browser opens the GoalBar of one session at "
        "http://HOST:PORT/goalbar?session=<id>#token=<token> (the token is in <home>/bridge.token).",
    )
    serve.add_argument("--port", type=int, default=0, help="port to listen on (default: any free port)")
    serve.add_argument("--host", help="address to bind (default: 127.0.0.1)")
    serve.add_argument("--home", help="runtime home (default: $LOOPDOCK_HOME or ./.loopdock)")
    serve.add_argument(
        "--no-loopx", action="store_true",
        help="leave the LoopX integration off (it is on by default); the GoalBar then shows no bar (reason loopx-off)",
    )
    serve.add_argument(
        "--project", metavar="DIR",
        help="the LoopX project (its .loopx/) the GoalBar reads for sessions this runtime does not run, "
        "e.g. DSH's (default: the current directory); a runtime agent's session uses the agent's cwd",
    )
    patch = commands.add_parser("dsh-patch", help="write the DSH patch file that loads the bridge plugin")
    patch.add_argument("--url", required=True, help="the bridge, e.g. ws://127.0.0.1:PORT (path /dsh is added)")
    patch.add_argument("--out", required=True, help="directory to write patch.yml into")
    patch.add_argument("--dock", action="store_true", help="dock mode: the runtime selects every agent's loop")
    patch.add_argument("--drivers", default="default", help="dock drivers, comma separated (default: default)")
    patch.add_argument("--ping", action="store_true", help="register the offline ping model as DSH's default")
    patch.add_argument("--home", help="runtime home holding bridge.token (default: $LOOPDOCK_HOME or ./.loopdock)")
    experiment = commands.add_parser("experiment", help="one task set across a model x loop matrix: run, report, export")
    add_experiment_arguments(experiment)
    args = parser.parse_args(argv)
    configure_logging(verbose=args.verbose)
    if args.command == "bench":
        try:
            return run_bench(args)
        except KeyboardInterrupt:
            return 130
    try:
        if args.command == "demo":
            trio.run(_demo, args.home, sys.stdout)
        elif args.command == "dsh-patch":
            drivers = [d.strip() for d in args.drivers.split(",") if d.strip()]
            dsh_patch_command(
                args.url, args.out, dock=args.dock, drivers=drivers, ping=args.ping, home=args.home, out=sys.stdout
            )
        elif args.command == "experiment":
            return run_experiment_command(args, sys.stdout, sys.stderr)
        elif args.command == "serve":
            trio.run(serve_command, args.home, args.host, args.port, sys.stdout, not args.no_loopx, args.project)
        else:
            trio.run(_run, args.task, args.session_id, args.home, args.provider, args.model, sys.stdout)
    except LoopdockError as exc:
        print(f"loopdock: {exc.code}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
