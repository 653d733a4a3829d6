// cuDNN SDPA through the backend API (see cudnn_sdpa.h for the graph).
#include "bench/cudnn_sdpa.h"

#include <cstdio>
#include <limits>
#include <stdexcept>
#include <utility>

namespace kiln::bench::cudnn {
namespace {

// A failed backend call: the message names the call and cuDNN's own reason.
struct BackendError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void check(cudnnStatus_t st, const std::string& what) {
  if (st != CUDNN_STATUS_SUCCESS) throw BackendError(what + ": " + status_text(st));
}

// The 9.x headers mark these [[deprecated]] (a device-properties descriptor is the new way), but a plan and a
// graph still take the handle through them; named by value so -Werror=deprecated-declarations holds.
constexpr auto kOperationGraphHandle = cudnnBackendAttributeName_t(800);  // CUDNN_ATTR_OPERATIONGRAPH_HANDLE
constexpr auto kExecutionPlanHandle = cudnnBackendAttributeName_t(400);   // CUDNN_ATTR_EXECUTION_PLAN_HANDLE

void set(const Desc& d, cudnnBackendAttributeName_t a, cudnnBackendAttributeType_t t, int64_t n,
         const void* v, const char* what) {
  check(cudnnBackendSetAttribute(d.get(), a, t, n, v), std::string("cudnnBackendSetAttribute(") + what + ")");
}
void set_i64(const Desc& d, cudnnBackendAttributeName_t a, int64_t v, const char* what) {
  set(d, a, CUDNN_TYPE_INT64, 1, &v, what);
}
void set_dtype(const Desc& d, cudnnBackendAttributeName_t a, cudnnDataType_t v, const char* what) {
  set(d, a, CUDNN_TYPE_DATA_TYPE, 1, &v, what);
}
void set_desc(const Desc& d, cudnnBackendAttributeName_t a, const Desc& v, const char* what) {
  cudnnBackendDescriptor_t p = v.get();
  set(d, a, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &p, what);
}
void finalize(const Desc& d, const char* what) {
  check(cudnnBackendFinalize(d.get()), std::string("cudnnBackendFinalize(") + what + ")");
}

// Tensor UIDs of the variant pack; virtual tensors count up from kFirstVirtual.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kScale, kNegInf, kSeqQ, kSeqKv, kTableK, kTableV };
constexpr int64_t kFirstVirtual = 100;

// Builds the descriptors of one graph; every one stays alive in `keep` until the plan is gone.
class GraphBuilder {
 public:
  explicit GraphBuilder(std::deque<Desc>& keep) : keep_(keep) {}

  const Desc& tensor(int64_t uid, cudnnDataType_t dt, const Dims& dims, const Dims& strides, bool is_virtual,
                     bool by_value = false) {
    Desc t(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    set_dtype(t, CUDNN_ATTR_TENSOR_DATA_TYPE, dt, "TENSOR_DATA_TYPE");
    set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data(), "TENSOR_DIMENSIONS");
    set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data(), "TENSOR_STRIDES");
    set_i64(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, uid, "TENSOR_UNIQUE_ID");
    set_i64(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, 16, "TENSOR_BYTE_ALIGNMENT");
    set(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual, "TENSOR_IS_VIRTUAL");
    if (by_value)
      set(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value, "TENSOR_IS_BY_VALUE");
    finalize(t, ("tensor uid " + std::to_string(uid)).c_str());
    return keep(std::move(t));
  }
  const Desc& virt(cudnnDataType_t dt, const Dims& dims, const Dims& strides) {
    return tensor(next_virtual_++, dt, dims, strides, true);
  }

