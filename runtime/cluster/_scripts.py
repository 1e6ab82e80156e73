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

#: A commit: every session's part, in one call. Per session 8 KEYS: lease, header, log,
#: sessions, done, human inbox, auto inbox, marks. ARGV: the number of sessions, then per
#: session: token ('' to create a session without a lease), header JSON ('' to append),
#: created_at, session id, group, event count, then per event seq, type, time, data; then
#: the count of processed message ids and the ids; then the count of entries to
#: acknowledge and per entry its lane ('human'/'auto') and entry id; then the commit's
#: mark ('' for none), added to the marks stream under the log id of its last event.
#: Each session's part is checked before anything of it is written (a Lua script is not
#: rolled back), and stands alone: one refused leaves the others as they are.
#: Returns, per session, OK, FENCED (the lease is not this token's), EXISTS (creating a
#: session that exists), UNKNOWN (appending to one that does not) or SEQ:<next seq> (a gap
#: or repeat). A log's entries are seqs 0, 1, ... with none ever removed, so its length is
#: its next seq.
COMMIT = """
local function commit(k, i)
  local token, header = ARGV[i], ARGV[i + 1]
  local n = tonumber(ARGV[i + 5])
  local first = i + 6
  local ids_at = first + 4 * n
  local ids = tonumber(ARGV[ids_at])
  local acks_at = ids_at + 1 + ids
  if token ~= '' and redis.call('GET', KEYS[k + 1]) ~= token then return 'FENCED' end
  if header ~= '' then
    if redis.call('EXISTS', KEYS[k + 2]) == 1 then return 'EXISTS' end
  else
    if token == '' then return 'FENCED' end
    if redis.call('EXISTS', KEYS[k + 2]) == 0 then return 'UNKNOWN' end
  end
  if n > 0 then
    local nextseq = redis.call('XLEN', KEYS[k + 3])
    if tonumber(ARGV[first]) ~= nextseq then return 'SEQ:' .. nextseq end
  end
  if header ~= '' then
    redis.call('SET', KEYS[k + 2], header)
    redis.call('ZADD', KEYS[k + 4], ARGV[i + 2], ARGV[i + 3])
  end
  local e = first
  for _ = 1, n do
    redis.call('XADD', KEYS[k + 3], '0-' .. (tonumber(ARGV[e]) + 1), 't', ARGV[e + 1], 'm', ARGV[e + 2], 'd', ARGV[e + 3])
    e = e + 4
  end
  for j = ids_at + 1, ids_at + ids do
    redis.call('SADD', KEYS[k + 5], ARGV[j])
  end
  local acks = tonumber(ARGV[acks_at])
  for j = acks_at + 1, acks_at + 2 * acks, 2 do
    local stream = KEYS[k + 6]
    if ARGV[j] == 'auto' then stream = KEYS[k + 7] end
    redis.call('XACK', stream, ARGV[i + 4], ARGV[j + 1])
  end
  local mark = ARGV[acks_at + 1 + 2 * acks]
  if mark ~= '' and n > 0 then
    redis.call('XADD', KEYS[k + 8], '0-' .. (tonumber(ARGV[first]) + n), 'k', mark)
  end
  return 'OK'
end
local out = {}
local i = 2
for s = 1, tonumber(ARGV[1]) do
  out[s] = commit((s - 1) * 8, i)
  local n = tonumber(ARGV[i + 5])
  local ids_at = i + 6 + 4 * n
  local acks_at = ids_at + 1 + tonumber(ARGV[ids_at])
  i = acks_at + 2 + 2 * tonumber(ARGV[acks_at])
end
return out
"""

#: A control message is done, or a message refused, or a session's activation changes:
#: KEYS lease, done, inbox stream, live set, passive set, and for a refusal the sender's
#: refusal stream.
#: ARGV: token, message id ('' for none), group, entry id ('' for none), the op on the
#: shard's sets, session id; for a refusal also its code, its reason, the stream's ttl in
#: ms and its length cap. The ops: 'add' (live, not passivated), 'remove' (neither),
#: 'wake' (not passivated: before its agent is rebuilt), 'passive' (passivated, if it is
#: live: its agent was let go of, its log flushed), '' (none).
#: FENCED, or OK after recording the id, updating the sets, telling the sender of a
#: refusal and acknowledging: a refusal is told exactly when the message is done, and a
#: session is marked passivated only by the lease's holder.
SETTLE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 'FENCED' end
if ARGV[2] ~= '' then redis.call('SADD', KEYS[2], ARGV[2]) end
local op = ARGV[5]
if op == 'add' then redis.call('SADD', KEYS[4], ARGV[6]) end
if op == 'remove' then redis.call('SREM', KEYS[4], ARGV[6]) end
if op == 'add' or op == 'remove' or op == 'wake' then redis.call('SREM', KEYS[5], ARGV[6]) end
if op == 'passive' and redis.call('SISMEMBER', KEYS[4], ARGV[6]) == 1 then redis.call('SADD', KEYS[5], ARGV[6]) end
if #KEYS > 5 then
  redis.call('XADD', KEYS[6], 'MAXLEN', '~', ARGV[10], '*', 'id', ARGV[2], 'session', ARGV[6], 'code', ARGV[7],
             'reason', ARGV[8])
  redis.call('PEXPIRE', KEYS[6], ARGV[9])
end
if ARGV[4] ~= '' then redis.call('XACK', KEYS[3], ARGV[3], ARGV[4]) end
return 'OK'
"""

#: Which messages are done already: KEYS their sessions' done sets, ARGV their ids (one
#: per key, in order). 1 per message done, 0 per one not.
DONE = """
local out = {}
for i, key in ipairs(KEYS) do
  out[i] = redis.call('SISMEMBER', key, ARGV[i])
end
return out
"""
