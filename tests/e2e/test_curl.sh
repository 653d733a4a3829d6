#!/usr/bin/env bash
# kiln serve on the CPU demo checkpoint, driven by curl: every endpoint, SSE framing, usage and
# cached_tokens, stop strings spanning tokens, the API key, a table of bad inputs (each a 4xx in
# OpenAI's error shape, the server still healthy after), /flush_cache and /metrics accounting, and a
# SIGTERM that drains an in-flight stream. Usage: test_curl.sh KILN FIXTURES_DIR SRC_DIR
KILN=$1
FIXTURES=$2
source "$(dirname "$0")/lib.sh"
command -v curl >/dev/null || skip "curl is not installed"
command -v python3 >/dev/null || skip "python3 is not installed"
CHECK="python3 $(dirname "$0")/check.py"
T="$E2E_LOG_DIR"
KEY=e2e-secret

start_server curl --model "$FIXTURES/demo" --served-model-name demo --api-key "$KEY" --max-total-tokens 4096 \
  --max-body-bytes 65536 --max-running-requests 8
AUTH=(-H "Authorization: Bearer $KEY")
JSON=(-H "Content-Type: application/json")

# post NAME PATH BODY: response body in $T/NAME.json, status in $T/NAME.status
post() {
  curl -s -o "$T/$1.json" -w '%{http_code}' "${AUTH[@]}" "${JSON[@]}" -X POST "$BASE$2" --data-binary "$3" >"$T/$1.status"
}
expect_status() { [[ "$(cat "$T/$1.status")" == "$2" ]] || fail "$1: status $(cat "$T/$1.status"), expected $2: $(head -c 300 "$T/$1.json")"; }

echo "== a second server on the same port fails to bind instead of sharing it; bad graph sizes fail"
rc=0
timeout 60 "$KILN" serve --port "$PORT" --device cpu --model "$FIXTURES/demo" >"$T/second.out" 2>"$T/second.log" || rc=$?
((rc != 0)) && grep -q 'cannot bind' "$T/second.log" || fail "second server on port $PORT: rc $rc, $(cat "$T/second.log")"

rc=0
timeout 60 "$KILN" serve --port 0 --device cpu --model "$FIXTURES/demo" --cuda-graph-bs 4,2 >"$T/bs.out" 2>"$T/bs.log" || rc=$?
((rc != 0)) && grep -q 'ascending' "$T/bs.log" || fail "--cuda-graph-bs 4,2: rc $rc, $(cat "$T/bs.log")"

echo "== health, models, auth"
[[ "$(curl -s -o /dev/null -w '%{http_code}' "$BASE/health")" == 200 ]] || fail "/health"
[[ "$(curl -s "${AUTH[@]}" "$BASE/v1/models" | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])')" == demo ]] ||
  fail "/v1/models does not list 'demo'"
curl -s -o "$T/noauth.json" -w '%{http_code}' "${JSON[@]}" "$BASE/v1/completions" -d '{"prompt":"a"}' >"$T/noauth.status"
$CHECK error "$T/noauth.json" "$T/noauth.status" 401 || fail "no API key must be 401"

echo "== chat: non-streaming, greedy, usage, prefix cache"
LONG="$(printf 'The quick brown fox jumps over the lazy dog. %.0s' $(seq 1 12))"
CHAT='{"model":"demo","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"'"$LONG"'"}],"max_tokens":6,"temperature":0}'
post chat1 /v1/chat/completions "$CHAT"
expect_status chat1 200
R1=$($CHECK chat "$T/chat1.json" 6) || fail "chat1: $(cat "$T/chat1.json")"
post chat2 /v1/chat/completions "$CHAT"
R2=$($CHECK chat "$T/chat2.json" 6) || fail "chat2"
C1=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["content"])' "$R1")
C2=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["content"])' "$R2")
[[ -n "$C1" && "$C1" == "$C2" ]] || fail "greedy chat not repeatable: '$C1' vs '$C2'"
CACHED=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["cached"])' "$R2")
((CACHED >= 32)) || fail "second identical long prompt reused only $CACHED cached tokens"
echo "   content '$C1', cached_tokens on repeat: $CACHED"

echo "== chat: streaming (SSE framing, include_usage) equals non-streaming"
curl -sN "${AUTH[@]}" "${JSON[@]}" "$BASE/v1/chat/completions" \
  -d "${CHAT%\}},\"stream\":true,\"stream_options\":{\"include_usage\":true}}" >"$T/stream.sse"
S=$($CHECK chat_stream "$T/stream.sse") || fail "chat stream: $(head -c 400 "$T/stream.sse")"
SC=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["content"])' "$S")
[[ "$SC" == "$C1" ]] || fail "streamed content '$SC' != non-streamed '$C1'"
python3 -c 'import json,sys; u=json.loads(sys.argv[1])["usage"]; assert u["completion_tokens"]==6, u' "$S" || fail "stream usage"

