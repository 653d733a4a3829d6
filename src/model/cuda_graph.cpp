// Decode-step CUDA graph (see cuda_graph.h).
#include "model/cuda_graph.h"

#include <algorithm>

#include "kiln/error.h"

#ifdef KILN_HAVE_CUDA
#include "kiln/cuda_check.h"

#include "ops/cuda/context.h"
#endif

namespace kiln {

void copy_with_table_width(const BatchDesc& in, int32_t table_rows, int32_t width, BatchDesc& out,
                           bool tree) {
  KILN_CHECK(table_rows >= in.num_seqs() && width >= in.pages_stride, "copy_with_table_width: a table of ",
             table_rows, " x ", width, " for ", in.num_seqs(), " x ", in.pages_stride);
  // Only a tree graph's attention reads the masks: for any other graph a token tree would run causally.
  KILN_CHECK(in.has_tree() == tree, "copy_with_table_width: ",
             in.has_tree() ? "a token-tree batch (tree_window / tree_mask) for a graph without tree masks"
                           : "a tree graph's batch without tree_window / tree_mask");
  out.tree_window = in.tree_window;
  out.tree_mask = in.tree_mask;
  out.tokens = in.tokens;
  out.positions = in.positions;
  out.slot_mapping = in.slot_mapping;
  out.cu_q = in.cu_q;
  out.kv_lens = in.kv_lens;
  out.page_size = in.page_size;
  out.pages_stride = width;
  // Padding entries are never read (kv_lens bounds the reads); 0 is a valid page index.
  out.page_table.assign(size_t(table_rows) * size_t(width), 0);
  for (int32_t i = 0; i < in.num_seqs(); ++i)
    std::copy_n(in.page_table.begin() + ptrdiff_t(i) * in.pages_stride, in.pages_stride,
                out.page_table.begin() + ptrdiff_t(i) * width);
}

#ifdef KILN_HAVE_CUDA
void capture_cuda_graph(void* stream, const std::function<void()>& launch, void** graph, void** exec) {
  auto* s = static_cast<cudaStream_t>(stream);
  if (*exec) KILN_CUDA_CHECK(cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(*exec)));
  if (*graph) KILN_CUDA_CHECK(cudaGraphDestroy(static_cast<cudaGraph_t>(*graph)));
  *exec = *graph = nullptr;
  cudaGraph_t g = nullptr;
  KILN_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  try {
    launch();
  } catch (...) {
    cudaStreamEndCapture(s, &g);  // leave the stream usable
    if (g) cudaGraphDestroy(g);
    throw;
  }
  KILN_CUDA_CHECK(cudaStreamEndCapture(s, &g));
  *graph = g;
  cudaGraphExec_t e = nullptr;
  KILN_CUDA_CHECK(cudaGraphInstantiate(&e, g, 0));
  *exec = e;
}

CudaDecodeGraph::CudaDecodeGraph(Qwen3Model& model, KvCache& cache, int32_t pages_stride, int32_t num_seqs,
                                 Tensor logits, std::optional<bool> pdl, int32_t rows_per_seq, bool tree)
    : model_(model),
      cache_(cache),
      pages_stride_(pages_stride),
      num_seqs_(num_seqs),
      rows_per_seq_(rows_per_seq),
      tree_(tree) {
  KILN_CHECK(!tree || rows_per_seq >= 2,
             "CudaDecodeGraph: a tree graph is a verify graph (rows_per_seq >= 2)");
  KILN_CHECK(model.device().is_cuda() && cache.device() == model.device(),
             "CudaDecodeGraph needs the model and its KV cache on one CUDA device");
  KILN_CHECK(pages_stride > 0, "CudaDecodeGraph: pages_stride must be positive");
  KILN_CHECK(num_seqs > 0, "CudaDecodeGraph: num_seqs must be positive");
  KILN_CHECK(rows_per_seq > 0, "CudaDecodeGraph: rows_per_seq must be positive");
  const int64_t V = model.config().vocab_size, rows = int64_t(num_seqs) * rows_per_seq;
  if (logits.data) {
    KILN_CHECK(logits.dtype == DType::f32 && logits.ndim == 2 && logits.shape[0] >= rows &&
                   logits.shape[1] == V && logits.stride[0] == V && logits.device == model.device(),
               "CudaDecodeGraph: logits must be contiguous f32 [>= ", rows, ", ", V, "] on ",
               device_name(model.device()), ", got ", logits.describe());
    logits_ = Tensor(logits.data, DType::f32, {rows, V}, model.device());
  } else {
    logits_buf_ = Buffer(size_t(rows) * size_t(V) * sizeof(float), model.device());
    logits_ = logits_buf_.view(DType::f32, {rows, V});
  }
  cudaStream_t s = nullptr;
  KILN_CUDA_CHECK(cudaStreamCreate(&s));
  stream_ = s;
  pdl_ = pdl.value_or(cuda::pdl_enabled());
}

