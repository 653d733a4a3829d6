#!/usr/bin/env bash
# Prebuilt binaries (built on the CPU machine, release preset, sm_90a): the GPU tests of the unverified changes,
# then the MoE kernel rows, within the call's budget.
set -u
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
mkdir -p build/release
xz -dc .carry/pb.tar.xz 2>/dev/null | tar xf - -C build/release ||
  python3 -c "import lzma,tarfile; tarfile.open(fileobj=lzma.open('.carry/pb.tar.xz')).extractall('build/release')"
tar xzf .carry/rtlibs.tgz -C /tmp
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
extra=
for l in libcublasLt.so.13 libnccl.so.2 libcudnn.so.9; do
  ldconfig -p | grep -q "$l" && continue
  p=$(find /usr/local /opt /usr/lib -name "$l" 2>/dev/null | head -1); [ -n "$p" ] && extra="$extra:$(dirname "$p")"
done
export LD_LIBRARY_PATH="/tmp/rtlibs${extra}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "unpacked $(el) s; $(nvidia-smi --query-gpu=name --format=csv,noheader); /work/main -> $(readlink -f /work/main)"
ldd build/release/bin/kiln | grep "not found"; ldd build/release/tests/test_cuda_moe_ep | grep "not found"
B=build/release/tests; T=$OUT/tests.txt; : > "$T"
for t in test_cuda_moe_ep test_cuda_moe test_cuda_moe_fp8 test_cuda_argmax test_cuda_eagle3 test_cuda_eagle3_engine test_cuda_model_moe test_tp_cuda test_cuda_model_vl_moe; do
  (( $(el) < ${TEST_UNTIL:-130} )) || { echo "== $t SKIPPED (time)" | tee -a "$T"; continue; }
  s=$(el); timeout 60 $B/$t --gtest_brief=1 > /tmp/$t.log 2>&1; rc=$?
  echo "== $t rc=$rc $(( $(el) - s )) s" >> "$T"; grep -v '^kiln: \|^\[ *OK\|^\[ RUN' /tmp/$t.log | tail -30 >> "$T"
  echo "$t rc=$rc ($(el) s)"
done
left=$(( ${BUDGET:-165} - $(el) ))
echo "tests done $(el) s; moe bench with $left s"
(( left > 25 )) && timeout $(( left - 3 )) build/release/bin/kiln bench kernels --filter moe > $OUT/moe_bench.txt 2>&1
grep -E "fp8" $OUT/moe_bench.txt | head -30
echo "all $(el) s"
