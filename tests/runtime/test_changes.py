"""Changes: a waiter is woken exactly when its predicate holds after a change, every wait
is a checkpoint, and a cancelled or failing waiter leaves nothing behind."""

import trio
import trio.testing

from loopdock.runtime._changes import Changes


class Steps(trio.abc.Instrument):
    """Counts the scheduler rounds (task steps) of one task."""

    def __init__(self, task: trio.lowlevel.Task) -> None:
        self.task = task
        self.count = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task is self.task:
            self.count += 1


async def test_a_waiter_is_woken_only_by_the_change_that_makes_its_predicate_hold():
    changes, state = Changes(), {"n": 0}
    done: list[int] = []

    async def waiter(task_status: trio.TaskStatus[trio.lowlevel.Task]) -> None:
        task_status.started(trio.lowlevel.current_task())
        await changes.wait_until(lambda: state["n"] >= 3)
        done.append(state["n"])

    async with trio.open_nursery() as nursery:
        task = await nursery.start(waiter)
        await trio.testing.wait_all_tasks_blocked()
        steps = Steps(task)
        trio.lowlevel.add_instrument(steps)
        for n in (1, 2):
            state["n"] = n
            changes.notify()
            await trio.testing.wait_all_tasks_blocked()
        assert done == [] and steps.count == 0  # two changes, no wake-up to check them
        state["n"] = 3
        changes.notify()
    trio.lowlevel.remove_instrument(steps)
    assert done == [3] and steps.count == 1 and changes.version == 3


async def test_waiters_on_one_object_are_woken_each_by_its_own_predicate():
    changes, state = Changes(), {"ready": set()}
    woken: list[str] = []

    async def waiter(name: str) -> None:
        await changes.wait_until(lambda: name in state["ready"])
        woken.append(name)

    async with trio.open_nursery() as nursery:
        for name in "abc":
            nursery.start_soon(waiter, name)
        await trio.testing.wait_all_tasks_blocked()
        state["ready"].add("b")
        changes.notify()
        await trio.testing.wait_all_tasks_blocked()
        assert woken == ["b"]
        state["ready"].update("ac")
        changes.notify()
    assert sorted(woken) == ["a", "b", "c"]


async def test_a_predicate_undone_before_the_waiter_runs_sends_it_back_to_wait():
    changes, state = Changes(), {"on": False}
    returned = False

    async def waiter() -> None:
        nonlocal returned
        await changes.wait_until(lambda: state["on"])
        returned = True

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        state["on"] = True
        changes.notify()  # the waiter is woken...
        state["on"] = False  # ...but finds it false again: it waits for the next change
        await trio.testing.wait_all_tasks_blocked()
        assert not returned
        state["on"] = True
        changes.notify()
    assert returned


async def test_wait_until_is_a_checkpoint_even_when_the_predicate_holds_at_once():
    changes = Changes()
    with trio.CancelScope() as scope:
        scope.cancel()
        await changes.wait_until(lambda: True)
    assert scope.cancelled_caught


async def test_a_cancelled_waiter_is_forgotten_and_a_later_change_wakes_nobody():
    changes = Changes()
    with trio.move_on_after(1) as scope:
        await changes.wait_until(lambda: False)
    assert scope.cancelled_caught and not changes._waiters
    changes.notify()  # would reschedule a task that is not waiting if it were kept
    assert changes.version == 1


async def test_wait_returns_on_the_next_change_whatever_it_is():
    changes = Changes()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(changes.wait)
        await trio.testing.wait_all_tasks_blocked()
        changes.notify()
    assert not changes._waiters


async def test_a_predicate_that_raises_fails_its_waiter_not_the_notifier():
    changes, state = Changes(), {"broken": False}

    def predicate() -> bool:
        if state["broken"]:
            raise ValueError("broken predicate")
        return False

    raised: list[Exception] = []

    async def waiter() -> None:
        try:
            await changes.wait_until(predicate)
        except ValueError as exc:
            raised.append(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        state["broken"] = True
        changes.notify()  # does not raise here
    assert [str(e) for e in raised] == ["broken predicate"] and not changes._waiters
