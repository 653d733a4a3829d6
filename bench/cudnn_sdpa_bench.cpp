// cuDNN's fused SDPA (bench/cudnn_sdpa.h, the C backend API) beside kiln's attention kernels
// (bench/attention_bench.cpp), at the Qwen3-4B heads (32 Q / 8 KV, D 128, bf16), as the reference the issue's
// anchor table quotes. Decode: one query row per sequence, non-causal over its whole context, B = 1 at
// context 1024 and 8192, B = 8 and 32 at 1024, B = 64 and 128 at 9216, timed as CUDA-graph replays plus
// "amortized" (16 in one graph / 16) when cudnnBackendExecute captures, else eagerly (the path says which).
// Prefill: one causal 4096- and one 8192-token prompt (q_len = ctx), timed eagerly. Each shape twice: K/V
// contiguous [B, Hkv, S, D] ("cudnn sdpa") and paged, page 32, HND pages through cuDNN's paged cache load
// ("cudnn sdpa paged", with the per-sequence lengths and padding mask that form needs). Q and O are
// token-major [T, Hq, D] as kiln stores them.
//
// Before timing, every row runs set 0 once and compares sampled output rows with an fp64 reference on the
// host (relative Frobenius error <= 2^-7, docs/NUMERICS.md's bound for any attention implementation); a row
// that fails, or whose graph cuDNN cannot build or run, prints its reason and no time. Inputs: bf16 uniform
// in [-1, 1], a pattern of kPeriod values repeated through each buffer (the host reads any element back from
// the pattern; the odd period keeps rows from lining up). >= 4 sets (q, out, page-table permutation) over
// one K/V allocation, rotated; every sample starts from a flushed L2. Bytes and FLOPs as attention_bench.cpp.
// A row keeps the first form cuDNN plans (its path names it): the graph ("graph"), the graph with a real
// stats output ("graph + stats"), or for decode the single SDPA_FWD operation ("sdpa op").
// KILN_ATTN_BENCH_ONLY=TEXT: only the shapes whose name contains TEXT (shared with attention_bench.cpp).
// KILN_CUDNN_SDPA_OP=1: also decode rows of the SDPA_FWD operation ("cudnn sdpa op", "cudnn sdpa op paged").
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <numeric>
#include <random>
#include <set>
#include <span>
#include <string>
#include <tuple>

#include "bench/cudnn_sdpa.h"
#include "bench/kernel_bench.h"
#include "kiln/cuda_check.h"
#include "kiln/dtype.h"
#include "kiln/tensor.h"

