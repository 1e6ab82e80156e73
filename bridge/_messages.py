"""The bridge's message set: one frozen class per wire ``type``, and the frame around it.

Python names are snake_case; ``_protocol`` renames them to the camelCase the DSH plugin
speaks. Payloads that belong to DSH (event data, live data, messages, agent options) stay
opaque JSON objects here: the runtime converts them where it uses them (``runtime._serde``).

Who sends what (runtime = the server; host = the DSH plugin; goalbar = a GoalBar page):

=========== ===================== ========================================
type        direction             answered by
=========== ===================== ========================================
hello       peer -> runtime       welcome, or error + close
welcome     runtime -> peer
error       either                (may carry ``re``: it then answers that request)
events      host -> runtime,      (batched: many items per frame)
            runtime -> goalbar
live        host -> runtime,      (batched)
            runtime -> goalbar
followup    runtime -> host       ack
wake        runtime -> host       ack
cancel      runtime -> host       ack
preStep     host -> runtime       verdict
select      host -> runtime       selection, or error (e.g. LOOP_SWITCH)
mirrored    host -> runtime       mirroredSeqs (an older runtime: error
                                  UNKNOWN_TYPE)
command     host -> runtime       commandDone (an older runtime: error
                                  UNKNOWN_TYPE)
goalbarRead goalbar -> runtime    goalbarResult (also goalbarWatch,
                                  goalbarStart, goalbarPause)
goalbar     runtime -> goalbar    (pushed after a goalbarWatch)
approval    goalbar -> runtime,   approvalDone (a console page answers an
            runtime -> host       agent's approval question; the runtime
                                  answers a DSH agent's question DSH asked)
ping        either                pong
=========== ===================== ========================================
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Annotated, Any, Literal

import attrs

from loopdock.actors import LiveEvent, Placement
from loopdock.runtime import Event

from ._errors import ErrorCode, ProtocolError

Role = Literal["dsh-host", "goalbar"]

#: Longest ``id``/``re`` accepted: ids are correlation handles, not payload.
MAX_ID_LENGTH = 128

#: A session id from a host (agent id == session id on DSH): decoding checks it as the
#: runtime's API does (``runtime._ids.check_session_id``), so that nothing is ever kept
#: under an id the runtime would refuse (error INVALID_SESSION_ID).
SessionId = Annotated[str, "session id"]


# -- handshake and errors -------------------------------------------------------------


@attrs.frozen
class Hello:
    """The peer's first frame. Unknown keys are tolerated (a newer peer may say more)."""

    token: str = attrs.field(repr=False)  # never in logs
    role: Role
    protocol: int
    capabilities: tuple[str, ...] = ()


@attrs.frozen
class Welcome:
    """The runtime's answer to a good hello. ``capabilities`` are those both sides named.
    Unknown keys are tolerated (a newer runtime may say more)."""

    protocol: int
    capabilities: tuple[str, ...]
    connection_id: str


#: Longest ``code`` and ``message`` of an ``error`` frame; longer ones are cut. What a
#: handler says may quote what a peer sent (an unknown loop's name, ...): the answer to a
#: 100,000-character name must not be as long, nor a line logged from it.
MAX_ERROR_CODE = 64
MAX_ERROR_MESSAGE = 1000


def _cut_code(text: str) -> str:
    return text if len(text) <= MAX_ERROR_CODE else text[:MAX_ERROR_CODE]


def _cut_message(text: str) -> str:
    return text if len(text) <= MAX_ERROR_MESSAGE else text[: MAX_ERROR_MESSAGE - 3] + "..."


@attrs.frozen
class ErrorNotice:
    """The ``error`` frame: a code (``ErrorCode`` or a handler's, e.g. ``LOOP_SWITCH``)
    and a message for people, cut to ``MAX_ERROR_CODE`` and ``MAX_ERROR_MESSAGE``
    characters (a peer's too). Unknown keys are tolerated (details may be added)."""

    code: str = attrs.field(converter=_cut_code)
    message: str = attrs.field(converter=_cut_message)


# -- event traffic (batched) ------------------------------------------------------------


@attrs.frozen
class SessionEvent:
    """One session-log event ``{type, seq, time, data}`` of session ``session_id``.

    The event object and its ``data`` belong to DSH: unknown keys inside ``event`` are
    tolerated (and dropped), ``data`` is kept as it came.
    """

    session_id: SessionId
    event: Event


@attrs.frozen
class Events:
    items: tuple[SessionEvent, ...]


