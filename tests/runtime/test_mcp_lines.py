"""Cutting a child's output into lines (runtime/mcp/_lines.py): whatever the chunks, the
lines are the stream's; a line past the limit is refused or cut, and an endless line
holds at most the limit in memory."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loopdock.runtime.mcp._lines import Lines, LineTooLong


def feed_all(lines: Lines, chunks: list[bytes]) -> list[bytes]:
    return [line for chunk in chunks for line in lines.feed(chunk)]


@given(
    st.lists(st.binary(max_size=40).filter(lambda b: b"\n" not in b), max_size=20),
    st.binary(max_size=40).filter(lambda b: b"\n" not in b),
    st.lists(st.integers(min_value=1, max_value=50), min_size=1, max_size=30),
)
def test_the_lines_are_the_streams_whatever_the_chunks(whole, unfinished, sizes):
    data = b"".join(line + b"\n" for line in whole) + unfinished
    chunks, at = [], 0
    while at < len(data):
        size = sizes[len(chunks) % len(sizes)]
        chunks.append(data[at : at + size])
        at += size
    lines = Lines(40)
    assert feed_all(lines, chunks) == whole
    assert lines.pending == len(unfinished)


def test_a_line_past_the_limit_is_refused_finished_or_not():
    assert Lines(5).feed(b"12345\n") == [b"12345"]  # exactly the limit: a line
    with pytest.raises(LineTooLong):
        Lines(5).feed(b"123456\n")  # finished within one chunk
    lines = Lines(5)
    assert lines.feed(b"123") == []
    with pytest.raises(LineTooLong):
        lines.feed(b"456")  # unfinished, across chunks
    with pytest.raises(LineTooLong):
        Lines(5).feed(b"ok\n" + b"x" * 6)  # the line after a good one


def test_cut_lines_keep_their_start_and_the_next_line_is_whole():
    lines = Lines(4, cut=True)
    assert lines.feed(b"abcdefgh") == [] and lines.pending == 4
    assert lines.feed(b"ijk\nnext\nlo") == [b"abcd", b"next"]
    assert lines.feed(b"ng line\n") == [b"long"]


def test_an_endless_line_holds_at_most_the_limit():
    lines = Lines(1000, cut=True)
    chunk = b"y" * 65_536
    for _ in range(1600):  # 100 MiB without a newline
        assert lines.feed(chunk) == []
        assert lines.pending == 1000
    assert lines.feed(b"\n") == [b"y" * 1000]
    assert lines.pending == 0
