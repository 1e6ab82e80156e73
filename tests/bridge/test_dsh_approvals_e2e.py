"""DSH's own approval questions, answered from every surface exactly once, on a real DSH host.

DSH 0.2.1 asks a person through its approval service (``ctx.approval.request``): it logs
``approval/asked``, runs the ``approval/request`` waterfall (its answerers: the web UI's
panel, an ACP client; none in headless), then logs ``approval/decided``. The bridge plugin
goes first in that waterfall and holds the question open for the runtime, which shows it
as the DSH agent's open question (``DshAgent.pending_approvals``, the console's row) and
answers it through the host; the rest of DSH's answerers race with it, and the first
answer wins: every later one gets ``APPROVAL_CLOSED``.

`dsh headless` loads bridge/dsh_plugin and a probe plugin (``dsh_approval_probe.mjs``)
through the patch, against the handlers ``loopdock serve`` composes (the console over the
GoalBar over the DSH agents' mirror). The probe makes DSH's own tool policy ask before the
``read`` tool (``tools/pre-execute`` answers ``ask``) and is another DSH answerer after the
bridge's (it answers calls whose arguments say ``dsh-allows``/``dsh-refuses``); the last
test uses DSH's real ACP surface instead (`dsh --profile acp`, the test as its client). The
plugin creates one extra agent, ``s-ask``, that the tests drive; the ping model calls ``read``
when a message says ``call: read {...}``. Everything is judged on DSH's own session log,
which DSH writes. Offline and quiet: DSH_HOME and HOME in a temporary directory, telemetry
disabled, loopback only. The headless task says HOLD, so `dsh headless` stays up until the
runtime wakes that agent.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import yaml
from trio_websocket import open_websocket

from loopdock._bridge import compose_handlers, goalbar_service
from loopdock._runtime import Runtime
from loopdock.bridge import DshAgent, HostHandler, serve_bridge
from loopdock.bridge._dsh_files import dsh_process, quiet_env, session_log, split_turns, turn_end
from loopdock.bridge._patch import write_patch
from loopdock.runtime import ApprovalClosedError

DSH = Path(sys.executable).parent / "dsh"
PROBE = Path(__file__).with_name("dsh_approval_probe.mjs")
TOKEN = "e2e-token-" + "a" * 20
AGENT = "s-ask"
TEST_LIMIT_S = 240
REASON = "the probe asks before read"


def read_call(path: str) -> str:
    return "call: read " + json.dumps({"file_path": path})


@attrs.define
class Host:
    """A running `dsh headless` with the probe, and the runtime's side of it."""

    handler: HostHandler
    proxies: dict[str, DshAgent]
    proc: trio.Process
    output: Path
    dsh_home: Path
    port: int

    @property
    def proxy(self) -> DshAgent:
        return self.proxies[AGENT]

    async def until(self, predicate: Callable[[], bool]) -> None:
        while not predicate():
            if self.proc.returncode is not None:
                pytest.fail(f"dsh exited ({self.proc.returncode}): {self.output.read_text(errors='replace')}")
            with trio.move_on_after(0.5):  # and see whether dsh is still alive
                await self.handler.wait_until(predicate)

    async def idle(self) -> None:
        """Until the agent is idle with nothing queued (as the mirror shows it)."""
        await self.until(lambda: self.proxy.status == "idle" and not self.proxy.live.inbox)

    def log(self) -> list[dict[str, Any]]:
        return [e for e in session_log(self.dsh_home, AGENT) if "seq" in e]


