#include "runtime/qwen3_runner.h"

#include <algorithm>

#include "kiln/error.h"

#ifdef KILN_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace kiln {

namespace {
constexpr int64_t kGiB = int64_t(1) << 30;

Device parse_device(const std::string& s) {
  if (s == "auto") return cuda_available() ? Device::cuda(0) : Device::cpu();
  if (s == "cpu") return Device::cpu();
  if (s == "cuda") return Device::cuda(0);
  if (s.rfind("cuda:", 0) == 0) {
    const std::string n = s.substr(5);
    KILN_CHECK(!n.empty() && n.size() < 4 &&
                   std::all_of(n.begin(), n.end(), [](char c) { return c >= '0' && c <= '9'; }),
               "bad device '", s, "': expected cpu, cuda, cuda:N or auto");
    return Device::cuda(std::stoi(n));
  }
  KILN_FAIL("bad device '", s, "': expected cpu, cuda, cuda:N or auto");
}
}  // namespace

Qwen3Runner::Qwen3Runner(std::unique_ptr<Qwen3Model> model, ops::KvLayout layout, DType kv_dtype)
    : model_(std::move(model)), layout_(layout), kv_dtype_(kv_dtype) {
  KILN_CHECK(model_ != nullptr);
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
  // Both at once (a generative request asking for hidden states) runs the step twice; the second run
  // rewrites the same K/V values into the same slots.
  if (hidden) {
    Tensor out = device_rows(hidden_buf_, R, H);
    model_->forward_hidden(batch, *cache_, out);
    hidden->resize(size_t(R * H));
    copy_bytes(hidden->data(), Device::cpu(), out.data, device(), size_t(R * H) * sizeof(float));
  }
  if (logits || !hidden) {
    Tensor out = device_rows(logits_buf_, R, V);
    model_->forward(batch, *cache_, out);
    if (logits) {
      logits->resize(size_t(R * V));
      copy_bytes(logits->data(), Device::cpu(), out.data, device(), size_t(R * V) * sizeof(float));
    }
  }
}

std::unique_ptr<Qwen3Runner> load_qwen3_runner(const EngineOptions& opts) {
  KILN_CHECK(!opts.model_dir.empty(), "no model directory given");
  LoadOptions lo;
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
  lo.max_position = opts.max_context_len;  // 0: the config's max_position_embeddings
  ops::KvLayout layout;
  if (opts.kv_layout == "nhd") {
    layout = ops::KvLayout::nhd;
  } else if (opts.kv_layout == "hnd") {
    layout = ops::KvLayout::hnd;
  } else {
    KILN_FAIL("bad KV layout '", opts.kv_layout, "': expected nhd or hnd");
  }
  auto model = Qwen3Model::load(opts.model_dir, lo);
  DType kv = model->config().dtype;
  if (opts.kv_cache_dtype == "bf16") {
    kv = DType::bf16;
  } else if (opts.kv_cache_dtype == "fp16") {
    kv = DType::f16;
  } else if (opts.kv_cache_dtype == "fp8_e4m3") {
    kv = DType::f8e4m3;
  } else {
    KILN_CHECK(opts.kv_cache_dtype == "auto", "bad KV cache dtype '", opts.kv_cache_dtype,
               "': expected auto, bf16, fp16 or fp8_e4m3");
  }
  return std::make_unique<Qwen3Runner>(std::move(model), layout, kv);
}

std::unique_ptr<Engine> Engine::create(const EngineOptions& opts) {
  return std::make_unique<Engine>(load_qwen3_runner(opts), opts);
}

}  // namespace kiln
