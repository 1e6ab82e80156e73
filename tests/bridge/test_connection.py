"""The per-connection state machine, on pure values: text in, outputs out, no sockets."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loopdock.bridge import (
    CLOSE_POLICY_VIOLATION,
    CLOSE_PROTOCOL_ERROR,
    Ack,
    Answered,
    BridgeClosedError,
    Close,
    Connection,
    ConnectionState,
    ErrorCode,
    ErrorNotice,
    Events,
    Followup,
    Frame,
    Hello,
    Opened,
    Ping,
    Pong,
    Received,
    SendFrame,
    Verdict,
    Wake,
    Welcome,
    decode,
    encode,
)
from loopdock.bridge._messages import MAX_ID_LENGTH, MESSAGE_TYPES

TOKEN = "tok-0123456789"


def hello(token=TOKEN, role="dsh-host", protocol=1, capabilities=("events", "dock", "future")):
    return encode(Frame(Hello(token, role, protocol, capabilities)))


def wire(type_, data, **ids):
    return json.dumps({"v": 1, "type": type_, **ids, "data": data})


def open_connection(role="dsh-host"):
    conn = Connection(role, TOKEN, connection_id="c1")
    conn.receive(hello(role=role))
    assert conn.state is ConnectionState.OPEN
    return conn


def only_error(outputs):
    """The single error frame a protocol error produces (and nothing else)."""
    assert len(outputs) == 1 and isinstance(outputs[0], SendFrame), outputs
    frame = outputs[0].frame
    assert isinstance(frame.message, ErrorNotice)
    return frame


def refused(outputs, code=ErrorCode.UNAUTHORIZED, close=CLOSE_POLICY_VIOLATION):
    assert len(outputs) == 2, outputs
    error, closing = outputs
    assert isinstance(error, SendFrame) and error.frame.message.code == code
    assert closing == Close(close, "unauthorized" if close == CLOSE_POLICY_VIOLATION else "bad-version")
    return error.frame.message.message


# -- the handshake ---------------------------------------------------------------------


def test_a_good_hello_is_welcomed_with_the_capabilities_both_sides_name():
    conn = Connection("dsh-host", TOKEN, connection_id="c1")
    outputs = conn.receive(hello())
    welcome = Welcome(protocol=1, capabilities=("events", "dock"), connection_id="c1")
    assert outputs == [SendFrame(Frame(welcome)), Opened(Hello(TOKEN, "dsh-host", 1, ("events", "dock", "future")))]
    assert conn.state is ConnectionState.OPEN
    assert conn.hello.capabilities == ("events", "dock", "future")


def test_a_wrong_token_is_refused_and_the_connection_closed():
    conn = Connection("dsh-host", TOKEN, connection_id="c1")
    assert refused(conn.receive(hello(token=TOKEN + "x"))) == "bad token"
    assert conn.state is ConnectionState.CLOSED
    # Nothing the peer sends afterwards is looked at, not even a good hello.
    assert conn.receive(hello()) == []


@pytest.mark.parametrize(
    "first",
    [
        wire("ping", {}, id="1"),
        wire("events", {"items": []}),
        "{not json",
        b"\x00binary",
        wire("hello", {"role": "dsh-host", "protocol": 1}),  # no token at all
        json.dumps({"v": 2, "type": "hello", "data": {"token": TOKEN, "role": "dsh-host", "protocol": 2}}),
    ],
)
def test_anything_but_a_hello_first_is_unauthorized(first):
    conn = Connection("dsh-host", TOKEN, connection_id="c1")
    why = refused(conn.receive(first))
    assert why.startswith("the first frame must be")
    assert conn.state is ConnectionState.CLOSED


def test_a_hello_for_another_role_is_unauthorized():
    conn = Connection("goalbar", TOKEN, connection_id="c1")
    assert refused(conn.receive(hello(role="dsh-host"))) == "this endpoint serves goalbar, not dsh-host"


def test_the_token_is_checked_before_the_role_and_the_version():
    # A peer without the token learns nothing about what the endpoint expects.
    conn = Connection("goalbar", TOKEN, connection_id="c1")
    assert refused(conn.receive(hello(token="nope", role="dsh-host", protocol=7))) == "bad token"


def test_a_good_hello_of_another_protocol_is_bad_version():
    conn = Connection("dsh-host", TOKEN, connection_id="c1")
    why = refused(conn.receive(hello(protocol=2)), code=ErrorCode.BAD_VERSION, close=CLOSE_PROTOCOL_ERROR)
    assert "protocol 2" in why


def test_no_hello_in_time_is_unauthorized():
    conn = Connection("dsh-host", TOKEN, connection_id="c1")
    assert refused(conn.expire_hello()) == "no hello in time"
    assert open_connection().expire_hello() == []  # too late to matter once open


def test_an_empty_token_is_refused_up_front():
    with pytest.raises(ValueError):
        Connection("dsh-host", "", connection_id="c1")


# -- after the welcome ---------------------------------------------------------------------


def test_protocol_errors_after_the_welcome_are_answered_and_the_connection_stays_open():
    conn = open_connection()
    assert only_error(conn.receive("{oops")).message.code == ErrorCode.MALFORMED_JSON
    unknown = only_error(conn.receive(wire("teleport", {}, id="t1")))
    assert (unknown.message.code, unknown.re) == (ErrorCode.UNKNOWN_TYPE, "t1")
    bad = only_error(conn.receive(wire("preStep", {"agentId": "a"}, id="p1")))
    assert (bad.message.code, bad.re) == (ErrorCode.BAD_DATA, "p1")  # answers that request
    assert only_error(conn.receive(b"bytes")).message.code == ErrorCode.BAD_ENVELOPE
    assert conn.state is ConnectionState.OPEN


def test_another_version_after_the_welcome_closes_with_1002():
    conn = open_connection()
    outputs = conn.receive(json.dumps({"v": 2, "type": "ping", "id": "1", "data": {}}))
    refused(outputs, code=ErrorCode.BAD_VERSION, close=CLOSE_PROTOCOL_ERROR)
    assert conn.state is ConnectionState.CLOSED


def test_ping_is_answered_here():
    assert open_connection().receive(wire("ping", {}, id="p7")) == [SendFrame(Frame(Pong(), re="p7"))]


def test_host_notifications_and_requests_go_to_the_application():
    conn = open_connection()
    [events] = conn.receive(wire("events", {"items": []}))
    assert events == Received(Frame(Events(())))
    [select] = conn.receive(wire("select", {"op": "create", "sessionId": "s"}, id="h1"))
    assert isinstance(select, Received) and select.frame.id == "h1"


def test_a_second_hello_is_refused_but_harmless():
    conn = open_connection()
    error = only_error(conn.receive(hello()))
    assert (error.message.code, error.message.message) == (ErrorCode.UNKNOWN_TYPE, "hello is only valid as the first frame")
    assert conn.state is ConnectionState.OPEN


@pytest.mark.parametrize(
    ("role", "text"),
    [
        ("goalbar", wire("events", {"items": []})),
        ("goalbar", wire("preStep", {"agentId": "a", "sessionId": "s", "turn": 1, "step": 0, "messages": []}, id="1")),
        ("dsh-host", wire("followup", {"agentId": "a", "message": {}}, id="1")),
        ("dsh-host", wire("welcome", {"protocol": 1, "capabilities": [], "connectionId": "x"})),
    ],
)
def test_messages_of_the_wrong_direction_are_unknown_here(role, text):
    error = only_error(open_connection(role).receive(text))
    assert error.message.code == ErrorCode.UNKNOWN_TYPE
    assert f"not a message a {role} sends" in error.message.message


# -- our requests and their replies ------------------------------------------------------


def test_requests_get_fresh_ids_and_replies_are_matched_to_them():
    conn = open_connection()
    first = conn.request(Followup("a1", {"id": "m"}))
    second = conn.request(Wake("a1"))
    assert first.id != second.id and {first.id, second.id} == conn.pending
    assert conn.receive(wire("ack", {"ok": True}, re=second.id)) == [Answered(second.id, Ack(True))]
    assert conn.pending == {first.id}
    failed = conn.receive(wire("error", {"code": "NOT_LIVE", "message": "gone"}, re=first.id))
    assert failed == [Answered(first.id, ErrorNotice("NOT_LIVE", "gone"))]
    assert conn.pending == frozenset()


def test_a_reply_to_no_pending_request_is_bad_envelope_not_a_crash():
    conn = open_connection()
    request = conn.request(Wake("a1"))
    conn.receive(wire("ack", {"ok": True}, re=request.id))
    again = only_error(conn.receive(wire("ack", {"ok": True}, re=request.id)))  # answered twice
    assert again.message.code == ErrorCode.BAD_ENVELOPE and request.id in again.message.message
    assert only_error(conn.receive(wire("pong", {}, re="never")))


def test_an_abandoned_request_turns_its_late_reply_into_bad_envelope():
    conn = open_connection()
    request = conn.request(Ping())
    conn.abandon(request.id)
    assert only_error(conn.receive(wire("pong", {}, re=request.id))).message.code == ErrorCode.BAD_ENVELOPE


def test_a_reply_of_the_wrong_type_fails_the_request_at_once():
    conn = open_connection()
    request = conn.request(Wake("a1"))
    outputs = conn.receive(wire("verdict", {"kind": "enter"}, re=request.id))
    assert len(outputs) == 2
    error, answered = outputs
    assert error.frame.message.code == ErrorCode.BAD_ENVELOPE
    assert answered == Answered(request.id, error.frame.message)
    assert conn.pending == frozenset()


def test_an_error_frame_is_never_answered_with_another():
    conn = open_connection()
    # Two peers bouncing errors at each other would never stop.
    [unsolicited] = conn.receive(wire("error", {"code": "X", "message": "m"}))
    assert isinstance(unsolicited, Received)
    [stray] = conn.receive(wire("error", {"code": "X", "message": "m"}, re="nobody"))
    assert isinstance(stray, Received)


def test_only_the_requests_of_the_role_can_be_sent():
    with pytest.raises(TypeError):
        open_connection("goalbar").request(Wake("a1"))
    with pytest.raises(TypeError):
        open_connection().request(Verdict("enter"))
    assert open_connection("goalbar").request(Ping()).id


def test_replies_to_the_peer_are_checked_against_its_request():
    conn = open_connection()
    [received] = conn.receive(wire("preStep", {"agentId": "a", "sessionId": "s", "turn": 1, "step": 0, "messages": []}, id="h1"))
    assert conn.reply(received.frame, Verdict("enter")) == Frame(Verdict("enter"), re="h1")
    assert conn.reply(received.frame, ErrorNotice("X", "m")).re == "h1"
    with pytest.raises(TypeError):
        conn.reply(received.frame, Ack(True))


def test_nothing_can_be_sent_before_the_welcome_or_after_the_close():
    conn = Connection("dsh-host", TOKEN, connection_id="c1")
    with pytest.raises(BridgeClosedError):
        conn.request(Ping())
    conn = open_connection()
    pending = conn.request(Ping())
    conn.close()
    assert conn.pending == frozenset()
    with pytest.raises(BridgeClosedError):
        conn.request(Ping())
    assert conn.receive(wire("pong", {}, re=pending.id)) == []


# -- the contract: receive never raises ------------------------------------------------------

json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8)
json_values = st.recursive(
    json_scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
# Ids a frame may carry, ids it may not (empty, one too long, not strings), and the id of
# the request each run has pending (so that replies reach their matching, too).
wild_ids = st.one_of(
    st.just("r1"),
    st.text(max_size=3),
    st.text(min_size=MAX_ID_LENGTH, max_size=MAX_ID_LENGTH + 1),
    st.integers(),
    st.none(),
)
envelopes = st.fixed_dictionaries(
    {
        "v": st.sampled_from([1, 1, 1, 2, 0, "1", True]),
        "type": st.sampled_from(sorted(MESSAGE_TYPES)) | st.text(max_size=8),
        "data": st.dictionaries(st.sampled_from(["sessionId", "agentId", "items", "op", "token", "x"]), json_values)
        | json_values,
    },
    optional={"id": wild_ids, "re": wild_ids},
)
peer_frames = st.one_of(
    st.text(),
    st.binary(),
    envelopes.map(json.dumps),
    st.just(hello()),
    st.just(wire("ping", {}, id="p")),
    st.just(wire("ack", {"ok": True}, re="r1")),
    st.just(json.dumps({"v": 1, "type": "nope", "id": "", "data": {}})),
)


@settings(max_examples=500, deadline=None)
@given(st.booleans(), st.lists(peer_frames, max_size=10))
def test_receive_never_raises_and_only_answers_with_frames_the_codec_can_write(greet, frames):
    conn = Connection("dsh-host", TOKEN, connection_id="c1")
    if greet:
        conn.receive(hello())
        assert conn.request(Wake("a1")).id == "r1"
    for data in frames:
        was_closed = conn.state is ConnectionState.CLOSED
        outputs = conn.receive(data)
        if was_closed:
            assert outputs == []
        for out in outputs:
            assert isinstance(out, (SendFrame, Close, Opened, Received, Answered))
            if isinstance(out, SendFrame):
                assert decode(encode(out.frame)) == out.frame
        if any(isinstance(out, Close) for out in outputs):
            assert isinstance(outputs[-1], Close) and conn.state is ConnectionState.CLOSED


@pytest.mark.parametrize("bad_id", ["", "x" * (MAX_ID_LENGTH + 1)])
@pytest.mark.parametrize(
    "envelope",
    [
        {"type": "teleport", "data": {}},  # UNKNOWN_TYPE
        {"type": "preStep", "data": {}},  # BAD_DATA
        {"type": "ping", "data": []},  # BAD_ENVELOPE (data)
    ],
)
def test_an_id_no_frame_may_carry_is_answered_without_re(bad_id, envelope):
    # The error cannot answer that id: it answers nothing, and says why.
    conn = open_connection()
    error = only_error(conn.receive(json.dumps({"v": 1, "id": bad_id, **envelope})))
    assert error.re is None
    assert (error.message.code, error.message.message) == (ErrorCode.BAD_ENVELOPE, "'id' must be a string of 1 to 128 characters")
    assert conn.state is ConnectionState.OPEN
