// Generation (/v1/chat/completions, /v1/completions, /generate) and /v1/embeddings handlers.
#include <chrono>
#include <ctime>

#include "server/api_error.h"
#include "server/generation.h"
#include "server/responses.h"
#include "server/server_impl.h"

namespace kiln::server {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

constexpr auto kPollInterval = std::chrono::milliseconds(50);

// One generation request in flight. Touched only by the HTTP worker serving it (provider + releaser);
// the engine thread reaches only `queue`, through the shared_ptr its callback holds.
struct Session {
  Session(const TextCodec& codec, GenSpec s) : spec(std::move(s)), tracker(codec, spec), parser(spec.parse) {}
  GenSpec spec;
  OutputTracker tracker;
  OutputParser parser;  // chat streams: released text -> content / reasoning / tool-call deltas
  std::shared_ptr<EventQueue> queue = std::make_shared<EventQueue>();
  RequestId rid = 0;
  ResponseCtx ctx;
  Clock::time_point start = Clock::now();
  bool started = false;
  bool abort_sent = false;
  bool ended = false;
  size_t text_offset = 0;  // completions logprobs: byte offset of the next token's text
};

json maybe_usage(const Session& s) {
  if (s.spec.continuous_usage) return usage_json(s.tracker);
  return nullptr;
}

// SSE frames for what one event released.
std::string stream_delta(Session& s, const Delta& d, const TextCodec& codec) {
  const bool has_lp = s.spec.logprobs && !d.tokens.empty();
  if (d.text.empty() && !has_lp && s.spec.endpoint != Endpoint::generate) return "";
  json chunk;
  switch (s.spec.endpoint) {
    case Endpoint::chat: {
      const ParsedDelta pd = s.parser.feed(d.text);
      if (pd.empty() && !has_lp) return "";  // held back: a possible tag, or the inside of a call
      chunk =
          chat_chunk(s.ctx, chat_delta(pd), nullptr, has_lp ? chat_logprobs(d.tokens, codec) : json(nullptr));
      break;
    }
    case Endpoint::completion: {
      json lp = nullptr;
      if (has_lp) {
        lp = completion_logprobs(d.tokens, codec, s.text_offset);
        for (const auto& t : d.tokens) s.text_offset += codec.token_bytes(t.id).size();
      }
      chunk = completion_chunk(s.ctx, d.text, nullptr, lp);
      break;
    }
    case Endpoint::generate:
      if (d.ids.empty() && d.text.empty()) return "";
      if (s.tracker.finished()) return "";  // the final frame carries everything
      return sse_frame(generate_response(s.ctx, s.tracker, s.spec, codec,
                                         std::chrono::duration<double>(Clock::now() - s.start).count()));
  }
  if (s.spec.include_usage) chunk["usage"] = maybe_usage(s);
  return sse_frame(chunk);
}

// The closing frames: finish_reason, usage (when asked), an error frame if the engine failed, [DONE].
std::string stream_end(Session& s, const TextCodec& codec) {
  const OutputTracker& t = s.tracker;
  std::string out;
  if (t.finish_reason() == "error") {
    out += sse_frame(error_body(500, "generation failed: " + t.error()));
    return out + sse_done();
  }
  const double e2e = std::chrono::duration<double>(Clock::now() - s.start).count();
  json chunk;
  switch (s.spec.endpoint) {
    case Endpoint::chat: {
      const ParsedDelta rest = s.parser.finish();  // what the parser still held back
      if (!rest.empty()) {
        json c = chat_chunk(s.ctx, chat_delta(rest), nullptr, nullptr);
        if (s.spec.include_usage) c["usage"] = maybe_usage(s);
        out += sse_frame(c);
      }
      chunk = chat_chunk(s.ctx, json::object(), chat_finish_reason(t, s.parser.tool_call_count()), nullptr);
      break;
    }
    case Endpoint::completion:
      chunk = completion_chunk(s.ctx, "", finish_reason_json(t), nullptr);
      break;
    case Endpoint::generate:
      return sse_frame(generate_response(s.ctx, t, s.spec, codec, e2e)) + sse_done();
  }
  if (s.spec.include_usage) {
    chunk["usage"] = maybe_usage(s);
    out += sse_frame(chunk);
    out += sse_frame(usage_chunk(
        s.ctx, s.spec.endpoint == Endpoint::chat ? "chat.completion.chunk" : "text_completion", t));
  } else {
    out += sse_frame(chunk);
  }
  return out + sse_done();
}

std::string full_body(Session& s, const TextCodec& codec) {
  const OutputTracker& t = s.tracker;
  if (t.finish_reason() == "error") return dump_json(error_body(500, "generation failed: " + t.error()));
  const double e2e = std::chrono::duration<double>(Clock::now() - s.start).count();
  switch (s.spec.endpoint) {
    case Endpoint::chat:
      return dump_json(chat_response(s.ctx, t, s.spec, codec));
    case Endpoint::completion:
      return dump_json(completion_response(s.ctx, t, s.spec, codec));
    case Endpoint::generate:
      return dump_json(generate_response(s.ctx, t, s.spec, codec, e2e));
  }
  return "";
}

Outcome outcome_of(const OutputTracker& t) {
  if (!t.finished()) return Outcome::aborted;
  if (t.finish_reason() == "stop" || t.finish_reason() == "length") return Outcome::completed;
  if (t.finish_reason() == "error") return Outcome::error;
  return Outcome::aborted;
}

}  // namespace

