# bench/device.sh suites for Qwen3-VL, Hugging Face parity and the embedding fixtures (sourced).
# shellcheck shell=bash disable=SC2154  # here, suite, rows, W, K, BD: set by device.sh and lib.sh

# The image parity fixture generated here (CPU torch, ~1 min; $OUT/qwen3_vl_image_tiny.tgz: unpack it into
# tests/fixtures/hf and commit), the VL tests on it, and the Qwen3-VL-4B-shaped vision tower timed.
suite_vl() {
  need_gpu || return
  make_fixture make_hf_vl_image_fixture tests/fixtures/hf qwen3_vl_image_tiny.tgz qwen3_vl_image_tiny
  local tests=(test_hf_parity_vl_image test_engine_vl test_ops_vision test_cuda_vision test_cuda_vision_varlen
    test_cuda_model_vl)
  build kiln "${tests[@]}" || return
  local t
  for t in "${tests[@]}"; do run_test "$t"; done
  timeout 200 "$K" bench vision --device cuda --shape 4b --runs 5 >"$W/vl/bench_vision.txt" 2>&1
  row "bench vision (4B tower)" "rc=$? $(grep -E 'ms' "$W/vl/bench_vision.txt" | tail -3 | tr -s ' ' | cut -c1-60 | tr '\n' ' ')"
}

# Greedy image chats (the fixture images and a 448x448 PNG, two questions each, 64 tokens) against kiln serve's
# defaults, KILN_ATTN_PREP=unfused and --disable-cuda-graph, one at a time (must agree bit for bit) and 8 in
# flight; TTFT of a one-image chat request; `kiln bench serve --image` at LEVELS (default "1 8 32").
# SHAPE=demo DEVICE=cpu KILN=build/cpu/bin/kiln LEVELS=1: a CPU dry run of the flow.
suite_vl_serve() {
  [[ ${DEVICE:-cuda} == cpu ]] || need_gpu || return
  build kiln || return
  local m=$S/vl-serve-model port=8141 out=$W/vl-serve
  "$K" demo-model "$m" --arch vl >/dev/null || return
  [[ ${SHAPE:-4b} == demo ]] || python3 "$here/vl_config.py" "$m/config.json"
  python3 "$here/make_png.py" "$out/img448.png"
  local common=(--model "$m" --load-format random --device "${DEVICE:-cuda}" --served-model-name vl
    --max-running-requests 64)
  check() {  # NAME: one at a time, then (after a cache flush) 8 in flight
    python3 "$here/vl_check.py" "$port" 1 "$out/check_$1_seq.json" tests/fixtures/vision/images/*.{png,jpg} \
      "$out/img448.png"
    curl -s -X POST "http://127.0.0.1:$port/flush_cache" >/dev/null
    python3 "$here/vl_check.py" "$port" 8 "$out/check_$1.json" tests/fixtures/vision/images/*.{png,jpg} \
      "$out/img448.png"
  }
  serve_start defaults $port "${common[@]}" || return
  check defaults
  python3 "$here/vl_ttft.py" "$port" "$out/img448.png" >"$out/ttft_chat.txt" 2>&1
  row "one-image chat TTFT" "$(tail -1 "$out/ttft_chat.txt" | cut -c1-150)"
  local C
  for C in ${LEVELS:-1 8 32}; do
    bench_serve "image_c$C" $port 600 --image "$out/img448.png" --input-len 128 --output-len 128 --concurrency "$C" \
      --num-prompts $((C < 4 ? 16 : 4 * C)) --warmups 2
    serve_row "bench serve --image C=$C" "image_c$C" $?
  done
  serve_stop
  KILN_ATTN_PREP=unfused serve_start unfused $port "${common[@]}" || return
  check unfused
  serve_stop
  serve_start eager $port "${common[@]}" --disable-cuda-graph || return
  check eager
  serve_stop
  python3 "$here/vl_compare.py" "$out" >"$out/compare.txt" 2>&1
  local line
  while read -r line; do row "greedy image chats" "${line:0:200}"; done <"$out/compare.txt"
}

# The Qwen3-4B-shaped checkpoint and its transformers reference (GPU, ~2 min, ~8 GB under HF4B_DIR, default
# /tmp/hf4b) made in the background while the tiny VL fixture is generated (CPU; $OUT/qwen3_vl_tiny.tgz to
# unpack into tests/fixtures/hf and commit) and checked; then test_cuda_model_hf4b against the reference.
suite_parity() {
  need_gpu || return
  local hf4b=${HF4B_DIR:-/tmp/hf4b}
  python3 tests/fixtures/make_hf_4b_reference.py --out "$hf4b" >"$W/parity/make_hf_4b.log" 2>&1 &
  local pid4b=$!
  make_fixture make_hf_vl_fixture tests/fixtures/hf qwen3_vl_tiny.tgz qwen3_vl_tiny
  local vl=$?
  build kiln test_cuda_model_vl test_cuda_model_hf4b test_hf_parity_vl || { wait $pid4b; return; }
  ((vl == 0)) && run_test test_hf_parity_vl
  run_test test_cuda_model_vl
  wait $pid4b
  local rc4b=$?
  row "make_hf_4b_reference" "rc=$rc4b $(grep -E '^\{' "$W/parity/make_hf_4b.log" | tail -1 | cut -c1-120)"
  if ((rc4b == 0)); then
    cp "$hf4b/hf_reference.json" "$W/parity/hf4b_reference.json"
    run_test test_cuda_model_hf4b -- KILN_HF4B_DIR="$hf4b"
    grep -hE "^hf4b " "$W/parity/test_cuda_model_hf4b.log" | head -12
  fi
}

# The Qwen3-Embedding fixtures (tests/fixtures/hf, made by tests/fixtures/make_hf_embedding_fixture.py) on CUDA
# against sentence-transformers' vectors. REGEN=1 regenerates them first (CPU torch, ~30 s; packed to $OUT).
suite_embed() {
  need_gpu || return
  if [[ ${REGEN:-0} == 1 ]]; then
    make_fixture make_hf_embedding_fixture tests/fixtures/hf embedding_fixtures.tgz 'qwen3_embedding_*'
  fi
  build test_cuda_embedding_hf || return
  run_test test_cuda_embedding_hf
}

# The embedding fixtures of issue 41 point 8 (real tokenizer, one KV head, vocab 151,936 and 151,669), the GEMMs
# of any N and K, and `kiln serve --device cuda` on the odd vocabulary (bench/device/embedding_any_shape.sh).
suite_embed_any_shape() {
  need_gpu || return
  local d="$W/embed-any-shape"
  mkdir -p "$d"
  bash bench/device/embedding_any_shape.sh "$d" >"$d/run.log" 2>&1
  row "embedding_any_shape.sh" "rc=$?"
  sed -n '/^---- summary/,$p' "$d/run.log"
  [[ -f $d/hf_embedding_point8.tgz ]] && keep "$d/hf_embedding_point8.tgz"
}
