"""The runtime's error set: one base class, a stable ``code`` on every error.

Each class's docstring says *when* it is raised. Callers branch on the class (or on
``.code`` across a wire); messages name the offending value and, where it helps,
what would have been accepted.
"""

from __future__ import annotations


class LoopdockError(Exception):
    """Base class of every error the runtime raises on purpose."""

    code = "LOOPDOCK_ERROR"


class InvalidSessionIdError(LoopdockError):
    """Raised when a session id is missing, empty, too long or has forbidden characters."""

    code = "INVALID_SESSION_ID"


class UnknownEventTypeError(LoopdockError):
    """Raised when something appends an event type the session log does not know.

    DSH refuses to load a log with an unknown type, so we refuse to write one.
    """

    code = "UNKNOWN_EVENT_TYPE"


class InvalidOptionsError(LoopdockError):
    """Raised when agent options are malformed (``max_tokens <= 0``, wrong types, ...)."""

    code = "INVALID_OPTIONS"


class UnknownAdapterError(LoopdockError):
    """Raised when agent options name a model provider no adapter is registered for."""

    code = "UNKNOWN_ADAPTER"


class UnknownToolError(LoopdockError):
    """Raised when agent options or a restriction name a tool that is not registered."""

    code = "UNKNOWN_TOOL"


class DuplicateToolError(LoopdockError):
    """Raised when a tool name is registered twice in the same scope."""

    code = "DUPLICATE_TOOL"


class SessionExistsError(LoopdockError):
    """Raised when creating a session whose id is already persisted or live."""

    code = "SESSION_EXISTS"


class SessionNotFoundError(LoopdockError):
    """Raised when resuming or forking a session that is not persisted."""

    code = "SESSION_NOT_FOUND"


class AgentBusyError(LoopdockError):
    """Raised when resuming a session whose agent is already live in this runtime."""

    code = "AGENT_BUSY"


class SetupError(LoopdockError):
    """Raised when a setup or commit fails during the publication transaction.

    The original exception is chained as ``__cause__``; nothing was published.
    """

    code = "SETUP_FAILED"


class StoreUnusableError(LoopdockError):
    """Raised by ``Runtime.open`` when the session store stopped working under a running
    runtime (its writer failed): nothing more can be made durable, so the runtime ends."""

    code = "STORE_UNUSABLE"


class AgentClosedError(LoopdockError):
    """Raised when a message is sent to an agent that was disposed."""

    code = "AGENT_CLOSED"


class AgentPassivatedError(LoopdockError):
    """Raised when reading what only an active agent holds in memory (its options, tools,
    in-memory session) from a passivated one: ``await agent.activate()`` brings it back.
    Messages never raise it: they reactivate the agent (docs/lifecycle.md)."""

    code = "AGENT_PASSIVATED"


class AgentReactivationError(LoopdockError):
    """Raised by ``wait_idle`` or ``activate`` when bringing a passivated agent back failed
    (a setup raised, its loop or driver is gone, the store cannot be read): the messages
    sent to it stay queued, and the next message or ``activate()`` tries again."""

    code = "AGENT_REACTIVATION_FAILED"


class MessageRefusedError(LoopdockError):
    """Raised by an agent's ``wait_idle`` when a message sent through that agent (a
    followup, steer or inject) was refused by the host that runs the agent, a cluster
    worker or a DSH host: it never entered the agent's inbox. ``message_id`` names the
    message; ``host_code`` and ``reason`` are the host's (e.g. ``SESSION_NOT_FOUND``).
    Each refusal is raised once, by the next ``wait_idle`` after it is known, oldest first.
    (A refused reservation is not raised: it settles ``cancelled`` with the reason.)"""

    code = "MESSAGE_REFUSED"

    def __init__(self, message_id: str, host_code: str, reason: str) -> None:
        super().__init__(f"message {message_id} was refused by its host: {host_code}: {reason}")
        self.message_id = message_id
        self.host_code = host_code
        self.reason = reason


