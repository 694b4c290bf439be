-- wrk script for bench/suite/run.py (HTTP enqueue scenario).
-- Each request POSTs the same 3-row text/csv body under a batchId that is
-- unique across the whole run: <BENCH_RUN_ID>-<wrk thread>-<counter>.
-- Reads BENCH_RUN_ID and BENCH_API_KEY from the environment.
--
-- Every BENCH_RECONNECT_EVERY-th request of a thread (default 100) carries
-- "Connection: close", so wrk reconnects now and then. Without it, the 32
-- keep-alive connections stay on whichever gunicorn worker accepted them
-- first, and a run sometimes measures one worker process instead of all of
-- them (seen: one worker with all 32 connections, the other idle).

local run_id = os.getenv("BENCH_RUN_ID") or "run"
local api_key = os.getenv("BENCH_API_KEY") or ""
local reconnect_every = tonumber(os.getenv("BENCH_RECONNECT_EVERY") or "100")
local body = "sku,quantity\nA-1,1\nB-2,2\nC-3,3\n"
local headers = {
  ["Authorization"] = "Bearer " .. api_key,
  ["Content-Type"] = "text/csv",
}
local closing = {
  ["Authorization"] = "Bearer " .. api_key,
  ["Content-Type"] = "text/csv",
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
  local path = "/api/imports?batchId=" .. run_id .. "-" .. thread_no .. "-" .. counter
  if reconnect_every > 0 and counter % reconnect_every == 0 then
    return wrk.format("POST", path, closing, body)
  end
  return wrk.format("POST", path, headers, body)
end
