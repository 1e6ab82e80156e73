"""The GoalBar service on the REAL loopx CLI (2.1.1, Node 22 from scripts/test).

Covers the seed's GoalBar verification items: reconstruction after a restart, a source
change forcing an authoritative re-read, runtime-only wakes creating no state, stale
binding rejection, serialized lifecycle mutations and the post-mutation readback. Each CLI
call costs ~0.7 s and a GoalBar read is three of them, so each test builds only what it
needs. Nothing sleeps to synchronise: tests wait on reads, watch iterators and results.
"""

import functools
import json
from contextlib import aclosing
from pathlib import Path

import attrs
import pytest
import trio
from trio_websocket import open_websocket

from loopdock.bridge._goalbar import (
    MAX_GOAL_TEXT,
    GoalBarHandler,
    GoalBarHidden,
    GoalBarService,
    GoalBarVisible,
    goal_state_file,
    state_to_json,
)
from loopdock.bridge._server import serve_bridge
from loopdock.runtime.loopx import HOST_SURFACE, LifecycleResult, LoopxClient, LoopxOk

PHASE = 90
SESSION = "dsh-session-goalbar-1"


class CountingClient(LoopxClient):
    """The real client, counting lifecycle executions and how many overlap."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.in_flight = 0
        self.max_in_flight = 0
        self.executed: list[str] = []

    async def goal_lifecycle(self, goal_id, operation, *, execute):
        if not execute:
            return await super().goal_lifecycle(goal_id, operation, execute=False)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return await super().goal_lifecycle(goal_id, operation, execute=True)
        finally:
            self.in_flight -= 1
            self.executed.append(operation)


class UnverifiedClient(LoopxClient):
    """A real client whose "executions" are only previews: LoopX's answer then carries
    ``readback: not_executed``, which the GoalBar must not show as success."""

    async def goal_lifecycle(self, goal_id, operation, *, execute):
        return await super().goal_lifecycle(goal_id, operation, execute=False)


@pytest.fixture
def client(loopx_command, loopx_project, loopx_env, loopx_runtime_root) -> CountingClient:
    return CountingClient(
        loopx_command, project=loopx_project, env=loopx_env, timeout=60, runtime_root=loopx_runtime_root
    )


def service(client: LoopxClient, **kwargs):
    return GoalBarService.open(lambda project: client, **kwargs)


async def ok(client: LoopxClient, *args: str) -> dict:
    result = await client.run(*args)
    assert isinstance(result, LoopxOk), (args, result)
    return dict(result.payload)


async def new_goal(client: LoopxClient, goal_id: str, *agent_ids: str, objective: str | None = None) -> None:
    objective = objective if objective is not None else f"Test goal {goal_id}"
    await ok(client, "bootstrap", "--project", ".", "--goal-id", goal_id, "--objective", objective,
             "--adapter-kind", "read_only_project_map_v0", "--adapter-status", "connected-read-only")
    for agent_id in agent_ids:
        await ok(client, "register-agent", "--goal-id", goal_id, "--agent-id", agent_id, "--require-new", "--execute")


async def bind(client: LoopxClient, goal_id: str, agent_id: str, thread_id: str, *, unbind: bool = False) -> None:
    verb = "unbind-agent-thread" if unbind else "bind-agent-thread"
    await ok(client, verb, "--goal-id", goal_id, "--thread-id", thread_id,
             "--host-surface", HOST_SURFACE, "--agent-id", agent_id, "--execute")


async def add_todo(client: LoopxClient, goal_id: str, agent_id: str, text: str) -> None:
    await ok(client, "todo", "add", "--goal-id", goal_id, "--project", ".", "--role", "agent",
             "--claimed-by", agent_id, "--task-class", "advancement_task", "--text", text)


async def lifecycle_state(client: LoopxClient, goal_id: str) -> str:
    preview = await client.goal_lifecycle(goal_id, "stop", execute=False)
    assert isinstance(preview, LifecycleResult)
    return preview.before_state


async def test_hidden_visible_counts_and_reconstruction_after_restart(client, loopx_project):
    goal, agent = "goal-bar", "agent-bar"
    with trio.fail_after(PHASE):
        await new_goal(client, goal, agent)
        await add_todo(client, goal, agent, "[P0] First")
        await add_todo(client, goal, agent, "[P1] Second")
        await bind(client, goal, agent, SESSION)
        listing = await ok(client, "todo", "list", "--goal-id", goal, "--role", "agent", "--agent-id", agent)
    # The source file the service hashes is the one LoopX names.
    assert Path(listing["state_file"]) == goal_state_file(loopx_project, goal)

    expected = GoalBarVisible(SESSION, goal, agent, "active", processed=0, remaining=2, total=2,
                              goal_text=f"Test goal {goal}")
    with trio.fail_after(PHASE):
        async with service(client) as bar:
            unbound = await bar.read("dsh-session-nobody", loopx_project)
            shown = await bar.read(SESSION, loopx_project)
    assert unbound == GoalBarHidden("dsh-session-nobody", "unbound")
    assert shown == expected
    assert state_to_json(shown)["kind"] == "visible" and state_to_json(unbound)["reason"] == "unbound"

    # A restart: a new service (new actors, no memory) rebuilds the same bar from LoopX.
    with trio.fail_after(PHASE):
        async with service(client) as bar:
            assert await bar.read(SESSION, loopx_project) == expected

    # A second goal binding the same session: ambiguous, so hidden -- never guessed.
    with trio.fail_after(PHASE):
        await new_goal(client, "goal-other", "agent-other")
        await bind(client, "goal-other", "agent-other", SESSION)
        async with service(client) as bar:
            ambiguous = await bar.read(SESSION, loopx_project)
    assert isinstance(ambiguous, GoalBarHidden) and ambiguous.reason == "ambiguous"


def loopx_files(project: Path) -> dict[str, bytes]:
    """Every file LoopX keeps in the project, by relative path."""
    root = project / ".loopx"
    return {str(path.relative_to(root)): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()}


async def test_goal_text_comes_from_a_read_only_status_call(client, loopx_project):
    # Longer than LoopX's 132-character title: the objective itself is shown while the goal
    # is active; LoopX gives only the (cut) title for a stopped goal.
    long_text = "Ship the release notes: " + " ".join(f"item{i}" for i in range(60))
    assert 132 < len(long_text) <= MAX_GOAL_TEXT
    with trio.fail_after(2 * PHASE):
        await new_goal(client, "goal-text", "agent-text", objective=long_text)
        await bind(client, "goal-text", "agent-text", SESSION)
        # LoopX withholds a text that looks like a local path: the bar stays, without text.
        await new_goal(client, "goal-pathy", "agent-pathy", objective="Fix the bug in /home/someone/secret.txt")
        await bind(client, "goal-pathy", "agent-pathy", "dsh-session-pathy")

    with trio.fail_after(3 * PHASE):
        async with service(client) as bar:
            before = loopx_files(loopx_project)
            shown = await bar.read(SESSION, loopx_project)
            pathy = await bar.read("dsh-session-pathy", loopx_project)
            # Reading the bar (text included) wrote nothing to the project's LoopX state.
            assert loopx_files(loopx_project) == before
            assert isinstance(shown, GoalBarVisible) and shown.goal_text == long_text
            assert state_to_json(shown)["goal_text"] == long_text
            assert isinstance(pathy, GoalBarVisible) and pathy.goal_text is None
            assert pathy.goal_id == "goal-pathy" and pathy.lifecycle_state == "active"

            paused = await bar.pause(SESSION, loopx_project)
            assert paused.outcome == "done" and paused.state.lifecycle_state == "stopped"
            title = paused.state.goal_text
            assert title is not None and title != long_text
            assert title.endswith("\u2026") and long_text.startswith(title[:-1].rstrip())

            assert (await bar.start(SESSION, loopx_project)).state.goal_text == long_text


async def test_pause_start_serialized_with_verified_readback(client, loopx_project):
    goal, agent = "goal-life", "agent-life"
    with trio.fail_after(PHASE):
        await new_goal(client, goal, agent)
        await add_todo(client, goal, agent, "[P0] Only")
        await bind(client, goal, agent, SESSION)

    active = GoalBarVisible(SESSION, goal, agent, "active", processed=0, remaining=1, total=1,
                            goal_text=f"Test goal {goal}")
    with trio.fail_after(6 * PHASE):
        async with service(client) as bar:
            assert await bar.read(SESSION, loopx_project) == active

            # Pause, watched: pending is shown with the old (LoopX) state, never the
            # optimistic one; then the verified, re-read state.
            seen: list = []
            async with trio.open_nursery() as nursery:
                async def watch():
                    async with aclosing(bar.watch(SESSION, loopx_project)) as states:
                        async for state in states:
                            seen.append(state)
                            if state.lifecycle_state == "stopped" and not state.pending:
                                return
                nursery.start_soon(watch)
                paused = await bar.pause(SESSION, loopx_project)
            assert paused.outcome == "done" and paused.reason is None
            assert paused.state == attrs.evolve(active, lifecycle_state="stopped")
            assert attrs.evolve(active, pending=True) in seen
            assert all(s.lifecycle_state == "active" for s in seen if s.pending)
            assert seen[-1] == paused.state
            assert await lifecycle_state(client, goal) == "stopped"

            # Start and Pause at once on the paused goal: one mutation at a time, each with
            # its own check and readback. Start first: both run; Pause first: LoopX's
            # preview finds the goal paused, so it is refused without an --execute. The bar
            # ends on what LoopX says.
            results = {}
            async with trio.open_nursery() as nursery:
                async def click(name, action):
                    results[name] = await action(SESSION, loopx_project)
                nursery.start_soon(click, "start", bar.start)
                nursery.start_soon(click, "pause", bar.pause)
            assert client.max_in_flight == 1
            assert results["start"].outcome == "done"
            assert (results["pause"].outcome, results["pause"].reason) in (("done", None), ("refused", "already-paused"))
            last = {"resume": "active", "stop": "stopped"}[client.executed[-1]]
            final = await bar.read(SESSION, loopx_project)
            assert final.lifecycle_state == last == await lifecycle_state(client, goal)
            assert not final.pending and final.error is None
            assert client.executed in (["stop", "resume", "stop"], ["stop", "resume"])

            if final.lifecycle_state == "stopped":
                started = await bar.start(SESSION, loopx_project)
                assert started.outcome == "done" and started.state == active
            # Start on the active goal of a session with no continuation has nothing to do
            # (and runs no no-op resume).
            executed = list(client.executed)
            idle = await bar.start(SESSION, loopx_project)
            assert (idle.outcome, idle.reason, idle.state) == ("refused", "nothing-to-start", active)
            assert client.executed == executed
            assert len(bar.locks) == 0

        # After a restart the bar is rebuilt as LoopX has it.
        async with service(client) as bar:
            assert await bar.read(SESSION, loopx_project) == active


async def test_unverified_mutation_shows_an_error_not_the_optimistic_state(
    loopx_command, loopx_project, loopx_env, loopx_runtime_root
):
    unverified = UnverifiedClient(
        loopx_command, project=loopx_project, env=loopx_env, timeout=60, runtime_root=loopx_runtime_root
    )
    goal, agent = "goal-unverified", "agent-unverified"
    with trio.fail_after(2 * PHASE):
        await new_goal(unverified, goal, agent)
        await bind(unverified, goal, agent, SESSION)
        async with service(unverified) as bar:
            before = await bar.read(SESSION, loopx_project)
            paused = await bar.pause(SESSION, loopx_project)
    assert isinstance(before, GoalBarVisible) and before.lifecycle_state == "active"
    assert paused.outcome == "failed" and paused.reason == "stop was not verified by LoopX"
    assert paused.state == attrs.evolve(before, error="stop was not verified by LoopX")


async def test_source_change_forces_reread_and_runtime_wakes_create_no_state(client, loopx_project):
    goal, agent = "goal-watch", "agent-watch"
    with trio.fail_after(PHASE):
        await new_goal(client, goal, agent)
        await add_todo(client, goal, agent, "[P0] First")
        await bind(client, goal, agent, SESSION)

    one = GoalBarVisible(SESSION, goal, agent, "active", processed=0, remaining=1, total=1,
                         goal_text=f"Test goal {goal}")
    with trio.fail_after(3 * PHASE):
        async with service(client, poll_interval=0.05) as bar:
            # Runtime events for a session nobody watches make no actor and no bar.
            assert bar.wake("dsh-session-unwatched") == 0

            # Two watchers of one session share one actor: one read for both.
            async with aclosing(bar.watch(SESSION, loopx_project)) as first, \
                    aclosing(bar.watch(SESSION, loopx_project)) as second:
                assert await first.__anext__() == one
                assert await second.__anext__() == one
                stats = bar.actor_stats(SESSION, loopx_project)
                assert (stats["reads"], stats["watchers"], stats["version"]) == (1, 2, 1)

                # A burst of wakes without a LoopX change: one re-read, the same state,
                # nothing new for the watchers.
                for _ in range(25):
                    assert bar.wake(SESSION) == 1
                assert await bar.read(SESSION, loopx_project) == one
                stats = bar.actor_stats(SESSION, loopx_project)
                assert (stats["reads"], stats["version"], stats["forced_reads"]) == (2, 1, 0)

                # A LoopX change made outside the service (the CLI, as from a shell), with
                # no wake at all: the source hash forces a re-read both watchers see.
                await add_todo(client, goal, agent, "[P1] Second")
                two = attrs.evolve(one, remaining=2, total=2)
                assert await first.__anext__() == two
                assert await second.__anext__() == two
                stats = bar.actor_stats(SESSION, loopx_project)
                assert stats["forced_reads"] >= 1 and stats["version"] == 2


async def test_stale_binding_is_rejected(client, loopx_project):
    goal, agent, other = "goal-stale", "agent-one", "agent-two"
    with trio.fail_after(PHASE):
        await new_goal(client, goal, agent, other)
        await bind(client, goal, agent, SESSION)

    with trio.fail_after(2 * PHASE):
        async with service(client) as bar:
            shown = await bar.read(SESSION, loopx_project)
            assert isinstance(shown, GoalBarVisible) and shown.agent_id == agent

            # The thread is rebound to another agent lane between the read and the click.
            await bind(client, goal, agent, SESSION, unbind=True)
            await bind(client, goal, other, SESSION)
            refused = await bar.pause(SESSION, loopx_project)
            assert refused.outcome == "refused" and refused.reason == "stale-binding"
            assert isinstance(refused.state, GoalBarVisible) and refused.state.agent_id == other

            # An explicit expectation that no longer holds is refused too.
            again = await bar.pause(SESSION, loopx_project, expected=(goal, agent))
            assert (again.outcome, again.reason) == ("refused", "stale-binding")
            assert client.executed == []
            assert await lifecycle_state(client, goal) == "active"


# -- over the bridge: the /goalbar endpoint ------------------------------------------------

TOKEN = "goalbar-test-token"


def wire(type_, data, **ids):
    return json.dumps({"v": 1, "type": type_, **ids, "data": data})


async def frames_until(ws, predicate):
    """Frames from ``ws`` up to and including the first one ``predicate`` accepts."""
    seen = []
    while True:
        frame = json.loads(await ws.get_message())
        seen.append(frame)
        if predicate(frame):
            return seen


def answer_to(request_id):
    return lambda frame: frame.get("re") == request_id


async def test_goalbar_endpoint_read_watch_pause_start(client, loopx_project):
    goal, agent = "goal-wire", "agent-wire"
    with trio.fail_after(PHASE):
        await new_goal(client, goal, agent)
        await add_todo(client, goal, agent, "[P0] Only")
        await bind(client, goal, agent, SESSION)

    with trio.fail_after(3 * PHASE):
        async with service(client) as bar, trio.open_nursery() as nursery:
            handler = GoalBarHandler(bar, lambda session_id: loopx_project, nursery)
            port = await nursery.start(functools.partial(serve_bridge, handler, token=TOKEN))
            async with open_websocket("127.0.0.1", port, "/goalbar?session=x", use_ssl=False) as ws:
                await ws.send_message(wire("hello", {"token": TOKEN, "role": "goalbar", "protocol": 1,
                                                     "capabilities": ["goalbar"]}))
                welcome = json.loads(await ws.get_message())
                assert welcome["type"] == "welcome" and welcome["data"]["capabilities"] == ["goalbar"]

                # An unbound session: hidden, with the reason. An invalid id: an error frame.
                await ws.send_message(wire("goalbarRead", {"sessionId": "dsh-session-nobody"}, id="r1"))
                [reply] = await frames_until(ws, answer_to("r1"))
                assert reply["type"] == "goalbarResult"
                assert reply["data"]["state"] == {"kind": "hidden", "sessionId": "dsh-session-nobody",
                                                  "reason": "unbound", "pending": False}
                await ws.send_message(wire("goalbarRead", {"sessionId": "no/slashes"}, id="r2"))
                [reply] = await frames_until(ws, answer_to("r2"))
                assert reply["type"] == "error" and reply["data"]["code"] == "INVALID_LOOPX_REQUEST"

                # Watch the bound session: the answer, and pushed states from then on.
                visible = {"kind": "visible", "sessionId": SESSION, "goalId": goal, "agentId": agent,
                           "goalText": f"Test goal {goal}", "lifecycleState": "active", "processed": 0,
                           "remaining": 1, "total": 1, "pending": False, "agentRunning": False}
                await ws.send_message(wire("goalbarWatch", {"sessionId": SESSION}, id="w1"))
                frames = await frames_until(ws, lambda f: f["type"] == "goalbar")
                replies = [f for f in frames if f.get("re") == "w1"]
                if not replies:
                    replies = await frames_until(ws, answer_to("w1"))
                assert replies[-1]["data"] == {"state": visible, "outcome": "read"}
                assert frames[-1]["data"]["state"] == visible

                # Pause through the page: pending is pushed with the old state, then the
                # verified one; the answer carries the same.
                await ws.send_message(wire("goalbarPause", {"sessionId": SESSION, "goalId": goal,
                                                            "agentId": agent}, id="p1"))
                frames = await frames_until(ws, answer_to("p1"))
                stopped = {**visible, "lifecycleState": "stopped"}
                assert frames[-1]["data"] == {"state": stopped, "outcome": "done"}
                pushed = [f["data"]["state"] for f in frames if f["type"] == "goalbar"]
                assert {**visible, "pending": True} in pushed
                if pushed[-1] != stopped:
                    [push] = await frames_until(ws, lambda f: f["type"] == "goalbar")
                    assert push["data"]["state"] == stopped
                assert await lifecycle_state(client, goal) == "stopped"

                # A click for a binding the bar no longer has is refused; Start works.
                await ws.send_message(wire("goalbarStart", {"sessionId": SESSION, "goalId": goal,
                                                            "agentId": "agent-other"}, id="s0"))
                [reply] = [f for f in await frames_until(ws, answer_to("s0")) if f.get("re") == "s0"]
                assert (reply["data"]["outcome"], reply["data"]["reason"]) == ("refused", "stale-binding")
                await ws.send_message(wire("goalbarStart", {"sessionId": SESSION}, id="s1"))
                frames = await frames_until(ws, answer_to("s1"))
                assert frames[-1]["data"] == {"state": visible, "outcome": "done"}
                assert await lifecycle_state(client, goal) == "active"
            nursery.cancel_scope.cancel()


async def test_the_page_is_served_over_plain_http_on_the_bridge_origin():
    async def get(port, path):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
            data = b""
            while chunk := await stream.receive_some():
                data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        return head.decode().split("\r\n")[0], body

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(functools.partial(serve_bridge, token=TOKEN))
            status, body = await get(port, "/goalbar?session=s1")
            assert status == "HTTP/1.1 200 OK"
            assert b"goalbarWatch" in body and body.startswith(b"<!doctype html>")
            status, _ = await get(port, "/dsh")
            assert status == "HTTP/1.1 404 Not Found"
            # The websocket endpoints on the same port are untouched.
            async with open_websocket("127.0.0.1", port, "/goalbar", use_ssl=False) as ws:
                await ws.send_message(wire("hello", {"token": TOKEN, "role": "goalbar", "protocol": 1}))
                assert json.loads(await ws.get_message())["type"] == "welcome"
            nursery.cancel_scope.cancel()


async def test_a_pause_runs_to_completion_when_the_page_that_asked_goes_away(client, loopx_project):
    goal, agent = "goal-closed", "agent-closed"
    with trio.fail_after(PHASE):
        await new_goal(client, goal, agent)
        await bind(client, goal, agent, SESSION)

    with trio.fail_after(3 * PHASE):
        async with service(client) as bar, trio.open_nursery() as nursery:
            handler = GoalBarHandler(bar, lambda session_id: loopx_project, nursery)
            port = await nursery.start(functools.partial(serve_bridge, handler, token=TOKEN))
            async with open_websocket("127.0.0.1", port, "/goalbar", use_ssl=False) as ws:
                await ws.send_message(wire("hello", {"token": TOKEN, "role": "goalbar", "protocol": 1}))
                assert json.loads(await ws.get_message())["type"] == "welcome"
                await ws.send_message(wire("goalbarPause", {"sessionId": SESSION, "goalId": goal, "agentId": agent},
                                           id="c1"))
            # The page is gone (closed, or reloading) before any answer: its request was
            # cancelled with its connection, the Pause it asked for was not. Only that
            # Pause can make the bar pending or the goal stopped.
            async with aclosing(bar.watch(SESSION, loopx_project)) as states:
                async for state in states:
                    if state.pending or state.lifecycle_state == "stopped":
                        break
            assert bar.actor_stats(SESSION, loopx_project)["mutations"] == 1
            joined = await bar.pause(SESSION, loopx_project, expected=(goal, agent))
            # It either joined the Pause still running (one mutation) or came after it
            # and found the goal paused already; both mean that Pause ran to its end.
            assert (joined.outcome, joined.reason) in (("done", None), ("refused", "already-paused"))
            assert client.executed == ["stop"]  # a second Pause is refused on LoopX's preview
            assert await lifecycle_state(client, goal) == "stopped"
            assert len(bar.locks) == 0
            nursery.cancel_scope.cancel()
