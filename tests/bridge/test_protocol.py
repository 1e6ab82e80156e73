"""The wire codec: exact wire shapes, every error code, and hypothesis fuzzing.

The fuzzing states the codec's two promises: ``decode`` raises nothing but ProtocolError,
whatever it is given, and every frame the codec can write reads back equal.
"""

import gc
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loopdock import Event
from loopdock.actors import LiveEvent
from loopdock.bridge import (
    MESSAGE_TYPES,
    Ack,
    AnswerApproval,
    ApprovalDone,
    Cancel,
    CommandDone,
    ErrorCode,
    ErrorNotice,
    Events,
    Followup,
    Frame,
    Hello,
    Live,
    Ping,
    Pong,
    PreStep,
    ProtocolError,
    RunCommand,
    Select,
    Selection,
    SelectionParts,
    SessionEvent,
    Verdict,
    Wake,
    Welcome,
    decode,
    encode,
)
from loopdock.bridge._messages import (
    MAX_APPROVAL_ID,
    MAX_APPROVAL_REASON,
    MAX_ERROR_CODE,
    MAX_ERROR_MESSAGE,
    MAX_ID_LENGTH,
    REPLIES,
    REPLY_TYPES,
    Goalbar,
    GoalbarPause,
    GoalbarRead,
    GoalbarResult,
    GoalbarStart,
    GoalbarView,
    GoalbarWatch,
    Mirrored,
    MirroredSeqs,
    StoredBinding,
)
from loopdock.bridge._protocol import encode_batch, encode_item


def wire(type_, data, **ids):
    return json.dumps({"v": 1, "type": type_, **ids, "data": data})


def error_of(text):
    with pytest.raises(ProtocolError) as info:
        decode(text)
    return info.value


# -- the wire shapes, pinned (camelCase names, None fields left out) ------------------------

EVENT = Event("turn/start", 0, 1700000000000, {"turn": 1})
MESSAGE = {"id": "m1", "role": "user", "content": [{"type": "text", "text": "hi"}], "source": {"kind": "loopx-continuation"}}

