// Dispatchers of the vision tower's ops (ops/layer_norm.h, ops/rows.h, ops/vision_attention.h,
// ops/vision_pos_embed.h): argument checks, then the CPU reference or the CUDA kernel where one exists.
#include <cmath>
#include <vector>

#include "ops/checks.h"
#include "ops/cpu/reference.h"
#include "ops/cuda/dispatch.h"
#include "ops/layer_norm.h"
#include "ops/rows.h"
#include "ops/vision_attention.h"
#include "ops/vision_pos_embed.h"

namespace kiln::ops {
namespace {

// The host copy of a small i32 tensor (validation of device-side indexes).
std::vector<int32_t> host_i32(const Tensor& t) {
  std::vector<int32_t> v(static_cast<size_t>(t.numel()));
  copy_bytes(v.data(), Device::cpu(), t.data, t.device, v.size() * sizeof(int32_t));
  return v;
}

void check_same_shape(const char* op, const Tensor& a, const Tensor& b) {
  KILN_CHECK(a.ndim == b.ndim && a.shape == b.shape, op, ": ", a.describe(), " vs ", b.describe());
}

}  // namespace

void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps, const Tensor& out) {
  constexpr const char* op = "layer_norm";
  detail::check_matrix(op, "x", x, 2, DType::bf16);
  detail::check_matrix(op, "out", out, 2, DType::bf16);
  detail::check_matrix(op, "weight", weight, 1, DType::bf16);
  detail::check_matrix(op, "bias", bias, 1, DType::bf16);
  check_same_shape(op, x, out);
  KILN_CHECK(weight.shape[0] == x.shape[1] && bias.shape[0] == x.shape[1] && x.shape[1] > 0, op, ": weight ",
             weight.describe(), " and bias ", bias.describe(), " must be [", x.shape[1], "]");
  KILN_CHECK(eps > 0.0f, op, ": eps must be positive, got ", eps);
  for (const Tensor* t : {&weight, &bias, &out}) detail::check_same_device(op, x, *t);
  if (x.device.is_cuda()) return KILN_CUDA_OP(layer_norm(x, weight, bias, eps, out));
  cpu::layer_norm(x, weight, bias, eps, out);
}

void add(const Tensor& a, const Tensor& b, const Tensor& out) {
  constexpr const char* op = "add";
  detail::check_matrix(op, "a", a, 2, DType::bf16);
  detail::check_matrix(op, "b", b, 2, DType::bf16);
  detail::check_matrix(op, "out", out, 2, DType::bf16);
  check_same_shape(op, a, b);
  check_same_shape(op, a, out);
  detail::check_same_device(op, a, b);
  detail::check_same_device(op, a, out);
  if (a.device.is_cuda()) return KILN_CUDA_OP(add(a, b, out));
  cpu::add(a, b, out);
}

void scatter_rows(const Tensor& dst, const Tensor& rows, const Tensor& src, bool accumulate) {
  constexpr const char* op = "scatter_rows";
  detail::check_matrix(op, "dst", dst, 2, DType::bf16);
  detail::check_matrix(op, "rows", rows, 1, DType::i32);
  detail::check_matrix(op, "src", src, 2, DType::bf16);
  KILN_CHECK(src.shape[0] == rows.shape[0] && src.shape[1] == dst.shape[1], op, ": src ", src.describe(),
             " must be [", rows.shape[0], ", ", dst.shape[1], "]");
  detail::check_same_device(op, dst, rows);
  detail::check_same_device(op, dst, src);
  if (dst.device.is_cuda()) return KILN_CUDA_OP(scatter_rows(dst, rows, src, accumulate));
  const int32_t* r = rows.ptr<int32_t>();
  for (int64_t i = 0; i < rows.shape[0]; ++i)
    KILN_CHECK(r[i] >= 0 && r[i] < dst.shape[0], op, ": row ", r[i], " outside [0, ", dst.shape[0], ")");
  cpu::scatter_rows(dst, rows, src, accumulate);
}