@attrs.frozen
class Live:
    """Live agent events (``agent/created``, ``agent/status``, ``agent/inbox/*``,
    ``agent/disposed``, and whatever else DSH emits): ``type`` is not restricted."""

    items: tuple[LiveEvent, ...]


# -- runtime -> host commands, answered by ack -------------------------------------------


@attrs.frozen
class Followup:
    """Put ``message`` (a DSH message ``{id, role, content, source}``) into the exact live
    agent's inbox with ``placement``: ``followup`` (next turn, wakes it), ``steer`` (next
    step, wakes it) or ``inject`` (next step, no wake)."""

    agent_id: str
    message: Mapping[str, Any]
    placement: Placement = "followup"


@attrs.frozen
class Wake:
    """Wake an idle agent whose inbox stalled (DSH leaves it so after a pre-step reject)."""

    agent_id: str


@attrs.frozen
class Cancel:
    agent_id: str
    cause: str
    keep_inbox: bool = True


@attrs.frozen
class Ack:
    """``ok`` false with ``error``: the host understood the command and could not do it
    (e.g. the agent is not live); a malformed command gets an ``error`` frame instead."""

    ok: bool
    error: ErrorNotice | None = None


# -- host -> runtime requests ------------------------------------------------------------


@attrs.frozen
class PreStep:
    """DSH's ``agent/pre-step``: ``messages`` (DSH messages) are about to enter step
    ``step`` of turn ``turn``. The host asks only for messages whose source kind the
    runtime owns, with a deadline, and rejects if no verdict arrives in time."""

    agent_id: SessionId
    session_id: SessionId
    turn: int
    step: int
    messages: tuple[Mapping[str, Any], ...]


@attrs.frozen
class Verdict:
    kind: Literal["enter", "reject"]
    reason: str | None = None


@attrs.frozen
class StoredBinding:
    """A loop-dock binding as DSH's session log stores it (``agent-preset/selected``'s
    ``data.agentLoopDock``): ``loop``, and ``driver`` unless the loop is a driver loop."""

    loop: str
    driver: str | None = None


@attrs.frozen
class Select:
    """Dock mode: DSH is about to create or resume ``session_id``; which loop and driver?

    On a resume, ``binding`` is the newest valid binding in the session's own log (read by
    the host before the session is loaded; absent if the log holds none): the durable
    record the dock judges the resume against."""

    op: Literal["create", "resume"]
    session_id: SessionId
    agent_options: Mapping[str, Any] = attrs.field(factory=dict)
    agent_preset: str | None = None
    binding: StoredBinding | None = None


@attrs.frozen
class SelectionParts:
    """What DSH applies for a strategy, declaratively: a preset to mount, tool allow/deny
    lists, and a provider/model pin. ``None`` means "leave as is"."""

    preset: str | None = None
    allow_tools: tuple[str, ...] | None = None
    deny_tools: tuple[str, ...] | None = None
    provider: str | None = None
    model: str | None = None


@attrs.frozen
class Selection:
    """The dock's decision: ``loop`` on ``driver`` (``None``: DSH's default driver)."""

    loop: str
    driver: str | None = None
    parts: SelectionParts = SelectionParts()


@attrs.frozen
class Mirrored:
    """Sent by the host after each ``welcome``: how far does the runtime's mirror of
    each of ``session_ids`` reach? The host then sends each session's log from the seq
    after the answer's (from 0 for a session the answer leaves out, and for every session
    if the request fails), instead of every log from 0."""

    session_ids: tuple[SessionId, ...]


#: session id -> the last seq mirrored (a non-negative integer)
SeqMap = Mapping[str, int]


@attrs.frozen
class MirroredSeqs:
    """The answer to ``mirrored``: ``seqs`` maps a session id to the highest seq the
    runtime mirrors of it (every one below it is mirrored too, or was lost for good and
    reported as a gap). A session the runtime knows nothing of is left out; a runtime
    that mirrors nothing answers ``{}``."""

    seqs: SeqMap


@attrs.frozen
class RunCommand:
    """A DSH user ran a command that the plugin registers on the runtime's behalf
    (``/loopx-init``) in the exact live agent ``agent_id``: the runtime carries it out and
    answers ``commandDone``. ``args`` is the rest of the command line."""

    agent_id: SessionId
    name: str
    args: str = ""


@attrs.frozen
class CommandDone:
    """How the command ended: ``ok``, a short ``message`` for people, and its typed
    ``data`` (an opaque JSON object)."""

    ok: bool
    message: str
    data: Mapping[str, Any] = attrs.field(factory=dict)


