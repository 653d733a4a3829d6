// Generation (/v1/chat/completions, /v1/completions, /generate) and /v1/embeddings handlers. Each parses and
// submits on a worker thread and returns a ResponseSource (server/http_transport.h) that the connection
// pulls on its I/O thread whenever the engine's callback wakes it.
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

// One generation request in flight. Touched only by its connection (pull, finish, on its I/O thread); the
// engine thread reaches only `queue` and `wake`, through the shared_ptrs its callback holds.
struct Session : ResponseSource {
  Session(ApiServer::Impl& srv, GenSpec s)
      : server(srv), spec(std::move(s)), tracker(srv.codec, spec), parser(spec.parse) {}
  ~Session() override { finish(false); }  // a response dropped before the transport took it

  void attach(std::function<void()> fn) override { wake->arm(std::move(fn)); }
  bool pull(std::string& out, HttpResponse& res) override;
  void finish(bool complete) override;

  ApiServer::Impl& server;
  GenSpec spec;
  OutputTracker tracker;
  OutputParser parser;  // chat streams: released text -> content / reasoning / tool-call deltas
  std::shared_ptr<EventQueue> queue = std::make_shared<EventQueue>();
  std::shared_ptr<WakeRelay> wake = std::make_shared<WakeRelay>();
  bool submitted = false;
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

bool Session::pull(std::string& out, HttpResponse&) {
  const TextCodec& codec = server.codec;
  const bool stream = spec.stream;
  if (!started) {
    started = true;
    if (stream && spec.endpoint == Endpoint::chat) {
      json first = chat_chunk(ctx, {{"role", "assistant"}, {"content", ""}}, nullptr, nullptr);
      if (spec.include_usage) first["usage"] = maybe_usage(*this);
      out += sse_frame(first);
    }
  }
  std::vector<TokenEvent> events;
  queue->wait_pop(events, std::chrono::milliseconds(0));
  for (const auto& e : events) {
    const Delta d = tracker.consume(e);
    if (tracker.stopped_by_string() && !abort_sent) {
      abort_sent = true;
      server.engine.abort(rid);  // the engine frees the pages; the client sees finish_reason "stop"
    }
    if (stream) out += stream_delta(*this, d, codec);
    if (tracker.finished()) break;
  }
  if (!tracker.finished()) return false;
  out += stream ? stream_end(*this, codec) : full_body(*this, codec);
  return true;
}

// Once, when the transport is done with the response: after the last byte, or when the client went away or
// the server stopped mid-way -- then the engine request is aborted so its pages are freed.
void Session::finish(bool) {
  if (ended || !submitted) return;
  ended = true;
  wake->disarm();
  if (!tracker.finished()) server.engine.abort(rid);
  server.on_ended(rid, outcome_of(tracker));
}

}  // namespace

void ApiServer::Impl::handle_generation(Endpoint ep, const HttpRequest& req, HttpResponse& res) {
  const json body = parse_body(req.body);
  const ApiLimits lim = limits();
  GenSpec spec = ep == Endpoint::chat         ? parse_chat_request(body, codec, lim)
                 : ep == Endpoint::completion ? parse_completion_request(body, codec, lim)
                                              : parse_generate_request(body, codec, lim);
  if (engine.is_embedding_model())
    throw bad_request("this model is an embedding model: use /v1/embeddings", "model");
  if (ep == Endpoint::chat) spec.parse.id_prefix = make_id("call_") + "_";
  auto s = std::make_shared<Session>(*this, std::move(spec));
  s->ctx.id = make_id(ep == Endpoint::chat ? "chatcmpl-" : ep == Endpoint::completion ? "cmpl-" : "");
  s->ctx.created = int64_t(std::time(nullptr));
  s->ctx.model = s->spec.model;

  Request r;
  r.prompt = s->spec.prompt;
  r.sampling = s->spec.sampling;
  r.return_hidden = s->spec.return_hidden;
  s->rid = submit(std::move(r), [q = s->queue, w = s->wake](const TokenEvent& e) {
    q->push(e);
    w->wake();
  });
  s->submitted = true;
  on_accepted(s->rid);

  const bool stream = s->spec.stream;
  if (stream) {
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
  }
  res.content_type = stream ? "text/event-stream" : "application/json";
  res.stream = stream;
  res.source = std::move(s);
}

