//! The Lua scripts. Each decision is one `EVALSHA` (one round trip); Redis runs a
//! script atomically, so replicas sharing a server share each limit exactly.
//!
//! Time comes from the server (`TIME`, microseconds), so replicas with skewed clocks
//! still agree. Rate buckets are strings holding the GCRA theoretical arrival time in
//! microseconds; budgets are hashes `{w, calls, in, out, cpu}` for window `w`.

/// Check (ARGV[1] = "check") or reserve (ARGV[1] = "reserve") one call.
///
/// KEYS: the rate buckets (ARGV[2] of them), then the budget hashes.
/// ARGV after the first two: per rate `interval_us, period_us`; per budget
/// `window_ms, calls, bytes_in, bytes_out, cpu_ms` (-1 = unlimited).
///
/// Returns `{0, i, wait_us}` when rate `i` refuses, `{2, j, wait_us}` when budget `j`
/// refuses, else `{1, tightest_rate_index, remaining}` followed by, per budget,
/// `window, calls_left, in_left, out_left, cpu_left, resets_in_ms` (-1 = unlimited).
pub(crate) const DECIDE: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_ms = math.floor(now / 1000)
local reserve = ARGV[1] == 'reserve'
local nr = tonumber(ARGV[2])
local nb = #KEYS - nr
local a = 3
local tats = {}
local periods = {}
local best, best_i = -1, 0
for i = 1, nr do
  local interval = tonumber(ARGV[a])
  local period = tonumber(ARGV[a + 1])
  a = a + 2
  local tat = tonumber(redis.call('GET', KEYS[i])) or now
  if tat < now then tat = now end
  local new = tat + interval
  if new - now > period then
    return {0, i, new - now - period}
  end
  tats[i] = new
  periods[i] = period
  local rem = math.floor((period - (new - now)) / interval)
  if best < 0 or rem < best then best = rem; best_i = i end
end
local out = {1, best_i, best}
local wins = {}
local used = {}
for j = 1, nb do
  local key = KEYS[nr + j]
  local wms = tonumber(ARGV[a])
  local lim = {tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])}
  a = a + 5
  local win = math.floor(now_ms / wms)
  local v = redis.call('HMGET', key, 'w', 'calls', 'in', 'out', 'cpu')
  local u = {0, 0, 0, 0}
  if tonumber(v[1]) == win then
    u = {tonumber(v[2]) or 0, tonumber(v[3]) or 0, tonumber(v[4]) or 0, tonumber(v[5]) or 0}
  end
  local resets = (win + 1) * wms - now_ms
  if (lim[1] >= 0 and u[1] >= lim[1]) or (lim[2] >= 0 and u[2] >= lim[2])
     or (lim[3] >= 0 and u[3] >= lim[3]) or (lim[4] >= 0 and u[4] >= lim[4]) then
    return {2, j, resets * 1000}
  end
  wins[j] = {win, wms, u}
  local function left(l, x) if l < 0 then return -1 end return l - x end
  table.insert(out, win)
  table.insert(out, left(lim[1], u[1] + 1))
  table.insert(out, left(lim[2], u[2]))
  table.insert(out, left(lim[3], u[3]))
  table.insert(out, left(lim[4], u[4]))
  table.insert(out, resets)
end
if reserve then
  for i = 1, nr do
    redis.call('SET', KEYS[i], tats[i], 'PX', math.ceil((tats[i] - now) / 1000) + 1000)
  end
  for j = 1, nb do
    local key = KEYS[nr + j]
    local w = wins[j]
    if w[3][1] == 0 and w[3][2] == 0 and w[3][3] == 0 and w[3][4] == 0 then
      redis.call('HSET', key, 'w', w[1], 'calls', 1, 'in', 0, 'out', 0, 'cpu', 0)
    else
      redis.call('HINCRBY', key, 'calls', 1)
    end
    redis.call('PEXPIRE', key, w[2] * 2)
  end
end
return out
"#;

/// Gives back a reservation whose call never executed.
///
/// KEYS: rate buckets (ARGV[1] of them), then budget hashes. ARGV after the first: per
/// rate `interval_us`; per budget `window`.
pub(crate) const REFUND: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local nr = tonumber(ARGV[1])
for i = 1, nr do
  local tat = tonumber(redis.call('GET', KEYS[i]))
  if tat then
    local back = tat - tonumber(ARGV[1 + i])
    if back < now then back = now end
    redis.call('SET', KEYS[i], back, 'KEEPTTL')
  end
end
for j = 1, #KEYS - nr do
  local key = KEYS[nr + j]
  if tonumber(redis.call('HGET', key, 'w')) == tonumber(ARGV[1 + nr + j]) then
    if (tonumber(redis.call('HGET', key, 'calls')) or 0) > 0 then
      redis.call('HINCRBY', key, 'calls', -1)
    end
  end
end
return 1
"#;

/// Adds actual usage to the budgets a call was counted in.
///
/// KEYS: budget hashes. ARGV: `bytes_in, bytes_out, cpu_ms`, then per budget `window`.
pub(crate) const SETTLE: &str = r#"
for j = 1, #KEYS do
  if tonumber(redis.call('HGET', KEYS[j], 'w')) == tonumber(ARGV[3 + j]) then
    redis.call('HINCRBY', KEYS[j], 'in', ARGV[1])
    redis.call('HINCRBY', KEYS[j], 'out', ARGV[2])
    redis.call('HINCRBY', KEYS[j], 'cpu', ARGV[3])
  end
end
return 1
"#;
