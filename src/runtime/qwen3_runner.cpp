#include "runtime/qwen3_runner.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "kiln/env.h"
#include "kiln/error.h"
#include "model/cuda_step_choice.h"
#include "runtime/tp_runner.h"

#ifdef KILN_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kiln/cuda_check.h"
#include "ops/cuda/context.h"
#include "ops/cuda/sampling.h"
#include "ops/stream.h"
#endif

namespace kiln {

namespace {
constexpr int64_t kGiB = int64_t(1) << 30;

// EAGLE-3 on CUDA: served by default; KILN_EAGLE3_CUDA=0 refuses it by name, as kiln did at `2f94697` (before
// the cause of that commit's H100 test failures was found: the draft's outputs off a 16-byte boundary).
constexpr bool kEagle3OnCudaByDefault = true;
// EAGLE-3 tree drafting (--speculative-eagle-topk above 1) on CUDA: its kernels (the draft's top-k,
// token-tree attention, move_kv) and their tests are compiled but have not run on a GPU yet (2026-12-07,
// `dc34ecc`), so it is refused there by name unless KILN_EAGLE3_TREE_CUDA=1; the CPU backend runs it
// (test_eagle3_tree).
constexpr bool kEagle3TreeOnCudaByDefault = false;

const Qwen3Model& nonnull(const std::unique_ptr<Qwen3Model>& m) {
  KILN_CHECK(m != nullptr);
  return *m;
}
}  // namespace

Qwen3Runner::Qwen3Runner(std::unique_ptr<Qwen3Model> model, ops::KvLayout layout, DType kv_dtype)
    : model_(std::move(model)),
      layout_(layout),
      kv_dtype_(kv_dtype),
      sample_uploads_(nonnull(model_).device()),
      penalties_(model_->device(), model_->config().vocab_size) {}

Qwen3Runner::~Qwen3Runner() {
  abandon_launched();
#ifdef KILN_HAVE_CUDA
  for (void* e : launch_done_)
    if (e) cudaEventDestroy(static_cast<cudaEvent_t>(e));
#endif
}

void Qwen3Runner::release_request(uint64_t request) {
  penalties_.release(request);
  images_.release(request);
}

void Qwen3Runner::attach_images(uint64_t request, VlPromptLayout layout,
                                std::vector<vision::ImagePatches> images) {
  KILN_CHECK(model_->vision() != nullptr, "this model (", config().architecture,
             ") is text-only: it takes no images");
  images_.attach(request, std::move(layout), std::move(images));
}

const BatchDesc& Qwen3Runner::with_images(const BatchDesc& batch, BatchDesc& local, VisualInput& visual) {
  visual = VisualInput{};
  if (images_.empty() || model_->vision() == nullptr) return batch;
  local = batch;
  try {
    if (!images_.text_positions(local)) images_.prepare(local, *model_->vision(), visual, abandoned_);
  } catch (const VisionCancelled& e) {
    throw StepCancelled(e.what());
  }
  return local;
}

void Qwen3Runner::place_positions(BatchDesc& batch) const {
  if (config().mrope_section.empty()) return;
  if (!images_.text_positions(batch)) batch.set_text_mrope();
}

int64_t Qwen3Runner::kv_memory_budget(double mem_fraction) const {
  if (device().is_cpu()) return int64_t(mem_fraction * double(4 * kGiB));
#ifdef KILN_HAVE_CUDA
  KILN_CHECK(cudaSetDevice(device().index) == cudaSuccess, "cannot select ", device_name(device()));
  size_t free_b = 0, total_b = 0;
  KILN_CHECK(cudaMemGetInfo(&free_b, &total_b) == cudaSuccess, "cudaMemGetInfo failed");
  // The weights are loaded already: kiln may still take fraction * total minus what is in use, less a
  // reserve for activations, logits and graph pools.
  const int64_t used = int64_t(total_b) - int64_t(free_b);
  const int64_t reserve = std::min<int64_t>(2 * kGiB, int64_t(total_b) / 16);
  return std::max<int64_t>(0, int64_t(mem_fraction * double(total_b)) - used - reserve);
#else
  return 0;
#endif
}

void Qwen3Runner::allocate_kv(int32_t num_pages, int32_t page_size) {
  cache_ = std::make_unique<KvCache>(config(), num_pages, page_size, layout_, kv_dtype_, device());
  if (draft_) draft_->allocate_kv(num_pages, page_size, layout_);
}

void Qwen3Runner::set_draft(std::unique_ptr<Eagle3Model> draft) {
  KILN_CHECK(cache_ == nullptr && graphs_.empty(), "set_draft: before allocate_kv and prepare_graphs");
  KILN_CHECK(device().is_cpu() || env_switch("KILN_EAGLE3_CUDA", kEagle3OnCudaByDefault),
             "--speculative-algorithm EAGLE3 is switched off on CUDA (KILN_EAGLE3_CUDA=0); set "
             "KILN_EAGLE3_CUDA=1, or use --speculative-algorithm NGRAM");
  KILN_CHECK(config().mrope_section.empty() && config().arch != ModelArch::qwen3_embedding,
             "EAGLE-3 drafts for text generation models only, not ", config().architecture);
  const auto& l = draft->aux_layers();
  model_->set_aux_capture({l[0], l[1], l[2]});
  draft_ = std::move(draft);
}

void Qwen3Runner::draft_from_step(const BatchDesc& batch, const std::vector<int32_t>& step_rows,
                                  DraftOut* out) {
  KILN_CHECK(draft_ != nullptr, "this model runner has no EAGLE-3 draft");
  draft_->forward_features(batch, model_->aux_hidden(), step_rows, out);
}

void Qwen3Runner::draft_from_hidden(const BatchDesc& batch, const std::vector<float>& hidden, DraftOut* out) {
  KILN_CHECK(draft_ != nullptr, "this model runner has no EAGLE-3 draft");
  draft_->forward_hidden(batch, hidden, out);
}

void Qwen3Runner::draft_chain(const std::vector<BatchDesc>& passes, const std::vector<float>& hidden,
                              std::vector<std::vector<int32_t>>* tokens) {
  KILN_CHECK(draft_ != nullptr, "this model runner has no EAGLE-3 draft");
  draft_->forward_chain(passes, hidden, tokens);
}

void Qwen3Runner::set_draft_topk(int k) {
  if (!draft_) return ModelRunner::set_draft_topk(k);
  KILN_CHECK(k <= 1 || device().is_cpu() || env_switch("KILN_EAGLE3_TREE_CUDA", kEagle3TreeOnCudaByDefault),
             "--speculative-eagle-topk above 1 (tree drafting) has not run on a GPU yet and is off on CUDA; "
             "KILN_EAGLE3_TREE_CUDA=1 runs it, or use --speculative-eagle-topk 1 (chains)");
  draft_->set_topk(k);
}

void Qwen3Runner::check_kv_moves(const std::vector<int64_t>& from, const std::vector<int64_t>& to) const {
  KILN_CHECK(cache_ != nullptr, "Qwen3Runner: allocate_kv was not called");
  KvCache::check_slot_moves(from, to, cache_->num_slots());  // the draft's cache has the same page grid
}

void Qwen3Runner::move_kv(const std::vector<int64_t>& from, const std::vector<int64_t>& to) {
  check_kv_moves(from, to);
  cache_->move_slots(from, to);
  if (draft_) draft_->move_kv(from, to);
}

bool Qwen3Runner::uniform_draft_extend() const {
  return draft_ && (draft_->has_graphs() || env_switch("KILN_EAGLE3_UNIFORM_EXTEND", false));
}

Tensor Qwen3Runner::device_rows(Buffer& buf, int64_t rows, int64_t cols) {
  const size_t need = size_t(std::max<int64_t>(rows, 1) * cols) * sizeof(float);
  if (buf.bytes() < need) buf = Buffer(std::max(need, buf.bytes() * 2), device());
  return Tensor(buf.data(), DType::f32, {rows, cols}, device());
}

void Qwen3Runner::forward(const BatchDesc& batch, std::vector<float>* logits, std::vector<float>* hidden) {
  KILN_CHECK(cache_ != nullptr, "Qwen3Runner: allocate_kv was not called");
  const int64_t R = int64_t(batch.logit_rows.size());
  const int64_t V = config().vocab_size, H = config().hidden_size;
  BatchDesc local;
  VisualInput visual;
  const BatchDesc& b = with_images(batch, local, visual);
  const VisualInput* vis = visual.empty() ? nullptr : &visual;
  if (!hidden && logits && !vis) {
    if (CudaDecodeGraph* g = graph_for(b)) {
      const Tensor out = g->step(b);
      logits->resize(size_t(R * V));  // the copy waits for the replay (the graph's stream is blocking)
      copy_bytes(logits->data(), Device::cpu(), out.data, device(), size_t(R * V) * sizeof(float));
      return;
    }
  }
  // Both at once (a generative request asking for hidden states) runs the step twice; the second run
  // rewrites the same K/V values into the same slots. A step that wants neither (a prompt chunk before the
  // last) runs the LM head's forward, but an embedding model's the hidden one: it has no LM head.
  const bool no_head = config().arch == ModelArch::qwen3_embedding;
  if (hidden || (!logits && no_head)) {
    Tensor out = device_rows(hidden_buf_, R, H);
    model_->forward_hidden(b, *cache_, out, vis);
    if (hidden) {
      hidden->resize(size_t(R * H));
      copy_bytes(hidden->data(), Device::cpu(), out.data, device(), size_t(R * H) * sizeof(float));
    }
  }
  if (logits || (!hidden && !no_head)) {
    Tensor out = device_rows(logits_buf_, R, V);
    model_->forward(b, *cache_, out, vis);
    if (logits) {
      logits->resize(size_t(R * V));
      copy_bytes(logits->data(), Device::cpu(), out.data, device(), size_t(R * V) * sizeof(float));
    }
  }
  images_.step_done(b);
}

Tensor Qwen3Runner::forward_device(const BatchDesc& batch) {
  KILN_CHECK(cache_ != nullptr, "Qwen3Runner: allocate_kv was not called");
  if (CudaDecodeGraph* g = graph_for(batch)) return g->step(batch);
  Tensor out = device_rows(logits_buf_, int64_t(batch.logit_rows.size()), config().vocab_size);
  model_->forward(batch, *cache_, out);
  return out;
}

#ifdef KILN_HAVE_CUDA
namespace {

// The draws of R rows as the sampler leaves them: tokens [R] i32, logprobs [R] f32, top ids [R, top_n] i32,
// top logprobs [R, top_n] f32.
size_t draw_bytes(int64_t R, int top_n) {
  return size_t(R) * (2 + 2 * size_t(top_n)) * 4;
}
struct DrawLayout {
  int32_t* tokens;
  float* logprobs;
  int32_t* top_ids;  // null when top_n == 0
  float* top_logprobs;
};
DrawLayout draw_layout(void* base, int64_t R, int top_n) {
  char* b = static_cast<char*>(base);
  return {reinterpret_cast<int32_t*>(b), reinterpret_cast<float*>(b + size_t(R) * 4),
          top_n > 0 ? reinterpret_cast<int32_t*>(b + size_t(R) * 8) : nullptr,
          top_n > 0 ? reinterpret_cast<float*>(b + size_t(R) * (8 + 4 * size_t(top_n))) : nullptr};
}

void unpack_draws(void* host, int64_t R, int top_n, std::vector<ModelRunner::SampledRow>* out) {
  const DrawLayout d = draw_layout(host, R, top_n);
  out->assign(size_t(R), ModelRunner::SampledRow{});
  for (int64_t r = 0; r < R; ++r) {
    ModelRunner::SampledRow& o = (*out)[size_t(r)];
    o.token = d.tokens[r];
    o.logprob = d.logprobs[r];
    for (int64_t i = r * top_n; i < (r + 1) * top_n; ++i) {
      TokenLogprob t;
      t.id = d.top_ids[i];
      t.logprob = d.top_logprobs[i];
      o.top.push_back(t);
    }
  }
}

}  // namespace
#endif

bool Qwen3Runner::forward_sampled(const BatchDesc& batch, const std::vector<RowSampling>& rows, int top_n,
                                  std::vector<SampledRow>* out, const std::function<void()>& before_sample) {
#ifdef KILN_HAVE_CUDA
  if (!device().is_cuda()) return false;
  KILN_CHECK(cache_ != nullptr, "Qwen3Runner: allocate_kv was not called");
  const int64_t R = int64_t(batch.logit_rows.size());
  const int64_t V = config().vocab_size;
  KILN_CHECK_EQ(int64_t(rows.size()), R, "one RowSampling per logit row");
  KILN_CHECK(top_n >= 0 && top_n <= cuda::kMaxTopN, "top_n ", top_n, " out of range");
  BatchDesc local;
  VisualInput visual;
  const BatchDesc& b = with_images(batch, local, visual);
  CudaDecodeGraph* graph = visual.empty() ? graph_for(b) : nullptr;
  Tensor logits;
  if (graph) {
    logits = graph->step(b);
  } else {
    logits = device_rows(logits_buf_, R, V);
    model_->forward(b, *cache_, logits, visual.empty() ? nullptr : &visual);
    images_.step_done(b);
  }
  // The forward is queued: the GPU runs it while the engine finishes the step's grammar masks.
  if (before_sample) before_sample();
  out->assign(size_t(R), SampledRow{});
  if (R == 0) return true;
  const size_t out_bytes = draw_bytes(R, top_n);
  if (sample_out_buf_.bytes() < out_bytes) sample_out_buf_ = Buffer(out_bytes * 2, device());
  void* const stream_handle = graph ? graph->stream() : ops::current_stream();
  auto* stream = static_cast<cudaStream_t>(stream_handle);
  const bool processed = penalties_.apply(logits.ptr<float>(), V, rows, stream);
  sample_into(logits, rows, top_n, sample_out_buf_.data(), stream_handle);
  if (processed)  // the history grows on the device
    penalties_.count_sampled(draw_layout(sample_out_buf_.data(), R, top_n).tokens, R, stream);
  KILN_CHECK(cudaStreamSynchronize(stream) == cudaSuccess,
             "CUDA step or sampling failed: ", cudaGetErrorString(cudaGetLastError()));
  std::vector<char> host(out_bytes);
  copy_bytes(host.data(), Device::cpu(), sample_out_buf_.data(), device(), out_bytes);
  unpack_draws(host.data(), R, top_n, out);
  return true;
#else
  (void)batch;
  (void)rows;
  (void)top_n;
  (void)out;
  (void)before_sample;
  return false;
#endif
}

bool Qwen3Runner::launch_sampled(const BatchDesc& batch, const std::vector<RowSampling>& rows, int top_n,
                                 bool chained) {
  KILN_CHECK_EQ(rows.size(), batch.logit_rows.size(), "one RowSampling per logit row");
  for (const RowSampling& r : rows)
    if (r.proc && r.proc->active()) return false;  // the device penalties' history needs each step's draws
  if (!launch_forward(batch, top_n, chained)) return false;
  sample_launched(rows);
  return true;
}

bool Qwen3Runner::launch_forward(const BatchDesc& batch, int top_n, bool chained) {
#ifdef KILN_HAVE_CUDA
  if (!device().is_cuda() || launched_.size() >= 2) return false;
  KILN_CHECK(cache_ != nullptr, "Qwen3Runner: allocate_kv was not called");
  KILN_CHECK(launched_.empty() || launched_.back().sampled, "Qwen3Runner: a step launched before the one ",
             "launched last was sampled");
  const int64_t R = int64_t(batch.logit_rows.size());
  KILN_CHECK(top_n >= 0 && top_n <= cuda::kMaxTopN, "top_n ", top_n, " out of range");
  BatchDesc local;
  VisualInput visual;
  const BatchDesc& b = with_images(batch, local, visual);
  CudaDecodeGraph* graph = visual.empty() && R > 0 ? graph_for(b) : nullptr;
  if (!graph) return false;
  // A chained step reads the draws of the step launched before it: the same graph, so the same stream.
  if (chained && (launched_.empty() || launched_.back().graph != graph || launched_.back().rows < R))
    return false;
  const int slot = next_slot_;
  const size_t out_bytes = draw_bytes(R, top_n);
  if (launch_out_buf_[slot].bytes() < out_bytes) launch_out_buf_[slot] = Buffer(out_bytes * 2, device());
  launch_host_[slot].reserve(out_bytes);  // no copy into it in flight: its step was collected
  if (!launch_done_[slot]) {
    cudaEvent_t e = nullptr;
    KILN_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    launch_done_[slot] = e;
  }
  const int32_t* chain_tokens =
      chained ? static_cast<const int32_t*>(launch_out_buf_[launched_.back().slot].data()) : nullptr;
  const Tensor logits = graph->step(b, chain_tokens);
  launched_.push_back({R, top_n, slot, graph, logits, false});
  next_slot_ = 1 - slot;
  return true;
#else
  (void)batch;
  (void)top_n;
  (void)chained;
  return false;
#endif
}

void Qwen3Runner::sample_launched(const std::vector<RowSampling>& rows) {
  KILN_CHECK(!launched_.empty() && !launched_.back().sampled, "Qwen3Runner: no launched forward to sample");
#ifdef KILN_HAVE_CUDA
  Launched& l = launched_.back();
  KILN_CHECK_EQ(int64_t(rows.size()), l.rows, "one RowSampling per logit row");
  auto* stream = static_cast<cudaStream_t>(l.graph->stream());
  void* const out = launch_out_buf_[l.slot].data();
  // Queued behind the forward on the graph's stream; the rows' masks leave by an asynchronous copy, so the
  // host does not wait for the forward here. The parameters' buffer is shared with the step launched before:
  // its sampling, earlier on the same stream, has read it by the time this step's copy runs.
  const bool processed = penalties_.apply(l.logits.ptr<float>(), config().vocab_size, rows, stream);
  sample_into(l.logits, rows, l.top_n, out, l.graph->stream());
  if (processed) penalties_.count_sampled(draw_layout(out, l.rows, l.top_n).tokens, l.rows, stream);
  KILN_CUDA_CHECK(cudaMemcpyAsync(launch_host_[l.slot].data(), out, draw_bytes(l.rows, l.top_n),
                                  cudaMemcpyDeviceToHost, stream));
  KILN_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(launch_done_[l.slot]), stream));
  l.sampled = true;
