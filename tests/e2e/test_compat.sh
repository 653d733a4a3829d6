#!/usr/bin/env bash
# What a vLLM or SGLang user expects beside the OpenAI routes (issue 46), driven by curl: several served
# model names and the --model path as a name, GET /v1/models/{id}, /tokenize and /detokenize in vLLM's
# shapes, /version, /get_server_info, /health_generate, 405 with Allow, CORS (preflight and simple), the
# fields of protocol_fields.h (implemented or a 400 naming them), `kiln <command> --help`, and
# --metrics-compat vllm.
# Usage: test_compat.sh KILN FIXTURES_DIR SRC_DIR
KILN=$1
FIXTURES=$2
source "$(dirname "$0")/lib.sh"
command -v curl >/dev/null || skip "curl is not installed"
command -v python3 >/dev/null || skip "python3 is not installed"
T="$E2E_LOG_DIR"
JSON=(-H "Content-Type: application/json")

# req NAME METHOD PATH [BODY] [CURL ARGS...]: body in $T/NAME.json, headers in $T/NAME.h, status echoed
req() {
  local name=$1 method=$2 path=$3 body=${4:-}
  shift 4 || shift $#
  if [[ -n "$body" ]]; then
    curl -s -o "$T/$name.json" -D "$T/$name.h" -w '%{http_code}' -X "$method" "${JSON[@]}" "$@" "$BASE$path" --data-binary "$body"
  else
    curl -s -o "$T/$name.json" -D "$T/$name.h" -w '%{http_code}' -X "$method" "$@" "$BASE$path"
  fi
}
# jq_ NAME EXPR: a Python expression over the JSON body j
jq_() { python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$T/$1.json" "$2"; }
expect() { [[ "$1" == "$2" ]] || fail "$3: got '$1', expected '$2' ($(head -c 300 "$T/${4:-x}.json" 2>/dev/null))"; }

echo "== kiln <command> --help for every command"
while read -r cmd; do
  # shellcheck disable=SC2086
  "$KILN" $cmd --help >"$T/help.out" 2>&1 || fail "kiln $cmd --help exited non-zero: $(head -3 "$T/help.out")"
  grep -qi 'usage' "$T/help.out" || fail "kiln $cmd --help printed no usage"
done < <("$KILN" --help 2>&1 | sed -n 's/^  \([a-z-]*\( [a-z]*\)\?\)  .*/\1/p' | sed 's/ *$//')
"$KILN" serve --help | grep -q -- '--served-model-name' || fail "kiln serve --help does not list --served-model-name"

DEMO="$FIXTURES/demo"
start_server compat --model "$DEMO/" --served-model-name demo qwen/demo-alias --max-total-tokens 4096 \
  --allowed-origins '["https://app.example"]' --metrics-compat vllm

echo "== model names: every served name listed, the path and basename accepted, /v1/models/{id}"
expect "$(req models GET /v1/models)" 200 "/v1/models"
expect "$(jq_ models '",".join(m["id"] for m in j["data"])')" "demo,qwen/demo-alias" "/v1/models ids" models
for name in demo qwen/demo-alias "$DEMO/" "$(basename "$DEMO")"; do
  st=$(req m GET "/v1/completions" '{"model":"'"$name"'","prompt":"a","max_tokens":1}' -X POST)
  expect "$st" 200 "completion with model '$name'" m
  expect "$(jq_ m 'j["model"]')" demo "echoed model for '$name'" m
done
expect "$(req nf POST /v1/completions '{"model":"nope","prompt":"a","max_tokens":1}')" 404 "unknown model"
expect "$(jq_ nf 'j["error"]["code"]')" model_not_found "unknown model code" nf
expect "$(req m1 GET /v1/models/qwen/demo-alias)" 200 "GET /v1/models/{id}"
expect "$(jq_ m1 'j["id"] + " " + j["object"]')" "qwen/demo-alias model" "model object" m1
expect "$(req m2 GET /v1/models/nope)" 404 "GET /v1/models/nope"
expect "$(jq_ m2 'j["error"]["code"] + " " + j["error"]["param"] + " " + j["error"]["type"]')" \
  "model_not_found model invalid_request_error" "404 shape" m2

echo "== /tokenize and /detokenize (vLLM shapes)"
expect "$(req tk POST /tokenize '{"prompt":"Hello world"}')" 200 "/tokenize prompt"
TOKS=$(jq_ tk 'json.dumps(j["tokens"])')
expect "$(jq_ tk 'j["count"] == len(j["tokens"]) > 0 and j["max_model_len"] > 0 and j["token_strs"] is None')" True "tokenize shape" tk
expect "$(req dt POST /detokenize '{"tokens":'"$TOKS"'}')" 200 "/detokenize"
expect "$(jq_ dt 'j["prompt"]')" "Hello world" "detokenize round trip" dt
MSGS='"messages":[{"role":"user","content":"hi"}]'
req tc POST /tokenize '{'"$MSGS"'}' >/dev/null
req tcn POST /tokenize '{'"$MSGS"',"add_generation_prompt":false}' >/dev/null
expect "$(jq_ tc 'j["count"]')" "$(python3 -c 'import json; print(len(json.load(open("'"$T/tc.json"'"))["tokens"]))')" "chat count" tc
NC=$(jq_ tc 'j["count"]')
NN=$(jq_ tcn 'j["count"]')
((NN < NC)) || fail "add_generation_prompt false should drop the generation prompt ($NN vs $NC tokens)"
# The chat route gives the same prompt: its usage.prompt_tokens equals /tokenize's count.
req chat POST /v1/chat/completions '{'"$MSGS"',"max_tokens":1}' >/dev/null
expect "$(jq_ chat 'j["usage"]["prompt_tokens"]')" "$NC" "chat prompt_tokens vs /tokenize count" chat
# continue_final_message: the prompt ends with the assistant's partial text.
req cf POST /tokenize '{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"Sure, the"}],"add_generation_prompt":false,"continue_final_message":true}' >/dev/null
req cfd POST /detokenize '{"tokens":'"$(jq_ cf 'json.dumps(j["tokens"])')"'}' >/dev/null
[[ "$(jq_ cfd 'j["prompt"].endswith("Sure, the")')" == True ]] || fail "continue_final_message: $(cat "$T/cfd.json")"
expect "$(req bad POST /tokenize '{"prompt":"a","messages":[]}')" 400 "prompt and messages"
expect "$(req bad2 POST /detokenize '{"tokens":[-1]}')" 400 "bad token id"

echo "== /version, /get_server_info, /health_generate"
expect "$(req v GET /version)" 200 "/version"
[[ -n "$(jq_ v 'j["version"]')" ]] || fail "/version has no version"
expect "$(req si GET /get_server_info)" 200 "/get_server_info"
expect "$(jq_ si 'j["served_model_name"][1]')" qwen/demo-alias "server info names" si
expect "$(req hg GET /health_generate)" 200 "/health_generate"
expect "$(jq_ hg 'j["status"]')" ok "/health_generate body" hg

echo "== 405 with Allow on a known route, 404 on an unknown one"
expect "$(req w1 GET /v1/chat/completions)" 405 "GET chat"
grep -qi '^allow: POST' "$T/w1.h" || fail "405 without Allow: $(cat "$T/w1.h")"
expect "$(req w2 POST /v1/models '{}')" 405 "POST /v1/models"
grep -qi '^allow: GET, HEAD' "$T/w2.h" || fail "405 /v1/models Allow"
expect "$(req w3 GET /nowhere)" 404 "unknown path"

echo "== CORS: preflight answered, allowed origin echoed, others refused"
expect "$(req pf OPTIONS /v1/chat/completions '' -H 'Origin: https://app.example' \
  -H 'Access-Control-Request-Method: POST' -H 'Access-Control-Request-Headers: authorization,content-type')" 200 "preflight"
grep -qi '^access-control-allow-origin: https://app.example' "$T/pf.h" || fail "preflight origin: $(cat "$T/pf.h")"
grep -qi '^access-control-allow-methods:.*POST' "$T/pf.h" || fail "preflight methods"
grep -qi '^access-control-allow-headers: authorization,content-type' "$T/pf.h" || fail "preflight headers"
expect "$(req pf2 OPTIONS /v1/chat/completions '' -H 'Origin: https://evil.example' -H 'Access-Control-Request-Method: POST')" 400 "preflight, other origin"
req simple GET /v1/models '' -H 'Origin: https://app.example' >/dev/null
grep -qi '^access-control-allow-origin: https://app.example' "$T/simple.h" || fail "simple request CORS header"
req simple2 GET /v1/models '' -H 'Origin: https://evil.example' >/dev/null
! grep -qi '^access-control-allow-origin' "$T/simple2.h" || fail "CORS header for a disallowed origin"

echo "== fields: implemented as vLLM/SGLang do, or a 400 naming them"
P='"prompt":"Once upon a time","temperature":0,"ignore_eos":true'
req mt POST /v1/chat/completions '{'"$MSGS"',"max_tokens":5,"max_completion_tokens":2,"temperature":0,"ignore_eos":true}' >/dev/null
expect "$(jq_ mt 'j["usage"]["completion_tokens"]')" 2 "max_completion_tokens wins over max_tokens" mt
req tr POST /v1/completions '{'"$P"',"max_tokens":1,"truncate_prompt_tokens":2}' >/dev/null
expect "$(jq_ tr 'j["usage"]["prompt_tokens"]')" 2 "truncate_prompt_tokens" tr
req rid POST /generate '{"text":"a","rid":"my-request-7","sampling_params":{"max_new_tokens":1}}' >/dev/null
expect "$(jq_ rid 'j["meta_info"]["id"]')" my-request-7 "/generate rid" rid
for case in \
  'return_tokens_as_token_ids|/v1/completions|{"prompt":"a","return_tokens_as_token_ids":true}' \
  'reasoning_effort|/v1/chat/completions|{'"$MSGS"',"reasoning_effort":"extreme"}' \
  'sampling_params.no_stop_trim|/generate|{"text":"a","sampling_params":{"no_stop_trim":true}}' \
  'tools[0].type|/v1/chat/completions|{'"$MSGS"',"tools":[{"type":"code_interpreter"}]}' \
  'tools[0].function.name|/v1/chat/completions|{'"$MSGS"',"tools":[{"type":"function","function":{"parameters":{}}}]}' \
  'continue_final_message|/v1/chat/completions|{'"$MSGS"',"continue_final_message":true,"add_generation_prompt":true}'; do
  IFS='|' read -r param path body <<<"$case"
  expect "$(req f POST "$path" "$body")" 400 "$param"
  expect "$(jq_ f 'j["error"]["param"]')" "$param" "param named for $param" f
done
LONG=$(python3 -c 'print("word " * 5000)')
expect "$(req long POST /v1/completions '{"prompt":"'"$LONG"'"}')" 400 "over-long prompt"
expect "$(jq_ long 'j["error"]["param"]')" prompt "over-long completions prompt names prompt" long
# text_offset counts characters: "é" is 2 bytes, 1 character.
req lp POST /v1/completions '{"prompt":"a","max_tokens":8,"temperature":0,"ignore_eos":true,"logprobs":0}' >/dev/null
python3 - "$T/lp.json" <<'PY' || fail "text_offset is not in characters"
import json, sys
c = json.load(open(sys.argv[1]))["choices"][0]["logprobs"]
off = c["text_offset"]
for i, t in enumerate(c["tokens"][:-1]):
    assert off[i + 1] - off[i] == len(t), (i, t, off)
PY

echo "== batched prompts (completions, /generate), choice indexing, echo"
G='"max_tokens":3,"temperature":0,"ignore_eos":true'
req b1 POST /v1/completions '{"prompt":"Once upon",'"$G"'}' >/dev/null
req b2 POST /v1/completions '{"prompt":[5,6,7],'"$G"'}' >/dev/null
expect "$(req batch POST /v1/completions '{"prompt":[[1,2],[5,6,7]],"n":2,'"$G"'}')" 200 "token-list batch" batch
expect "$(jq_ batch '[c["index"] for c in j["choices"]]')" "[0, 1, 2, 3]" "batch choice indexes" batch
expect "$(jq_ batch 'j["choices"][2]["text"] == j["choices"][3]["text"]')" True "greedy choices of one prompt agree" batch
expect "$(jq_ batch 'j["choices"][2]["text"]')" "$(jq_ b2 'j["choices"][0]["text"]')" "batched prompt 2 == alone" batch
expect "$(jq_ batch 'j["usage"]["prompt_tokens"]')" 5 "batch usage counts each prompt once" batch
expect "$(jq_ batch 'j["usage"]["completion_tokens"]')" 12 "batch completion tokens" batch
expect "$(req sb POST /v1/completions '{"prompt":["Once upon","a"],'"$G"'}')" 200 "string batch"
expect "$(jq_ sb 'j["choices"][0]["text"]')" "$(jq_ b1 'j["choices"][0]["text"]')" "batched prompt 1 == alone" sb
curl -sN "${JSON[@]}" "$BASE/v1/completions" -d '{"prompt":["Once upon","a"],"stream":true,'"$G"'}' >"$T/bs.sse"
python3 - "$T/bs.sse" "$(jq_ sb 'json.dumps([c["text"] for c in j["choices"]])')" <<'PY' || fail "batched stream"
import json, sys
texts, done = {}, {}
for f in open(sys.argv[1]).read().split("\n\n"):
    if not f.startswith("data: ") or f == "data: [DONE]":
        continue
    for c in json.loads(f[6:])["choices"]:
        texts[c["index"]] = texts.get(c["index"], "") + c["text"]
        if c["finish_reason"]: done[c["index"]] = c["finish_reason"]
assert [texts[0], texts[1]] == json.loads(sys.argv[2]), texts
assert done == {0: "length", 1: "length"}, done
PY
# include_stop_str_in_output: the stop string (the greedy output's last two characters) kept, or not.
for inc in true false; do
  B=$(python3 -c 'import json,sys; t=json.load(open(sys.argv[1]))["choices"][0]["text"]; print(json.dumps({"prompt":"Once upon","max_tokens":3,"temperature":0,"ignore_eos":True,"stop":[t[-2:]],"include_stop_str_in_output":sys.argv[2]=="true"}))' "$T/b1.json" $inc)
  req is POST /v1/completions "$B" >/dev/null
  python3 - "$T/b1.json" "$T/is.json" $inc <<'PY' || fail "include_stop_str_in_output $inc: $(cat "$T/is.json")"
import json, sys
full = json.load(open(sys.argv[1]))["choices"][0]["text"]
got = json.load(open(sys.argv[2]))["choices"][0]
stop = full[-2:]
i = full.find(stop)
want = full[: i + len(stop)] if sys.argv[3] == "true" else full[:i]
assert got["text"] == want and got["finish_reason"] == "stop", (got, want)
PY
done
req ec POST /v1/completions '{"prompt":"Once upon","echo":true,'"$G"'}' >/dev/null
expect "$(jq_ ec 'j["choices"][0]["text"]')" "Once upon$(jq_ b1 'j["choices"][0]["text"]')" "echo" ec
expect "$(req el POST /v1/completions '{"prompt":"a","echo":true,"logprobs":1,"stream":true}')" 400 "echo with logprobs, streamed (e2e_scoring checks it unstreamed)"
expect "$(req gb POST /generate '{"text":["Once upon","a"],"sampling_params":{"max_new_tokens":2,"temperature":0}}')" 200 "/generate batch"
expect "$(jq_ gb '[o["index"] for o in j]')" "[0, 1]" "/generate batch indexes" gb
expect "$(req gi POST /generate '{"input_ids":[[1,2],[3]],"sampling_params":{"max_new_tokens":1}}')" 200 "/generate id batch"
expect "$(jq_ gi 'len(j)')" 2 "/generate id batch size" gi

echo "== --metrics-compat vllm: vLLM's names beside kiln's, the same values"
[[ "$(metric 'vllm:num_requests_running{model_name="demo"}')" == 0 ]] || fail "vllm:num_requests_running"
[[ "$(metric 'vllm:generation_tokens_total{model_name="demo"}')" == "$(metric 'kiln_generation_tokens_total{model_name="demo"}')" ]] ||
  fail "vllm:generation_tokens_total differs from kiln's"
[[ "$(metric 'vllm:request_success_total{model_name="demo",finished_reason="length"}')" == \
   "$(metric 'kiln_requests_finished_total{model_name="demo",reason="length"}')" ]] || fail "vllm:request_success_total"
[[ "$(metric 'vllm:time_to_first_token_seconds_count{model_name="demo"}')" -ge 5 ]] || fail "vllm:time_to_first_token_seconds"
stop_server
echo "PASS test_compat"
