"""A loop package template: one strategy loop, ``template-concise``.

Copy this directory, rename the package and the loop id, and change ``setup``.

Rules for a loop author:

- ``setup`` only *composes* the new agent (prompt sections, tools, listeners, services).
  It runs inside the agent's publication transaction, before the agent is live: never
  drive the agent there (no ``followup``/``steer``/``inject``, no waiting for turns, no
  creating other agents). If it raises, the whole creation is rolled back.
- Everything registered through ``agent_ctx`` is scoped to that agent and undone when the
  agent is disposed or its creation fails, so prefer it to anything process-wide.
- Keep mutable state per agent or per session: create it inside ``setup`` (a closure, or a
  dict keyed by ``agent_ctx.agent.id`` / session id). Never module-global state: one
  process runs many agents, and the same loop serves all of them.
- Durable state must be derivable from the session's events, so a resumed agent can
  rebuild it.
"""

from __future__ import annotations

from loopdock import StrategyLoop

PROMPT_SECTION = "template-concise"
PROMPT_TEXT = (
    "Answer concisely: lead with the answer, use as few words as the question allows, "
    "and skip preambles and recaps."
)
# Tools the agent may see; loopdock's built-in read-only ones (write_file and shell are hidden).
READ_ONLY_TOOLS = ("read_file", "list_dir")


def setup(agent_ctx):
    """Compose one agent (it may also be ``async def``, and may return a commit)."""
    agent_ctx.add_prompt_section(PROMPT_SECTION, PROMPT_TEXT)
    agent_ctx.tools.restrict(allow=READ_ONLY_TOOLS)


TEMPLATE_LOOP = StrategyLoop(
    id="template-concise",  # must match ^[a-z0-9][a-z0-9._-]*$ and be unique in the dock
    setup=setup,
    label="Concise, read-only",
    description="Asks for concise answers and restricts the agent to read-only tools.",
)

# What the entry point names: every loop this package ships.
LOOPS = (TEMPLATE_LOOP,)
