"""Where the cluster keeps things in Redis, and which shard a session belongs to.

Every key starts with ``loopdock:``. Per shard ``n``: the lease (``lease:n``), its
fencing counter (``epoch:n``), the two inbox streams (``inbox:n:human``,
``inbox:n:auto``), the set of sessions live on it (``live:n``: created or resumed, not
disposed) and, of those, the ones passivated (``passive:n``: no agent in memory; a new
owner resumes the live ones that are not, and activates the others on their next
message). Per session ``s``: its header (``s:s:header``), its log as a stream
whose entry ids are ``0-<seq + 1>`` (``s:s:log``), and the ids of the messages it has
processed (``s:s:done``) and one mark per commit (``s:s:marks``, for the clients that wait). Cluster-wide: ``meta`` (shard count), ``workers`` (a sorted
set of live workers by lease expiry) and ``sessions`` (every session id by creation). Per
client ``c``: the replies to its requests (``reply:<message id>``) and the stream of its
messages that workers refused (``refused:c``).
"""

from __future__ import annotations

import zlib

PREFIX = "loopdock:"
META = PREFIX + "meta"
WORKERS = PREFIX + "workers"
SESSIONS = PREFIX + "sessions"
#: The consumer group every inbox stream has: one group, read only by the shard's owner.
GROUP = "owner"
#: How many shards a new cluster gets (fixed for the cluster's life: see docs/cluster.md).
DEFAULT_SHARDS = 32
LANES = ("human", "auto")


def shard_of(session_id: str, shards: int) -> int:
    return zlib.crc32(session_id.encode("utf-8")) % shards


def lease(shard: int) -> str:
    return f"{PREFIX}lease:{shard}"


def epoch(shard: int) -> str:
    return f"{PREFIX}epoch:{shard}"


def inbox(shard: int, lane: str) -> str:
    return f"{PREFIX}inbox:{shard}:{lane}"


def live(shard: int) -> str:
    return f"{PREFIX}live:{shard}"


def passive(shard: int) -> str:
    """The shard's live sessions whose agents are passivated (docs/cluster.md, "Takeover")."""
    return f"{PREFIX}passive:{shard}"


def header(session_id: str) -> str:
    return f"{PREFIX}s:{session_id}:header"


def log(session_id: str) -> str:
    return f"{PREFIX}s:{session_id}:log"


def session_of_log(key: str) -> str:
    """The session id in a log stream's key (``log``'s inverse)."""
    return key[len(PREFIX) + 2 : -len(":log")]


def done(session_id: str) -> str:
    return f"{PREFIX}s:{session_id}:done"


def marks(session_id: str) -> str:
    """The stream of what a session's commits made of its log that a client waiting for
    the agent to be idle needs (``runtime.cluster._store.mark_of``): one entry per commit,
    whose id is the log's (``log_id``) of the commit's last event."""
    return f"{PREFIX}s:{session_id}:marks"


def reply(message_id: str) -> str:
    return f"{PREFIX}reply:{message_id}"


def refused(client_id: str) -> str:
    """The stream of a client's messages that workers refused (read by its ``wait_idle``)."""
    return f"{PREFIX}refused:{client_id}"


def log_id(seq: int) -> str:
    """The log stream's entry id of event ``seq`` (ids start above ``0-0``)."""
    return f"0-{seq + 1}"


def seq_of(entry_id: str) -> int:
    return int(entry_id.partition("-")[2]) - 1
