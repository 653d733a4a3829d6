// POST /v1/rerank, /rerank, /score, /v1/score (server/rerank.h): every (query, document) pair is one
// prefill-only engine request asking the log-probabilities of "yes" and "no" at its last position; one JSON
// reply once all have ended (server/batched_source.h).
#include <ctime>

#include "server/api_error.h"
#include "server/batched_source.h"
#include "server/rerank.h"
#include "server/responses.h"

namespace kiln::server {

using nlohmann::json;

namespace {

struct RerankReply : BatchedSource {
  RerankReply(ApiServer::Impl& srv, RerankSpec sp) : BatchedSource(srv, "scoring"), spec(std::move(sp)) {
    scores.resize(spec.documents.size());
  }
  // A scored request ends "length" (it generates nothing) with the log-probabilities of {no, yes}.
  bool take(size_t i, const TokenEvent& e) override {
    if (e.score_logprobs.size() != 2) return false;
    scores[i] = rerank_score(e.score_logprobs[1], e.score_logprobs[0]);
    return true;
  }
  std::string reply() override {
    return dump_json(
        rerank_response(spec, scores, prompt_tokens(), server_.make_id(""), int64_t(std::time(nullptr))));
  }
  RerankSpec spec;
  std::vector<double> scores;
};

}  // namespace

void ApiServer::Impl::handle_rerank(const HttpRequest& req, HttpResponse& res, bool score_shape) {
  const json body = parse_body(req.body);
  if (!opts.rerank)
    throw bad_request("this server does not rerank: serve a Qwen3-Reranker checkpoint with --task rerank",
                      "model");
  std::string model;
  check_model(body, limits(), model);
  auto s = std::make_shared<RerankReply>(*this, parse_rerank_request(body, score_shape, model));
  std::vector<std::vector<int32_t>> prompts;  // all tokenized before the first submit
  for (size_t i = 0; i < s->spec.documents.size(); ++i)
    prompts.push_back(
        rerank_prompt(*opts.rerank, codec, s->spec.instruction, s->spec.queries[i], s->spec.documents[i]));
  // On a refusal mid-way, the destructor aborts and counts the pairs already submitted.
  for (auto& p : prompts) {
    Request r;
    r.prompt = std::move(p);
    r.sampling.temperature = 0.0f;
    r.sampling.max_new_tokens = 0;
    r.score_ids = {opts.rerank->no_id, opts.rerank->yes_id};
    s->submit(std::move(r));
  }
  res.source = std::move(s);
}

}  // namespace kiln::server
