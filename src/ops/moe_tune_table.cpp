// The MoE tuner's cache file (see moe_tune_table.h).
#include "ops/moe_tune_table.h"

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "kiln/atomic_file.h"

namespace kiln::ops {
namespace {

// A whole decimal number in [lo, hi], nothing else.
bool parse_int(const std::string& s, int64_t lo, int64_t hi, int64_t& out) {
  if (s.empty() || s.size() > 18) return false;
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (*end != '\0' || v < lo || v > hi) return false;
  out = int64_t(v);
  return true;
}

// "name=value" with this name: the value.
bool field(const std::string& tok, const char* name, std::string& value) {
  const std::string prefix = std::string(name) + "=";
  if (tok.compare(0, prefix.size(), prefix) != 0) return false;
  value = tok.substr(prefix.size());
  return true;
}

constexpr int64_t kMaxSize = int64_t(1) << 30;

}  // namespace

std::string MoeTuneKey::text() const {
  std::string name = gpu.empty() ? "unknown" : gpu;
  for (char& c : name)
    if (c == ' ' || c == '\t' || c == '=' || c == '#') c = '_';
  std::ostringstream os;
  os << "gpu=" << name << " sms=" << sms << " E=" << shape.E << " L=" << shape.local << " k=" << shape.k
     << " H=" << shape.H << " I=" << shape.I << " experts=" << (shape.fp8 ? "fp8" : "bf16")
     << " below=" << below;
  return os.str();
}

std::string format_moe_tune_line(const MoeTuneKey& key, const MoeTuneEntry& e) {
  std::ostringstream os;
  os << key.text() << " grouped_from=" << e.grouped_from;
  if (!e.times.tokens.empty()) {
    const auto list = [&](const char* name, const std::vector<double>& us) {
      os << "; " << name;
      char buf[32];
      for (const double v : us) {
        std::snprintf(buf, sizeof buf, " %.1f", v);
        os << buf;
      }
    };
    os << "  # T";
    for (const int64_t t : e.times.tokens) os << ' ' << t;
    list("gemv us", e.times.gemv_us);
    list("grouped us", e.times.grouped_us);
  }
  return os.str();
}

bool parse_moe_tune_line(const std::string& line, MoeTuneKey& key, MoeTuneEntry& e) {
  std::istringstream in(line.substr(0, line.find('#')));
  std::vector<std::string> toks;
  for (std::string t; in >> t;) toks.push_back(t);
  if (toks.size() != 10) return false;
  std::string v;
  if (!field(toks[0], "gpu", v) || v.empty()) return false;
  key = {};
  key.gpu = v;
  int64_t* const nums[] = {&key.sms,     &key.shape.E, &key.shape.local,
                           &key.shape.k, &key.shape.H, &key.shape.I};
  const char* const names[] = {"sms", "E", "L", "k", "H", "I"};
  for (size_t i = 0; i < 6; ++i)
    if (!field(toks[i + 1], names[i], v) || !parse_int(v, 1, kMaxSize, *nums[i])) return false;
  if (!field(toks[7], "experts", v) || (v != "fp8" && v != "bf16")) return false;
  key.shape.fp8 = v == "fp8";
  if (!field(toks[8], "below", v) || !parse_int(v, 2, kMaxSize, key.below)) return false;
  e = {};
  if (!field(toks[9], "grouped_from", v) || !parse_int(v, 1, key.below, e.grouped_from)) return false;
  return key.shape.local <= key.shape.E && key.shape.k <= key.shape.E;
}

MoeTuneCache load_moe_tune_cache(const std::string& path) {
  std::ifstream in(path);
  if (!in) return {};
  MoeTuneCache cache;
  std::string line;
  if (!std::getline(in, line) || line != kMoeTuneCacheFormat) {
    std::fprintf(stderr, "kiln: MoE threshold cache %s does not start with '%s': ignored (re-tuned)\n",
                 path.c_str(), kMoeTuneCacheFormat);
    return {};
  }
  for (int64_t n = 2; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    MoeTuneKey key;
    MoeTuneEntry e;
    if (!parse_moe_tune_line(line, key, e)) {
      std::fprintf(stderr, "kiln: MoE threshold cache %s: line %lld is malformed: ignored (re-tuned)\n",
                   path.c_str(), static_cast<long long>(n));
      return {};
    }
    cache[key] = e;
  }
  return cache;
}

bool save_moe_tune_cache(const std::string& path, const MoeTuneCache& cache) {
  try {
    const std::filesystem::path p(path);
    if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
    write_file_atomically(path, [&](std::ostream& out) {
      out << kMoeTuneCacheFormat << "\n";
      for (const auto& [key, e] : cache) out << format_moe_tune_line(key, e) << "\n";
    });
    return true;
  } catch (const std::exception& ex) {  // a read-only home still runs, just re-tunes next start
    std::fprintf(stderr, "kiln: could not save the MoE threshold cache: %s\n", ex.what());
    return false;
  }
}

std::string moe_tune_cache_path(const std::string& tactic_cache_path) {
  return tactic_cache_path + ".moe";
}

}  // namespace kiln::ops
