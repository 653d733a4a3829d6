// Flags shared by `kiln bench serve` and `kiln bench ab`: the workload and how requests are sent.
#pragma once

#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "cli/flags.h"
#include "client/serve_bench.h"
#include "client/workload.h"
#include "kiln/error.h"

namespace kiln::cli {

inline const std::set<std::string> kWorkloadFlags = {
    "api",         "model",   "input-len",    "output-len",        "seed",
    "vocab-range", "prompts", "warmups",      "warmup-output-len", "timeout",
    "api-key",     "image",   "image-tokens", "json-schema"};
inline const std::set<std::string> kWorkloadBoolFlags = {"no-flush", "no-progress"};

inline constexpr const char* kWorkloadHelp =
    "  --api generate|completions   /generate with input_ids (default for random prompts) or "
    "/v1/completions\n"
    "                               (default with --prompts; random prompts go as a token-id list)\n"
    "  --model NAME                 model field for /v1/completions (default: /v1/models' first id)\n"
    "  --input-len N --output-len N random prompt length and exact output length (ignore_eos); 1024 / 128\n"
    "  --seed N                     prompt seed (default 1); --vocab-range LO:HI token ids (default "
    "1000:30000)\n"
    "  --prompts FILE               text prompts, one per line or JSONL {\"prompt\", \"input_tokens\"?}\n"
    "  --warmups N                  warm-up requests per window (default max(64, C)); --warmup-output-len N "
    "(16)\n"
    "  --no-flush                   do not POST /flush_cache after the warm-ups\n"
    "  --timeout S                  per-request timeout in seconds (default 3600); --api-key KEY\n"
    "  --no-progress                no progress bar (it is drawn only on a terminal anyway)\n"
    "  --image FILE                 send this image (PNG/JPEG/WebP) with every request as /generate "
    "image_data\n"
    "                               (random prompts only), its placeholder appended to each prompt\n"
    "  --image-tokens S,P,E         placeholder ids: vision start, image pad, vision end (default "
    "Qwen3-VL's\n"
    "                               151652,151655,151653)\n"
    "  --json-schema FILE           constrain every request by this JSON Schema (/generate "
    "sampling_params.json_schema,\n"
    "                               /v1/completions response_format); pick one whose outputs cannot end "
    "before\n"
    "                               --output-len tokens (a grammar that ends stops its request: "
    "bench/grammar/"
    "long_output.json)\n";

inline std::vector<int64_t> parse_int_list(const std::string& s, const std::string& flag) {
  std::vector<int64_t> out;
  size_t pos = 0;
  while (pos <= s.size()) {
    const size_t comma = s.find(',', pos);
    const std::string item = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    KILN_CHECK(!item.empty() && item.size() < 10 && item.find_first_not_of("0123456789") == std::string::npos,
               "--", flag, " needs positive integers separated by commas, got '", s, "'");
    out.push_back(std::stoll(item));
    KILN_CHECK(out.back() > 0, "--", flag, " values must be positive, got '", s, "'");
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

inline client::SweepOptions workload_from_flags(const Flags& f) {
  client::SweepOptions o;
  client::Workload& w = o.workload;
  w.input_len = f.i64("input-len", 1024);
  w.output_len = f.i64("output-len", 128);
  KILN_CHECK(w.input_len > 0 && w.output_len > 0, "--input-len and --output-len must be positive");
  w.seed = uint64_t(f.i64("seed", 1));
  if (f.has("vocab-range")) {
    const std::string r = f.str("vocab-range");
    const size_t colon = r.find(':');
    const std::string lo = colon == std::string::npos ? "" : r.substr(0, colon);
    const std::string hi = colon == std::string::npos ? "" : r.substr(colon + 1);
    auto ok = [](const std::string& x) {
      return !x.empty() && x.size() < 10 && x.find_first_not_of("0123456789") == std::string::npos;
    };
    KILN_CHECK(ok(lo) && ok(hi), "--vocab-range needs LO:HI (non-negative integers), got '", r, "'");
    w.vocab_lo = int32_t(std::stol(lo));
    w.vocab_hi = int32_t(std::stol(hi));
    KILN_CHECK(w.vocab_lo < w.vocab_hi, "--vocab-range LO must be below HI, got '", r, "'");
  }
  if (f.has("prompts")) w.texts = client::load_prompts(f.str("prompts"));
  const std::string api = f.str("api", w.texts.empty() ? "generate" : "completions");
  o.run.stream.api = client::parse_api(api);
  if (f.has("image")) {
    KILN_CHECK(o.run.stream.api == client::Api::generate && w.texts.empty(),
               "--image goes with random prompts over /generate (image_data); not with --prompts or --api "
               "completions");
    std::ifstream in(f.str("image"), std::ios::binary);
    KILN_CHECK(in.good(), "--image: cannot read ", f.str("image"));
    w.image_b64 = client::base64_encode(std::string(std::istreambuf_iterator<char>(in), {}));
    KILN_CHECK(!w.image_b64.empty(), "--image: ", f.str("image"), " is empty");
  }
  if (f.has("image-tokens")) {
    const auto ids = parse_int_list(f.str("image-tokens"), "image-tokens");
    KILN_CHECK(ids.size() == 3, "--image-tokens needs 3 ids (vision start, image pad, vision end)");
    w.image_tokens.assign(ids.begin(), ids.end());
  }
  if (f.has("json-schema")) {
    std::ifstream in(f.str("json-schema"), std::ios::binary);
    KILN_CHECK(in.good(), "--json-schema: cannot read ", f.str("json-schema"));
    std::string text(std::istreambuf_iterator<char>(in), {});
    KILN_CHECK(nlohmann::json::accept(text), "--json-schema: ", f.str("json-schema"), " is not JSON");
    o.run.stream.json_schema = std::move(text);
  }
  o.run.stream.model = f.str("model");
  o.run.api_key = f.str("api-key");
  o.run.timeout_s = f.f64("timeout", 3600);
  KILN_CHECK(o.run.timeout_s > 0, "--timeout must be positive");
  o.run.progress = !f.flag("no-progress");
  o.warmups = f.i64("warmups", -1);
  KILN_CHECK(o.warmups >= -1, "--warmups must be >= 0");
  o.warmup_output_len = f.i64("warmup-output-len", -1);
  o.flush_cache = !f.flag("no-flush");
  return o;
}

}  // namespace kiln::cli