#else
  (void)rows;
#endif
}

#ifdef KILN_HAVE_CUDA
// Sampling follows the step on its stream (the graph's own, or the eager one), its parameters copied while
// the step runs: the host waits once, for the sampled rows (a wait for the step, then a pageable copy of the
// parameters, cost a batch-1 serving step ~18 µs more; H200, 2026-12-03,
// `0546dfd`: bench/results/h200_prefill_wait_staged_inputs_2026-12-03.txt).
void Qwen3Runner::sample_into(const Tensor& logits, const std::vector<RowSampling>& rows, int top_n,
                              void* out, void* stream) {
  const int64_t R = int64_t(rows.size()), V = config().vocab_size;
  std::vector<cuda::SampleParams> hp(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) {
    const RowSampling& p = rows[size_t(r)];
    hp[size_t(r)] = {p.temperature, p.top_k, p.top_p, p.seed, p.step};
  }
  const size_t params_bytes = size_t(R) * sizeof(cuda::SampleParams);
  if (sample_params_buf_.bytes() < params_bytes) sample_params_buf_ = Buffer(params_bytes * 2, device());
  sample_uploads_.begin(StagedUploads::footprint(params_bytes), stream);
  sample_uploads_.copy(sample_params_buf_.data(), hp.data(), params_bytes);
  sample_uploads_.end();
  const DrawLayout d = draw_layout(out, R, top_n);
  cuda::sample(logits.ptr<float>(), V, R, V,
               static_cast<const cuda::SampleParams*>(sample_params_buf_.data()), d.tokens, d.logprobs, top_n,
               d.top_ids, d.top_logprobs, static_cast<cudaStream_t>(stream));
}
#endif

