"""The cluster's own Redis connection for a turn's commands (runtime.cluster._resp)."""

from __future__ import annotations

import pytest
import trio

from loopdock.benchmarks._redis import free_port
from loopdock.runtime.cluster import RETRYABLE, RedisReplyError, RespConnection, RespConnectionError
from loopdock.runtime.cluster._resp import _Incomplete, encode, parse


def test_commands_encode_as_arrays_of_bulk_strings():
    assert encode(("XADD", "s", "*", "n", 12, "f", 1.5, b"\x00")) == (
        b"*8\r\n$4\r\nXADD\r\n$1\r\ns\r\n$1\r\n*\r\n$1\r\nn\r\n$2\r\n12\r\n$1\r\nf\r\n$3\r\n1.5\r\n$1\r\n\x00\r\n")
    with pytest.raises(TypeError):
        encode(("SET", "k", None))  # type: ignore[arg-type]


def test_replies_parse_whole_or_not_at_all():
    reply = b"*3\r\n$2\r\nid\r\n*2\r\n:7\r\n$-1\r\n+OK\r\n-ERR no\r\n"
    value, end = parse(reply, 0)
    assert value == ["id", [7, None], "OK"]
    error, end = parse(reply, end)
    assert isinstance(error, RedisReplyError) and str(error) == "ERR no" and end == len(reply)
    for cut in range(1, len(reply) - len(b"-ERR no\r\n")):
        with pytest.raises((_Incomplete, IndexError)):
            parse(reply[:cut], 0)
    assert parse("$5\r\nhé\r\n\r\n".encode(), 0) == ("hé\r\n", 11)  # a bulk string holds anything


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
