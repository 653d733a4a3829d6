// A random MoE layer for the CUDA tests with block-FP8 experts: each expert quantized alone
// (ops::quantize_weight_fp8 on its [2I, H] and [H, I]), its dequantization (path (c), also usable as a BF16
// layer), host and device copies, and the MoeWeights views of either form. Router rows have one power-of-two
// weight, so the logits are exact in any summation order and CPU and GPU route alike.
#pragma once

#include <string>
#include <vector>

#include "kiln/tensor.h"
#include "ops/cuda/moe.h"
#include "ops/cuda/moe_ops.h"
#include "ops/fp8_linear.h"
#include "ops/moe.h"
#include "test_util_cuda.h"

namespace kiln::test {

// One layer's experts quantized per expert (ops::quantize_weight_fp8 on each [2I, H] and [H, I]), their
// dequantization (path (c)), and the device copies of both.
struct Fp8Layer {
  int64_t E = 0, k = 0, H = 0, I = 0;
  std::vector<bf16_t> router, gate_up_deq, down_deq;
  std::vector<uint8_t> gate_up_q, down_q;
  std::vector<float> gate_up_s, down_s;
  Buffer d_router, d_gu_q, d_dn_q, d_gu_s, d_dn_s, d_gu_deq, d_dn_deq;