@asynccontextmanager
async def dsh_with_probe(tmp_path: Path) -> AsyncIterator[Host]:
    work = tmp_path / "work"
    work.mkdir()
    for name in ("notes.txt", "other.txt", "dsh-allows.txt", "dsh-refuses.txt", "cancelled.txt", "page.txt"):
        (work / name).write_text(f"the text of {name}\n")
    async with Runtime.open(tmp_path / "runtime") as rt:
        live = rt.subscribe_live()
        hosts = HostHandler(rt.dock)
        proxies: dict[str, DshAgent] = {}

        async def on_agent(proxy: DshAgent) -> None:
            proxies[proxy.id] = proxy

        async with goalbar_service(rt) as service, trio.open_nursery() as nursery:
            console = await compose_handlers(rt, service, tmp_path, nursery, live, hosts=hosts, on_agent=on_agent)
            port = await nursery.start(functools.partial(serve_bridge, console, token=TOKEN))
            patch = write_patch(
                tmp_path / "p", f"ws://127.0.0.1:{port}/dsh", TOKEN, ping=True,
                extra={"createAgents": [{"sessionId": AGENT}], "verdictTimeoutMs": TEST_LIMIT_S * 1000},
            )
            rows = yaml.safe_load(patch.read_text())
            rows.append({"insert": [{"id": "approval-probe", "name": str(PROBE), "config": {"askTools": ["read"]}}]})
            patch.write_text(yaml.safe_dump(rows, sort_keys=False))
            dsh_home, output = tmp_path / "dsh-home", tmp_path / "dsh.err"
            async with dsh_process(
                DSH, ["headless", "--patch", str(patch), "HOLD until the runtime is done"],
                cwd=work, env=quiet_env(dsh_home, tmp_path / "home"), output=output,
            ) as proc:
                host = Host(hosts, proxies, proc, output, dsh_home, port)
                await host.until(lambda: (proxy := proxies.get(AGENT)) is not None and proxy.running
                                 and any(a != AGENT for a in hosts.agents))
                await host.idle()
                yield host
                # the end: wake the headless agent (its ping call holds until then)
                await hosts.wake(next(a for a in hosts.agents if a != AGENT))
                with trio.fail_after(60):
                    code = await proc.wait()
            assert code == 0, output.read_text(errors="replace")
            nursery.cancel_scope.cancel()


def questions(events: list[dict[str, Any]]) -> list[tuple[str, str, str | None]]:
    """(approval id, tool, outcome) of every question DSH logged, in order."""
    outcomes: dict[str, list[str]] = {}
    for e in events:
        if e["type"] == "approval/decided":
            outcomes.setdefault(e["data"]["id"], []).append(e["data"]["outcome"])
    for decided in outcomes.values():
        assert len(decided) == 1, outcomes  # every question decided once
    return [(e["data"]["id"], e["data"]["toolName"], (outcomes.get(e["data"]["id"]) or [None])[0])
            for e in events if e["type"] == "approval/asked"]


def tool_results(events: list[dict[str, Any]]) -> dict[str, str]:
    """callId -> the text of its tool result, as DSH logged it."""
    out = {}
    for e in events:
        if e["type"] == "tool/result":
            message = e["data"].get("message") or {}
            text = json.dumps(message.get("content"))
            out[message.get("toolCallId")] = text
    return out


def decided_after(proxy: DshAgent, skip: int = 0) -> list[Any]:
    """The ``approval/decided`` events the mirror shows of the agent, but the first ``skip``."""
    return [e for e in proxy.session.events if e.type == "approval/decided"][skip:]


def _need_dsh() -> None:
    if not DSH.exists():
        pytest.fail(f"no dsh next to {sys.executable}: scripts/test installs deepseek-harness-runtime-bin")


