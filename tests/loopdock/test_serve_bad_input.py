"""Bad input costs ``loopdock serve`` nothing lasting.

A real ``loopdock serve`` process (LoopX off: no Node) is sent frames it must refuse, of
about 100 KB each; every one must be answered with its typed error, and afterwards the
process's resident memory (``VmRSS``) must be within ``BOUND`` of a baseline taken after a
warm-up with the same frames, small (so that first-use imports and caches are not
counted). The same for what the websocket layer and the pages refuse or answer: messages
over the size limit, page URLs with an absurd ``session=`` query. The bound and what the
allocator does are in docs/reliability.md ("Bad input").

No sleep stands in for settling: each frame's answer is awaited before the next is sent,
and a ping answered after the last one proves the server has read past it; a page request
is done once the server has closed its connection.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio
from trio_websocket import ConnectionClosed, WebSocketConnection, open_websocket

from loopdock.bridge._host_handler import MAX_SESSIONS_PER_CONNECTION
from loopdock.bridge._messages import MAX_ERROR_MESSAGE
from loopdock.bridge._server import MAX_MESSAGE_SIZE

READY = re.compile(r"^loopdock serve: ws://127\.0\.0\.1:(\d+) \(token in (.+)\)$")
MB = 2**20
#: What refused input may leave the server larger by, after it answered everything.
BOUND = 5 * MB
FRAMES = 300
BIG = 100_000  # characters of each refused id (or of the event's data, for unknown sessions)
PHASE = 240  # interpreter start, runtime open, 30 MB of frames in and parsed, on a busy machine


def frame(type_: str, data: dict[str, Any], **ids: str) -> str:
    return json.dumps({"v": 1, "type": type_, **ids, "data": data})


def vm_rss(pid: int) -> int:
    """The process's resident memory now, in bytes (``/proc/<pid>/status``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


@asynccontextmanager
async def serve_process(tmp_path: Path) -> AsyncIterator[tuple[trio.Process, int, str, Path]]:
    """``loopdock serve --port 0 --no-loopx`` as a child (cwd outside the checkout, its log
    in a file): yields (process, port, token, log) once it printed its readiness line."""
    log = tmp_path / "serve.log"
    with log.open("wb") as err:
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-P", "-m", "loopdock._cli", "serve", "--port", "0", "--no-loopx",
             "--home", str(tmp_path / "home")],
            cwd=tmp_path, stdout=subprocess.PIPE, stderr=err,
        )
    try:
        assert proc.stdout is not None
        data = b""
        while not data.endswith(b"\n"):
            chunk = await proc.stdout.receive_some(1)
            assert chunk, f"serve exited before its readiness line; its log: {log.read_text()[-2000:]}"
            data += chunk
        match = READY.match(data.decode().rstrip("\n"))
        assert match, data
        yield proc, int(match[1]), (await trio.Path(match[2]).read_text()).strip(), log
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def settle(ws: WebSocketConnection, tag: str) -> None:
    """Return once the server has read and handled everything sent before (notifications
    are handled in order, before the next frame is read)."""
    await ws.send_message(frame("ping", {}, id=f"{tag}-ping"))
    assert json.loads(await ws.get_message()) == {"v": 1, "type": "pong", "re": f"{tag}-ping", "data": {}}


def event(session_id: str, data: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"sessionId": session_id, "event": {"type": "turn/start", "seq": 0, "time": 1, "data": data or {}}}


# Frame n of a run: (text, the code it must be refused with, the request id it answers).
Refused = Callable[[int, str, int], tuple[str, str, str | None]]


def select_with_a_refused_id(n: int, tag: str, size: int) -> tuple[str, str, str | None]:
    session_id = f"s{n}" + "s" * size if size else "bad id"
    return frame("select", {"op": "create", "sessionId": session_id}, id=f"{tag}{n}"), "INVALID_SESSION_ID", f"{tag}{n}"


def events_with_a_refused_id(n: int, tag: str, size: int) -> tuple[str, str, str | None]:
    return frame("events", {"items": [event("e" * size + f"/{n}")]}), "INVALID_SESSION_ID", None


def events_for_an_unknown_session(n: int, tag: str, size: int) -> tuple[str, str, str | None]:
    # well-formed, and new to the runtime: refused only because this connection's cap of
    # sessions is full of live ones (see fill_the_session_cap)
    items = [event(f"unknown-{tag}-{n}", {"pad": "u" * size})]
    return frame("events", {"items": items}), "TOO_MANY_SESSIONS", None


KINDS: list[Refused] = [select_with_a_refused_id, events_with_a_refused_id, events_for_an_unknown_session]


async def refuse_all(ws: WebSocketConnection, tag: str, size: int) -> int:
    """Send ``FRAMES`` frames of the three kinds, each answered with its typed error
    before the next goes; returns the characters sent."""
    sent = 0
    for n in range(FRAMES):
        text, code, request_id = KINDS[n % len(KINDS)](n, tag, size)
        await ws.send_message(text)
        sent += len(text)
        reply = json.loads(await ws.get_message())
        assert (reply["type"], reply["data"]["code"], reply.get("re")) == ("error", code, request_id), reply
        assert len(reply["data"]["message"]) <= MAX_ERROR_MESSAGE  # the refused text is not sent back
    await settle(ws, tag)
    return sent


