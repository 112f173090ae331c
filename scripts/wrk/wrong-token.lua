-- wrk script: POST /v1/check re-sending the bearer tokens of a file (one a line), each connection
-- pausing DELAY_MS after each answer. Usage: wrk ... -s wrong-token.lua URL -- TOKENS_FILE DELAY_MS
local tokens, pause, n = {}, 20, 0
function init(args)
   for line in io.lines(args[1]) do if #line > 0 then table.insert(tokens, line) end end
   pause = tonumber(args[2] or "20")
end
function request()
   n = n + 1
   local body = '{"tenant":"acme","client":"attacker"}'
   return wrk.format("POST", "/v1/check", {["Content-Type"] = "application/json",
      ["Authorization"] = "Bearer " .. tokens[(n % #tokens) + 1]}, body)
end
function delay() return pause end
