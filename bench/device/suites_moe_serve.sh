# bench/device.sh's moe-serve suite (sourced): issue 44's serving and prefill targets on the Qwen3-30B-A3B shape
# (random weights: the router spreads tokens about uniformly, the case where a step reads the most experts).
# shellcheck shell=bash disable=SC2154  # here, suite, W, K, S: set by device.sh and lib.sh

# moe_serve_run W MODEL: kiln serve with BF16 or FP8 (quantized at load) experts; 2048 in / 1024 out at C = 10
# (TPOT p50 <= 6 ms: vLLM on an H100, TP 1, untuned: 13.18 ms) and 1024 in / 256 out at C = 64 (>= 3,500 out
# tok/s with BF16 weights), MOE_NUM_10 and MOE_NUM_64 prompts (default 20 and 128, far below `kiln bench serve`'s
# default: say so beside the figures).
moe_serve_run() {
  local w=$1 m=$2 q=() f
  [[ $w == fp8 ]] && q=(--quantization fp8)
  serve_start "moe_$w" 0 --model "$m" --load-format random --device "${DEVICE:-cuda}" --served-model-name shape \
    --max-running-requests 64 "${q[@]}" || return
  grep -h 'KV pool' "$SERVE_LOG" | head -1
  bench_serve "c10_$w" "$SERVE_PORT" "${MOE_SECONDS:-120}" --input-len "${MOE_IN_10:-2048}" \
    --output-len "${MOE_OUT_10:-1024}" --concurrency 10 --num-prompts "${MOE_NUM_10:-20}" --warmups 2
  serve_row "${MOE_IN_10:-2048}/${MOE_OUT_10:-1024} C=10, $w experts" "c10_$w" $?
  f=$(serve_value "c10_$w" tpot_p50)
  row "C=10 TPOT p50, $w experts" "$f ms (target <= 6: $(verdict "$f" "<=" 6))"
  bench_serve "c64_$w" "$SERVE_PORT" "${MOE_SECONDS:-120}" --input-len "${MOE_IN_64:-1024}" \
    --output-len "${MOE_OUT_64:-256}" --concurrency 64 --num-prompts "${MOE_NUM_64:-128}" --warmups 2
  serve_row "${MOE_IN_64:-1024}/${MOE_OUT_64:-256} C=64, $w experts" "c64_$w" $?
  f=$(serve_value "c64_$w" out_tok_s)
  row "C=64 out tok/s, $w experts" "$f (BF16 target >= 3500: $(verdict "$f" ">=" 3500))"
  serve_stop
}

# One 8192-token prompt of the 30B-A3B shape beside the dense 4B shape (about the same active weights: 3.3 B
# against 4.0 B), then the serving rows with BF16 experts and (MOE_FP8=1, the default) FP8 experts. SHAPE=demo
# DEVICE=cpu KILN=build/cpu/bin/kiln MOE_IN_10=32 MOE_OUT_10=8 MOE_NUM_10=2 MOE_IN_64=32 MOE_OUT_64=8 MOE_NUM_64=4:
# a CPU dry run of the serving part. MODEL_ROWS=0: the serving part only.
suite_moe_serve() {
  [[ ${DEVICE:-cuda} == cpu ]] || need_gpu || return
  build kiln || return
  if [[ ${DEVICE:-cuda} == cpu || ${MODEL_ROWS:-1} == 0 ]]; then
    row "kiln bench model rows" "skipped: DEVICE=cpu or MODEL_ROWS=0 (the serving part only)"
  else
    tune qwen3-30b-a3b 8192 64
    tune qwen3-4b 8192 64
    bench_model "30B-A3B one 8192-token prompt, BF16" --shape qwen3-30b-a3b --context 2 --steps 1 --prefill 8192 \
      --no-breakdown
    bench_model "4B (dense, about the same active size) one 8192-token prompt, BF16" --shape qwen3-4b --context 2 \
      --steps 1 --prefill 8192 --no-breakdown
  fi
  local m=$S/moe-serve-model-${SHAPE:-30b-a3b}
  shape_model "$m" "${SHAPE:-30b-a3b}" --arch moe || return
  moe_serve_run bf16 "$m"
  [[ ${MOE_FP8:-1} == 1 ]] && moe_serve_run fp8 "$m"
  return 0
}
