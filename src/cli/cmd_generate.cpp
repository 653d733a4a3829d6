// kiln generate: one sequence through the model (prefill, then one decode row per step) with a paged
// KV cache, sampled on the CPU. Greedy at temperature 0 (the default); stops at EOS or --max-tokens.
//   kiln generate --model DIR (--prompt TEXT | --prompt-ids 1,2,3) [--max-tokens N] [--temperature T]
//                 [--top-p P] [--top-k K] [--min-p P] [--seed S] [--json] [--device auto|cpu|cuda|cuda:N]
//                 [--load-format real|random] [--quantization none|fp8] [--kv-layout nhd|hnd]
//                 [--kv-dtype bf16|fp8_e4m3]
//                 [--page-size N] [--ignore-eos] [--tp N]
// --tp N: the model sharded over N ranks (runtime/tp_runner.h; CPU threads or GPUs cuda:N..), one process.
// --json prints {"ids", "text", "logprobs", "finish_reason", "prompt_tokens", timings} on one line;
// logprobs are the natural-log probabilities of each generated token under the raw model distribution.
// Otherwise the generated text goes to stdout and a timing line to stderr.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/flags.h"
#include "cli/tp_flags.h"
#include "kiln/error.h"
#include "kiln/tokenizer.h"
#include "model/qwen3.h"
#include "runtime/sampler.h"
#include "runtime/tp_runner.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// User-facing checks: the message alone (no "check failed: <expression>" prefix).
template <typename... A>
void require(bool ok, const A&... parts) {
  if (!ok) kiln::throw_error(kiln::detail::concat(parts...));
}

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && s[i] == ' ') ++i;
    size_t j = i;
    if (j < s.size() && s[j] == '-') ++j;
    while (j < s.size() && s[j] >= '0' && s[j] <= '9') ++j;
    const std::string num = s.substr(i, j - i);
    require(!num.empty() && num != "-" && num.size() <= 11,
            "--prompt-ids: expected comma-separated integers, got '", s, "'");
    const long long v = std::stoll(num);
    require(v >= INT32_MIN && v <= INT32_MAX, "--prompt-ids: ", num, " does not fit a token id");
    ids.push_back(int32_t(v));
    while (j < s.size() && s[j] == ' ') ++j;
    require(j == s.size() || s[j] == ',', "--prompt-ids: expected comma-separated integers, got '", s, "'");
    i = j + 1;
    require(j == s.size() || i < s.size(), "--prompt-ids: trailing comma in '", s, "'");
  }
  return ids;
}

// --device: kiln::parse_device's grammar; an explicit cuda needs a GPU.
kiln::Device device_arg(const std::string& s) {
  const kiln::Device d = kiln::parse_device(s);
  require(!d.is_cuda() || kiln::cuda_available(), "--device ", s,
          ": no CUDA device is available in this build or machine");
  return d;
}

// One step: `n` new tokens of the sequence starting at context position `start`; logits of the last one.
kiln::BatchDesc step_batch(const std::vector<int32_t>& seq, int32_t start, int32_t n, int page_size,
                           int32_t num_pages) {
  kiln::BatchDesc b;
  b.page_size = page_size;
  for (int32_t p = start; p < start + n; ++p) {
    b.tokens.push_back(seq[size_t(p)]);
    b.positions.push_back(p);
    b.slot_mapping.push_back(p);  // pages 0, 1, 2, ... in order: slot == position
  }
  b.cu_q = {0, n};
  b.kv_lens = {start + n};
  b.pages_stride = num_pages;
  for (int32_t i = 0; i < num_pages; ++i) b.page_table.push_back(i);
  b.logit_rows = {n - 1};
  return b;
}

