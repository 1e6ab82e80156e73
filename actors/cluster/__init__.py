"""The cluster's actors: a worker's lease keeper (which shards it owns) and its shard
host (which runs their agents from their inboxes). See docs/cluster.md."""

from ._host import ShardHost as ShardHost
from ._leases import LeaseKeeper as LeaseKeeper
