"""What the HTTP model adapters share: retries with backoff, error summaries, keys, prices.

A retry happens only while the caller has seen nothing yet (see ``Attempts``); the
delay before it is the server's ``Retry-After`` when it sent one (up to
``RetryPolicy.max_retry_after``), else an exponential backoff with jitter, so that
agents throttled together do not come back together.
"""

from __future__ import annotations

import email.utils
import json
import random
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from contextlib import aclosing
from typing import Any, Protocol, cast

import attrs
import httpx
import trio

from .._errors import ModelError, ModelRejectedError, ModelStreamBrokenError
from .._logging import get_logger
from ._adapter import Chunk, FinishReason, RetryNotice, Usage

log = get_logger(__name__)

# Streams can pause for a long time while a model thinks; connecting should not.
DEFAULT_TIMEOUT = httpx.Timeout(120.0, connect=15.0)

_MAX_ERROR_CHARS = 200
_MAX_ERROR_BODY_BYTES = 8192


@attrs.frozen
class RetryPolicy:
    """How often and how long a model call is retried.

    Before retry ``n`` (from 1) the adapter waits ``base_delay * 2 ** (n - 1)``, at most
    ``max_delay``, less a random share of up to ``jitter`` of it; or what the server's
    ``Retry-After`` asks. A server asking for more than ``max_retry_after`` seconds is
    not waited for: the call fails at once.
    """

    max_attempts: int = 3
    base_delay: float = 0.5
    max_delay: float = 30.0
    jitter: float = 0.5
    max_retry_after: float = 60.0

    def __attrs_post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {self.max_attempts}")
        if min(self.base_delay, self.max_delay, self.max_retry_after) < 0:
            raise ValueError("retry delays must be >= 0")
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"jitter must be between 0 and 1, got {self.jitter}")

    def backoff(self, attempt: int, draw: float) -> float:
        """The delay after failed attempt ``attempt``; ``draw`` is uniform in [0, 1)."""
        full = min(self.max_delay, self.base_delay * 2.0 ** (attempt - 1))
        return full * (1.0 - self.jitter * draw)


#: The policy of an adapter given none.
DEFAULT_RETRY = RetryPolicy()


@attrs.frozen
class Price:
    """The price of a million input and of a million output tokens (US dollars for a
    provider's usage; an experiment's prices may be in any one currency)."""

    input: float
    output: float

    def cost(self, input_tokens: int, output_tokens: int) -> float:
        return (input_tokens * self.input + output_tokens * self.output) / 1_000_000


def priced(usage: Usage, price: Price | None) -> Usage:
    if price is None:
        return usage
    return attrs.evolve(usage, cost=price.cost(usage.input_tokens, usage.output_tokens))


class RetryableStatus(Exception):
    """An HTTP 429 / 5xx answer: worth another attempt."""

    def __init__(self, summary: str, retry_after: float | None) -> None:
        super().__init__(summary)
        self.summary = summary
        self.retry_after = retry_after


#: Failures of the connection or the server: retried while nothing was yielded.
RETRYABLE = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError, RetryableStatus)


def is_retryable_status(status: int) -> bool:
    return status == 429 or status >= 500


