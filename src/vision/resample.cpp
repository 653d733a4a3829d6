#include "vision/resample.h"

#include <algorithm>
#include <cmath>

#include "kiln/error.h"

namespace kiln::vision {
namespace {

// Keys cubic, a = -0.5, with each implementation's own operation order for the outer piece (the two round
// differently in the last bit).
double keys_cubic(double x, ResampleKernel kernel) {
  constexpr double a = -0.5;
  x = std::abs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
  if (x < 2.0)
    return kernel == ResampleKernel::pil ? (((x - 5.0) * x + 8.0) * x - 4.0) * a
                                         : ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a;
  return 0.0;
}

// One axis: for each output index, the first input index, the tap count and the integer weights.
struct AxisWeights {
  int taps = 0;       // stride of `weights`
  int precision = 0;  // fractional bits
  std::vector<int> first, count;
  std::vector<int32_t> weights;  // [out, taps]
};

AxisWeights axis_weights(int in_size, int out_size, ResampleKernel kernel) {
  const double scale = static_cast<double>(in_size) / out_size;
  const double filter_scale = std::max(scale, 1.0);
  const double support = 2.0 * filter_scale;
  const double inv_scale = 1.0 / filter_scale;
  AxisWeights a;
  a.taps = static_cast<int>(std::ceil(support)) * 2 + 1;
  a.first.resize(out_size);
  a.count.resize(out_size);
  std::vector<double> w(static_cast<size_t>(out_size) * a.taps, 0.0);
  double w_max = 0.0;
  for (int i = 0; i < out_size; ++i) {
    const double center = (i + 0.5) * scale;
    // Truncation toward zero, then clamping, as both implementations round these bounds.
    const int lo = std::max(static_cast<int>(center - support + 0.5), 0);
    const int hi = std::min(static_cast<int>(center + support + 0.5), in_size);
    const int n = std::clamp(hi - lo, 0, a.taps);
    double total = 0.0;
    double* wi = &w[static_cast<size_t>(i) * a.taps];
    for (int j = 0; j < n; ++j) total += wi[j] = keys_cubic((j + lo - center + 0.5) * inv_scale, kernel);
    if (total != 0.0)
      for (int j = 0; j < n; ++j) w_max = std::max(w_max, wi[j] /= total);
    a.first[i] = lo;
    a.count[i] = n;
  }
  if (kernel == ResampleKernel::pil) {
    a.precision = 22;
  } else {
    for (a.precision = 0; a.precision < 22; ++a.precision)
      if (static_cast<int>(0.5 + w_max * (1 << (a.precision + 1))) >= (1 << 15)) break;
  }
  a.weights.resize(w.size());
  const double one = static_cast<double>(1 << a.precision);
  for (size_t k = 0; k < w.size(); ++k) {
    const double v = w[k] * one;
    a.weights[k] = v < 0 ? static_cast<int32_t>(-0.5 + v) : static_cast<int32_t>(0.5 + v);
  }
  return a;
}

// Sums fit in int32: |weights| add up to < 1.3 x 2^precision (the cubic's negative lobes), precision <= 22,
// samples <= 255.
uint8_t clamp_shift(int32_t acc, int precision) {
  return static_cast<uint8_t>(std::clamp<int32_t>(acc >> precision, 0, 255));
}

// rows [y0, y1) of src [*, in_w, 3] -> [y1 - y0, out_w, 3]
std::vector<uint8_t> pass_horizontal(const std::vector<uint8_t>& src, int in_w, int y0, int y1,
                                     const AxisWeights& a, int out_w) {
  std::vector<uint8_t> dst(static_cast<size_t>(y1 - y0) * out_w * 3);
  const int32_t half = int32_t{1} << (a.precision - 1);
  for (int y = y0; y < y1; ++y) {
    const uint8_t* row = &src[static_cast<size_t>(y) * in_w * 3];
    uint8_t* out = &dst[static_cast<size_t>(y - y0) * out_w * 3];
    for (int x = 0; x < out_w; ++x) {
      const int32_t* w = &a.weights[static_cast<size_t>(x) * a.taps];
      const uint8_t* in = row + static_cast<size_t>(a.first[x]) * 3;
      int32_t r = half, g = half, b = half;
      for (int k = 0; k < a.count[x]; ++k) {
        r += int32_t{in[3 * k]} * w[k];
        g += int32_t{in[3 * k + 1]} * w[k];
        b += int32_t{in[3 * k + 2]} * w[k];
      }
      out[3 * x] = clamp_shift(r, a.precision);
      out[3 * x + 1] = clamp_shift(g, a.precision);
      out[3 * x + 2] = clamp_shift(b, a.precision);
    }
  }
  return dst;
}

// src [*, w, 3] whose row 0 is input row `row0` -> [out_h, w, 3]. Row-major accumulation (tap outer, sample
// inner) so the inner loop is a contiguous multiply-add the compiler vectorizes.
std::vector<uint8_t> pass_vertical(const std::vector<uint8_t>& src, int w, int row0, const AxisWeights& a,
                                   int out_h) {
  std::vector<uint8_t> dst(static_cast<size_t>(out_h) * w * 3);
  const size_t stride = static_cast<size_t>(w) * 3;
  std::vector<int32_t> acc(stride);
  for (int y = 0; y < out_h; ++y) {
    const int32_t* wy = &a.weights[static_cast<size_t>(y) * a.taps];
    std::fill(acc.begin(), acc.end(), int32_t{1} << (a.precision - 1));
    for (int k = 0; k < a.count[y]; ++k) {
      const uint8_t* in = &src[static_cast<size_t>(a.first[y] - row0 + k) * stride];
      const int32_t wk = wy[k];
      for (size_t c = 0; c < stride; ++c) acc[c] += int32_t{in[c]} * wk;
    }
    uint8_t* out = &dst[static_cast<size_t>(y) * stride];
    for (size_t c = 0; c < stride; ++c) out[c] = clamp_shift(acc[c], a.precision);
  }
  return dst;
}

}  // namespace

std::vector<uint8_t> resize_bicubic_rgb(const std::vector<uint8_t>& rgb, int in_w, int in_h, int out_w,
                                        int out_h, ResampleKernel kernel) {
  KILN_CHECK(in_w >= 1 && in_h >= 1 && out_w >= 1 && out_h >= 1, "resize ", in_w, "x", in_h, " -> ", out_w,
             "x", out_h);
  KILN_CHECK_EQ(rgb.size(), static_cast<size_t>(in_w) * in_h * 3);
  const bool need_h = out_w != in_w, need_v = out_h != in_h;
  if (!need_h && !need_v) return rgb;
  if (!need_v) return pass_horizontal(rgb, in_w, 0, in_h, axis_weights(in_w, out_w, kernel), out_w);
  const AxisWeights av = axis_weights(in_h, out_h, kernel);
  if (!need_h) return pass_vertical(rgb, in_w, 0, av, out_h);
  // Only the input rows the vertical pass reads go through the horizontal one.
  const int y0 = av.first.front();
  const int y1 = av.first.back() + av.count.back();
  const std::vector<uint8_t> tmp =
      pass_horizontal(rgb, in_w, y0, y1, axis_weights(in_w, out_w, kernel), out_w);
  return pass_vertical(tmp, out_w, y0, av, out_h);
}

}  // namespace kiln::vision
