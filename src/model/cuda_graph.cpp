// Decode-step CUDA graph (see cuda_graph.h).
#include "model/cuda_graph.h"

#include "kiln/error.h"

#ifdef KILN_HAVE_CUDA
#include "kiln/cuda_check.h"

#include "ops/cuda/context.h"
#endif

namespace kiln {

#ifdef KILN_HAVE_CUDA
CudaDecodeGraph::CudaDecodeGraph(Qwen3Model& model, KvCache& cache, int32_t pages_stride)
    : model_(model), cache_(cache), pages_stride_(pages_stride) {
  KILN_CHECK(model.device().is_cuda() && cache.device() == model.device(),
             "CudaDecodeGraph needs the model and its KV cache on one CUDA device");
  KILN_CHECK(pages_stride > 0, "CudaDecodeGraph: pages_stride must be positive");
  const int64_t V = model.config().vocab_size;
  logits_buf_ = Buffer(size_t(V) * sizeof(float), model.device());
  logits_ = logits_buf_.view(DType::f32, {1, V});
  cudaStream_t s = nullptr;
  KILN_CUDA_CHECK(cudaStreamCreate(&s));
  stream_ = s;
}

CudaDecodeGraph::~CudaDecodeGraph() {
  if (exec_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
  if (graph_) cudaGraphDestroy(static_cast<cudaGraph_t>(graph_));
  if (stream_) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

void CudaDecodeGraph::capture() {
  cudaStream_t s = static_cast<cudaStream_t>(stream_);
  cuda::StreamScope scope(s);
  // Eager once on the graph's stream: creates GEMM plans and sizes scratch, so the captured launches
  // allocate nothing. The step's K/V write is idempotent, so the replay that follows repeats it harmlessly.
  model_.launch_layers(cache_);
  model_.launch_lm_head(logits_);
  KILN_CUDA_CHECK(cudaStreamSynchronize(s));
  if (exec_) KILN_CUDA_CHECK(cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_)));
  if (graph_) KILN_CUDA_CHECK(cudaGraphDestroy(static_cast<cudaGraph_t>(graph_)));
  exec_ = graph_ = nullptr;
  cudaGraph_t g = nullptr;
  KILN_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  try {
    model_.launch_layers(cache_);
    model_.launch_lm_head(logits_);
  } catch (...) {
    cudaStreamEndCapture(s, &g);  // leave the stream usable
    if (g) cudaGraphDestroy(g);
    throw;
  }
  KILN_CUDA_CHECK(cudaStreamEndCapture(s, &g));
  graph_ = g;
  cudaGraphExec_t e = nullptr;
  KILN_CUDA_CHECK(cudaGraphInstantiate(&e, g, 0));
  exec_ = e;
  generation_ = model_.workspace_generation();
  ++captures_;
}

Tensor CudaDecodeGraph::step(const BatchDesc& in) {
  KILN_CHECK(in.num_seqs() == 1 && in.num_tokens() == 1 && in.logit_rows.size() == 1 && in.logit_rows[0] == 0,
             "CudaDecodeGraph::step takes one sequence with one new token and its logits");
  KILN_CHECK(in.pages_stride <= pages_stride_, "CudaDecodeGraph: page table of ", in.pages_stride,
             " pages is wider than the graph's ", pages_stride_);
  BatchDesc b = in;
  b.page_table.resize(size_t(pages_stride_), 0);  // padding pages are never read: kv_lens bounds the reads
  b.pages_stride = pages_stride_;
  cudaStream_t s = static_cast<cudaStream_t>(stream_);
  KILN_CUDA_CHECK(
      cudaStreamSynchronize(s));  // the last replay has read its inputs before they are overwritten
  model_.stage(b, cache_);
  if (!exec_ || model_.workspace_generation() != generation_) capture();
  KILN_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), s));
  return logits_;
}

#else
CudaDecodeGraph::CudaDecodeGraph(Qwen3Model& model, KvCache& cache, int32_t pages_stride)
    : model_(model), cache_(cache), pages_stride_(pages_stride) {
  KILN_FAIL("kiln was built without CUDA: no CUDA graphs");
}
CudaDecodeGraph::~CudaDecodeGraph() = default;
void CudaDecodeGraph::capture() {}
Tensor CudaDecodeGraph::step(const BatchDesc&) {
  KILN_FAIL("kiln was built without CUDA: no CUDA graphs");
}
#endif

}  // namespace kiln
