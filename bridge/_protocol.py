"""The wire codec (sans-IO): JSON text <-> ``Frame``, on the one cattrs converter (``runtime._serde``).

A frame is ``{"v": 1, "type": str, "id"?: str, "re"?: str, "data": object}``. ``decode``
never raises anything but ``ProtocolError``, whatever the text; ``encode`` writes compact
JSON that ``decode`` reads back to an equal frame.

Strictness: the envelope and our own payloads are strict (missing, mistyped or unknown
keys are BAD_DATA naming the field); unknown keys are tolerated only in ``hello``,
``welcome`` and ``error`` (so that a newer peer may say more without a version bump) and
inside what belongs to DSH (a session event's envelope and every opaque ``data``,
``message``, ``messages`` and ``agentOptions`` object).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any, Literal

import cattrs
from cattrs.gen import override
from cattrs.v import format_exception, transform_error

from loopdock.actors import LiveEvent
from loopdock.runtime import (
    Event,
    InvalidSessionIdError,
    WireTypeError,
    camel,
    check_session_id,
    converter,
    json_kind,
    register_wire_class,
)

from ._errors import ErrorCode, ProtocolError
from ._messages import (
    MAX_APPROVAL_ID,
    MAX_APPROVAL_REASON,
    MAX_ID_LENGTH,
    MESSAGE_TYPES,
    Ack,
    AnswerApproval,
    ApprovalDone,
    ApprovalId,
    ApprovalReason,
    Cancel,
    CommandDone,
    ErrorNotice,
    Events,
    Followup,
    Frame,
    Goalbar,
    GoalbarPause,
    GoalbarRead,
    GoalbarResult,
    GoalbarStart,
    GoalbarView,
    GoalbarWatch,
    Hello,
    Live,
    Mirrored,
    MirroredSeqs,
    Ping,
    Pong,
    PreStep,
    RunCommand,
    Select,
    Selection,
    SelectionParts,
    SeqMap,
    SessionEvent,
    SessionId,
    StoredBinding,
    Verdict,
    Wake,
    Welcome,
)

PROTOCOL_VERSION = 1

_ENVELOPE_KEYS = frozenset({"v", "type", "id", "re", "data"})
# Classes whose wire objects may carry keys we do not know (see the module docstring).
_TOLERANT = frozenset({Hello, Welcome, ErrorNotice, Event})
# A JSON escape of a UTF-16 surrogate: the only way lone surrogates get into decoded text.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _register_wire() -> cattrs.Converter:
    """The bridge's frames on the one converter (``runtime._serde``): strict JSON types,
    camelCase, ``None`` fields left out; unknown keys refused but in ``_TOLERANT``."""

    def session_id(value: Any, _: Any) -> str:
        if not isinstance(value, str):
            raise WireTypeError(f"expected a string, got {json_kind(value)}")
        return check_session_id(value)

    converter.register_structure_hook_func(lambda tp: tp == SessionId, session_id)

    # Strings a console page sends, with the most the runtime keeps of them.
    def bounded(what: str, longest: int) -> Any:
        def structure(value: Any, _: Any) -> str:
            if not isinstance(value, str):
                raise WireTypeError(f"expected a string, got {json_kind(value)}")
            if not value and what == "approval id":
                raise WireTypeError("an approval id is not empty")
            if len(value) > longest:
                raise WireTypeError(f"an {what} is at most {longest} characters, got {len(value)}")
            return value

        return structure

    converter.register_structure_hook_func(lambda tp: tp == ApprovalId, bounded("approval id", MAX_APPROVAL_ID))
    converter.register_structure_hook_func(
        lambda tp: tp == ApprovalReason, bounded("approval reason", MAX_APPROVAL_REASON)
    )

    # session id -> seq: an object whose every value is a non-negative integer.
    def is_seq_map(tp: Any) -> bool:
        return bool(tp == SeqMap)

    def seq_map(value: Any, _: Any) -> dict[str, int]:
        if not isinstance(value, dict):
            raise WireTypeError(f"expected an object, got {json_kind(value)}")
        for key, seq in value.items():
            if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
                got = json_kind(seq) if not isinstance(seq, int) or isinstance(seq, bool) else str(seq)
                raise WireTypeError(f"expected a non-negative integer for {key[:100]!r}, got {got}")
        return dict(value)

    converter.register_structure_hook_func(is_seq_map, seq_map)
    converter.register_unstructure_hook_func(is_seq_map, dict)

    # Nested classes first, so that the outer ones are generated with their hooks.
    nested: tuple[type, ...] = (Event, LiveEvent, SessionEvent, ErrorNotice, SelectionParts, StoredBinding, GoalbarView)
    outer: tuple[type, ...] = (Hello, Welcome, Events, Live, Followup, Wake, Cancel, Ack, PreStep, Verdict,
                Select, Selection, Mirrored, MirroredSeqs, RunCommand, CommandDone, Ping, Pong, GoalbarRead, GoalbarWatch,
                GoalbarStart, GoalbarPause, GoalbarResult, Goalbar, AnswerApproval, ApprovalDone)
    for cls in (*nested, *outer):
        # The actors' LiveEvent: its agent id is a session id on DSH.
        overrides = {"agent_id": override(rename="agentId", struct_hook=session_id)} if cls is LiveEvent else None
        register_wire_class(cls, tolerant=cls in _TOLERANT, overrides=overrides)
    return converter


_CONVERTER = _register_wire()


def _format(exc: BaseException, tp: Any) -> str:
    if isinstance(exc, (WireTypeError, InvalidSessionIdError)):
        return str(exc)
    return format_exception(exc, tp)


def _leaves(exc: BaseException) -> list[BaseException]:
    """The failures at the bottom of cattrs' error tree."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def _drop_tracebacks(exc: BaseException) -> None:
    """Cut every traceback out of cattrs' error tree, so that reference counting frees the
    frame's text as soon as its error is described.

    A generated structuring function collects its fields' errors in a local list, and each
    error's traceback holds that function's frame: error -> frame -> list -> error, a cycle
    that keeps the frame's locals (the decoded JSON, the refused text whole) until the
    cyclic collector runs. The runtime makes that rare (``runtime._gc``) and freezes what
    survives a collection (``runtime._gc_governor``): a 100,000-character session id kept
    its frame's text alive long enough for 300 such frames to leave ``serve`` 31 MB larger.
    """
    pending, seen = [exc], set()
    while pending:
        error = pending.pop()
        if id(error) in seen:
            continue
        seen.add(id(error))
        error.__traceback__ = None
        if isinstance(error, BaseExceptionGroup):
            pending.extend(error.exceptions)
        pending.extend(linked for linked in (error.__cause__, error.__context__) if linked is not None)


