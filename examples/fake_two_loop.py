"""Two strategy loops sharing one fake driver, in one runtime (no model, no network).

    python examples/fake_two_loop.py
"""

import tempfile

import trio

from loopdock import FakeDriver, Runtime, StrategyLoop, configure_logging, read_binding


def role(text):
    def setup(ctx):  # a strategy only composes the unpublished agent
        ctx.add_prompt_section("role", text)

    return setup


async def main():
    with tempfile.TemporaryDirectory() as home:
        async with Runtime.open(home) as rt:
            rt.register_driver("fake", FakeDriver("fake"))
            rt.dock.register(StrategyLoop("planner-loop", role("You plan."), driver="fake"))
            rt.dock.register(StrategyLoop("coder-loop", role("You code."), driver="fake"))
            for session_id, loop in (("planner", "planner-loop"), ("coder", "coder-loop")):
                handle = await rt.create_agent(session_id=session_id, loop=loop)
                handle.agent.followup(f"hello from {session_id}")
                await handle.agent.wait_idle()
                binding = read_binding(await handle.agent.session.read_events())
                reply = (await handle.agent.read_transcript())[-1].text
                print(f"{session_id}: loop={binding.loop} driver={binding.driver} reply={reply!r}")
            print("Two agents, one dock, two different loops.")


if __name__ == "__main__":
    configure_logging()
    trio.run(main)
