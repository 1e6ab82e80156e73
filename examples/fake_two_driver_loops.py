"""Two fully independent fake driver loops in one runtime (no model, no network).

    python examples/fake_two_driver_loops.py
"""

import tempfile

import trio

from loopdock import DriverLoop, FakeDriver, Runtime, configure_logging, read_binding


async def main():
    with tempfile.TemporaryDirectory() as home:
        async with Runtime.open(home) as rt:
            rt.dock.register(DriverLoop.from_driver("loop-a", FakeDriver("loop-a")))
            rt.dock.register(DriverLoop.from_driver("loop-b", FakeDriver("loop-b")))
            handles = [
                await rt.create_agent(session_id="agent-a", loop="loop-a"),
                await rt.create_agent(session_id="agent-b", loop="loop-b"),
            ]
            for handle in handles:
                handle.agent.followup("ping")
            async with trio.open_nursery() as nursery:
                for handle in handles:
                    nursery.start_soon(handle.agent.wait_idle)
            for handle in handles:
                binding = read_binding(await handle.agent.session.read_events())
                print(f"{handle.agent.id}: loop={binding.loop} reply={(await handle.agent.read_transcript())[-1].text!r}")
            print("Two agents, one dock, two different loops.")


if __name__ == "__main__":
    configure_logging()
    trio.run(main)
