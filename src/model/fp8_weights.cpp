#include "model/fp8_weights.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "kiln/env.h"
#include "kiln/error.h"
#include "ops/fp8.h"

#ifdef KILN_HAVE_CUDA
#include <cuda_runtime_api.h>

#include <climits>

#include "kiln/cuda_check.h"
#include "ops/cuda/fp8_weight_quant.h"
#include "ops/cuda/ops_cuda.h"
#endif

namespace kiln {
namespace {

std::string module_of(const std::string& weight_name) {
  const std::string suffix = ".weight";
  if (weight_name.size() > suffix.size() &&
      weight_name.compare(weight_name.size() - suffix.size(), suffix.size(), suffix) == 0)
    return weight_name.substr(0, weight_name.size() - suffix.size());
  return weight_name;
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

}  // namespace

bool fp8_module_excluded(const QuantConfig& q, const std::string& weight_name) {
  const std::string module = module_of(weight_name);
  for (const std::string& m : q.modules_to_not_convert) {
    if (m.empty()) continue;
    // Whole dotted components only: "mlp.gate" (an MoE router) must not match "mlp.gate_proj", nor
    // "layers.1" match "layers.11".
    for (size_t pos = module.find(m); pos != std::string::npos; pos = module.find(m, pos + 1)) {
      const size_t end = pos + m.size();
      if ((pos == 0 || module[pos - 1] == '.') && (end == module.size() || module[end] == '.')) return true;
    }
  }
  return false;
}

bool checkpoint_linear_is_fp8(const QuantConfig& q, const Checkpoint& ckpt, const std::string& weight_name,
                              int64_t rows, int64_t cols) {
  const TensorEntry& e = ckpt.entry(weight_name);  // throws naming a missing tensor
  const std::string scale_name = module_of(weight_name) + ".weight_scale_inv";
  const bool has_scale = ckpt.has(scale_name);
  if (e.dtype != DType::f8e4m3) {
    KILN_CHECK(!has_scale, "tensor '", scale_name, "' accompanies '", weight_name, "', which is ",
               dtype_name(e.dtype), ": block scales go with F8_E4M3 weights only");
    return false;
  }
  KILN_CHECK(q.method == "fp8", "tensor '", weight_name,
             "' is F8_E4M3 but config.json has no quantization_config with quant_method \"fp8\"");
  const std::vector<int64_t> want{rows, cols};
  KILN_CHECK(e.shape == want, "tensor '", weight_name, "': expected f8e4m3", shape_str(want),
             ", found f8e4m3", shape_str(e.shape));
  KILN_CHECK(has_scale, "tensor '", weight_name, "' is F8_E4M3 but its block scales '", scale_name,
             "' are missing");
  const TensorEntry& s = ckpt.entry(scale_name);
  KILN_CHECK(s.dtype == DType::f32 || s.dtype == DType::bf16, "tensor '", scale_name,
             "': block scales must be F32 or BF16, found ", dtype_name(s.dtype));
  const std::vector<int64_t> want_s{ops::fp8_blocks(rows), ops::fp8_blocks(cols)};
  KILN_CHECK(s.shape == want_s, "tensor '", scale_name, "': expected ", shape_str(want_s),
             " (ceil(out/128), ceil(in/128) of '", weight_name, "' ", shape_str(want), "), found ",
             shape_str(s.shape));
  return true;
}

Fp8HostPart read_fp8_part(const Checkpoint& ckpt, const std::string& weight_name, int64_t rows,
                          int64_t cols) {
  Fp8HostPart p;
  p.rows = rows, p.cols = cols;
  p.q = ckpt.get(weight_name).ptr<uint8_t>();
  const std::string scale_name = module_of(weight_name) + ".weight_scale_inv";
  const Tensor s = ckpt.get(scale_name);
  const int64_t n = s.numel();
  p.scale.resize(size_t(n));
  for (int64_t i = 0; i < n; ++i) {
    const float v = s.dtype == DType::f32 ? s.ptr<float>()[i] : bf16_to_f32(s.ptr<bf16_t>()[i]);
    KILN_CHECK(std::isfinite(v) && v >= 0.0f, "tensor '", scale_name, "' holds ", v, " at element ", i,
               ": block scales must be finite and non-negative");
    p.scale[size_t(i)] = v;
  }
  return p;
}

Fp8HostPart quantize_fp8_part(const bf16_t* w, int64_t rows, int64_t cols, const std::string& name) {
  Fp8HostPart p;
  p.rows = rows, p.cols = cols;
  p.owned.resize(size_t(rows * cols));
  p.scale.resize(size_t(ops::fp8_blocks(rows) * ops::fp8_blocks(cols)));
  ops::quantize_weight_fp8(Tensor(const_cast<bf16_t*>(w), DType::bf16, {rows, cols}),
                           Tensor(p.owned.data(), DType::f8e4m3, {rows, cols}),
                           Tensor(p.scale.data(), DType::f32, {ops::fp8_blocks(rows), ops::fp8_blocks(cols)}),
                           name);
  p.q = p.owned.data();
  return p;
}

#ifdef KILN_HAVE_CUDA
namespace {
// Rows of the W8A8 GEMM's workspace reserved at load: more than any decode graph captures (serving's largest
// batch bucket times the speculative tokens per row); prefill chunks grow it eagerly.
constexpr int64_t kFp8GemmGraphRows = 2048;
}  // namespace
#endif

bool fp8_dequant_forced() {
  return env_switch("KILN_FP8_DEQUANT", false);
}

bool fp8_quantize_on_gpu() {
  static const bool on = env_switch("KILN_FP8_QUANTIZE_ON_GPU", kFp8QuantizeOnGpuDefault);
  return on;
}

bool fp8_weights_stay_fp8(Device device) {
  if (device.is_cpu()) return true;
#ifdef KILN_HAVE_CUDA
  if (fp8_dequant_forced()) return false;
  int major = 0, minor = 0;
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device.index));
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device.index));
  return major > 8 || (major == 8 && minor >= 9);
