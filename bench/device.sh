#!/usr/bin/env bash
# The one entry point for the GPU machine: bash bench/device.sh SUITE [SUITE...]   (docs/BENCH.md)
#
# Every suite shares one build (scripts/device_build.sh, in build/device) and one GEMM tactic cache
# ($KILN_TUNE_CACHE, default /tmp/kiln-gemm-tactics.txt), writes its logs under a work folder, and adds rows to
# one summary table printed last. $OUT (default /tmp/kiln-out) gets summary.txt, logs.tgz (every log) and at
# most five more files a suite names (fixture tarballs): the device tool brings back at most 8 files.
# Carry .deps/sysroot (made here by scripts/device_deps.sh); the serving and parity suites also need the
# tokenizer models under .deps/npm. With no GPU the build still runs and every GPU suite says it was skipped.
#
# Suites (run in the order given; `all` = build tests kernels model):
#   build      kiln and every GPU test binary
#   probe      the machine, its toolchain and its ceilings: copy bandwidth and bf16 matmul rate (torch)
#   tests      every GPU test binary (tests/cuda and the engine, VL and TP tests that run on CUDA)
#   kernels    kiln bench kernels: attention (+ cuDNN SDPA), attn_prep, gemm, gemv_attn_prep, gemv_fp8, launch_floor
#   attention  test_cuda_attention, then the attention rows under the defaults and each VARIANTS entry
#   sanitize   compute-sanitizer memcheck, racecheck, synccheck on the attention and attn_prep small cases
#   model      kiln tune, then kiln bench model: decode steps (4B, 0.6B; batch 1-128; bf16 and fp8 caches),
#              the per-op breakdown, one 8192-token prompt
#   decode     the decode step under the switches kept for A/B (SWITCHES; default: PDL sites, fused QKV)
#   prefill    one prompt's forward kernel by kernel under ncu (LENS, default "4096 8192"; 1: a decode-like step;
#              PREFILL_SHAPES, PREFILL_QUANT=fp8)
#   serve      the serving sweep: 4B shape, random weights, 8192 in / 1024 out (CONC, NUM, KV, SWEEP_SECONDS)
#   seed       the second SGLang seed's workloads: /generate 4096 in / 1 out at C = 4 (200 requests), and
#              /v1/embeddings of 4096 and 8192 ids on a Qwen3-Embedding-shaped checkpoint
#   fp8-serve  issue 43's FP8-weight targets, each beside BF16 in the same run (the serving part: ~1-2.5 min on
#              an H100, 2026-12-07): 4B one 8192-token prompt, 8B batch-1 TPOT, the seed workload's p50, 8192 in / 1024 out
#              with FP8 KV at C = 128 (128 prompts), 1024 in / 256 out at C = 1 and 32 (SEED_NUM, SHORT_NUM,
#              BIG_NUM, BIG_BF16, *_SECONDS; docs/BENCH.md)
#   moe-serve  issue 44's serving targets on the Qwen3-30B-A3B shape, BF16 and FP8 experts: 2048 in / 1024 out
#              at C = 10 (TPOT), 1024 in / 256 out at C = 64 (out tok/s), one 8192-token prompt beside the 4B shape
#              (MOE_NUM_10, MOE_NUM_64, MOE_FP8, MOE_SECONDS, MODEL_ROWS; with MODEL_ROWS=0 ~2-2.5 min on an H100)
#   structured structured output's serving cost: 4B shape, 1024 in / 256 out at C = 32, unconstrained vs every
#              request under a JSON Schema (bench/grammar/long_output.json), out tok/s and their ratio
#              (CONC, NUM, IN, OUTLEN, ROUNDS, SHAPE, DEVICE)
#   ready      time from `kiln serve` to READY, cold (empty tactic cache) and tuned
#   checks     greedy outputs of kiln serve's defaults against VARIANTS (default --disable-cuda-graph and
#              --disable-mixed-batches) through kiln eval reference
#   http       the HTTP layer's CPU per streamed token at C = 256 and 512 (LEVELS)
#   vl         Qwen3-VL: image parity fixture, VL tests, kiln bench vision (448, 1024, 1920x1080)
#   vl-serve   Qwen3-VL serving: fused vs unfused vs eager greedy image chats, TTFT, bench serve --image
#   tp         the NCCL tensor-parallel tests and kiln bench model --tp 1 beside the plain runner
#   parity     Hugging Face parity: the Qwen3-4B-shaped checkpoint (test_cuda_model_hf4b), the VL fixture
#   embed      the Qwen3-Embedding fixtures on CUDA (test_cuda_embedding_hf)
#   embed-any-shape  the real-tokenizer embedding fixtures made (kept as a tarball), GEMMs of any N and K,
#              kiln serve --device cuda on the 151,669 vocabulary
#   fp8        the block-FP8 fixture (transformers, CPU torch), kept as a tarball; test_cuda_fp8_dequant
#   moe-fixtures  the Qwen3-MoE parity fixtures (transformers, CPU torch), kept as a tarball
#   yarn       one 131,000-token YaRN prompt served (~1 min)
#   ncu        Nsight Compute on the attention kernels (prefill, decode bf16 / fp8, cuDNN's decode)
#   ncu-cmd    Nsight Compute on the kernels matching NCU_KERNEL of one kiln command (NCU_CMD, NCU_SKIP, NCU_COUNT,
#              NCU_TUNE: the shape to tune first; NCU_SOURCE=1: the stall samples by CUDA line and SASS instruction)
#   sass       the prefill kernel's SASS: instruction counts and the order of its waits and exponentials
#   spec       speculative decoding: a small Qwen3 and its EAGLE-3 draft trained here, kiln serve batch 1 plain,
#              n-gram and EAGLE-3 (SPEC_TRAIN_MIN, SPEC_DRAFT_MIN, SPEC_PROMPTS, SPEC_TOKENS; ~6 min)
#   spec-c32-random  the 4B shape, random weights, C = 32: plain vs n-gram, the off switch's "never slower"
#              (SPEC_C32_ROUNDS pairs, then the medians' ratio)
#   ab         this tree against the trees in .ab/*.tar.gz and FLAGS / FLAGS2 builds (CMD, ENV, ROUNDS)
# Environment: OUT, KILN_TUNE_CACHE, DEADLINE (seconds from the start: the suites, and the optional parts of a suite, that would start past it are skipped), KILN_COMMIT (the commit the summary names: the device copy's git may not be the tree's), and each suite's knobs above (docs/BENCH.md lists them with defaults).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
here=bench/device
# shellcheck source=bench/device/lib.sh
source "$here/lib.sh"
# shellcheck source=bench/device/suites_gpu.sh
source "$here/suites_gpu.sh"
# shellcheck source=bench/device/suites_model.sh
source "$here/suites_model.sh"
# shellcheck source=bench/device/suites_serve.sh
source "$here/suites_serve.sh"
# shellcheck source=bench/device/suites_vl.sh
source "$here/suites_vl.sh"
# shellcheck source=bench/device/suites_ab.sh
source "$here/suites_ab.sh"
# shellcheck source=bench/device/suites_spec.sh
source "$here/suites_spec.sh"
# shellcheck source=bench/device/suites_fp8_serve.sh
source "$here/suites_fp8_serve.sh"
# shellcheck source=bench/device/suites_moe_serve.sh
source "$here/suites_moe_serve.sh"

usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
(($#)) || { usage; exit 2; }
suites=()
for s in "$@"; do
  case $s in
    -h | --help | help) usage; exit 0 ;;
    all) suites+=(build tests kernels model) ;;
    *)
      declare -F "suite_${s//-/_}" >/dev/null || { echo "device.sh: unknown suite '$s' (bench/device.sh --help)"; exit 2; }
      suites+=("$s")
      ;;
  esac
done

dev_start
spec_train_early "${suites[@]}"
for s in "${suites[@]}"; do
  dev_section "$s"
  # A suite that would start past DEADLINE is skipped, so a call near its time limit still ends with the
  # summary and logs.tgz.
  if past_deadline; then
    row "$s" "SKIPPED: past DEADLINE=$DEADLINE s"
    continue
  fi
  "suite_${s//-/_}"
done
dev_finish
