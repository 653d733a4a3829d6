// Generation (/v1/chat/completions, /v1/completions, /generate) and /v1/embeddings handlers.
#include <algorithm>
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

// One choice of a generation request in flight. Touched only by the HTTP worker serving it (provider +
// releaser); the engine thread reaches only the request's EventQueue, through the shared_ptr its
// callback holds.
struct Session {
  Session(const TextCodec& codec, GenSpec s) : spec(std::move(s)), tracker(codec, spec), parser(spec.parse) {}
  GenSpec spec;
  OutputTracker tracker;
  OutputParser parser;  // chat streams: released text -> content / reasoning / tool-call deltas
  RequestId rid = 0;    // 0 until submitted
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

// A choice's closing frame when it finishes: its finish_reason (chat: after what the parser held back),
// an error frame if the engine failed it, or /generate's final object.
std::string stream_choice_end(Session& s, const TextCodec& codec) {
  const OutputTracker& t = s.tracker;
  if (t.finish_reason() == "error") return sse_frame(error_body(500, "generation failed: " + t.error()));
  std::string out;
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
      return sse_frame(generate_response(s.ctx, t, s.spec, codec,
                                         std::chrono::duration<double>(Clock::now() - s.start).count()));
  }
  if (s.spec.include_usage) chunk["usage"] = maybe_usage(s);
  return out + sse_frame(chunk);
}

using Group = std::vector<std::shared_ptr<Session>>;

std::vector<const OutputTracker*> trackers(const Group& g) {
  std::vector<const OutputTracker*> t;
  for (const auto& s : g) t.push_back(&s->tracker);
  return t;
}

bool any_error(const Group& g) {
  for (const auto& s : g)
    if (s->tracker.finish_reason() == "error") return true;
  return false;
}

// After every choice's end: the usage chunk (when asked; not after an error) and [DONE].
std::string stream_tail(const Group& g) {
  const Session& s = *g[0];
  if (!s.spec.include_usage || s.spec.endpoint == Endpoint::generate || any_error(g)) return sse_done();
  const char* object = s.spec.endpoint == Endpoint::chat ? "chat.completion.chunk" : "text_completion";
  json u = usage_chunk(s.ctx, object, s.tracker);
  u["usage"] = usage_json(trackers(g));
  return sse_frame(u) + sse_done();
}

std::string full_body(const Group& g, const TextCodec& codec) {
  for (const auto& s : g)
    if (s->tracker.finish_reason() == "error")
      return dump_json(error_body(500, "generation failed: " + s->tracker.error()));
  std::vector<json> bodies;
  for (const auto& s : g) {
    const double e2e = std::chrono::duration<double>(Clock::now() - s->start).count();
    switch (s->spec.endpoint) {
      case Endpoint::chat:
        bodies.push_back(chat_response(s->ctx, s->tracker, s->spec, codec));
        break;
      case Endpoint::completion:
        bodies.push_back(completion_response(s->ctx, s->tracker, s->spec, codec));
        break;
      case Endpoint::generate:
        bodies.push_back(generate_response(s->ctx, s->tracker, s->spec, codec, e2e));
        break;
    }
  }
  if (g.size() == 1) return dump_json(bodies[0]);
  if (g[0]->spec.endpoint == Endpoint::generate) return dump_json(json(bodies));  // SGLang: a list
  return dump_json(merge_choices(bodies, usage_json(trackers(g))));
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
  const GenSpec spec = ep == Endpoint::chat         ? parse_chat_request(body, codec, lim)
                       : ep == Endpoint::completion ? parse_completion_request(body, codec, lim)
                                                    : parse_generate_request(body, codec, lim);
  if (engine.is_embedding_model())
    throw bad_request("this model is an embedding model: use /v1/embeddings", "model");
  // n choices: n engine requests on one event queue; the later ones wait for the first's prefill and
  // reuse its cached prompt pages (Request::after_prefill_of).
  auto queue = std::make_shared<EventQueue>();
  ResponseCtx ctx;
  ctx.id = make_id(ep == Endpoint::chat ? "chatcmpl-" : ep == Endpoint::completion ? "cmpl-" : "");
  ctx.created = int64_t(std::time(nullptr));
  ctx.model = spec.model;
  Group group;
  for (int i = 0; i < spec.n; ++i) {
    GenSpec si = spec;
    if (ep == Endpoint::chat) si.parse.id_prefix = make_id("call_") + "_";
    auto s = std::make_shared<Session>(codec, std::move(si));
    s->ctx = ctx;
    s->ctx.index = i;
    group.push_back(std::move(s));
  }
  try {
    for (size_t i = 0; i < group.size(); ++i) {
      Session& s = *group[i];
      Request r;
      r.prompt = s.spec.prompt;
      r.sampling = s.spec.sampling;
      if (r.sampling.seed >= 0)
        r.sampling.seed = int64_t((uint64_t(r.sampling.seed) + i) & uint64_t(INT64_MAX));
      r.return_hidden = s.spec.return_hidden;
      r.after_prefill_of = i > 0 ? group[0]->rid : 0;
      s.rid = submit(std::move(r), [q = queue](const TokenEvent& e) { q->push(e); });
      on_accepted(s.rid);
    }
  } catch (...) {  // busy part-way: the choices already submitted go too
    for (const auto& s : group)
      if (s->rid != 0) {
        engine.abort(s->rid);
        on_ended(s->rid, Outcome::aborted);
      }
    throw;
  }

  const bool stream = spec.stream;
  auto provider = [this, group, queue, stream](size_t, httplib::DataSink& sink) -> bool {
    std::string out;
    Session& first = *group[0];
    if (!first.started) {
      first.started = true;
      if (stream && first.spec.endpoint == Endpoint::chat) {
        for (const auto& s : group) {
          json c = chat_chunk(s->ctx, {{"role", "assistant"}, {"content", ""}}, nullptr, nullptr);
          if (s->spec.include_usage) c["usage"] = maybe_usage(*s);
          out += sse_frame(c);
        }
      }
    }
    std::vector<TokenEvent> events;
    queue->wait_pop(events, out.empty() ? kPollInterval : std::chrono::milliseconds(0));
    if (sink.is_writable && !sink.is_writable()) return false;  // the client went away
    for (const auto& e : events) {
      auto it = std::find_if(group.begin(), group.end(), [&](const auto& s) { return s->rid == e.id; });
      if (it == group.end() || (*it)->tracker.finished()) continue;
      Session& s = **it;
      const Delta d = s.tracker.consume(e);
      if (s.tracker.stopped_by_string() && !s.abort_sent) {
        s.abort_sent = true;
        engine.abort(s.rid);  // the engine frees the pages; the client sees finish_reason "stop"
      }
      if (stream) out += stream_delta(s, d, codec);
      if (stream && s.tracker.finished()) out += stream_choice_end(s, codec);
    }
    const bool finished =
        std::all_of(group.begin(), group.end(), [](const auto& s) { return s->tracker.finished(); });
    if (finished) out += stream ? stream_tail(group) : full_body(group, codec);
    if (!out.empty() && !sink.write(out.data(), out.size())) return false;
    if (finished) sink.done();
    return true;
  };
  // Runs once, when the response is destroyed: after the last byte, or when the client went away or the
  // server stopped mid-way -- then the unfinished engine requests are aborted so their pages are freed.
  auto releaser = [this, group](bool) {
    for (const auto& s : group) {
      if (s->ended) continue;
      s->ended = true;
      if (!s->tracker.finished()) engine.abort(s->rid);
      on_ended(s->rid, outcome_of(s->tracker));
    }
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