void Qwen3Runner::collect_sampled(std::vector<SampledRow>* out) {
  KILN_CHECK(!launched_.empty(), "Qwen3Runner::collect_sampled: no step in flight");
  KILN_CHECK(launched_.front().sampled, "Qwen3Runner::collect_sampled: the step's sampling was not queued");
#ifdef KILN_HAVE_CUDA
  const Launched l = launched_.front();
  launched_.erase(launched_.begin());
  const cudaError_t e = cudaEventSynchronize(static_cast<cudaEvent_t>(launch_done_[l.slot]));
  KILN_CHECK(e == cudaSuccess, "CUDA step or sampling failed: ", cudaGetErrorString(e));
  unpack_draws(launch_host_[l.slot].data(), l.rows, l.top_n, out);
#else
  (void)out;
#endif
}

void Qwen3Runner::abandon_launched() {
#ifdef KILN_HAVE_CUDA
  for (const Launched& l : launched_) {
    if (l.sampled) {
      cudaEventSynchronize(static_cast<cudaEvent_t>(launch_done_[l.slot]));
    } else {  // only its forward was queued: no event of its own yet
      cudaStreamSynchronize(static_cast<cudaStream_t>(l.graph->stream()));
    }
  }
#endif
  launched_.clear();
}

Qwen3RunnerSettings parse_qwen3_runner_settings(const EngineOptions& opts) {
  KILN_CHECK(!opts.model_dir.empty(), "no model directory given");
  Qwen3RunnerSettings st;
  LoadOptions& lo = st.load;
  lo.device = parse_device(opts.device);
#ifdef KILN_HAVE_CUDA
  const char* why = "";
#else
  const char* why = " (kiln was built without CUDA)";
#endif
  KILN_CHECK(!lo.device.is_cuda() || cuda_available(), "device ", opts.device,
             " asked for, but no GPU is usable", why);
  if (opts.load_format == "auto" || opts.load_format == "safetensors") {
    lo.load_format = LoadFormat::real;
  } else if (opts.load_format == "random") {
    lo.load_format = LoadFormat::random;
  } else {
    KILN_FAIL("bad load format '", opts.load_format, "': expected auto, safetensors or random");
  }
  lo.seed = opts.seed;
  lo.quantization = opts.quantization;
  lo.max_position = opts.max_context_len;  // 0: the config's max_context()
  lo.is_embedding = opts.is_embedding;
  if (opts.kv_layout == "nhd") {
    st.layout = ops::KvLayout::nhd;
  } else if (opts.kv_layout == "hnd") {
    st.layout = ops::KvLayout::hnd;
  } else {
    KILN_FAIL("bad KV layout '", opts.kv_layout, "': expected nhd or hnd");
  }
  KILN_CHECK(opts.kv_cache_dtype == "auto" || opts.kv_cache_dtype == "bf16" ||
                 opts.kv_cache_dtype == "fp16" || opts.kv_cache_dtype == "fp8_e4m3",
             "bad KV cache dtype '", opts.kv_cache_dtype, "': expected auto, bf16, fp16 or fp8_e4m3");
  st.kv_cache_dtype = opts.kv_cache_dtype;
  return st;
}

