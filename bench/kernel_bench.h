// Kernel benchmarks: a registry of named benchmarks (one file each, KILN_KERNEL_BENCH) and the timing
// helpers they share. Method (docs/PERF.md): cold L2 before every timed sample (a read of 4x the L2
// through a separate buffer) and >= 4 rotating input sets; CUDA events; the median of >= 100 samples;
// small launches timed as CUDA-graph replays, plus "amortized": 16 launches in one graph / 16.
// Every row is printed with its bytes moved and the fraction of the device-to-device copy bandwidth
// measured in the same run.
//
// Adding a benchmark is one file in bench/ (globbed; an OBJECT library, so its registration is linked in):
//   static void run_gemm(const kiln::bench::Env& env, std::vector<kiln::bench::Row>& rows) {
//     ... allocate >= 4 input sets; Row r{"gemm", "cublaslt", "M=16 N=4096 K=4096"}; r.bytes = ...;
//     r.us = kiln::bench::time_cold_us(env, [&](int i) { launch(sets[i % sets.size()], env.stream); });
//     rows.push_back(r);
//   }
//   KILN_KERNEL_BENCH("gemm", "cuBLASLt GEMMs of the Qwen3-4B shapes", run_gemm);
// and `kiln bench kernels --filter gemm` runs it (bench/attn_prep_bench.cpp is a complete example).
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <string>
#include <vector>

namespace kiln::bench {

struct Row {
  std::string bench;         // "attn_prep"
  std::string variant;       // "fused", "unfused"
  std::string shape;         // "T=4096 32/8 D128 HND bf16-cache q-contig"
  double us = 0;             // median time of one launch (graph replay when graphed); 0: not run (path: why)
  double us_amortized = -1;  // 16 launches in one graph / 16; < 0 when not measured
  double bytes = 0;          // bytes read + written by one launch (the physics floor's numerator)
  std::string path;          // implementation actually taken (e.g. "cuda_fused_decode")
};

struct Env {
  cudaStream_t stream = nullptr;
  int reps = 100;  // samples per median (>= 100)
  size_t l2_bytes = 0;
  double copy_gbps = 0;  // device-to-device copy, bytes read + written, measured in this run
  double read_gbps = 0;  // a read-only stream of 2 GB (the floor of read-dominated kernels), this run
  std::string device_name;
};

using BenchFn = std::function<void(const Env&, std::vector<Row>&)>;
struct Bench {
  std::string name, summary;
  BenchFn fn;
};
bool register_bench(Bench b);
const std::vector<Bench>& benches();

#define KILN_BENCH_CONCAT2_(a, b) a##b
#define KILN_BENCH_CONCAT_(a, b) KILN_BENCH_CONCAT2_(a, b)
#define KILN_KERNEL_BENCH(name, summary, fn)                               \
  static const bool KILN_BENCH_CONCAT_(kiln_bench_registered_, __LINE__) = \
      ::kiln::bench::register_bench({name, summary, fn})

// Evicts the L2 (reads a private buffer of 4x its size) on env.stream.
void flush_l2(const Env& env);
// Median of `reps` samples of launch(i) (i = sample index; rotate input sets with it), each after an L2
// flush, timed with CUDA events on env.stream.
double time_cold_us(const Env& env, const std::function<void(int)>& launch);
// Same, replaying graphs[i % graphs.size()] (each captured by the caller on env.stream).
double time_graph_cold_us(const Env& env, const std::vector<cudaGraphExec_t>& graphs,
                          double per_graph_launches = 1);
// Captures launch(i) for i in [first, first + n) on env.stream into one executable graph.
cudaGraphExec_t capture(const Env& env, const std::function<void(int)>& launch, int first, int n);
// A small launch's row: r.us = graph replays of launch(i), one launch a graph, i < sets (the input sets
// the launch rotates); r.us_amortized = 16 launches in one graph / 16. The graphs are destroyed after.
void time_graph_row(const Env& env, const std::function<void(int)>& launch, int sets, Row& r);
// Device-to-device copy bandwidth (bytes read + written per second / 1e9), median of 20 copies of 512 MB.
double measure_copy_gbps(const Env& env);
// Read-only bandwidth (bytes read per second / 1e9), median of 20 reads of 2 GB.
double measure_read_gbps(const Env& env);

// Runs every benchmark whose name contains `filter` (empty: all) and returns the rows.
Env make_env(int reps);
std::vector<Row> run_benches(const Env& env, const std::string& filter);
void print_rows(const Env& env, const std::vector<Row>& rows);

}  // namespace kiln::bench
