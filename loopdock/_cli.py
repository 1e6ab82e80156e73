"""The ``loopdock`` command: demo, run, serve, sessions, dsh-patch, dsh-install, dsh-migrate, bench."""

from __future__ import annotations

import argparse
import functools
import logging
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from importlib import metadata
from pathlib import Path
from typing import Any, TextIO

import trio

from loopdock.actors import PASSIVATE_AFTER, AgentActor, AgentHandle, check_passivate_after
from loopdock.actors.dock import read_binding
from loopdock.benchmarks import add_arguments as add_bench_arguments
from loopdock.benchmarks import run_from_args as run_bench
from loopdock.bridge import SERVE_LOGGER, dsh_patch_command
from loopdock.runtime import Event, LoopdockError, configure_logging, resolve_home
from loopdock.runtime.tools import ShellPolicy

from . import _approve, _goal, _install, _sessions
from ._otlp import OTLP_ENV
from ._runtime import Runtime
from ._serve import serve_command
from .experiment._command import add_arguments as add_experiment_arguments
from .experiment._command import run_command as run_experiment_command

DESCRIPTION = """\
loopdock: a trio runtime in which every agent runs its own agent loop.

  loopdock demo                      two agents on two loops, offline
  loopdock run "task"                one task on one agent; prints its transcript
  loopdock serve --port 8765         the bridge for DSH hosts, the console and the GoalBar
  loopdock dsh-install               loopdock's plugin in a DSH profile (dsh web, dsh headless)
  loopdock sessions list             every session: loop, driver, status, turns
  loopdock sessions approve ID AP    answer a stopped session's approval question
  loopdock goal bind --session ID    a LoopX goal for a session's GoalBar

-v (anywhere on the line) logs at info level on stderr."""

# loopdock's founding demo: two agents, two models, two loops, one runtime.
DEMO_AGENTS = (
    ("flash", "deepseek-v4-flash", "standard"),
    ("pro", "deepseek-v4-pro", "minimal-first"),
)
# On the offline ping model a `call:` line makes it call that tool; a real model reads
# the same text as an instruction.
DEMO_TASK = 'call: list_dir {"path": "."}\nList the files here, then say which one to read first.'


class TurnFailedError(LoopdockError):
    """Raised by ``run`` and ``demo`` when a turn they ran ended ``error``."""

    code = "TURN_FAILED"


class ApprovalPendingError(LoopdockError):
    """Raised by ``run`` when its agent waits for a person's answer: nobody at this
    command gives one, and the question stays open in the session's log."""

    code = "APPROVAL_PENDING"


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


async def _print_agent(handle: AgentHandle, out: TextIO) -> None:
    agent = handle.agent
    events = await agent.session.read_events()
    binding = read_binding(events)  # read back from the log, not assumed
    where = f"loop {binding.loop} on driver {binding.driver or '-'}" if binding else "no binding"
    print(f"== {agent.id}  [{agent.options.provider}/{agent.options.model}, {where}]", file=out)
    for line in format_transcript(events):
        print(line, file=out)


async def _check_turns(handles: Sequence[AgentHandle], since: int = 0) -> None:
    """TurnFailedError naming every turn from event ``since`` on that ended ``error``
    (the exit status says so)."""
    failed = []
    for handle in handles:
        for event in await handle.agent.session.read_events(since):
            reason = event.data.get("reason") if event.type == "turn/end" else None
            if isinstance(reason, dict) and reason.get("kind") == "error":
                detail = reason.get("message") or reason.get("error") or reason.get("code") or ""
                failed.append(f"{handle.agent.id} turn {event.data.get('turn')}" + (f": {detail}" if detail else ""))
    if failed:
        raise TurnFailedError("a turn ended with an error: " + "; ".join(str(f)[:300] for f in failed))


def _make_demo_scratch() -> tempfile.TemporaryDirectory[str]:
    scratch = tempfile.TemporaryDirectory(prefix="loopdock-demo-")
    work = Path(scratch.name, "work")
    work.mkdir()
    for name in ("README.md", "notes.txt"):
        (work / name).write_text(f"{name}: demo file\n")
    return scratch


