// The sparse MLP's oracle (ops/moe.h): routing per token, then the experts visited in ascending index, each
// over the rows that chose it (a gathered GEMM, so a row's result is linear's and never depends on which
// other rows chose the same expert), accumulating every token's fp32 sum in ascending expert order.
#include "ops/cpu/moe.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/cpu/fp8_ref.h"
#include "ops/cpu/parallel.h"
#include "ops/cpu/reference.h"

namespace kiln::ops::cpu {

float moe_lane_sum(const float* v, int64_t n) {
  float p[32] = {};
  for (int64_t i = 0; i < n; ++i) p[i % 32] += v[i];
  for (int o = 16; o >= 1; o /= 2) {
    float q[32];
    for (int l = 0; l < 32; ++l) q[l] = p[l] + p[l ^ o];
    for (int l = 0; l < 32; ++l) p[l] = q[l];
  }
  return p[0];
}

void moe_router_logits(const Tensor& x, const Tensor& router, const Tensor& logits) {
  const int64_t T = x.shape[0], H = x.shape[1], E = router.shape[0];
  parallel_for(T * E, 64, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = i / E, e = i % E;
      const bf16_t* xr = x.ptr<bf16_t>() + t * x.stride[0];
      const bf16_t* wr = router.ptr<bf16_t>() + e * router.stride[0];
      float p[32] = {};
      for (int64_t c = 0; c < (H + 7) / 8; ++c)
        for (int64_t j = c * 8; j < std::min(c * 8 + 8, H); ++j)
          p[c % 32] = std::fma(bf16_to_f32(xr[j]), bf16_to_f32(wr[j]), p[c % 32]);
      for (int o = 16; o >= 1; o /= 2) {
        float q[32];
        for (int l = 0; l < 32; ++l) q[l] = p[l] + p[l ^ o];
        std::copy(q, q + 32, p);
      }
      logits.ptr<bf16_t>()[t * logits.stride[0] + e] = f32_to_bf16(p[0]);
    }
  });
}

namespace {

// Row t of the routing: experts and weights of the top-k, in ascending expert index.
void route_row(const bf16_t* logit, int64_t E, int64_t k, bool norm, int32_t* experts, bf16_t* weights,
               std::vector<float>& l, std::vector<char>& taken, std::vector<float>& e) {
  float m = -INFINITY;
  for (int64_t i = 0; i < E; ++i) {
    l[size_t(i)] = bf16_to_f32(logit[i]);
    m = std::fmax(m, l[size_t(i)]);
  }
  // k selection passes: the best expert not yet taken, the lower index winning ties (and a NaN never
  // beating anything, so the choice is still defined).
  std::fill(taken.begin(), taken.end(), 0);
  for (int64_t j = 0; j < k; ++j) {
    int64_t best = -1;
    for (int64_t i = 0; i < E; ++i) {
      if (taken[size_t(i)]) continue;
      if (best < 0 || l[size_t(i)] > l[size_t(best)]) best = i;
    }
    if (best < 0) break;  // k <= E (checked by the dispatcher): never
    taken[size_t(best)] = 1;
  }
  for (int64_t i = 0; i < E; ++i) e[size_t(i)] = float(std::exp(double(l[size_t(i)] - m)));
  const float S = moe_lane_sum(e.data(), E);
  int64_t slot = 0;
  float s_k = 0.0f;
  for (int64_t i = 0; i < E; ++i) {
    if (!taken[size_t(i)]) continue;
    const float p = e[size_t(i)] / S;
    experts[slot] = int32_t(i);
    e[size_t(slot)] = p;  // reuse: slots < i are past, so the probabilities left to read are untouched
    s_k += p;
    ++slot;
  }
  for (int64_t j = 0; j < k; ++j) weights[j] = f32_to_bf16(norm ? e[size_t(j)] / s_k : e[size_t(j)]);
}

// Local expert e's two projections: [2I, H] and [H, I] views, with their block scales when FP8.
struct ExpertWeights {
  Tensor gate_up, gate_up_scale, down, down_scale;
};
ExpertWeights expert_weights(const MoeWeights& w, int64_t e) {
  const int64_t H = w.gate_up.shape[2], I = w.intermediate();
  const DType dt = w.gate_up.dtype;
  const auto* gu = static_cast<const char*>(w.gate_up.data);
  const auto* dn = static_cast<const char*>(w.down.data);
  const int64_t es = dtype_size(dt);
  ExpertWeights x;
  x.gate_up = Tensor(const_cast<char*>(gu + e * 2 * I * H * es), dt, {2 * I, H});
  x.down = Tensor(const_cast<char*>(dn + e * H * I * es), dt, {H, I});
  if (!w.is_fp8()) return x;
  const int64_t gr = w.gate_up_scale.shape[1], gc = w.gate_up_scale.shape[2];
  const int64_t dr = w.down_scale.shape[1], dc = w.down_scale.shape[2];
  x.gate_up_scale = Tensor(w.gate_up_scale.ptr<float>() + e * gr * gc, DType::f32, {gr, gc});
  x.down_scale = Tensor(w.down_scale.ptr<float>() + e * dr * dc, DType::f32, {dr, dc});
  return x;
}

// One expert projection with linear's rounding (bf16 out) or its fp32 sum (f32 out): bf16 weights by
// linear / linear_f32, block-FP8 ones by path (a) or (d) with one warp a row (ops/fp8_linear.h; ops/moe.h).
void expert_linear(const Tensor& x, const Tensor& weight, const Tensor& scale, const Tensor& out,
                   MoeFp8Path fp8) {
  if (weight.dtype == DType::f8e4m3 && fp8 == MoeFp8Path::chunk16)
    return linear_fp8_chunk16(x, weight, scale, out, 32);
  if (weight.dtype == DType::f8e4m3) return linear_fp8_w8a8(x, weight, scale, out);
  if (out.dtype == DType::f32) return linear_f32(x, weight, out);
  linear(x, weight, out);
}

}  // namespace

