#!/usr/bin/env bash
# Configure and build on the GPU machine with the Debian headers/static libraries carried in .deps/sysroot
# (see scripts/device_deps.sh). Usage: scripts/device_build.sh [targets...]   (default: everything)
# KILN_BUILD_DIR (default build/device) and KILN_CUDA_FLAGS (extra nvcc flags, e.g. an experiment's -D switch)
# give a second build of the same tree beside the first (`bench/device.sh ab` with FLAGS=...).
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD/.deps/sysroot"
[[ -d "$root/usr/include" ]] || { echo "device_build: $root missing: run scripts/device_deps.sh here and carry .deps/sysroot"; exit 1; }
export LD_LIBRARY_PATH="$root/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
bdir=${KILN_BUILD_DIR:-build/device}
extra=()
[[ -n ${KILN_CUDA_FLAGS:-} ]] && extra+=("-DCMAKE_CUDA_FLAGS=$KILN_CUDA_FLAGS")
mkdir -p build
cmake -S . -B "$bdir" -G Ninja "${extra[@]}" -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON -DKILN_SERVER=ON \
  -DCMAKE_PREFIX_PATH="$root/usr" -DCMAKE_LIBRARY_ARCHITECTURE=x86_64-linux-gnu \
  -DCMAKE_CUDA_COMPILER="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)" >"$bdir-configure.log" 2>&1 ||
  { tail -40 "$bdir-configure.log"; exit 1; }
targets=()
(($#)) && targets=(--target "$@")
# -k 0: one failing object does not hide the others (the GPU machine has GCC 13, this one GCC 12).
cmake --build "$bdir" -j "$(nproc)" "${targets[@]}" -- -k 0