# -- GoalBar (goalbar -> runtime requests, runtime -> goalbar state) -----------------------


@attrs.frozen
class GoalbarView:
    """The bar for one session as the page shows it (``bridge._goalbar``'s states,
    flattened): ``hidden`` with a ``reason`` (and a safe ``detail``), or ``visible`` with
    the bound goal, its lifecycle state and the agent lane's progress; ``pending`` while a
    Start/Pause runs, ``error`` when the last one failed or was not verified;
    ``continuation`` (a state: ``armed``, ``queued``, ``working``, ``waiting``, ``quiet``,
    ``paused``, ``stopped``, ``needs-person``, ``failed``, ``inactive``) and
    ``continuation_reason`` say what the session's LoopX continuation does and why;
    ``agent_running``: the session's agent is in a turn (Start waits for it)."""

    kind: Literal["hidden", "visible"]
    session_id: str
    reason: str | None = None
    detail: str | None = None
    goal_id: str | None = None
    agent_id: str | None = None
    goal_text: str | None = None
    lifecycle_state: str | None = None
    processed: int | None = None
    remaining: int | None = None
    total: int | None = None
    pending: bool = False
    error: str | None = None
    continuation: str | None = None
    continuation_reason: str | None = None
    agent_running: bool | None = None


@attrs.frozen
class GoalbarRead:
    """A fresh read of the bar for ``session_id`` (from LoopX)."""

    session_id: str


@attrs.frozen
class GoalbarWatch:
    """Like ``goalbarRead``, then ``goalbar`` frames with every change, until the
    connection ends."""

    session_id: str


@attrs.frozen
class GoalbarStart:
    """Resume the goal bound to ``session_id``. ``goal_id``/``agent_id``: the binding the
    page showed; a different binding at click time is refused (``stale-binding``)."""

    session_id: str
    goal_id: str | None = None
    agent_id: str | None = None


@attrs.frozen
class GoalbarPause:
    """Stop the goal bound to ``session_id`` (see ``goalbarStart``)."""

    session_id: str
    goal_id: str | None = None
    agent_id: str | None = None


@attrs.frozen
class GoalbarResult:
    """The answer to every GoalBar request: ``outcome`` is ``read`` for a read or watch,
    else ``done``, ``refused`` or ``failed`` (with a ``reason``); ``state`` is the bar after.
    ``warnings`` (of a ``done``): what went wrong after LoopX applied it
    (``driver-sync-failed``, ``post-read-failed``)."""

    state: GoalbarView
    outcome: Literal["read", "done", "refused", "failed"] = "read"
    reason: str | None = None
    warnings: tuple[str, ...] | None = None


@attrs.frozen
class Goalbar:
    """The bar changed (pushed to a page that sent ``goalbarWatch``)."""

    state: GoalbarView


GOALBAR_REQUESTS = (GoalbarRead, GoalbarWatch, GoalbarStart, GoalbarPause)


# -- approvals (console page -> runtime, runtime -> DSH host) ----------------------------

#: Longest approval id a page may name (the runtime's are ``ap-`` and 16 hex digits).
MAX_APPROVAL_ID = 64
#: Longest reason a page may give with a refusal (it goes into the log and to the model).
MAX_APPROVAL_REASON = 2000

#: An approval question's id (decoding checks its length: BAD_DATA).
ApprovalId = Annotated[str, "approval id"]
#: A person's reason for a refusal (decoding checks its length: BAD_DATA).
ApprovalReason = Annotated[str, "approval reason"]


@attrs.frozen
class AnswerApproval:
    """A person answers the open question ``approval_id`` of the runtime agent
    ``agent_id`` from a console page: ``approve`` (the call runs) or ``refuse`` (the
    model reads ``refused by a person: <reason>`` as the call's error). Answered with
    ``approvalDone``, or an ``error``: ``APPROVAL_CLOSED`` (answered already, from any
    surface, withdrawn, or never asked), ``UNKNOWN_AGENT``, ``NOT_SERVED`` (the
    connection is not a console page).

    The runtime sends the same request to a DSH host for a question DSH's approval service
    asked (``approval/asked`` in the DSH agent's log; its id is DSH's): the host answers
    ``approvalDone`` once DSH logged the decision (``approval/decided``: ``allowed-once``
    or ``rejected``; DSH's outcome carries no reason), or ``APPROVAL_CLOSED`` (DSH's own
    surfaces answered first, the turn was cancelled, or the host does not hold it)."""

    agent_id: SessionId
    approval_id: ApprovalId
    decision: Literal["approve", "refuse"]
    reason: ApprovalReason | None = None