async def fill_the_session_cap(ws: WebSocketConnection) -> None:
    """Announce as many live agents as a connection may bring sessions in, and mirror their
    sessions: a new session is then refused (none can be let go of: each has a live agent)."""
    created = [{"type": "agent/created", "agentId": f"live-{n}", "data": {"source": "startup", "sessionId": f"live-{n}"}}
               for n in range(MAX_SESSIONS_PER_CONNECTION)]
    await ws.send_message(frame("live", {"items": created}))
    await ws.send_message(frame("events", {"items": [event(f"live-{n}") for n in range(MAX_SESSIONS_PER_CONNECTION)]}))
    await settle(ws, "cap")


async def test_refused_frames_of_100_kb_leave_serve_no_larger_once_answered(tmp_path: Path) -> None:
    with trio.fail_after(PHASE):
        async with serve_process(tmp_path) as (proc, port, token, log):
            async with open_websocket("127.0.0.1", port, "/dsh", use_ssl=False) as ws:
                hello = {"token": token, "role": "dsh-host", "protocol": 1, "capabilities": ["events", "live", "dock"]}
                await ws.send_message(frame("hello", hello))
                assert json.loads(await ws.get_message())["type"] == "welcome"
                await fill_the_session_cap(ws)

                await refuse_all(ws, "warm", 0)
                baseline = vm_rss(proc.pid)
                sent = await refuse_all(ws, "big", BIG)
                grown = vm_rss(proc.pid) - baseline
                # still serving
                await ws.send_message(frame("select", {"op": "create", "sessionId": "after"}, id="q"))
                assert json.loads(await ws.get_message())["type"] == "selection"
    assert sent > FRAMES * BIG
    print(f"VmRSS baseline {baseline / MB:.1f} MiB, grown by {grown / MB:.2f} MiB after {sent / MB:.1f} MiB refused")
    assert grown < BOUND, f"{grown / MB:.1f} MiB more after {FRAMES} refused frames"
    lines = log.read_text().splitlines()
    assert not [line for line in lines if line.startswith("loopdock ERROR") or "Traceback" in line], lines[-20:]
    # the refused text went into no log line (a peer's first error is logged, cut)
    assert max(map(len, lines)) < 1000


async def oversize(port: int, token: str, size: int) -> int:
    """A DSH host whose second frame is ``size`` characters: the close code it gets."""
    try:
        async with open_websocket("127.0.0.1", port, "/dsh", use_ssl=False) as ws:
            await ws.send_message(frame("hello", {"token": token, "role": "dsh-host", "protocol": 1, "capabilities": []}))
            assert json.loads(await ws.get_message())["type"] == "welcome"
            await ws.send_message(frame("events", {"items": [event("x" * size)]}))
            raise AssertionError(f"answered: {await ws.get_message()!r:.200}")
    except ConnectionClosed as exc:
        assert exc.reason is not None
        return int(exc.reason.code)


async def page(port: int, target: str) -> str:
    """The status of a plain GET of ``target``, once the server has closed the connection."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    response = b""
    async with stream:
        try:
            await stream.send_all(f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        except trio.BrokenResourceError:
            pass  # refused before it was all sent
        try:
            while chunk := await stream.receive_some():
                response += chunk
        except trio.BrokenResourceError:
            pass  # closed with the rest of the request unread: a reset after the answer
    return response.split(b" ", 2)[1].decode()


async def test_oversize_messages_and_absurd_page_queries_leave_serve_no_larger(tmp_path: Path) -> None:
    with trio.fail_after(PHASE):
        async with serve_process(tmp_path) as (proc, port, token, log):
            for n in range(3):
                assert await oversize(port, token, MAX_MESSAGE_SIZE + n) == 1009
                assert await page(port, f"/goalbar?session=w{n}") == "200"
                assert await page(port, f"/goalbar?session=w{n}" + "q" * BIG) == "431"
            baseline = vm_rss(proc.pid)
            for n in range(30):  # 30 MiB of frames over the limit
                assert await oversize(port, token, MAX_MESSAGE_SIZE + n) == 1009
            for n in range(FRAMES):
                # the head over 16 KiB is refused (431); a long one under it
                # is a page (the query is the page's to read)
                assert await page(port, f"/goalbar?session={n}" + "q" * BIG) == "431"
                assert await page(port, f"/console?session={n}" + "q" * (BIG // 10)) == "200"
            async with open_websocket("127.0.0.1", port, "/dsh", use_ssl=False) as ws:  # still serving
                await ws.send_message(frame("hello", {"token": token, "role": "dsh-host", "protocol": 1, "capabilities": []}))
                assert json.loads(await ws.get_message())["type"] == "welcome"
                await settle(ws, "after")
            grown = vm_rss(proc.pid) - baseline
    print(f"VmRSS baseline {baseline / MB:.1f} MiB, grown by {grown / MB:.2f} MiB")
    assert grown < BOUND, f"{grown / MB:.1f} MiB more"
    lines = log.read_text().splitlines()
    assert not [line for line in lines if line.startswith("loopdock ERROR") or "Traceback" in line], lines[-20:]
