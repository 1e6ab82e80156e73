"""HistoryCache: how much of idle agents' history a runtime keeps in memory.

The session log is in the store; an agent only needs its history (its transcript, and
its session's recent events) in memory while it runs a turn. Dropping it the moment an
agent goes idle would make every turn of a busy conversational agent read its whole
history back, so idle histories are kept, least recently active first out, while they
weigh at most ``budget`` bytes in all. An evicted agent costs O(1) memory whatever its
history, and reads its transcript back from the store at its next turn (one read per
cold turn: what a model call needs anyway, the whole conversation).

A history weighs what it holds, estimated without walking the heap: ``ITEM_BYTES`` per
message and per event, plus the characters of its messages' content. The budget once
counted items alone, so a thousand agents whose tool results were files of 100 KB kept
gigabytes warm under a budget meant as 60 MB; counted in bytes, long messages evict
sooner (tests/actors/test_history.py).

``budget=0`` evicts every history as soon as its agent goes idle.
"""

from __future__ import annotations

from typing import Protocol

#: Bytes of idle agents' history kept in memory in all: enough for five hundred agents
#: with conversations of a hundred short messages or so to stay warm. Agents served in
#: turn (a runtime under load) thrash a least-recently-used cache that holds fewer than
#: all of them, every turn then reading its whole transcript back: about 1 ms of CPU for
#: 200 messages, little beside a model call, and the budget is what keeps a user's memory
#: per agent flat (benchmarks/PROFILE.md, "Memory per agent as users measure it").
WARM_HISTORY_BYTES = 32 * 2**20

#: What a message or an event costs in memory beyond its text: the objects that hold
#: it. Measured with tracemalloc over turns of short messages: 600-680 B per message
#: held, about 700 per event (the figure was 400, from a measure that mixed in events
#: trimmed meanwhile, and the estimate fell to 0.45 of what was held). An event's strings
#: are its message's, shared, so only the messages' characters are added
#: (tests/actors/test_history.py checks the estimate against tracemalloc).
ITEM_BYTES = 640


class Evictable(Protocol):
    def history_weight(self) -> int:
        """The bytes this agent's history holds in memory (estimated: ``ITEM_BYTES`` per
        message and event, plus the messages' characters)."""

    def evict_history(self) -> None:
        """Drop what can be read back from the store."""


class HistoryCache:
    def __init__(self, budget: int = WARM_HISTORY_BYTES) -> None:
        if budget < 0:
            raise ValueError(f"a history budget cannot be negative ({budget})")
        self.budget = budget
        self.held = 0
        self.evictions = 0
        self._idle: dict[Evictable, int] = {}  # least recently idle first

    def idle(self, agent: Evictable) -> None:
        """``agent`` went idle: keep its history, evicting the oldest over the budget."""
        self.busy(agent)
        weight = agent.history_weight()
        self._idle[agent] = weight
        self.held += weight
        while self.held > self.budget and self._idle:
            oldest = next(iter(self._idle))
            self.held -= self._idle.pop(oldest)
            oldest.evict_history()
            self.evictions += 1

    def busy(self, agent: Evictable) -> None:
        """``agent`` runs a turn (or is gone): its history is not evictable."""
        weight = self._idle.pop(agent, None)
        if weight is not None:
            self.held -= weight

    def __len__(self) -> int:
        return len(self._idle)
