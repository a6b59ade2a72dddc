"""The job store's own Lua (app/stores/jobs.py runs it): storing a window, sealing a job's
segment count, the listener leases. Each is one atomic script, safe to repeat; the admission
ledger's scripts are app/stores/ledger.py's."""

from __future__ import annotations

from app.stores.states import JobState, lua

# Events streams are wake-up signals, not a log: a few hundred entries is plenty.
EVENTS_MAXLEN = 500

# KEYS: job_keys, then the jobs' progress zset. ARGV: segment, window, pcm, now, ttl, samples,
# events maxlen, "count:window_frames" the writer plans (used when the segment has none yet),
# the window's timing JSON ('' for none: a writer from before word timestamps), the whole
# segment's samples (0 if unknown), the job's id. A stored window is progress for the stall
# sweeper too, in the same round trip (the progress zset is shared: it keeps no TTL).
STORE_WINDOW = lua("""
local segment = ARGV[1]
local window = ARGV[2]
local pcm = ARGV[3]
local now = ARGV[4]
local ttl = ARGV[5]
local samples = ARGV[6]
local events_maxlen = ARGV[7]
local planned = ARGV[8]
local timing = ARGV[9]
local segment_samples = ARGV[10]
local job_id = ARGV[11]
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return -2 end
if state == '$CANCELED' or state == '$FAILED' then return -1 end
redis.call('HSETNX', KEYS[5], segment, planned)
local plan = redis.call('HGET', KEYS[5], segment)
local count = tonumber(string.match(plan, '^(%d+)'))
local field = segment .. ':' .. window
redis.call('HSET', KEYS[2], field, pcm)
if timing and timing ~= '' then redis.call('HSET', KEYS[7], field, timing) end
if segment_samples and segment_samples ~= '0' then
  redis.call('HSETNX', KEYS[1], 'segment_samples_' .. segment, segment_samples)
end
if redis.call('SADD', KEYS[3], field) == 1 then
  redis.call('HINCRBY', KEYS[1], 'audio_samples_' .. segment, samples)
  if segment == '0' and window == '0' then
    redis.call('HSETNX', KEYS[1], 'first_chunk_at', now)
  end
  if redis.call('HINCRBY', KEYS[6], segment, 1) == count then
    redis.call('HINCRBY', KEYS[1], 'done', 1)
  end
end
redis.call('XADD', KEYS[4], 'MAXLEN', '~', events_maxlen, '*', 'chunk', field)
local done = tonumber(redis.call('HGET', KEYS[1], 'done'))
local total = tonumber(redis.call('HGET', KEYS[1], 'total'))
if total >= 0 and done >= total and state ~= '$DONE' then
  redis.call('HSET', KEYS[1], 'state', '$DONE', 'finished_at', now)
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', events_maxlen, '*', 'state', '$DONE')
end
for i = 1, #KEYS - 1 do redis.call('EXPIRE', KEYS[i], ttl) end
redis.call('ZADD', KEYS[#KEYS], 'XX', now, job_id)
return done
""", JobState)

# KEYS: job_keys. ARGV: total, now, events maxlen. Closes the job's segment count; the job
# is done at once if every segment is already stored.
SEAL = lua("""
local total_in = ARGV[1]
local now = ARGV[2]
local events_maxlen = ARGV[3]
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return -2 end
redis.call('HSET', KEYS[1], 'total', total_in)
local done = tonumber(redis.call('HGET', KEYS[1], 'done'))
if (state == '$QUEUED' or state == '$RUNNING') and done >= tonumber(total_in) then
  redis.call('HSET', KEYS[1], 'state', '$DONE', 'finished_at', now)
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', events_maxlen, '*', 'state', '$DONE')
end
return done
""", JobState)

# KEYS: the listener leases. ARGV: now, how many at most. Claims (removes) the leases that
# lapsed and returns their job ids.
CLAIM_LAPSED = """
local now = ARGV[1]
local limit = ARGV[2]
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, limit)
if #ids > 0 then redis.call('ZREM', KEYS[1], unpack(ids)) end
return ids
"""

# KEYS: the listener leases, the job record. ARGV: the job id. A stream that ended lets go of
# its lease once its job is over (a live job keeps it until it lapses: the sweep then cancels
# it, should the web that ended the stream not have done so).
END_LEASE = lua("""
local job_id = ARGV[1]
local state = redis.call('HGET', KEYS[2], 'state')
if not state or state == '$DONE' or state == '$CANCELED' or state == '$FAILED' then
  redis.call('ZREM', KEYS[1], job_id)
end
""", JobState)


# A segment's feature-cache hit or miss, counted on its job and on the job's owner (the API
# key that asked: /v1/stats shows a key its own figures, never the farm's). A job gone
# (expired, or never made) counts nowhere: an increment would leave a hash with no TTL.
# KEYS: job. ARGV: field (cache_hits or cache_misses), the owners' counters' key prefix.
COUNT_CACHE = """
local owner = redis.call('HGET', KEYS[1], 'owner')
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
if owner and owner ~= '' then redis.call('HINCRBY', ARGV[2] .. owner, ARGV[1], 1) end
return 1
"""
