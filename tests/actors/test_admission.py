"""The runtime-wide admission gate: automatic turns compute at most ``slots`` at a time,
people's turns never wait for a slot, and an agent waiting for one takes a person's
message first. No timing is asserted: counts and orders only (tests that count slots
freeze trio's clock, so that the stall limit never fires on a loaded machine)."""

import trio
import trio.testing

from loopdock import DriverLoop, Message, ProducerSource, Runtime, TextBlock
from loopdock.actors import AdmissionGate, create_with_body


def automatic(text: str) -> Message:
    return Message("user", (TextBlock(text),), ProducerSource("test-driver"))


# -- the gate alone ------------------------------------------------------------------------


async def test_slots_are_granted_first_come_first_served_and_handed_on_at_release():
    gate = AdmissionGate(2, stall=60)
    a, b = gate.try_acquire(), gate.try_acquire()
    assert a is not None and b is not None and gate.in_use == 2
    assert gate.try_acquire() is None
    woken: list[str] = []
    first = gate.enqueue(lambda: woken.append("first"))
    second = gate.enqueue(lambda: woken.append("second"))
    assert gate.try_acquire() is None  # nobody jumps the queue, even when a slot frees
    a.release()
    assert woken == ["first"] and first.slot is not None and second.slot is None
    a.release()  # releasing twice changes nothing
    assert gate.in_use == 2 and woken == ["first"]
    gate.dequeue(first)  # gives its granted slot on to the next waiter
    assert woken == ["first", "second"] and second.slot is not None
    b.release()
    second.slot.release()
    assert gate.in_use == 0 and gate.waiting == 0


async def test_a_waiter_that_leaves_the_queue_is_never_granted():
    gate = AdmissionGate(1, stall=60)
    held = gate.try_acquire()
    assert held is not None
    woken: list[str] = []
    waiter = gate.enqueue(lambda: woken.append("w"))
    gate.dequeue(waiter)
    held.release()
    assert woken == [] and gate.in_use == 0


async def test_a_slot_held_past_the_stall_limit_stops_counting_while_others_wait(autojump_clock):
    gate = AdmissionGate(1, stall=0.05)
    async with trio.open_nursery() as nursery:
        await nursery.start(gate.run)
        stuck = gate.try_acquire()
        assert stuck is not None
        granted = trio.Event()
        waiter = gate.enqueue(granted.set)
        await granted.wait()  # the watcher uncounted the stuck slot after 50 ms
        assert gate.stalled == 1 and waiter.slot is not None and gate.in_use == 1
        stuck.release()  # its late release does not free the slot it no longer counts
        assert gate.in_use == 1
        waiter.slot.release()
        assert gate.in_use == 0
        nursery.cancel_scope.cancel()


async def test_a_held_gate_admits_nothing_automatic_and_hands_out_in_order_when_released():
    gate = AdmissionGate(2, stall=60)
    running = gate.try_acquire()
    assert running is not None
    gate.hold("the store fails")
    assert gate.try_acquire() is None  # a slot is free, but the gate is held
    woken: list[str] = []
    for name in ("first", "second", "third"):
        gate.enqueue(lambda name=name: woken.append(name))
    running.release()  # the running turn ends: still nothing handed out
    assert woken == [] and gate.in_use == 0 and gate.waiting == 3
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(gate.run)
            # The stall watcher waits for the hold to end (it would never block if it
            # spun handing out slots that the hold refuses).
            await trio.testing.wait_all_tasks_blocked()
            assert woken == []
            gate.hold(None)
            assert woken == ["first", "second"] and gate.in_use == 2 and gate.waiting == 1
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()


# -- agents behind the gate -----------------------------------------------------------------


class CountingBody:
    """A turn body that computes across several scheduler rounds (no outside wait)."""

    def __init__(self, log: list[tuple[str, int]]) -> None:
        self.log = log
        self.active = 0
        self.peak = 0

    async def run_turn(self, turn) -> str:
        messages = await turn.begin_step()
        human = any(m.source is not None and m.source.kind == "user" for m in messages)
        if not human:
            self.active += 1
            self.peak = max(self.peak, self.active)
        for _ in range(5):
            await trio.lowlevel.checkpoint()
        if not human:
            self.active -= 1
        self.log.append((turn.agent.id, len(messages)))
        turn.end_step()
        return "completed"


class CountingDriver:
    def __init__(self, body: CountingBody) -> None:
        self.body = body

    async def create_agent(self, owner, options):
        return await create_with_body(owner, options, self.body)

    async def resume(self, owner, options):
        raise NotImplementedError


async def test_automatic_turns_compute_at_most_slots_at_a_time_and_all_run(tmp_path, mock_clock):
    # A frozen clock: no slot reaches the stall limit, whatever the machine's load.
    body = CountingBody([])
    async with Runtime.open(tmp_path / "home", automatic_slots=2) as rt:
        rt.dock.register(DriverLoop.from_driver("counting", CountingDriver(body)))
        handles = [await rt.create_agent(session_id=f"a{i}", loop="counting") for i in range(8)]
        reservations = [h.agent.reserve(automatic(f"job {i}")) for i, h in enumerate(handles)]
        for h in handles:
            await h.agent.wait_idle()
        assert [r.state for r in reservations] == ["admitted"] * 8
        assert body.peak == 2  # eight agents wanted to compute, two at a time did
        assert rt.supervisor.admission.in_use == 0 and rt.supervisor.admission.granted >= 8


