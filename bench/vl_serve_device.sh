#!/usr/bin/env bash
# Issue 12's serving half on the H200, one device call (carry .deps/sysroot):
#     OUT=DIR bash bench/vl_serve_device.sh
#  1. builds kiln and test_cuda_vision (scripts/device_build.sh) and runs test_cuda_vision (the engine with
#     images, decode graphs vs eager vs M-RoPE on every step);
#  2. a Qwen3-VL-4B-shaped checkpoint: `kiln demo-model --arch vl` with text_config and vision_config set to
#     Qwen3-VL-4B-Instruct's sizes, random weights (--load-format random);
#  3. the seed's image check (item 7): the same greedy image chat requests (the fixture images, 64 tokens)
#     against kiln serve with its defaults (fused attention preparation, decode CUDA graphs), with
#     KILN_ATTN_PREP=unfused, and with --disable-cuda-graph, sent one at a time (the same batches on every
#     server: the token sequences must be identical) and 8 in flight (batches as the timing falls: a graph
#     pads the batch to its bucket and the GEMMs see another M, so near-ties may split); identical
#     contents, or where they split the token and the default run's top-2 margin there;
#  4. item 8: TTFT of a one-image chat request (448x448 PNG, streamed, 16 in a row), and `kiln bench serve
#     --image` (448x448, 128 random text tokens around it, 128 out) at C = 1, 8, 32.
# Env: KILN (binary; default: build it), LEVELS ("1 8 32"); a CPU dry run of the flow on the demo checkpoint:
#     KILN=build/cpu/bin/kiln DEVICE=cpu SHAPE=demo LEVELS=1 OUT=/tmp/x bash bench/vl_serve_device.sh
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/kiln-out}
mkdir -p "$out"
export PATH=/usr/local/cuda/bin:$PATH
export KILN_TUNE_CACHE=${KILN_TUNE_CACHE:-/tmp/kiln-gemm-tactics.txt}
K=${KILN:-build/device/bin/kiln}
t0=$(date +%s)
el() { echo "$(($(date +%s) - t0)) s"; }
summary=()
if [[ -z ${KILN:-} ]]; then
  bash scripts/device_build.sh kiln test_cuda_vision >"$out/build.log" 2>&1
  summary+=("build rc=$? ($(el))")
  build/device/tests/test_cuda_vision >"$out/test_cuda_vision.log" 2>&1
  summary+=("test_cuda_vision rc=$? ($(el)): $(grep -E '^\[  (PASSED|FAILED) ' "$out/test_cuda_vision.log" | tr '\n' ' ')")
fi
source bench/serve_lib.sh

m=/tmp/kiln-qwen3-vl-${SHAPE:-4b}-shape
"$K" demo-model "$m" --arch vl >/dev/null
[[ ${SHAPE:-4b} == demo ]] || python3 - "$m/config.json" <<'PY'
import json, sys
p = sys.argv[1]
c = json.load(open(p))
c["text_config"].update(hidden_size=2560, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                        head_dim=128, intermediate_size=9728, vocab_size=151936, max_position_embeddings=40960)
c["text_config"].pop("layer_types", None)
c["text_config"]["rope_scaling"]["mrope_section"] = [24, 20, 20]
c["vision_config"].update(depth=24, hidden_size=1024, intermediate_size=4096, num_heads=16, out_hidden_size=2560,
                          deepstack_visual_indexes=[5, 11, 17])