async def test_the_runtime_answers_a_dsh_question_exactly_once(tmp_path):
    _need_dsh()
    results: dict[str, str] = {}
    with trio.fail_after(TEST_LIMIT_S):
        async with dsh_with_probe(tmp_path) as host:
            proxy = host.proxy
            assert proxy.pending_approvals() == []

            # 1. DSH asks: the runtime shows the question, with the call's arguments
            proxy.followup(read_call("notes.txt"))
            with trio.fail_after(60):
                [question] = await proxy.wait_approvals()
            assert (question.tool, question.reason, dict(question.arguments)) == (
                "read", REASON, {"file_path": "notes.txt"})
            assert question.call_id and question.turn is not None
            assert proxy.status == "running"  # the turn waits for a person

            # two answers race at the host: exactly one wins, the other is APPROVAL_CLOSED
            async def answer(decision: str) -> None:
                try:
                    await host.handler.answer_approval(AGENT, question.id, decision)
                    results[decision] = "done"
                except ApprovalClosedError:
                    results[decision] = "closed"

            async with trio.open_nursery() as nursery:
                nursery.start_soon(answer, "approve")
                nursery.start_soon(answer, "refuse")
            assert sorted(results.values()) == ["closed", "done"], results
            with trio.fail_after(30):
                await host.until(lambda: proxy.pending_approvals() == [])
            with pytest.raises(ApprovalClosedError):  # and every later one
                await question.answer("approve")
            await host.idle()

            # 2. a refusal, through the question itself
            proxy.followup(read_call("other.txt"))
            with trio.fail_after(60):
                [refused] = await proxy.wait_approvals()
            with pytest.raises(ValueError):  # DSH's outcomes have no edit
                await refused.answer("edit", arguments={"file_path": "notes.txt"})
            await refused.answer("refuse", reason="not that one")
            assert proxy.pending_approvals() == []  # the mirror shows DSH's decision at once
            await host.idle()

            # 3. a turn cancelled while its question is open: DSH decides it cancelled
            proxy.followup(read_call("cancelled.txt"))
            with trio.fail_after(60):
                [cancelled] = await proxy.wait_approvals()
            proxy.cancel("the test cancels")
            with trio.fail_after(30):
                await host.until(lambda: proxy.pending_approvals() == [])
            with pytest.raises(ApprovalClosedError):
                await host.handler.answer_approval(AGENT, cancelled.id, "approve")
            await host.idle()
    events = host.log()

    winner = next(d for d, r in results.items() if r == "done")
    asked = questions(events)
    assert [(i, t) for i, t, _ in asked] == [(question.id, "read"), (refused.id, "read"), (cancelled.id, "read")]
    assert [o for _, _, o in asked] == ["allowed-once" if winner == "approve" else "rejected", "rejected", "cancelled"]
    results_by_call = tool_results(events)
    first = results_by_call[question.call_id]
    if winner == "approve":
        assert "the text of notes.txt" in first, first
    else:
        assert "the user rejected tool" in first and "the text of" not in first, first
    assert "the user rejected tool" in results_by_call[refused.call_id]
    assert "the text of other.txt" not in results_by_call[refused.call_id]
    assert "the text of cancelled.txt" not in json.dumps(events)
    ends = [(turn_end(t) or {}).get("kind") for t in split_turns(events)]
    assert ends[-3:] == ["completed", "completed", "aborted"], ends


async def test_dsh_s_own_answerer_wins_and_the_runtime_s_answer_is_closed(tmp_path):
    _need_dsh()
    with trio.fail_after(TEST_LIMIT_S):
        async with dsh_with_probe(tmp_path) as host:
            proxy = host.proxy
            ids = []
            for path in ("dsh-allows.txt", "dsh-refuses.txt"):
                decided = functools.partial(decided_after, proxy, len(decided_after(proxy)))
                proxy.followup(read_call(path))
                with trio.fail_after(60):
                    await host.until(lambda decided=decided: bool(decided()))
                    await host.idle()
                [asked] = [e for e in proxy.session.events if e.type == "approval/asked"][len(ids):]
                ids.append(asked.data["id"])
                assert proxy.pending_approvals() == []
                # the runtime's answer comes second: the host holds the question no more
                with pytest.raises(ApprovalClosedError):
                    await host.handler.answer_approval(AGENT, asked.data["id"], "approve")
    events = host.log()
    assert [(i, o) for i, _, o in questions(events)] == [(ids[0], "allowed-once"), (ids[1], "rejected")]
    texts = json.dumps([e for e in events if e["type"] == "tool/result"])
    assert "the text of dsh-allows.txt" in texts and "the text of dsh-refuses.txt" not in texts


class Page:
    """A console page's connection: the rows it was sent, and the replies to its requests."""

    def __init__(self, ws) -> None:
        self.ws = ws
        self.rows: dict[str, dict] = {}
        self.replies: dict[str, dict] = {}
        self._ids = 0

    async def receive(self) -> None:
        frame = json.loads(await self.ws.get_message())
        if frame["type"] == "live":
            for item in frame["data"]["items"]:
                if item["type"] == "console/agent":
                    if item["data"].get("gone"):
                        self.rows.pop(item["agentId"], None)
                    else:
                        self.rows[item["agentId"]] = item["data"]
        elif frame["type"] == "ping":
            await self.ws.send_message(json.dumps({"v": 1, "type": "pong", "re": frame["id"], "data": {}}))
        elif "re" in frame:
            self.replies[frame["re"]] = frame

    async def until(self, predicate: Callable[[Page], bool]) -> None:
        while not predicate(self):
            await self.receive()

    def questions(self, agent_id: str) -> list[dict] | None:
        row = self.rows.get(agent_id)
        return None if row is None else row["approvals"]

    async def answer(self, data: Mapping[str, Any]) -> dict:
        self._ids += 1
        request_id = f"q{self._ids}"
        await self.ws.send_message(json.dumps({"v": 1, "type": "approval", "id": request_id, "data": data}))
        await self.until(lambda p: request_id in p.replies)
        return self.replies.pop(request_id)