namespace kiln::bench {
namespace {

constexpr int kHq = 32, kHkv = 8, kD = 128, kPage = 32, kSets = 4;
constexpr size_t kPeriod = 1048573;  // elements of each input pattern (odd, so it never aligns with D)
constexpr double kTolerance = 1.0 / 128;

struct Shape {
  int B = 1, ctx = 0;
  bool prefill = false, paged = false;
  int s_q() const { return prefill ? ctx : 1; }
  int pages_per_seq() const { return ctx / kPage; }  // every context here is a multiple of the page
};

std::string shape_name(const Shape& s) {
  std::string n = "B=" + std::to_string(s.B) + " ctx=" + std::to_string(s.ctx);
  if (s.prefill) n += " q_len=" + std::to_string(s.ctx) + " causal";
  return n + " 32/8 D128 bf16 " + (s.paged ? "page32 HND" : "K/V BHSD");
}

bool shape_selected(const std::string& name) {
  const char* v = std::getenv("KILN_ATTN_BENCH_ONLY");
  return !v || !*v || name.find(v) != std::string::npos;
}

struct Pattern {
  std::vector<uint16_t> bits;
  double at(size_t i) const { return bf16_to_f32(bf16_t{bits[i % kPeriod]}); }
};

Pattern make_pattern(std::mt19937& rng) {
  Pattern p;
  p.bits.resize(kPeriod);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (auto& x : p.bits) x = f32_to_bf16(u(rng)).bits;
  return p;
}

// dst[i] = pattern[i % kPeriod] for i < elems: one upload, then copies that double the filled prefix (each
// starts at a multiple of the period).
Buffer tiled(const Pattern& p, size_t elems) {
  Buffer b(elems * 2, Device::cuda());
  auto* dst = static_cast<char*>(b.data());
  const size_t first = std::min(elems, kPeriod);
  KILN_CUDA_CHECK(cudaMemcpy(dst, p.bits.data(), first * 2, cudaMemcpyHostToDevice));
  for (size_t done = first; done < elems;) {
    const size_t n = std::min(done, elems - done);
    KILN_CUDA_CHECK(cudaMemcpy(dst + done * 2, dst, n * 2, cudaMemcpyDeviceToDevice));
    done += n;
  }
  return b;
}

Buffer upload_i32(const std::vector<int32_t>& v) {
  Buffer b(v.size() * 4, Device::cuda());
  copy_bytes(b.data(), Device::cuda(), v.data(), Device::cpu(), v.size() * 4);
  return b;
}

cudnn::SdpaSpec make_spec(const Shape& s) {
  const int64_t sq = s.s_q(), S = s.ctx, D = kD;
  cudnn::SdpaSpec spec{.B = s.B, .Hq = kHq, .Hkv = kHkv, .D = kD, .s_q = sq, .s_kv = S, .causal = s.prefill};
  spec.scale = 1.0f / std::sqrt(float(kD));
  spec.q_stride = spec.o_stride = {sq * kHq * D, D, kHq * D, 1};  // token-major [B, s_q, Hq, D]
  spec.kv_stride = {kHkv * S * D, S * D, D, 1};                   // [B, Hkv, S, D]
  if (s.paged) {
    spec.page_size = kPage;
    spec.num_pages = int64_t(s.B) * s.pages_per_seq();
  }
  return spec;
}

// Inputs and outputs of one shape: one K/V allocation, kSets (q, out, page table) sets.
struct Data {
  Pattern k_pat, v_pat;
  std::vector<Pattern> q_pat;
  std::vector<int32_t> table0;  // set 0's page table, [B, pages_per_seq] (the reference reads K/V through it)
  Buffer k, v, stats, seq_q, seq_kv;
  std::vector<Buffer> q, out, table;
  std::vector<cudnn::SdpaBuffers> sets;
};

Data make_data(const Shape& s, std::mt19937& rng) {
  Data d;
  d.k_pat = make_pattern(rng);
  d.v_pat = make_pattern(rng);
  const size_t kv_elems = size_t(s.B) * s.ctx * kHkv * kD, q_elems = size_t(s.B) * s.s_q() * kHq * kD;
  d.k = tiled(d.k_pat, kv_elems);
  d.v = tiled(d.v_pat, kv_elems);
  d.stats = Buffer(size_t(s.B) * kHq * s.s_q() * 4, Device::cuda());
  if (s.paged) {
    d.seq_q = upload_i32(std::vector<int32_t>(size_t(s.B), s.s_q()));
    d.seq_kv = upload_i32(std::vector<int32_t>(size_t(s.B), s.ctx));
  }
  for (int i = 0; i < kSets; ++i) {
    d.q_pat.push_back(make_pattern(rng));
    d.q.push_back(tiled(d.q_pat.back(), q_elems));
    d.out.emplace_back(q_elems * 2, Device::cuda());
    if (s.paged) {
      std::vector<int32_t> table(size_t(s.B) * s.pages_per_seq());
      std::iota(table.begin(), table.end(), 0);
      std::shuffle(table.begin(), table.end(), rng);
      if (i == 0) d.table0 = table;
      d.table.push_back(upload_i32(table));
    }
    void* tab = s.paged ? d.table.back().data() : nullptr;
    d.sets.push_back({.q = d.q.back().data(),
                      .k = d.k.data(),
                      .v = d.v.data(),
                      .o = d.out.back().data(),
                      .stats = d.stats.data(),
                      .seq_q = d.seq_q.data(),
                      .seq_kv = d.seq_kv.data(),
                      .table_k = tab,
                      .table_v = tab});
  }
  return d;
}

struct Check {
  double max_abs = 0, rel = 0;
  bool pass() const { return std::isfinite(rel) && rel <= kTolerance; }
};

// Set 0's output against fp64 on sampled (sequence, head, query row) triples.
Check validate(const Shape& s, const Data& d) {
  const int sq = s.s_q(), G = kHq / kHkv;
  std::set<std::tuple<int, int, int>> samples;
  for (int b : {0, s.B / 2, s.B - 1})
    for (int h : {0, 13, kHq - 1})
      for (int i : {0, 1, sq / 2 + 7, sq - 1})
        if (i < sq) samples.insert({b, h, i});
  // Element index of key t, head hk, dim 0 of sequence b in the K/V buffers.
  auto kv_index = [&](int b, int hk, int t) -> size_t {
    if (!s.paged) return ((size_t(b) * kHkv + hk) * s.ctx + t) * kD;
    const size_t page = size_t(d.table0[size_t(b) * s.pages_per_seq() + size_t(t / kPage)]);
    return ((page * kHkv + hk) * kPage + size_t(t % kPage)) * kD;
  };
  const double scale = 1.0 / std::sqrt(double(kD));
  double err2 = 0, ref2 = 0, max_abs = 0;
  std::vector<uint16_t> got(kD);
  std::vector<double> p(size_t(s.ctx));
  for (auto [b, h, i] : samples) {
    const size_t row = ((size_t(b) * sq + i) * kHq + h) * kD;
    copy_bytes(got.data(), Device::cpu(), static_cast<const char*>(d.out[0].data()) + row * 2, Device::cuda(),
               kD * 2);
    const int keys = s.prefill ? i + 1 : s.ctx;
    double m = -INFINITY, l = 0;
    for (int t = 0; t < keys; ++t) {
      const size_t k0 = kv_index(b, h / G, t);
      double dot = 0;
      for (int c = 0; c < kD; ++c) dot += d.q_pat[0].at(row + c) * d.k_pat.at(k0 + c);
      p[size_t(t)] = dot * scale;
      m = std::max(m, p[size_t(t)]);
    }
    for (int t = 0; t < keys; ++t) l += (p[size_t(t)] = std::exp(p[size_t(t)] - m));
    for (int c = 0; c < kD; ++c) {
      double o = 0;
      for (int t = 0; t < keys; ++t) o += p[size_t(t)] * d.v_pat.at(kv_index(b, h / G, t) + c);
      o /= l;
      const double diff = bf16_to_f32(bf16_t{got[size_t(c)]}) - o;
      err2 += diff * diff;
      ref2 += o * o;
      max_abs = std::max(max_abs, std::isnan(diff) ? INFINITY : std::abs(diff));
    }
  }
  return {max_abs, std::sqrt(err2 / ref2)};
}

// K and V rows read (each sequence's whole context once per KV head), q read, out written.
double bytes_moved(const Shape& s) {
  return double(s.B) * s.ctx * kHkv * kD * 2 * 2 + double(s.B) * s.s_q() * kHq * kD * 2 * 2;
}

// Captures n executions into one graph; nullptr (and `why`) when the capture or an execution fails.
cudaGraphExec_t try_capture(const Env& env, cudnnHandle_t h, const cudnn::SdpaPlan& plan,
                            const std::vector<cudnn::Desc>& packs, int first, int n, std::string& why) {
  if (cudaStreamBeginCapture(env.stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
    why = cudaGetErrorString(cudaGetLastError());
    return nullptr;
  }
  cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
  for (int i = first; i < first + n && st == CUDNN_STATUS_SUCCESS; ++i)
    st = plan.execute(h, packs[size_t(i) % packs.size()]);
  cudaGraph_t g = nullptr;
  const cudaError_t end = cudaStreamEndCapture(env.stream, &g);
  cudaGraphExec_t ge = nullptr;
  if (st != CUDNN_STATUS_SUCCESS)
    why = "cudnnBackendExecute under capture: " + cudnn::status_text(st);
  else if (end != cudaSuccess)
    why = std::string("cudaStreamEndCapture: ") + cudaGetErrorString(end);
  else if (cudaGraphInstantiate(&ge, g, 0) != cudaSuccess)
    why = "cudaGraphInstantiate failed";
  if (g) cudaGraphDestroy(g);
  cudaGetLastError();  // a failed capture leaves its error behind; the eager timing must not see it
  return why.empty() ? ge : nullptr;
}

std::string fmt(const char* f, double a, double b = 0) {
  char s[96];
  std::snprintf(s, sizeof(s), f, a, b);
  return s;
}

// The forms a row tries, in order, keeping the first cuDNN builds a plan for: the graph as cudnn-frontend
// lowers inference SDPA, the same with a real stats output (the training graph), and for decode the single
// SDPA_FWD operation. Rows of `op` try that operation alone.
struct Form {
  const char* name;
  bool stats_output, single_op;
};
constexpr Form kGraphForms[] = {
    {"graph", false, false}, {"graph + stats", true, false}, {"sdpa op", false, true}};
constexpr Form kOpForms[] = {{"sdpa op", false, true}, {"sdpa op + stats", true, true}};

// One row: build the plan, validate, time.
Row run_shape(const Env& env, cudnnHandle_t h, const Shape& s, bool op, std::mt19937& rng) {
  Row r{"attention_cudnn", std::string("cudnn sdpa") + (op ? " op" : "") + (s.paged ? " paged" : ""),
        shape_name(s)};
  r.bytes = bytes_moved(s);
  cudnn::SdpaSpec spec = make_spec(s);
  cudnn::SdpaPlan plan;
  std::string form, first_error;
  for (const Form& f : op ? std::span<const Form>(kOpForms) : std::span<const Form>(kGraphForms)) {
    if (f.single_op && s.prefill) continue;  // no causal mask in the operation before cuDNN 9.21
    spec.stats_output = f.stats_output;
    spec.single_op = f.single_op;
    plan = cudnn::SdpaPlan::build(h, spec);
    if (plan.ok()) {
      form = f.name;
      break;
    }
    std::fprintf(stderr, "attention_cudnn: %s: %s: %s\n", r.shape.c_str(), f.name, plan.error().c_str());
    if (first_error.empty()) first_error = std::string(f.name) + ": " + plan.error();
  }
  if (!plan.ok()) {
    r.path = "NOT RUN: cuDNN builds no plan: " + first_error.substr(0, 200);
    return r;
  }
  std::fprintf(stderr, "attention_cudnn: %s: %s, %s, workspace %lld B; plan %s\n", r.shape.c_str(),
               form.c_str(), plan.engine().c_str(), static_cast<long long>(plan.workspace_bytes()),
               plan.json().empty() ? "(no json)" : plan.json().c_str());
  Data d = make_data(s, rng);
  Buffer ws;
  if (plan.workspace_bytes() > 0) ws = Buffer(size_t(plan.workspace_bytes()), Device::cuda());
  std::vector<cudnn::Desc> packs;
  for (const auto& set : d.sets) {
    std::string err;
    packs.push_back(plan.pack(set, ws.data(), err));
    if (!err.empty()) {
      r.path = "NOT RUN: " + err;
      return r;
    }
  }
  KILN_CUDA_CHECK(cudaDeviceSynchronize());  // device-to-device fills return before they finish
  if (cudnnStatus_t st = plan.execute(h, packs[0]); st != CUDNN_STATUS_SUCCESS) {
    r.path = "NOT RUN: cudnnBackendExecute: " + cudnn::status_text(st);
    return r;
  }
  KILN_CUDA_CHECK(cudaStreamSynchronize(env.stream));
  const Check c = validate(s, d);
  const std::string check = fmt("vs fp64: max abs diff %.2e, rel %.2e", c.max_abs, c.rel);
  if (!c.pass()) {
    r.path = "FAILED validation (rel > 2^-7), " + check;
    return r;
  }

  cudnnStatus_t failed = CUDNN_STATUS_SUCCESS;
  auto launch = [&](int i) {
    const cudnnStatus_t st = plan.execute(h, packs[size_t(i) % packs.size()]);
    if (st != CUDNN_STATUS_SUCCESS) failed = st;
  };
  std::string timing = "eager";
  if (!s.prefill) {
    std::string why;
    std::vector<cudaGraphExec_t> g1, g16;
    for (int i = 0; i < kSets && why.empty(); ++i)
      if (cudaGraphExec_t g = try_capture(env, h, plan, packs, i, 1, why)) g1.push_back(g);
    for (int j = 0; j < 4 && why.empty(); ++j)
      if (cudaGraphExec_t g = try_capture(env, h, plan, packs, 16 * j, 16, why)) g16.push_back(g);
    if (why.empty()) {
      r.us = time_graph_cold_us(env, g1);
      r.us_amortized = time_graph_cold_us(env, g16, 16);
      timing = "graph";
    } else {
      timing = "eager (no graph: " + why.substr(0, 80) + ")";
    }
    for (auto g : g1) KILN_CUDA_CHECK(cudaGraphExecDestroy(g));
    for (auto g : g16) KILN_CUDA_CHECK(cudaGraphExecDestroy(g));
  }
  if (r.us == 0) r.us = time_cold_us(env, launch);
  KILN_CUDA_CHECK(cudaStreamSynchronize(env.stream));
  if (failed != CUDNN_STATUS_SUCCESS) {
    r.us = 0;
    r.us_amortized = -1;
    r.path = "NOT RUN: cudnnBackendExecute while timing: " + cudnn::status_text(failed);
    return r;
  }
  r.path = form + ", " + plan.engine() + ", ws " + std::to_string(plan.workspace_bytes()) + " B, " + timing +
           ", " + check;
  if (s.prefill) {
    const double flop = 4.0 * kHq * kD * (double(s.ctx) * (s.ctx + 1) / 2);  // causal (query, key) pairs
    r.path += fmt(", %.3g FLOP, %.1f TFLOP/s", flop, flop / (r.us * 1e-6) / 1e12);
  }
  return r;
}

void run_cudnn_sdpa(const Env& env, std::vector<Row>& rows) {
  cudnnHandle_t h = nullptr;
  if (cudnnStatus_t st = cudnnCreate(&h); st != CUDNN_STATUS_SUCCESS) {
    rows.push_back(
        {"attention_cudnn", "cudnn sdpa", "-", 0, -1, 0, "NOT RUN: cudnnCreate: " + cudnn::status_text(st)});
    return;
  }
  if (cudnnStatus_t st = cudnnSetStream(h, env.stream); st != CUDNN_STATUS_SUCCESS) {
    rows.push_back({"attention_cudnn", "cudnn sdpa", "-", 0, -1, 0,
                    "NOT RUN: cudnnSetStream: " + cudnn::status_text(st)});
    cudnnDestroy(h);
    return;
  }
  std::fprintf(stderr, "attention_cudnn: cuDNN %zu (headers %d.%d.%d)\n", cudnnGetVersion(), CUDNN_MAJOR,
               CUDNN_MINOR, CUDNN_PATCHLEVEL);
  std::mt19937 rng(9);
  const Shape decode[] = {{1, 1024}, {1, 8192}, {8, 1024}, {32, 1024}, {64, 9216}, {128, 9216}};
  std::vector<Shape> shapes;
  for (bool paged : {false, true}) {
    for (Shape s : decode) {
      s.paged = paged;
      shapes.push_back(s);
    }
    for (int len : {4096, 8192}) shapes.push_back({.B = 1, .ctx = len, .prefill = true, .paged = paged});
  }
  // KILN_CUDNN_SDPA_OP=1: decode rows of the single SDPA_FWD operation too (their own plans; it may pick
  // other engines than the graph).
  const char* op_env = std::getenv("KILN_CUDNN_SDPA_OP");
  const bool op_rows = op_env && std::string(op_env) == "1";
  for (const Shape& s : shapes) {
    if (!shape_selected(shape_name(s))) continue;
    for (bool op : {false, true}) {
      if (op && (!op_rows || s.prefill)) continue;
      try {
        rows.push_back(run_shape(env, h, s, op, rng));
      } catch (const std::exception& e) {  // e.g. out of memory: this row only
        rows.push_back({"attention_cudnn",
                        std::string("cudnn sdpa") + (op ? " op" : "") + (s.paged ? " paged" : ""),
                        shape_name(s), 0, -1, bytes_moved(s), std::string("NOT RUN: ") + e.what()});
      }
      std::replace(rows.back().path.begin(), rows.back().path.end(), '|', '/');  // cuDNN's "a || b": one cell
    }
  }
  cudnnDestroy(h);
}

}  // namespace

KILN_KERNEL_BENCH("attention_cudnn",
                  "cuDNN fused SDPA (backend API), contiguous and paged K/V, the attention bench's shapes",
                  run_cudnn_sdpa);

}  // namespace kiln::bench
