# bench/device.sh suites that serve: the sweep, the second SGLang seed's workloads, readiness, greedy checks,
# the HTTP layer at scale (sourced). Each starts kiln serve on a Qwen3 shape with random weights
# (--load-format random: the weights are drawn on the GPU; no checkpoint is read).
# shellcheck shell=bash disable=SC2154  # here, suite, rows, W, K, BD: set by device.sh and lib.sh

# shape_model DIR 4b|0.6b|demo [--embedding]: the demo checkpoint's tokenizer with a Qwen3 shape's config.json
# (the demo tokenizer's ids are all below the shape's vocabulary); demo: as written.
shape_model() {
  local dir=$1 shape=$2
  shift 2
  "$K" demo-model "$dir" "$@" >/dev/null || return 1
  [[ $shape == demo ]] && return 0
  python3 "$here/shape_config.py" "$dir/config.json" "$shape"
}

# serve_start NAME PORT ARGS...: kiln serve in the background (SERVE_PID, SERVE_LOG); waits for READY
# (READY_TIMEOUT seconds, default 120). SERVE_PORT: the port it listens on (PORT 0: a free one, from READY).
serve_start() {
  local name=$1 port=$2
  shift 2
  SERVE_LOG="$W/$suite/serve_$name.log"
  SERVE_OUT="$W/$suite/serve_$name.out"
  "$K" serve --port "$port" "$@" >"$SERVE_OUT" 2>"$SERVE_LOG" &
  SERVE_PID=$!
  local _
  for _ in $(seq 1 $((${READY_TIMEOUT:-120} * 10))); do
    if grep -q '^READY ' "$SERVE_OUT" 2>/dev/null; then
      # shellcheck disable=SC2034  # read by the suites that serve on a free port (fp8-serve)
      SERVE_PORT=$(sed -n 's/^READY http:\/\/[^:]*:\([0-9]*\)$/\1/p' "$SERVE_OUT")
      return 0
    fi
    kill -0 "$SERVE_PID" 2>/dev/null || break
    sleep 0.1
  done
  row "kiln serve ($name)" "did not start: see $suite/serve_$name.log"
  tail -20 "$SERVE_LOG"
  kill -TERM "$SERVE_PID" 2>/dev/null
  return 1
}

# serve_stop: SIGTERM, wait, the server's accounting line.
serve_stop() {
  kill -TERM "$SERVE_PID" 2>/dev/null
  wait "$SERVE_PID"
  grep -h 'stopped. accepted\|captured' "$SERVE_LOG" | tail -2
}

# bench_serve NAME PORT SECONDS FLAGS...: `kiln bench serve` against the server on PORT with FLAGS (lengths,
# levels, counts), cut at SECONDS: its table in $W/$suite/NAME.txt, everything in NAME.json / .md / .svg. Returns
# its exit status (3: a level was invalid; 124: cut off).
bench_serve() {
  local name=$1 port=$2 secs=$3
  shift 3
  timeout "$secs" "$K" bench serve --base-url "http://127.0.0.1:$port" --out "$W/$suite/$name" --no-progress "$@" \
    >"$W/$suite/$name.txt" 2>&1
}

# serve_row WHAT NAME RC: the summary row of bench_serve run NAME: its exit status and each level's figures.
serve_row() { row "$1" "rc=$3 $(python3 "$here/figures.py" serve "$W/$suite/$2.json")"; }

# serve_value NAME METRIC [C]: one figure of bench_serve run NAME (level C, default the first), or n/a.
serve_value() { python3 "$here/figures.py" value "$W/$suite/$1.json" "${@:2}"; }

# CONC, NUM (levels and prompts a level), IN, OUTLEN, KV (auto|fp8_e4m3), SHAPE (4b|0.6b), MAX_RUNNING (128),
# SWEEP_SECONDS, SERVE_ARGS (more kiln serve flags). The counts
# are far below `kiln bench serve`'s defaults: say so next to any figure taken with them.
suite_serve() {
  need_gpu || return
  build kiln || return
  local m=$S/serve-model kv=${KV:-auto}
  shape_model "$m" "${SHAPE:-4b}" || return
  # shellcheck disable=SC2086
  serve_start "$kv" 8123 --model "$m" --load-format random --device cuda --served-model-name shape \
    --max-running-requests "${MAX_RUNNING:-128}" --kv-cache-dtype "$kv" ${SERVE_ARGS:-} || return
  grep -h 'KV pool\|captured' "$SERVE_LOG" | head -3
  bench_serve "sweep_$kv" 8123 "${SWEEP_SECONDS:-300}" --input-len "${IN:-8192}" --output-len "${OUTLEN:-1024}" \
    --concurrency "${CONC:-1,8,32}" --num-prompts "${NUM:-2,8,32}" --warmups 2 \
    --title "Qwen3-${SHAPE:-4b} shape, random bf16 weights, KV $kv"
  serve_row "sweep ${IN:-8192}/${OUTLEN:-1024}, C=${CONC:-1,8,32}, KV $kv" "sweep_$kv" $?
  grep -E '^\|' "$W/serve/sweep_$kv.txt" | head -12
  curl -s http://127.0.0.1:8123/metrics | grep -E "^kiln_(requests|preempt)" | head -8 >"$W/serve/metrics.txt"
  serve_stop
  [[ -f $W/serve/sweep_$kv.md ]] && keep "$W/serve/sweep_$kv.md"
}

