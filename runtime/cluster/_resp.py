"""RespConnection: one plain connection to Redis for the commands a turn pays for.

Through coredis, every round trip costs a trio process a few hundred microseconds of
CPU (its connection pool, its reader and writer tasks, a command object per command),
which made the round trips of a turn (a worker's commits, its inbox reads and
duplicate checks; a client's messages and its log watcher) cost more than the turn's own
work. Each of those paths has a connection of its own, used by one task at a time: a
command (or a pipeline of them) is encoded, sent, and its reply parsed; nothing else.
Everything else (leases, control messages, tests) keeps using coredis.

RESP2 (no ``HELLO``): replies are ``str`` (simple and bulk strings, decoded as UTF-8),
``int``, ``None`` (a null) and lists; an error reply is a ``RedisReplyError``, raised
(``call``) or in its place in the list (``pipeline``). A connection that failed, or whose
command was cancelled halfway, is closed and opened again at its next use; the failure
is a ``RespConnectionError``, an ``OSError`` (``RETRYABLE``), so callers retry as they
retry coredis's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import unquote, urlsplit

import trio

from ._connect import check_url

Arg = str | bytes | int | float
#: The most bytes one receive asks for.
_RECEIVE = 1 << 16


class RespConnectionError(ConnectionError):
    """The connection to Redis failed (it is opened again at the next command)."""


class RedisReplyError(Exception):
    """Redis answered a command with an error (``-ERR ...``, ``-NOSCRIPT ...``)."""

    @property
    def no_script(self) -> bool:
        return str(self).startswith("NOSCRIPT")


def encode(command: Sequence[Arg]) -> bytes:
    """A command as a RESP array of bulk strings."""
    parts = [b"*%d\r\n" % len(command)]
    append = parts.append
    for arg in command:
        # Exact types first: a commit's arguments are mostly str, then int.
        if type(arg) is str:
            data = arg.encode()
        elif type(arg) is int:
            data = b"%d" % arg
        elif isinstance(arg, bytes):
            data = arg
        elif isinstance(arg, int | float) and not isinstance(arg, bool):
            data = repr(arg).encode()
        else:
            raise TypeError(f"a Redis argument must be str, bytes, int or float, not {type(arg).__name__}")
        append(b"$%d\r\n" % len(data))
        append(data)
        append(b"\r\n")
    return b"".join(parts)


class Replies:
    """Parses RESP2 replies out of a buffer that grows as bytes arrive, looking at each
    byte once: an array that the end of the buffer cuts keeps the items it parsed
    (``_open``), and the next ``take`` goes on from where this one stopped. (Parsing a
    reply again from its start at each receive made a reply of n bytes cost n**2 / 64 KiB.)"""

    def __init__(self) -> None:
        self._open: list[tuple[list[Any], int]] = []  # the arrays being filled, outermost first

    def clear(self) -> None:
        self._open.clear()

    def take(self, buffer: bytes | bytearray, pos: int) -> tuple[bool, Any, int]:
        """``(True, reply, end)`` for the reply whose parse reached ``pos`` (its start, or
        where the last ``take`` stopped), or ``(False, None, p)``: more bytes are needed,
        and the next ``take`` starts at ``p``."""
        while True:
            end = buffer.find(b"\r\n", pos)
            if end < 0:
                return False, None, pos
            kind = buffer[pos]
            value: Any
            if kind == 0x24:  # $ bulk string
                length = int(buffer[pos + 1 : end])
                if length < 0:
                    value, pos = None, end + 2
                else:
                    stop = end + 2 + length
                    if len(buffer) < stop + 2:
                        return False, None, pos
                    value, pos = buffer[end + 2 : stop].decode(), stop + 2
            elif kind == 0x2A:  # * array
                count = int(buffer[pos + 1 : end])
                pos = end + 2
                if count > 0:
                    self._open.append(([], count))
                    continue
                value = None if count < 0 else []
            elif kind == 0x3A:  # : integer
                value, pos = int(buffer[pos + 1 : end]), end + 2
            elif kind == 0x2B:  # + simple string
                value, pos = buffer[pos + 1 : end].decode(), end + 2
            elif kind == 0x2D:  # - error
                value, pos = RedisReplyError(buffer[pos + 1 : end].decode(errors="replace")), end + 2
            else:
                raise RespConnectionError(f"not a RESP2 reply: {bytes(buffer[pos : pos + 20])!r}")
            # A whole value: it completes the arrays it fills last, up to a whole reply.
            while self._open:
                items, count = self._open[-1]
                items.append(value)
                if len(items) < count:
                    break
                self._open.pop()
                value = items
            else:
                return True, value, pos


class RespConnection:
    def __init__(self, url: str) -> None:
        parts = urlsplit(check_url(url))
        self._host = parts.hostname or "127.0.0.1"
        self._port = parts.port or 6379
        self._username = unquote(parts.username) if parts.username else None
        self._password = unquote(parts.password) if parts.password else None
        db = parts.path.strip("/")
        self._db = int(db) if db else 0
        self._stream: trio.SocketStream | None = None
        self._buffer = bytearray()
        self._parser = Replies()
        self._lock = trio.Lock()

    async def call(self, *command: Arg) -> Any:
        """One command's reply (an error reply raised as RedisReplyError)."""
        (reply,) = await self.pipeline([command])
        if isinstance(reply, RedisReplyError):
            raise reply
        return reply

    async def pipeline(self, commands: Sequence[Sequence[Arg]]) -> list[Any]:
        """Every command's reply, in order, after one send (error replies in their place)."""
        payload = b"".join(encode(command) for command in commands)
        async with self._lock:
            stream = self._stream or await self._connect()
            try:
                await stream.send_all(payload)
                return await self._replies(stream, len(commands))
            except BaseException as exc:
                # Half a conversation (a failure, a cancellation): the rest of it would
                # be read as the next command's reply. Start again on a new connection.
                self._drop()
                if isinstance(exc, trio.BrokenResourceError | trio.ClosedResourceError | OSError) \
                        and not isinstance(exc, RespConnectionError):
                    raise RespConnectionError(f"redis connection lost: {exc!r}") from exc
                raise

    async def aclose(self) -> None:
        if self._stream is not None:
            stream, self._stream = self._stream, None
            with trio.CancelScope(shield=True):
                await stream.aclose()

    def _drop(self) -> None:
        stream, self._stream = self._stream, None
        self._buffer.clear()
        self._parser.clear()
        if stream is not None:
            stream.socket.close()

    async def _replies(self, stream: trio.SocketStream, count: int) -> list[Any]:
        buffer = self._buffer
        replies: list[Any] = []
        pos = 0
        while len(replies) < count:
            whole, reply, pos = self._parser.take(buffer, pos)
            if not whole:
                data = await stream.receive_some(_RECEIVE)
                if not data:
                    raise RespConnectionError("redis closed the connection")
                buffer += data
                continue
            replies.append(reply)
        del buffer[:pos]
        return replies

    async def _connect(self) -> trio.SocketStream:
        try:
            stream = await trio.open_tcp_stream(self._host, self._port)
        except OSError as exc:
            raise RespConnectionError(f"cannot connect to redis: {exc!r}") from exc
        self._stream = stream
        self._buffer.clear()
        hello: list[Sequence[Arg]] = []
        if self._password is not None:
            hello.append(("AUTH", self._username, self._password) if self._username else ("AUTH", self._password))
        if self._db:
            hello.append(("SELECT", self._db))
        if hello:
            try:
                await stream.send_all(b"".join(encode(command) for command in hello))
                replies = await self._replies(stream, len(hello))
            except BaseException:
                self._drop()
                raise
            for reply in replies:
                if isinstance(reply, RedisReplyError):
                    self._drop()
                    raise reply
        return stream