@asynccontextmanager
async def _demo_scratch() -> AsyncIterator[Path]:
    """A temporary folder with the demo's ``work`` folder (two files in it), removed
    afterwards; both on the disk in a worker thread."""
    scratch = await trio.to_thread.run_sync(_make_demo_scratch)
    try:
        yield Path(scratch.name)
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(scratch.cleanup)


async def _demo(home: str | None, out: TextIO) -> None:
    provider = "deepseek" if os.environ.get("DEEPSEEK_API_KEY") else "ping"
    async with _demo_scratch() as scratch:
        work = scratch / "work"
        async with Runtime.open(home or scratch / "home") as rt:
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
                await _print_agent(handle, out)
            print(f"{len(handles)} agents, {len(handles)} loops, one runtime.", file=out)
            await _check_turns(handles)


async def _run(
    task: str, session_id: str | None, home: str | None, provider: str, model: str, config: str | None, out: TextIO
) -> None:
    async with Runtime.open(resolve_home(home), config=config) as rt:
        options = {"provider": provider, "model": model}
        sid = session_id or f"run-{time.time_ns()}"
        persisted = {h.id for h in await rt.list_sessions()}
        if sid in persisted:
            handle = await rt.resume_agent(resume_session_id=sid, agent_options=options)
        else:
            handle = await rt.create_agent(session_id=sid, agent_options=options)
        before = handle.agent.session.event_count  # this task's turn is logged from here on
        if not handle.agent.pending_approvals():  # a resumed turn asking: the task would wait behind it
            handle.agent.followup(task)
            await _idle_unless_asked(handle.agent)
        _check_answered(handle.agent)
        await _print_agent(handle, out)
        await _check_turns([handle], since=before)


async def _idle_unless_asked(agent: AgentActor) -> None:
    """Wait until ``agent`` is idle, or one of its tool calls asks a person."""
    async with trio.open_nursery() as nursery:

        async def idle() -> None:
            await agent.wait_idle()
            nursery.cancel_scope.cancel()

        nursery.start_soon(idle)
        await agent.wait_approvals()
        nursery.cancel_scope.cancel()


def _check_answered(agent: AgentActor) -> None:
    """ApprovalPendingError naming the agent's open questions and how to answer them."""
    pending = agent.pending_approvals()
    if pending:
        asked = "; ".join(f"{a.id} ({a.tool}: {a.reason[:200]})" for a in pending)
        raise ApprovalPendingError(
            f"session {agent.id} waits for a person's answer to {asked}. Answer with "
            f"`loopdock sessions approve {agent.id} {pending[0].id} [--refuse REASON]` (same --home); "
            f"the next `loopdock run --session-id {agent.id} ...` goes on from there"
        )


def _version() -> str:
    try:
        return metadata.version("loopdock")
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def _dsh_home_or_none(value: str | None) -> Path | None:
    raw = value or os.environ.get("DSH_HOME")
    return Path(raw).expanduser().absolute() if raw else None


