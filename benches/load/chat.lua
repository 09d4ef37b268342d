-- wrk script: POST a realistic ~8 KB OpenAI chat request with a tokensaver key.
--
-- Environment:
--   LOAD_DIR   directory holding body_prefix.txt, body_suffix.txt, keys_*.txt (from gen.py)
--   LOAD_MODE  allow : every request has a fresh marker (own fingerprint), keys round-robin
--              serve : each (key, prompt) pair repeated; rounds of PROMPTS×keys, so a pair is
--                      sent at most 6 more times after its warm-up (the 8-identical rule)
--              warm  : send each (key, prompt) pair of the serve set once, then stop the thread
--   PROMPTS    prompts per SERVE key (default 16)
local dir = os.getenv("LOAD_DIR") or "."
local mode = os.getenv("LOAD_MODE") or "allow"
local prompts = tonumber(os.getenv("PROMPTS") or "16")

local function slurp(p)
  local f = assert(io.open(p, "rb")); local s = f:read("*a"); f:close(); return s
end
local function lines(p)
  local t = {}
  for l in io.lines(p) do if #l > 0 then t[#t + 1] = l end end
  return t
end

local counter = 0
local threads = {}

function setup(thread)
  thread:set("tid", #threads)
  table.insert(threads, thread)
end

function init(args)
  nthreads = tonumber(os.getenv("WRK_THREADS") or "2")
  prefix = slurp(dir .. "/body_prefix.txt")
  suffix = slurp(dir .. "/body_suffix.txt")
  local all = lines(dir .. "/keys_" .. (mode == "allow" and "allow" or "serve") .. ".txt")
  keys = {}
  -- each wrk thread gets its own slice of the keys
  for i = 1, #all do
    if (i - 1) % nthreads == tid then keys[#keys + 1] = "Bearer " .. all[i] end
  end
  headers = { ["Content-Type"] = "application/json", ["x-tokensaver-human"] = "true" }
end

function request()
  counter = counter + 1
  local nk = #keys
  local key, mark
  if mode == "allow" then
    key = keys[(counter % nk) + 1]
    mark = "t" .. tid .. "-" .. counter
  else
    local pairs_n = nk * prompts
    local idx = (counter - 1) % pairs_n
    if mode == "warm" and counter > pairs_n then
      wrk.thread:stop()
    end
    key = keys[(idx % nk) + 1]
    mark = "p" .. math.floor(idx / nk)
  end
  headers["Authorization"] = key
  return wrk.format("POST", "/v1/chat/completions", headers, prefix .. mark .. suffix)
end
