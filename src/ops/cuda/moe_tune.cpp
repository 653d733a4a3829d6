// The MoE expert-kernel tuner (see moe_tune.h).
#include "ops/cuda/moe_tune.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <functional>
#include <iterator>
#include <vector>

#include "kiln/cuda_check.h"
#include "kiln/error.h"
#include "kiln/tensor.h"
#include "ops/cuda/context.h"
#include "ops/cuda/elementwise.h"
#include "ops/cuda/fp8_weight_quant.h"
#include "ops/cuda/moe.h"
#include "ops/cuda/moe_ops.h"

namespace kiln::ops::cuda {
namespace kc = ::kiln::cuda;
namespace {

constexpr int kInputs = 8;  // input batches rotated over (different experts a call)
constexpr int kReps = 7;    // timed repetitions; the median is kept
constexpr int64_t kBf16Below = kMoeTuneLadder[std::size(kMoeTuneLadder) - 1] + 1;
constexpr size_t kQuantChunkBytes = size_t(64) << 20;  // the bf16 staging of the FP8 experts' quantization
constexpr size_t kFreeMargin = size_t(512) << 20;      // left free for the caller beside the tuner's buffers

// Device buffers freed on every exit path.
struct DeviceBuffers {
  std::vector<void*> ptrs;
  void* get(size_t bytes) {
    void* p = nullptr;
    KILN_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 256)));
    ptrs.push_back(p);
    return p;
  }
  ~DeviceBuffers() {
    for (void* p : ptrs) cudaFree(p);
  }
};

struct Events {
  std::vector<cudaEvent_t> ev;
  explicit Events(int n) : ev(size_t(n), nullptr) {
    for (auto& e : ev) KILN_CUDA_CHECK(cudaEventCreate(&e));
  }
  ~Events() {
    for (auto e : ev)
      if (e) cudaEventDestroy(e);
  }
};

struct OwnedStream {
  cudaStream_t s = nullptr;
  OwnedStream() { KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~OwnedStream() {
    if (s) cudaStreamDestroy(s);
  }
};

struct GraphExec {
  cudaGraphExec_t exec = nullptr;
  GraphExec() = default;
  GraphExec(GraphExec&& o) noexcept : exec(o.exec) { o.exec = nullptr; }
  GraphExec(const GraphExec&) = delete;
  GraphExec& operator=(const GraphExec&) = delete;
  ~GraphExec() {
    if (exec) cudaGraphExecDestroy(exec);
  }
};

// `run` captured on st into an instantiated graph, as the decode step runs the layer; exec nullptr where the
// capture failed (its error cleared: the caller times eagerly instead).
GraphExec capture(cudaStream_t st, const std::function<void()>& run) {
  KILN_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  bool ok = true;
  try {
    run();
  } catch (const std::exception&) {
    ok = false;
  }
  cudaGraph_t graph = nullptr;
  ok = cudaStreamEndCapture(st, &graph) == cudaSuccess && graph && ok;
  GraphExec g;
  if (ok && cudaGraphInstantiate(&g.exec, graph, 0) != cudaSuccess) g.exec = nullptr;
  if (graph) cudaGraphDestroy(graph);
  if (!g.exec) (void)cudaGetLastError();
  return g;
}

// Random bf16 [rows, cols] (a stack of experts' matrices) quantized per 128 x 128 block into q and scale,
// chunk by chunk through `stage` (stage_rows rows of bf16).
void fill_fp8(uint8_t* q, float* scale, int64_t rows, int64_t cols, uint16_t* stage, int64_t stage_rows,
              int32_t* nonfinite, uint64_t seed, cudaStream_t st) {
  const int64_t scale_cols = (cols + 127) / 128;
  for (int64_t r = 0; r < rows; r += stage_rows) {
    const int64_t n = std::min(stage_rows, rows - r);
    kc::fill_random_bf16(stage, n * cols, seed + uint64_t(r), 0.05f, 0.0f, st);
    kc::quantize_weight_fp8(stage, n, cols, q + r * cols, scale + r / 128 * scale_cols, nonfinite, 0, st);
  }
}

int64_t ladder_rungs_below(int64_t below) {
  int64_t n = 0;
  for (const int64_t t : kMoeTuneLadder) n += t < below;
  return n;
}

}  // namespace

