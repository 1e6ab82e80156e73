"""One connection's protocol state machine, server side (sans-IO: values in, values out).

``Connection.receive(text)`` returns what to do about one incoming frame, as a list of
frozen outputs: ``SendFrame`` (answer the peer), ``Close`` (end the connection with this
websocket code), ``Opened`` (the handshake succeeded), ``Received`` (a notification or a
request for the application) and ``Answered`` (the reply to one of our requests). It never
raises for anything the peer sends.

Rules:
- The first frame must be a ``hello`` carrying the token (compared in constant time) and
  the role this endpoint serves; anything else -> ``error UNAUTHORIZED`` and close 1008.
  A good hello with another protocol version -> ``error BAD_VERSION`` and close 1002.
- After the ``welcome``, a frame with another version -> BAD_VERSION and close 1002; any
  other protocol error -> an ``error`` frame (answering the frame's ``id`` when it had
  one) and the connection stays open.
- Replies are matched to our pending requests by ``re``; a reply to no pending request
  gets ``error BAD_ENVELOPE``. An ``error`` frame is never answered with another one (two
  peers would otherwise bounce errors forever).
- ``ping`` is answered here with ``pong``; the application never sees it.
"""

from __future__ import annotations

import enum
import hmac
import itertools
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import attrs

from ._errors import BridgeClosedError, ErrorCode, ProtocolError
from ._messages import (
    GOALBAR_REQUESTS,
    REPLIES,
    REPLY_TYPES,
    TYPE_NAMES,
    AnswerApproval,
    BridgeMessage,
    Cancel,
    ErrorNotice,
    Events,
    Followup,
    Frame,
    Hello,
    Live,
    Mirrored,
    Ping,
    Pong,
    PreStep,
    Role,
    RunCommand,
    Select,
    Wake,
    Welcome,
)
from ._protocol import PROTOCOL_VERSION, decode

#: Websocket close codes the bridge uses (RFC 6455 section 7.4.1).
CLOSE_NORMAL = 1000  # a peer that leaves on purpose (the DSH plugin when DSH unloads it)
CLOSE_PROTOCOL_ERROR = 1002  # the peer speaks another protocol version
CLOSE_POLICY_VIOLATION = 1008  # no valid hello with the token first
CLOSE_INVALID_DATA = 1007  # sent by bridge._websocket for a text frame that is not UTF-8
CLOSE_TOO_LARGE = 1009  # sent by bridge._websocket for a message over the size limit

#: What the runtime offers each role; the welcome lists those the peer also named.
CAPABILITIES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        # events/live: the host streams them; commands: followup/wake/cancel; pre-step:
        # verdicts; dock: select (dock mode); approvals: the host holds DSH's own approval
        # questions open for the runtime's ``approval`` answers.
        "dsh-host": ("events", "live", "commands", "pre-step", "dock", "approvals"),
        "goalbar": ("events", "live", "goalbar"),
    }
)

# What each role may send us besides hello, replies and errors.
_ACCEPTED: Mapping[str, frozenset[type[Any]]] = MappingProxyType(
    {
        "dsh-host": frozenset({Events, Live, PreStep, Select, Mirrored, RunCommand, Ping}),
        "goalbar": frozenset({Ping, AnswerApproval, *GOALBAR_REQUESTS}),
    }
)
# The requests we may send each role.
_REQUESTS: Mapping[str, frozenset[type[Any]]] = MappingProxyType(
    {
        "dsh-host": frozenset({Followup, Wake, Cancel, AnswerApproval, Ping}),
        "goalbar": frozenset({Ping}),
    }
)


class ConnectionState(enum.Enum):
    AWAITING_HELLO = "awaiting-hello"
    OPEN = "open"
    CLOSED = "closed"


@attrs.frozen
class SendFrame:
    frame: Frame


@attrs.frozen
class Close:
    """End the connection with websocket ``code``; ``reason`` is a short slug
    (``unauthorized``, ``bad-version``) that fits a close frame."""

    code: int
    reason: str


@attrs.frozen
class Opened:
    hello: Hello


@attrs.frozen
class Received:
    """A frame for the application: a notification, a request (answer it with
    ``Connection.reply``), or an ``error`` that answers none of our requests."""

    frame: Frame


@attrs.frozen
class Answered:
    """The reply to our request ``request_id``: its reply message or an ``ErrorNotice``."""

    request_id: str
    message: BridgeMessage


Output = SendFrame | Close | Opened | Received | Answered


def _error(code: str, message: str, re: str | None = None) -> SendFrame:
    return SendFrame(Frame(ErrorNotice(code, message), re=re))


