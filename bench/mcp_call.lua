-- wrk script: POST one MCP tools/call (JSON-RPC) per request, over a kept-alive connection.
--   wrk ... -s bench/mcp_call.lua <url> -- <tokens-file|-> <tool|@list> [arguments-json]
-- Tokens (one bearer JWT per line) rotate per request, so quotas count many principals
-- the way many agents would; "-" sends no Authorization header (the baseline).
-- done() prints one JSON line (prefixed "WRKJSON ") the orchestrator parses.

local threads = {}
local counter = 0

function setup(thread)
  counter = counter + 1
  thread:set("tid", counter)
  table.insert(threads, thread)
end

function init(args)
  tokens = {}
  local file = args[1] or "-"
  tool = args[2] or "list_nodes"
  arguments = args[3] or "{}"
  if file ~= "-" then
    for line in io.lines(file) do
      if #line > 0 then table.insert(tokens, line) end
    end
  end
  idx = (tid or 1) * 7919
  seq = 0
  ok, rpc_errors, tool_errors, http_errors = 0, 0, 0, 0
end

function request()
  seq = seq + 1
  local headers = {
    ["Content-Type"] = "application/json",
    ["Accept"] = "application/json, text/event-stream",
    ["MCP-Protocol-Version"] = "2025-06-18",
  }
  if #tokens > 0 then
    idx = idx + 1
    headers["Authorization"] = "Bearer " .. tokens[(idx % #tokens) + 1]
  end
  local body
  if tool == "@list" then  -- tools/list instead of a call
    body = '{"jsonrpc":"2.0","id":' .. seq .. ',"method":"tools/list","params":{}}'
  else
    body = '{"jsonrpc":"2.0","id":' .. seq .. ',"method":"tools/call","params":{"name":"' .. tool
      .. '","arguments":' .. arguments .. '}}'
  end
  return wrk.format("POST", nil, headers, body)
end

function response(status, headers, body)
  if status ~= 200 then
    http_errors = http_errors + 1
  elseif string.find(body, '"isError":true', 1, true) then
    tool_errors = tool_errors + 1
  elseif string.find(body, '"error":{', 1, true) then
    rpc_errors = rpc_errors + 1
  else
    ok = ok + 1
  end
end

function done(summary, latency, requests)
  local o, r, t, h = 0, 0, 0, 0
  for _, thread in ipairs(threads) do
    o = o + thread:get("ok")
    r = r + thread:get("rpc_errors")
    t = t + thread:get("tool_errors")
    h = h + thread:get("http_errors")
  end
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests":%d,"duration_us":%d,"ok":%d,"rpc_errors":%d,"tool_errors":%d,"http_errors":%d,'
      .. '"socket_errors":%d,"p50_us":%d,"p90_us":%d,"p99_us":%d,"max_us":%d,"mean_us":%.1f}\n',
    summary.requests, summary.duration, o, r, t, h,
    e.connect + e.read + e.write + e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max, latency.mean))
end
