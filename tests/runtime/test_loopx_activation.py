"""Activation of the LoopX driver, folded from one session's events: exact shapes only."""

import json

import pytest

from loopdock.runtime._events import Event
from loopdock.runtime.loopx import Activation


def ev(seq, type_, data):
    return Event(type_, seq, 0, data)


def user(source):
    return {"id": "m", "role": "user", "content": [{"type": "text", "text": "x"}], "source": source}


def call(call_id, name, arguments):
    return {"callId": call_id, "name": name, "arguments": arguments}


def result(call_id, is_error=False):
    block = {"type": "tool-result", "callId": call_id, "content": "body", "isError": is_error}
    return {"id": "r", "role": "tool", "content": [block], "source": {"kind": "tool", "callId": call_id}}


LOOPX_ARGS = json.dumps({"name": "loopx"})


def dsh_result(call_id, is_error=False, error=None, tool_call_id=None):
    """A tool result as DSH 0.2.1 logs it (the shape of a real ``dsh`` run's ``skill`` call;
    ``tests/bridge/test_dsh_loopx_e2e.py`` activates through a real one)."""
    message = {"role": "tool", "source": {"kind": "tool", "callId": call_id},
               "toolCallId": tool_call_id or call_id, "content": [{"type": "text", "text": "<skill_content/>"}],
               "isError": is_error, "id": "r"}
    data = {"turn": 1, "step": 1, "message": message}
    if error is not None:
        data["error"] = error
    return data


def test_an_exact_user_invocation_activates():
    events = [ev(0, "user/message", user({"kind": "skill-invocation", "name": "loopx", "form": "instructions"}))]
    assert Activation.fold(events).active


def test_a_successful_paired_skill_call_activates():
    events = [ev(0, "tool/call", call("c1", "skill", LOOPX_ARGS)), ev(1, "tool/result", result("c1"))]
    assert Activation.fold(events).active


def test_a_successful_paired_skill_call_in_dsh_format_activates():
    events = [ev(0, "tool/call", {"turn": 1, "step": 1, **call("call-1", "skill", LOOPX_ARGS)}),
              ev(1, "tool/result", dsh_result("call-1"))]
    assert Activation.fold(events).active


@pytest.mark.parametrize(
    "events",
    [
        [ev(0, "user/message", user({"kind": "skill-invocation", "name": "loopx", "form": "summary"}))],
        [ev(0, "user/message", user({"kind": "skill-invocation", "name": "loopx-project", "form": "instructions"}))],
        [ev(0, "user/message", user({"kind": "user"}))],
        [ev(0, "user/message", user({"kind": "dsh-loopx-plugin/init-command", "phase": "start"}))],
        [ev(0, "user/message", user({"kind": "loopx-continuation", "turnInstanceId": "t"}))],
        [ev(0, "tool/call", call("c1", "skill", LOOPX_ARGS))],  # a request alone
        [ev(0, "tool/call", call("c1", "skill", LOOPX_ARGS)), ev(1, "tool/result", result("c1", is_error=True))],
        [ev(0, "tool/call", call("c1", "skill", LOOPX_ARGS)), ev(1, "tool/result", result("c2"))],  # unmatched
        [ev(0, "tool/call", call("c1", "skill", '["loopx"]')), ev(1, "tool/result", result("c1"))],
        [ev(0, "tool/call", call("c1", "skill", "{not json")), ev(1, "tool/result", result("c1"))],
        [ev(0, "tool/call", call("c1", "skill", '{"name": "LOOPX"}')), ev(1, "tool/result", result("c1"))],
        [ev(0, "tool/call", call("c1", "shell", '{"command": "loopx status", "name": "loopx"}')), ev(1, "tool/result", result("c1"))],
        [ev(0, "tool/result", result("c1")), ev(1, "tool/call", call("c1", "skill", LOOPX_ARGS))],  # wrong order
        # A failed result settles the call: a later result for the same id does not count.
        [
            ev(0, "tool/call", call("c1", "skill", LOOPX_ARGS)),
            ev(1, "tool/result", result("c1", is_error=True)),
            ev(2, "tool/result", result("c1")),
        ],
        [ev(0, "tool/call", call("c1", "skill", LOOPX_ARGS)), ev(1, "tool/result", dsh_result("c1", is_error=True))],
        [ev(0, "tool/call", call("c1", "skill", LOOPX_ARGS)),
         ev(1, "tool/result", dsh_result("c1", error={"name": "ToolError", "code": "X"}))],
        [ev(0, "tool/call", call("c1", "skill", LOOPX_ARGS)), ev(1, "tool/result", dsh_result("c2"))],
        [ev(0, "tool/call", call("c1", "skill", LOOPX_ARGS)), ev(1, "tool/result", dsh_result("c1", tool_call_id="c2"))],
        [ev(0, "assistant/message", {"id": "a", "role": "assistant", "content": [{"type": "text", "text": "/loopx"}]})],
    ],
)
def test_every_other_shape_fails_closed(events):
    assert not Activation.fold(events).active