def retry_after(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """``Retry-After`` in seconds (delta-seconds or an HTTP date), None if absent or bad."""
    value = (headers.get("retry-after") or "").strip()
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def trim(text: str) -> str:
    text = " ".join(text.split())
    if len(text) > _MAX_ERROR_CHARS:
        text = text[: _MAX_ERROR_CHARS - 3] + "..."
    return text


def finish_reason(reason: str, known: Mapping[str, FinishReason], what: str) -> FinishReason:
    """Ours for a provider's ``reason``, one of its ``known`` ones. Any other (a refusal,
    a content filter, ``pause_turn``, ...) is not an end of turn the agent can act on:
    ModelError, naming it as the provider does (``what``: "finish reason", "stop reason")."""
    mapped = known.get(reason)
    if mapped is None:
        raise ModelError(f"model stopped with {what} {trim(reason)!r}")
    return mapped


def error_text(payload: Any) -> str:
    """The human message of an error payload (``{"error": {"message": ...}}``), or ''."""
    if not isinstance(payload, dict):
        return ""
    error = payload.get("error", payload)
    if isinstance(error, dict):
        error = error.get("message")
    return trim(error) if isinstance(error, str) else ""


async def status_summary(response: httpx.Response) -> str:
    """``HTTP 401: <message>``, reading at most a few KB of the error body."""
    body = b""
    async for piece in response.aiter_bytes():
        body += piece
        if len(body) >= _MAX_ERROR_BODY_BYTES:
            break
    try:
        message = error_text(json.loads(body))
    except ValueError:
        message = ""  # not JSON: an HTML error page is noise, not an explanation
    summary = f"HTTP {response.status_code}"
    return f"{summary}: {message}" if message else summary


async def check_status(response: httpx.Response, where: str, redact: Callable[[str], str]) -> None:
    """Raise for a non-200 answer: ``RetryableStatus`` (429, 5xx) or ModelRejectedError."""
    if response.status_code == 200:
        return
    summary = redact(await status_summary(response))
    if is_retryable_status(response.status_code):
        raise RetryableStatus(summary, retry_after(response.headers))
    raise ModelRejectedError(f"model call to {where} was refused: {summary}", response.status_code)


@attrs.define
class Attempts:
    """The retry bookkeeping of one model call.

    ``failed`` is called in the ``except`` clause and returns the delay (or raises the
    call's final error); ``pause`` is awaited outside it, so a cancellation arriving
    during the backoff is not chained to the failure that caused it.
    """

    where: str
    policy: RetryPolicy
    on_retry: Callable[[RetryNotice], Awaitable[None]] | None = None
    draw: Callable[[], float] = random.random
    attempt: int = 0

    def failed(self, exc: Exception, *, yielded: bool) -> tuple[float, str]:
        short = exc.summary if isinstance(exc, RetryableStatus) else type(exc).__name__
        if yielded:
            raise ModelStreamBrokenError(f"model stream from {self.where} broke off: {short}") from exc
        if self.attempt >= self.policy.max_attempts:
            plural = "s" if self.attempt > 1 else ""
            raise ModelError(
                f"model call to {self.where} failed after {self.attempt} attempt{plural}: {short}"
            ) from exc
        asked = exc.retry_after if isinstance(exc, RetryableStatus) else None
        if asked is None:
            return self.policy.backoff(self.attempt, self.draw()), short
        if asked > self.policy.max_retry_after:
            raise ModelError(
                f"model call to {self.where} failed: {short}; the server asks to wait {asked:.0f} s, "
                f"more than {self.policy.max_retry_after:.0f} s"
            ) from exc
        return asked, short

    async def pause(self, delay: float, short: str) -> None:
        log.warning("model.retry", where=self.where, attempt=self.attempt, delay=delay, error=short)
        if self.on_retry is not None:
            await self.on_retry(RetryNotice(self.attempt, delay, short))
        await trio.sleep(delay)


@attrs.frozen
class ApiKey:
    """Where an adapter's key comes from: a literal (tests, embedding code) or the name
    of an environment variable, read at each call so a rotated key is picked up."""

    value: str | None = attrs.field(default=None, repr=False)
    env_name: str | None = None
    env: Mapping[str, str] = attrs.field(factory=dict, repr=False, eq=False)

    def get(self, where: str) -> str:
        """The key ('' when none is configured); ModelRejectedError if its variable is unset."""
        if self.env_name is None:
            return self.value or ""
        key = (self.env.get(self.env_name) or "").strip()
        if not key:
            raise ModelRejectedError(f"model call to {where} needs ${self.env_name}, which is not set")
        return key


class SseParser(Protocol):
    """Turns the lines of one SSE answer into chunks (a plain object, not a generator,
    so that the call's own generator is the only one to close on cancellation)."""

    done: bool

    def feed(self, line: str) -> list[Chunk]: ...

    def end(self) -> list[Chunk]: ...


@attrs.frozen
class SseCall:
    """One streaming POST, retried per ``attempts`` while nothing was yielded."""

    client_factory: Callable[[], httpx.AsyncClient]
    url: str
    body: Mapping[str, Any]
    headers: Mapping[str, str]
    where: str
    redact: Callable[[str], str]
    parser: Callable[[], SseParser]

    async def stream(self, attempts: Attempts) -> AsyncGenerator[Chunk, None]:
        async with self.client_factory() as client:
            while True:
                attempts.attempt += 1
                yielded = False
                try:
                    async with client.stream("POST", self.url, json=self.body, headers=dict(self.headers)) as response:
                        await check_status(response, self.where, self.redact)
                        parser = self.parser()
                        # aiter_lines is an async generator: closed at once when we stop early.
                        lines_gen = cast(AsyncGenerator[str, None], response.aiter_lines())
                        async with aclosing(lines_gen) as lines:
                            async for line in lines:
                                for chunk in parser.feed(line):
                                    yielded = True
                                    yield chunk
                                if parser.done:
                                    break
                        for chunk in parser.end():
                            yielded = True
                            yield chunk
                    return
                # Only failures of the connection or the server are retried; trio.Cancelled,
                # GeneratorExit and ModelError are not caught here and propagate as is.
                except RETRYABLE as exc:
                    delay, short = attempts.failed(exc, yielded=yielded)
                except (httpx.HTTPError, httpx.InvalidURL) as exc:
                    # Anything else from httpx (a bad URL or scheme, a proxy refusing, an
                    # undecodable body) will not get better by retrying.
                    raise ModelError(f"model call to {self.where} failed: {type(exc).__name__}") from exc
                await attempts.pause(delay, short)
