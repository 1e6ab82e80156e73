"""The bridge's errors: what a peer did wrong on the wire, and what a request can end in.

Every class derives from ``runtime.LoopdockError`` and carries a stable ``code``; a
``ProtocolError``'s code is what its ``error`` frame carries to the peer.
"""

from __future__ import annotations

import enum

from loopdock.runtime import InvalidSessionIdError, LoopdockError


class ErrorCode(enum.StrEnum):
    """The codes of ``ProtocolError`` (and of the ``error`` frames it becomes)."""

    MALFORMED_JSON = "MALFORMED_JSON"  # the text is not one JSON value (or not valid Unicode)
    BAD_ENVELOPE = "BAD_ENVELOPE"  # not {v, type, id?, re?, data}, or ids that do not fit the type
    BAD_VERSION = "BAD_VERSION"  # a protocol version other than PROTOCOL_VERSION
    UNKNOWN_TYPE = "UNKNOWN_TYPE"  # a type we do not know, or not one this peer may send us
    BAD_DATA = "BAD_DATA"  # ``data`` does not fit its type (the message names the field)
    UNAUTHORIZED = "UNAUTHORIZED"  # anything but a hello with the right token and role first
    TOO_LARGE = "TOO_LARGE"  # an item too large for any frame the peer accepts
    # a session (or agent) id the runtime's API refuses too (runtime._ids.check_session_id)
    INVALID_SESSION_ID = InvalidSessionIdError.code


class ProtocolError(LoopdockError):
    """Raised by ``decode``/``encode`` when a frame breaks the protocol; ``code`` says how.

    ``request_id`` is the offending frame's ``id`` when its envelope was readable, so that
    the ``error`` frame can answer that very request (``re``) instead of leaving the peer
    to time out. Protocol errors never end a connection by themselves: the connection
    state machine decides (only UNAUTHORIZED and BAD_VERSION close it).
    """

    def __init__(self, code: ErrorCode, message: str, *, request_id: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.request_id = request_id


class BridgeClosedError(LoopdockError):
    """Raised when a request is made on, or was waiting on, a connection that is closed
    (the peer went away, was dropped, or the server is shutting down)."""

    code = "BRIDGE_CLOSED"


class RequestTimeoutError(LoopdockError):
    """Raised by ``BridgeConnection.request`` when no reply arrived before the deadline.

    The request is forgotten: a reply arriving later is answered with BAD_ENVELOPE.
    """

    code = "REQUEST_TIMEOUT"


class RemoteError(LoopdockError):
    """Raised by ``BridgeConnection.request`` when the peer answered with an ``error`` frame;
    ``code`` is the peer's code (e.g. ``BAD_DATA``, or one of its own)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class LimitError(LoopdockError):
    """Raised by a handler when what a peer sent would make the runtime keep more than one
    of its caps allows: what needed room is not kept (the rest of the frame is), and the
    peer gets an ``error`` frame with ``code`` (``TOO_MANY_SESSIONS``, ``TOO_MANY_AGENTS``,
    ``INBOX_FULL``)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class NotServedError(LoopdockError):
    """Raised by a handler for a request it does not serve (``NullHandler`` and ``select``)."""

    code = "NOT_SERVED"


class TokenFileError(LoopdockError):
    """Raised when ``<home>/bridge.token`` exists but holds no token."""

    code = "BAD_TOKEN_FILE"