def _structuring_failure(type_name: str, exc: Exception) -> tuple[ErrorCode, str]:
    """The code and message for ``data`` that does not fit its type (``exc``: cattrs' error tree)."""
    _drop_tracebacks(exc)
    code = (
        ErrorCode.INVALID_SESSION_ID
        if any(isinstance(leaf, InvalidSessionIdError) for leaf in _leaves(exc))
        else ErrorCode.BAD_DATA
    )
    return code, f"{type_name}: {_describe(exc)}"[:1000]


def _describe(exc: BaseException) -> str:
    """cattrs' error tree as ``problem @ data.field`` lines, with wire (camelCase) names."""
    lines = []
    for line in transform_error(exc, path="data", format_exception=_format):
        problem, _, path = line.rpartition(" @ ")
        lines.append(f"{problem} @ {re.sub(r'[A-Za-z_]+', lambda m: camel(m.group()), path)}")
    return "; ".join(lines)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"{text} is out of range")
    return value


def _check_unicode(text: str, parsed: Any = None) -> None:
    """Refuse lone surrogates: they cannot be sent as UTF-8, so a frame holding one
    would fail later, in whichever task relays it."""
    try:
        text.encode("utf-8")
        if parsed is not None and _SURROGATE_ESCAPE.search(text):
            json.dumps(parsed, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise ProtocolError(ErrorCode.MALFORMED_JSON, "the text holds a lone UTF-16 surrogate") from None


def decode(text: str | bytes) -> Frame:
    """Read one frame; raises ProtocolError (and nothing else) if ``text`` is not one
    (binary data never is)."""
    if not isinstance(text, str):
        raise ProtocolError(ErrorCode.BAD_ENVELOPE, "a frame is JSON text, not binary")
    _check_unicode(text)
    try:
        raw = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(ErrorCode.MALFORMED_JSON, f"not JSON: {str(exc)[:200]}") from None
    try:
        _check_unicode(text, raw)
    except RecursionError:
        raise ProtocolError(ErrorCode.MALFORMED_JSON, "the JSON is nested too deeply") from None
    if not isinstance(raw, dict):
        raise ProtocolError(ErrorCode.BAD_ENVELOPE, f"a frame is a JSON object, got {json_kind(raw)}")
    version = raw.get("v")
    if not isinstance(version, int) or isinstance(version, bool):
        raise ProtocolError(ErrorCode.BAD_ENVELOPE, "a frame needs an integer protocol version 'v'")
    if version != PROTOCOL_VERSION:
        raise ProtocolError(
            ErrorCode.BAD_VERSION,
            f"protocol version {version} is not supported (this runtime speaks {PROTOCOL_VERSION})",
        )
    extra = raw.keys() - _ENVELOPE_KEYS
    if extra:
        raise ProtocolError(
            ErrorCode.BAD_ENVELOPE, f"unknown envelope keys: {', '.join(sorted(map(repr, extra)))[:200]}"
        )
    # The ids first: every later error answers the frame's id, so it must be one a frame can carry.
    for key in ("id", "re"):
        if key in raw and not (isinstance(raw[key], str) and 0 < len(raw[key]) <= MAX_ID_LENGTH):
            raise ProtocolError(ErrorCode.BAD_ENVELOPE, f"{key!r} must be a string of 1 to {MAX_ID_LENGTH} characters")
    request_id = raw.get("id")
    type_name = raw.get("type")
    if not isinstance(type_name, str):
        raise ProtocolError(ErrorCode.BAD_ENVELOPE, "a frame needs a string 'type'", request_id=request_id)
    cls = MESSAGE_TYPES.get(type_name)
    if cls is None:
        raise ProtocolError(
            ErrorCode.UNKNOWN_TYPE, f"unknown message type {type_name[:100]!r}", request_id=request_id
        )
    data = raw.get("data")
    if not isinstance(data, dict):
        raise ProtocolError(
            ErrorCode.BAD_ENVELOPE,
            f"{type_name}: 'data' must be an object, got {json_kind(data) if 'data' in raw else 'nothing'}",
            request_id=request_id,
        )
    try:
        message = _CONVERTER.structure(data, cls)
    except Exception as exc:  # cattrs reports every structuring failure as some exception
        code, why = _structuring_failure(type_name, exc)
    else:
        return Frame(message, id=request_id, re=raw.get("re"))
    # Raised here, not in the except clause, so that it carries no link to cattrs' errors;
    # and never held in a local, which its own traceback would make a cycle.
    raise ProtocolError(code, why, request_id=request_id)


def _dumps(value: Any, what: str) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError) as exc:
        raise ProtocolError(ErrorCode.BAD_DATA, f"{what} is not JSON: {exc}") from None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ProtocolError(ErrorCode.BAD_DATA, f"{what} holds a lone UTF-16 surrogate") from None
    return text


