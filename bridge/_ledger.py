"""``Ledger``: which connection brought in each id a handler keeps.

Handlers keep things under ids that peers name (the host's mirrored sessions and live
agents, the dock's bindings). A ledger records, oldest first, which connection brought
each id in, and counts them per connection, so that a handler can cap what one peer, and
all of them together, make the runtime keep. It decides nothing itself: the handler asks
``held_by`` and ``len`` before it admits an id, and ``oldest`` for one it may let go of.
"""

from __future__ import annotations

from collections.abc import Callable


class Ledger:
    def __init__(self) -> None:
        # id -> the connection that brought it in (None once that connection ended), oldest first
        self._owners: dict[str, str | None] = {}
        self._held: dict[str, int] = {}  # connection id -> ids it brought in, still kept

    def __len__(self) -> int:
        return len(self._owners)

    def __contains__(self, key: object) -> bool:
        return key in self._owners

    def held_by(self, connection_id: str) -> int:
        """How many of the ids kept ``connection_id`` brought in."""
        return self._held.get(connection_id, 0)

    def owner(self, key: str) -> str | None:
        """The connection that brought ``key`` in; None if it ended (or ``key`` is not kept)."""
        return self._owners.get(key)

    def add(self, key: str, connection_id: str) -> None:
        """Record ``key`` as brought in by ``connection_id``, as the newest id (an id
        already recorded moves to that connection and becomes the newest)."""
        self.discard(key)
        self._owners[key] = connection_id
        self._held[connection_id] = self._held.get(connection_id, 0) + 1

    def discard(self, key: str) -> None:
        """``key`` is no longer kept."""
        if key not in self._owners:
            return
        owner = self._owners.pop(key)
        if owner is not None:
            self._held[owner] -= 1

    def oldest(self, may_go: Callable[[str], bool]) -> str | None:
        """The oldest id for which ``may_go(id)`` holds, or None."""
        return next((key for key in self._owners if may_go(key)), None)

    def release(self, connection_id: str) -> None:
        """``connection_id`` ended: the ids it brought in stay, owned by none (they count
        toward the total only)."""
        if self._held.pop(connection_id, 0):
            for key, owner in self._owners.items():
                if owner == connection_id:
                    self._owners[key] = None