json.dump(c, open(p, "w"), indent=2)
PY
python3 - "$out/img448.png" <<'PY'
import sys, zlib, struct, random
# A 448x448 RGB PNG of smooth gradients and noise, written without PIL.
w = h = 448
r = random.Random(3)
rows = bytearray()
for y in range(h):
    rows.append(0)
    for x in range(w):
        rows += bytes(((x * 255) // w, (y * 255) // h, (x ^ y) & 255 if r.random() < 0.5 else 128))
def chunk(t, d):
    return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)
png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
png += chunk(b"IDAT", zlib.compress(bytes(rows), 6)) + chunk(b"IEND", b"")
open(sys.argv[1], "wb").write(png)
PY

common=(--model $m --load-format random --device ${DEVICE:-cuda} --served-model-name vl --max-running-requests 64)
port=8141
# check NAME: the item-7 requests against the fresh server, contents and logprobs to $out/check_NAME_seq.json
# (one at a time: the same batches of one on every server, and a request reuses only the cached pages of the
# one before it, computed alike, so the variants must agree bit for bit), then, after a cache flush, to
# $out/check_NAME.json (8 in flight: each server batches them as their timing falls).
check() {
  check_with 1 "$out/check_$1_seq.json"
  python3 -c "import urllib.request as u; u.urlopen(u.Request('http://127.0.0.1:$port/flush_cache', b'', method='POST'), timeout=30)"
  check_with 8 "$out/check_$1.json"
}
check_with() {
  python3 - "$port" "$1" "$2" tests/fixtures/vision/images/*.{png,jpg} "$out/img448.png" <<'PY'
import base64, json, sys, urllib.request, concurrent.futures as cf
port, par, dst, images = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
asks = ["Describe this image.", "What colours do you see?", "Count the objects.", "Write a caption."]
reqs = []
for i, path in enumerate(images):
    kind = "png" if path.endswith(".png") else "jpeg"
    url = f"data:image/{kind};base64," + base64.b64encode(open(path, "rb").read()).decode()
    for j in range(2):
        content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": asks[(i + j) % 4]}]
        reqs.append({"model": "vl", "messages": [{"role": "user", "content": content}], "temperature": 0,
                     "max_tokens": 64, "logprobs": True, "top_logprobs": 2})
def send(body):
    rq = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(),
                                {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(rq, timeout=600) as r:
            j = json.load(r)
        c = j["choices"][0]
        return {"content": c["message"]["content"], "tokens": [t["token"] for t in c["logprobs"]["content"]],
                "top": [[[a["token"], a["logprob"]] for a in t["top_logprobs"]] for t in c["logprobs"]["content"]]}
    except Exception as e:
        return {"error": str(e)}
with cf.ThreadPoolExecutor(par) as ex:
    res = list(ex.map(send, reqs))
json.dump(res, open(dst, "w"))
print(f"{len(res)} requests, {par} in flight, {sum('error' in r for r in res)} errors")
PY
}
serve_start defaults $port "${common[@]}" || exit 1
check defaults
summary+=("defaults: $(grep -h 'captured' "$SERVE_LOG" | tail -1 | cut -c1-160)")
# Item 8: TTFT of a one-image chat request, streamed, one at a time.
python3 - "$port" "$out/img448.png" >"$out/ttft_chat.txt" <<'PY'
import base64, json, sys, time, http.client, statistics
port, path = sys.argv[1], sys.argv[2]
url = "data:image/png;base64," + base64.b64encode(open(path, "rb").read()).decode()
body = json.dumps({"model": "vl", "stream": True, "max_tokens": 16, "temperature": 0, "messages": [
    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                 {"type": "text", "text": "Describe this image."}]}]})
ttft = []
for i in range(18):
    c = http.client.HTTPConnection("127.0.0.1", int(port), timeout=120)
    t = time.perf_counter()
    c.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    first = None
    for line in r:
        text = line.replace(b'"content":""', b"").replace(b'"reasoning_content":""', b"")
        if line.startswith(b"data: ") and (b'"content":"' in text or b'"reasoning_content":"' in text):
            first = time.perf_counter() - t
            break
    r.read()
    c.close()
    if first is not None and i >= 2:  # two warm-ups
        ttft.append(first * 1e3)
if not ttft:
    sys.exit("one-image chat request: no streamed text arrived")
print(f"one-image chat request (448x448, 196 image tokens), TTFT over {len(ttft)}: median {statistics.median(ttft):.1f} ms,"
      f" min {min(ttft):.1f}, max {max(ttft):.1f}")
PY
summary+=("$(cat "$out/ttft_chat.txt")")
for C in ${LEVELS:-1 8 32}; do
  "$K" bench serve --base-url http://127.0.0.1:$port --image "$out/img448.png" --input-len 128 --output-len 128 \
    --concurrency $C --num-prompts $((C < 4 ? 16 : 4 * C)) --warmups 2 --no-progress --out "$out/image_c$C" \
    >"$out/image_c$C.txt" 2>&1
  summary+=("bench serve --image C=$C rc=$?: $(grep -E '^C=' "$out/image_c$C.txt" | head -1)")
done
serve_stop
KILN_ATTN_PREP=unfused serve_start unfused $port "${common[@]}" || exit 1
grep -h "attention preparation" "$SERVE_LOG"
check unfused
serve_stop
serve_start eager $port "${common[@]}" --disable-cuda-graph || exit 1
check eager
serve_stop
python3 - "$out" <<'PY' >"$out/item7.txt"
import json, sys
d = sys.argv[1]
for other, seq in [(o, s) for s in ["", "_seq"] for o in ["unfused", "eager"]]:
    ref = json.load(open(f"{d}/check_defaults{seq}.json"))
    got = json.load(open(f"{d}/check_{other}{seq}.json"))
    same, notes = 0, []
    for i, (a, b) in enumerate(zip(ref, got)):
        if "error" in a or "error" in b:
            notes.append(f"#{i} error {a.get('error', '')}{b.get('error', '')}"[:160])
        elif a["tokens"] == b["tokens"]:
            same += 1
        else:
            k = next(k for k in range(min(len(a["tokens"]), len(b["tokens"]))) if a["tokens"][k] != b["tokens"][k])
            top = a["top"][k]
            margin = top[0][1] - top[1][1] if len(top) > 1 else float("nan")
            notes.append(f"#{i} splits at token {k}: {a['tokens'][k]!r} vs {b['tokens'][k]!r}, default top-2 margin {margin:.4f}")
    print(f"defaults vs {other}, {'one' if seq else 'eight'} in flight: {same}/{len(ref)} identical greedy token sequences; " + "; ".join(notes[:6]))
PY
summary+=("$(cat "$out/item7.txt")")
echo "---- summary ($(el))"
printf '%s\n' "${summary[@]}"
[[ -f $out/test_cuda_vision.log ]] && grep -hE "Failure|Expected|Which is" "$out"/test_cuda_vision.log | head -20
exit 0
