"""The bridge workload's client: a Python process playing the DSH host (and a GoalBar page).

Started by ``benchmarks._bridge`` as ``python -m loopdock.benchmarks._bridge_client`` with its
parameters (port, token, sizes) as JSON on stdin; it reports progress as ``@@progress``
lines on stderr and writes its figures as JSON on stdout. It runs its own trio loop, so
the runtime's loop (the server) and this one never share a scheduler or a CPU slice.

It speaks exactly the frames of the DSH plugin (``bridge/dsh_plugin/index.mjs``): a
``hello`` with role ``dsh-host`` and the plugin's capabilities, ``events`` frames of at
most 200 items ``{sessionId, event: {type, seq, time, data}}``, and ``preStep`` requests
(ids ``h<n>``) answered by ``verdict``; and, on a second connection, those of the GoalBar
page (``hello`` role ``goalbar``, ``goalbarWatch``, pushed ``goalbar`` frames). Frames are
written and read with the library's own codec (``bridge.encode``/``bridge.decode``), over a
websocket client of a few lines on wsproto (``_WebSocket``; the plugin's is the host's
``WebSocket``). Times are ``time.perf_counter()`` in this process.
"""

from __future__ import annotations

import json
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio
from wsproto import ConnectionType, WSConnection
from wsproto import events as ws_events

from loopdock.bridge import Events, Frame, Goalbar, GoalbarWatch, Hello, Ping, PreStep, SessionEvent, decode, encode
from loopdock.runtime import Event

from ._common import PROGRESS_PREFIX, percentile, summary_ms

#: The plugin's batch size (BATCH_ITEMS in index.mjs) and its capabilities (without dock).
PLUGIN_BATCH_ITEMS = 200
HOST_CAPABILITIES = ("events", "live", "commands", "pre-step")
GOALBAR_CAPABILITIES = ("events", "live", "goalbar")
#: The source kind the plugin asks verdicts for by default (config.ownedKinds).
OWNED_KIND = "loopx-continuation"

INGEST_PREFIX = "bench-ingest-"
RELAY_SESSION = "bench-relay-0"
GOALBAR_SESSION = "bench-goalbar"
AGENT_PREFIX = "bench-agent-"


def _message(i: int) -> dict[str, Any]:
    """A DSH message of a kind the runtime owns (the plugin asks verdicts only for those)."""
    return {
        "id": f"m{i}",
        "role": "user",
        "content": [{"type": "text", "text": "continue the bound goal"}],
        "source": {"kind": OWNED_KIND},
    }


def _event(seq: int) -> Event:
    """A DSH-shaped session event of about 150 characters on the wire."""
    return Event(
        "assistant/message/delta",
        seq,
        1_767_000_000_000 + seq,
        {"index": 0, "delta": {"type": "text", "text": "the quick brown fox jumps over the lazy dog"}},
    )


def _events_frames(session_id: str, first_seq: int, count: int, batch: int) -> list[tuple[int, str]]:
    """``count`` events of ``session_id`` from ``first_seq``, as (last seq, frame text)."""
    frames = []
    for start in range(first_seq, first_seq + count, batch):
        stop = min(start + batch, first_seq + count)
        items = tuple(SessionEvent(session_id, _event(seq)) for seq in range(start, stop))
        frames.append((stop - 1, encode(Frame(Events(items)))))
    return frames