CudaDecodeGraph::~CudaDecodeGraph() {
  if (exec_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
  if (graph_) cudaGraphDestroy(static_cast<cudaGraph_t>(graph_));
  if (stream_) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

void CudaDecodeGraph::capture() {
  cudaStream_t s = static_cast<cudaStream_t>(stream_);
  cuda::StreamScope scope(s);
  struct PdlScope {  // the graph's PDL setting for these launches, the caller's again afterwards
    bool before = cuda::pdl_enabled();
    explicit PdlScope(bool on) { cuda::set_pdl(on); }
    ~PdlScope() { cuda::set_pdl(before); }
  } pdl_scope(pdl_);
  // Eager once on the graph's stream: creates GEMM plans and sizes scratch, so the captured launches
  // allocate nothing. The step's K/V write is idempotent, so the replay that follows repeats it harmlessly.
  model_.launch_layers(cache_);
  model_.launch_lm_head(logits_);
  KILN_CUDA_CHECK(cudaStreamSynchronize(s));
  capture_cuda_graph(
      s,
      [&] {
        model_.launch_layers(cache_);
        model_.launch_lm_head(logits_);
      },
      &graph_, &exec_);
  generation_ = model_.workspace_generation();
  ++captures_;
}

Tensor CudaDecodeGraph::step(const BatchDesc& in, const int32_t* token_ids) {
  // A tree graph's attention reads the masks; any other's would run a tree's rows causally.
  KILN_CHECK(in.has_tree() == tree_, "CudaDecodeGraph::step: ",
             tree_ ? "a tree graph takes token-tree batches (tree_window / tree_mask) only"
                   : "a token-tree batch (tree_window / tree_mask) for a graph without tree masks");
  const int32_t B = num_seqs_, q = rows_per_seq_, T = B * q;
  const int64_t R = int64_t(in.logit_rows.size());
  KILN_CHECK(in.num_seqs() == B && in.num_tokens() == T && !in.mrope, "CudaDecodeGraph::step takes ", B,
             " sequences of ", q, " new tokens each without M-RoPE, got ", in.num_seqs(), " sequences and ",
             in.num_tokens(), " tokens", in.mrope ? " (M-RoPE)" : "");
  for (int32_t i = 0; i <= B; ++i)
    KILN_CHECK(in.cu_q[size_t(i)] == i * q, "CudaDecodeGraph::step: sequence ", i - 1, " has not ", q,
               " new tokens");
  KILN_CHECK(R <= T, "CudaDecodeGraph::step: ", R, " logit rows for ", T, " tokens");
  KILN_CHECK(!token_ids || q == 1, "CudaDecodeGraph::step: chained input tokens on a verify graph");
  for (int64_t r = 0; r < R; ++r)
    KILN_CHECK(in.logit_rows[size_t(r)] == r, "CudaDecodeGraph::step: logit_rows must be 0, 1, ..., R-1");
  KILN_CHECK(in.pages_stride <= pages_stride_, "CudaDecodeGraph: page table of ", in.pages_stride,
             " pages is wider than the graph's ", pages_stride_);
  KILN_CHECK_EQ(in.page_table.size(), size_t(B) * size_t(in.pages_stride),
                "CudaDecodeGraph: page table size");
  BatchDesc& b = staged_;
  copy_with_table_width(in, B, pages_stride_, b, tree_);
  b.logit_rows.resize(size_t(T));
  for (int32_t i = 0; i < T; ++i) b.logit_rows[size_t(i)] = i;  // a fixed LM-head shape
  cudaStream_t s = static_cast<cudaStream_t>(stream_);
  // A plain step waits for the graph's earlier replays, as every step did before the overlap schedule
  // (measured that way on the H200). A chained step (token_ids) must not: it is queued while its
  // predecessor runs. Either way the inputs' copies are ordered after the earlier replays that read them:
  // on the same stream, or StagedUploads waits for the device when the previous step ran on another one.
  if (!token_ids) KILN_CUDA_CHECK(cudaStreamSynchronize(s));
  {
    cuda::StreamScope scope(s);
    model_.stage(b, cache_);
    if (q > 1) model_.drop_per_step_attention_bounds();  // a replay keeps the capture's
  }
  if (token_ids)
    KILN_CUDA_CHECK(cudaMemcpyAsync(model_.staged_token_ids(), token_ids, size_t(R) * sizeof(int32_t),
                                    cudaMemcpyDeviceToDevice, s));
  if (!exec_ || model_.workspace_generation() != generation_) capture();
  KILN_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), s));
  return Tensor(logits_.data, DType::f32, {R, model_.config().vocab_size}, model_.device());
}

#else
void capture_cuda_graph(void*, const std::function<void()>&, void**, void**) {
  KILN_FAIL("kiln was built without CUDA: no CUDA graphs");
}
CudaDecodeGraph::CudaDecodeGraph(Qwen3Model& model, KvCache& cache, int32_t pages_stride, int32_t num_seqs,
                                 Tensor, std::optional<bool>, int32_t rows_per_seq, bool tree)
    : model_(model),
      cache_(cache),
      pages_stride_(pages_stride),
      num_seqs_(num_seqs),
      rows_per_seq_(rows_per_seq),
      tree_(tree) {
  KILN_FAIL("kiln was built without CUDA: no CUDA graphs");
}
CudaDecodeGraph::~CudaDecodeGraph() = default;
void CudaDecodeGraph::capture() {}
Tensor CudaDecodeGraph::step(const BatchDesc&, const int32_t*) {
  KILN_FAIL("kiln was built without CUDA: no CUDA graphs");
}
#endif

}  // namespace kiln
