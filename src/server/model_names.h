// The names a request's "model" may carry, as vLLM accepts them: every --served-model-name (the first is the
// name responses echo and /metrics labels; all are listed by /v1/models), plus the --model argument as
// given and its directory's basename (accepted, not listed: a client configured with the checkpoint path
// or the hub id's last part still works). An unknown name is 404 model_not_found in OpenAI's shape.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace kiln::server {

struct ModelNames {
  std::vector<std::string> served;    // non-empty; served[0] is the primary name
  std::vector<std::string> accepted;  // further names a request may use (never listed)

  const std::string& primary() const { return served.front(); }
  bool accepts(const std::string& name) const;
};

// served: the --served-model-name values (empty: the model directory's basename, or "kiln").
// model_arg: --model as given. Duplicates are dropped; order is kept.
ModelNames make_model_names(const std::vector<std::string>& served, const std::string& model_arg);

// OpenAI's model object for one name (the shape of GET /v1/models/{id} and of each /v1/models entry).
nlohmann::json model_card(const std::string& id, int64_t created, int64_t max_model_len);

// The 404 body for a name that is not served: {"error": {..., "param": "model", "code": "model_not_found"}}.
nlohmann::json model_not_found_body(const std::string& name, const ModelNames& names);

}  // namespace kiln::server
