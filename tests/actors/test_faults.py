"""A fault is recorded in the session it concerns, on a type DSH knows, out of the model's sight."""

from loopdock.actors import FAULT_KIND, is_fault, record_fault


async def test_a_fault_is_a_system_message_with_a_fault_source_the_model_never_sees(rt):
    handle = await rt.create_agent(session_id="f1")
    agent = handle.agent
    before = len(agent.transcript)
    record_fault(agent.session, "loopx-continuation", ValueError("/home/secret/path"), action="retried")
    event = (await agent.session.read_events())[-1]
    assert event.type == "system/message"
    assert is_fault(event.data)
    assert event.data["source"] == {"kind": FAULT_KIND, "actor": "loopx-continuation",
                                    "error": "ValueError", "action": "retried"}
    assert "/home/secret" not in str(event.data)  # a foreign exception shows its type only
    agent.followup("hello")
    await agent.wait_idle()
    assert len(agent.transcript) == before + 2  # the person's message and the answer only
    assert all(m.role != "system" for m in agent.transcript)
    await handle.dispose()


async def test_recording_on_a_closed_session_is_only_logged(rt):
    handle = await rt.create_agent(session_id="f2")
    session = handle.agent.session
    await handle.dispose()
    count = session.event_count
    record_fault(session, "subscriber", "fell behind")
    assert session.event_count == count


def test_other_system_messages_are_not_faults():
    assert not is_fault({"role": "system", "content": [], "source": {"kind": "user"}})
    assert not is_fault({"role": "system", "content": []})
    assert not is_fault("text")