WIRE_SHAPES = [
    (
        Frame(Hello(token="t", role="dsh-host", protocol=1, capabilities=("events", "dock"))),
        {"type": "hello", "data": {"token": "t", "role": "dsh-host", "protocol": 1, "capabilities": ["events", "dock"]}},
    ),
    (
        Frame(Welcome(protocol=1, capabilities=("events",), connection_id="c1")),
        {"type": "welcome", "data": {"protocol": 1, "capabilities": ["events"], "connectionId": "c1"}},
    ),
    (
        Frame(ErrorNotice("LOOP_SWITCH", "no"), re="7"),
        {"type": "error", "re": "7", "data": {"code": "LOOP_SWITCH", "message": "no"}},
    ),
    (
        Frame(Events((SessionEvent("s1", EVENT),))),
        {"type": "events", "data": {"items": [{"sessionId": "s1", "event": {"type": "turn/start", "seq": 0, "time": 1700000000000, "data": {"turn": 1}}}]}},
    ),
    (
        Frame(Live((LiveEvent("agent/status", "a1", {"status": "idle"}),))),
        {"type": "live", "data": {"items": [{"type": "agent/status", "agentId": "a1", "data": {"status": "idle"}}]}},
    ),
    (
        Frame(Followup("a1", MESSAGE, "steer"), id="r1"),
        {"type": "followup", "id": "r1", "data": {"agentId": "a1", "message": MESSAGE, "placement": "steer"}},
    ),
    (Frame(Wake("a1"), id="r2"), {"type": "wake", "id": "r2", "data": {"agentId": "a1"}}),
    (
        Frame(Cancel("a1", "user", keep_inbox=False), id="r3"),
        {"type": "cancel", "id": "r3", "data": {"agentId": "a1", "cause": "user", "keepInbox": False}},
    ),
    (
        Frame(Ack(False, ErrorNotice("NOT_LIVE", "gone")), re="r1"),
        {"type": "ack", "re": "r1", "data": {"ok": False, "error": {"code": "NOT_LIVE", "message": "gone"}}},
    ),
    (
        Frame(PreStep("a1", "s1", 2, 0, (MESSAGE,)), id="h1"),
        {"type": "preStep", "id": "h1", "data": {"agentId": "a1", "sessionId": "s1", "turn": 2, "step": 0, "messages": [MESSAGE]}},
    ),
    (Frame(Verdict("reject", "not now"), re="h1"), {"type": "verdict", "re": "h1", "data": {"kind": "reject", "reason": "not now"}}),
    (Frame(Verdict("enter"), re="h1"), {"type": "verdict", "re": "h1", "data": {"kind": "enter"}}),
    (
        Frame(Select("resume", "s1", {"model": "m"}, "reviewer"), id="h2"),
        {"type": "select", "id": "h2", "data": {"op": "resume", "sessionId": "s1", "agentOptions": {"model": "m"}, "agentPreset": "reviewer"}},
    ),
    (
        Frame(Select("resume", "s1", binding=StoredBinding("loop2.reviewer", "loop2")), id="h3"),
        {"type": "select", "id": "h3", "data": {"op": "resume", "sessionId": "s1", "agentOptions": {}, "binding": {"loop": "loop2.reviewer", "driver": "loop2"}}},
    ),
    (
        Frame(Select("resume", "s1", binding=StoredBinding("loop-ping")), id="h4"),
        {"type": "select", "id": "h4", "data": {"op": "resume", "sessionId": "s1", "agentOptions": {}, "binding": {"loop": "loop-ping"}}},
    ),
    (
        Frame(Selection("planner", "loop2", SelectionParts(preset="p", allow_tools=("read_file",), deny_tools=(), model="m")), re="h2"),
        {"type": "selection", "re": "h2", "data": {"loop": "planner", "driver": "loop2", "parts": {"preset": "p", "allowTools": ["read_file"], "denyTools": [], "model": "m"}}},
    ),
    (Frame(Mirrored(("s1", "s2")), id="h5"), {"type": "mirrored", "id": "h5", "data": {"sessionIds": ["s1", "s2"]}}),
    (Frame(MirroredSeqs({"s1": 41, "s2": 0}), re="h5"), {"type": "mirroredSeqs", "re": "h5", "data": {"seqs": {"s1": 41, "s2": 0}}}),
    (Frame(RunCommand("s1", "loopx-init"), id="h6"),
     {"type": "command", "id": "h6", "data": {"agentId": "s1", "name": "loopx-init", "args": ""}}),
    (Frame(CommandDone(True, "LoopX CLI 2.1.1 is ready", {"skillsChanged": False}), re="h6"),
     {"type": "commandDone", "re": "h6", "data": {"ok": True, "message": "LoopX CLI 2.1.1 is ready", "data": {"skillsChanged": False}}}),
    (Frame(Ping(), id="p1"), {"type": "ping", "id": "p1", "data": {}}),
    (Frame(Pong(), re="p1"), {"type": "pong", "re": "p1", "data": {}}),
    (Frame(GoalbarRead("s1"), id="g1"), {"type": "goalbarRead", "id": "g1", "data": {"sessionId": "s1"}}),
    (Frame(GoalbarWatch("s1"), id="g2"), {"type": "goalbarWatch", "id": "g2", "data": {"sessionId": "s1"}}),
    (
        Frame(GoalbarStart("s1", "goal", "agent"), id="g3"),
        {"type": "goalbarStart", "id": "g3", "data": {"sessionId": "s1", "goalId": "goal", "agentId": "agent"}},
    ),
    (Frame(GoalbarPause("s1"), id="g4"), {"type": "goalbarPause", "id": "g4", "data": {"sessionId": "s1"}}),
    (
        Frame(GoalbarResult(GoalbarView("hidden", "s1", reason="unbound"), "refused", "stale-binding"), re="g4"),
        {"type": "goalbarResult", "re": "g4", "data": {"state": {"kind": "hidden", "sessionId": "s1", "reason": "unbound", "pending": False}, "outcome": "refused", "reason": "stale-binding"}},
    ),
    (
        Frame(GoalbarResult(GoalbarView("hidden", "s1", reason="loopx-failure"), "done", None, ("post-read-failed", "driver-sync-failed")), re="g5"),
        {"type": "goalbarResult", "re": "g5", "data": {"state": {"kind": "hidden", "sessionId": "s1", "reason": "loopx-failure", "pending": False}, "outcome": "done",
                                                      "warnings": ["post-read-failed", "driver-sync-failed"]}},
    ),
    (
        Frame(Goalbar(GoalbarView("visible", "s1", goal_id="g", agent_id="a", lifecycle_state="active", processed=1, remaining=2, total=3, pending=True))),
        {"type": "goalbar", "data": {"state": {"kind": "visible", "sessionId": "s1", "goalId": "g", "agentId": "a", "lifecycleState": "active", "processed": 1, "remaining": 2, "total": 3, "pending": True}}},
    ),
    (
        Frame(Goalbar(GoalbarView("visible", "s1", goal_id="g", agent_id="a", lifecycle_state="active", processed=0, remaining=1, total=1,
                                  continuation="quiet", continuation_reason="the last turn was cancelled", agent_running=False))),
        {"type": "goalbar", "data": {"state": {"kind": "visible", "sessionId": "s1", "goalId": "g", "agentId": "a", "lifecycleState": "active", "processed": 0, "remaining": 1, "total": 1, "pending": False,
                                               "continuation": "quiet", "continuationReason": "the last turn was cancelled", "agentRunning": False}}},
    ),
    (
        Frame(AnswerApproval("a1", "ap-0123456789abcdef", "refuse", "not that file"), id="q1"),
        {"type": "approval", "id": "q1", "data": {"agentId": "a1", "approvalId": "ap-0123456789abcdef", "decision": "refuse", "reason": "not that file"}},
    ),
    (
        Frame(ApprovalDone("a1", "ap-0123456789abcdef", "approve"), re="q1"),
        {"type": "approvalDone", "re": "q1", "data": {"agentId": "a1", "approvalId": "ap-0123456789abcdef", "decision": "approve"}},
    ),
]