# The second SGLang seed's workloads on the 4B shape: /generate 4096 in / 1 out at C = 4, 200 requests (p50
# is the figure), and /v1/embeddings of one 4,096- and one 8,192-id input a request on the embedding layout.
suite_seed() {
  need_gpu || return
  build kiln || return
  local m=$S/seed-model e=$S/seed-embed
  shape_model "$m" 4b || return
  serve_start generate 8126 --model "$m" --load-format random --device cuda --served-model-name shape \
    --max-running-requests 8 --chunked-prefill-size 8192 ${KV:+--kv-cache-dtype $KV} || return
  bench_serve generate_4096_1_c4 8126 300 --input-len 4096 --output-len 1 --concurrency 4 --num-prompts "${NUM:-200}" \
    --warmups 8
  serve_row "/generate 4096 in / 1 out, C=4" generate_4096_1_c4 $?
  serve_stop
  shape_model "$e" 4b --embedding || return
  serve_start embed 8127 --model "$e" --load-format random --device cuda --served-model-name embed || return
  local n
  for n in 4096 8192; do
    timeout 200 python3 "$here/embed_load.py" --port 8127 --model embed --ids "$n" --concurrency "${EMBED_C:-4}" \
      --requests "${EMBED_N:-64}" >"$W/seed/embed_$n.txt" 2>&1
    row "/v1/embeddings, $n ids an input" "rc=$? $(tail -1 "$W/seed/embed_$n.txt" | cut -c1-150)"
  done
  serve_stop
}

# Time from `kiln serve` to its READY line on the 4B shape: cold (an empty tactic cache: the GEMMs are tuned
# at load) and tuned (the cache the cold start wrote). MODEL=DIR times a real checkpoint (weights read
# from disk; run it twice for the page-cache-warm figure).
suite_ready() {
  need_gpu || return
  build kiln || return
  local m=${MODEL:-$S/ready-model} load=() cache=$S/ready-tactics.txt what t0 t1
  [[ -n ${MODEL:-} ]] || { shape_model "$m" 4b || return; load=(--load-format random); }
  rm -f "$cache"
  for what in cold tuned; do
    t0=$(date +%s.%N)
    KILN_TUNE_CACHE=$cache READY_TIMEOUT=600 serve_start "$what" 8128 --model "$m" "${load[@]}" --device cuda || return
    t1=$(date +%s.%N)
    serve_stop >/dev/null
    row "to READY, $what tactic cache" "$(python3 -c "print(f'{$t1 - $t0:.2f} s')") (${MODEL:-4B shape, random weights})"
  done
}

