// Kernel-benchmark registry and timing helpers (see kernel_bench.h for the method).
#include <algorithm>
#include <cstdio>

#include "bench/kernel_bench.h"
#include "ops/cuda/common.cuh"

namespace kiln::bench {

namespace {

std::vector<Bench>& registry() {
  static std::vector<Bench> r;
  return r;
}

// Reads n uint4 and writes one value only when the sum is a sentinel (never in practice), so the reads
// cannot be optimised away and the L2 is left holding clean lines of this buffer.
__global__ void flush_kernel(const uint4* __restrict__ p, size_t n, unsigned* sink) {
  unsigned acc = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint4 v = p[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;
}

struct FlushBuffer {
  void* p = nullptr;
  size_t bytes = 0;
  unsigned* sink = nullptr;
};

FlushBuffer& flush_buffer(size_t bytes) {
  static FlushBuffer fb;
  if (fb.bytes < bytes) {
    if (fb.p) cudaFree(fb.p);
    KILN_CUDA_CHECK(cudaMalloc(&fb.p, bytes));
    KILN_CUDA_CHECK(cudaMemset(fb.p, 1, bytes));
    if (!fb.sink) KILN_CUDA_CHECK(cudaMalloc(&fb.sink, sizeof(unsigned)));
    fb.bytes = bytes;
  }
  return fb;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

bool register_bench(Bench b) {
  registry().push_back(std::move(b));
  return true;
}
const std::vector<Bench>& benches() {
  return registry();
}

void flush_l2(const Env& env) {
  FlushBuffer& fb = flush_buffer(std::max<size_t>(env.l2_bytes * 4, size_t(64) << 20));
  flush_kernel<<<1056, 512, 0, env.stream>>>(static_cast<const uint4*>(fb.p), fb.bytes / 16, fb.sink);
  KILN_CUDA_CHECK(cudaGetLastError());
}

namespace {
template <typename F>
double time_samples(const Env& env, F&& body) {
  cudaEvent_t e0, e1;
  KILN_CUDA_CHECK(cudaEventCreate(&e0));
  KILN_CUDA_CHECK(cudaEventCreate(&e1));
  for (int w = 0; w < 3; ++w) body(w);  // warm-up (first-launch costs, lazy module loading)
  KILN_CUDA_CHECK(cudaStreamSynchronize(env.stream));
  std::vector<double> us;
  for (int i = 0; i < env.reps; ++i) {
    flush_l2(env);
    KILN_CUDA_CHECK(cudaEventRecord(e0, env.stream));
    body(i);
    KILN_CUDA_CHECK(cudaEventRecord(e1, env.stream));
    KILN_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    us.push_back(ms * 1e3);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return median(us);
}
}  // namespace

double time_cold_us(const Env& env, const std::function<void(int)>& launch) {
  return time_samples(env, launch);
}

double time_graph_cold_us(const Env& env, const std::vector<cudaGraphExec_t>& graphs,
                          double per_graph_launches) {
  return time_samples(env,
                      [&](int i) {
                        KILN_CUDA_CHECK(cudaGraphLaunch(graphs[size_t(i) % graphs.size()], env.stream));
                      }) /
         per_graph_launches;
}

cudaGraphExec_t capture(const Env& env, const std::function<void(int)>& launch, int first, int n) {
  cudaGraph_t g;
  KILN_CUDA_CHECK(cudaStreamBeginCapture(env.stream, cudaStreamCaptureModeThreadLocal));
  for (int i = first; i < first + n; ++i) launch(i);
  KILN_CUDA_CHECK(cudaStreamEndCapture(env.stream, &g));
  cudaGraphExec_t ge;
  KILN_CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
  KILN_CUDA_CHECK(cudaGraphDestroy(g));
  return ge;
}

void time_graph_row(const Env& env, const std::function<void(int)>& launch, int sets, Row& r) {
  std::vector<cudaGraphExec_t> g1, g16;
  for (int i = 0; i < sets; ++i) g1.push_back(capture(env, launch, i, 1));
  for (int k = 0; k < 4; ++k) g16.push_back(capture(env, launch, 16 * k, 16));
  r.us = time_graph_cold_us(env, g1);
  r.us_amortized = time_graph_cold_us(env, g16, 16);
  KILN_CUDA_CHECK(cudaStreamSynchronize(env.stream));
  for (auto g : g1) KILN_CUDA_CHECK(cudaGraphExecDestroy(g));
  for (auto g : g16) KILN_CUDA_CHECK(cudaGraphExecDestroy(g));
}

double measure_copy_gbps(const Env& env) {
  const size_t bytes = size_t(512) << 20;
  void *a = nullptr, *b = nullptr;
  KILN_CUDA_CHECK(cudaMalloc(&a, bytes));
  KILN_CUDA_CHECK(cudaMalloc(&b, bytes));
  KILN_CUDA_CHECK(cudaMemset(a, 1, bytes));
  Env e = env;
  e.reps = 20;
  const double us = time_samples(
      e, [&](int) { KILN_CUDA_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, env.stream)); });
  cudaFree(a);
  cudaFree(b);
  return 2.0 * double(bytes) / (us * 1e-6) / 1e9;
}

namespace {
// Reads n uint4 four at a time per thread (independent loads in flight); the sum is written only when it
// equals a sentinel, so the reads stay.
__global__ void read_kernel(const uint4* __restrict__ p, size_t n, unsigned* sink) {
  unsigned acc = 0;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    const uint4 a = p[i], b = p[i + stride], c = p[i + 2 * stride], d = p[i + 3 * stride];
    acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
  }
  for (; i < n; i += stride) acc ^= p[i].x ^ p[i].y ^ p[i].z ^ p[i].w;
  if (acc == 0x9e3779b9u) *sink = acc;
}
}  // namespace

double measure_read_gbps(const Env& env) {
  const size_t bytes = size_t(2) << 30;
  void* a = nullptr;
  unsigned* sink = nullptr;
  KILN_CUDA_CHECK(cudaMalloc(&a, bytes));
  KILN_CUDA_CHECK(cudaMalloc(&sink, sizeof(unsigned)));
  KILN_CUDA_CHECK(cudaMemset(a, 1, bytes));
  int sms = 132;
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  Env e = env;
  e.reps = 20;
  const double us = time_samples(e, [&](int) {
    read_kernel<<<sms * 4, 512, 0, env.stream>>>(static_cast<const uint4*>(a), bytes / 16, sink);
    KILN_CUDA_CHECK(cudaGetLastError());
  });
  cudaFree(a);
  cudaFree(sink);
  return double(bytes) / (us * 1e-6) / 1e9;
}

Env make_env(int reps) {
  Env env;
  env.reps = std::max(reps, 100);
  int dev = 0, l2 = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&dev));
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  env.l2_bytes = size_t(l2);
  cudaDeviceProp prop;
  KILN_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  env.device_name = prop.name;
  KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&env.stream, cudaStreamNonBlocking));
  env.copy_gbps = measure_copy_gbps(env);
  env.read_gbps = measure_read_gbps(env);
  return env;
}

