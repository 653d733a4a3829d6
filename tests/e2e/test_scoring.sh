#!/usr/bin/env bash
# Prompt log-probabilities and the Qwen3-Reranker through curl (issue 46): vLLM's prompt_logprobs on both
# OpenAI routes, completions echo + logprobs as lm-eval-harness' loglikelihood reads it, SGLang's
# logprob_start_len, the named limit, and /v1/rerank, /rerank, /score, /v1/score on the demo checkpoint
# served with --task rerank, each score checked against sigmoid(logprob(yes) - logprob(no)) taken from the
# prompt logprobs of the same prompt followed by "yes" and by "no".
# Usage: test_scoring.sh KILN FIXTURES_DIR SRC_DIR
KILN=$1
FIXTURES=$2
source "$(dirname "$0")/lib.sh"
command -v curl >/dev/null || skip "curl is not installed"
command -v python3 >/dev/null || skip "python3 is not installed"
T="$E2E_LOG_DIR"

post() {  # post NAME PATH BODY: body in $T/NAME.json, status echoed
  curl -s -o "$T/$1.json" -w '%{http_code}' -X POST -H "Content-Type: application/json" "$BASE$2" --data-binary "$3"
}
check() {  # check NAME PYTHON: asserts over the JSON bodies ($T/*.json loaded as b["NAME"])
  python3 - "$T" "$2" <<'PY' || fail "$1"
import glob, json, math, os, sys
b = {os.path.basename(p)[:-5]: json.load(open(p)) for p in glob.glob(sys.argv[1] + "/*.json")}
exec(sys.argv[2])
PY
}

start_server scoring --model "$FIXTURES/demo" --max-total-tokens 4096 --task rerank --max-prompt-logprob-tokens 100

echo "== prompt_logprobs (vLLM) on /v1/completions and /v1/chat/completions"
PROMPT='"The capital of France is Paris, and the capital of Spain is"'
[[ $(post pl /v1/completions '{"prompt":'"$PROMPT"',"max_tokens":1,"temperature":0,"prompt_logprobs":2}') == 200 ]] || fail "prompt_logprobs: $(cat "$T/pl.json")"
check "vLLM prompt_logprobs shape" '
c = b["pl"]["choices"][0]; pl = c["prompt_logprobs"]; n = b["pl"]["usage"]["prompt_tokens"]
assert len(pl) == n and pl[0] is None, (len(pl), n)
for e in pl[1:]:
    assert 1 <= len(e) <= 3, e
    for k, v in e.items():
        assert int(k) >= 0 and v["logprob"] <= 0 and v["rank"] >= 1 and isinstance(v["decoded_token"], str), e
    assert min(v["rank"] for v in e.values()) == 1, e
'
[[ $(post plc /v1/chat/completions '{"messages":[{"role":"user","content":"hi there"}],"max_tokens":1,"prompt_logprobs":0}') == 200 ]] || fail "chat prompt_logprobs: $(cat "$T/plc.json")"
check "chat prompt_logprobs at the top level" '
j = b["plc"]; pl = j["prompt_logprobs"]
assert len(pl) == j["usage"]["prompt_tokens"] and pl[0] is None and all(len(e) == 1 for e in pl[1:]), pl
'

echo "== completions echo + logprobs (lm-eval-harness loglikelihood) equals prompt_logprobs"
[[ $(post echo /v1/completions '{"prompt":'"$PROMPT"',"max_tokens":1,"temperature":0,"echo":true,"logprobs":1}') == 200 ]] || fail "echo logprobs: $(cat "$T/echo.json")"
check "echo logprobs" '
c = b["echo"]["choices"][0]; lp = c["logprobs"]; n = b["echo"]["usage"]["prompt_tokens"]
ref = b["pl"]["choices"][0]["prompt_logprobs"]
assert c["text"].startswith("The capital of France is Paris"), c["text"]
assert len(lp["tokens"]) == n + 1 and lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
assert "".join(lp["tokens"][:n]) == "The capital of France is Paris, and the capital of Spain is"
for p in range(1, n):
    own = [v["logprob"] for v in ref[p].values()]
    assert lp["token_logprobs"][p] in own, (p, lp["token_logprobs"][p], ref[p])
    top = lp["top_logprobs"][p]
    assert max(top.values()) == min(v["logprob"] for v in ref[p].values() if v["rank"] == 1), (top, ref[p])
    assert lp["token_logprobs"][p] in top.values()
offs = lp["text_offset"]
assert offs[0] == 0 and all(offs[i] + len(lp["tokens"][i]) == offs[i + 1] for i in range(n)), offs
ctxlen = 3  # what lm-eval sums: token_logprobs[ctxlen:-1]
assert all(isinstance(x, float) for x in lp["token_logprobs"][ctxlen:-1])
'