@attrs.frozen
class ApprovalDone:
    """The answer is durable (the question's ``approval/answered`` is in the log; on a
    DSH host, DSH's ``approval/decided``)."""

    agent_id: str
    approval_id: str
    decision: Literal["approve", "refuse"]


# -- liveness --------------------------------------------------------------------------


@attrs.frozen
class Ping:
    pass


@attrs.frozen
class Pong:
    pass


BridgeMessage = (
    Hello | Welcome | ErrorNotice | Events | Live | Followup | Wake | Cancel | Ack
    | PreStep | Verdict | Select | Selection | Mirrored | MirroredSeqs | RunCommand | CommandDone | Ping | Pong
    | GoalbarRead | GoalbarWatch | GoalbarStart | GoalbarPause | GoalbarResult | Goalbar
    | AnswerApproval | ApprovalDone
)

#: Wire ``type`` -> class.
MESSAGE_TYPES: Mapping[str, type[Any]] = MappingProxyType(
    {
        "hello": Hello,
        "welcome": Welcome,
        "error": ErrorNotice,
        "events": Events,
        "live": Live,
        "followup": Followup,
        "wake": Wake,
        "cancel": Cancel,
        "ack": Ack,
        "preStep": PreStep,
        "verdict": Verdict,
        "select": Select,
        "selection": Selection,
        "mirrored": Mirrored,
        "mirroredSeqs": MirroredSeqs,
        "command": RunCommand,
        "commandDone": CommandDone,
        "ping": Ping,
        "pong": Pong,
        "goalbarRead": GoalbarRead,
        "goalbarWatch": GoalbarWatch,
        "goalbarStart": GoalbarStart,
        "goalbarPause": GoalbarPause,
        "goalbarResult": GoalbarResult,
        "goalbar": Goalbar,
        "approval": AnswerApproval,
        "approvalDone": ApprovalDone,
    }
)
TYPE_NAMES: Mapping[type[Any], str] = MappingProxyType({cls: name for name, cls in MESSAGE_TYPES.items()})

#: Request class -> the class of its reply (an ``error`` frame may answer any request).
REPLY_TYPES: Mapping[type[Any], type[Any]] = MappingProxyType(
    {Followup: Ack, Wake: Ack, Cancel: Ack, PreStep: Verdict, Select: Selection, Mirrored: MirroredSeqs,
     RunCommand: CommandDone, Ping: Pong, AnswerApproval: ApprovalDone,
     **{cls: GoalbarResult for cls in GOALBAR_REQUESTS}}
)
REPLIES = frozenset(REPLY_TYPES.values())


def _check_id(name: str, value: str | None) -> None:
    if value is not None and not (0 < len(value) <= MAX_ID_LENGTH):
        raise ProtocolError(
            ErrorCode.BAD_ENVELOPE, f"{name!r} must be 1 to {MAX_ID_LENGTH} characters"
        )


@attrs.frozen
class Frame:
    """One wire frame: a message, and its correlation ids.

    ``id`` names a request (required on requests, absent otherwise); ``re`` is the id of
    the request a reply answers (required on replies, optional on ``error``, absent
    otherwise). A frame that breaks these rules cannot be built (BAD_ENVELOPE).
    """

    message: BridgeMessage
    id: str | None = None
    re: str | None = None

    def __attrs_post_init__(self) -> None:
        cls = type(self.message)
        name = TYPE_NAMES.get(cls)
        if name is None:
            raise TypeError(f"{cls.__name__} is not a bridge message")
        _check_id("id", self.id)
        _check_id("re", self.re)
        if cls in REPLY_TYPES:
            if self.id is None or self.re is not None:
                raise ProtocolError(
                    ErrorCode.BAD_ENVELOPE,
                    f"{name} is a request: it needs an 'id' and has no 're'",
                    request_id=self.id,
                )
        elif cls in REPLIES:
            if self.re is None or self.id is not None:
                raise ProtocolError(
                    ErrorCode.BAD_ENVELOPE, f"{name} is a reply: it needs an 're' and has no 'id'"
                )
        elif self.id is not None or (self.re is not None and cls is not ErrorNotice):
            raise ProtocolError(
                ErrorCode.BAD_ENVELOPE,
                f"{name} is neither a request nor a reply: it has no 'id'"
                + ("" if cls is ErrorNotice else " and no 're'"),
            )

    @property
    def type(self) -> str:
        return TYPE_NAMES[type(self.message)]
