"""Tool approvals in one process: the durable question, its answers (exactly once), and
an agent that stays responsive while a person has not answered."""

import json

import pytest
import trio
import trio.testing

from loopdock import ApprovalClosedError, LoopdockError, Message, ProducerSource, TextBlock
from loopdock.runtime.models import Reply, ScriptedAdapter, ToolCall
from loopdock.runtime.tools import Tool

SCRIPTED = {"provider": "scripted", "model": "script-1"}
ASK_TOUCH = {"tools": {"touch": "ask"}}


def touch_tool(ran):
    async def touch(arguments, ctx):
        ran.append(dict(arguments))
        return f"touched {arguments.get('path')}"

    return Tool("touch", "touches a file", {"type": "object"}, touch)


async def agent_with(rt, replies, approvals=ASK_TOUCH, ran=None, session_id="a1"):
    rt.register_tool(touch_tool([] if ran is None else ran))
    adapter = ScriptedAdapter(replies)
    rt.register_adapter("scripted", adapter)
    handle = await rt.create_agent(session_id=session_id, agent_options={**SCRIPTED, "approvals": approvals})
    return handle.agent, adapter


def touch_call(path="a.txt", call_id="c1"):
    return Reply(tool_calls=[ToolCall("touch", {"path": path}, call_id=call_id)])


async def events(agent, *wanted):
    return [e for e in await agent.session.read_events() if e.type in wanted]


def results(request):
    """The tool results a model request carries, as (callId, content, isError)."""
    return [
        (b.call_id, b.content, b.is_error)
        for m in request.messages if m.role == "tool" for b in m.content
    ]  # fmt: skip


async def test_no_policy_runs_every_call_without_a_question(rt):
    ran = []
    agent, _ = await agent_with(rt, [touch_call(), "done"], approvals=None, ran=ran)
    agent.followup("go")
    with trio.fail_after(5):
        await agent.wait_idle()
    assert ran == [{"path": "a.txt"}]
    assert await events(agent, "approval/requested", "approval/answered") == []


async def test_an_approved_call_runs_after_a_durable_question(rt):
    ran = []
    agent, adapter = await agent_with(rt, [touch_call(), "done"], ran=ran)
    agent.followup("go")
    with trio.fail_after(5):
        [approval] = await agent.wait_approvals()
    assert (approval.tool, approval.call_id, dict(approval.arguments)) == ("touch", "c1", {"path": "a.txt"})
    assert ran == [] and agent.status == "running"
    await approval.answer("approve")
    with trio.fail_after(5):
        await agent.wait_idle()
    assert ran == [{"path": "a.txt"}]
    assert agent.pending_approvals() == []
    requested, answered = await events(agent, "approval/requested", "approval/answered")
    assert requested.data == {"id": approval.id, "callId": "c1", "tool": "touch", "arguments": {"path": "a.txt"},
                              "reason": "the policy asks before touch runs", "turn": 1}  # fmt: skip
    assert answered.data == {"id": approval.id, "decision": "approve"}
    assert results(adapter.requests[1]) == [("c1", "touched a.txt", False)]
    # The answer is durable once ``answer`` returned.
    assert agent.session.committed_count > answered.seq


async def test_a_refusal_reaches_the_model_as_the_call_s_error(rt):
    ran = []
    agent, adapter = await agent_with(rt, [touch_call(), "understood"], ran=ran)
    agent.followup("go")
    with trio.fail_after(5):
        [approval] = await agent.wait_approvals()
        await approval.answer("refuse", reason="not that file")
        await agent.wait_idle()
    assert ran == []
    assert results(adapter.requests[1]) == [("c1", "refused by a person: not that file", True)]


async def test_an_edit_runs_with_the_new_arguments_and_records_them(rt):
    ran = []
    agent, adapter = await agent_with(rt, [touch_call("a.txt"), "ok"], ran=ran)
    agent.followup("go")
    with trio.fail_after(5):
        [approval] = await agent.wait_approvals()
        await approval.answer("edit", arguments={"path": "b.txt"})
        await agent.wait_idle()
    assert ran == [{"path": "b.txt"}]
    [answered] = await events(agent, "approval/answered")
    assert answered.data == {"id": approval.id, "decision": "edit", "arguments": {"path": "b.txt"}}
    assert results(adapter.requests[1]) == [("c1", "touched b.txt", False)]


