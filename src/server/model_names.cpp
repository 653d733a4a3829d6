#include "server/model_names.h"

#include <algorithm>
#include <filesystem>

#include "server/api_error.h"

namespace kiln::server {

bool ModelNames::accepts(const std::string& name) const {
  return std::find(served.begin(), served.end(), name) != served.end() ||
         std::find(accepted.begin(), accepted.end(), name) != accepted.end();
}

ModelNames make_model_names(const std::vector<std::string>& served, const std::string& model_arg) {
  ModelNames m;
  auto add = [&](std::vector<std::string>& to, const std::string& name) {
    if (!name.empty() && !m.accepts(name)) to.push_back(name);
  };
  for (const auto& s : served) add(m.served, s);
  // "dir/" and "dir" name the same checkpoint: the basename of the normalized path.
  std::string base = std::filesystem::path(model_arg).lexically_normal().filename().string();
  if (base.empty())
    base = std::filesystem::path(model_arg).lexically_normal().parent_path().filename().string();
  if (base == "." || base == "..") base.clear();
  if (m.served.empty()) add(m.served, base.empty() ? std::string("kiln") : base);
  add(m.accepted, model_arg);
  add(m.accepted, base);
  return m;
}

nlohmann::json model_card(const std::string& id, int64_t created, int64_t max_model_len) {
  return {{"id", id},
          {"object", "model"},
          {"created", created},
          {"owned_by", "kiln"},
          {"root", id},
          {"parent", nullptr},
          {"max_model_len", max_model_len}};
}

nlohmann::json model_not_found_body(const std::string& name, const ModelNames& names) {
  return ApiError(404,
                  "The model '" + name + "' does not exist; this server serves '" + names.primary() + "'",
                  "model", "invalid_request_error", "model_not_found")
      .to_json();
}

}  // namespace kiln::server