class ApprovalClosedError(LoopdockError):
    """Raised by ``approval.answer(...)`` when the question is not open: another answer
    came first (two answers race, one wins), it was withdrawn (its turn was cancelled),
    or no such question was asked of this agent."""

    code = "APPROVAL_CLOSED"


class EventsTrimmedError(LoopdockError):
    """Raised by ``session.events_since(i)`` when events from ``i`` on were trimmed from
    memory: they are in the store, and ``await session.read_events(i)`` reads them."""

    code = "EVENTS_TRIMMED"


class TranscriptNotInMemoryError(LoopdockError):
    """Raised by ``agent.transcript`` outside a turn when the idle agent's history was
    evicted to the store: ``await agent.read_transcript()`` reads it back."""

    code = "TRANSCRIPT_NOT_IN_MEMORY"


class SubscriberDroppedError(LoopdockError):
    """Raised from a subscription's iterator when the subscriber fell behind and was dropped.

    ``reason`` says why (``"fell-behind"``); the subscriber never blocked the publisher.
    """

    code = "SUBSCRIBER_DROPPED"

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class ModelError(LoopdockError):
    """Raised by a model adapter when a call fails for good (after its bounded retries)."""

    code = "MODEL_ERROR"


class ModelRejectedError(ModelError):
    """Raised by a model adapter when the server refuses the call with a 4xx answer
    other than 429 (a bad key, an unknown model, a malformed request), or when the
    variable named for its key is unset: never retried, as repeating it cannot help.
    ``status`` is the HTTP status (0 when no request was sent)."""

    code = "MODEL_REJECTED"

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class ModelStreamBrokenError(ModelError):
    """Raised by a model adapter when a stream breaks off after it yielded a chunk:
    repeating the call could duplicate text or tool calls, so it is not retried."""

    code = "MODEL_STREAM_BROKEN"


class ToolError(LoopdockError):
    """Raised by a tool for a failure the model should see as the tool's result."""

    code = "TOOL_ERROR"


def safe_message(exc: BaseException) -> str:
    """A short error text fit for a log or a peer: ``CODE: message`` for our own errors,
    only the type name for anything else (its text may carry paths or secrets)."""
    if isinstance(exc, LoopdockError):
        return f"{exc.code}: {exc}"[:500]
    if isinstance(exc, BaseExceptionGroup):
        return f"{type(exc).__name__}({', '.join(safe_message(e) for e in exc.exceptions)})"[:500]
    return type(exc).__name__


# -- past one process (the cluster) and the bridge's port: defined here, where nothing
# needs coredis or a socket, so that every error a user may catch imports from loopdock.


class ClusterUrlError(LoopdockError):
    """The cluster URL is not ``redis://HOST:PORT/DB``."""

    code = "BAD_CLUSTER_URL"


class ClusterConfigError(LoopdockError):
    """A worker's settings disagree with the cluster's (shard count, lease ttl)."""

    code = "CLUSTER_CONFIG"


class ClusterUnreachableError(LoopdockError):
    """The cluster's Redis did not answer a process joining it (a wrong host or port, or
    Redis not running)."""

    code = "CLUSTER_UNREACHABLE"


class RegistryMismatchError(LoopdockError):
    """This worker's loops and drivers differ from the live workers' (see docs/cluster.md)."""

    code = "REGISTRY_MISMATCH"


class ClusterRequestError(LoopdockError):
    """A worker refused a request (its code is the worker's, e.g. UNKNOWN_LOOP)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class NoWorkerError(LoopdockError):
    """No worker answered in time (is ``loopdock worker --cluster`` running?)."""

    code = "NO_WORKER"


class PortInUseError(LoopdockError):
    """Raised when the bridge's port is taken (another ``serve``, or any program)."""

    code = "PORT_IN_USE"