@pytest.mark.parametrize(("frame", "expected"), WIRE_SHAPES, ids=[f.type for f, _ in WIRE_SHAPES])
def test_every_message_type_has_its_documented_wire_shape(frame, expected):
    text = encode(frame)
    assert json.loads(text) == {"v": 1, **expected}
    assert decode(text) == frame


def test_the_shape_table_covers_every_type():
    assert {f.type for f, _ in WIRE_SHAPES} == set(MESSAGE_TYPES)


def test_encoding_is_compact_and_keeps_unicode():
    text = encode(Frame(ErrorNotice("X", "héllo → 世界")))
    assert text == '{"v":1,"type":"error","data":{"code":"X","message":"héllo → 世界"}}'


def test_a_batch_frame_is_exactly_what_encode_writes():
    # The sender assembles events/live frames from pre-encoded items; a peer must not be
    # able to tell them from frames written by encode.
    items = (SessionEvent("s1", EVENT), SessionEvent("s2", Event("turn/end", 1, 2, {"turn": 1})))
    encoded = [encode_item(item) for item in items]
    assert {kind for kind, _ in encoded} == {"events"}
    assert encode_batch("events", [text for _, text in encoded]) == encode(Frame(Events(items)))
    live = LiveEvent("agent/created", "a1", {"source": "startup"})
    kind, text = encode_item(live)
    assert kind == "live"
    assert encode_batch("live", [text]) == encode(Frame(Live((live,))))


# -- every error code ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    ["", "{", "{'v': 1}", "NaN", '{"v": 1, "x": Infinity}', "1e400", '"\\ud800"', "[" * 100000, "9" * 5000],
)
def test_text_that_is_not_json_is_malformed(text):
    assert error_of(text).code is ErrorCode.MALFORMED_JSON