@asynccontextmanager
async def page(port: int) -> AsyncIterator[Page]:
    async with open_websocket("127.0.0.1", port, "/goalbar", use_ssl=False) as ws:
        hello = {"token": TOKEN, "role": "goalbar", "protocol": 1, "capabilities": ["live", "console"]}
        await ws.send_message(json.dumps({"v": 1, "type": "hello", "data": hello}))
        assert json.loads(await ws.get_message())["type"] == "welcome"
        yield Page(ws)


async def test_a_console_page_answers_a_dsh_question_and_a_second_page_is_closed(tmp_path):
    _need_dsh()
    with trio.fail_after(TEST_LIMIT_S):
        async with dsh_with_probe(tmp_path) as host, page(host.port) as first, page(host.port) as second:
            await first.until(lambda p: p.questions(AGENT) == [])
            host.proxy.followup(read_call("page.txt"))
            with trio.fail_after(60):
                await first.until(lambda p: bool(p.questions(AGENT)))
                await second.until(lambda p: bool(p.questions(AGENT)))
            [shown] = first.questions(AGENT)
            assert shown["tool"] == "read" and shown["reason"] == REASON
            assert json.loads(shown["arguments"]) == {"file_path": "page.txt"}
            assert first.rows[AGENT]["origin"] == "dsh" and first.rows[AGENT]["approvalsOpen"] == 1

            data = {"agentId": AGENT, "approvalId": shown["id"], "decision": "approve"}
            done = await first.answer(data)
            assert done["type"] == "approvalDone" and done["data"]["approvalId"] == shown["id"], done
            closed = await second.answer({**data, "decision": "refuse", "reason": "too late"})
            assert (closed["type"], closed["data"]["code"]) == ("error", "APPROVAL_CLOSED"), closed
            # every page's row follows DSH's decision
            with trio.fail_after(30):
                await first.until(lambda p: p.questions(AGENT) == [])
                await second.until(lambda p: p.questions(AGENT) == [])
            await host.idle()
    events = host.log()
    assert [(i, o) for i, _, o in questions(events)] == [(shown["id"], "allowed-once")]
    assert "the text of page.txt" in json.dumps([e for e in events if e["type"] == "tool/result"])


# -- DSH's ACP surface racing the runtime ---------------------------------------------------


class AcpClient:
    """The client side of `dsh --profile acp` (JSON-RPC 2.0, one message a line, over its
    stdio): requests and their results, and the requests the agent makes of the client
    (``session/request_permission``), which the test answers when it chooses."""

    def __init__(self, proc: trio.Process) -> None:
        self.proc = proc
        self.results: dict[int, dict[str, Any]] = {}
        self.asked: list[dict[str, Any]] = []  # the agent's permission requests, in order
        self.changes = trio.Event()
        self._ids = 0

    async def read(self) -> None:
        buffer = b""
        assert self.proc.stdout is not None
        async for chunk in self.proc.stdout:
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                message = json.loads(line)
                if message.get("method") == "session/request_permission":
                    self.asked.append(message)
                elif "id" in message and "method" not in message:
                    self.results[message["id"]] = message
                self.changes.set()
                self.changes = trio.Event()

    async def until(self, predicate: Callable[[], bool]) -> None:
        while not predicate():
            await self.changes.wait()

    async def send(self, message: Mapping[str, Any]) -> None:
        assert self.proc.stdin is not None
        await self.proc.stdin.send_all((json.dumps({"jsonrpc": "2.0", **message}) + "\n").encode())

    async def request(self, method: str, params: Mapping[str, Any]) -> int:
        self._ids += 1
        await self.send({"id": self._ids, "method": method, "params": params})
        return self._ids

    async def result(self, request_id: int) -> dict[str, Any]:
        await self.until(lambda: request_id in self.results)
        reply = self.results[request_id]
        assert "result" in reply, reply
        return reply["result"]

    async def permit(self, asked: Mapping[str, Any], option: str) -> None:
        await self.send({"id": asked["id"], "result": {"outcome": {"outcome": "selected", "optionId": option}}})