void moe_route(const Tensor& logits, int64_t top_k, bool norm_topk_prob, const Tensor& experts,
               const Tensor& weights) {
  const int64_t T = logits.shape[0], E = logits.shape[1];
  parallel_for(T, 16, [&](int64_t t0, int64_t t1) {
    std::vector<float> l(static_cast<size_t>(E)), e(static_cast<size_t>(E));
    std::vector<char> taken(static_cast<size_t>(E));
    for (int64_t t = t0; t < t1; ++t)
      route_row(logits.ptr<bf16_t>() + t * logits.stride[0], E, top_k, norm_topk_prob,
                experts.ptr<int32_t>() + t * top_k, weights.ptr<bf16_t>() + t * top_k, l, taken, e);
  });
}

void moe_mlp(const Tensor& x, const MoeWeights& w, const Tensor& out, MoeFp8Path fp8) {
  const int64_t T = x.shape[0], H = x.shape[1], E = w.num_experts(), I = w.intermediate(), k = w.top_k;
  const int64_t e0 = w.expert_begin, e1 = w.expert_begin + w.local_experts();
  // ops/moe.h: a split-intermediate rank's fp32 partial keeps y unrounded.
  const bool y_f32 = out.dtype == DType::f32 && w.split_intermediate;
  if (T == 0) return;
  std::vector<bf16_t> logits(size_t(T * E)), weights(size_t(T * k));
  std::vector<int32_t> experts(size_t(T * k));
  const Tensor logits_t(logits.data(), DType::bf16, {T, E});
  moe_router_logits(x, w.router, logits_t);
  moe_route(logits_t, k, w.norm_topk_prob, Tensor(experts.data(), DType::i32, {T, k}),
            Tensor(weights.data(), DType::bf16, {T, k}));

  // (token, slot) pairs grouped by expert, tokens ascending within an expert.
  std::vector<std::vector<int64_t>> pairs(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) pairs[size_t(experts[size_t(t * k + j)])].push_back(t * k + j);

  std::vector<float> acc(size_t(T * H), 0.0f), yf;
  std::vector<bf16_t> xs, gu, act, y;
  for (int64_t e = e0; e < e1; ++e) {
    const std::vector<int64_t>& rows = pairs[size_t(e)];
    const int64_t n = int64_t(rows.size());
    if (n == 0) continue;
    xs.resize(size_t(n * H));
    gu.resize(size_t(n * 2 * I));
    act.resize(size_t(n * I));
    y.resize(size_t(n * H));
    if (y_f32) yf.resize(size_t(n * H));
    for (int64_t r = 0; r < n; ++r) {
      const bf16_t* src = x.ptr<bf16_t>() + (rows[size_t(r)] / k) * x.stride[0];
      std::copy(src, src + H, xs.begin() + r * H);
    }
    const ExpertWeights ew = expert_weights(w, e - e0);
    const Tensor gu_t(gu.data(), DType::bf16, {n, 2 * I}), act_t(act.data(), DType::bf16, {n, I});
    expert_linear(Tensor(xs.data(), DType::bf16, {n, H}), ew.gate_up, ew.gate_up_scale, gu_t, fp8);
    silu_and_mul(gu_t, act_t);
    if (y_f32) {
      expert_linear(act_t, ew.down, ew.down_scale, Tensor(yf.data(), DType::f32, {n, H}), fp8);
    } else {
      expert_linear(act_t, ew.down, ew.down_scale, Tensor(y.data(), DType::bf16, {n, H}), fp8);
    }
    for (int64_t r = 0; r < n; ++r) {
      const int64_t pair = rows[size_t(r)], t = pair / k;
      const float wt = bf16_to_f32(weights[size_t(pair)]);
      float* a = acc.data() + t * H;
      if (y_f32) {
        const float* yr = yf.data() + r * H;
        for (int64_t h = 0; h < H; ++h) a[h] += yr[h] * wt;
      } else {
        const bf16_t* yr = y.data() + r * H;
        for (int64_t h = 0; h < H; ++h) a[h] += bf16_to_f32(yr[h]) * wt;
      }
    }
  }
  if (out.dtype == DType::f32) {  // a tensor-parallel rank's partial, rounded after the all-reduce
    for (int64_t t = 0; t < T; ++t)
      std::copy(acc.begin() + t * H, acc.begin() + (t + 1) * H, out.ptr<float>() + t * out.stride[0]);
    return;
  }
  for (int64_t t = 0; t < T; ++t) {
    bf16_t* o = out.ptr<bf16_t>() + t * out.stride[0];
    for (int64_t h = 0; h < H; ++h) o[h] = f32_to_bf16(acc[size_t(t * H + h)]);
  }
}

}  // namespace kiln::ops::cpu