def test_a_raw_lone_surrogate_is_malformed():
    assert error_of('{"v":1,"type":"ping","id":"\ud800","data":{}}').code is ErrorCode.MALFORMED_JSON


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("[1]", "JSON object"),
        ('{"type": "ping", "data": {}}', "'v'"),
        ('{"v": "1", "type": "ping", "data": {}}', "'v'"),
        ('{"v": true, "type": "ping", "data": {}}', "'v'"),
        ('{"v": 1, "type": "ping", "id": "1", "data": {}, "extra": 0}', "'extra'"),
        ('{"v": 1, "type": "ping", "id": 1, "data": {}}', "'id'"),
        ('{"v": 1, "type": 5, "data": {}}', "'type'"),
        ('{"v": 1, "type": "ping", "id": "1"}', "'data'"),
        ('{"v": 1, "type": "ping", "id": "1", "data": []}', "'data'"),
        ('{"v": 1, "type": "ping", "data": {}}', "needs an 'id'"),
        ('{"v": 1, "type": "pong", "data": {}}', "needs an 're'"),
        ('{"v": 1, "type": "pong", "re": "1", "id": "2", "data": {}}', "has no 'id'"),
        ('{"v": 1, "type": "events", "id": "1", "data": {"items": []}}', "no 'id'"),
        ('{"v": 1, "type": "live", "re": "1", "data": {"items": []}}', "no 're'"),
        ('{"v": 1, "type": "ping", "id": "", "data": {}}', "1 to 128"),
        (wire("ping", {}, id="x" * (MAX_ID_LENGTH + 1)), "1 to 128"),
    ],
)
def test_a_bad_envelope_says_what_is_wrong(text, says):
    error = error_of(text)
    assert error.code is ErrorCode.BAD_ENVELOPE
    assert says in str(error)


@pytest.mark.parametrize("version", [0, 2, -1, 10**6])
def test_another_version_is_bad_version(version):
    error = error_of(json.dumps({"v": version, "type": "ping", "id": "1", "data": {}}))
    assert error.code is ErrorCode.BAD_VERSION
    assert f"protocol version {version}" in str(error)


def test_a_newer_envelope_is_bad_version_not_bad_envelope():
    # A peer of a later version may have new envelope keys: the version speaks first.
    assert error_of('{"v": 2, "type": "ping", "trace": "x", "data": {}}').code is ErrorCode.BAD_VERSION


def test_an_unknown_type_answers_the_request_it_came_as():
    error = error_of(wire("teleport", {}, id="q9"))
    assert error.code is ErrorCode.UNKNOWN_TYPE
    assert error.request_id == "q9"
    assert "teleport" in str(error)


