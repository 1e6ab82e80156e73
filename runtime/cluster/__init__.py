"""The cluster's infrastructure on Redis: key layout, Lua scripts, the session store that
any worker can continue, and the wire form of inbox messages (see docs/cluster.md)."""

from .._errors import ClusterConfigError as ClusterConfigError
from .._errors import ClusterUnreachableError as ClusterUnreachableError
from .._errors import ClusterUrlError as ClusterUrlError
from . import keys as keys
from ._connect import RETRYABLE as RETRYABLE
from ._connect import check_url as check_url
from ._connect import cluster_shards as cluster_shards
from ._connect import connect as connect
from ._connect import live_workers as live_workers
from ._connect import redact as redact
from ._ownership import Ownership as Ownership
from ._ownership import Pending as Pending
from ._resp import RedisReplyError as RedisReplyError
from ._resp import RespConnection as RespConnection
from ._resp import RespConnectionError as RespConnectionError
from ._scripts import ACQUIRE as ACQUIRE
from ._scripts import DONE as DONE
from ._scripts import HEARTBEAT as HEARTBEAT
from ._scripts import LEAVE as LEAVE
from ._scripts import RELEASE as RELEASE
from ._scripts import RENEW as RENEW
from ._scripts import SETTLE as SETTLE
from ._store import CONSUMING_TYPES as CONSUMING_TYPES
from ._store import RedisSessionStore as RedisSessionStore
from ._store import consumed_ids as consumed_ids
from ._store import decode_event as decode_event
from ._store import mark_of as mark_of
from ._wire import BadInboxMessageError as BadInboxMessageError
from ._wire import InboxMessage as InboxMessage
from .keys import DEFAULT_SHARDS as DEFAULT_SHARDS
from .keys import shard_of as shard_of
