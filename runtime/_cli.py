"""The ``loopdock`` command: ``demo`` and ``run``."""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import TextIO

import structlog
import trio

from ._driver import AgentHandle
from ._errors import LoopdockError
from ._events import Event
from ._runtime import Runtime, resolve_home

DEMO_AGENTS = {
    "planner": ["Plan a small website.", 'call: list_dir {"path": "."}\nWhat is here?'],
    "coder": ['call: write_file {"path": "hello.txt", "content": "hi"}\nWrite hello.txt.', "Done?"],
    "reviewer": ['call: read_file {"path": "hello.txt"}\nReview hello.txt.'],
}


def _configure_logging(verbose: bool) -> None:
    level = logging.INFO if verbose else logging.WARNING
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
    )


def format_transcript(events: Sequence[Event]) -> list[str]:
    """One line per message or tool call, as a person wants to read it."""
    lines = []
    for event in events:
        data = event.data
        if event.type in ("user/message", "assistant/message", "tool/result"):
            for block in data["content"]:
                if block["type"] == "text" and block["text"]:
                    who = "user" if event.type == "user/message" else "assistant"
                    lines.append(f"  {who:>9}: {block['text']}")
                elif block["type"] == "tool-result":
                    lines.append(f"  {'tool':>9}: {block['content'].replace(chr(10), ' | ')}")
        elif event.type == "tool/call":
            lines.append(f"  {'call':>9}: {data['name']} {data['arguments']}")
        elif event.type == "turn/end":
            lines.append(f"  {'':>9}  (turn {data['turn']} {data['reason']['kind']})")
    return lines


def _print_agent(handle: AgentHandle, out: TextIO) -> None:
    agent = handle.agent
    print(f"== {agent.id}  [{agent.options.provider}/{agent.options.model}]", file=out)
    for line in format_transcript(agent.session.events):
        print(line, file=out)


async def _demo(home: str | None, out: TextIO) -> None:
    with tempfile.TemporaryDirectory(prefix="loopdock-demo-") as scratch:
        async with Runtime.open(home or f"{scratch}/home") as rt:
            handles = []
            for name, messages in DEMO_AGENTS.items():
                handle = await rt.create_agent(
                    session_id=f"{name}-{time.time_ns()}", agent_options={"cwd": scratch}
                )
                for message in messages:
                    handle.agent.followup(message)
                handles.append(handle)
            async with trio.open_nursery() as nursery:  # the agents work concurrently
                for handle in handles:
                    nursery.start_soon(handle.agent.wait_idle)
            for handle in handles:
                _print_agent(handle, out)
            print(f"{len(handles)} agents ran concurrently in one runtime.", file=out)


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
    demo = commands.add_parser("demo", help="several agents at once on the offline ping model")
    demo.add_argument("--home", help="runtime home (default: a temporary directory)")
    run = commands.add_parser("run", help="run one task on one agent and print its transcript")
    run.add_argument("task")
    run.add_argument("--session-id", help="resume this session if it exists, else create it")
    run.add_argument("--home", help="runtime home (default: $LOOPDOCK_HOME or ./.loopdock)")
    run.add_argument("--provider", default="ping")
    run.add_argument("--model", default="ping-1")
    args = parser.parse_args(argv)
    _configure_logging(args.verbose)
    try:
        if args.command == "demo":
            trio.run(_demo, args.home, sys.stdout)
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
