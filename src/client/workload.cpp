#include "client/workload.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "kiln/error.h"

namespace kiln::client {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::vector<TextPrompt> load_prompts(const std::string& path) {
  std::ifstream in(path);
  KILN_CHECK(in.good(), "cannot open prompts file '", path, "'");
  std::vector<TextPrompt> out;
  std::string line;
  size_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    TextPrompt p;
    if (line.front() == '{') {
      const auto j = nlohmann::json::parse(line, nullptr, false);
      KILN_CHECK(!j.is_discarded() && j.is_object(), path, ":", lineno, ": not valid JSON");
      KILN_CHECK(j.contains("prompt") && j["prompt"].is_string(), path, ":", lineno,
                 ": needs a string \"prompt\"");
      p.text = j["prompt"].get<std::string>();
      if (j.contains("input_tokens")) {
        KILN_CHECK(j["input_tokens"].is_number_integer() && j["input_tokens"].get<int64_t>() > 0, path, ":",
                   lineno, ": \"input_tokens\" must be a positive integer");
        p.input_tokens = j["input_tokens"].get<int64_t>();
      }
    } else {
      p.text = line;
    }
    KILN_CHECK(!p.text.empty(), path, ":", lineno, ": empty prompt");
    try {
      (void)nlohmann::json(p.text).dump();  // requests are JSON: the text must be valid UTF-8
    } catch (const nlohmann::json::exception&) {
      KILN_FAIL(path, ":", lineno, ": prompt is not valid UTF-8");
    }
    out.push_back(std::move(p));
  }
  KILN_CHECK(!out.empty(), "prompts file '", path, "' holds no prompts");
  return out;
}

std::vector<RequestSpec> make_requests(const Workload& w, uint64_t tag, size_t n) {
  KILN_CHECK(w.output_len > 0, "output length must be positive, got ", w.output_len);
  std::vector<RequestSpec> out(n);
  const uint64_t stream = splitmix64(w.seed ^ splitmix64(tag));
  if (!w.texts.empty()) {
    const size_t offset = size_t(stream % w.texts.size());
    for (size_t i = 0; i < n; ++i) {
      const TextPrompt& p = w.texts[(offset + i) % w.texts.size()];
      out[i].text = p.text;
      out[i].expected_input = p.input_tokens;
      out[i].output_len = w.output_len;
    }
    return out;
  }
  KILN_CHECK(w.input_len > 0, "input length must be positive, got ", w.input_len);
  KILN_CHECK(w.vocab_lo >= 0 && w.vocab_lo < w.vocab_hi, "bad token id range [", w.vocab_lo, ", ", w.vocab_hi,
             ")");
  const uint64_t span = uint64_t(w.vocab_hi - w.vocab_lo);
  for (size_t i = 0; i < n; ++i) {
    uint64_t x = splitmix64(stream + i);
    out[i].input_ids.resize(size_t(w.input_len));
    for (auto& id : out[i].input_ids) {
      x = splitmix64(x);
      id = int32_t(w.vocab_lo + int64_t(x % span));
    }
    out[i].expected_input = w.input_len;
    out[i].output_len = w.output_len;
    if (!w.image_b64.empty()) {
      out[i].input_ids.insert(out[i].input_ids.end(), w.image_tokens.begin(), w.image_tokens.end());
      out[i].image_b64 = w.image_b64;
      out[i].expected_input = -1;
    }
  }
  return out;
}

std::string base64_encode(const std::string& bytes) {
  static constexpr char t[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  auto at = [&](size_t k) { return k < bytes.size() ? uint32_t(uint8_t(bytes[k])) : 0u; };
  for (; i < bytes.size(); i += 3) {
    const uint32_t v = (at(i) << 16) | (at(i + 1) << 8) | at(i + 2);
    out += t[(v >> 18) & 63];
    out += t[(v >> 12) & 63];
    out += i + 1 < bytes.size() ? t[(v >> 6) & 63] : '=';
    out += i + 2 < bytes.size() ? t[v & 63] : '=';
  }
  return out;
}

}  // namespace kiln::client
