#include "server/rerank.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "kiln/error.h"
#include "server/api_error.h"
#include "server/protocol_fields.h"

namespace kiln::server {

using nlohmann::json;

namespace {

constexpr const char* kPrefix =
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the "
    "Instruct "
    "provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n";
constexpr const char* kSuffix = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";
constexpr const char* kDefaultInstruction =
    "Given a web search query, retrieve relevant passages that answer the query";

int32_t single_token(const TextCodec& codec, const char* word) {
  const std::vector<int32_t> ids = codec.encode(word);
  KILN_CHECK(ids.size() == 1, "--task rerank: the tokenizer encodes \"", word, "\" as ", ids.size(),
             " tokens; a Qwen3-Reranker's encodes it as one");
  return ids[0];
}

std::string text_item(const json& v, const std::string& param) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object())
    if (auto it = v.find("text"); it != v.end() && it->is_string()) return it->get<std::string>();
  throw bad_request("'" + param + "' must be a string or an object with a string 'text'", param);
}

std::vector<std::string> text_list(const json& v, const char* param) {
  std::vector<std::string> out;
  if (!v.is_array()) return {text_item(v, param)};
  if (v.empty()) throw bad_request(std::string("'") + param + "' must not be empty", param);
  if (v.size() > kMaxRerankDocuments)
    throw bad_request(std::string("'") + param + "' holds " + std::to_string(v.size()) +
                          " items; the limit is kMaxRerankDocuments = " + std::to_string(kMaxRerankDocuments),
                      param);
  for (size_t i = 0; i < v.size(); ++i)
    out.push_back(text_item(v[i], std::string(param) + "[" + std::to_string(i) + "]"));
  return out;
}

const json& required(const json& body, const char* name) {
  const json* v = given_field(body, name);
  if (!v) throw bad_request(std::string("'") + name + "' is required", name);
  return *v;
}

}  // namespace

RerankSetup make_rerank_setup(const TextCodec& codec) {
  RerankSetup s;
  s.yes_id = single_token(codec, "yes");
  s.no_id = single_token(codec, "no");
  s.prefix = codec.encode(kPrefix);
  s.suffix = codec.encode(kSuffix);
  return s;
}

RerankSpec parse_rerank_request(const json& body, bool score_shape, const std::string& served_name) {
  RerankSpec r;
  r.score_shape = score_shape;
  r.model = served_name;
  r.instruction = kDefaultInstruction;
  if (const json* v = given_field(body, "instruction")) {
    if (!v->is_string()) throw bad_request("'instruction' must be a string", "instruction");
    r.instruction = v->get<std::string>();
  }
  if (score_shape) {
    std::vector<std::string> a = text_list(required(body, "text_1"), "text_1");
    std::vector<std::string> b = text_list(required(body, "text_2"), "text_2");
    if (a.size() == 1) a.resize(b.size(), a[0]);  // one query against every text_2
    if (a.size() != b.size())
      throw bad_request("'text_1' and 'text_2' must have the same length (or 'text_1' one item), got " +
                            std::to_string(a.size()) + " and " + std::to_string(b.size()),
                        "text_2");
    r.queries = std::move(a);
    r.documents = std::move(b);
    return r;
  }
  const json& q = required(body, "query");
  if (!q.is_string()) throw bad_request("'query' must be a string", "query");
  const json& docs = required(body, "documents");
  if (!docs.is_array()) throw bad_request("'documents' must be a list", "documents");
  r.documents = text_list(docs, "documents");
  r.queries.assign(r.documents.size(), q.get<std::string>());
  if (const json* v = given_field(body, "top_n")) {
    if (!v->is_number_integer() || v->get<int64_t>() < 0)
      throw bad_request("'top_n' must be an integer >= 0, got " + v->dump(), "top_n");
    r.top_n = size_t(std::min<int64_t>(v->get<int64_t>(), int64_t(kMaxRerankDocuments)));
  }
  if (const json* v = given_field(body, "return_documents")) {
    if (!v->is_boolean()) throw bad_request("'return_documents' must be a boolean", "return_documents");
    r.return_documents = v->get<bool>();
  }
  return r;
}

std::vector<int32_t> rerank_prompt(const RerankSetup& setup, const TextCodec& codec,
                                   const std::string& instruction, const std::string& query,
                                   const std::string& document) {
  try {
    if (query.rfind("<|im_start|>", 0) == 0)
      return codec.encode(query + document);  // formatted by the client
    std::vector<int32_t> ids = setup.prefix;
    const std::vector<int32_t> mid =
        codec.encode("<Instruct>: " + instruction + "\n<Query>: " + query + "\n<Document>: " + document);
    ids.insert(ids.end(), mid.begin(), mid.end());
    ids.insert(ids.end(), setup.suffix.begin(), setup.suffix.end());
    return ids;
  } catch (const kiln::Error& e) {
    throw bad_request(std::string("the query or a document could not be tokenized: ") + e.what(),
                      "documents");
  }
}

double rerank_score(float yes_logprob, float no_logprob) {
  return 1.0 / (1.0 + std::exp(double(no_logprob) - double(yes_logprob)));
}

json rerank_response(const RerankSpec& spec, const std::vector<double>& scores, int64_t prompt_tokens,
                     const std::string& id, int64_t created) {
  if (spec.score_shape) {
    json data = json::array();
    for (size_t i = 0; i < scores.size(); ++i)
      data.push_back({{"index", i}, {"object", "score"}, {"score", scores[i]}});
    return {{"id", "score-" + id},
            {"object", "list"},
            {"created", created},
            {"model", spec.model},
            {"data", std::move(data)},
            {"usage",
             {{"prompt_tokens", prompt_tokens}, {"total_tokens", prompt_tokens}, {"completion_tokens", 0}}}};
  }
  std::vector<size_t> order(scores.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return scores[a] > scores[b]; });
  if (spec.top_n > 0 && spec.top_n < order.size()) order.resize(spec.top_n);
  json results = json::array();
  for (size_t i : order) {
    json r = {{"index", i}, {"relevance_score", scores[i]}};
    if (spec.return_documents) r["document"] = {{"text", spec.documents[i]}};
    results.push_back(std::move(r));
  }
  return {{"id", "rerank-" + id},
          {"model", spec.model},
          {"usage", {{"total_tokens", prompt_tokens}}},
          {"results", std::move(results)}};
}

}  // namespace kiln::server
