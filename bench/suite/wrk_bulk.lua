-- wrk script for the bulk HTTP scenario (bench/suite/http_load.py, 2b).
-- Each request POSTs BENCH_BULK (100) NDJSON lines {"batchId", "csv"} of the
-- same 3-row CSV, each batchId unique across the run:
-- <BENCH_RUN_ID>-<wrk thread>-<request>-<line>. Reads BENCH_RUN_ID,
-- BENCH_API_KEY, BENCH_BULK and BENCH_RECONNECT_EVERY (as wrk_post.lua).

local run_id = os.getenv("BENCH_RUN_ID") or "run"
local api_key = os.getenv("BENCH_API_KEY") or ""
local per_request = tonumber(os.getenv("BENCH_BULK") or "100")
local reconnect_every = tonumber(os.getenv("BENCH_RECONNECT_EVERY") or "100")
local csv = "sku,quantity\\nA-1,1\\nB-2,2\\nC-3,3\\n"
local headers = {
  ["Authorization"] = "Bearer " .. api_key,
  ["Content-Type"] = "application/x-ndjson",
}
local closing = {
  ["Authorization"] = "Bearer " .. api_key,
  ["Content-Type"] = "application/x-ndjson",
  ["Connection"] = "close",
}

local thread_count = 0
function setup(thread)
  thread_count = thread_count + 1
  thread:set("thread_no", thread_count)
end

local counter = 0
function request()
  counter = counter + 1
  local prefix = run_id .. "-" .. thread_no .. "-" .. counter .. "-"
  local lines = {}
  for j = 1, per_request do
    lines[j] = '{"batchId":"' .. prefix .. j .. '","csv":"' .. csv .. '"}'
  end
  local body = table.concat(lines, "\n") .. "\n"
  if reconnect_every > 0 and counter % reconnect_every == 0 then
    return wrk.format("POST", "/api/imports/bulk", closing, body)
  end
  return wrk.format("POST", "/api/imports/bulk", headers, body)
end