DType Qwen3RunnerSettings::kv_dtype(const ModelConfig& cfg) const {
  if (kv_cache_dtype == "bf16") return DType::bf16;
  if (kv_cache_dtype == "fp16") return DType::f16;
  if (kv_cache_dtype == "fp8_e4m3") return DType::f8e4m3;
  return cfg.dtype;
}

std::unique_ptr<Qwen3Runner> load_qwen3_runner(const EngineOptions& opts) {
  const Qwen3RunnerSettings st = parse_qwen3_runner_settings(opts);
  auto model = Qwen3Model::load(opts.model_dir, st.load);
  const DType kv = st.kv_dtype(model->config());
  std::unique_ptr<Eagle3Model> draft;
  if (opts.speculative.algorithm == spec::SpecAlgorithm::eagle3)
    draft = Eagle3Model::load(opts.speculative.draft_model_path, *model);
  auto runner = std::make_unique<Qwen3Runner>(std::move(model), st.layout, kv);
  if (draft) runner->set_draft(std::move(draft));
  return runner;
}

std::unique_ptr<Engine> Engine::create(const EngineOptions& opts) {
  std::unique_ptr<ModelRunner> runner = opts.tp > 1 ? make_tp_runner(opts) : load_qwen3_runner(opts);
  EngineOptions o = opts;
  if (o.max_prefill_chunk_ms < 0) o.max_prefill_chunk_ms = runner->device().is_cpu() ? 500 : 0;
  return std::make_unique<Engine>(std::move(runner), o);
}

}  // namespace kiln