#else
  return false;
#endif
}

namespace {

// Path (c) on CUDA: each part dequantized into its rows of one bf16 matrix.
ops::LinearWeight place_dequantized(const std::vector<Fp8HostPart>& parts, int64_t rows, Device device,
                                    std::vector<Buffer>& storage) {
  const int64_t cols = parts[0].cols, kb = ops::fp8_blocks(cols);
  Buffer out(size_t(rows * cols) * sizeof(bf16_t), device);
  int64_t row0 = 0;
  for (const Fp8HostPart& p : parts) {
    Buffer q(size_t(p.rows * p.cols), device), s(p.scale.size() * sizeof(float), device);
    copy_bytes(q.data(), device, p.q, Device::cpu(), size_t(p.rows * p.cols));
    copy_bytes(s.data(), device, p.scale.data(), Device::cpu(), p.scale.size() * sizeof(float));
    const ops::LinearWeight w(q.view(DType::f8e4m3, {p.rows, p.cols}),
                              s.view(DType::f32, {ops::fp8_blocks(p.rows), kb}));
    ops::dequantize_fp8(
        w, Tensor(static_cast<bf16_t*>(out.data()) + row0 * cols, DType::bf16, {p.rows, cols}, device));
#ifdef KILN_HAVE_CUDA
    KILN_CUDA_CHECK(cudaDeviceSynchronize());  // before q and s are freed
#endif
    row0 += p.rows;
  }
  ops::LinearWeight w(out.view(DType::bf16, {rows, cols}));
  storage.push_back(std::move(out));
  return w;
}

}  // namespace

ops::LinearWeight place_fp8_linear(const std::vector<Fp8HostPart>& parts,
                                   const std::vector<std::string>& names, Device device,
                                   std::vector<Buffer>& storage) {
  KILN_CHECK(!parts.empty() && parts.size() == names.size(), "place_fp8_linear: no parts");
  const int64_t cols = parts[0].cols;
  int64_t rows = 0;
  for (const Fp8HostPart& p : parts) {
    KILN_CHECK(p.cols == cols, "internal: stacked parts of different widths");
    rows += p.rows;
  }
  bool blocks_aligned = true;  // every part but the last fills whole 128-row blocks
  for (size_t i = 0; i + 1 < parts.size(); ++i)
    blocks_aligned = blocks_aligned && parts[i].rows % ops::kFp8Block == 0;
  if (device.is_cuda() && (!blocks_aligned || !fp8_weights_stay_fp8(device)))
    return place_dequantized(parts, rows, device, storage);
  for (size_t i = 0; i + 1 < parts.size(); ++i)
    KILN_CHECK(parts[i].rows % ops::kFp8Block == 0, "block-FP8 tensor '", names[i], "' has ", parts[i].rows,
               " rows, not a multiple of 128: kiln stacks it with '", names[i + 1],
               "' into one matrix, which needs every part but the last to fill whole 128-row blocks");
  const ops::LinearWeight w = upload_fp8_stack(parts, device, storage);
  reserve_fp8_gemm_buffers(device, rows, cols);
  return w;
}