void ApiServer::Impl::handle_generation(Endpoint ep, const httplib::Request& req, httplib::Response& res) {
  const json body = parse_body(req.body);
  const ApiLimits lim = limits();
  GenSpec spec = ep == Endpoint::chat         ? parse_chat_request(body, codec, lim)
                 : ep == Endpoint::completion ? parse_completion_request(body, codec, lim)
                                              : parse_generate_request(body, codec, lim);
  if (engine.is_embedding_model())
    throw bad_request("this model is an embedding model: use /v1/embeddings", "model");
  if (ep == Endpoint::chat) spec.parse.id_prefix = make_id("call_") + "_";
  auto s = std::make_shared<Session>(codec, std::move(spec));
  s->ctx.id = make_id(ep == Endpoint::chat ? "chatcmpl-" : ep == Endpoint::completion ? "cmpl-" : "");
  s->ctx.created = int64_t(std::time(nullptr));
  s->ctx.model = s->spec.model;

  Request r;
  r.prompt = s->spec.prompt;
  r.sampling = s->spec.sampling;
  r.return_hidden = s->spec.return_hidden;
  s->rid = submit(std::move(r), [q = s->queue](const TokenEvent& e) { q->push(e); });
  on_accepted(s->rid);

  const bool stream = s->spec.stream;
  auto provider = [this, s, stream](size_t, httplib::DataSink& sink) -> bool {
    std::string out;
    if (!s->started) {
      s->started = true;
      if (stream && s->spec.endpoint == Endpoint::chat) {
        json first = chat_chunk(s->ctx, {{"role", "assistant"}, {"content", ""}}, nullptr, nullptr);
        if (s->spec.include_usage) first["usage"] = maybe_usage(*s);
        out += sse_frame(first);
      }
    }
    std::vector<TokenEvent> events;
    s->queue->wait_pop(events, out.empty() ? kPollInterval : std::chrono::milliseconds(0));
    if (sink.is_writable && !sink.is_writable()) return false;  // the client went away
    for (const auto& e : events) {
      const Delta d = s->tracker.consume(e);
      if (s->tracker.stopped_by_string() && !s->abort_sent) {
        s->abort_sent = true;
        engine.abort(s->rid);  // the engine frees the pages; the client sees finish_reason "stop"
      }
      if (stream) out += stream_delta(*s, d, codec);
      if (s->tracker.finished()) break;
    }
    const bool finished = s->tracker.finished();
    if (finished) out += stream ? stream_end(*s, codec) : full_body(*s, codec);
    if (!out.empty() && !sink.write(out.data(), out.size())) return false;
    if (finished) sink.done();
    return true;
  };
  // Runs once, when the response is destroyed: after the last byte, or when the client went away or the
  // server stopped mid-way -- then the engine request is aborted so its pages are freed.
  auto releaser = [this, s](bool) {
    if (s->ended) return;
    s->ended = true;
    if (!s->tracker.finished()) engine.abort(s->rid);
    on_ended(s->rid, outcome_of(s->tracker));
  };
  if (stream) {
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
  }
  res.set_chunked_content_provider(stream ? "text/event-stream" : "application/json", provider, releaser);
}

void ApiServer::Impl::handle_embeddings(const httplib::Request& req, httplib::Response& res) {
  const json body = parse_body(req.body);
  const EmbedSpec spec = parse_embedding_request(body, codec, limits());
  if (!engine.is_embedding_model())
    throw bad_request(
        "this model does not produce embeddings: serve an embedding checkpoint (Qwen3-Embedding)", "model");
  auto queue = std::make_shared<EventQueue>();
  std::vector<RequestId> ids;
  auto end_all = [&](const std::vector<RequestId>& v, Outcome o) {
    for (RequestId id : v) on_ended(id, o);
  };
  try {
    for (const auto& input : spec.inputs) {
      Request r;
      r.prompt = input;
      r.embedding = true;
      r.sampling.max_new_tokens = 0;
      ids.push_back(submit(std::move(r), [queue](const TokenEvent& e) { queue->push(e); }));
      on_accepted(ids.back());
    }
  } catch (...) {
    for (RequestId id : ids) engine.abort(id);
    end_all(ids, Outcome::aborted);
    throw;
  }
  // Embedding requests are one forward each: wait for all of them (no token stream to watch).
  std::vector<std::vector<float>> vecs(ids.size());
  std::vector<bool> done(ids.size(), false);
  size_t remaining = ids.size();
  int64_t prompt_tokens = 0;
  std::string error;
  bool aborted = false;
  while (remaining > 0) {
    std::vector<TokenEvent> events;
    queue->wait_pop(events, kPollInterval);
    for (const auto& e : events) {
      if (!e.finished) continue;
      for (size_t i = 0; i < ids.size(); ++i) {
        if (ids[i] != e.id || done[i]) continue;
        done[i] = true;
        --remaining;
        const Outcome o = e.finish_reason == "error"   ? Outcome::error
                          : e.finish_reason == "abort" ? Outcome::aborted
                                                       : Outcome::completed;
        on_ended(ids[i], o);
        if (o == Outcome::error) error = e.error;
        if (o == Outcome::aborted) aborted = true;
        prompt_tokens += e.prompt_tokens > 0 ? e.prompt_tokens : int64_t(spec.inputs[i].size());
        vecs[i] = shape_embedding(e.embedding, spec.dimensions);
      }
    }
  }
  if (!error.empty()) {
    send_error(res, 500, error_body(500, "embedding failed: " + error));
    return;
  }
  if (aborted) {
    send_error(res, 503, error_body(503, "the request was aborted (server shutting down)"));
    return;
  }
  res.set_content(dump_json(embeddings_response(spec.model, vecs, spec.base64, prompt_tokens)),
                  "application/json");
}

}  // namespace kiln::server
