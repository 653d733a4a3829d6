// CPU references for the vision tower's ops: LayerNorm, GELU, bf16 adds and row scatters, the 2-D rotary
// embedding, bidirectional variable-length attention, the interpolated position embedding and the pixel rows'
// bf16 rounding. Each output element is computed by one thread in a fixed order, so results are bitwise
// independent of the thread count.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <vector>

#include "ops/cpu/dot.h"
#include "ops/cpu/parallel.h"
#include "ops/cpu/reference.h"

namespace kiln::ops::cpu {
namespace {

const bf16_t* row_of(const Tensor& t, int64_t r) {
  return t.ptr<bf16_t>() + r * t.stride[0];
}
bf16_t* mut_row_of(const Tensor& t, int64_t r) {
  return t.ptr<bf16_t>() + r * t.stride[0];
}

// One axis term of the interpolation (ops/vision_pos_embed.h): floor and ceil corner and the fraction.
struct PosAxis {
  int64_t lo, hi;
  float frac;
};
PosAxis pos_axis(float v, int64_t side) {
  const int64_t lo = int64_t(v);
  return {lo, std::min(lo + 1, side - 1), v - float(lo)};
}

}  // namespace

void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps, const Tensor& out) {
  const int64_t T = x.shape[0], H = x.shape[1];
  const bf16_t* w = weight.ptr<bf16_t>();
  const bf16_t* b = bias.ptr<bf16_t>();
  parallel_for(T, 8, [&](int64_t t0, int64_t t1) {
    std::vector<float> xf(static_cast<size_t>(H));
    for (int64_t t = t0; t < t1; ++t) {
      const bf16_t* xr = row_of(x, t);
      double sum = 0;
      for (int64_t i = 0; i < H; ++i) {
        xf[size_t(i)] = bf16_to_f32(xr[i]);
        sum += xf[size_t(i)];
      }
      const double mean = sum / double(H);
      double var = 0;
      for (int64_t i = 0; i < H; ++i) var += (xf[size_t(i)] - mean) * (xf[size_t(i)] - mean);
      var /= double(H);
      const float r = float(1.0 / std::sqrt(var + double(eps)));
      const float m = float(mean);
      bf16_t* o = mut_row_of(out, t);
      for (int64_t i = 0; i < H; ++i)
        o[i] = f32_to_bf16((xf[size_t(i)] - m) * r * bf16_to_f32(w[i]) + bf16_to_f32(b[i]));
    }
  });
}

void gelu(const Tensor& x, const Tensor& out, bool tanh_approx) {
  const int64_t M = x.shape[0], N = x.shape[1];
  parallel_for(M, 16, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      const bf16_t* xr = row_of(x, m);
      bf16_t* o = mut_row_of(out, m);
      for (int64_t i = 0; i < N; ++i) {
        const float v = bf16_to_f32(xr[i]);
        const float g = tanh_approx
                            ? 0.5f * v * (1.0f + std::tanh(0.7978845608028654f * (v + 0.044715f * v * v * v)))
                            : 0.5f * v * (1.0f + std::erf(v * 0.7071067811865476f));
        o[i] = f32_to_bf16(g);
      }
    }
  });
}

void add(const Tensor& a, const Tensor& b, const Tensor& out) {
  const int64_t M = a.shape[0], N = a.shape[1];
  parallel_for(M, 16, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      const bf16_t* ar = row_of(a, m);
      const bf16_t* br = row_of(b, m);
      bf16_t* o = mut_row_of(out, m);
      for (int64_t i = 0; i < N; ++i) o[i] = f32_to_bf16(bf16_to_f32(ar[i]) + bf16_to_f32(br[i]));
    }
  });
}

void scatter_rows(const Tensor& dst, const Tensor& rows, const Tensor& src, bool accumulate) {
  const int64_t n = rows.shape[0], H = dst.shape[1];
  const int32_t* r = rows.ptr<int32_t>();
  parallel_for(n, 16, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      bf16_t* d = mut_row_of(dst, r[i]);
      const bf16_t* s = row_of(src, i);
      for (int64_t c = 0; c < H; ++c)
        d[c] = accumulate ? f32_to_bf16(bf16_to_f32(d[c]) + bf16_to_f32(s[c])) : s[c];
    }
  });
}

void rope_2d(const Tensor& qkv, const Tensor& pos, const Tensor& table, int num_heads) {
  const int64_t T = qkv.shape[0], D = table.shape[1] * 2, Q = D / 4, half = D / 2;
  const int32_t* p = pos.ptr<int32_t>();
  const float* tab = table.ptr<float>();
  const int64_t ts = table.stride[0];
  parallel_for(T, 16, [&](int64_t t0, int64_t t1) {
    std::vector<float> c(static_cast<size_t>(half)), s(static_cast<size_t>(half));
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t i = 0; i < half; ++i) {
        const int64_t axis = i < Q ? 0 : 1, j = i < Q ? i : i - Q;
        const float* row = tab + int64_t(p[2 * t + axis]) * ts;
        c[size_t(i)] = row[j];
        s[size_t(i)] = row[Q + j];
      }
      bf16_t* base = mut_row_of(qkv, t);
      for (int64_t h = 0; h < 2 * int64_t(num_heads); ++h) {  // q heads, then k heads
        bf16_t* x = base + h * D;
        for (int64_t i = 0; i < half; ++i) {
          const float a = bf16_to_f32(x[i]), b = bf16_to_f32(x[i + half]);
          const float ac = a * c[size_t(i)], bs = b * s[size_t(i)];
          const float bc = b * c[size_t(i)], as = a * s[size_t(i)];
          x[i] = f32_to_bf16(ac - bs);
          x[i + half] = f32_to_bf16(bc + as);
        }
      }
    }
  });
}