class _WebSocket:
    """The client side of one websocket connection, as much as the bench needs: text
    messages both ways, pings answered. One reader (``get_message``); writers take turns."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self._stream = stream
        self._ws = WSConnection(ConnectionType.CLIENT)
        self._send_lock = trio.Lock()
        self._parts: list[str] = []
        self._messages: deque[str] = deque()
        self.accepted = False

    async def _send(self, event: ws_events.Event) -> None:
        async with self._send_lock:
            await self._stream.send_all(self._ws.send(event))

    async def send_message(self, text: str) -> None:
        await self._send(ws_events.TextMessage(data=text))

    async def _read(self) -> None:
        data = await self._stream.receive_some(2**16)
        if not data:
            raise ConnectionError("the bridge closed the connection")
        self._ws.receive_data(data)
        for event in self._ws.events():
            if isinstance(event, ws_events.AcceptConnection):
                self.accepted = True
            elif isinstance(event, ws_events.TextMessage):
                self._parts.append(event.data)
                if event.message_finished:
                    self._messages.append("".join(self._parts))
                    self._parts.clear()
            elif isinstance(event, ws_events.Ping):
                await self._send(event.response())
            elif isinstance(event, ws_events.CloseConnection):
                raise ConnectionError(f"the bridge closed the websocket ({event.code} {event.reason})")
            else:
                raise ConnectionError(f"the bridge refused the websocket: {event!r}")

    async def get_message(self) -> str:
        while not self._messages:
            await self._read()
        return self._messages.popleft()


@asynccontextmanager
async def _open_websocket(port: int, path: str) -> AsyncIterator[_WebSocket]:
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        ws = _WebSocket(stream)
        await ws._send(ws_events.Request(host=f"127.0.0.1:{port}", target=path))
        while not ws.accepted:
            await ws._read()
        yield ws


class Peer:
    """One websocket connection with a receiver task: replies wake their waiters,
    everything else goes to ``on_frame(frame, t)``."""

    def __init__(self, ws: _WebSocket, prefix: str) -> None:
        self.ws = ws
        self._prefix = prefix
        self._ids = 0
        self._waiters: dict[str, tuple[trio.Event, list[Any]]] = {}
        self.on_frame: Callable[[Frame, float], None] = lambda frame, t: None
        self.errors: list[str] = []

    async def hello(self, token: str, role: str, capabilities: tuple[str, ...]) -> None:
        await self.ws.send_message(encode(Frame(Hello(token, role, 1, capabilities))))  # type: ignore[arg-type]
        welcome = decode(await self.ws.get_message())
        if welcome.type != "welcome":
            raise RuntimeError(f"no welcome from the bridge: {welcome!r}")

    async def receive_loop(self) -> None:
        ws, clock = self.ws, time.perf_counter
        while True:
            text = await ws.get_message()
            t = clock()
            frame = decode(text)
            if frame.re is not None:
                waiter = self._waiters.pop(frame.re, None)
                if waiter is not None:
                    waiter[1].extend((frame, t))
                    waiter[0].set()
                    continue
            if frame.type == "error":
                self.errors.append(repr(frame.message))
                continue
            self.on_frame(frame, t)

    def new_request(self, message: Any) -> tuple[str, str, trio.Event, list[Any]]:
        """A request frame (text) and its reply slot: ``[reply frame, arrival time]``."""
        self._ids += 1
        request_id = f"{self._prefix}{self._ids}"
        done, slot = trio.Event(), []
        self._waiters[request_id] = (done, slot)
        return request_id, encode(Frame(message, id=request_id)), done, slot

    async def request(self, message: Any) -> tuple[Frame, float, float]:
        """Send a request and wait for its reply: (reply, sent at, answered at)."""
        _, text, done, slot = self.new_request(message)
        t0 = time.perf_counter()
        await self.ws.send_message(text)
        await done.wait()
        return slot[0], t0, slot[1]


def _progress(fraction: float, label: str) -> None:
    sys.stderr.write(f"{PROGRESS_PREFIX}{fraction:.4f} {label}\n")
    sys.stderr.flush()


async def _sequential(peer: Peer, make: Callable[[int], Any], count: int, expect: str) -> list[float]:
    samples = []
    for i in range(count):
        reply, t0, t1 = await peer.request(make(i))
        if reply.type != expect:
            raise RuntimeError(f"expected {expect}, got {reply!r}")
        samples.append(t1 - t0)
    return samples


def _pre_step(i: int, agents: int) -> PreStep:
    agent = f"{AGENT_PREFIX}{i % agents}"
    return PreStep(agent, agent, turn=i, step=0, messages=(_message(i),))


async def _pre_step_burst(host: Peer, size: int, agents: int, offset: int) -> tuple[list[float], float]:
    """``size`` pre-step requests sent back to back, then every verdict awaited: each
    request's round trip, and the burst's duration (first send -> last verdict)."""
    sent: list[tuple[float, trio.Event, list[Any]]] = []
    clock = time.perf_counter
    started = clock()
    for i in range(size):
        _, text, done, slot = host.new_request(_pre_step(offset + i, agents))
        t0 = clock()
        await host.ws.send_message(text)
        sent.append((t0, done, slot))
    latencies, last = [], started
    for t0, done, slot in sent:
        await done.wait()
        frame, t1 = slot
        if frame.type != "verdict" or frame.message.kind != "enter":
            raise RuntimeError(f"expected verdict enter, got {frame!r}")
        latencies.append(t1 - t0)
        last = max(last, t1)
    return latencies, last - started


async def _ingest(host: Peer, events: int, sessions: int, batch: int) -> dict[str, Any]:
    """``events`` events over ``sessions`` sessions, interleaved frame by frame as a busy
    host's flush would; the clock stops at the pong of a ping sent after the last frame.
    The server reads a peer's frames in order and awaits the handler's ``on_events``
    before reading the next one, so that pong means every event was mirrored."""
    per_session = max(1, events // sessions)
    by_session = [_events_frames(f"{INGEST_PREFIX}{s}", 0, per_session, batch) for s in range(sessions)]
    frames = [frame for group in zip(*by_session, strict=True) for _, frame in group]
    total_chars = sum(len(f) for f in frames)
    _, ping, done, slot = host.new_request(Ping())
    started = time.perf_counter()
    for text in frames:
        await host.ws.send_message(text)
    await host.ws.send_message(ping)
    await done.wait()
    elapsed = slot[1] - started
    sent = per_session * sessions
    return {
        "events": sent,
        "sessions": sessions,
        "frames": len(frames),
        "items_per_frame": sent / len(frames),
        "chars_per_event": total_chars / sent,
        "seconds": elapsed,
        "events_per_s": sent / elapsed,
        "frames_per_s": len(frames) / elapsed,
        "mb_per_s": total_chars / elapsed / 1e6,
    }


async def _relay(host: Peer, goalbar: Peer, events: int, batch: int, window: int) -> dict[str, Any]:
    """Host -> runtime -> GoalBar page: ``events`` events of one session sent in frames of
    ``batch``, at most ``window`` events sent and not yet received by the page (the
    page's outbox in the server holds 4,096 entries: a peer beyond it is dropped)."""
    window = max(window, batch)  # a frame never waits for itself
    frames = _events_frames(RELAY_SESSION, 0, events, batch)
    sent_at = [0.0] * events
    latencies: list[float] = []
    state = {"received": 0, "frames": 0}
    progressed = trio.Event()
    everything = trio.Event()
    previous = goalbar.on_frame

    def on_frame(frame: Frame, t: float) -> None:
        nonlocal progressed
        if isinstance(frame.message, Events):
            state["frames"] += 1
            for item in frame.message.items:
                if item.session_id == RELAY_SESSION:
                    latencies.append(t - sent_at[item.event.seq])
                    state["received"] += 1
            progressed.set()
            progressed = trio.Event()
            if state["received"] >= events:
                everything.set()
        else:
            previous(frame, t)

    goalbar.on_frame = on_frame
    clock = time.perf_counter
    started = clock()
    for last_seq, text in frames:
        first_seq = last_seq - (last_seq % batch)
        while last_seq + 1 - state["received"] > window:
            await progressed.wait()
        t0 = clock()
        for seq in range(first_seq, last_seq + 1):
            sent_at[seq] = t0
        await host.ws.send_message(text)
    await everything.wait()
    elapsed = clock() - started
    goalbar.on_frame = previous
    return {
        "events": events,
        "window": window,
        "seconds": elapsed,
        "events_per_s": events / elapsed,
        "page_frames": state["frames"],
        "items_per_page_frame": events / max(state["frames"], 1),
        "latency": summary_ms(latencies),
    }


class GoalbarWatcher:
    """The page's view of one session's bar: the latest ``processed`` it was shown."""

    def __init__(self, goalbar: Peer) -> None:
        self.processed = -1
        self.frames = 0
        self._changed = trio.Event()
        goalbar.on_frame = self.on_frame

    def on_frame(self, frame: Frame, t: float) -> None:
        message = frame.message
        if isinstance(message, Goalbar) and message.state.session_id == GOALBAR_SESSION:
            self.frames += 1
            self.last_at = t
            self.processed = message.state.processed if message.state.processed is not None else -1
            self._changed.set()
            self._changed = trio.Event()

    async def wait_for(self, processed: int) -> float:
        while self.processed < processed:
            await self._changed.wait()
        return self.last_at


async def _goalbar(host: Peer, watcher: GoalbarWatcher, wakes: int, flood: int, batch: int) -> dict[str, Any]:
    """The GoalBar: (1) ``wakes`` times, one session event sent, then the ``goalbar`` frame
    showing it awaited (wake -> LoopX re-read -> projection changed -> frame pushed);
    (2) ``flood`` events sent as fast as frames go, counting the frames the page gets
    (one read serves every wake made before it started: frames coalesce)."""
    latencies = []
    seq = 0
    for _ in range(wakes):
        ((_, text),) = _events_frames(GOALBAR_SESSION, seq, 1, 1)
        t0 = time.perf_counter()
        await host.ws.send_message(text)
        seq += 1
        latencies.append(await watcher.wait_for(seq) - t0)
    frames_before = watcher.frames
    started = time.perf_counter()
    for _, text in _events_frames(GOALBAR_SESSION, seq, flood, batch):
        await host.ws.send_message(text)
    seq += flood
    ended = await watcher.wait_for(seq)
    elapsed = ended - started
    frames = watcher.frames - frames_before
    return {
        "wakes": wakes,
        "wake_to_frame": summary_ms(latencies),
        "flood_events": flood,
        "flood_frames": frames,
        "flood_seconds": elapsed,
        "flood_events_per_s": flood / elapsed,
        "flood_frames_per_s": frames / elapsed,
        "events_per_frame": flood / max(frames, 1),
    }


async def run_client(params: dict[str, Any]) -> dict[str, Any]:
    port, token = params["port"], params["token"]
    agents, batch = params["agents"], PLUGIN_BATCH_ITEMS
    result: dict[str, Any] = {}
    steps = 6
    async with _open_websocket(port, "/dsh") as host_ws, _open_websocket(port, "/goalbar") as page_ws:
        host, page = Peer(host_ws, "h"), Peer(page_ws, "g")
        await host.hello(token, "dsh-host", HOST_CAPABILITIES)
        await page.hello(token, "goalbar", GOALBAR_CAPABILITIES)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(host.receive_loop)
            nursery.start_soon(page.receive_loop)
            watcher = GoalbarWatcher(page)
            reply, _, _ = await page.request(GoalbarWatch(GOALBAR_SESSION))
            if reply.type != "goalbarResult":
                raise RuntimeError(f"goalbarWatch answered {reply!r}")

            count = params["sequential"]
            _progress(0 / steps, "bridge: ping and pre-step round trips")
            await _sequential(host, lambda i: Ping(), params["warmup"], "pong")
            await _sequential(host, lambda i: _pre_step(i, agents), params["warmup"], "verdict")
            pings = await _sequential(host, lambda i: Ping(), count, "pong")
            pre_steps = await _sequential(host, lambda i: _pre_step(i, agents), count, "verdict")
            result["ping"] = summary_ms(pings)
            result["pre_step_sequential"] = summary_ms(pre_steps)
            result["pre_step_sequential"]["mean_ms"] = sum(pre_steps) / len(pre_steps) * 1e3

            _progress(1 / steps, "bridge: pre-step bursts")
            burst_latencies, rates = [], []
            for b in range(params["bursts"]):
                latencies, seconds = await _pre_step_burst(host, params["burst_size"], agents, b * params["burst_size"])
                burst_latencies += latencies
                rates.append(params["burst_size"] / seconds)
            result["pre_step_burst"] = {
                **summary_ms(burst_latencies),
                "bursts": params["bursts"],
                "burst_size": params["burst_size"],
                "verdicts_per_s": percentile(rates, 50),
            }

            _progress(2 / steps, "bridge: host events ingested")
            result["ingest"] = await _ingest(host, params["ingest_events"], params["ingest_sessions"], batch)

            _progress(3 / steps, "bridge: host -> GoalBar page relay")
            result["relay"] = await _relay(host, page, params["relay_events"], batch, params["relay_window"])

            _progress(4 / steps, "bridge: GoalBar wakes")
            result["goalbar"] = await _goalbar(host, watcher, params["goalbar_wakes"], params["goalbar_flood"], batch)
            _progress(1.0, "bridge: done")
            result["errors"] = host.errors + page.errors
            nursery.cancel_scope.cancel()
    return result


def main() -> int:
    params = json.loads(sys.stdin.read())

    async def bounded() -> dict[str, Any]:
        with trio.fail_after(params["timeout"]):  # a hang fails the phase, loudly
            return await run_client(params)

    result = trio.run(bounded)
    sys.stdout.write(json.dumps(result))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