async def test_never_refuses_without_asking(rt):
    ran = []
    agent, adapter = await agent_with(rt, [touch_call(), "ok"], approvals={"tools": {"touch": "never"}}, ran=ran)
    agent.followup("go")
    with trio.fail_after(5):
        await agent.wait_idle()
    assert ran == [] and await events(agent, "approval/requested") == []
    [(call_id, content, is_error)] = results(adapter.requests[1])
    assert call_id == "c1" and is_error and content.startswith("refused: the approval policy does not let touch run")


async def test_two_racing_answers_one_wins_the_other_gets_a_typed_error(rt):
    ran = []
    agent, _ = await agent_with(rt, [touch_call(), "done"], ran=ran)
    agent.followup("go")
    with trio.fail_after(5):
        [approval] = await agent.wait_approvals()
    outcomes = {}

    async def answer(name, decision):
        try:
            await approval.answer(decision, reason=name)
            outcomes[name] = "won"
        except ApprovalClosedError as error:
            outcomes[name] = error

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(answer, "first", "approve")
            nursery.start_soon(answer, "second", "refuse")
        await agent.wait_idle()
    # Which task runs first is trio's choice: exactly one wins, the log holds its answer.
    [winner] = [name for name, outcome in outcomes.items() if outcome == "won"]
    [lost] = [outcome for outcome in outcomes.values() if outcome != "won"]
    assert isinstance(lost, LoopdockError) and lost.code == "APPROVAL_CLOSED"
    decision = {"first": "approve", "second": "refuse"}[winner]
    answered = await events(agent, "approval/answered")
    assert [(e.data["decision"], e.data["reason"]) for e in answered] == [(decision, winner)]
    assert ran == ([{"path": "a.txt"}] if winner == "first" else [])
    with pytest.raises(ApprovalClosedError):  # closed now: a late answer too
        await approval.answer("approve")


async def test_an_answer_to_an_unknown_question_is_the_same_typed_error(rt):
    agent, _ = await agent_with(rt, [])
    with pytest.raises(ApprovalClosedError):
        await agent.approvals.answer("ap-nope", "approve")
    with pytest.raises(ValueError):
        await agent.approvals.answer("ap-nope", "maybe")


async def test_an_edit_whose_arguments_are_not_json_is_refused_and_the_question_stays_open(rt):
    agent, _ = await agent_with(rt, [touch_call(), "done"])
    agent.followup("go")
    with trio.fail_after(5):
        [approval] = await agent.wait_approvals()
    with pytest.raises(ValueError):
        await approval.answer("edit", arguments={"path": object()})
    with pytest.raises(ValueError):
        await approval.answer("approve", arguments={"path": "b.txt"})  # only an edit gives arguments
    assert agent.pending_approvals() == [approval]
    with trio.fail_after(5):
        await approval.answer("approve")
        await agent.wait_idle()


async def test_cancel_while_waiting_withdraws_the_question_and_ends_the_turn(rt):
    ran = []
    agent, adapter = await agent_with(rt, [touch_call()], ran=ran)
    agent.followup("go")
    with trio.fail_after(5):
        [approval] = await agent.wait_approvals()
        agent.cancel("changed my mind")
        await agent.wait_idle()
    assert ran == [] and agent.pending_approvals() == []
    [answered] = await events(agent, "approval/answered")
    assert answered.data == {"id": approval.id, "decision": "withdrawn", "reason": "changed my mind"}
    [end] = await events(agent, "turn/end")
    assert end.data["reason"] == {"kind": "aborted", "cause": "changed my mind"}
    [(call_id, content, is_error)] = [
        (r.data["content"][0]["callId"], r.data["content"][0]["content"], r.data["content"][0]["isError"])
        for r in await events(agent, "tool/result")
    ]
    assert (call_id, content, is_error) == ("c1", "cancelled", True)
    with pytest.raises(ApprovalClosedError):
        await approval.answer("approve")


