-- wrk script: POST /v1/check spreading checks over CLIENTS clients of one tenant.
-- Usage: wrk ... -s check.lua URL -- CLIENTS TENANT [OFFSET] [DELAY_MS]
-- Each wrk thread starts its walk over the client ids ("c-<n>") at a different point, so the
-- load is spread over all of them. DELAY_MS > 0 paces every connection (wrk's delay() hook:
-- wait that long after each answer), which is how the "half the maximum rate" run is made
-- without wrk2. done() prints p50/p99/p99.9 and the count of non-200 answers.

local clients, tenant, offset, pause = 10000, "bench", 0, 0
local counter = 0
local threads = {}

function setup(thread)
   thread:set("id", #threads)
   table.insert(threads, thread)
end

function init(args)
   clients = tonumber(args[1] or "10000")
   tenant = args[2] or "bench"
   offset = tonumber(args[3] or "0")
   pause = tonumber(args[4] or "0")
   counter = (id or 0) * 7919
   wrk.method = "POST"
   wrk.headers["Content-Type"] = "application/json"
end

function request()
   counter = counter + 1
   local body = string.format('{"tenant":"%s","client":"c-%d","cost":1}', tenant,
      offset + (counter % clients))
   return wrk.format(nil, nil, nil, body)
end

function delay()
   return pause
end

non2xx = 0 -- global: done() reads it from every thread
function response(status, headers, body)
   if status ~= 200 then non2xx = non2xx + 1 end
end

function done(summary, latency, requests)
   local bad = 0
   for _, t in ipairs(threads) do bad = bad + (t:get("non2xx") or 0) end
   io.write(string.format("non-200 answers: %d\n", bad))
   io.write(string.format("percentiles us: p50 %d p99 %d p99.9 %d max %d\n",
      latency:percentile(50), latency:percentile(99), latency:percentile(99.9), latency.max))
end