@pytest.mark.parametrize(
    ("type_", "data", "field", "problem"),
    [
        ("preStep", {"sessionId": "s", "turn": 1, "step": 0, "messages": []}, "data.agentId", "required field missing"),
        ("preStep", {"agentId": "a", "sessionId": "s", "turn": "1", "step": 0, "messages": []}, "data.turn", "expected an integer, got a string"),
        ("preStep", {"agentId": "a", "sessionId": "s", "turn": True, "step": 0, "messages": []}, "data.turn", "expected an integer, got a boolean"),
        ("preStep", {"agentId": "a", "sessionId": "s", "turn": 1, "step": 0, "messages": ["hi"]}, "data.messages[0]", "expected an object, got a string"),
        ("wake", {"agentId": 7}, "data.agentId", "expected a string, got a number"),
        ("cancel", {"agentId": "a", "cause": "c", "keepInbox": "yes"}, "data.keepInbox", "expected a boolean, got a string"),
        ("verdict", {"kind": "maybe"}, "data.kind", "expected one of 'enter', 'reject', got 'maybe'"),
        ("select", {"op": "create", "sessionId": "s", "agentOptions": []}, "data.agentOptions", "expected an object, got an array"),
        ("select", {"op": "resume", "sessionId": "s", "binding": "standard"}, "data.binding", "expected an object, got a string"),
        ("select", {"op": "resume", "sessionId": "s", "binding": {"driver": "d"}}, "data.binding.loop", "required field missing"),
        ("select", {"op": "resume", "sessionId": "s", "binding": {"loop": 1}}, "data.binding.loop", "expected a string, got a number"),
        ("select", {"op": "resume", "sessionId": "s", "binding": {"loop": "l", "driver": False}}, "data.binding.driver", "expected a string, got a boolean"),
        ("select", {"op": "resume", "sessionId": "s", "binding": {"loop": "l", "preset": "p"}}, "data.binding", "extra fields found (preset)"),
        ("selection", {"loop": "l", "parts": {"allowTools": "read_file"}}, "data.parts.allowTools", "expected an array, got a string"),
        ("selection", {"loop": "l", "parts": {"tools": []}}, "data.parts", "extra fields found (tools)"),
        ("events", {"items": [{"sessionId": "s", "event": {"type": "t", "seq": 0, "data": {}}}]}, "data.items[0].event.time", "required field missing"),
        ("live", {"items": [{"type": "agent/status", "agentId": "a", "data": {}, "agent": {}}]}, "data.items[0]", "extra fields found (agent)"),
        ("hello", {"token": "t", "role": "admin", "protocol": 1}, "data.role", "expected one of 'dsh-host', 'goalbar', got 'admin'"),
        ("ack", {}, "data.ok", "required field missing"),
        ("mirrored", {}, "data.sessionIds", "required field missing"),
        ("mirrored", {"sessionIds": "s1"}, "data.sessionIds", "expected an array, got a string"),
        ("mirrored", {"sessionIds": ["s1", None]}, "data.sessionIds[1]", "expected a string, got null"),
        ("mirrored", {"sessionIds": [], "since": 0}, "data", "extra fields found (since)"),
        ("mirroredSeqs", {}, "data.seqs", "required field missing"),
        ("mirroredSeqs", {"seqs": [["s1", 3]]}, "data.seqs", "expected an object, got an array"),
        ("mirroredSeqs", {"seqs": {"s1": "3"}}, "data.seqs", "expected a non-negative integer for 's1', got a string"),
        ("mirroredSeqs", {"seqs": {"s1": -1}}, "data.seqs", "expected a non-negative integer for 's1', got -1"),
        ("mirroredSeqs", {"seqs": {"s1": 2.5}}, "data.seqs", "expected a non-negative integer for 's1', got a number"),
        ("mirroredSeqs", {"seqs": {"s1": True}}, "data.seqs", "expected a non-negative integer for 's1', got a boolean"),
        ("mirroredSeqs", {"seqs": {"s1": None}}, "data.seqs", "expected a non-negative integer for 's1', got null"),
        ("mirroredSeqs", {"seqs": {}, "more": 1}, "data", "extra fields found (more)"),
        ("approval", {"agentId": "a1", "decision": "approve"}, "data.approvalId", "required field missing"),
        ("approval", {"agentId": "a1", "approvalId": 7, "decision": "approve"}, "data.approvalId", "expected a string, got a number"),
        ("approval", {"agentId": "a1", "approvalId": "", "decision": "approve"}, "data.approvalId", "an approval id is not empty"),
        ("approval", {"agentId": "a1", "approvalId": "x" * (MAX_APPROVAL_ID + 1), "decision": "approve"}, "data.approvalId",
         f"an approval id is at most {MAX_APPROVAL_ID} characters, got {MAX_APPROVAL_ID + 1}"),
        ("approval", {"agentId": "a1", "approvalId": "ap-1", "decision": "approve", "reason": "r" * 100_000}, "data.reason",
         f"an approval reason is at most {MAX_APPROVAL_REASON} characters, got 100000"),
        ("approval", {"agentId": "a1", "approvalId": "ap-1", "decision": "approve", "reason": ["no"]}, "data.reason",
         "expected a string, got an array"),
        ("approval", {"agentId": "a1", "approvalId": "ap-1", "decision": "approve", "arguments": {}}, "data", "extra fields found (arguments)"),
        ("approval", {"agentId": "a1", "approvalId": "ap-1", "decision": "edit"}, "data.decision",
         "expected one of 'approve', 'refuse', got 'edit'"),
    ],
)
def test_bad_data_names_the_wire_field(type_, data, field, problem):
    ids = {"re": "1"} if MESSAGE_TYPES[type_] in REPLIES else {"id": "1"} if MESSAGE_TYPES[type_] in REPLY_TYPES else {}
    error = error_of(wire(type_, data, **ids))
    assert error.code is ErrorCode.BAD_DATA
    assert f"{problem} @ {field}" in str(error)
    assert error.request_id == ids.get("id")


EVENT_ITEM = {"type": "t", "seq": 0, "time": 1, "data": {}}