class Connection:
    """The protocol state of one connection to a peer of role ``role_expected``."""

    def __init__(self, role_expected: Role, token: str, *, connection_id: str) -> None:
        if not token:
            raise ValueError("the bridge token must not be empty")
        self.role: Role = role_expected
        self.connection_id = connection_id
        self.state = ConnectionState.AWAITING_HELLO
        self.hello: Hello | None = None
        self._token = token.encode("utf-8")
        self._request_ids = itertools.count(1)
        self._pending: dict[str, type[Any]] = {}  # our request id -> its request class

    @property
    def pending(self) -> frozenset[str]:
        """Ids of our requests still waiting for a reply."""
        return frozenset(self._pending)

    # -- incoming ----------------------------------------------------------------------

    def receive(self, data: str | bytes) -> list[Output]:
        """What to do about one incoming websocket message."""
        if self.state is ConnectionState.CLOSED:
            return []
        try:
            frame = decode(data)
        except ProtocolError as exc:
            if self.state is ConnectionState.AWAITING_HELLO:
                return self._refuse(f"the first frame must be a hello with the bridge token ({exc.code}: {exc})")
            if exc.code is ErrorCode.BAD_VERSION:
                return self._fatal_version(str(exc))
            return [_error(exc.code, str(exc), re=exc.request_id)]
        if self.state is ConnectionState.AWAITING_HELLO:
            return self._handshake(frame)
        return self._dispatch(frame)

    def expire_hello(self) -> list[Output]:
        """The peer said nothing in time: refuse it like a peer without a hello."""
        if self.state is not ConnectionState.AWAITING_HELLO:
            return []
        return self._refuse("no hello in time")

    def _refuse(self, why: str) -> list[Output]:
        self.close()
        return [_error(ErrorCode.UNAUTHORIZED, why), Close(CLOSE_POLICY_VIOLATION, "unauthorized")]

    def _fatal_version(self, why: str) -> list[Output]:
        self.close()
        return [_error(ErrorCode.BAD_VERSION, why), Close(CLOSE_PROTOCOL_ERROR, "bad-version")]

    def _handshake(self, frame: Frame) -> list[Output]:
        hello = frame.message
        if not isinstance(hello, Hello):
            return self._refuse(f"the first frame must be a hello, not {frame.type}")
        # The token first: nothing else about a peer matters until it has proved it may talk.
        if not hmac.compare_digest(hello.token.encode("utf-8"), self._token):
            return self._refuse("bad token")
        if hello.role != self.role:
            return self._refuse(f"this endpoint serves {self.role}, not {hello.role}")
        if hello.protocol != PROTOCOL_VERSION:
            return self._fatal_version(
                f"protocol {hello.protocol} is not supported (this runtime speaks {PROTOCOL_VERSION})"
            )
        self.state = ConnectionState.OPEN
        self.hello = hello
        offered = CAPABILITIES[self.role]
        welcome = Welcome(
            protocol=PROTOCOL_VERSION,
            capabilities=tuple(c for c in offered if c in hello.capabilities),
            connection_id=self.connection_id,
        )
        return [SendFrame(Frame(welcome)), Opened(hello)]

    def _dispatch(self, frame: Frame) -> list[Output]:
        message = frame.message
        cls = type(message)
        if cls is Ping:
            return [SendFrame(Frame(Pong(), re=frame.id))]
        if cls in REPLIES or (cls is ErrorNotice and frame.re is not None):
            return self._answer(frame)
        if cls is ErrorNotice:
            return [Received(frame)]
        if cls not in _ACCEPTED[self.role]:
            why = (
                "hello is only valid as the first frame"
                if cls is Hello
                else f"{frame.type} is not a message a {self.role} sends to the runtime"
            )
            return [_error(ErrorCode.UNKNOWN_TYPE, why, re=frame.id)]
        return [Received(frame)]

    def _answer(self, frame: Frame) -> list[Output]:
        assert frame.re is not None
        request = self._pending.pop(frame.re, None)
        if request is None:
            if isinstance(frame.message, ErrorNotice):
                return [Received(frame)]
            return [
                _error(
                    ErrorCode.BAD_ENVELOPE,
                    f"{frame.type} answers {frame.re!r}, which is no pending request "
                    "(never sent, already answered, or timed out)",
                )
            ]
        expected = REPLY_TYPES[request]
        if not isinstance(frame.message, (expected, ErrorNotice)):
            notice = ErrorNotice(
                ErrorCode.BAD_ENVELOPE,
                f"request {frame.re!r} is answered by {TYPE_NAMES[expected]} or error, not {frame.type}",
            )
            return [SendFrame(Frame(notice)), Answered(frame.re, notice)]
        return [Answered(frame.re, frame.message)]

    # -- outgoing ----------------------------------------------------------------------

    def request(self, message: BridgeMessage) -> Frame:
        """A request frame with a fresh id; its reply will come out as ``Answered``."""
        self._check_open()
        if type(message) not in _REQUESTS[self.role]:
            raise TypeError(f"{type(message).__name__} is not a request the runtime sends a {self.role}")
        request_id = f"r{next(self._request_ids)}"
        self._pending[request_id] = type(message)
        return Frame(message, id=request_id)

    def abandon(self, request_id: str) -> None:
        """Stop waiting for ``request_id`` (it timed out); a late reply is BAD_ENVELOPE."""
        self._pending.pop(request_id, None)

    def reply(self, request: Frame, message: BridgeMessage) -> Frame:
        """The frame answering the peer's ``request`` with ``message`` (or an ErrorNotice)."""
        expected = REPLY_TYPES.get(type(request.message))
        if expected is None or request.id is None:
            raise TypeError(f"{request.type} is not a request")
        if not isinstance(message, (expected, ErrorNotice)):
            raise TypeError(f"{request.type} is answered by {TYPE_NAMES[expected]}, not {type(message).__name__}")
        return Frame(message, re=request.id)

    def close(self) -> None:
        """No more frames either way; pending requests are forgotten."""
        self.state = ConnectionState.CLOSED
        self._pending.clear()

    def _check_open(self) -> None:
        if self.state is not ConnectionState.OPEN:
            raise BridgeClosedError(f"connection {self.connection_id} is {self.state.value}")
