-- wrk script: the direct simulator read (GET /nodes with the PVE API token), for reference.
--   wrk ... -s bench/sim_get.lua <api_url>/nodes -- <token-file>
local threads = {}

function setup(thread)
  table.insert(threads, thread)
end

function init(args)
  local f = io.open(args[1], "r")
  token = f:read("*l")
  f:close()
  ok, http_errors = 0, 0
end

function request()
  return wrk.format("GET", nil, { ["Authorization"] = "PVEAPIToken=" .. token }, nil)
end

function response(status, headers, body)
  if status == 200 then ok = ok + 1 else http_errors = http_errors + 1 end
end

function done(summary, latency, requests)
  local o, h = 0, 0
  for _, thread in ipairs(threads) do
    o = o + thread:get("ok")
    h = h + thread:get("http_errors")
  end
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests":%d,"duration_us":%d,"ok":%d,"rpc_errors":0,"tool_errors":0,"http_errors":%d,'
      .. '"socket_errors":%d,"p50_us":%d,"p90_us":%d,"p99_us":%d,"max_us":%d,"mean_us":%.1f}\n',
    summary.requests, summary.duration, o, h, e.connect + e.read + e.write + e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max, latency.mean))
end