bool fp8_stack_stays_fp8(const std::vector<int64_t>& rows, Device device) {
  for (size_t i = 0; i + 1 < rows.size(); ++i)
    if (rows[i] % ops::kFp8Block != 0) return false;
  return fp8_weights_stay_fp8(device);
}

void reserve_fp8_gemm_buffers(Device device, int64_t rows, int64_t cols) {
#ifdef KILN_HAVE_CUDA
  // GemmEngine's buffers for the FP8 calls the GEMV does not take (gemm.h), grown now, before any graph
  // capture: the dequantization scratch for the largest FP8 weight placed, and the W8A8 GEMM's workspace for
  // kFp8GemmGraphRows rows (a captured step with more rows takes the scratch path).
  if (device.is_cuda()) {
    ops::cuda::reserve_fp8_dequant(rows * cols);
    ops::cuda::reserve_fp8_gemm(kFp8GemmGraphRows, cols);
  }
#else
  (void)device, (void)rows, (void)cols;
#endif
}

ops::LinearWeight upload_fp8_stack(const std::vector<Fp8HostPart>& parts, Device device,
                                   std::vector<Buffer>& storage) {
  const int64_t cols = parts.at(0).cols, kb = ops::fp8_blocks(cols);
  int64_t rows = 0, scale_rows = 0;
  for (const Fp8HostPart& p : parts) {
    KILN_CHECK(p.cols == cols, "internal: stacked parts of different widths");
    rows += p.rows;
    scale_rows += ops::fp8_blocks(p.rows);
  }
  Buffer q(size_t(rows * cols), device), s(size_t(scale_rows * kb) * sizeof(float), device);
  auto* qd = static_cast<uint8_t*>(q.data());
  auto* sd = static_cast<float*>(s.data());
  for (const Fp8HostPart& p : parts) {
    copy_bytes(qd, device, p.q, Device::cpu(), size_t(p.rows * p.cols));
    copy_bytes(sd, device, p.scale.data(), Device::cpu(), p.scale.size() * sizeof(float));
    qd += p.rows * p.cols;
    sd += p.scale.size();
  }
  ops::LinearWeight w(q.view(DType::f8e4m3, {rows, cols}), s.view(DType::f32, {scale_rows, kb}));
  storage.push_back(std::move(q));
  storage.push_back(std::move(s));
  return w;
}

ops::LinearWeight quantize_fp8_stack_on_device(const std::vector<std::string>& names,
                                               const std::vector<int64_t>& rows, int64_t cols,
                                               const DeviceBf16Fill& fill, Device device,
                                               std::vector<Buffer>& storage) {
  KILN_CHECK(!names.empty() && names.size() == rows.size() && device.is_cuda(),
             "quantize_fp8_stack_on_device: no parts, or not a CUDA device");
#ifdef KILN_HAVE_CUDA
  const int64_t kb = ops::fp8_blocks(cols);
  int64_t total = 0, scale_rows = 0, largest = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    KILN_CHECK(i + 1 == rows.size() || rows[i] % ops::kFp8Block == 0, "block-FP8 tensor '", names[i],
               "' has ", rows[i], " rows, not a multiple of 128: kiln stacks it with '",
               names[std::min(i + 1, names.size() - 1)],
               "' into one matrix, which needs every part but the last to fill whole 128-row blocks");
    total += rows[i];
    scale_rows += ops::fp8_blocks(rows[i]);
    largest = std::max(largest, rows[i]);
  }
  Buffer q(size_t(total * cols), device), s(size_t(scale_rows * kb) * sizeof(float), device);
  Buffer staging(size_t(largest * cols) * sizeof(bf16_t), device), flag(sizeof(int32_t), device);
  const int32_t none = INT32_MAX;
  KILN_CUDA_CHECK(cudaMemcpy(flag.data(), &none, sizeof(none), cudaMemcpyHostToDevice));
  auto* qd = static_cast<uint8_t*>(q.data());
  auto* sd = static_cast<float*>(s.data());
  for (size_t i = 0; i < rows.size(); ++i) {
    fill(i, staging.data());
    // The legacy stream, as the fill's: the next part's fill of `staging` waits for this quantization.
    cuda::quantize_weight_fp8(static_cast<const uint16_t*>(staging.data()), rows[i], cols, qd, sd,
                              static_cast<int32_t*>(flag.data()), int32_t(i), nullptr);
    qd += rows[i] * cols;
    sd += ops::fp8_blocks(rows[i]) * kb;
  }
  int32_t bad = none;
  KILN_CUDA_CHECK(cudaMemcpy(&bad, flag.data(), sizeof(bad), cudaMemcpyDeviceToHost));  // after every part
  KILN_CHECK(bad == none, "--quantization fp8: ", names[size_t(bad)], " holds a non-finite value");
  ops::LinearWeight w(q.view(DType::f8e4m3, {total, cols}), s.view(DType::f32, {scale_rows, kb}));
  storage.push_back(std::move(q));
  storage.push_back(std::move(s));
  return w;