def encode(frame: Frame) -> str:
    """Write one frame as compact JSON text; raises ProtocolError (BAD_DATA) if an opaque
    payload is not JSON (``NaN``, a set, a lone surrogate, ...)."""
    envelope: dict[str, Any] = {"v": PROTOCOL_VERSION, "type": frame.type}
    if frame.id is not None:
        envelope["id"] = frame.id
    if frame.re is not None:
        envelope["re"] = frame.re
    envelope["data"] = _CONVERTER.unstructure(frame.message, type(frame.message))
    return _dumps(envelope, frame.type)


BatchKind = Literal["events", "live"]


def encode_item(item: SessionEvent | LiveEvent) -> tuple[BatchKind, str]:
    """One item of an ``events``/``live`` frame, encoded once when it is published (so
    that batching can count its size, and a bad item fails its producer, not the sender)."""
    kind: BatchKind = "events" if isinstance(item, SessionEvent) else "live"
    return kind, _dumps(_CONVERTER.unstructure(item, type(item)), f"a {kind} item")


def encode_batch(kind: BatchKind, items: Sequence[str]) -> str:
    """The ``events``/``live`` frame holding ``items`` (from ``encode_item``); the same
    text ``encode`` writes for that frame."""
    return f'{{"v":{PROTOCOL_VERSION},"type":"{kind}","data":{{"items":[{",".join(items)}]}}}}'