void varlen_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_seqlens,
                      const Tensor& out, float scale, const std::function<bool()>& stop) {
  const int64_t T = q.shape[0], Hn = q.shape[1], D = q.shape[2];
  const int32_t* cu = cu_seqlens.ptr<int32_t>();
  const int64_t S = cu_seqlens.shape[0] - 1;
  std::vector<int32_t> seg_of(static_cast<size_t>(T));
  for (int64_t s = 0; s < S; ++s)
    for (int32_t t = cu[s]; t < cu[s + 1]; ++t) seg_of[size_t(t)] = int32_t(s);
  auto widen = [&](const Tensor& x, int64_t t, int64_t h, float* dst) {
    const bf16_t* src = x.ptr<bf16_t>() + t * x.stride[0] + h * x.stride[1];
    for (int64_t d = 0; d < D; ++d) dst[d] = bf16_to_f32(src[d]);
  };
  std::atomic<bool> stopped{false};
  parallel_for(T * Hn, 4, [&](int64_t w0, int64_t w1) {
    std::vector<float> qf(static_cast<size_t>(D)), kf(static_cast<size_t>(D)), acc(static_cast<size_t>(D)),
        scores;
    for (int64_t w = w0; w < w1; ++w) {
      if (stop && (stopped.load(std::memory_order_relaxed) || (w % 64 == 0 && stop()))) {
        stopped.store(true, std::memory_order_relaxed);
        return;
      }
      const int64_t t = w / Hn, h = w % Hn;
      const int32_t b = cu[seg_of[size_t(t)]], e = cu[seg_of[size_t(t)] + 1];
      widen(q, t, h, qf.data());
      scores.resize(size_t(e - b));
      float mx = -INFINITY;
      for (int32_t j = b; j < e; ++j) {
        widen(k, j, h, kf.data());
        const float sc = dot8(qf.data(), kf.data(), D) * scale;
        scores[size_t(j - b)] = sc;
        mx = std::max(mx, sc);
      }
      std::fill(acc.begin(), acc.end(), 0.0f);
      float denom = 0;
      for (int32_t j = b; j < e; ++j) {
        const float pj = std::exp(scores[size_t(j - b)] - mx);
        denom += pj;
        widen(v, j, h, kf.data());
        for (int64_t d = 0; d < D; ++d) acc[size_t(d)] += pj * kf[size_t(d)];
      }
      bf16_t* o = out.ptr<bf16_t>() + t * out.stride[0] + h * out.stride[1];
      for (int64_t d = 0; d < D; ++d) o[d] = f32_to_bf16(acc[size_t(d)] / denom);
    }
  });
}

void pos_embed_interpolate(const Tensor& table, const Tensor& lin, int64_t side, int64_t grid_t,
                           int64_t grid_h, int64_t grid_w, int64_t merge, const Tensor& out) {
  const int64_t C = table.shape[1], H = grid_h, W = grid_w, m = merge, HW = H * W;
  const bf16_t* E = table.ptr<bf16_t>();
  const float* v = lin.ptr<float>();
  auto bf = [](float x) { return bf16_to_f32(f32_to_bf16(x)); };
  // q: a patch of frame 0 in merge-block order; frame t's row is t * HW + q (the same values).
  parallel_for(HW, 16, [&](int64_t q0, int64_t q1) {
    for (int64_t q = q0; q < q1; ++q) {
      const int64_t blk = q / (m * m), in = q % (m * m);
      const int64_t i = (blk / (W / m)) * m + in / m, j = (blk % (W / m)) * m + in % m;
      const PosAxis ah = pos_axis(v[i], side), aw = pos_axis(v[H + j], side);
      const float dh = ah.frac, dw = aw.frac;
      const int64_t idx[4] = {ah.lo * side + aw.lo, ah.lo * side + aw.hi, ah.hi * side + aw.lo,
                              ah.hi * side + aw.hi};
      const float wt[4] = {bf((1 - dh) * (1 - dw)), bf((1 - dh) * dw), bf(dh * (1 - dw)), bf(dh * dw)};
      bf16_t* o = mut_row_of(out, q);
      for (int64_t c = 0; c < C; ++c) {
        float acc = 0;
        for (int k = 0; k < 4; ++k) {
          const float p = bf(bf16_to_f32(E[idx[k] * C + c]) * wt[k]);
          acc = k == 0 ? p : bf(acc + p);
        }
        o[c] = f32_to_bf16(acc);
      }
      for (int64_t t = 1; t < grid_t; ++t) std::copy_n(o, C, mut_row_of(out, t * HW + q));
    }
  });
}

void cast_to_bf16(const Tensor& in, const Tensor& out) {
  const int64_t M = in.shape[0], K = in.shape[1];
  parallel_for(M, 64, [&](int64_t m0, int64_t m1) {
    for (int64_t r = m0; r < m1; ++r) {
      const float* x = in.ptr<float>() + r * in.stride[0];
      bf16_t* o = mut_row_of(out, r);
      for (int64_t c = 0; c < K; ++c) o[c] = f32_to_bf16(x[c]);
    }
  });
}

}  // namespace kiln::ops::cpu
