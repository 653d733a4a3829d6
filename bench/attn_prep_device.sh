#!/usr/bin/env bash
# Builds and runs the attn_prep GPU tests, sanitizers and benchmark on the GPU machine, standalone: only
# src/core, the attn_prep sources and bench/ are compiled (nvcc + g++, no CMake), so the rest of the tree
# need not build there. Needs .deps/sysroot (gtest) carried. Usage: bench/attn_prep_device.sh OUT [steps]
# steps: any of build test sanitize bench ncu (default: build test sanitize bench). Logs go to OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: attn_prep_device.sh OUT [steps]}
shift
steps=" ${*:-build test sanitize bench} "
mkdir -p "$out"
B=build/attn_prep_dev
mkdir -p $B/obj
root=$PWD/.deps/sysroot
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
CUDA=$(dirname "$(dirname "$NVCC")")
JOBS=${JOBS:-$(nproc)}
CXXF="-std=c++20 -O2 -g -Wall -Wextra -Wpedantic -Werror -Wno-missing-field-initializers -DKILN_HAVE_CUDA=1 -Iinclude -Isrc -I. -isystem $CUDA/include"
[[ -d $root/usr/include ]] && CXXF+=" -isystem $root/usr/include" && NVF_SYS=" -isystem $root/usr/include"
NVF="-std=c++20 -O3 -lineinfo -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -DKILN_HAVE_CUDA=1 -Iinclude -Isrc -I. -Xcompiler=-Wall,-Wextra,-Werror --Werror all-warnings${NVF_SYS:-}"
LIBS="-L$CUDA/lib64 -lcudart -pthread"
[[ -d $root/usr/lib/x86_64-linux-gnu ]] && LIBS="-L$root/usr/lib/x86_64-linux-gnu $LIBS"

core="src/core/tensor.cpp src/core/memory.cpp src/core/error.cpp src/core/dtype.cpp"
ops="src/ops/attn_prep.cpp src/ops/cpu/attn_prep_ref.cpp src/ops/rope_table.cpp"
cuda="src/ops/cuda/attn_prep_fused.cu src/ops/cuda/attn_prep_fused_d64.cu src/ops/cuda/attn_prep_fused_d128.cu
      src/ops/cuda/attn_prep_fused_d256.cu src/ops/cuda/attn_prep_unfused.cu bench/kernel_bench.cu
      tests/cuda/test_attn_prep_convert.cu"
other="bench/attn_prep_bench.cpp src/cli/main.cpp src/cli/flags.cpp src/cli/cmd_bench_kernels.cpp
       tests/cuda/test_attn_prep.cpp tests/unit/test_attn_prep_ref.cpp tests/unit/test_attn_prep_fp8.cpp"
obj() { echo "$B/obj/$(echo "$1" | tr / _).o"; }

if [[ $steps == *" build "* ]]; then
  t0=$(date +%s)
  { for f in $cuda; do echo "$NVCC $NVF -c $f -o $(obj $f)"; done
    for f in $core $ops $other; do echo "g++ $CXXF -c $f -o $(obj $f)"; done; } |
    xargs -P "$JOBS" -I{} sh -c '{} || exit 255' >"$out/build.log" 2>&1 || { tail -50 "$out/build.log"; echo "BUILD FAILED"; exit 1; }
  base="$(for f in $core $ops $cuda; do [[ $f == tests/* ]] || obj $f; done)"
  g++ -o $B/test_attn_prep_cuda $base $(obj tests/cuda/test_attn_prep.cpp) $(obj tests/cuda/test_attn_prep_convert.cu) -lgtest -lgtest_main $LIBS &&
    g++ -o $B/test_attn_prep_unit $base $(obj tests/unit/test_attn_prep_ref.cpp) $(obj tests/unit/test_attn_prep_fp8.cpp) -lgtest -lgtest_main $LIBS &&
    g++ -o $B/kiln_bench $base $(obj bench/attn_prep_bench.cpp) $(obj src/cli/main.cpp) $(obj src/cli/flags.cpp) \
      $(obj src/cli/cmd_bench_kernels.cpp) $LIBS >>"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; echo "LINK FAILED"; exit 1; }
  echo "build: ok in $(($(date +%s) - t0)) s"
fi
if [[ $steps == *" test "* ]]; then
  $B/test_attn_prep_unit >"$out/unit.log" 2>&1; echo "unit tests: rc=$? $(grep -E 'PASSED|FAILED' "$out/unit.log" | head -3 | tr '\n' ' ')"
  t0=$(date +%s)
  $B/test_attn_prep_cuda >"$out/cuda_test.log" 2>&1
  echo "cuda tests: rc=$? in $(($(date +%s) - t0)) s: $(grep -E '\[ attn_prep \]|PASSED|FAILED|Failure' "$out/cuda_test.log" | head -8 | tr '\n' ' ')"
fi
if [[ $steps == *" sanitize "* ]]; then
  for tool in memcheck racecheck synccheck; do
    KILN_ATTN_PREP_CASES=${SAN_CASES:-24} compute-sanitizer --tool $tool --error-exitcode 9 $B/test_attn_prep_cuda \
      --gtest_filter='AttnPrepCuda.FusedEquals*:AttnPrepCuda.OutOfRange*:AttnPrepCuda.Graph*' >"$out/san_$tool.log" 2>&1
    echo "compute-sanitizer $tool: rc=$? $(grep -E 'ERROR SUMMARY|PASSED|FAILED' "$out/san_$tool.log" | tr '\n' ' ')"
  done
fi
if [[ $steps == *" bench "* ]]; then
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,driver_version --format=csv,noheader >"$out/bench.log" 2>&1
  $B/kiln_bench bench kernels --filter attn_prep --reps 100 >>"$out/bench.log" 2>&1
  echo "bench: rc=$?"
  grep -E "device:|\| attn_prep" "$out/bench.log" | grep -E "device:|T=1 |T=8 |T=128 |T=4096 |T=8192 " | grep -E "device:|HND" | cut -c1-160
fi
if [[ $steps == *" ncu "* ]]; then
  KILN_ATTN_PREP_T=4096 ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section Occupancy --section LaunchStats --kernel-name regex:'attn_prep_(stream|prefill|decode)' \
    --launch-skip 5 --launch-count 1 $B/kiln_bench bench kernels --filter attn_prep --reps 100 >"$out/ncu.log" 2>&1
  echo "ncu: rc=$?"; grep -E "attn_prep_|Memory Throughput|DRAM Throughput|Duration|Achieved Occupancy|Registers|Compute \(SM\)" "$out/ncu.log" | head -14
fi
