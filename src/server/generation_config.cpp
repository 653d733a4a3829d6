#include "server/generation_config.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "kiln/error.h"

namespace kiln::server {

using nlohmann::json;

namespace {

std::string num_text(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

// A finite number in [lo, hi] (lo excluded when lo_open), else a warning and nothing.
bool take_num(const json& j, const char* key, double lo, double hi, bool lo_open, GenerationDefaults& d,
              double& out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return false;
  if (!it->is_number() || !std::isfinite(it->get<double>()) || it->get<double>() < lo ||
      it->get<double>() > hi || (lo_open && it->get<double>() == lo)) {
    d.warnings.push_back(std::string(key) + " " + it->dump() + " is out of range: not applied");
    return false;
  }
  out = it->get<double>();
  d.applied.push_back(std::string(key) + "=" + num_text(out));
  return true;
}

}  // namespace

GenerationDefaults parse_generation_config(const std::string& text, int64_t vocab_size) {
  GenerationDefaults d;
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    KILN_FAIL("generation_config.json is not valid JSON: ", e.what());
  }
  KILN_CHECK(j.is_object(), "generation_config.json must hold a JSON object");
  double v = 0;
  if (take_num(j, "temperature", 0.0, 2.0, false, d, v)) d.sampling.temperature = float(v);
  if (take_num(j, "top_p", 0.0, 1.0, true, d, v)) d.sampling.top_p = float(v);
  if (take_num(j, "min_p", 0.0, 1.0, false, d, v)) d.sampling.min_p = float(v);
  if (auto it = j.find("top_k"); it != j.end() && !it->is_null()) {
    if (it->is_number_integer() && it->get<int64_t>() >= -1 && it->get<int64_t>() <= (1 << 30)) {
      const int64_t k = it->get<int64_t>();
      d.sampling.top_k = k == 0 ? -1 : int(k);
      d.applied.push_back("top_k=" + std::to_string(k));
    } else {
      d.warnings.push_back("top_k " + it->dump() + " is not an integer >= -1: not applied");
    }
  }
  if (take_num(j, "repetition_penalty", 0.0, 2.0, true, d, v)) d.sampling.repetition_penalty = float(v);
  if (auto it = j.find("eos_token_id"); it != j.end() && !it->is_null()) {
    const json ids = it->is_array() ? *it : json::array({*it});
    for (const auto& id : ids) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= vocab_size) {
        d.warnings.push_back("eos_token_id " + id.dump() + " is not a token id of this model: not applied");
        continue;
      }
      const auto t = int32_t(id.get<int64_t>());
      bool dup = false;
      for (int32_t e : d.eos_ids) dup = dup || e == t;
      if (!dup) d.eos_ids.push_back(t);
    }
    if (!d.eos_ids.empty()) d.applied.push_back("eos_token_id=" + json(d.eos_ids).dump());
  }
  return d;
}

GenerationDefaults load_generation_config(const std::string& model_dir, int64_t vocab_size) {
  const std::filesystem::path p = std::filesystem::path(model_dir) / "generation_config.json";
  std::ifstream in(p);
  if (!in) return {};
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_generation_config(ss.str(), vocab_size);
}

}  // namespace kiln::server
