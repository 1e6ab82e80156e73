"""A subprocess's output stream read line by line (for tests that watch a real process)."""

from __future__ import annotations

import re

import trio


class Lines:
    """``until(pattern)`` waits for the first line (seen so far or to come) matching
    ``pattern``; ``lines`` holds every line read. With ``deadline`` seconds, a wait that
    runs out prints the last lines read, to say what came instead."""

    def __init__(self, stream: trio.abc.ReceiveStream, deadline: float | None = None) -> None:
        self.stream, self.buffer, self.lines = stream, b"", []
        self.deadline = deadline

    async def until(self, pattern: str) -> str:
        if self.deadline is None:
            return await self._until(pattern)
        with trio.fail_after(self.deadline):
            try:
                return await self._until(pattern)
            except trio.Cancelled:
                print("\n".join(self.lines[-40:]))
                raise

    async def _until(self, pattern: str) -> str:
        regex, index = re.compile(pattern), 0
        while True:
            for line in self.lines[index:]:
                if regex.search(line):
                    return line
            index = len(self.lines)
            chunk = await self.stream.receive_some()
            assert chunk, f"the stream ended before {pattern!r}; got {self.lines}"
            self.buffer += chunk
            *done, self.buffer = self.buffer.split(b"\n")
            self.lines += [line.decode() for line in done]
