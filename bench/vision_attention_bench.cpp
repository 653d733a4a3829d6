// Vision-tower attention (ops/vision_attention.h, cuda/vision_attention.h) at the Qwen3-VL-4B tower's heads
// (16 of D 64), one image per launch: 1024, 4096 and 8160 patches (8160: a 1920x1088 image, 120 x 68 patches
// of 16 px). Rows: the tensor-core kernel with 64- and 128-row blocks (the path column says which one the
// dispatcher picks) and the SIMT kernel it replaces. q, k and v are views into a fused QKV buffer
// [T, 3 * 16 * 64] as in the tower; 4 sets rotated, the L2 flushed before every sample. Bytes: q, k and v
// read once, out written; the path column adds the FLOPs (4 T^2 Hn D) and TFLOP/s.
#include <cstdio>
#include <string>
#include <vector>

#include "bench/kernel_bench.h"
#include "kiln/cuda_check.h"
#include "kiln/dtype.h"
#include "kiln/tensor.h"
#include "ops/cuda/vision_attention.h"

namespace kiln::bench {
namespace {

constexpr int kHn = 16, kD = 64, kSets = 4;

struct Set {
  Buffer qkv, out, cu;
  cuda::VarlenAttnParams p;
};

Set make_set(int T, const std::vector<uint16_t>& qkv) {
  Set s;
  const Device dev = Device::cuda();
  s.qkv = Buffer(qkv.size() * 2, dev);
  copy_bytes(s.qkv.data(), dev, qkv.data(), Device::cpu(), qkv.size() * 2);
  s.out = Buffer(size_t(T) * kHn * kD * 2, dev);
  const int32_t cu[2] = {0, T};
  s.cu = Buffer(sizeof(cu), dev);
  copy_bytes(s.cu.data(), dev, cu, Device::cpu(), sizeof(cu));
  const auto* base = static_cast<const uint16_t*>(s.qkv.data());
  const int64_t row = 3 * kHn * kD;
  s.p = {.q = base,
         .k = base + kHn * kD,
         .v = base + 2 * kHn * kD,
         .cu = static_cast<const int32_t*>(s.cu.data()),
         .out = static_cast<uint16_t*>(s.out.data()),
         .qs = row,
         .qh = kD,
         .ks = row,
         .kh = kD,
         .vs = row,
         .vh = kD,
         .os = kHn * kD,
         .oh = kD,
         .T = T,
         .Hn = kHn,
         .S = 1,
         .D = kD,
         .scale = 0.125f};
  return s;
}

void run_vision_attention(const Env& env, std::vector<Row>& rows) {
  for (int T : {1024, 4096, 8160}) {
    // Values in [-1, 1) from a fixed LCG (the timing does not depend on them); one host copy for every set.
    std::vector<uint16_t> qkv(size_t(T) * 3 * kHn * kD);
    uint32_t x = 12345;
    for (auto& e : qkv) {
      x = x * 1664525u + 1013904223u;
      e = f32_to_bf16(float(x >> 8) / float(1 << 23) - 1.0f).bits;
    }
    std::vector<Set> sets;
    for (int i = 0; i < kSets; ++i) sets.push_back(make_set(T, qkv));
    const int picked = cuda::varlen_attention_mma_tile_rows(sets[0].p);
    const std::string shape = "T=" + std::to_string(T) + " (1 image) 16 heads D64 qkv-strided";
    const double flop = 4.0 * double(T) * T * kHn * kD;
    for (int variant : {64, 128, 0}) {  // tile rows; 0: the SIMT kernel
      Row r{"vision_attention", variant ? "mma " + std::to_string(variant) + "-row" : std::string("simt"),
            shape};
      r.bytes = 4.0 * T * kHn * kD * 2;
      r.us = time_cold_us(env, [&](int i) {
        const Set& s = sets[size_t(i) % sets.size()];
        if (variant)
          cuda::launch_varlen_attention_mma(s.p, env.stream, variant);
        else
          cuda::launch_varlen_attention_simt(s.p, env.stream);
      });
      KILN_CUDA_CHECK(cudaStreamSynchronize(env.stream));
      char path[112];
      std::snprintf(path, sizeof(path), "%s, %.3g FLOP, %.1f TFLOP/s",
                    !variant            ? "SIMT, one thread per (row, head)"
                    : variant == picked ? "tensor cores (the dispatcher's choice)"
                                        : "tensor cores",
                    flop, flop / (r.us * 1e-6) / 1e12);
      r.path = path;
      rows.push_back(r);
    }
  }
}

}  // namespace

KILN_KERNEL_BENCH(
    "vision_attention",
    "vision-tower varlen attention, Qwen3-VL-4B heads (16 x D64), one 1024/4096/8160-patch image: "
    "tensor-core (64/128-row blocks) and SIMT kernels",
    run_vision_attention);

}  // namespace kiln::bench