int run_generate(const kiln::cli::Args& args) {
  const kiln::cli::Flags flags(
      args,
      {"model", "prompt", "prompt-ids", "max-tokens", "temperature", "top-p", "top-k", "min-p", "seed",
       "device", "load-format", "quantization", "kv-layout", "kv-dtype", "page-size", "tp"},
      {"json", "ignore-eos", "enable-expert-parallel"});
  require(flags.positional().empty(), "unexpected argument '", flags.positional()[0], "'");
  const std::string dir = flags.required("model");
  require(fs::is_directory(dir), "model directory '", dir, "' does not exist");
  require(flags.has("prompt") != flags.has("prompt-ids"), "give exactly one of --prompt and --prompt-ids");
  const int64_t max_tokens = flags.i64("max-tokens", 16);
  require(max_tokens > 0, "--max-tokens must be > 0, got ", max_tokens);
  const int64_t page_size = flags.i64("page-size", 16);
  require(page_size > 0 && page_size <= 1024, "--page-size must be in [1, 1024], got ", page_size);

  kiln::SamplingParams sp;
  sp.temperature = float(flags.f64("temperature", 0.0));
  sp.top_p = float(flags.f64("top-p", 1.0));
  const int64_t top_k = flags.i64("top-k", -1);
  require(top_k >= -1 && top_k <= INT32_MAX, "--top-k must be -1, 0 or positive, got ", top_k);
  sp.top_k = int(top_k);
  sp.min_p = float(flags.f64("min-p", 0.0));
  sp.seed = flags.i64("seed", 0);
  require(sp.seed >= 0, "--seed must be >= 0, got ", sp.seed);
  kiln::Sampler sampler(sp, 0);

  const std::string kv_layout = flags.str("kv-layout", "nhd");
  require(kv_layout == "nhd" || kv_layout == "hnd", "--kv-layout must be nhd or hnd, got '", kv_layout, "'");
  const std::string kv_dtype = flags.str("kv-dtype", "bf16");
  require(kv_dtype == "bf16" || kv_dtype == "fp8_e4m3", "--kv-dtype must be bf16 or fp8_e4m3, got '",
          kv_dtype, "'");
  const std::string load_format = flags.str("load-format", "real");
  require(load_format == "real" || load_format == "random", "--load-format must be real or random, got '",
          load_format, "'");

  kiln::LoadOptions lo;
  lo.device = device_arg(flags.str("device", "auto"));
  lo.load_format = load_format == "random" ? kiln::LoadFormat::random : kiln::LoadFormat::real;
  lo.quantization = flags.str("quantization", "none");
  const kiln::ModelConfig cfg = kiln::load_model_config(dir);
  require(cfg.arch != kiln::ModelArch::qwen3_embedding, "this is an embedding model: it does not generate");

  // The tokenizer is needed for --prompt; with --prompt-ids it is used for "text" when present.
  std::optional<kiln::Tokenizer> tok;
  if (flags.has("prompt") || fs::exists(fs::path(dir) / "tokenizer.json")) tok = kiln::Tokenizer::load(dir);
  std::vector<int32_t> prompt =
      flags.has("prompt") ? tok->encode(flags.str("prompt")) : parse_ids(flags.str("prompt-ids"));
  require(!prompt.empty(), "the prompt is empty");
  for (size_t i = 0; i < prompt.size(); ++i) {
    require(prompt[i] >= 0 && prompt[i] < cfg.vocab_size, "prompt token ", i, " has id ", prompt[i],
            ", outside the vocabulary [0, ", cfg.vocab_size, ")");
  }
  const int64_t context = int64_t(prompt.size()) + max_tokens;
  require(context <= cfg.max_context(), "prompt (", prompt.size(), " tokens) + --max-tokens (", max_tokens,
          ") = ", context, " exceeds the model's context of ", cfg.max_context(), " tokens");
  std::vector<int64_t> eos = cfg.eos_token_ids;
  if (eos.empty() && tok) {
    for (int32_t e : tok->eos_token_ids()) eos.push_back(e);
  }

  kiln::EngineOptions eo;  // --tp > 1: the tensor-parallel runner over the same options
  kiln::cli::read_tp_flags(flags, eo);
  const auto t_load = Clock::now();
  const int32_t num_pages = int32_t((context + page_size - 1) / page_size);
  std::unique_ptr<kiln::TpRunner> tp;
  std::unique_ptr<kiln::Qwen3Model> model;
  std::optional<kiln::KvCache> cache;
  if (eo.tp > 1) {
    eo.model_dir = dir;
    eo.device = kiln::device_name(lo.device);
    eo.load_format = load_format == "random" ? "random" : "auto";
    eo.quantization = lo.quantization;
    eo.kv_layout = kv_layout;
    eo.kv_cache_dtype = kv_dtype;
    tp = std::make_unique<kiln::TpRunner>(eo, kiln::tp_runner_options(eo));
    tp->allocate_kv(num_pages, int32_t(page_size));
  } else {
    model = kiln::Qwen3Model::load(dir, lo);
    cache.emplace(cfg, num_pages, int(page_size),
                  kv_layout == "nhd" ? kiln::ops::KvLayout::nhd : kiln::ops::KvLayout::hnd,
                  kv_dtype == "bf16" ? kiln::DType::bf16 : kiln::DType::f8e4m3, lo.device);
  }
  const double load_s = std::chrono::duration<double>(Clock::now() - t_load).count();

  kiln::Buffer dev_logits(size_t(cfg.vocab_size) * sizeof(float), lo.device);
  const kiln::Tensor logits_t = dev_logits.view(kiln::DType::f32, {1, cfg.vocab_size});
  std::vector<float> logits(static_cast<size_t>(cfg.vocab_size));

  std::vector<int32_t> seq = prompt, out_ids;
  std::vector<float> logprobs;
  std::string finish = "length";
  int32_t cached = 0;
  double prefill_s = 0, decode_s = 0;
  for (int64_t step = 0; step < max_tokens; ++step) {
    const auto t0 = Clock::now();
    const int32_t n = int32_t(seq.size()) - cached;
    kiln::BatchDesc b = step_batch(seq, cached, n, int(page_size), num_pages);
    if (!cfg.mrope_section.empty()) b.set_text_mrope();  // Qwen3-VL: text positions on all three axes
    if (tp) {
      tp->forward(b, &logits, nullptr);
    } else {
      model->forward(b, *cache, logits_t);
      kiln::copy_bytes(logits.data(), kiln::Device::cpu(), dev_logits.data(), lo.device,
                       logits.size() * sizeof(float));
    }
    cached += n;
    const kiln::Draw d = sampler.sample(logits);
    (step == 0 ? prefill_s : decode_s) += std::chrono::duration<double>(Clock::now() - t0).count();
    out_ids.push_back(d.token);
    logprobs.push_back(d.logprob);
    seq.push_back(d.token);
    if (!flags.flag("ignore-eos") && std::find(eos.begin(), eos.end(), int64_t(d.token)) != eos.end()) {
      finish = "stop";
      break;
    }
  }
  const std::string text = tok ? tok->decode(out_ids, /*skip_special_tokens=*/true) : std::string();
  const double decode_tps = out_ids.size() > 1 ? double(out_ids.size() - 1) / decode_s : 0.0;
  if (flags.flag("json")) {
    nlohmann::json j{{"ids", out_ids},
                     {"text", text},
                     {"logprobs", logprobs},
                     {"finish_reason", finish},
                     {"prompt_tokens", prompt.size()},
                     {"load_s", load_s},
                     {"prefill_s", prefill_s},
                     {"decode_tokens_per_s", decode_tps}};
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    std::printf("%s\n", text.c_str());
    std::fprintf(stderr,
                 "kiln generate: %zu prompt + %zu generated tokens (%s); load %.2f s, prefill %.3f s, decode "
                 "%.1f tok/s\n",
                 prompt.size(), out_ids.size(), finish.c_str(), load_s, prefill_s, decode_tps);
  }
  return 0;
}

}  // namespace

KILN_COMMAND("generate", "generate text from a prompt with one sequence (greedy by default)", run_generate);