  int64_t gr() const { return 2 * I / 128; }
  int64_t gc() const { return ops::fp8_blocks(H); }
  int64_t dr() const { return H / 128; }
  int64_t dc() const { return ops::fp8_blocks(I); }
  // The device buffer or the host vector holding the same values, as d says.
  template <typename T>
  static void* on(Device d, const Buffer& dev, const std::vector<T>& host) {
    return d.is_cuda() ? dev.data() : const_cast<T*>(host.data());
  }
  ops::MoeWeights common(Device d) const {
    ops::MoeWeights w;
    w.router = Tensor(on(d, d_router, router), DType::bf16, {E, H}, d);
    w.top_k = k;
    w.norm_topk_prob = true;
    return w;
  }
  ops::MoeWeights fp8(Device d) const {
    ops::MoeWeights w = common(d);
    w.gate_up = Tensor(on(d, d_gu_q, gate_up_q), DType::f8e4m3, {E, 2 * I, H}, d);
    w.down = Tensor(on(d, d_dn_q, down_q), DType::f8e4m3, {E, H, I}, d);
    w.gate_up_scale = Tensor(on(d, d_gu_s, gate_up_s), DType::f32, {E, gr(), gc()}, d);
    w.down_scale = Tensor(on(d, d_dn_s, down_s), DType::f32, {E, dr(), dc()}, d);
    return w;
  }
  // The dequantized experts as a BF16 layer, on the host or the device.
  ops::MoeWeights dequantized(Device d) const {
    ops::MoeWeights w = common(d);
    w.gate_up = Tensor(on(d, d_gu_deq, gate_up_deq), DType::bf16, {E, 2 * I, H}, d);
    w.down = Tensor(on(d, d_dn_deq, down_deq), DType::bf16, {E, H, I}, d);
    return w;
  }
  ops::MoeWeights dequantized_device() const { return dequantized(Device::cuda()); }
};

// Quantizes [E, rows, cols] expert by expert into q / s and dequantizes into deq.
inline void quantize_experts(const std::vector<bf16_t>& w, int64_t E, int64_t rows, int64_t cols,
                             std::vector<uint8_t>& q, std::vector<float>& s, std::vector<bf16_t>& deq) {
  const int64_t sb = ops::fp8_blocks(rows) * ops::fp8_blocks(cols);
  q.resize(size_t(E * rows * cols));
  s.resize(size_t(E * sb));
  deq.resize(q.size());
  for (int64_t e = 0; e < E; ++e) {
    const Tensor qt(q.data() + e * rows * cols, DType::f8e4m3, {rows, cols});
    const Tensor st(s.data() + e * sb, DType::f32, {ops::fp8_blocks(rows), ops::fp8_blocks(cols)});
    ops::quantize_weight_fp8(
        Tensor(const_cast<bf16_t*>(w.data()) + e * rows * cols, DType::bf16, {rows, cols}), qt, st,
        "expert " + std::to_string(e));
    ops::dequantize_fp8({qt, st}, Tensor(deq.data() + e * rows * cols, DType::bf16, {rows, cols}));
  }
}

inline Fp8Layer make_fp8_layer(int64_t E, int64_t k, int64_t H, int64_t I, uint32_t seed) {
  Fp8Layer l;
  l.E = E, l.k = k, l.H = H, l.I = I;
  l.router.assign(size_t(E * H), f32_to_bf16(0.0f));
  // One power-of-two router weight a row: logits exact in any order, CPU and GPU route alike.
  for (int64_t e = 0; e < E; ++e)
    l.router[size_t(e * H + (e * 37 + 11) % H)] = f32_to_bf16(e % 2 ? 2.0f : 4.0f);
  quantize_experts(test::random_bf16(size_t(E * 2 * I * H), seed, -0.1f, 0.1f), E, 2 * I, H, l.gate_up_q,
                   l.gate_up_s, l.gate_up_deq);
  quantize_experts(test::random_bf16(size_t(E * H * I), seed + 1, -0.1f, 0.1f), E, H, I, l.down_q, l.down_s,
                   l.down_deq);
  l.d_router = test::to_device(l.router);
  l.d_gu_q = test::to_device(l.gate_up_q);
  l.d_dn_q = test::to_device(l.down_q);
  l.d_gu_s = test::to_device(l.gate_up_s);
  l.d_dn_s = test::to_device(l.down_s);
  l.d_gu_deq = test::to_device(l.gate_up_deq);
  l.d_dn_deq = test::to_device(l.down_deq);
  return l;
}

// The W8A8 grouped GEMM's whole layer (path (a)) against the CPU oracle's, relative Frobenius. The layer is
// two W8A8 products with the act quantized between them, and where the GPU's fp32 sums round gate, up or act
// to the other bf16 neighbour of the CPU's (2^-8 relative), that act may quantize to the next e4m3 code (2^-3
// relative) or move its group's scale: so the layer sits further from the oracle than one product's 2^-8
// (fp8_gemm.h) does from the fp64 product of its own quantized operands. Measured on an H200 (2026-12-07,
// `6f1ce2f`): 2.8e-3 to 8.6e-3 over test_cuda_moe_fp8_w8a8, path (c) (no act quantization) 3.6e-2 to
// 4.2e-2; on an H100 (`b2888dd`) a tensor-parallel share of test_cuda_moe_fp8 at T = 300 reached 5.3e-3.
constexpr double kW8a8LayerTol = 1.0 / 64;

// Sets the W8A8 grouped GEMM switch (ops/cuda/moe_ops.h, KILN_MOE_FP8_W8A8) for a scope, then puts the
// previous value back: the dequant path's tests turn it off, the W8A8 tests on.
struct Fp8W8a8Scope {
  bool before = ops::cuda::moe_fp8_w8a8_enabled();
  explicit Fp8W8a8Scope(bool on) { ops::cuda::moe_set_fp8_w8a8(on); }
  ~Fp8W8a8Scope() { ops::cuda::moe_set_fp8_w8a8(before); }
  Fp8W8a8Scope(const Fp8W8a8Scope&) = delete;
  Fp8W8a8Scope& operator=(const Fp8W8a8Scope&) = delete;
};

// Sets the gather GEMV's path-(d) switch (kiln::cuda::moe_set_fp8_e4m3x16, KILN_MOE_FP8_E4M3X16) for a scope,
// then puts the previous value back: the tests of path (c)'s bits pin it off, the e4m3 x 16 tests on.
struct Fp8E4m3x16Scope {
  bool before = ::kiln::cuda::moe_fp8_e4m3x16();
  explicit Fp8E4m3x16Scope(bool on) { ::kiln::cuda::moe_set_fp8_e4m3x16(on); }
  ~Fp8E4m3x16Scope() { ::kiln::cuda::moe_set_fp8_e4m3x16(before); }
  Fp8E4m3x16Scope(const Fp8E4m3x16Scope&) = delete;
  Fp8E4m3x16Scope& operator=(const Fp8E4m3x16Scope&) = delete;
};

// Experts [e0, e1) of w (host or device, bf16 or block-FP8): views into w's storage, expert_begin e0.
inline ops::MoeWeights expert_share(const ops::MoeWeights& w, int64_t e0, int64_t e1) {
  const auto experts = [&](const Tensor& t) {
    const int64_t bytes = t.shape[1] * t.shape[2] * dtype_size(t.dtype);
    return Tensor(static_cast<char*>(t.data) + e0 * bytes, t.dtype, {e1 - e0, t.shape[1], t.shape[2]},
                  t.device);
  };
  ops::MoeWeights s = w;
  s.gate_up = experts(w.gate_up);
  s.down = experts(w.down);
  if (w.is_fp8()) {
    s.gate_up_scale = experts(w.gate_up_scale);
    s.down_scale = experts(w.down_scale);
  }
  s.expert_begin = e0;
  return s;
}

// n elements of type T at device address p.
template <typename T>
std::vector<T> read_device(const void* p, int64_t n) {
  std::vector<T> v(static_cast<size_t>(n));
  copy_bytes(v.data(), Device::cpu(), p, Device::cuda(), size_t(n) * sizeof(T));
  return v;
}

// A graph-replay test's input r: x (bf16, n elements) refilled from seed + r, out poisoned, then
// synchronised.
inline void load_moe_input(Buffer& x, Buffer& out, size_t n, uint32_t seed) {
  const auto xs = test::random_bf16(n, seed);
  copy_bytes(x.data(), Device::cuda(), xs.data(), Device::cpu(), xs.size() * 2);
  test::poison(out);
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
}

// One ops::cuda::moe_mlp of w on x bf16 [T, H] with the given expert kernel, out and scratch poisoned first
// (scratch grown when short); returns out and leaves the scratch for reading.
inline std::vector<bf16_t> run_moe_gpu(const ops::MoeWeights& w, const Buffer& x, int64_t T, int64_t H,
                                       ops::cuda::MoeExperts kernel, Buffer& scratch) {
  Buffer out(size_t(T * H) * 2, Device::cuda());
  test::poison(out);
  const size_t bytes = ops::cuda::moe_scratch_bytes(w, H, T, kernel);
  if (scratch.bytes() < bytes) scratch = Buffer(bytes, Device::cuda());
  test::poison(scratch);
  ops::cuda::moe_mlp(Tensor(x.data(), DType::bf16, {T, H}, Device::cuda()), w,
                     Tensor(out.data(), DType::bf16, {T, H}, Device::cuda()), scratch.data(), scratch.bytes(),
                     kernel);
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
  return test::to_host<bf16_t>(out, size_t(T * H));
}

}  // namespace kiln::test