async def test_an_acp_client_and_the_runtime_race_for_a_dsh_question(tmp_path):
    """DSH's ACP profile asks its client (``session/request_permission``) while the bridge
    holds the same question for the runtime: whichever answers first decides, and the
    other's answer is closed (the runtime's gets APPROVAL_CLOSED; the ACP client's late
    one is ignored by DSH, which logs one decision)."""
    _need_dsh()
    work = tmp_path / "work"
    work.mkdir()
    for name in ("notes.txt", "other.txt"):
        (work / name).write_text(f"the text of {name}\n")
    with trio.fail_after(TEST_LIMIT_S):
        async with Runtime.open(tmp_path / "runtime") as rt:
            live = rt.subscribe_live()
            hosts = HostHandler(rt.dock)
            proxies: dict[str, DshAgent] = {}

            async def on_agent(proxy: DshAgent) -> None:
                proxies[proxy.id] = proxy

            async with goalbar_service(rt) as service, trio.open_nursery() as nursery:
                console = await compose_handlers(rt, service, tmp_path, nursery, live, hosts=hosts, on_agent=on_agent)
                port = await nursery.start(functools.partial(serve_bridge, console, token=TOKEN))
                patch = write_patch(tmp_path / "p", f"ws://127.0.0.1:{port}/dsh", TOKEN, ping=True)
                rows = yaml.safe_load(patch.read_text())
                rows.append({"id": "acp", "config": {"provider": "ping", "model": "ping-1"}})
                rows.append({"insert": [{"id": "approval-probe", "name": str(PROBE), "config": {"askTools": ["read"]}}]})
                patch.write_text(yaml.safe_dump(rows, sort_keys=False))
                dsh_home = tmp_path / "dsh-home"
                with (tmp_path / "dsh.err").open("wb") as err:
                    proc = await trio.lowlevel.open_process(
                        [str(DSH), "--profile", "acp", "--patch", str(patch)], cwd=work,
                        env=quiet_env(dsh_home, tmp_path / "home"), stdin=-1, stdout=-1, stderr=err,
                    )
                try:
                    client = AcpClient(proc)
                    nursery.start_soon(client.read)
                    await client.result(await client.request("initialize", {"protocolVersion": 1, "clientCapabilities": {}}))
                    session = (await client.result(await client.request(
                        "session/new", {"cwd": str(work), "mcpServers": []})))["sessionId"]
                    await hosts.wait_until(lambda: (p := proxies.get(session)) is not None and p.running)
                    proxy = proxies[session]

                    # 1. the ACP client answers first: the runtime's answer is closed
                    prompt = await client.request("session/prompt", {
                        "sessionId": session, "prompt": [{"type": "text", "text": read_call("notes.txt")}]})
                    await client.until(lambda: len(client.asked) == 1)
                    [first] = await proxy.wait_approvals()  # both surfaces show it at once
                    assert client.asked[0]["params"]["toolCall"]["toolCallId"] == first.call_id
                    await client.permit(client.asked[0], "allow-once")
                    assert (await client.result(prompt))["stopReason"] == "end_turn"
                    with pytest.raises(ApprovalClosedError):
                        await hosts.answer_approval(session, first.id, "refuse")
                    assert proxy.pending_approvals() == []

                    # 2. the runtime answers first, the ACP client's request still open
                    prompt = await client.request("session/prompt", {
                        "sessionId": session, "prompt": [{"type": "text", "text": read_call("other.txt")}]})
                    await client.until(lambda: len(client.asked) == 2)
                    [second] = await proxy.wait_approvals()
                    await second.answer("refuse")
                    assert (await client.result(prompt))["stopReason"] == "end_turn"  # the turn went on
                    await client.permit(client.asked[1], "allow-once")  # too late: DSH ignores it
                    await hosts.wait_until(lambda: proxy.status == "idle")
                finally:
                    assert proc.stdin is not None
                    await proc.stdin.aclose()  # the ACP client leaves: dsh exits
                    with trio.move_on_after(30):
                        await proc.wait()
                    if proc.returncode is None:
                        proc.kill()
                        await proc.wait()
                nursery.cancel_scope.cancel()
    events = [e for e in session_log(dsh_home, session) if "seq" in e]
    assert [(i, o) for i, _, o in questions(events)] == [(first.id, "allowed-once"), (second.id, "rejected")]
    results_by_call = tool_results(events)
    assert "the text of notes.txt" in results_by_call[first.call_id]
    assert "the user rejected tool" in results_by_call[second.call_id]
    assert "the text of other.txt" not in json.dumps(events)