int64_t moe_tune_below(const MoeTuneShape& s) {
  if (s.E < 1 || s.k < 1 || s.H < 8 || s.I < 8) return 0;
  if (s.fp8) {
    const int64_t dequant = moe_fp8_dequant_min_tokens();
    const bool w8a8 = moe_fp8_w8a8_enabled() && moe_env_experts() != MoeExperts::grouped_gemm &&
                      kc::moe_grouped_gemm_fp8_sm90_applies() && s.H % 128 == 0 && s.I % 128 == 0;
    return w8a8 && dequant > 1 ? dequant : 0;
  }
  const bool wgmma = moe_env_experts() == MoeExperts::by_rows && kc::moe_grouped_gemm_sm90_applies();
  return wgmma ? kBf16Below : 0;
}

MoeTuneKey moe_tune_key(const MoeTuneShape& s) {
  int dev = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  KILN_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  return {.gpu = prop.name, .sms = prop.multiProcessorCount, .shape = s, .below = moe_tune_below(s)};
}

MoeThresholds tune_moe_thresholds(const MoeTuneShape& s) {
  const auto t0 = std::chrono::steady_clock::now();
  MoeThresholds r;
  r.below = moe_tune_below(s);
  const int64_t rungs = ladder_rungs_below(r.below);
  if (r.below == 0 || rungs == 0) return r;
  const int64_t E = s.E, L = s.local > 0 ? s.local : s.E, H = s.H, I = s.I;
  const int64_t t_max = kMoeTuneLadder[rungs - 1];
  int dev = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&dev));
  const Device device = Device::cuda(dev);

  // Sizes first: the experts, one quantization chunk (FP8), the inputs, and the largest scratch.
  const size_t elem = s.fp8 ? 1 : 2;
  const size_t gu_bytes = size_t(L * 2 * I * H) * elem, dn_bytes = size_t(L * H * I) * elem;
  const int64_t gu_srows = 2 * I / 128 * L, dn_srows = H / 128 * L;  // FP8 scale rows, stacked experts
  const size_t gu_s_bytes = s.fp8 ? size_t(gu_srows * ((H + 127) / 128)) * 4 : 0;
  const size_t dn_s_bytes = s.fp8 ? size_t(dn_srows * ((I + 127) / 128)) * 4 : 0;
  // Whole 128-row blocks of the wider matrix ([2I, H] or [H, I] rows of max(H, I) columns) a chunk.
  const int64_t cols_max = std::max(H, I);
  const int64_t stage_rows =
      std::max<int64_t>(128, int64_t(kQuantChunkBytes / size_t(cols_max * 2)) / 128 * 128);
  const size_t stage_bytes = s.fp8 ? size_t(stage_rows * cols_max) * 2 : 0;
  const MoeExperts grouped = s.fp8 ? MoeExperts::grouped_gemm_fp8_w8a8 : MoeExperts::grouped_gemm_sm90;

  ops::MoeWeights w;
  w.top_k = s.k;
  w.norm_topk_prob = true;
  const DType wt = s.fp8 ? DType::f8e4m3 : DType::bf16;
  // Shapes only (no data yet) to size the scratch.
  w.router = Tensor(nullptr, DType::bf16, {E, H}, device);
  w.gate_up = Tensor(nullptr, wt, {L, 2 * I, H}, device);
  w.down = Tensor(nullptr, wt, {L, H, I}, device);
  if (s.fp8) {
    w.gate_up_scale = Tensor(nullptr, DType::f32, {L, 2 * I / 128, (H + 127) / 128}, device);
    w.down_scale = Tensor(nullptr, DType::f32, {L, H / 128, (I + 127) / 128}, device);
  }
  size_t scratch_bytes = 0;
  for (int64_t i = 0; i < rungs; ++i)
    for (const MoeExperts e : {MoeExperts::gather_gemv, grouped})
      scratch_bytes = std::max(scratch_bytes, moe_scratch_bytes(w, H, kMoeTuneLadder[i], e));
  const size_t x_bytes = size_t(kInputs * t_max * H) * 2, out_bytes = size_t(t_max * H) * 2;
  const size_t need = gu_bytes + dn_bytes + gu_s_bytes + dn_s_bytes + stage_bytes + size_t(E * H) * 2 +
                      x_bytes + out_bytes + scratch_bytes;
  size_t free_bytes = 0, total_bytes = 0;
  KILN_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  if (need + kFreeMargin > free_bytes) {
    std::fprintf(stderr,
                 "kiln: the MoE expert-kernel tuner needs %.2f GB of device memory, %.2f GB are free: not "
                 "tuned (the default thresholds stay)\n",
                 double(need) * 1e-9, double(free_bytes) * 1e-9);
    return r;
  }

  DeviceBuffers bufs;
  const OwnedStream stream;
  const cudaStream_t st = stream.s;
  const kc::StreamScope scope(st);
  void* router = bufs.get(size_t(E * H) * 2);
  void* gate_up = bufs.get(gu_bytes);
  void* down = bufs.get(dn_bytes);
  void* x = bufs.get(x_bytes);
  void* out = bufs.get(out_bytes);
  void* scratch = bufs.get(scratch_bytes);
  // Fixed seeds: the same experts and routing on every run. Router and inputs as in moe_tune.h.
  kc::fill_random_bf16(router, E * H, 0x6d6f6531, 0.05f, 0.0f, st);
  kc::fill_random_bf16(x, kInputs * t_max * H, 0x6d6f6532, 1.0f, 0.0f, st);
  if (s.fp8) {
    void* gu_s = bufs.get(gu_s_bytes);
    void* dn_s = bufs.get(dn_s_bytes);
    auto* stage = static_cast<uint16_t*>(bufs.get(stage_bytes));
    auto* nonfinite = static_cast<int32_t*>(bufs.get(4));
    KILN_CUDA_CHECK(cudaMemsetAsync(nonfinite, 0x7f, 4, st));  // not read: the fills are finite
    fill_fp8(static_cast<uint8_t*>(gate_up), static_cast<float*>(gu_s), L * 2 * I, H, stage, stage_rows,
             nonfinite, 0x6d6f6533, st);
    fill_fp8(static_cast<uint8_t*>(down), static_cast<float*>(dn_s), L * H, I, stage, stage_rows, nonfinite,
             0x6d6f6534, st);
    w.gate_up_scale.data = gu_s;
    w.down_scale.data = dn_s;
  } else {
    kc::fill_random_bf16(gate_up, L * 2 * I * H, 0x6d6f6533, 0.05f, 0.0f, st);
    kc::fill_random_bf16(down, L * H * I, 0x6d6f6534, 0.05f, 0.0f, st);
  }
  w.router.data = router;
  w.gate_up.data = gate_up;
  w.down.data = down;

  int64_t call_index = 0;
  const auto call = [&](int64_t T, MoeExperts e) {
    auto* xi = static_cast<uint16_t*>(x) + (call_index++ % kInputs) * t_max * H;
    moe_mlp(Tensor(xi, DType::bf16, {T, H}, device), w, Tensor(out, DType::bf16, {T, H}, device), scratch,
            scratch_bytes, e);
  };
  const Events ev(kReps + 1);
  // Median µs per call over kReps runs of `run` (kInputs calls each) between events, after one untimed run.
  const auto median_us = [&](const std::function<void()>& run) {
    run();
    KILN_CUDA_CHECK(cudaEventRecord(ev.ev[0], st));
    for (int rep = 0; rep < kReps; ++rep) {
      run();
      KILN_CUDA_CHECK(cudaEventRecord(ev.ev[size_t(rep) + 1], st));
    }
    KILN_CUDA_CHECK(cudaEventSynchronize(ev.ev[kReps]));
    std::vector<float> us(kReps);
    for (int rep = 0; rep < kReps; ++rep) {
      float ms = 0;
      KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, ev.ev[size_t(rep)], ev.ev[size_t(rep) + 1]));
      us[size_t(rep)] = ms * 1000.0f / float(kInputs);
    }
    std::nth_element(us.begin(), us.begin() + kReps / 2, us.end());
    return double(us[kReps / 2]);
  };
  const auto calls = [&](int64_t T, MoeExperts e) {
    for (int c = 0; c < kInputs; ++c) call(T, e);
  };
  const auto time_us = [&](int64_t T, MoeExperts e) {
    call(T, e);  // eager first: first-use setup (cuBLASLt plans for the router GEMM, tensor maps) stays out
    const GraphExec g = capture(st, [&] { calls(T, e); });
    if (!g.exec) {
      r.graphs = false;
      return median_us([&] { calls(T, e); });
    }
    return median_us([&] { KILN_CUDA_CHECK(cudaGraphLaunch(g.exec, st)); });
  };
  for (int64_t i = 0; i < rungs; ++i) {
    const int64_t T = kMoeTuneLadder[i];
    r.times.tokens.push_back(T);
    r.times.gemv_us.push_back(time_us(T, MoeExperts::gather_gemv));
    r.times.grouped_us.push_back(time_us(T, grouped));
  }
  KILN_CUDA_CHECK(cudaStreamSynchronize(st));
  r.grouped_from = moe_grouped_from(r.times, r.below);
  r.tuned = true;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace kiln::ops::cuda