echo "== enable_thinking via chat_template_kwargs changes the prompt"
post think /v1/chat/completions '{"messages":[{"role":"user","content":"hi"}],"max_tokens":1,"chat_template_kwargs":{"enable_thinking":false}}'
post nothink /v1/chat/completions '{"messages":[{"role":"user","content":"hi"}],"max_tokens":1}'
P1=$($CHECK field "$T/think.json" 'j["usage"]["prompt_tokens"]')
P2=$($CHECK field "$T/nothink.json" 'j["usage"]["prompt_tokens"]')
((P1 > P2)) || fail "enable_thinking=false should add the empty think block ($P1 vs $P2 prompt tokens)"

echo "== /generate: token texts, then a stop string spanning two tokens"
post gen /generate '{"text":"Once upon a time","sampling_params":{"max_new_tokens":10,"temperature":0,"ignore_eos":true},"return_logprob":true,"return_text_in_logprobs":true}'
expect_status gen 200
[[ "$($CHECK field "$T/gen.json" 'j["meta_info"]["completion_tokens"]')" == 10 ]] || fail "/generate completion_tokens"
ST=$($CHECK stop_from_tokens "$T/gen.json") || fail "no stop candidate"
STOP=$(python3 -c 'import json,sys; print(json.dumps(json.loads(sys.argv[1])["stop"]))' "$ST")
EXPECT=$(python3 -c 'import json,sys; print(json.dumps(json.loads(sys.argv[1])["expected"]))' "$ST")
post stop /v1/completions '{"prompt":"Once upon a time","max_tokens":10,"temperature":0,"ignore_eos":true,"stop":['"$STOP"']}'
[[ "$($CHECK field "$T/stop.json" 'j["choices"][0]["text"]')" == "$EXPECT" ]] ||
  fail "stop $STOP: text $($CHECK field "$T/stop.json" 'j["choices"][0]["text"]'), expected $EXPECT"
[[ "$($CHECK field "$T/stop.json" 'j["choices"][0]["finish_reason"]')" == '"stop"' ]] || fail "stop: finish_reason"
curl -sN "${AUTH[@]}" "${JSON[@]}" "$BASE/generate" \
  -d '{"input_ids":[9707,11,1879],"sampling_params":{"max_new_tokens":3,"temperature":0},"return_hidden_states":true,"stream":true}' >"$T/gen.sse"
tail -c 16 "$T/gen.sse" | grep -q '\[DONE\]' || fail "/generate stream does not end with [DONE]"
python3 - "$T/gen.sse" <<'PY' || fail "/generate stream content"
import json, sys
frames = [f[6:] for f in open(sys.argv[1]).read().split("\n\n") if f]
last = json.loads(frames[-2])
assert last["meta_info"]["finish_reason"]["type"] == "length", last["meta_info"]
assert len(last["output_ids"]) == 3 and len(last["meta_info"]["hidden_states"][0]) == 256
PY

echo "== completions with token ids and logprobs"
post comp /v1/completions '{"prompt":[9707,11,1879],"max_tokens":3,"logprobs":2,"temperature":0}'
expect_status comp 200
python3 - "$T/comp.json" <<'PY' || fail "completion logprobs shape"
import json, sys
j = json.load(open(sys.argv[1])); lp = j["choices"][0]["logprobs"]
assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == 3
assert all(len(t) == 2 for t in lp["top_logprobs"]) and all(x <= 0 for x in lp["token_logprobs"])
assert j["usage"]["prompt_tokens"] == 3
PY