#else
  (void)cols, (void)fill, (void)storage;
  KILN_FAIL("kiln was built without CUDA: cannot quantize weights on a GPU");
#endif
}

}  // namespace kiln

namespace kiln {

std::vector<NamedTensor> quantize_checkpoint_linears(const std::vector<NamedTensor>& in,
                                                     const std::function<bool(const std::string&)>& is_linear,
                                                     bool bf16_scales, Fp8CheckpointStorage& storage) {
  std::vector<NamedTensor> out;
  for (const NamedTensor& t : in) {
    if (!is_linear(t.name)) {
      out.push_back(t);
      continue;
    }
    KILN_CHECK(t.tensor.ndim == 2 && t.tensor.dtype == DType::bf16, "quantize_checkpoint_linears: '", t.name,
               "' must be a bf16 matrix, got ", t.tensor.describe());
    const int64_t rows = t.tensor.shape[0], cols = t.tensor.shape[1];
    const int64_t nb = ops::fp8_blocks(rows), kb = ops::fp8_blocks(cols);
    Fp8HostPart p = quantize_fp8_part(t.tensor.ptr<bf16_t>(), rows, cols, t.name);
    const std::string scale_name = module_of(t.name) + ".weight_scale_inv";
    if (bf16_scales) {
      // The scale a loader will see is bf16(s): requantize each block against it (q = e4m3(w / s'), a
      // correctly rounded division, as the activation quantizer does).
      std::vector<bf16_t>& sb = storage.bf16.emplace_back(p.scale.size());
      for (size_t i = 0; i < sb.size(); ++i) sb[i] = f32_to_bf16(p.scale[i]);
      const bf16_t* w = t.tensor.ptr<bf16_t>();
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) {
          const float s = bf16_to_f32(sb[size_t((r / ops::kFp8Block) * kb + c / ops::kFp8Block)]);
          p.owned[size_t(r * cols + c)] = f32_to_e4m3(bf16_to_f32(w[r * cols + c]) / s);
        }
      out.push_back({t.name, Tensor(storage.bytes.emplace_back(std::move(p.owned)).data(), DType::f8e4m3,
                                    {rows, cols})});
      out.push_back({scale_name, Tensor(sb.data(), DType::bf16, {nb, kb})});
    } else {
      out.push_back({t.name, Tensor(storage.bytes.emplace_back(std::move(p.owned)).data(), DType::f8e4m3,
                                    {rows, cols})});
      out.push_back(
          {scale_name, Tensor(storage.f32.emplace_back(std::move(p.scale)).data(), DType::f32, {nb, kb})});
    }
  }
  return out;
}

std::string fp8_quantization_config_json(const std::vector<std::string>& modules_to_not_convert) {
  std::string s = R"({"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", )"
                  R"("weight_block_size": [128, 128])";
  if (!modules_to_not_convert.empty()) {
    s += R"(, "modules_to_not_convert": [)";
    for (size_t i = 0; i < modules_to_not_convert.size(); ++i)
      s += (i ? ", \"" : "\"") + modules_to_not_convert[i] + "\"";
    s += "]";
  }
  return s + "}";
}

}  // namespace kiln
