"""The cluster's Lua scripts: each runs atomically in Redis, so a check and the writes it
guards cannot interleave with another worker's.

Fencing: a lease's value is its token ``<worker>/<epoch>``, the epoch from ``INCR`` on
the shard's counter, so every new owner has a token no earlier owner had. Every write an
owner makes to a session's log is conditional on the lease still holding its token: an
owner that was paused past its lease (or cut off from Redis) finds its writes refused
with ``FENCED`` after another worker took the shard, whatever its own clock says.
"""

from __future__ import annotations

#: KEYS: lease, epoch. ARGV: worker id, ttl ms. The new token, or false if the lease is held.
ACQUIRE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return false end
local token = ARGV[1] .. '/' .. redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], token, 'PX', ARGV[2])
return token
"""

#: KEYS: leases. ARGV: ttl ms, then one token per lease. 1 per lease still held (and
#: extended), 0 per lease lost.
RENEW = """
local held = {}
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[i + 1] then
    redis.call('PEXPIRE', key, ARGV[1])
    held[i] = 1
  else
    held[i] = 0
  end
end
return held
"""

#: KEYS: lease. ARGV: token. Deletes the lease only if it is still this token's.
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

#: KEYS: workers. ARGV: worker id, ttl ms, registry fingerprint.
#: Joins (or stays in) the set of live workers and drops the ones whose time ran out (by
#: Redis's clock, so workers' clocks need not agree). Returns the live workers, then each
#: one's fingerprint, then the server time in ms.
HEARTBEAT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('HSET', KEYS[1] .. ':registry', ARGV[1], ARGV[3])
local live = redis.call('ZRANGE', KEYS[1], 0, -1)
local out = {}
for _, w in ipairs(live) do
  table.insert(out, w)
  table.insert(out, redis.call('HGET', KEYS[1] .. ':registry', w) or '')
end
table.insert(out, tostring(now))
return out
"""

#: KEYS: workers. Reads only: the live workers (by Redis's clock) and each one's
#: fingerprint, as pairs.
LIVE_WORKERS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
for _, w in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')) do
  table.insert(out, w)
  table.insert(out, redis.call('HGET', KEYS[1] .. ':registry', w) or '')
end
return out
"""

#: KEYS: workers. ARGV: worker id. Leaves the set of live workers.
LEAVE = """
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[1] .. ':registry', ARGV[1])
return 1
"""

#: One session's part of a commit.
#: KEYS: lease, header, log, sessions, done, human inbox, auto inbox.
#: ARGV: token ('' to create a session without a lease), header JSON ('' to append),
#:   created_at, session id, group, event count, then per event seq, type, time, data;
#:   then the count of processed message ids and the ids; then the count of entries to
#:   acknowledge and per entry its lane ('human'/'auto') and entry id.
#: Everything is checked before anything is written (a Lua script is not rolled back).
#: Returns OK, FENCED (the lease is not this token's), EXISTS (creating a session that
#: exists), UNKNOWN (appending to one that does not) or SEQ:<next seq> (a gap or repeat).
COMMIT = """
local token = ARGV[1]
local header = ARGV[2]
if token ~= '' and redis.call('GET', KEYS[1]) ~= token then return 'FENCED' end
if header ~= '' then
  if redis.call('EXISTS', KEYS[2]) == 1 then return 'EXISTS' end
else
  if token == '' then return 'FENCED' end
  if redis.call('EXISTS', KEYS[2]) == 0 then return 'UNKNOWN' end
end
local n = tonumber(ARGV[6])
local i = 7
if n > 0 then
  local nextseq = 0
  local last = redis.call('XREVRANGE', KEYS[3], '+', '-', 'COUNT', 1)
  if #last > 0 then nextseq = tonumber(string.match(last[1][1], '^0%-(%d+)$')) end
  if tonumber(ARGV[i]) ~= nextseq then return 'SEQ:' .. nextseq end
end
if header ~= '' then
  redis.call('SET', KEYS[2], header)
  redis.call('ZADD', KEYS[4], ARGV[3], ARGV[4])
end
for _ = 1, n do
  redis.call('XADD', KEYS[3], '0-' .. (tonumber(ARGV[i]) + 1), 't', ARGV[i + 1], 'm', ARGV[i + 2], 'd', ARGV[i + 3])
  i = i + 4
end
local ids = tonumber(ARGV[i])
i = i + 1
for _ = 1, ids do
  redis.call('SADD', KEYS[5], ARGV[i])
  i = i + 1
end
local acks = tonumber(ARGV[i])
i = i + 1
for _ = 1, acks do
  local stream = KEYS[6]
  if ARGV[i] == 'auto' then stream = KEYS[7] end
  redis.call('XACK', stream, ARGV[5], ARGV[i + 1])
  i = i + 2
end
return 'OK'
"""

#: A control message is done, or a message refused: KEYS lease, done, inbox stream, live
#: set, and for a refusal the sender's refusal stream.
#: ARGV: token, message id, group, entry id, live-set op ('add', 'remove' or ''), session
#: id; for a refusal also its code, its reason, the stream's ttl in ms and its length cap.
#: FENCED, or OK after recording the id, updating the live set, telling the sender of a
#: refusal and acknowledging: a refusal is told exactly when the message is done.
SETTLE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 'FENCED' end
if ARGV[2] ~= '' then redis.call('SADD', KEYS[2], ARGV[2]) end
if ARGV[5] == 'add' then redis.call('SADD', KEYS[4], ARGV[6]) end
if ARGV[5] == 'remove' then redis.call('SREM', KEYS[4], ARGV[6]) end
if #KEYS > 4 then
  redis.call('XADD', KEYS[5], 'MAXLEN', '~', ARGV[10], '*', 'id', ARGV[2], 'session', ARGV[6], 'code', ARGV[7],
             'reason', ARGV[8])
  redis.call('PEXPIRE', KEYS[5], ARGV[9])
end
if ARGV[4] ~= '' then redis.call('XACK', KEYS[3], ARGV[3], ARGV[4]) end
return 'OK'
"""