echo "== bad inputs: 4xx in OpenAI's error shape"
BIG=$(head -c 70000 /dev/zero | tr '\0' 'a')
OVERLONG=$(printf 'hello %.0s' $(seq 1 4200))
bad() {  # NAME PATH STATUS BODY
  post "bad_$1" "$2" "$4"
  $CHECK error "$T/bad_$1.json" "$T/bad_$1.status" "$3" || fail "bad input '$1'"
}
bad malformed /v1/chat/completions 400 '{"messages": [ {"role": "user"'
bad not_object /v1/completions 400 '[1,2,3]'
bad wrong_type /v1/chat/completions 400 '{"messages":[{"role":"user","content":"x"}],"max_tokens":"ten"}'
bad no_messages /v1/chat/completions 400 '{"model":"demo"}'
bad empty_messages /v1/chat/completions 400 '{"messages":[]}'
bad bad_role /v1/chat/completions 400 '{"messages":[{"role":"robot","content":"x"}]}'
bad empty_prompt /v1/completions 400 '{"prompt":""}'
bad overlong_prompt /v1/completions 400 '{"prompt":"'"$OVERLONG"'"}'
bad too_many_tokens /v1/completions 400 '{"prompt":"hi","max_tokens":100000}'
bad id_too_big /v1/completions 400 '{"prompt":[1,2,151936]}'
bad id_negative /generate 400 '{"input_ids":[1,-5]}'
bad temp_inf /v1/completions 400 '{"prompt":"hi","temperature":1e999}'
bad temp_negative /v1/completions 400 '{"prompt":"hi","temperature":-0.5}'
bad top_p_zero /v1/completions 400 '{"prompt":"hi","top_p":0}'
bad top_k_bad /generate 400 '{"text":"hi","sampling_params":{"top_k":-7}}'
bad n_too_many /v1/chat/completions 400 '{"messages":[{"role":"user","content":"x"}],"n":17}'
bad response_format_type /v1/chat/completions 400 '{"messages":[{"role":"user","content":"x"}],"response_format":{"type":"xml"}}'
bad two_constraints /generate 400 '{"text":"hi","sampling_params":{"regex":"[0-9]+","ebnf":"root ::= \"a\""}}'
bad rep_penalty /generate 400 '{"text":"hi","sampling_params":{"repetition_penalty":0}}'
bad stream_string /v1/completions 400 '{"prompt":"hi","stream":"yes"}'
bad invalid_utf8 /v1/completions 400 "$(printf '{"prompt":"\xff\xfe bad"}')"
bad unknown_model /v1/completions 404 '{"model":"gpt-4o","prompt":"hi"}'
bad embeddings_on_lm /v1/embeddings 400 '{"input":"hi"}'
bad body_too_large /v1/completions 413 '{"prompt":"'"$BIG"'"}'
curl -s -o "$T/bad_route.json" -w '%{http_code}' "${AUTH[@]}" "$BASE/v1/nothing" >"$T/bad_route.status"
$CHECK error "$T/bad_route.json" "$T/bad_route.status" 404 || fail "unknown route"
[[ "$(curl -s -o /dev/null -w '%{http_code}' "$BASE/health")" == 200 ]] || fail "server unhealthy after bad inputs"
post after_bad /v1/completions '{"prompt":"still alive?","max_tokens":2}'
expect_status after_bad 200

echo "== 60 mutated request bodies: each a 200 or a 4xx with an error body, never a 5xx"
python3 - "$PORT" "$KEY" <<'PY' || fail "mutated bodies"
import http.client, json, random, sys
port, key = int(sys.argv[1]), sys.argv[2]
seeds = [("/v1/chat/completions", {"messages": [{"role": "user", "content": "héllo ✓"}], "max_tokens": 2, "stop": ["a"],
          "chat_template_kwargs": {"enable_thinking": False}, "logprobs": True, "top_logprobs": 1}),
         ("/v1/completions", {"prompt": [9707, 11, 1879], "max_tokens": 2, "stream": True}),
         ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 2, "top_k": 3}, "return_logprob": True})]
rnd = random.Random(7)
counts = {}
for i in range(60):
    path, seed = seeds[i % len(seeds)]
    b = bytearray(json.dumps(seed, ensure_ascii=False).encode())
    op = rnd.randrange(4)
    if op == 0: del b[rnd.randrange(len(b)):]
    elif op == 1: b[rnd.randrange(len(b))] = rnd.randrange(256)
    elif op == 2: b.insert(rnd.randrange(len(b)), ord(rnd.choice('{}[],:"0-e\\')))
    else:
        x, y = rnd.randrange(len(b)), rnd.randrange(len(b)); b[x], b[y] = b[y], b[x]
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("POST", path, bytes(b), {"Content-Type": "application/json", "Authorization": "Bearer " + key})
    r = c.getresponse(); body = r.read()
    assert r.status < 500, (path, bytes(b), r.status, body[:300])
    if r.status != 200:
        assert "error" in json.loads(body), body
    counts[r.status] = counts.get(r.status, 0) + 1
print("   statuses:", dict(sorted(counts.items())))
PY
[[ "$(curl -s -o /dev/null -w '%{http_code}' "$BASE/health")" == 200 ]] || fail "server unhealthy after mutated bodies"

echo "== /flush_cache and /metrics accounting"
post flush /flush_cache '{}'
expect_status flush 200
TOTAL=$(metric 'kiln_kv_pages_total{model_name="demo"}')
FREE=$(metric 'kiln_kv_pages_free{model_name="demo"}')
USED=$(metric 'kiln_kv_pages_used{model_name="demo"}')
[[ "$USED" == 0 && "$FREE" == "$TOTAL" ]] || fail "after flush: used $USED, free $FREE of $TOTAL pages"
ACC=$(metric 'kiln_server_requests_accepted_total{model_name="demo"}')
DONE=$(metric 'kiln_server_requests_finished_total{model_name="demo",outcome="completed"}')
[[ "$ACC" == "$DONE" ]] || fail "accepted $ACC != completed $DONE"
REJ=$(metric 'kiln_server_requests_rejected_total{model_name="demo",reason="invalid"}')
((REJ >= 21)) || fail "only $REJ invalid requests counted"
echo "   pages $FREE/$TOTAL free, accepted $ACC = completed $DONE, rejected invalid $REJ"