@pytest.mark.parametrize("bad", ["", "../..", "a\x00b", "a b", "-leading-dash", "x" * 129, "x" * 100_000])
@pytest.mark.parametrize(
    ("type_", "data", "field"),
    [
        ("events", lambda sid: {"items": [{"sessionId": "ok", "event": EVENT_ITEM}, {"sessionId": sid, "event": EVENT_ITEM}]}, "data.items[1].sessionId"),
        ("live", lambda sid: {"items": [{"type": "agent/status", "agentId": sid, "data": {}}]}, "data.items[0].agentId"),
        ("select", lambda sid: {"op": "create", "sessionId": sid}, "data.sessionId"),
        ("mirrored", lambda sid: {"sessionIds": ["ok", sid]}, "data.sessionIds[1]"),
        ("preStep", lambda sid: {"agentId": sid, "sessionId": "ok", "turn": 1, "step": 0, "messages": []}, "data.agentId"),
        ("preStep", lambda sid: {"agentId": "ok", "sessionId": sid, "turn": 1, "step": 0, "messages": []}, "data.sessionId"),
        ("command", lambda sid: {"agentId": sid, "name": "loopx-init"}, "data.agentId"),
        ("approval", lambda sid: {"agentId": sid, "approvalId": "ap-1", "decision": "approve"}, "data.agentId"),
    ],
)
def test_a_session_id_the_api_refuses_is_refused_on_the_wire(bad, type_, data, field):
    ids = {"id": "q1"} if MESSAGE_TYPES[type_] in REPLY_TYPES else {}
    error = error_of(wire(type_, data(bad), **ids))
    assert error.code is ErrorCode.INVALID_SESSION_ID
    assert error.request_id == ids.get("id")
    assert str(error).endswith(f"@ {field}") and len(str(error)) < 400


def test_every_session_id_the_api_accepts_passes_the_wire():
    for sid in ("s1", "0", "dsh-session-goalbar-1", "a.b_c:d@e+f-g", "x" * 128, "2f1c4e3a-8b7d-4c2e-9a1f-0b3c5d7e9f11"):
        assert decode(wire("select", {"op": "create", "sessionId": sid}, id="1")).message.session_id == sid


PAD = "p" * 100_000


@pytest.mark.parametrize(
    ("text", "code"),
    [
        (wire("select", {"op": "create", "sessionId": "s" * 100_000}, id="q1"), ErrorCode.INVALID_SESSION_ID),
        (wire("select", {"op": "create", "sessionId": "bad id", "agentOptions": {"pad": PAD}}, id="q1"), ErrorCode.INVALID_SESSION_ID),
        (wire("events", {"items": [{"sessionId": "e" * 100_000, "event": EVENT_ITEM}]}), ErrorCode.INVALID_SESSION_ID),
        (wire("events", {"items": [{"sessionId": "s", "event": {**EVENT_ITEM, "seq": "0", "data": {"pad": PAD}}}]}), ErrorCode.BAD_DATA),
        (wire("mirrored", {"sessionIds": ["ok", "m" * 100_000]}, id="q1"), ErrorCode.INVALID_SESSION_ID),
        (wire("live", {"items": [{"type": "agent/status", "agentId": "a" * 100_000, "data": {}}]}), ErrorCode.INVALID_SESSION_ID),
        (wire("command", {"agentId": "c" * 100_000, "name": "loopx-init", "args": PAD}, id="q1"), ErrorCode.INVALID_SESSION_ID),
        (wire("ack", {"ok": True, "pad": PAD}, re="q1"), ErrorCode.BAD_DATA),
        (wire("verdict", {"kind": PAD}, re="q1"), ErrorCode.BAD_DATA),
    ],
)
def test_a_refused_frame_leaves_nothing_for_the_cyclic_collector(text, code):
    # Reference counting alone must free a refused frame: the runtime collects cycles
    # rarely and freezes what survives a collection, so every frame kept in a cycle (with
    # its 100,000 characters) made `loopdock serve` larger (docs/reliability.md).
    gc.collect()
    gc.disable()
    try:
        for _ in range(3):
            try:  # not pytest.raises: its ExceptionInfo and this frame would make a cycle
                decode(text)
            except ProtocolError as exc:
                assert exc.code is code
            else:
                pytest.fail("decoded")
        assert gc.collect() == 0
    finally:
        gc.enable()


