// Qwen3Runner: the ModelRunner for the real model (src/model/qwen3.h) on the CPU or a GPU. It owns the
// Qwen3Model and its KvCache, and copies each step's logits / hidden rows back to the host.
#pragma once

#include <memory>
#include <string>

#include "model/kv_cache.h"
#include "model/qwen3.h"
#include "runtime/engine.h"
#include "runtime/model_runner.h"

namespace kiln {

class Qwen3Runner : public ModelRunner {
 public:
  Qwen3Runner(std::unique_ptr<Qwen3Model> model, ops::KvLayout layout, DType kv_dtype);

  const ModelConfig& config() const override { return model_->config(); }
  Device device() const override { return model_->device(); }
  int64_t kv_bytes_per_token() const override { return KvCache::bytes_per_token(config(), kv_dtype_); }
  int64_t kv_memory_budget(double mem_fraction) const override;
  void allocate_kv(int32_t num_pages, int32_t page_size) override;
  void forward(const BatchDesc& batch, std::vector<float>* logits, std::vector<float>* hidden) override;
  // CUDA: logits stay on the device; kiln::cuda::sample draws every row there. CPU: declines.
  bool forward_sampled(const BatchDesc& batch, const std::vector<RowSampling>& rows, int top_n,
                       std::vector<SampledRow>* out) override;

  Qwen3Model& model() { return *model_; }
  KvCache& cache() { return *cache_; }

 private:
  Tensor device_rows(Buffer& buf, int64_t rows, int64_t cols);  // f32 [rows, cols], grown on demand

  std::unique_ptr<Qwen3Model> model_;
  std::unique_ptr<KvCache> cache_;
  ops::KvLayout layout_;
  DType kv_dtype_;
  Buffer logits_buf_, hidden_buf_;
  Buffer sample_params_buf_, sample_out_buf_;  // device: SampleParams [R]; tokens, logprobs, top ids/logprobs
};

// Parses the string options (device, load format, KV layout and dtype) and loads the model.
std::unique_ptr<Qwen3Runner> load_qwen3_runner(const EngineOptions& opts);

}  // namespace kiln
