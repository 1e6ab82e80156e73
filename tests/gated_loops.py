"""A loop package for tests (``loopPackages: [gated_loops]``): the ``gated`` loop, whose
pre-step listener vetoes any message that mentions the weekend."""

from loopdock import Reject, StrategyLoop


async def no_weekends(pre, next_):
    if any("weekend" in m.text for m in pre.messages):
        return Reject("not on weekends")
    return await next_(pre)


def setup(ctx):
    ctx.on("agent/pre-step", no_weekends)


LOOPS = [StrategyLoop(id="gated", setup=setup)]