def with_(data, **changes):
    """``data`` with top-level keys changed (or, for ``message``, the DSH message's)."""
    data = json.loads(json.dumps(data))
    for key, value in changes.items():
        if key.startswith("message_"):
            data["message"][key.removeprefix("message_")] = value
        else:
            data[key] = value
    return data


SKILL_CALL = ev(0, "tool/call", call("c1", "skill", LOOPX_ARGS))
DSH_SKILL_CALL = ev(0, "tool/call", {"turn": 1, "step": 1, **call("c1", "skill", LOOPX_ARGS)})
TWO_BLOCKS = [{"type": "text", "text": "<skill_content/>"}, {"type": "text", "text": "more"}]


@pytest.mark.parametrize(
    "events",
    [
        # A DSH tool result whose source is a plugin's, not the tool's.
        [DSH_SKILL_CALL, ev(1, "tool/result", with_(dsh_result("c1"), message_source={"kind": "plugin", "callId": "c1"}))],
        [DSH_SKILL_CALL, ev(1, "tool/result", with_(dsh_result("c1"), message_source={"kind": "plugin", "name": "x"}))],
        # ... and the same in the runtime's format.
        [SKILL_CALL, ev(1, "tool/result", with_(result("c1"), source={"kind": "plugin", "callId": "c1"}))],
        # A DSH tool result with extra content blocks, or none.
        [DSH_SKILL_CALL, ev(1, "tool/result", with_(dsh_result("c1"), message_content=TWO_BLOCKS))],
        [DSH_SKILL_CALL, ev(1, "tool/result", with_(dsh_result("c1"), message_content=[]))],
        # The pending loopx call's id reused by a later shell call, another tool, another skill.
        [SKILL_CALL, ev(1, "tool/call", call("c1", "shell", '{"command": "loopx status"}')),
         ev(2, "tool/result", result("c1"))],
        [SKILL_CALL, ev(1, "tool/call", call("c1", "read_file", '{"path": "x"}')), ev(2, "tool/result", result("c1"))],
        [SKILL_CALL, ev(1, "tool/call", call("c1", "skill", '{"name": "loopx-project"}')),
         ev(2, "tool/result", result("c1"))],
        [DSH_SKILL_CALL, ev(1, "tool/call", {"turn": 1, "step": 1, **call("c1", "shell", '{"command": "ls"}')}),
         ev(2, "tool/result", dsh_result("c1"))],
        # A runtime-format result that carries an error.
        [SKILL_CALL, ev(1, "tool/result", with_(result("c1"), error={"name": "ToolError", "code": "X"}))],
        [SKILL_CALL, ev(1, "tool/result", with_(result("c1"), error="failed"))],
    ],
    ids=[
        "dsh-plugin-source", "dsh-plugin-source-without-call-id", "runtime-plugin-source",
        "dsh-extra-content-blocks", "dsh-no-content-block",
        "reused-by-shell", "reused-by-another-tool", "reused-by-another-skill", "dsh-reused-by-shell",
        "runtime-error-object", "runtime-error-string",
    ],
)
def test_shapes_that_only_look_like_a_successful_skill_call_fail_closed(events):
    assert not Activation.fold(events).active


def test_a_loopx_call_that_reuses_an_earlier_call_id_is_the_one_its_result_answers():
    shell_then_skill = [ev(0, "tool/call", call("c1", "shell", '{"command": "ls"}')),
                        ev(1, "tool/call", call("c1", "skill", LOOPX_ARGS)), ev(2, "tool/result", result("c1"))]
    assert Activation.fold(shell_then_skill).active
    # The untouched shapes still activate in both formats.
    assert Activation.fold([SKILL_CALL, ev(1, "tool/result", result("c1"))]).active
    assert Activation.fold([DSH_SKILL_CALL, ev(1, "tool/result", dsh_result("c1"))]).active


def test_activation_is_sticky_and_reported_once():
    activation = Activation()
    first = ev(0, "user/message", user({"kind": "skill-invocation", "name": "loopx", "form": "instructions"}))
    assert activation.feed(first) is True
    assert activation.feed(ev(1, "user/message", user({"kind": "user"}))) is False
    assert activation.active