  void matmul(const Desc& a, const Desc& b, const Desc& c, const Desc* m_override, const Desc* n_override,
              const Desc* k_override) {
    Desc mm(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    set_dtype(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_DATA_FLOAT, "MATMUL_COMP_TYPE");
    finalize(mm, "MATMUL_DESCRIPTOR");
    Desc op(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a, "OPERATION_MATMUL_ADESC");
    set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b, "OPERATION_MATMUL_BDESC");
    set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c, "OPERATION_MATMUL_CDESC");
    set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, mm, "OPERATION_MATMUL_DESC");
    if (m_override)
      set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC, *m_override, "GEMM_M_OVERRIDE");
    if (n_override)
      set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC, *n_override, "GEMM_N_OVERRIDE");
    if (k_override)
      set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC, *k_override, "GEMM_K_OVERRIDE");
    finalize(op, "OPERATION_MATMUL_DESCRIPTOR");
    keep(std::move(mm));
    add_op(std::move(op));
  }

  // y = mode(x[, b[, t]]); b is BDESC and t TDESC (BINARY_SELECT: y = t ? x : b).
  void pointwise(cudnnPointwiseMode_t mode, cudnnDataType_t compute, const Desc& x, const Desc* b,
                 const Desc* t, const Desc& y, int64_t axis = -1) {
    Desc pw(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, "POINTWISE_MODE");
    set_dtype(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, compute, "POINTWISE_MATH_PREC");
    if (mode == CUDNN_POINTWISE_GEN_INDEX) set_i64(pw, CUDNN_ATTR_POINTWISE_AXIS, axis, "POINTWISE_AXIS");
    finalize(pw, "POINTWISE_DESCRIPTOR");
    Desc op(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw, "OPERATION_POINTWISE_PW_DESCRIPTOR");
    set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x, "OPERATION_POINTWISE_XDESC");
    if (b) set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, *b, "OPERATION_POINTWISE_BDESC");
    if (t) set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, *t, "OPERATION_POINTWISE_TDESC");
    set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y, "OPERATION_POINTWISE_YDESC");
    const float one = 1.0f;
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one, "OPERATION_POINTWISE_ALPHA1");
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one, "OPERATION_POINTWISE_ALPHA2");
    finalize(op, "OPERATION_POINTWISE_DESCRIPTOR");
    keep(std::move(pw));
    add_op(std::move(op));
  }

  void reduction(cudnnReduceTensorOp_t mode, const Desc& x, const Desc& y) {
    Desc red(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    set(red, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode,
        "REDUCTION_OPERATOR");
    set_dtype(red, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_DATA_FLOAT, "REDUCTION_COMP_TYPE");
    finalize(red, "REDUCTION_DESCRIPTOR");
    Desc op(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x, "OPERATION_REDUCTION_XDESC");
    set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y, "OPERATION_REDUCTION_YDESC");
    set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, red, "OPERATION_REDUCTION_DESC");
    finalize(op, "OPERATION_REDUCTION_DESCRIPTOR");
    keep(std::move(red));
    add_op(std::move(op));
  }

  void paged_load(const Desc& container, const Desc& seq_len, const Desc& table, const Desc& y) {
    Desc op(CUDNN_BACKEND_OPERATION_PAGED_CACHE_LOAD_DESCRIPTOR);
    set_desc(op, CUDNN_ATTR_OPERATION_PAGED_CACHE_LOAD_CONTAINER_DESC, container,
             "PAGED_CACHE_LOAD_CONTAINER");
    set_desc(op, CUDNN_ATTR_OPERATION_PAGED_CACHE_LOAD_PAGE_TABLE_DESC, table, "PAGED_CACHE_LOAD_PAGE_TABLE");
    set_desc(op, CUDNN_ATTR_OPERATION_PAGED_CACHE_LOAD_SEQUENCE_DESC, seq_len, "PAGED_CACHE_LOAD_SEQUENCE");
    set_desc(op, CUDNN_ATTR_OPERATION_PAGED_CACHE_LOAD_YDESC, y, "PAGED_CACHE_LOAD_YDESC");
    finalize(op, "OPERATION_PAGED_CACHE_LOAD_DESCRIPTOR");
    add_op(std::move(op));
  }

  // CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR; the paged inputs only when `table_k` is given.
  void sdpa_op(const Desc& q, const Desc& k, const Desc& v, const Desc& o, const Desc* stats,
               const Desc& scale, const Desc* table_k, const Desc* table_v, const Desc* seq_q,
               const Desc* seq_kv) {
    Desc op(CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR);
    set_desc(op, CUDNN_ATTR_OPERATION_SDPA_FWD_QDESC, q, "SDPA_FWD_QDESC");
    set_desc(op, CUDNN_ATTR_OPERATION_SDPA_FWD_KDESC, k, "SDPA_FWD_KDESC");
    set_desc(op, CUDNN_ATTR_OPERATION_SDPA_FWD_VDESC, v, "SDPA_FWD_VDESC");
    set_desc(op, CUDNN_ATTR_OPERATION_SDPA_FWD_ODESC, o, "SDPA_FWD_ODESC");
    if (stats) set_desc(op, CUDNN_ATTR_OPERATION_SDPA_FWD_STATSDESC, *stats, "SDPA_FWD_STATSDESC");
    set_desc(op, CUDNN_ATTR_OPERATION_SDPA_FWD_SCALEDESC, scale, "SDPA_FWD_SCALEDESC");
    if (table_k) {
#if CUDNN_VERSION >= 91900  // the paged inputs of the single operation (older headers lack the attributes)
      set_desc(op, CUDNN_ATTR_OPERATION_SDPA_FWD_PAGE_TABLE_KDESC, *table_k, "SDPA_FWD_PAGE_TABLE_KDESC");
      set_desc(op, CUDNN_ATTR_OPERATION_SDPA_FWD_PAGE_TABLE_VDESC, *table_v, "SDPA_FWD_PAGE_TABLE_VDESC");
      set_desc(op, CUDNN_ATTR_OPERATION_SDPA_FWD_SEQ_LEN_QDESC, *seq_q, "SDPA_FWD_SEQ_LEN_QDESC");
      set_desc(op, CUDNN_ATTR_OPERATION_SDPA_FWD_SEQ_LEN_KVDESC, *seq_kv, "SDPA_FWD_SEQ_LEN_KVDESC");
#else
      (void)table_v, (void)seq_q, (void)seq_kv;
      throw BackendError("the paged SDPA_FWD operation needs cuDNN headers >= 9.19, built with " +
                         std::to_string(CUDNN_VERSION));
#endif
    }
    finalize(op, "OPERATION_SDPA_FWD_DESCRIPTOR");
    add_op(std::move(op));
  }

  Desc graph(cudnnHandle_t handle) {
    Desc g(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    set(g, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, int64_t(ops_.size()), ops_.data(),
        "OPERATIONGRAPH_OPS");
    set(g, kOperationGraphHandle, CUDNN_TYPE_HANDLE, 1, &handle, "OPERATIONGRAPH_HANDLE");
    finalize(g, "OPERATIONGRAPH_DESCRIPTOR");
    return g;
  }

 private:
  const Desc& keep(Desc d) {
    keep_.push_back(std::move(d));
    return keep_.back();
  }
  void add_op(Desc op) {
    ops_.push_back(keep(std::move(op)).get());
  }

  std::deque<Desc>& keep_;  // references into it stay valid as it grows
  std::vector<cudnnBackendDescriptor_t> ops_;
  int64_t next_virtual_ = kFirstVirtual;
};