# VARIANTS: kiln serve flags (without --), or old-kernels (decode v2 + prefill v3 through KILN_ATTN_DECODE /
# KILN_ATTN_PREFILL). SHAPE (4b|0.6b|demo), KV, PROMPT_SCALE (1; 0.1 for a CPU dry run on the demo),
# MAX_RUNNING (64), DEVICE (cuda). 32 prompts of 10-3000 words, 64 greedy tokens each, 16 in flight.
suite_checks() {
  [[ ${DEVICE:-cuda} == cpu ]] || need_gpu || return
  build kiln || return
  local m=$S/checks-model-${SHAPE:-4b} out=$W/checks
  shape_model "$m" "${SHAPE:-4b}" || return
  python3 "$here/check_prompts.py" "$out/prompts.txt" "${PROMPT_SCALE:-1}"
  local common=(--model "$m" --load-format random --device "${DEVICE:-cuda}" --served-model-name shape
    --max-running-requests "${MAX_RUNNING:-64}" ${KV:+--kv-cache-dtype $KV})
  local eval_args=(--base-url http://127.0.0.1:8124 --concurrency 16 --timeout 600)
  serve_start defaults 8124 "${common[@]}" || return
  "$K" eval reference "${eval_args[@]}" --write --dump "$out/defaults.json" --prompts "$out/prompts.txt" \
    --max-tokens 64 >"$out/defaults.txt" 2>&1 || { row "defaults" "eval reference failed"; serve_stop; return; }
  serve_stop
  local v
  for v in ${VARIANTS:-disable-cuda-graph disable-mixed-batches}; do
    if [[ $v == old-kernels ]]; then
      KILN_ATTN_DECODE=v2 KILN_ATTN_PREFILL=v3 serve_start "$v" 8124 "${common[@]}" || continue
    else
      serve_start "$v" 8124 "${common[@]}" "--$v" || continue
    fi
    "$K" eval reference "${eval_args[@]}" --dump "$out/defaults.json" --out "$out/$v.json" >"$out/$v.txt" 2>&1
    row "defaults vs $v" "$(grep -hE '^(prompts|log-prob|divergences)' "$out/$v.txt" | tr '\n' ';' | cut -c1-200)"
    serve_stop
  done
}

# LEVELS (default "256 512"): kiln serve with --max-running-requests 512, `kiln bench serve` 1024 in / 256 out,
# and the server's CPU time a streamed token by thread role (the engine thread, the HTTP layer, the CUDA
# driver's threads), over kiln_generation_tokens_total's rise in the same window.
suite_http() {
  need_gpu || return
  build kiln || return
  local m=$S/http-model port=8131 C
  shape_model "$m" 4b || return
  ulimit -n 65536 2>/dev/null || true
  serve_start scale $port --model "$m" --load-format random --device cuda --served-model-name shape \
    --max-running-requests 512 || return
  for C in ${LEVELS:-256 512}; do
    python3 "$here/http_cpu_split.py" start "$SERVE_PID" "$port" >"$W/http/cpu_$C.before"
    bench_serve "scale_c$C" $port 600 --input-len 1024 --output-len 256 --concurrency "$C" \
      --num-prompts $((2 * C)) --warmups 32
    local rc=$?
    row "C=$C 1024/256" "rc=$rc $(python3 "$here/http_cpu_split.py" end "$SERVE_PID" "$port" "$W/http/cpu_$C.before")"
    grep -E "^\| [0-9]" "$W/http/scale_c$C.txt" | head -1
  done
  serve_stop
}

# Structured output's serving cost (issue 45): one kiln serve on the 4B shape (random weights, the real Qwen3
# tokenizer from the demo checkpoint), `kiln bench serve` IN in / OUTLEN out at CONC, ROUNDS times each way in
# turn: unconstrained, then every request constrained by bench/grammar/long_output.json (an object whose
# "readings" need >= 300 digits: each digit is its own Qwen3 token, so no output completes before 256 tokens
# and the exact accounting holds). Rows: out tok/s each way and the ratio (target >= 0.95), the grammar
# counters from /metrics. Each run is cut at RUN_SECONDS (50; ~15 s each on an H100 expected), so the suite ends
# within ~4 minutes. DEVICE=cpu SHAPE=demo IN=64 OUTLEN=16 CONC=2 NUM=4 KILN=build/cpu/bin/kiln: a dry run.
suite_structured() {
  [[ ${DEVICE:-cuda} == cpu ]] || need_gpu || return
  build kiln || return
  local m=$S/structured-model-${SHAPE:-4b} out=$W/structured port=8132 round what
  shape_model "$m" "${SHAPE:-4b}" || return
  serve_start structured $port --model "$m" --load-format random --device "${DEVICE:-cuda}" \
    --served-model-name shape --max-running-requests "${MAX_RUNNING:-128}" || return
  grep -h 'KV pool\|captured' "$SERVE_LOG" | head -2
  local flags=(--input-len "${IN:-1024}" --output-len "${OUTLEN:-256}" --concurrency "${CONC:-32}"
    --num-prompts "${NUM:-128}" --warmups "${WARMUPS:-32}")
  for round in $(seq 1 "${ROUNDS:-2}"); do
    for what in free constrained; do
      local extra=()
      [[ $what == constrained ]] && extra=(--json-schema bench/grammar/long_output.json)
      bench_serve "${what}_$round" $port "${RUN_SECONDS:-50}" "${flags[@]}" "${extra[@]}"
      serve_row "$what, round $round" "${what}_$round" $?
    done
  done
  curl -s "http://127.0.0.1:$port/metrics" | grep -E '^kiln_grammar_(masks_total|mask_max|steps_not)' \
    >"$out/metrics.txt"
  row "grammar counters" "$(tr '\n' ' ' <"$out/metrics.txt")"
  serve_stop
  row "constrained / unconstrained out tok/s" "$(python3 - "$out" <<'PY'
import glob, json, sys
def rate(kind):
    runs = []
    for f in sorted(glob.glob(f"{sys.argv[1]}/{kind}_*.json")):
        lv = json.load(open(f))["levels"][0]
        if not lv.get("valid"):
            return None, f"{f}: invalid run"
        runs.append(lv["output_throughput_tok_s"])
    return (sum(runs) / len(runs), " ".join(f"{x:.1f}" for x in runs)) if runs else (None, "no runs")
free, fr = rate("free")
con, cr = rate("constrained")
if free is None or con is None:
    print(f"n/a ({fr if free is None else cr})")
else:
    print(f"{con / free:.3f} (free {free:.1f} tok/s: {fr}; constrained {con:.1f} tok/s: {cr}; target >= 0.95)")
PY
)"
}
