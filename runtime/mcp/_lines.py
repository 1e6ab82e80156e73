"""Lines: a byte stream from a child's pipe cut into lines, each byte scanned once.

Appending every chunk to one buffer and splitting the whole of it again costs time
quadratic in a line's length (an 8 MiB line read 64 KiB at a time is copied and scanned
about 128 times over); a line that never ends grows the buffer without bound. Here each
chunk is searched for newlines once, only the unfinished line is kept, and a line past
``limit`` bytes is refused (``LineTooLong``) or cut to its first ``limit`` bytes.
"""

from __future__ import annotations


class LineTooLong(Exception):
    """A line (finished or not) is longer than the splitter's limit."""


class Lines:
    """``feed(chunk)`` returns the lines ``chunk`` finished (without their newline).

    ``cut=False``: a line past ``limit`` raises LineTooLong. ``cut=True``: it is cut to
    its first ``limit`` bytes, the rest read and dropped up to its newline.
    """

    def __init__(self, limit: int, *, cut: bool = False) -> None:
        self.limit = limit
        self.cut = cut
        self._line = bytearray()  # the unfinished line (at most ``limit`` bytes)

    @property
    def pending(self) -> int:
        """The bytes of the unfinished line kept (never more than ``limit``)."""
        return len(self._line)

    def feed(self, data: bytes | bytearray) -> list[bytes]:
        chunk = data if isinstance(data, bytes) else bytes(data)
        lines: list[bytes] = []
        start = 0
        while (end := chunk.find(b"\n", start)) != -1:
            if not self._line and end - start <= self.limit:
                lines.append(chunk[start:end])  # a whole line in this chunk: one copy
            else:
                self._take(chunk, start, end)
                lines.append(bytes(self._line))
                self._line.clear()
            start = end + 1
        self._take(chunk, start, len(chunk))
        return lines

    def _take(self, chunk: bytes, start: int, end: int) -> None:
        room = self.limit - len(self._line)
        if end - start > room:
            if not self.cut:
                raise LineTooLong(f"a line longer than {self.limit} bytes")
            end = start + room
        if end > start:
            self._line += chunk[start:end]