Dims row_major(const Dims& d) {
  return {d[1] * d[2] * d[3], d[2] * d[3], d[3], 1};
}

// Adds the single SDPA_FWD operation of `s` to `g`: K and V as they are ([B, Hkv, S, D], or the page
// containers with their tables and the lengths, which imply the padding mask).
void build_sdpa_op(GraphBuilder& g, const SdpaSpec& s) {
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT, bf16 = CUDNN_DATA_BFLOAT16, i32 = CUDNN_DATA_INT32;
  const Dims one{1, 1, 1, 1}, rd{s.B, s.Hq, s.s_q, 1};
  const Desc& q = g.tensor(kQ, bf16, {s.B, s.Hq, s.s_q, s.D}, s.q_stride, false);
  const Desc& o = g.tensor(kO, bf16, {s.B, s.Hq, s.s_q, s.D}, s.o_stride, false);
  const Desc& scale = g.tensor(kScale, f32, one, one, false, true);
  const Desc* stats = s.stats_output ? &g.tensor(kStats, f32, rd, row_major(rd), false) : nullptr;
  if (s.page_size > 0) {
    const Dims container{s.num_pages, s.Hkv, s.page_size, s.D}, table{s.B, 1, s.s_kv / s.page_size, 1};
    const Desc& k = g.tensor(kK, bf16, container, row_major(container), false);
    const Desc& v = g.tensor(kV, bf16, container, row_major(container), false);
    const Desc& tk = g.tensor(kTableK, i32, table, row_major(table), false);
    const Desc& tv = g.tensor(kTableV, i32, table, row_major(table), false);
    const Desc& sq = g.tensor(kSeqQ, i32, {s.B, 1, 1, 1}, one, false);
    const Desc& skv = g.tensor(kSeqKv, i32, {s.B, 1, 1, 1}, one, false);
    g.sdpa_op(q, k, v, o, stats, scale, &tk, &tv, &sq, &skv);
  } else {
    const Desc& k = g.tensor(kK, bf16, {s.B, s.Hkv, s.s_kv, s.D}, s.kv_stride, false);
    const Desc& v = g.tensor(kV, bf16, {s.B, s.Hkv, s.s_kv, s.D}, s.kv_stride, false);
    g.sdpa_op(q, k, v, o, stats, scale, nullptr, nullptr, nullptr, nullptr);
  }
}

