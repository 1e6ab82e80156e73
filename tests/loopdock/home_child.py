"""A runtime in a child process, for the tests that kill it or compete with it.

    python home_child.py hold HOME              # open HOME, print "ready", wait
    python home_child.py scribe HOME N          # N agents, each in one endless turn that
                                                # appends and flushes; prints "ack SID SEQ TEXT"
                                                # after each flush returns

The scribe's sessions are created the first time and resumed after that (on the
``scribe`` driver; any driver of that name resumes them). Logs go to stderr.
"""

from __future__ import annotations

import sys

import trio

from loopdock import Message, Runtime, TextBlock, configure_logging, create_with_body, resume_with_body

BURST = 8  # events appended between two flushes


class ScribeBody:
    async def run_turn(self, turn):
        await turn.begin_step()
        session = turn.session
        n = 0
        while True:
            for _ in range(BURST):
                text = f"turn {turn.number} line {n}"
                event = turn.record("assistant/message", Message("assistant", (TextBlock(text),)))
                n += 1
            await session.flush()
            # Acknowledged: everything up to this event is durable.
            print(f"ack {session.id} {event.seq} {text}", flush=True)


class ScribeDriver:
    async def create_agent(self, owner, options):
        return await create_with_body(owner, options, ScribeBody())

    async def resume(self, owner, options):
        return await resume_with_body(owner, options, ScribeBody())


async def hold(home: str) -> None:
    async with Runtime.open(home):
        print("ready", flush=True)
        await trio.sleep_forever()


async def scribe(home: str, agents: int) -> None:
    async with Runtime.open(home) as rt:
        rt.register_driver("scribe", ScribeDriver())
        known = {header.id for header in await rt.list_sessions()}
        for i in range(agents):
            sid = f"scribe-{i}"
            if sid in known:
                handle = await rt.resume_agent(resume_session_id=sid)
            else:
                handle = await rt.create_agent(session_id=sid, driver="scribe")
            handle.agent.followup("write")
        await trio.sleep_forever()


if __name__ == "__main__":
    configure_logging()
    mode, home = sys.argv[1], sys.argv[2]
    trio.run(hold, home) if mode == "hold" else trio.run(scribe, home, int(sys.argv[3]))
