"""The cluster's infrastructure on Redis: key layout, Lua scripts, the session store that
any worker can continue, and the wire form of inbox messages (see docs/cluster.md)."""

from ._connect import RETRYABLE as RETRYABLE
from ._connect import ClusterConfigError as ClusterConfigError
from ._connect import ClusterUnreachableError as ClusterUnreachableError
from ._connect import ClusterUrlError as ClusterUrlError
from ._connect import check_url as check_url
from ._connect import cluster_shards as cluster_shards
from ._connect import connect as connect
from ._connect import live_workers as live_workers
from ._connect import redact as redact
from ._keys import DEFAULT_SHARDS as DEFAULT_SHARDS
from ._keys import shard_of as shard_of
from ._ownership import Ownership as Ownership
from ._ownership import Pending as Pending
from ._store import RedisSessionStore as RedisSessionStore
from ._store import consumed_ids as consumed_ids
from ._wire import BadInboxMessageError as BadInboxMessageError
from ._wire import InboxMessage as InboxMessage