def test_an_error_frame_carries_a_bounded_code_and_message():
    notice = ErrorNotice("C" * 1000, "m" * 100_000)
    assert (len(notice.code), len(notice.message)) == (MAX_ERROR_CODE, MAX_ERROR_MESSAGE)
    assert notice.message.endswith("...") and ErrorNotice("X", "m" * MAX_ERROR_MESSAGE).message == "m" * MAX_ERROR_MESSAGE
    # a peer's too, as it is read
    peer = decode(wire("error", {"code": "X", "message": "m" * 100_000})).message
    assert len(peer.message) == MAX_ERROR_MESSAGE


def test_unknown_keys_are_tolerated_only_where_a_newer_peer_needs_them():
    hello = decode(wire("hello", {"token": "t", "role": "goalbar", "protocol": 1, "locale": "fr"})).message
    assert hello == Hello("t", "goalbar", 1)
    assert decode(wire("welcome", {"protocol": 1, "capabilities": [], "connectionId": "c", "motd": "hi"})).message == Welcome(1, (), "c")
    assert decode(wire("error", {"code": "X", "message": "m", "details": {}})).message == ErrorNotice("X", "m")
    # DSH's own event envelope may grow: the event is still taken.
    events = decode(wire("events", {"items": [{"sessionId": "s", "event": {"type": "t", "seq": 0, "time": 1, "data": {"x": 1}, "meta": 2}}]}))
    assert events.message.items[0].event == Event("t", 0, 1, {"x": 1})
    # Ours are strict.
    assert error_of(wire("wake", {"agentId": "a", "now": True}, id="1")).code is ErrorCode.BAD_DATA


def test_the_token_never_shows_in_a_repr():
    assert "s3cret" not in repr(Frame(Hello("s3cret", "dsh-host", 1)))


def test_encode_refuses_what_is_not_json():
    with pytest.raises(ProtocolError) as info:
        encode(Frame(Followup("a", {"x": float("nan")}), id="1"))
    assert info.value.code is ErrorCode.BAD_DATA
    with pytest.raises(ProtocolError) as info:
        encode(Frame(Followup("a", {"x": "\ud800"}), id="1"))
    assert info.value.code is ErrorCode.BAD_DATA
    with pytest.raises(ProtocolError) as info:
        encode_item(SessionEvent("s", Event("t", 0, 0, {"x": {1, 2}})))
    assert info.value.code is ErrorCode.BAD_DATA


def test_a_frame_that_breaks_the_id_rules_cannot_be_built():
    with pytest.raises(ProtocolError):
        Frame(Wake("a"))  # a request without an id
    with pytest.raises(ProtocolError):
        Frame(Ack(True))  # a reply without re
    with pytest.raises(ProtocolError):
        Frame(Events(()), re="1")
    with pytest.raises(TypeError):
        Frame("not a message")


# -- fuzzing -----------------------------------------------------------------------------

names = st.text(max_size=12)
# What runtime._ids.check_session_id accepts (the wire checks every session id it carries).
session_ids = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._:@+-]{0,15}", fullmatch=True)
ids = st.text(min_size=1, max_size=MAX_ID_LENGTH)
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(names, inner, max_size=4),
    max_leaves=12,
)
json_objects = st.dictionaries(names, json_values, max_size=4)
string_tuples = st.lists(names, max_size=4).map(tuple)
optional_names = st.none() | names
error_notices = st.builds(ErrorNotice, code=names, message=st.text(max_size=40))
events = st.builds(Event, type=names, seq=st.integers(0, 2**40), time=st.integers(0, 2**45), data=json_objects)