Buffer build_rope_2d_table(int head_dim, double theta, int64_t max_pos, Device device) {
  KILN_CHECK(head_dim > 0 && head_dim % 4 == 0, "rope_2d table: head_dim ", head_dim,
             " must be a positive multiple of 4");
  KILN_CHECK(theta > 0 && max_pos > 0, "rope_2d table: theta and max_pos must be positive");
  const int Q = head_dim / 4, dim = head_dim / 2;
  std::vector<float> host(size_t(max_pos) * size_t(2 * Q));
  for (int j = 0; j < Q; ++j) {
    // transformers: 1.0 / (theta ** (arange(0, dim, 2, dtype=float) / dim)), all in fp32.
    const float expo = float(2 * j) / float(dim);
    const float inv = 1.0f / float(std::pow(double(float(theta)), double(expo)));
    for (int64_t p = 0; p < max_pos; ++p) {
      const float angle = float(p) * inv;
      host[size_t(p) * size_t(2 * Q) + size_t(j)] = float(std::cos(double(angle)));
      host[size_t(p) * size_t(2 * Q) + size_t(Q + j)] = float(std::sin(double(angle)));
    }
  }
  Buffer b(host.size() * sizeof(float), device);
  copy_bytes(b.data(), device, host.data(), Device::cpu(), host.size() * sizeof(float));
  return b;
}

RopeTable2d rope_2d_table_view(const Buffer& table, int head_dim, int64_t max_pos) {
  KILN_CHECK(table.bytes() >= size_t(max_pos) * size_t(head_dim / 2) * sizeof(float),
             "rope_2d table: buffer too small");
  return {table.view(DType::f32, {max_pos, head_dim / 2}), head_dim};
}

void rope_2d(const Tensor& qkv, const Tensor& pos, const RopeTable2d& table, int num_heads) {
  constexpr const char* op = "rope_2d";
  detail::check_matrix(op, "qkv", qkv, 2, DType::bf16);
  detail::check_matrix(op, "pos", pos, 2, DType::i32);
  detail::check_matrix(op, "table", table.cos_sin, 2, DType::f32);
  const int64_t D = table.head_dim, T = qkv.shape[0];
  KILN_CHECK(D > 0 && D % 4 == 0 && table.cos_sin.shape[1] == D / 2, op, ": table ", table.cos_sin.describe(),
             " does not fit head_dim ", D);
  KILN_CHECK(num_heads > 0 && qkv.shape[1] == 3 * num_heads * D, op, ": qkv ", qkv.describe(),
             " must be [T, 3 * ", num_heads, " * ", D, "]");
  KILN_CHECK(pos.shape[0] == T && pos.shape[1] == 2 && pos.is_contiguous(), op, ": pos ", pos.describe(),
             " must be contiguous [", T, ", 2]");
  detail::check_same_device(op, qkv, pos);
  detail::check_same_device(op, qkv, table.cos_sin);
  const std::vector<int32_t> p = host_i32(pos);
  for (int32_t v : p)
    KILN_CHECK(v >= 0 && v < table.cos_sin.shape[0], op, ": position ", v, " outside the table's [0, ",
               table.cos_sin.shape[0], ")");
  if (qkv.device.is_cuda()) return KILN_CUDA_OP(rope_2d(qkv, pos, table.cos_sin, num_heads));
  cpu::rope_2d(qkv, pos, table.cos_sin, num_heads);
}

void varlen_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_seqlens,
                      const Tensor& out, float scale, const std::function<bool()>& stop) {
  constexpr const char* op = "varlen_attention";
  detail::check_matrix(op, "q", q, 3, DType::bf16);
  detail::check_matrix(op, "k", k, 3, DType::bf16);
  detail::check_matrix(op, "v", v, 3, DType::bf16);
  detail::check_matrix(op, "out", out, 3, DType::bf16);
  detail::check_matrix(op, "cu_seqlens", cu_seqlens, 1, DType::i32);
  check_same_shape(op, q, k);
  check_same_shape(op, q, v);
  check_same_shape(op, q, out);
  KILN_CHECK(cu_seqlens.is_contiguous() && cu_seqlens.shape[0] >= 1, op,
             ": cu_seqlens must be contiguous, got ", cu_seqlens.describe());
  KILN_CHECK(out.data != q.data && out.data != k.data && out.data != v.data, op,
             ": out must not alias q, k or v");
  detail::check_same_device(op, q, cu_seqlens);
  const std::vector<int32_t> cu_host = host_i32(cu_seqlens);
  const int32_t* cu = cu_host.data();
  const int64_t S = cu_seqlens.shape[0] - 1;
  KILN_CHECK(cu[0] == 0 && cu[S] == q.shape[0], op, ": cu_seqlens must run from 0 to T = ", q.shape[0]);
  for (int64_t s = 0; s < S; ++s) KILN_CHECK(cu[s] <= cu[s + 1], op, ": cu_seqlens must be non-decreasing");
  detail::check_same_device(op, q, k);
  detail::check_same_device(op, q, v);
  detail::check_same_device(op, q, out);
  if (q.device.is_cuda()) return KILN_CUDA_OP(varlen_attention(q, k, v, cu_seqlens, out, scale));
  cpu::varlen_attention(q, k, v, cu_seqlens, out, scale, stop);
}