[[ $(post echo0 /v1/completions '{"prompt":'"$PROMPT"',"max_tokens":0,"echo":true,"logprobs":1}') == 200 ]] || fail "echo, max_tokens 0: $(cat "$T/echo0.json")"
check "echo with max_tokens 0 scores the prompt only" '
c = b["echo0"]["choices"][0]; n = b["echo"]["usage"]["prompt_tokens"]
assert c["logprobs"]["token_logprobs"] == b["echo"]["choices"][0]["logprobs"]["token_logprobs"][:n], c
assert c["text"] == "The capital of France is Paris, and the capital of Spain is" and b["echo0"]["usage"]["completion_tokens"] == 0
'
[[ $(post nomax /v1/completions '{"prompt":"a","max_tokens":0}') == 400 ]] || fail "max_tokens 0 without echo not refused"

echo "== /generate input_token_logprobs (SGLang)"
[[ $(post gen /generate '{"text":'"$PROMPT"',"sampling_params":{"max_new_tokens":1,"temperature":0},"return_logprob":true,"logprob_start_len":0,"top_logprobs_num":1}') == 200 ]] || fail "generate: $(cat "$T/gen.json")"
[[ $(post gen2 /generate '{"text":'"$PROMPT"',"sampling_params":{"max_new_tokens":1,"temperature":0},"return_logprob":true,"logprob_start_len":4}') == 200 ]] || fail "generate start 4"
[[ $(post gen3 /generate '{"text":'"$PROMPT"',"sampling_params":{"max_new_tokens":1,"temperature":0},"return_logprob":true}') == 200 ]] || fail "generate default start"
check "input_token_logprobs" '
m = b["gen"]["meta_info"]; il = m["input_token_logprobs"]; n = m["prompt_tokens"]
echo = b["echo"]["choices"][0]["logprobs"]["token_logprobs"]
assert len(il) == n and il[0][0] is None and m["input_top_logprobs"][0] is None
assert [x[0] for x in il[1:]] == echo[1:n], "the same values as echo"
assert all(len(t) == 1 for t in m["input_top_logprobs"][1:])
m2 = b["gen2"]["meta_info"]["input_token_logprobs"]
assert len(m2) == n - 4 and m2[0][0] is None and [x[0] for x in m2[1:]] == echo[5:n] and [x[1] for x in m2] == [x[1] for x in il[4:]]
m3 = b["gen3"]["meta_info"]["input_token_logprobs"]
assert len(m3) == 1 and m3[0][0] is None and m3[0][1] == il[-1][1]
'

echo "== refusals: streaming, the named limit"
[[ $(post r1 /v1/completions '{"prompt":"a b","max_tokens":1,"prompt_logprobs":1,"stream":true}') == 400 ]] || fail "stream + prompt_logprobs not refused"
[[ $(post r2 /v1/completions '{"prompt":"a b","max_tokens":1,"echo":true,"logprobs":1,"stream":true}') == 400 ]] || fail "stream + echo logprobs not refused"
[[ $(post r3 /v1/completions '{"prompt":"a b","max_tokens":1,"prompt_logprobs":21}') == 400 ]] || fail "prompt_logprobs 21 not refused"
LONG=$(python3 -c 'print("\"" + " word" * 150 + "\"")')
[[ $(post r4 /v1/completions '{"prompt":'"$LONG"',"max_tokens":1,"prompt_logprobs":0}') == 400 ]] || fail "over the limit not refused"
check "limit named" 'assert "max_prompt_logprob_tokens = 100" in b["r4"]["error"]["message"], b["r4"]'
[[ $(post r5 /v1/completions '{"prompt":'"$LONG"',"max_tokens":1}') == 200 ]] || fail "the same prompt without prompt logprobs"