async def test_an_agent_waiting_for_a_slot_takes_a_persons_message_first(tmp_path, mock_clock):
    body = CountingBody([])
    async with Runtime.open(tmp_path / "home", automatic_slots=1) as rt:
        rt.dock.register(DriverLoop.from_driver("counting", CountingDriver(body)))
        handle = await rt.create_agent(session_id="a", loop="counting")
        gate = rt.supervisor.admission
        held = gate.try_acquire()  # every slot taken: automatic work must wait
        assert held is not None
        reservation = handle.agent.reserve(automatic("background"))
        await trio.testing.wait_all_tasks_blocked()
        assert gate.waiting == 1 and handle.agent.status == "idle" and body.log == []
        handle.agent.followup("a person asks")
        await handle.agent.wait_idle()
        # The person's turn ran without a slot; the waiting reservation lost to it.
        assert body.log == [("a", 1)] and reservation.state == "cancelled"
        assert reservation.reason == "human-input"
        assert gate.waiting == 0 and gate.in_use == 1
        held.release()


async def test_people_never_wait_for_a_slot(tmp_path, mock_clock):
    body = CountingBody([])
    async with Runtime.open(tmp_path / "home", automatic_slots=1) as rt:
        rt.dock.register(DriverLoop.from_driver("counting", CountingDriver(body)))
        handles = [await rt.create_agent(session_id=f"p{i}", loop="counting") for i in range(3)]
        held = rt.supervisor.admission.try_acquire()
        for h in handles:
            h.agent.followup("hello")
        for h in handles:
            await h.agent.wait_idle()
        assert sorted(body.log) == [("p0", 1), ("p1", 1), ("p2", 1)]
        assert rt.supervisor.admission.waited == 0
        held.release()


async def test_a_turn_waiting_outside_holds_no_slot(tmp_path, mock_clock):
    release = trio.Event()
    inside: list[str] = []

    class OutsideBody:
        async def run_turn(self, turn) -> str:
            await turn.begin_step()
            async with turn.outside():
                inside.append(turn.agent.id)
                await release.wait()
            turn.end_step()
            return "completed"

    class OutsideDriver:
        async def create_agent(self, owner, options):
            return await create_with_body(owner, options, OutsideBody())

        async def resume(self, owner, options):
            raise NotImplementedError

    async with Runtime.open(tmp_path / "home", automatic_slots=1) as rt:
        rt.dock.register(DriverLoop.from_driver("outside", OutsideDriver()))
        handles = [await rt.create_agent(session_id=f"o{i}", loop="outside") for i in range(5)]
        for h in handles:
            h.agent.reserve(automatic("wait on the network"))
        with trio.fail_after(10):
            while len(inside) < 5:
                await trio.testing.wait_all_tasks_blocked()
        # Five automatic turns wait on the outside world at once through one slot.
        assert rt.supervisor.admission.in_use == 0
        release.set()
        for h in handles:
            await h.agent.wait_idle()
        assert rt.supervisor.admission.in_use == 0


async def test_a_cpu_bound_model_keeps_the_slot_and_a_waiting_one_gives_it_back(tmp_path, mock_clock):
    """ping computes (``cpu_bound``): an automatic turn on it holds its slot across the
    call. A model that waits on I/O holds none while it waits."""
    from loopdock.runtime.models import ScriptedAdapter

    seen: list[int] = []
    async with Runtime.open(tmp_path / "home", automatic_slots=4) as rt:
        gate = rt.supervisor.admission

        async def respond(request):
            seen.append(gate.in_use)
            return "waited"

        rt.register_adapter("scripted", ScriptedAdapter(respond))
        waiting = await rt.create_agent(session_id="w", agent_options={"provider": "scripted", "model": "s"})
        computing = await rt.create_agent(session_id="c")

        class Probe:
            cpu_bound = True

            async def stream(self, request):
                seen.append(gate.in_use)
                async for chunk in rt.adapters.get("ping").stream(request):
                    yield chunk

        rt.register_adapter("probe", Probe())
        probing = await rt.create_agent(session_id="p", agent_options={"provider": "probe", "model": "p"})
        for handle in (waiting, probing):
            handle.agent.reserve(automatic("hello"))
            await handle.agent.wait_idle()
        assert seen == [0, 1]  # the I/O model's call held no slot; the cpu-bound one's did
        assert computing.agent.status == "idle" and gate.in_use == 0


async def test_a_turn_waiting_to_compute_again_goes_on_when_a_person_steers_it(tmp_path, mock_clock):
    """An automatic turn back from the outside waits for a slot; a person's steer lets
    it go on without one, and it leaves the gate's queue (no slot is granted to it later)."""
    back = trio.Event()
    steps: list[int] = []

    class TwoStepBody:
        async def run_turn(self, turn) -> str:
            await turn.begin_step()
            async with turn.outside():
                await back.wait()
            turn.end_step()
            messages = await turn.begin_step()
            steps.append(len(messages))
            turn.end_step()
            return "completed"

    class TwoStepDriver:
        async def create_agent(self, owner, options):
            return await create_with_body(owner, options, TwoStepBody())

        async def resume(self, owner, options):
            raise NotImplementedError

    async with Runtime.open(tmp_path / "home", automatic_slots=1) as rt:
        rt.dock.register(DriverLoop.from_driver("two-step", TwoStepDriver()))
        handle = await rt.create_agent(session_id="t", loop="two-step")
        gate = rt.supervisor.admission
        handle.agent.reserve(automatic("background"))
        await trio.testing.wait_all_tasks_blocked()
        held = gate.try_acquire()  # the turn is outside: someone else takes the only slot
        assert held is not None
        back.set()
        await trio.testing.wait_all_tasks_blocked()
        assert gate.waiting == 1  # the turn waits to compute again
        handle.agent.steer("a person steers")
        await handle.agent.wait_idle()
        assert steps == [1] and gate.waiting == 0
        held.release()
        assert gate.in_use == 0  # nothing was granted to a waiter that had gone