// Adds the SDPA graph of `s` to `g` (see cudnn_sdpa.h).
void build_sdpa(GraphBuilder& g, const SdpaSpec& s) {
  const bool paged = s.page_size > 0;
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT, bf16 = CUDNN_DATA_BFLOAT16, i32 = CUDNN_DATA_INT32,
                        boolean = CUDNN_DATA_BOOLEAN;
  const Dims one{1, 1, 1, 1};
  const Desc& q = g.tensor(kQ, bf16, {s.B, s.Hq, s.s_q, s.D}, s.q_stride, false);
  const Desc& o = g.tensor(kO, bf16, {s.B, s.Hq, s.s_q, s.D}, s.o_stride, false);
  const Desc& scale = g.tensor(kScale, f32, one, one, false, true);
  const Desc* seq_q = nullptr;
  const Desc* seq_kv = nullptr;
  const Desc* kt = nullptr;  // K^T: [B, Hkv, D, s_kv]
  const Desc* v = nullptr;   // [B, Hkv, s_kv, D]
  if (paged) {
    const int64_t pages = s.s_kv / s.page_size;
    const Dims container{s.num_pages, s.Hkv, s.page_size, s.D}, table{s.B, 1, pages, 1};
    seq_q = &g.tensor(kSeqQ, i32, {s.B, 1, 1, 1}, one, false);
    seq_kv = &g.tensor(kSeqKv, i32, {s.B, 1, 1, 1}, one, false);
    const Desc& kc = g.tensor(kK, bf16, container, row_major(container), false);
    const Desc& vc = g.tensor(kV, bf16, container, row_major(container), false);
    const Desc& tk = g.tensor(kTableK, i32, table, row_major(table), false);
    const Desc& tv = g.tensor(kTableV, i32, table, row_major(table), false);
    const int64_t per_head = s.D * s.s_kv;
    kt = &g.virt(bf16, {s.B, s.Hkv, s.D, s.s_kv}, {per_head * s.Hkv, per_head, 1, s.D});
    v = &g.virt(bf16, {s.B, s.Hkv, s.s_kv, s.D}, {per_head * s.Hkv, per_head, s.D, 1});
    g.paged_load(kc, *seq_kv, tk, *kt);
    g.paged_load(vc, *seq_kv, tv, *v);
  } else {
    const Dims& ks = s.kv_stride;
    kt = &g.tensor(kK, bf16, {s.B, s.Hkv, s.D, s.s_kv}, {ks[0], ks[1], ks[3], ks[2]}, false);
    v = &g.tensor(kV, bf16, {s.B, s.Hkv, s.s_kv, s.D}, s.kv_stride, false);
  }

  const Dims sd{s.B, s.Hq, s.s_q, s.s_kv}, ss = row_major(sd);
  const Dims rd{s.B, s.Hq, s.s_q, 1}, rs = row_major(rd);
  const Desc* score = &g.virt(f32, sd, ss);
  g.matmul(q, *kt, *score, seq_q, seq_kv, nullptr);
  const Desc& scaled = g.virt(f32, sd, ss);
  g.pointwise(CUDNN_POINTWISE_MUL, f32, *score, &scale, nullptr, scaled);
  score = &scaled;

  const Desc* neg_inf = nullptr;
  if (paged || s.causal) neg_inf = &g.tensor(kNegInf, f32, one, one, false, true);
  if (paged) {  // keep row < seq_q[b] and col < seq_kv[b]
    const Desc& row = g.virt(i32, sd, ss);
    const Desc& col = g.virt(i32, sd, ss);
    g.pointwise(CUDNN_POINTWISE_GEN_INDEX, i32, *score, nullptr, nullptr, row, 2);
    g.pointwise(CUDNN_POINTWISE_GEN_INDEX, i32, *score, nullptr, nullptr, col, 3);
    const Desc& row_ok = g.virt(boolean, sd, ss);
    const Desc& col_ok = g.virt(boolean, sd, ss);
    const Desc& both = g.virt(boolean, sd, ss);
    g.pointwise(CUDNN_POINTWISE_CMP_LT, boolean, row, seq_q, nullptr, row_ok);
    g.pointwise(CUDNN_POINTWISE_CMP_LT, boolean, col, seq_kv, nullptr, col_ok);
    g.pointwise(CUDNN_POINTWISE_LOGICAL_AND, boolean, row_ok, &col_ok, nullptr, both);
    const Desc& masked = g.virt(f32, sd, ss);
    g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, f32, *score, neg_inf, &both, masked);
    score = &masked;
  }
  if (s.causal) {  // keep row >= col
    const Desc& row = g.virt(i32, sd, ss);
    const Desc& col = g.virt(i32, sd, ss);
    g.pointwise(CUDNN_POINTWISE_GEN_INDEX, f32, *score, nullptr, nullptr, row, 2);
    g.pointwise(CUDNN_POINTWISE_GEN_INDEX, f32, *score, nullptr, nullptr, col, 3);
    const Desc& keep = g.virt(boolean, sd, ss);
    g.pointwise(CUDNN_POINTWISE_CMP_GE, boolean, row, &col, nullptr, keep);
    const Desc& masked = g.virt(f32, sd, ss);
    g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, f32, *score, neg_inf, &keep, masked);
    score = &masked;
  }

  // Softmax; the stats (max + log sum) are part of the pattern even when nobody reads them.
  const Desc& mx = g.virt(f32, rd, rs);
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, *score, mx);
  const Desc& shifted = g.virt(f32, sd, ss);
  g.pointwise(CUDNN_POINTWISE_SUB, f32, *score, &mx, nullptr, shifted);
  const Desc& e = g.virt(f32, sd, ss);
  g.pointwise(CUDNN_POINTWISE_EXP, f32, shifted, nullptr, nullptr, e);
  const Desc& sum = g.virt(f32, rd, rs);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, sum);
  const Desc& log_sum = g.virt(f32, rd, rs);
  g.pointwise(CUDNN_POINTWISE_LOG, f32, sum, nullptr, nullptr, log_sum);
  const Desc& stats = s.stats_output ? g.tensor(kStats, f32, rd, rs, false) : g.virt(f32, rd, rs);
  g.pointwise(CUDNN_POINTWISE_ADD, f32, mx, &log_sum, nullptr, stats);
  const Desc& p = g.virt(bf16, sd, ss);  // the P of P V enters the second matmul as bf16
  g.pointwise(CUDNN_POINTWISE_DIV, f32, e, &sum, nullptr, p);
  g.matmul(p, *v, o, seq_q, nullptr, seq_kv);
}

