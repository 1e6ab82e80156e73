"""Fan-out of committed items to subscribers that can never block the publisher.

Each subscriber has a bounded buffer. ``publish`` never waits: a subscriber whose buffer
is full is dropped on the spot, and its iterator raises ``SubscriberDroppedError`` with
reason ``"fell-behind"`` once it has drained what it already had.
"""

from __future__ import annotations

from typing import Generic, TypeVar

import trio

from loopdock.runtime import SubscriberDroppedError, get_logger

T = TypeVar("T")

SUBSCRIBER_BUFFER = 1024

log = get_logger(__name__)


class Subscription(Generic[T]):
    """An ordered stream of items; ``async for`` over it, or ``await receive()``.

    Ends normally when the publisher closes; raises SubscriberDroppedError when dropped.
    Close it (or use it as a context manager) to unsubscribe.
    """

    def __init__(self, fanout: Fanout[T], receive: trio.MemoryReceiveChannel[T]) -> None:
        self._fanout = fanout
        self._receive = receive
        self.drop_reason: str | None = None

    async def receive(self) -> T:
        try:
            return await self._receive.receive()
        except trio.EndOfChannel:
            if self.drop_reason is not None:
                raise SubscriberDroppedError(
                    self.drop_reason,
                    f"subscriber of {self._fanout.name} was dropped: {self.drop_reason}",
                ) from None
            raise

    def receive_nowait(self) -> T:
        """The next buffered item, or trio.WouldBlock; raises like ``receive`` at the end."""
        try:
            return self._receive.receive_nowait()
        except trio.EndOfChannel:
            if self.drop_reason is not None:
                raise SubscriberDroppedError(
                    self.drop_reason,
                    f"subscriber of {self._fanout.name} was dropped: {self.drop_reason}",
                ) from None
            raise

    def __aiter__(self) -> Subscription[T]:
        return self

    async def __anext__(self) -> T:
        try:
            return await self.receive()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None

    def close(self) -> None:
        self._fanout._remove(self)
        self._receive.close()

    def __enter__(self) -> Subscription[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Fanout(Generic[T]):
    def __init__(self, name: str) -> None:
        self.name = name
        self._subscribers: dict[Subscription[T], trio.MemorySendChannel[T]] = {}
        self._closed = False

    def subscribe(self, max_buffer: int = SUBSCRIBER_BUFFER) -> Subscription[T]:
        send, receive = trio.open_memory_channel[T](max_buffer)
        subscription = Subscription(self, receive)
        if self._closed:
            send.close()
        else:
            self._subscribers[subscription] = send
        return subscription

    @property
    def subscriber_count(self) -> int:
        return len(self._subscribers)

    def publish(self, item: T) -> None:
        """Deliver ``item`` to every subscriber without waiting (never a checkpoint)."""
        if not self._subscribers:  # the common case: every event, nobody listening
            return
        for subscription, send in list(self._subscribers.items()):
            try:
                send.send_nowait(item)
            except trio.WouldBlock:
                self._drop(subscription, "fell-behind")
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self._subscribers.pop(subscription, None)

    def close(self) -> None:
        """End every subscription normally (the stream is complete)."""
        self._closed = True
        for send in self._subscribers.values():
            send.close()
        self._subscribers.clear()

    def _drop(self, subscription: Subscription[T], reason: str) -> None:
        subscription.drop_reason = reason
        send = self._subscribers.pop(subscription)
        send.close()
        log.warning("subscriber dropped", stream=self.name, reason=reason)

    def _remove(self, subscription: Subscription[T]) -> None:
        send = self._subscribers.pop(subscription, None)
        if send is not None:
            send.close()