def _parser() -> argparse.ArgumentParser:
    # -v anywhere: on the main parser and on every subcommand (SUPPRESS keeps a
    # subcommand from resetting what the main parser already read).
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="log at info level (stderr)")
    fmt = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(prog="loopdock", description=DESCRIPTION, formatter_class=fmt, parents=[common])
    parser.add_argument("--version", action="version", version=f"loopdock {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help: str, description: str | None = None) -> argparse.ArgumentParser:
        return commands.add_parser(name, help=help, description=description or help, formatter_class=fmt, parents=[common])

    home_help = "runtime home (default: $LOOPDOCK_HOME, else $XDG_DATA_HOME/loopdock, i.e. ~/.local/share/loopdock)"
    demo = command("demo", "two agents on two loops at once (offline unless DEEPSEEK_API_KEY is set)")
    demo.add_argument("--home", help="runtime home (default: a temporary directory)")

    run = command("run", "run one task on one agent and print its transcript",
                  "Run one task on one agent and print its transcript. The exit status is 1 if the turn ended with an error.")
    run.add_argument("task")
    run.add_argument("--session-id", help="resume this session if it exists, else create it")
    run.add_argument("--home", help=home_help)
    run.add_argument("--config", metavar="FILE", help="the dock's YAML config (as Runtime.open(config=...))")
    run.add_argument("--provider", default="ping", help="model provider: ping (offline, default) or deepseek")
    run.add_argument("--model", default="ping-1")

    serve = command(
        "serve", "the bridge for DSH hosts, the console and the GoalBar, until interrupted",
        "Run the runtime and its websocket bridge on 127.0.0.1 until interrupted. DSH hosts connect to\n"
        "ws://HOST:PORT/dsh (see dsh-install and dsh-patch); a browser opens the console at\n"
        "http://HOST:PORT/console and one session's GoalBar at http://HOST:PORT/goalbar?session=<id>\n"
        "(both printed at start, with the token from <home>/bridge.token in the #token= fragment).",
    )
    serve.add_argument("--port", type=int, default=0, help="port to listen on (default: any free port)")
    serve.add_argument("--host", help="address to bind (default: 127.0.0.1)")
    serve.add_argument("--home", help=home_help)
    serve.add_argument("--config", metavar="FILE", help="the dock's YAML config: loops, routes, agents (examples/agents.example.yml)")
    serve.add_argument("--shell-allow", metavar="EXE,...", help="enable the shell tool for the runtime's own agents, for these executables")
    serve.add_argument("--no-loopx", action="store_true",
                       help="leave the LoopX integration off (it is on by default); the GoalBar then shows no bar")
    serve.add_argument("--project", metavar="DIR",
                       help="the LoopX project (its .loopx/) of sessions no agent names one for (default: the current directory)")
    serve.add_argument("--cluster", metavar="URL",
                       help="also show the agents of the cluster at redis://HOST:PORT/DB on the console; its workers "
                            "must have this dock's loops (docs/cluster.md)")
    serve.add_argument("--otlp", metavar="URL", default=os.environ.get(OTLP_ENV) or None,
                       help=f"export the agents' traces to this OTLP/HTTP collector, e.g. http://127.0.0.1:4318 "
                            f"(default: ${OTLP_ENV}; needs pip install 'loopdock[otel]')")

    worker = command(
        "worker", "run agents as one worker of a Redis cluster, until interrupted",
        "Join the cluster at --cluster and run the agents of the shards this worker holds leases on,\n"
        "until SIGINT or SIGTERM; then hand the shards back. Every worker of a cluster must have the\n"
        "same loop packages (a mismatch is refused at start). See docs/cluster.md.",
    )
    worker.add_argument("--cluster", required=True, metavar="URL", help="the cluster's Redis: redis://HOST:PORT/DB")
    worker.add_argument("--home", help="the worker's own files (default: workers/<id> under the default home)")
    worker.add_argument("--config", metavar="FILE", help="the dock's YAML config (the same on every worker)")
    worker.add_argument("--shards", type=int, help="the cluster's shard count, fixed by its first worker (default: 32)")
    worker.add_argument("--lease-ttl", type=float, default=10.0, metavar="SECONDS",
                        help="a shard lease's time to live: a dead worker's shards move within about this (default: 10)")
    worker.add_argument("--id", help="this worker's name (default: host-pid-random)")
    worker.add_argument("--shell-allow", metavar="EXE,...", help="enable the shell tool for these executables")
    worker.add_argument("--passivate-after", type=_passivate_after, default=PASSIVATE_AFTER, metavar="SECONDS",
                        help="passivate an agent idle this long, until its next message; 'never' keeps every agent "
                             f"in memory (default: {PASSIVATE_AFTER:g})")

    sessions = command("sessions", "list the sessions, show one, follow one, or answer its question")
    verbs = sessions.add_subparsers(dest="verb", required=True, metavar="VERB")
    for name, text in (("list", "every session of the runtime and of DSH: loop, driver, status, turns, last event"),
                       ("show", "one session's whole history"), ("tail", "one session's last events, then new ones")):
        verb = verbs.add_parser(name, help=text, description=text, parents=[common])
        if name != "list":
            verb.add_argument("session_id", metavar="ID")
        if name == "list":
            verb.add_argument("-q", "--quiet", action="store_true", help="only the ids, the most recently active last")
        if name == "tail":
            verb.add_argument("-n", "--lines", type=int, default=10, help="how many past events to print first")
            verb.add_argument("--no-follow", action="store_true", help="print and exit")
        verb.add_argument("--home", help=home_help)
        verb.add_argument("--dsh-home", help="DSH's home, for its sessions (default: $DSH_HOME)")
    text = "answer an open approval question of a session no runtime is running (approve, or --refuse)"
    verb = verbs.add_parser("approve", help=text, description=text, parents=[common])
    verb.add_argument("session_id", metavar="ID")
    verb.add_argument("approval_id", metavar="APPROVAL_ID")
    verb.add_argument("--refuse", metavar="REASON", help="refuse the call; the model reads REASON")
    verb.add_argument("--home", help=home_help)

    install = command(
        "dsh-install", "install loopdock's plugin into a DSH profile and verify it with dsh",
        "Copy the DSH plugin under the runtime home, write its rows into\n"
        "$DSH_HOME/profiles/NAME/cordis.patch.yml (your other rows stay), and check with\n"
        "`dsh --profile NAME --dump-config` that DSH loads it. Reinstalling loopdock does not break it.",
    )
    install.add_argument("--profile", default="web", help="DSH profile (default: web; also headless, sdk, acp)")
    install.add_argument("--url", default=_install.DEFAULT_URL, help=f"the bridge (default: {_install.DEFAULT_URL})")
    install.add_argument("--dock", action="store_true", help="dock mode: the runtime selects every agent's loop")
    install.add_argument("--drivers", default="default", help="dock drivers, comma separated (default: default)")
    install.add_argument("--ping", action="store_true", help="make the offline ping model DSH's default")
    install.add_argument("--home", help=home_help)
    install.add_argument("--dsh-home", help="DSH's home (default: $DSH_HOME)")

    goal = command("goal", "LoopX goals of sessions (what their GoalBar shows)")
    goal_verbs = goal.add_subparsers(dest="verb", required=True, metavar="VERB")
    bind = goal_verbs.add_parser(
        "bind", help="make a LoopX goal and bind a session to it (run in the session's project)",
        description="Make a LoopX goal with one agent lane in the project, and bind the session to it\n"
        "(bootstrap, register-agent, todo add, bind-agent-thread). Needs loopx on PATH with Node >= 22.22.3.",
        formatter_class=fmt, parents=[common],
    )
    bind.add_argument("--session", required=True, metavar="ID", help="the session (a DSH session id, or a runtime agent's)")
    bind.add_argument("--goal-id", required=True, help="the goal's id, e.g. release-notes")
    bind.add_argument("--objective", required=True, help="what the goal is for, in a sentence")
    bind.add_argument("--todo", action="append", default=[], metavar="TEXT", help="a todo of the lane (repeatable)")
    bind.add_argument("--agent-id", help="the agent lane's id (default: one derived from the session id)")
    bind.add_argument("--project", metavar="DIR", help="the project holding .loopx/ (default: the current directory)")

    migrate = command("dsh-migrate", "move dock bindings of older plugins in DSH's logs to where dsh headless accepts them")
    migrate.add_argument("--dsh-home", help="DSH's home (default: $DSH_HOME)")

    patch = command("dsh-patch", "write a DSH patch file that loads the bridge plugin (dsh ... --patch FILE)")
    patch.add_argument("--url", required=True, help="the bridge, e.g. ws://127.0.0.1:PORT (path /dsh is added)")
    patch.add_argument("--out", required=True, help="directory to write patch.yml into")
    patch.add_argument("--dock", action="store_true", help="dock mode: the runtime selects every agent's loop")
    patch.add_argument("--drivers", default="default", help="dock drivers, comma separated (default: default)")
    patch.add_argument("--ping", action="store_true", help="register the offline ping model as DSH's default")
    patch.add_argument("--home", help=home_help)

    bench = command("bench", "measure many agents, human priority, floor and peer (benchmarks/)")
    add_bench_arguments(bench)

    experiment = command("experiment", "one task set across a model x loop matrix: run, report, export")
    add_experiment_arguments(experiment, [common])
    return parser


def _drivers(value: str) -> list[str]:
    return [d.strip() for d in value.split(",") if d.strip()]


def _passivate_after(value: str) -> float | None:
    if value == "never":
        return None
    try:
        return check_passivate_after(float(value))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a positive number of seconds or 'never', not {value!r}") from None


def _dispatch(args: Any, out: TextIO) -> int:
    if args.command == "demo":
        trio.run(_demo, args.home, out)
    elif args.command == "run":
        trio.run(_run, args.task, args.session_id, args.home, args.provider, args.model, args.config, out)
    elif args.command == "serve":
        # A server says what it does: session starts and ends, loop decisions (info).
        logging.getLogger(SERVE_LOGGER).setLevel(logging.INFO)
        allowed: frozenset[str] = frozenset(_drivers(args.shell_allow or ""))
        # (mypy reads attrs' converter=frozenset as wanting a bare Iterable[_T_co])
        shell = ShellPolicy(allow=allowed) if allowed else None  # type: ignore[arg-type]
        trio.run(functools.partial(
            serve_command, args.home, args.host, args.port, out, not args.no_loopx, args.project,
            config=args.config, shell=shell, cluster=args.cluster, otlp=args.otlp,
        ))
    elif args.command == "worker":
        from ._worker import worker_command  # needs coredis: pip install 'loopdock[cluster]'

        allow: frozenset[str] = frozenset(_drivers(args.shell_allow or ""))
        trio.run(functools.partial(
            worker_command, args.cluster, out, home=args.home, config=args.config, shards=args.shards,
            lease_ttl=args.lease_ttl, worker_id=args.id, passivate_after=args.passivate_after,
            shell=ShellPolicy(allow=allow) if allow else None,  # type: ignore[arg-type]
        ))
    elif args.command == "sessions" and args.verb == "approve":
        _approve.approve_command(resolve_home(args.home), args.session_id, args.approval_id, args.refuse, out)
    elif args.command == "sessions":
        home, dsh_home = resolve_home(args.home), _dsh_home_or_none(args.dsh_home)
        if args.verb == "list":
            found = _sessions.summaries(home, dsh_home)
            if args.quiet:
                for summary in sorted(found, key=lambda s: s.last_time or 0):
                    print(summary.id, file=out)
            else:
                _sessions.print_list(found, out)
        elif args.verb == "show":
            _sessions.show(home, dsh_home, args.session_id, out)
        else:
            _sessions.tail(home, dsh_home, args.session_id, out, lines=args.lines, follow=not args.no_follow)
    elif args.command == "dsh-install":
        _install.install_command(
            profile=args.profile, url=args.url, home=args.home, dsh_home_arg=args.dsh_home, dock=args.dock,
            drivers=_drivers(args.drivers), ping=args.ping, out=out,
        )
    elif args.command == "goal":
        trio.run(functools.partial(
            _goal.bind_command, session_id=args.session, goal_id=args.goal_id, objective=args.objective,
            agent_id=args.agent_id, todos=args.todo, project=args.project, out=out,
        ))
    elif args.command == "dsh-migrate":
        return _install.migrate_command(args.dsh_home, out)
    elif args.command == "dsh-patch":
        dsh_patch_command(args.url, args.out, dock=args.dock, drivers=_drivers(args.drivers), ping=args.ping,
                          home=args.home, out=out)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    configure_logging(verbose=getattr(args, "verbose", False))
    try:
        if args.command == "bench":
            return run_bench(args)
        if args.command == "experiment":
            return run_experiment_command(args, sys.stdout, sys.stderr)
        return _dispatch(args, sys.stdout)
    except TurnFailedError as exc:
        print(f"loopdock: {exc.code}: {exc}", file=sys.stderr)
        return 1
    except LoopdockError as exc:
        print(f"loopdock: {exc.code}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a file or socket the user named; a one-line reason
        print(f"loopdock: {exc.strerror or exc}{': ' + str(exc.filename) if exc.filename else ''}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        if exc.name != "coredis":
            raise
        print("loopdock: the cluster needs coredis: pip install 'loopdock[cluster]'", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