// The engine's global index ("?" when cuDNN does not say): informational only.
std::string engine_index(const Desc& cfg) {
  try {
    Desc engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
    cudnnBackendDescriptor_t e = engine.get();
    int64_t n = 0, index = -1;
    if (cudnnBackendGetAttribute(cfg.get(), CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n,
                                 &e) == CUDNN_STATUS_SUCCESS &&
        cudnnBackendGetAttribute(engine.get(), CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n,
                                 &index) == CUDNN_STATUS_SUCCESS)
      return std::to_string(index);
  } catch (const BackendError&) {
  }
  return "?";
}

std::string plan_json(const Desc& plan) {
  int64_t n = 0;
  if (cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, 0,
                               &n, nullptr) != CUDNN_STATUS_SUCCESS ||
      n <= 0)
    return "";
  std::string s(size_t(n), '\0');
  if (cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, n,
                               &n, s.data()) != CUDNN_STATUS_SUCCESS)
    return "";
  s.resize(s.find('\0') == std::string::npos ? s.size() : s.find('\0'));
  const size_t engine = s.rfind("\"engine\":");  // the engine and its knobs, not the whole graph again
  return engine == std::string::npos ? s : s.substr(engine);
}

}  // namespace

std::string status_text(cudnnStatus_t st) {
  char last[512] = "";
  cudnnGetLastErrorString(last, sizeof(last));
  std::string s = cudnnGetErrorString(st);
  if (last[0]) s += std::string(" (") + last + ")";
  return s;
}

