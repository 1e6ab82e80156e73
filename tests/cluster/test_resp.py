"""The cluster's own Redis connection for a turn's commands (runtime.cluster._resp)."""

from __future__ import annotations

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from loopdock.benchmarks._redis import free_port
from loopdock.runtime.cluster import RETRYABLE, RedisReplyError, RespConnection, RespConnectionError
from loopdock.runtime.cluster._resp import Replies, encode


def test_commands_encode_as_arrays_of_bulk_strings():
    assert encode(("XADD", "s", "*", "n", 12, "f", 1.5, b"\x00")) == (
        b"*8\r\n$4\r\nXADD\r\n$1\r\ns\r\n$1\r\n*\r\n$1\r\nn\r\n$2\r\n12\r\n$1\r\nf\r\n$3\r\n1.5\r\n$1\r\n\x00\r\n")
    with pytest.raises(TypeError):
        encode(("SET", "k", None))  # type: ignore[arg-type]


def take_all(data: bytes, cuts: list[int]) -> list[object]:
    """Every reply in ``data``, given to one parser in pieces cut at ``cuts``."""
    parser, buffer, pos, replies = Replies(), bytearray(), 0, []
    for start, stop in zip([0, *cuts], [*cuts, len(data)], strict=True):
        buffer += data[start:stop]
        while True:
            whole, reply, pos = parser.take(buffer, pos)
            if not whole:
                break
            replies.append(reply)
    assert pos == len(data)  # every byte was read
    return replies


def test_replies_parse_whole_and_go_on_where_the_bytes_ended():
    reply = b"*3\r\n$2\r\nid\r\n*2\r\n:7\r\n$-1\r\n+OK\r\n-ERR no\r\n*0\r\n*-1\r\n"
    whole = take_all(reply, [])
    assert whole[0] == ["id", [7, None], "OK"] and whole[2:] == [[], None]
    assert isinstance(whole[1], RedisReplyError) and str(whole[1]) == "ERR no"
    for cut in range(1, len(reply)):
        parts = take_all(reply, [cut])
        assert parts[0] == whole[0] and parts[2:] == whole[2:] and str(parts[1]) == "ERR no"
    assert take_all("$5\r\nhé\r\n\r\n".encode(), [3, 6]) == ["hé\r\n"]  # a bulk string holds anything
    with pytest.raises(RespConnectionError, match="not a RESP2 reply"):
        Replies().take(b"?what\r\n", 0)


def _resp(value: object) -> bytes:
    if value is None:
        return b"$-1\r\n"
    if isinstance(value, int):
        return b":%d\r\n" % value
    if isinstance(value, str):
        data = value.encode()
        return b"$%d\r\n%s\r\n" % (len(data), data)
    assert isinstance(value, list)
    return b"*%d\r\n" % len(value) + b"".join(_resp(item) for item in value)


_values = st.recursive(st.none() | st.integers() | st.text(), lambda inner: st.lists(inner, max_size=5), max_leaves=20)


@given(replies=st.lists(_values, min_size=1, max_size=4), data=st.data())
def test_replies_cut_anywhere_parse_as_whole(replies, data):
    encoded = b"".join(_resp(value) for value in replies)
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(encoded) - 1)), max_size=8)))
    assert take_all(encoded, [c for c in cuts if c < len(encoded)]) == replies


class CountingBuffer(bytearray):
    """A buffer that counts the bytes its ``find`` calls look at."""

    looked = 0

    def find(self, sub, start=0, *rest):  # type: ignore[override]
        found = super().find(sub, start, *rest)
        self.looked += (found if found >= 0 else len(self)) - start + len(sub)
        return found


def test_a_long_reply_arriving_in_pieces_is_read_once():
    # XREAD of a long log: 20,000 entries arriving 4 KiB at a time. Parsing again from the
    # reply's start at each piece would look at about 250 times the reply's bytes.
    reply = _resp([["e-%d" % i, ["event", "x" * 40]] for i in range(20_000)])
    parser, buffer, pos = Replies(), CountingBuffer(), 0
    for start in range(0, len(reply), 4096):
        buffer += reply[start : start + 4096]
        whole, value, pos = parser.take(buffer, pos)
    assert whole and len(value) == 20_000 and value[-1] == ["e-19999", ["event", "x" * 40]]
    assert buffer.looked < 2 * len(reply)


async def test_a_pipeline_answers_in_order_with_errors_in_their_place(redis_server):
    conn = RespConnection(redis_server.url)
    try:
        replies = await conn.pipeline([("SET", "k", "v"), ("INCR", "k"), ("GET", "k"), ("XLEN", "nothing")])
        assert replies[0] == "OK" and isinstance(replies[1], RedisReplyError) and replies[2:] == ["v", 0]
        with pytest.raises(RedisReplyError, match="NOSCRIPT") as caught:
            await conn.call("EVALSHA", "0" * 40, 0)
        assert caught.value.no_script
        assert await conn.call("GET", "k") == "v"  # the connection goes on after error replies
    finally:
        await conn.aclose()


async def test_a_command_cancelled_halfway_leaves_no_reply_for_the_next(redis_server):
    conn = RespConnection(redis_server.url)
    try:
        await conn.call("SET", "k", "v")
        with trio.move_on_after(0.05):
            await conn.call("BLPOP", "empty", 5)  # blocks in Redis; its reply would come later
        # Its late reply (or none) must not be read as this one's.
        assert await conn.call("GET", "k") == "v"
    finally:
        await conn.aclose()


async def test_a_lost_server_is_a_retryable_error_and_the_connection_comes_back(redis_server):
    conn = RespConnection(redis_server.url)
    try:
        await conn.call("SET", "k", "v")
        redis_server.restart()  # the append-only file keeps k
        with pytest.raises(RespConnectionError) as caught:
            await conn.call("GET", "k")
        assert isinstance(caught.value, RETRYABLE)
        assert await conn.call("GET", "k") == "v"
    finally:
        await conn.aclose()


async def test_nothing_listening_is_a_retryable_error():
    conn = RespConnection(f"redis://127.0.0.1:{free_port()}/0")
    with pytest.raises(RespConnectionError) as caught:
        await conn.call("PING")
    assert isinstance(caught.value, RETRYABLE)


async def test_the_url_names_the_database(redis_server):
    conn = RespConnection(redis_server.url.rsplit("/", 1)[0] + "/3")
    other = RespConnection(redis_server.url)
    try:
        await conn.call("SET", "k", "in 3")
        assert await other.call("GET", "k") is None
        assert await conn.call("GET", "k") == "in 3"
    finally:
        await conn.aclose()
        await other.aclose()


def test_a_commit_s_mark_names_what_a_waiter_needs_of_its_events():
    import json

    from loopdock.runtime import Event
    from loopdock.runtime.cluster import mark_of

    def event(seq: int, type_: str, **data: object) -> Event:
        return Event(type=type_, seq=seq, time=0, data=dict(data))

    assert mark_of([], []) == ""
    turn = [event(0, "turn/start"), event(1, "user/message", id="m1"),
            event(2, "agent/inbox/spliced", op="insert", placement="inject", messageId="m2"),
            event(3, "agent/inbox/spliced", op="insert", placement="followup", messageId="m3"),
            event(4, "turn/end")]
    assert json.loads(mark_of(turn, ["m1"])) == {"c": ["m1"], "i": ["m2"], "o": False}
    assert json.loads(mark_of(turn[:2], ["m1"]))["o"] is True
    assert json.loads(mark_of(turn[1:2], ["m1"]))["o"] is None  # no turn began or ended