echo "== SIGTERM drains an in-flight stream, then exits 0"
curl -sN "${AUTH[@]}" "${JSON[@]}" "$BASE/v1/completions" \
  -d '{"prompt":"Count:","max_tokens":40,"temperature":0,"ignore_eos":true,"stream":true}' >"$T/drain.sse" &
CURL_PID=$!
for _ in $(seq 1 400); do [[ -s "$T/drain.sse" ]] && break; sleep 0.05; done
stop_server
wait "$CURL_PID" || true
grep -q '"finish_reason":"length"' "$T/drain.sse" || fail "the in-flight stream did not finish during the drain"
tail -c 16 "$T/drain.sse" | grep -q '\[DONE\]' || fail "drained stream lacks [DONE]"
SUMMARY1=$(grep 'stopped. accepted' "$SERVER_LOG" | sed 's/^kiln serve: //')

echo "== queue limit -> 503 with Retry-After; a second SIGTERM aborts in-flight requests"
start_server queue --model "$FIXTURES/demo" --max-total-tokens 2048 --max-running-requests 1 --max-queue 1
for k in 1 2 3 4 5 6; do
  curl -sN -D "$T/q$k.headers" -o "$T/q$k.body" "${JSON[@]}" "$BASE/v1/completions" \
    -d '{"prompt":"Count:","max_tokens":1800,"ignore_eos":true,"stream":true}' &
done
for _ in $(seq 1 400); do
  (($(grep -l '^HTTP/1.1 ' "$T"/q?.headers 2>/dev/null | wc -l) == 6)) && break
  sleep 0.05
done
BUSY=$(grep -l '^HTTP/1.1 503' "$T"/q?.headers | wc -l)
((BUSY >= 4)) || fail "expected at least 4 of 6 requests refused with 503 (1 running + 1 queued), got $BUSY"
for h in $(grep -l '^HTTP/1.1 503' "$T"/q?.headers); do
  grep -qi '^Retry-After: 1' "$h" || fail "503 without Retry-After"
  $CHECK error "${h%.headers}.body" <(echo 503) 503 || fail "503 body shape"
done
kill -TERM "$SERVER_PID"
sleep 0.5
kill -TERM "$SERVER_PID"
rc=0
wait "$SERVER_PID" || rc=$?
SERVER_PID=""
wait
[[ $rc -eq 0 ]] || fail "server exited with $rc after two signals"
grep -q 'aborting' "$SERVER_LOG" || fail "the second signal did not abort"
SUMMARY2=$(grep 'stopped. accepted' "$SERVER_LOG" | sed 's/^kiln serve: //')
# Every accepted request ends completed or aborted, and the second signal aborted at least one. (How many
# finish first depends on this machine's load: the running request may end inside the first signal's drain,
# which failed CI once with 300 tokens; 1800 make that unlikely, the check no longer depends on it.)
if [[ $SUMMARY2 =~ accepted\ ([0-9]+):\ completed\ ([0-9]+),\ error\ 0,\ aborted\ ([0-9]+)\;.*busy\ ([0-9]+), ]]; then
  ((BASH_REMATCH[1] == 6 - BUSY && BASH_REMATCH[2] + BASH_REMATCH[3] == 6 - BUSY && BASH_REMATCH[3] >= 1 &&
    BASH_REMATCH[4] == BUSY)) || fail "accounting after abort: $SUMMARY2"
else
  fail "accounting after abort: $SUMMARY2"
fi
echo "== --is-embedding serves the generation checkpoint for /v1/embeddings, and refuses generation"
start_server isemb --model "$FIXTURES/demo" --is-embedding --max-total-tokens 2048
post isemb_ok /v1/embeddings '{"input":["hello world","x"],"dimensions":8}'
expect_status isemb_ok 200
python3 - "$T/isemb_ok.json" <<'PY' || fail "--is-embedding: $(head -c 300 "$T/isemb_ok.json")"
import json, math, sys
d = json.load(open(sys.argv[1]))["data"]
assert len(d) == 2 and all(len(e["embedding"]) == 8 for e in d)
assert all(abs(math.sqrt(sum(x * x for x in e["embedding"])) - 1) < 1e-4 for e in d)
assert d[0]["embedding"] != d[1]["embedding"]
PY
post isemb_gen /v1/completions '{"prompt":"a","max_tokens":2}'
expect_status isemb_gen 400
post isemb_empty /v1/embeddings '{"input":""}'
expect_status isemb_empty 400
stop_server

echo "PASS test_curl ($SUMMARY1 | queue test: $SUMMARY2)"