namespace {

// The inputs of one /v1/embeddings request, each its own engine request; one JSON reply once all are done.
struct EmbedSession : ResponseSource {
  EmbedSession(ApiServer::Impl& srv, EmbedSpec sp) : server(srv), spec(std::move(sp)) {}
  ~EmbedSession() override { finish(false); }

  void attach(std::function<void()> fn) override { wake->arm(std::move(fn)); }
  bool pull(std::string& out, HttpResponse& res) override;
  void finish(bool complete) override;

  ApiServer::Impl& server;
  EmbedSpec spec;
  std::shared_ptr<EventQueue> queue = std::make_shared<EventQueue>();
  std::shared_ptr<WakeRelay> wake = std::make_shared<WakeRelay>();
  std::vector<RequestId> ids;
  std::vector<std::vector<float>> vecs;
  std::vector<bool> done;
  size_t remaining = 0;
  int64_t prompt_tokens = 0;
  std::string error;
  bool aborted = false;
  bool ended = false;
};

bool EmbedSession::pull(std::string& out, HttpResponse& res) {
  std::vector<TokenEvent> events;
  queue->wait_pop(events, std::chrono::milliseconds(0));
  for (const auto& e : events) {
    if (!e.finished) continue;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] != e.id || done[i]) continue;
      done[i] = true;
      --remaining;
      const Outcome o = e.finish_reason == "error"   ? Outcome::error
                        : e.finish_reason == "abort" ? Outcome::aborted
                                                     : Outcome::completed;
      server.on_ended(ids[i], o);
      if (o == Outcome::error) error = e.error;
      if (o == Outcome::aborted) aborted = true;
      prompt_tokens += e.prompt_tokens > 0 ? e.prompt_tokens : int64_t(spec.inputs[i].size());
      vecs[i] = shape_embedding(e.embedding, spec.dimensions);
    }
  }
  if (remaining > 0) return false;
  if (!error.empty()) {
    server.send_error(res, 500, error_body(500, "embedding failed: " + error));
  } else if (aborted) {
    server.send_error(res, 503, error_body(503, "the request was aborted (server shutting down)"));
  } else {
    res.body = dump_json(embeddings_response(spec.model, vecs, spec.base64, prompt_tokens));
  }
  out = std::move(res.body);
  res.body.clear();
  return true;
}

// Inputs still running when the client went away (or the server stopped) are aborted and counted so.
void EmbedSession::finish(bool) {
  if (ended) return;
  ended = true;
  wake->disarm();
  for (size_t i = 0; i < ids.size(); ++i) {
    if (done[i]) continue;
    done[i] = true;
    server.engine.abort(ids[i]);
    server.on_ended(ids[i], Outcome::aborted);
  }
}

}  // namespace

void ApiServer::Impl::handle_embeddings(const HttpRequest& req, HttpResponse& res) {
  const json body = parse_body(req.body);
  EmbedSpec spec = parse_embedding_request(body, codec, limits());
  if (!engine.is_embedding_model())
    throw bad_request(
        "this model does not produce embeddings: serve an embedding checkpoint (Qwen3-Embedding)", "model");
  auto s = std::make_shared<EmbedSession>(*this, std::move(spec));
  // On a refusal mid-way, the destructor aborts and counts the inputs already submitted.
  for (const auto& input : s->spec.inputs) {
    Request r;
    r.prompt = input;
    r.embedding = true;
    r.sampling.max_new_tokens = 0;
    const RequestId id = submit(std::move(r), [q = s->queue, w = s->wake](const TokenEvent& e) {
      q->push(e);
      w->wake();
    });
    s->ids.push_back(id);
    s->done.push_back(false);
    s->vecs.emplace_back();
    s->remaining++;
    on_accepted(id);
  }
  res.source = std::move(s);
}

}  // namespace kiln::server