Desc::Desc(cudnnBackendDescriptorType_t type) {
  check(cudnnBackendCreateDescriptor(type, &d_),
        "cudnnBackendCreateDescriptor(type " + std::to_string(int(type)) + ")");
}
Desc& Desc::operator=(Desc&& o) noexcept {
  std::swap(d_, o.d_);
  return *this;
}
Desc::~Desc() {
  if (d_) cudnnBackendDestroyDescriptor(d_);
}

SdpaPlan SdpaPlan::build(cudnnHandle_t handle, const SdpaSpec& spec) {
  SdpaPlan p;
  p.spec_ = spec;
  p.scalars_ = std::make_unique<std::array<float, 2>>(
      std::array<float, 2>{spec.scale, -std::numeric_limits<float>::infinity()});
  try {
    GraphBuilder g(p.keep_);
    if (spec.single_op && spec.causal)
      throw BackendError("the SDPA_FWD operation has no causal mask before 9.21");
    spec.single_op ? build_sdpa_op(g, spec) : build_sdpa(g, spec);
    p.keep_.push_back(g.graph(handle));
    const Desc& graph = p.keep_.back();
    std::string tried;
    for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
      const char* mode_name = mode == CUDNN_HEUR_MODE_A ? "A" : "fallback";
      Desc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
      set_desc(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph, "ENGINEHEUR_OPERATION_GRAPH");
      set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "ENGINEHEUR_MODE");
      if (cudnnStatus_t st = cudnnBackendFinalize(heur.get()); st != CUDNN_STATUS_SUCCESS) {
        tried += std::string(" heuristic ") + mode_name + ": " + status_text(st) + ";";
        continue;
      }
      int64_t count = 0;
      check(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                     0, &count, nullptr),
            "cudnnBackendGetAttribute(ENGINEHEUR_RESULTS count)");
      std::vector<Desc> cfgs;
      std::vector<cudnnBackendDescriptor_t> raw;
      for (int64_t i = 0; i < count; ++i) {
        cfgs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
        raw.push_back(cfgs.back().get());
      }
      if (count > 0)
        check(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                       CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &count, raw.data()),
              "cudnnBackendGetAttribute(ENGINEHEUR_RESULTS)");
      tried += std::string(" heuristic ") + mode_name + ": " + std::to_string(count) + " configs";
      for (int64_t i = 0; i < count; ++i) {
        auto plan = std::make_unique<Desc>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
        set(*plan, kExecutionPlanHandle, CUDNN_TYPE_HANDLE, 1, &handle, "EXECUTION_PLAN_HANDLE");
        set_desc(*plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfgs[size_t(i)],
                 "EXECUTION_PLAN_ENGINE_CONFIG");
        if (cudnnStatus_t st = cudnnBackendFinalize(plan->get()); st != CUDNN_STATUS_SUCCESS) {
          tried += ", #" + std::to_string(i + 1) + " " + status_text(st).substr(0, 160);
          continue;
        }
        int64_t n = 0;
        check(cudnnBackendGetAttribute(plan->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                       CUDNN_TYPE_INT64, 1, &n, &p.workspace_),
              "cudnnBackendGetAttribute(EXECUTION_PLAN_WORKSPACE_SIZE)");
        p.engine_ = "engine " + engine_index(cfgs[size_t(i)]) + " (heuristic " + mode_name + ", config " +
                    std::to_string(i + 1) + " of " + std::to_string(count) + ")";
        p.json_ = plan_json(*plan);
        p.plan_ = std::move(plan);
        return p;
      }
      tried += ";";
    }
    // With 0 configs cuDNN dropped every candidate itself; its log says why.
    p.error_ = "no engine:" + tried + " (CUDNN_LOGLEVEL_DBG=2 CUDNN_LOGDEST_DBG=stderr: why)";
  } catch (const BackendError& e) {
    p.error_ = e.what();
  }
  return p;
}