messages = st.one_of(
    st.builds(Hello, token=names, role=st.sampled_from(["dsh-host", "goalbar"]), protocol=st.integers(-3, 3), capabilities=string_tuples),
    st.builds(Welcome, protocol=st.integers(-3, 3), capabilities=string_tuples, connection_id=names),
    error_notices,
    st.builds(Events, items=st.lists(st.builds(SessionEvent, session_id=session_ids, event=events), max_size=4).map(tuple)),
    st.builds(Live, items=st.lists(st.builds(LiveEvent, type=names, agent_id=session_ids, data=json_objects), max_size=4).map(tuple)),
    st.builds(Followup, agent_id=names, message=json_objects, placement=st.sampled_from(["followup", "steer", "inject"])),
    st.builds(Wake, agent_id=names),
    st.builds(Cancel, agent_id=names, cause=names, keep_inbox=st.booleans()),
    st.builds(Ack, ok=st.booleans(), error=st.none() | error_notices),
    st.builds(
        PreStep, agent_id=session_ids, session_id=session_ids, turn=st.integers(0, 10**6), step=st.integers(0, 10**6),
        messages=st.lists(json_objects, max_size=3).map(tuple),
    ),
    st.builds(Verdict, kind=st.sampled_from(["enter", "reject"]), reason=optional_names),
    st.builds(
        Select, op=st.sampled_from(["create", "resume"]), session_id=session_ids, agent_options=json_objects,
        agent_preset=optional_names, binding=st.none() | st.builds(StoredBinding, loop=names, driver=optional_names),
    ),
    st.builds(
        Selection, loop=names, driver=optional_names,
        parts=st.builds(
            SelectionParts, preset=optional_names, allow_tools=st.none() | string_tuples,
            deny_tools=st.none() | string_tuples, provider=optional_names, model=optional_names,
        ),
    ),
    st.builds(Mirrored, session_ids=st.lists(session_ids, max_size=4).map(tuple)),
    st.builds(MirroredSeqs, seqs=st.dictionaries(names, st.integers(0, 2**53), max_size=4)),
    st.just(Ping()),
    st.just(Pong()),
    st.builds(
        AnswerApproval, agent_id=session_ids, approval_id=st.text(min_size=1, max_size=MAX_APPROVAL_ID),
        decision=st.sampled_from(["approve", "refuse"]), reason=st.none() | st.text(max_size=40),
    ),
    st.builds(ApprovalDone, agent_id=names, approval_id=names, decision=st.sampled_from(["approve", "refuse"])),
)


@st.composite
def frames(draw):
    message = draw(messages)
    cls = type(message)
    if cls in REPLY_TYPES:
        return Frame(message, id=draw(ids))
    if cls in REPLIES:
        return Frame(message, re=draw(ids))
    if cls is ErrorNotice:
        return Frame(message, re=draw(st.none() | ids))
    return Frame(message)


def decodes_or_refuses(text):
    try:
        return decode(text)
    except ProtocolError as error:
        assert isinstance(error.code, ErrorCode)
        return None


@given(frames())
def test_every_valid_frame_round_trips(frame):
    assert decode(encode(frame)) == frame


@given(st.text())
def test_decode_of_any_text_raises_only_protocol_errors(text):
    decodes_or_refuses(text)


@given(json_values)
def test_decode_of_any_json_value_raises_only_protocol_errors(value):
    assert decodes_or_refuses(json.dumps(value)) is None  # no bare JSON value is a frame


@given(
    st.fixed_dictionaries(
        {"v": st.just(1), "type": st.sampled_from(sorted(MESSAGE_TYPES)), "data": json_objects},
        optional={"id": ids, "re": ids},
    )
)
def test_decode_of_any_data_under_a_known_type_raises_only_protocol_errors(envelope):
    decodes_or_refuses(json.dumps(envelope))


def _mutate(draw, value):
    """Replace, delete or add one thing somewhere inside ``value`` (a JSON tree)."""
    if isinstance(value, dict) and value and draw(st.booleans()):
        key = draw(st.sampled_from(sorted(value)))
        action = draw(st.sampled_from(["descend", "delete", "replace"]))
        if action == "delete":
            return {k: v for k, v in value.items() if k != key}
        new = _mutate(draw, value[key]) if action == "descend" else draw(json_values)
        return {**value, key: new}
    if isinstance(value, dict) and draw(st.booleans()):
        return {**value, draw(names): draw(json_values)}
    if isinstance(value, list) and value and draw(st.booleans()):
        index = draw(st.integers(0, len(value) - 1))
        return [*value[:index], _mutate(draw, value[index]), *value[index + 1 :]]
    return draw(json_values)


@given(frames(), st.data())
def test_decode_of_mutated_valid_frames_raises_only_protocol_errors(frame, data):
    mutated = _mutate(data.draw, json.loads(encode(frame)))
    decoded = decodes_or_refuses(json.dumps(mutated))
    if decoded is not None:
        # Whatever was accepted must be a frame the codec can write again, unchanged.
        assert decode(encode(decoded)) == decoded
