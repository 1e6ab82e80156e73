"""Opening the cluster's Redis from a ``redis://HOST:PORT/DB`` URL."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import coredis

from .._errors import ClusterConfigError, ClusterUnreachableError, ClusterUrlError
from . import keys
from ._scripts import LIVE_WORKERS

#: Errors after which a command is worth trying again on a new connection.
RETRYABLE = (coredis.exceptions.ConnectionError, TimeoutError, OSError)



def check_url(url: str) -> str:
    """``url`` if it is ``redis://HOST[:PORT][/DB]`` (a password may be in it); else
    ClusterUrlError, naming what is wrong without repeating a password."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ClusterUrlError(f"cluster URL is not redis://HOST:PORT/DB: {exc}") from None
    if parts.scheme != "redis" or not parts.hostname:
        raise ClusterUrlError(f"cluster URL must look like redis://HOST:PORT/DB, not scheme {parts.scheme!r}")
    db = parts.path.strip("/")
    if db and not db.isdigit():
        raise ClusterUrlError(f"cluster URL's database must be a number, got {db[:20]!r}")
    if parts.query or parts.fragment:
        raise ClusterUrlError("cluster URL takes no query or fragment")
    del port
    return url


def redact(url: str) -> str:
    """``url`` without its password, for logs and messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    user = parts.username or ""
    return parts._replace(netloc=f"{user}:***@{host}{port}").geturl()


def connect(url: str) -> coredis.Redis[str]:
    """A client (a pool of connections) for the cluster at ``url``; use it in ``async with``."""
    return coredis.Redis.from_url(check_url(url), decode_responses=True)




async def cluster_shards(redis: Any, wanted: int | None) -> int:
    """The cluster's shard count: set by its first worker, fixed after that. The first
    contact with the cluster: ClusterUnreachableError if its Redis does not answer."""
    if wanted is not None and not 1 <= wanted <= 16_384:
        raise ClusterConfigError(f"shards must be between 1 and 16384, got {wanted}")
    try:
        await redis.hsetnx(keys.META, "shards", str(wanted or keys.DEFAULT_SHARDS))
        have = int(await redis.hget(keys.META, "shards"))
    except RETRYABLE as exc:
        raise ClusterUnreachableError(f"cannot reach the cluster's Redis: {exc}") from None
    if wanted is not None and wanted != have:
        raise ClusterConfigError(f"the cluster has {have} shards; this worker was asked for {wanted}")
    return have


async def live_workers(redis: Any) -> dict[str, str]:
    """The cluster's live workers, each with its registry fingerprint (its loops and
    drivers, as ``loopdock worker`` announced them)."""
    reply: Any = await redis.register_script(LIVE_WORKERS)(keys=[keys.WORKERS])
    items = [str(x) for x in reply]
    return dict(zip(items[0::2], items[1::2], strict=True))  # worker, fingerprint pairs