echo "== rerank and score equal sigmoid(logprob(yes) - logprob(no)) from prompt logprobs"
Q='"What is the capital of China?"'
[[ $(post rr /v1/rerank '{"query":'"$Q"',"documents":["The capital of China is Beijing.","Gravity is a force.",{"text":"Paris"}]}') == 200 ]] || fail "rerank: $(cat "$T/rr.json")"
[[ $(post rr3 /v2/rerank '{"query":'"$Q"',"documents":["Paris"]}') == 200 ]] || fail "/v2/rerank"
[[ $(post rr2 /rerank '{"query":'"$Q"',"documents":["The capital of China is Beijing.","Gravity is a force.",{"text":"Paris"}],"top_n":1,"return_documents":false}') == 200 ]] || fail "/rerank"
[[ $(post sc /score '{"text_1":'"$Q"',"text_2":["The capital of China is Beijing.","Gravity is a force.","Paris"]}') == 200 ]] || fail "score: $(cat "$T/sc.json")"
[[ $(post sc2 /v1/score '{"text_1":['"$Q"','"$Q"'],"text_2":["The capital of China is Beijing.","Paris"]}') == 200 ]] || fail "/v1/score N x N"
[[ $(post sc3 /v1/score '{"text_1":['"$Q"','"$Q"'],"text_2":["a","b","c"]}') == 400 ]] || fail "/v1/score length mismatch not refused"
check "rerank shapes" '
r = b["rr"]; s = [x["score"] for x in b["sc"]["data"]]
assert [x["index"] for x in r["results"]] == sorted(range(3), key=lambda i: -s[i]), (r, s)
assert all(abs(x["relevance_score"] - s[x["index"]]) < 1e-12 and 0 < x["relevance_score"] < 1 for x in r["results"])
assert r["results"][0]["document"]["text"] in ("The capital of China is Beijing.", "Gravity is a force.", "Paris")
assert r["usage"]["total_tokens"] == b["sc"]["usage"]["prompt_tokens"] > 0 and r["id"].startswith("rerank-")
r2 = b["rr2"]["results"]; assert len(r2) == 1 and "document" not in r2[0] and r2[0]["index"] == r["results"][0]["index"]
assert [x["index"] for x in b["sc2"]["data"]] == [0, 1] and abs(b["sc2"]["data"][1]["score"] - s[2]) < 1e-12
assert b["sc"]["object"] == "list" and b["sc"]["data"][0]["object"] == "score"
'
# The reranker prompt, tokenized as the model card does, followed by "yes" / "no": its last prompt logprob.
tok() { curl -s -X POST -H "Content-Type: application/json" "$BASE/tokenize" --data-binary "$(python3 -c 'import json,sys; print(json.dumps({"prompt": sys.argv[1], "add_special_tokens": False}))' "$1")" | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)["tokens"]))'; }
PREFIX=$(tok $'<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n')
MID=$(tok $'<Instruct>: Given a web search query, retrieve relevant passages that answer the query\n<Query>: What is the capital of China?\n<Document>: Gravity is a force.')
SUFFIX=$(tok $'<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n')
YES=$(tok yes)
NO=$(tok no)
IDS=$(python3 -c 'import json,sys; print(json.dumps(sum((json.loads(a) for a in sys.argv[1:]), [])))' "$PREFIX" "$MID" "$SUFFIX")
[[ $(post py /v1/completions '{"prompt":'"$(python3 -c 'import json,sys; print(json.dumps(json.loads(sys.argv[1]) + json.loads(sys.argv[2])))' "$IDS" "$YES")"',"max_tokens":1,"prompt_logprobs":0}') == 200 ]] || fail "yes prompt: $(cat "$T/py.json")"
[[ $(post pn /v1/completions '{"prompt":'"$(python3 -c 'import json,sys; print(json.dumps(json.loads(sys.argv[1]) + json.loads(sys.argv[2])))' "$IDS" "$NO")"',"max_tokens":1,"prompt_logprobs":0}') == 200 ]] || fail "no prompt"
check "score formula" '
ly = list(b["py"]["choices"][0]["prompt_logprobs"][-1].values())[0]["logprob"]
ln = list(b["pn"]["choices"][0]["prompt_logprobs"][-1].values())[0]["logprob"]
want = 1 / (1 + math.exp(ln - ly)); got = b["sc"]["data"][1]["score"]
assert abs(got - want) < 1e-6, (got, want)
assert b["sc"]["usage"]["prompt_tokens"] >= 3 * (len(b["py"]["choices"][0]["prompt_logprobs"]) - 1 - 5)
'
stop_server

echo "== without --task rerank the rerank routes answer 400; --log-level debug lists the fields kiln ignored"
start_server plain --model "$FIXTURES/demo" --max-total-tokens 4096 --log-level debug
[[ $(post nr /v1/rerank '{"query":"q","documents":["d"]}') == 400 ]] || fail "rerank without --task rerank"
check "named flag" 'assert "--task rerank" in b["nr"]["error"]["message"], b["nr"]'
[[ $(post uk /v1/completions '{"prompt":"a","max_tokens":1,"made_up_field":1,"user":"u","temperature":0}') == 200 ]] || fail "unknown fields are accepted"
grep -q 'POST /v1/completions: fields not read by kiln (ignored): made_up_field, user' "$SERVER_LOG" || fail "no debug line for the ignored fields"
[[ $(post kn /generate '{"text":"a","sampling_params":{"max_new_tokens":1},"return_logprob":true,"logprob_start_len":0}') == 200 ]] || fail "generate"
grep -q 'POST /generate: fields not read' "$SERVER_LOG" && fail "a known field was logged as ignored"
stop_server
echo "PASS"
