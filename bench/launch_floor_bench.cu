// launch_floor benchmark: what a small graph-replayed kernel costs in this harness before it does any work,
// the floor under the batch-1 decode attention rows (issue 18: B = 1 at <= 6 / 12 us). Timed exactly as the
// attention decode rows are (time_graph_cold_us: the L2 flushed before every sample, one graph launch between
// two events; "amortized": 16 launches in one graph / 16):
//   empty x1      one launch of an empty kernel (1 block)
//   empty x2 pdl  two empty kernels, 128 blocks then 32, the second launched with PDL (decode + combine)
//   chain 2       128 blocks, each reads a table entry then the 16 bytes it points to, from DRAM (the page
//                 table, then the K/V tile), and writes 16 bytes: two dependent DRAM round trips
//   chain 2 + pdl the same, then a PDL-launched second kernel of 32 blocks reading 4 of those writes each
//                 and writing one result (the split combine): the shape of a B = 1 decode at its floor
// Bytes are those read and written; the floor that matters is the time, not a bandwidth.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <numeric>
#include <random>
#include <vector>

#include "bench/kernel_bench.h"
#include "kiln/tensor.h"
#include "ops/cuda/common.cuh"

namespace kiln::bench {
namespace {

// Mapping: nothing (a launch's own cost).
__global__ void empty_kernel() {}

// Mapping: block b, thread 0: table[b] -> data[table[b]] -> out[b] (two dependent loads, one store).
__global__ void chain_kernel(const int32_t* __restrict__ table, const uint4* __restrict__ data, uint4* out) {
  if (threadIdx.x != 0) return;
  const int32_t i = __ldcg(table + blockIdx.x);
  out[blockIdx.x] = __ldcg(data + int64_t(i) * 256);
}

// Mapping: block b, thread 0: waits for the chain kernel (PDL), reads out[4b .. 4b + 3], writes res[b].
__global__ void combine_kernel(const uint4* in, uint4* res) {
  cuda::pdl_wait();
  if (threadIdx.x != 0) return;
  uint4 a = __ldcg(in + 4 * blockIdx.x);
  for (int j = 1; j < 4; ++j) {
    const uint4 v = __ldcg(in + 4 * blockIdx.x + j);
    a.x ^= v.x, a.y ^= v.y, a.z ^= v.z, a.w ^= v.w;
  }
  res[blockIdx.x] = a;
}

void run_launch_floor(const Env& env, std::vector<Row>& rows) {
  constexpr int kBlocks = 128, kCombine = 32;
  const Device dev = Device::cuda();
  // The chain's data: 64 MB, its 16-byte targets 4 KB apart in a shuffled order (no two in one DRAM page).
  constexpr int64_t kTargets = 16384;
  Buffer data(size_t(kTargets) * 4096, dev), out(kBlocks * 16, dev), res(kCombine * 16, dev);
  KILN_CUDA_CHECK(cudaMemset(data.data(), 1, data.bytes()));
  std::vector<Buffer> tables;
  std::mt19937 rng(7);
  std::vector<int32_t> idx(kTargets);
  std::iota(idx.begin(), idx.end(), 0);
  for (int t = 0; t < 4; ++t) {  // four input sets, rotated
    std::shuffle(idx.begin(), idx.end(), rng);
    tables.emplace_back(kBlocks * 4, dev);
    copy_bytes(tables.back().data(), dev, idx.data(), Device::cpu(), kBlocks * 4);
  }
  const auto* d = static_cast<const uint4*>(data.data());
  auto* o = static_cast<uint4*>(out.data());
  auto* r = static_cast<uint4*>(res.data());
  const auto chain = [&](int i) {
    cuda::launch({.grid = dim3(kBlocks), .block = dim3(32), .stream = env.stream}, chain_kernel,
                 static_cast<const int32_t*>(tables[size_t(i) % tables.size()].data()), d, o);
  };
  const auto combine = [&] {
    cuda::launch({.grid = dim3(kCombine), .block = dim3(32), .stream = env.stream, .pdl = true},
                 combine_kernel, static_cast<const uint4*>(o), r);
  };
  struct Case {
    const char* name;
    double bytes;
    std::function<void(int)> launch;
  };
  const Case cases[] = {
      {"empty x1", 0,
       [&](int) { cuda::launch({.grid = dim3(1), .block = dim3(32), .stream = env.stream}, empty_kernel); }},
      {"empty x2 pdl", 0,
       [&](int) {
         cuda::launch({.grid = dim3(kBlocks), .block = dim3(32), .stream = env.stream}, empty_kernel);
         cuda::launch({.grid = dim3(kCombine), .block = dim3(32), .stream = env.stream, .pdl = true},
                      empty_kernel);
       }},
      {"chain 2", kBlocks * (4.0 + 16 + 16), chain},
      {"chain 2 + pdl combine", kBlocks * (4.0 + 16 + 16) * 2 + kCombine * 16,
       [&](int i) {
         chain(i);
         combine();
       }},
  };
  for (const Case& c : cases) {
    Row row{"launch_floor", c.name, "graph replay, cold L2", 0, -1, c.bytes, "bench kernels"};
    time_graph_row(env, c.launch, int(tables.size()), row);
    rows.push_back(row);
  }
  KILN_CUDA_CHECK(cudaStreamSynchronize(env.stream));
}

}  // namespace

KILN_KERNEL_BENCH("launch_floor",
                  "the cost of a graph-replayed launch and of two dependent DRAM round trips (B = 1 floors)",
                  run_launch_floor);

}  // namespace kiln::bench