std::vector<Row> run_benches(const Env& env, const std::string& filter) {
  std::vector<Row> rows;
  for (const Bench& b : benches()) {
    // "=NAME": that benchmark alone; otherwise every benchmark whose name contains the filter.
    const bool match = filter.empty() || (filter[0] == '=' ? b.name == filter.substr(1)
                                                           : b.name.find(filter) != std::string::npos);
    if (!match) continue;
    b.fn(env, rows);
  }
  return rows;
}

void print_rows(const Env& env, const std::vector<Row>& rows) {
  std::printf(
      "device: %s, L2 %.0f MB, copy bandwidth (read + write, this run) %.0f GB/s, read-only stream %.0f "
      "GB/s, "
      "%d samples per median\n",
      env.device_name.c_str(), env.l2_bytes / 1e6, env.copy_gbps, env.read_gbps, env.reps);
  std::printf(
      "| bench | variant | shape | path | us | amortized us | MB moved | floor us | GB/s | of copy BW | read "
      "floor us | of read BW |\n");
  std::printf("| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  for (const Row& r : rows) {
    if (r.us <= 0) {  // not measured: the path says why, and no number stands in for a time
      std::printf("| %s | %s | %s | %s | - | - | %.3f | %.2f | - | - | %.2f | - |\n", r.bench.c_str(),
                  r.variant.c_str(), r.shape.c_str(), r.path.c_str(), r.bytes / 1e6,
                  r.bytes / (env.copy_gbps * 1e9) * 1e6, r.bytes / (env.read_gbps * 1e9) * 1e6);
      continue;
    }
    const double best = r.us_amortized > 0 ? std::min(r.us, r.us_amortized) : r.us;
    const double gbps = r.bytes / (best * 1e-6) / 1e9;
    const double floor_us = r.bytes / (env.copy_gbps * 1e9) * 1e6;
    char am[32] = "-";
    if (r.us_amortized > 0) std::snprintf(am, sizeof(am), "%.2f", r.us_amortized);
    const double read_floor_us = r.bytes / (env.read_gbps * 1e9) * 1e6;
    std::printf("| %s | %s | %s | %s | %.2f | %s | %.3f | %.2f | %.0f | %.1f%% | %.2f | %.1f%% |\n",
                r.bench.c_str(), r.variant.c_str(), r.shape.c_str(), r.path.c_str(), r.us, am, r.bytes / 1e6,
                floor_us, gbps, 100.0 * gbps / env.copy_gbps, read_floor_us, 100.0 * gbps / env.read_gbps);
  }
}

}  // namespace kiln::bench