async def test_a_followup_while_a_question_is_open_waits_for_the_turn_s_end(rt):
    agent, adapter = await agent_with(rt, [touch_call(), "first done", "second done"])
    agent.followup("go")
    with trio.fail_after(5):
        [approval] = await agent.wait_approvals()
    later = agent.followup("and then this")
    # The turn still waits for the person: the followup did not start a model step.
    await trio.testing.wait_all_tasks_blocked(0.05)  # everything that could run ran
    assert len(adapter.requests) == 1 and agent.pending_approvals() == [approval]
    with trio.fail_after(5):
        await approval.answer("approve")
        await agent.wait_idle()
    starts = [e.data["turn"] for e in await events(agent, "turn/start")]
    assert starts == [1, 2]
    # Turn 1's second model request has no trace of the followup; turn 2's has it.
    texts = [[b.text for m in r.messages for b in m.content if isinstance(b, TextBlock)] for r in adapter.requests]
    assert "and then this" not in texts[1] and "and then this" in texts[2]
    assert later.id in {e.data["messageId"] for e in await events(agent, "agent/inbox/spliced")}


def automatic(text):
    return Message("user", (TextBlock(text),), ProducerSource("test-driver", {"n": text}))


async def test_an_automatic_turn_waits_for_a_person_without_a_slot_and_no_automatic_input_answers(rt):
    ran = []
    agent, adapter = await agent_with(rt, [touch_call(), "done", "after"], ran=ran)
    gate = rt.supervisor.admission
    reservation = agent.reserve(automatic("continue"))
    with trio.fail_after(5):
        [approval] = await agent.wait_approvals()
    assert reservation.state == "admitted"
    assert gate.in_use == 0  # the waiting turn holds no admission slot
    second = agent.reserve(automatic("continue again"))
    await trio.testing.wait_all_tasks_blocked(0.05)  # everything that could run ran
    assert agent.pending_approvals() == [approval] and ran == [] and second.state == "pending"
    with trio.fail_after(5):
        await approval.answer("approve")
        await agent.wait_idle()
    assert ran == [{"path": "a.txt"}] and second.state == "admitted"
    assert [e.data["decision"] for e in await events(agent, "approval/answered")] == ["approve"]
    assert json.loads(json.dumps([e.data for e in await events(agent, "approval/requested")]))[0]["turn"] == 1


async def test_a_steer_while_a_question_is_open_enters_the_step_after_the_answered_call(rt):
    agent, adapter = await agent_with(rt, [touch_call(), "done"])
    agent.followup("go")
    with trio.fail_after(5):
        [approval] = await agent.wait_approvals()
    agent.steer("use b.txt next time")
    await trio.testing.wait_all_tasks_blocked(0.05)  # everything that could run ran
    assert len(adapter.requests) == 1 and agent.pending_approvals() == [approval]
    with trio.fail_after(5):
        await approval.answer("approve")
        await agent.wait_idle()
    assert [e.data["turn"] for e in await events(agent, "turn/start")] == [1]
    last = adapter.requests[1].messages
    assert [m.role for m in last[-2:]] == ["tool", "user"] and last[-1].text == "use b.txt next time"


async def test_each_question_asked_or_closed_is_announced_live(rt):
    agent, _ = await agent_with(rt, [touch_call(), "done", touch_call("b.txt", "c2"), "ok"])
    with rt.subscribe_live() as live, trio.fail_after(5):
        agent.followup("go")
        [first] = await agent.wait_approvals()
        await first.answer("approve")
        await agent.wait_idle()
        agent.followup("again")
        [second] = await agent.wait_approvals()
        agent.cancel("stop")  # withdrawn: closed too
        await agent.wait_idle()
        seen = []
        while True:
            try:
                item = live.receive_nowait()
            except trio.WouldBlock:
                break
            if item.type == "agent/approvals":
                seen.append((item.agent_id, dict(item.data)))
    assert seen == [
        (agent.id, {"approvalId": first.id, "change": "requested", "open": 1}),
        (agent.id, {"approvalId": first.id, "change": "answered", "open": 0}),
        (agent.id, {"approvalId": second.id, "change": "requested", "open": 1}),
        (agent.id, {"approvalId": second.id, "change": "answered", "open": 0}),
    ]
