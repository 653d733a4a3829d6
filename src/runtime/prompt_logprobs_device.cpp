// Qwen3Runner::forward_logprobs (runtime/prompt_logprobs.h): on CUDA the step's query rows go through the LM
// head kRowLogprobGroup rows at a time into a device buffer, are reduced there (cuda::row_logprobs for the
// asked ids, cuda::sample greedy for the top-n), and only the answers come back. Elsewhere (the CPU backend,
// a step that also wants hidden states) the host default of ModelRunner runs.
#include <algorithm>

#include "runtime/qwen3_runner.h"

#ifdef KILN_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "ops/cuda/row_logprobs.h"
#include "ops/cuda/sampling.h"
#include "ops/stream.h"
#endif

namespace kiln {

void Qwen3Runner::forward_logprobs(const BatchDesc& batch, std::vector<float>* logits,
                                   std::vector<float>* hidden, const std::vector<LogprobQuery>& queries,
                                   std::vector<RowLogprobs>* out) {
#ifdef KILN_HAVE_CUDA
  if (!device().is_cuda() || queries.empty() || hidden || model_->tp())
    return ModelRunner::forward_logprobs(batch, logits, hidden, queries, out);
  KILN_CHECK(cache_ != nullptr, "Qwen3Runner: allocate_kv was not called");
  const int64_t R = int64_t(batch.logit_rows.size()), V = config().vocab_size;
  BatchDesc local;
  VisualInput visual;
  const BatchDesc& b = with_images(batch, local, visual);
  const Tensor sampled = device_rows(logits_buf_, R, V);
  model_->forward(b, *cache_, sampled, visual.empty() ? nullptr : &visual);
  images_.step_done(b);
  auto* stream = static_cast<cudaStream_t>(ops::current_stream());
  auto sync = [&] {
    KILN_CHECK(cudaStreamSynchronize(stream) == cudaSuccess,
               "CUDA prompt logprobs failed: ", cudaGetErrorString(cudaGetLastError()));
  };
  if (logits) {
    sync();
    logits->resize(size_t(R * V));
    copy_bytes(logits->data(), Device::cpu(), sampled.data, device(), size_t(R * V) * sizeof(float));
  }
  out->assign(queries.size(), RowLogprobs{});
  for (size_t g0 = 0; g0 < queries.size(); g0 += kRowLogprobGroup) {
    const int64_t n = std::min<int64_t>(kRowLogprobGroup, int64_t(queries.size() - g0));
    int ids_per_row = 1, top_n = 0;
    for (int64_t q = 0; q < n; ++q) {
      ids_per_row = std::max(ids_per_row, int(queries[g0 + size_t(q)].ids.size()));
      top_n = std::max(top_n, int(queries[g0 + size_t(q)].top_n));
    }
    KILN_CHECK(ids_per_row <= cuda::kMaxRowLogprobIds && top_n <= cuda::kMaxTopN,
               "prompt logprobs: too many ids or alternatives for one row");
    // Inputs in one upload: rows i32 [n], ids i32 [n, k] (short rows padded with their first id), greedy
    // SampleParams [n]; outputs: logprobs f32 [n, k], ranks i32 [n, k], tokens, token logprobs, top ids and
    // top logprobs (cuda::sample's).
    const size_t k = size_t(ids_per_row), un = size_t(n);
    std::vector<int32_t> in(un + un * k);
    for (size_t q = 0; q < un; ++q) {
      const LogprobQuery& lq = queries[g0 + q];
      in[q] = lq.row;
      for (size_t j = 0; j < k; ++j)
        in[un + q * k + j] = lq.ids.empty() ? 0 : lq.ids[std::min(j, lq.ids.size() - 1)];
    }
    const size_t in_bytes = in.size() * 4, params_bytes = un * sizeof(cuda::SampleParams);
    const size_t out_bytes = un * k * 8 + un * 8 + un * size_t(top_n) * 8;
    const size_t need = in_bytes + 16 + params_bytes + out_bytes;
    if (query_buf_.bytes() < need) query_buf_ = Buffer(need, device());
    char* base = static_cast<char*>(query_buf_.data());
    char* params = base + (in_bytes + 15) / 16 * 16;
    char* o = params + params_bytes;
    auto* lp = reinterpret_cast<float*>(o);
    auto* ranks = reinterpret_cast<int32_t*>(o + un * k * 4);
    auto* tokens = reinterpret_cast<int32_t*>(o + un * k * 8);
    auto* tok_lp = reinterpret_cast<float*>(o + un * k * 8 + un * 4);
    auto* top_ids = reinterpret_cast<int32_t*>(o + un * k * 8 + un * 8);
    auto* top_lp = reinterpret_cast<float*>(o + un * k * 8 + un * 8 + un * size_t(top_n) * 4);
    sync();  // the previous group's kernels have read their inputs
    copy_bytes(base, device(), in.data(), Device::cpu(), in_bytes);
    if (top_n > 0) {
      const std::vector<cuda::SampleParams> greedy(un);  // temperature 0: argmax, then the top-n
      copy_bytes(params, device(), greedy.data(), Device::cpu(), params_bytes);
    }
    const Tensor rows(base, DType::i32, {n}, device());
    const Tensor group = device_rows(query_logits_buf_, n, V);
    model_->lm_head_rows(rows, group);
    cuda::row_logprobs(group.ptr<float>(), V, n, V, reinterpret_cast<const int32_t*>(base) + un, int(k), lp,
                       ranks, stream);
    if (top_n > 0)
      cuda::sample(group.ptr<float>(), V, n, V, reinterpret_cast<const cuda::SampleParams*>(params), tokens,
                   tok_lp, top_n, top_ids, top_lp, stream);
    sync();
    std::vector<char> host(out_bytes);
    copy_bytes(host.data(), Device::cpu(), o, device(), out_bytes);
    const auto* h_lp = reinterpret_cast<const float*>(host.data());
    const auto* h_rank = reinterpret_cast<const int32_t*>(host.data() + un * k * 4);
    const auto* h_top_ids = reinterpret_cast<const int32_t*>(host.data() + un * k * 8 + un * 8);
    const auto* h_top_lp =
        reinterpret_cast<const float*>(host.data() + un * k * 8 + un * 8 + un * size_t(top_n) * 4);
    for (size_t q = 0; q < un; ++q) {
      const LogprobQuery& lq = queries[g0 + q];
      RowLogprobs& a = (*out)[g0 + q];
      for (size_t j = 0; j < lq.ids.size(); ++j) {
        a.logprobs.push_back(h_lp[q * k + j]);
        a.ranks.push_back(h_rank[q * k + j]);
      }
      for (int j = 0; j < lq.top_n; ++j)
        a.top.push_back({h_top_ids[q * size_t(top_n) + size_t(j)], h_top_lp[q * size_t(top_n) + size_t(j)]});
    }
  }
#else
  ModelRunner::forward_logprobs(batch, logits, hidden, queries, out);
#endif
}

}  // namespace kiln