namespace {

// torch.linspace(0, end, steps) in fp32 as ATen's CPU kernel computes it: the first half from the start,
// the second from the end.
void linspace_f32(float end, int64_t steps, float* v) {
  if (steps == 1) {
    v[0] = 0.0f;
    return;
  }
  const float step = end / float(steps - 1);
  const int64_t half = steps / 2;
  for (int64_t i = 0; i < steps; ++i) v[i] = i < half ? step * float(i) : end - step * float(steps - 1 - i);
}

}  // namespace

std::vector<float> pos_embed_linspace(int64_t side, int64_t grid_h, int64_t grid_w) {
  KILN_CHECK(side > 0 && grid_h > 0 && grid_w > 0, "pos_embed_linspace: side ", side, " and grid ", grid_h,
             " x ", grid_w, " must be positive");
  std::vector<float> v(static_cast<size_t>(grid_h + grid_w));
  linspace_f32(float(side - 1), grid_h, v.data());
  linspace_f32(float(side - 1), grid_w, v.data() + grid_h);
  return v;
}

void pos_embed_interpolate(const Tensor& table, const Tensor& lin, int64_t grid_t, int64_t grid_h,
                           int64_t grid_w, int64_t merge, const Tensor& out) {
  constexpr const char* op = "pos_embed_interpolate";
  detail::check_matrix(op, "table", table, 2, DType::bf16);
  detail::check_matrix(op, "lin", lin, 1, DType::f32);
  detail::check_matrix(op, "out", out, 2, DType::bf16);
  KILN_CHECK(table.is_contiguous() && lin.is_contiguous(), op, ": table ", table.describe(), " and lin ",
             lin.describe(), " must be contiguous");
  int64_t side = int64_t(std::sqrt(double(table.shape[0])));
  while (side * side > table.shape[0]) --side;
  while ((side + 1) * (side + 1) <= table.shape[0]) ++side;
  KILN_CHECK(side > 0 && side * side == table.shape[0] && table.shape[1] > 0, op, ": table ",
             table.describe(), " must be [side * side, C]");
  KILN_CHECK(
      merge > 0 && grid_t > 0 && grid_h > 0 && grid_w > 0 && grid_h % merge == 0 && grid_w % merge == 0, op,
      ": grid ", grid_t, " x ", grid_h, " x ", grid_w, " must be positive multiples of merge ", merge);
  KILN_CHECK(lin.shape[0] == grid_h + grid_w, op, ": lin ", lin.describe(), " must be [", grid_h + grid_w,
             "]");
  KILN_CHECK(out.shape[0] == grid_t * grid_h * grid_w && out.shape[1] == table.shape[1], op, ": out ",
             out.describe(), " must be [", grid_t * grid_h * grid_w, ", ", table.shape[1], "]");
  detail::check_same_device(op, table, lin);
  detail::check_same_device(op, table, out);
  if (table.device.is_cuda())
    return KILN_CUDA_OP(pos_embed_interpolate(table, lin, side, grid_t, grid_h, grid_w, merge, out));
  const float* v = lin.ptr<float>();
  for (int64_t i = 0; i < lin.shape[0]; ++i)
    KILN_CHECK(std::isfinite(v[i]) && v[i] >= 0.0f && v[i] <= float(side - 1), op, ": lin[", i, "] = ", v[i],
               " outside [0, ", side - 1, "]");
  cpu::pos_embed_interpolate(table, lin, side, grid_t, grid_h, grid_w, merge, out);
}

void cast_to_bf16(const Tensor& in, const Tensor& out) {
  constexpr const char* op = "cast_to_bf16";
  detail::check_matrix(op, "in", in, 2, DType::f32);
  detail::check_matrix(op, "out", out, 2, DType::bf16);
  check_same_shape(op, in, out);
  detail::check_same_device(op, in, out);
  if (in.numel() == 0) return;
  if (in.device.is_cuda()) return KILN_CUDA_OP(cast_to_bf16(in, out));
  cpu::cast_to_bf16(in, out);
}

}  // namespace kiln::ops
