// Qwen3-Reranker: a Qwen3ForCausalLM checkpoint served as a reranker (`kiln serve --task rerank`; vLLM's
// `--task score` is accepted as the same). A (query, document) pair's relevance is
//   sigmoid(logit("yes") - logit("no"))
// at the last position of the model card's prompt:
//   <|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct
//   provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n
//   <Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}
//   <|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n
// (prefix, middle and suffix tokenized apart, as the model card does). The difference of the two logits is
// that of their log-probabilities, which the engine gives for just those two ids (Request::score_ids): no
// full logits row leaves the device. A query that already starts with "<|im_start|>" is taken as formatted
// by the client (vLLM's Qwen3-Reranker example formats query and document itself): the prompt is then
// query + document, tokenized as one text. "instruction" (a kiln extension) replaces the default
// instruction "Given a web search query, retrieve relevant passages that answer the query".
//
// Routes (rerank_route.cpp), each pair one prefill-only engine request, all batched by the engine:
//   POST /v1/rerank, /v2/rerank, /rerank (Jina / Cohere, as vLLM): {query, documents: [str | {text}], top_n?,
//     return_documents? (true), instruction?} -> {id, model, usage: {total_tokens}, results: [{index,
//     document?: {text}, relevance_score}]} sorted by score (descending, ties by index), top_n of them (0 or
//     absent: all).
//   POST /score, /v1/score (vLLM): {text_1: str | [str], text_2: str | [str], instruction?}: 1 x 1, 1 x N
//     or N x N pairs -> {id, object: "list", created, model, data: [{index, object: "score", score}],
//     usage}.
// At most kMaxRerankDocuments pairs per request (a 400 naming the limit past it).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/backend.h"

namespace kiln::server {

inline constexpr size_t kMaxRerankDocuments = 1024;

struct RerankSetup {
  int32_t yes_id = -1, no_id = -1;
  std::vector<int32_t> prefix, suffix;  // the template's parts around the instruction/query/document text
};

// The ids of "yes" and "no" (each one token, else kiln::Error) and the template's parts, from the tokenizer.
RerankSetup make_rerank_setup(const TextCodec& codec);

struct RerankSpec {
  bool score_shape = false;  // /score: vLLM's score reply, else the rerank reply
  std::string model;
  std::vector<std::string> queries;    // one per pair
  std::vector<std::string> documents;  // one per pair
  std::string instruction;
  size_t top_n = 0;  // 0: all
  bool return_documents = true;
};

RerankSpec parse_rerank_request(const nlohmann::json& body, bool score_shape, const std::string& served_name);
// The pair's prompt token ids (see above).
std::vector<int32_t> rerank_prompt(const RerankSetup& setup, const TextCodec& codec,
                                   const std::string& instruction, const std::string& query,
                                   const std::string& document);
// sigmoid(logprob(yes) - logprob(no)), in double.
double rerank_score(float yes_logprob, float no_logprob);
// The reply for the pairs' scores (same order as spec's pairs) and their prompt tokens in all.
nlohmann::json rerank_response(const RerankSpec& spec, const std::vector<double>& scores,
                               int64_t prompt_tokens, const std::string& id, int64_t created);

}  // namespace kiln::server
