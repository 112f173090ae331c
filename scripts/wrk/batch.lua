-- wrk script: POST /v1/check/batch with BATCH checks a request, spread over CLIENTS clients of
-- one tenant. Usage: wrk ... -s batch.lua URL -- CLIENTS TENANT [BATCH] [OFFSET]
-- done() prints p50/p99/p99.9 and the count of non-200 answers.

local clients, tenant, batch, offset = 10000, "bench", 100, 0
local counter = 0
local threads = {}

function setup(thread)
   thread:set("id", #threads)
   table.insert(threads, thread)
end

function init(args)
   clients = tonumber(args[1] or "10000")
   tenant = args[2] or "bench"
   batch = tonumber(args[3] or "100")
   offset = tonumber(args[4] or "0")
   counter = (id or 0) * 7919
   wrk.method = "POST"
   wrk.headers["Content-Type"] = "application/json"
end

function request()
   local parts = {}
   for i = 1, batch do
      counter = counter + 1
      parts[i] = string.format('{"tenant":"%s","client":"c-%d","cost":1}', tenant,
         offset + (counter % clients))
   end
   return wrk.format(nil, nil, nil, '{"checks":[' .. table.concat(parts, ",") .. ']}')
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