Desc SdpaPlan::pack(const SdpaBuffers& b, void* workspace, std::string& error) const {
  std::vector<int64_t> uids{kQ, kK, kV, kO, kScale};
  std::vector<void*> ptrs{b.q, b.k, b.v, b.o, &(*scalars_)[0]};
  if (!spec_.single_op && (spec_.page_size > 0 || spec_.causal)) {
    uids.push_back(kNegInf);
    ptrs.push_back(&(*scalars_)[1]);
  }
  if (spec_.page_size > 0) {
    uids.insert(uids.end(), {kSeqQ, kSeqKv, kTableK, kTableV});
    ptrs.insert(ptrs.end(), {b.seq_q, b.seq_kv, b.table_k, b.table_v});
  }
  if (spec_.stats_output) {
    uids.push_back(kStats);
    ptrs.push_back(b.stats);
  }
  try {
    Desc vp(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    set(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, int64_t(uids.size()), uids.data(),
        "VARIANT_PACK_UNIQUE_IDS");
    set(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, int64_t(ptrs.size()), ptrs.data(),
        "VARIANT_PACK_DATA_POINTERS");
    set(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace, "VARIANT_PACK_WORKSPACE");
    finalize(vp, "VARIANT_PACK_DESCRIPTOR");
    return vp;
  } catch (const BackendError& e) {
    error = e.what();
    return Desc();
  }
}

cudnnStatus_t SdpaPlan::execute(cudnnHandle_t handle, const Desc& pack) const {
  return cudnnBackendExecute(handle, plan_->get(), pack.get());
}

}  // namespace kiln::bench::cudnn
