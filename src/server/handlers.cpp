// Generation (/v1/chat/completions, /v1/completions, /generate) and /v1/embeddings handlers. Each parses and
// submits on a worker thread and returns a ResponseSource (server/http_transport.h) that the connection
// pulls on its I/O thread whenever the engine's callback wakes it.
#include <algorithm>
#include <chrono>
#include <ctime>

#include "server/api_error.h"
#include "server/batched_source.h"
#include "server/generation.h"
#include "server/prompt_logprobs.h"
#include "server/responses.h"
#include "server/server_impl.h"
#include "server/sse_writer.h"

namespace kiln::server {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

// One choice of a generation request in flight (n of them per request, in a GroupSource). Touched only by
// its connection's I/O thread.
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
  size_t text_offset = 0;  // completions logprobs: character offset of the next token's text
  Delta pulled;            // what this pull's events released, sent as one frame
  bool pulled_any = false;
  sse::StringCache gen_text;  // /generate streams: the cumulative text and ids, serialized once
  sse::IdsCache gen_ids;
};

json maybe_usage(const Session& s) {
  if (s.spec.continuous_usage) return usage_json(s.tracker);
  return nullptr;
}

// SSE frames for what one event released, appended to `out` (the fixed shapes by sse_writer.h).
void stream_delta(Session& s, const Delta& d, const TextCodec& codec, Frame& frame) {
  std::string& out = frame.bytes;
  const bool has_lp = s.spec.logprobs && !d.tokens.empty();
  if (d.text.empty() && !has_lp && s.spec.endpoint != Endpoint::generate) return;
  const std::string usage = !s.spec.include_usage     ? ""
                            : s.spec.continuous_usage ? dump_json(usage_json(s.tracker))
                                                      : "null";
  std::string body;
  switch (s.spec.endpoint) {
    case Endpoint::chat: {
      const ParsedDelta pd = s.parser.feed(d.text);
      if (pd.empty() && !has_lp) return;  // held back: a possible tag, or the inside of a call
      if (pd.tool_calls.empty())
        sse::append_text_delta(body, pd.content, pd.reasoning);
      else
        body = dump_json(chat_delta(pd));
      const std::string lp = has_lp ? dump_json(chat_logprobs(d.tokens, codec)) : "null";
      sse::append_chat_chunk(out, s.ctx, {body, "null", lp, usage});
      return;
    }
    case Endpoint::completion: {
      std::string lp = "null";
      if (has_lp) {
        lp = dump_json(completion_logprobs(d.tokens, codec, s.text_offset));
        for (const auto& t : d.tokens) s.text_offset += text_offset_length(codec.token_bytes(t.id));
      }
      sse::append_string(body, d.text);
      sse::append_completion_chunk(out, s.ctx, {body, "null", lp, usage});
      return;
    }
    case Endpoint::generate: {
      if (d.ids.empty() && d.text.empty()) return;
      if (s.tracker.finished()) return;  // the final frame carries everything
      const double e2e = std::chrono::duration<double>(Clock::now() - s.start).count();
      if (s.spec.logprobs)  // cumulative logprob lists: the general shape
        out += sse_frame(generate_response(s.ctx, s.tracker, s.spec, codec, e2e));
      else
        sse::append_generate_running(frame, s.ctx, s.tracker, s.spec.n > 1 || s.spec.batched, e2e, s.gen_text,
                                     s.gen_ids);
      return;
    }
  }
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
  u["usage"] = usage_json(trackers(g), s.spec.n);
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
  return dump_json(merge_choices(bodies, usage_json(trackers(g), g[0]->spec.n)));
}

Outcome outcome_of(const OutputTracker& t) {
  if (!t.finished()) return Outcome::aborted;
  if (t.finish_reason() == "stop" || t.finish_reason() == "length") return Outcome::completed;
  if (t.finish_reason() == "error") return Outcome::error;
  return Outcome::aborted;
}

// The response of one generation request: its n choices on one event queue. Touched only by its
// connection (pull, finish, on its I/O thread); the engine thread reaches only `queue` and `wake`, through
// the shared_ptrs its callbacks hold.
struct GroupSource : ResponseSource {
  GroupSource(ApiServer::Impl& srv, int wake_every)
      : server(srv), queue(std::make_shared<EventQueue>(wake_every)) {}
  ~GroupSource() override { finish(false); }  // a response dropped before the transport took it

  void attach(std::function<void()> fn) override { wake->arm(std::move(fn)); }
  bool pull(Frame& out, HttpResponse& res) override;
  void finish(bool complete) override;

  ApiServer::Impl& server;
  Group group;
  std::shared_ptr<EventQueue> queue;
  std::shared_ptr<WakeRelay> wake = std::make_shared<WakeRelay>();
  std::vector<TokenEvent> events;  // swapped with the queue's buffer each pull
  bool started = false;
};

bool GroupSource::pull(Frame& frame, HttpResponse&) {
  std::string& out = frame.bytes;
  const TextCodec& codec = server.codec;
  const bool stream = group[0]->spec.stream;
  if (!started) {
    started = true;
    if (stream && group[0]->spec.endpoint == Endpoint::chat) {
      for (const auto& s : group) {
        json c = chat_chunk(s->ctx, {{"role", "assistant"}, {"content", ""}}, nullptr, nullptr);
        if (s->spec.include_usage) c["usage"] = maybe_usage(*s);
        out += sse_frame(c);
      }
    }
    if (stream && group[0]->spec.endpoint == Endpoint::completion && !group[0]->spec.echo_text.empty()) {
      for (const auto& s : group) {  // echo: the prompt's text first
        json c = completion_chunk(s->ctx, s->spec.echo_text, nullptr, nullptr);
        if (s->spec.include_usage) c["usage"] = maybe_usage(*s);
        out += sse_frame(c);
      }
    }
  }
  queue->take(events);
  // A choice's events of one pull (several under a stream interval, or when the connection fell behind)
  // become one frame: one delta with all their text, ids and logprobs.
  for (const auto& e : events) {
    auto it = std::find_if(group.begin(), group.end(), [&](const auto& s) { return s->rid == e.id; });
    if (it == group.end() || (*it)->tracker.finished()) continue;
    Session& s = **it;
    Delta d = s.tracker.consume(e);
    if (s.tracker.stopped_by_string() && !s.abort_sent) {
      s.abort_sent = true;
      server.engine.abort(s.rid);  // the engine frees the pages; the client sees finish_reason "stop"
    }
    if (!stream) continue;
    if (!s.pulled_any) {
      s.pulled = std::move(d);
      s.pulled_any = true;
      continue;
    }
    s.pulled.text += d.text;
    s.pulled.ids.insert(s.pulled.ids.end(), d.ids.begin(), d.ids.end());
    s.pulled.tokens.insert(s.pulled.tokens.end(), std::make_move_iterator(d.tokens.begin()),
                           std::make_move_iterator(d.tokens.end()));
  }
  for (const auto& sp : group) {
    Session& s = *sp;
    if (!s.pulled_any) continue;
    s.pulled_any = false;
    stream_delta(s, s.pulled, codec, frame);
    if (s.tracker.finished()) out += stream_choice_end(s, codec);
  }
  const bool finished =
      std::all_of(group.begin(), group.end(), [](const auto& s) { return s->tracker.finished(); });
  if (!finished) return false;
  out += stream ? stream_tail(group) : full_body(group, codec);
  return true;
}

// Once, when the transport is done with the response: after the last byte, or when the client went away or
// the server stopped mid-way (or a submission failed part-way) -- then the unfinished engine requests are
// aborted so their pages are freed.
void GroupSource::finish(bool) {
  wake->disarm();
  for (const auto& s : group) {
    if (s->ended || s->rid == 0) continue;
    s->ended = true;
    if (!s->tracker.finished()) server.engine.abort(s->rid);
    server.on_ended(s->rid, outcome_of(s->tracker));
  }
}

}  // namespace

std::shared_ptr<const grammar::CompiledGrammar> ApiServer::Impl::compile_grammar(const GenSpec& spec) {
  if (!spec.grammar) return nullptr;
  GrammarService* svc = nullptr;
  {
    std::lock_guard<std::mutex> lk(grammar_mu);
    if (!grammars) {
      std::vector<int32_t> eos = engine.eos_token_ids();
      for (int32_t id : opts.extra_eos_ids)
        if (std::find(eos.begin(), eos.end(), id) == eos.end()) eos.push_back(id);
      GrammarServiceOptions go;
      go.lenient = opts.grammar_lenient;
      go.compile_threads = opts.grammar_compile_threads;
      go.compile_timeout_ms = opts.grammar_compile_timeout_ms;
      grammars = std::make_unique<GrammarService>(codec, engine.vocab_size(), std::move(eos), go);
    }
    svc = grammars.get();
  }
  return svc->compile(*spec.grammar);
}

void ApiServer::Impl::handle_generation(Endpoint ep, const HttpRequest& req, HttpResponse& res) {
  const json body = parse_body(req.body);
  const ApiLimits lim = limits();
  GenSpec spec = ep == Endpoint::chat         ? parse_chat_request(body, codec, lim)
                 : ep == Endpoint::completion ? parse_completion_request(body, codec, lim)
                                              : parse_generate_request(body, codec, lim);
  if (spec.grammar)
    spec.grammar = with_body_order(std::move(*spec.grammar), req.body,
                                   ep == Endpoint::generate ? BodyShape::generate : BodyShape::openai);
  if (engine.is_embedding_model())
    throw bad_request("this model is an embedding model: use /v1/embeddings", "model");
  // n choices (of each prompt): n engine requests on one event queue; the later ones wait for the first's
  // prefill and reuse its cached prompt pages (Request::after_prefill_of).
  // The connection is woken every opts.stream_interval tokens while streaming (SGLang's --stream-interval:
  // fewer, larger chunks); a response sent whole needs waking only at its end, unless the server must watch
  // its text for stop strings to abort it as soon as one matches.
  const int wake_every = spec.stream || !spec.stop.empty() ? opts.stream_interval : 0;
  auto src = std::make_shared<GroupSource>(*this, wake_every);
  ResponseCtx ctx;
  ctx.id = !spec.request_id.empty() ? spec.request_id
                                    : make_id(ep == Endpoint::chat         ? "chatcmpl-"
                                              : ep == Endpoint::completion ? "cmpl-"
                                                                           : "");
  ctx.created = int64_t(std::time(nullptr));
  ctx.model = spec.model;
  // Batched prompts: prompt p's choice i is choice p * n + i (OpenAI's and vLLM's indexing).
  GenSpec base = spec;
  base.more_prompts.clear();
  for (size_t p = 0; p <= spec.more_prompts.size(); ++p) {
    if (p > 0) {
      const GenSpec::MorePrompt& mp = spec.more_prompts[p - 1];
      base.prompt = mp.ids;
      base.sampling.max_new_tokens = mp.max_new_tokens;
      base.echo_text = mp.echo_text;
    }
    for (int i = 0; i < spec.n; ++i) {
      GenSpec si = base;
      if (ep == Endpoint::chat) si.parse.id_prefix = make_id("call_") + "_";
      auto s = std::make_shared<Session>(codec, std::move(si));
      s->ctx = ctx;
      s->ctx.index = int(p) * spec.n + i;
      src->group.push_back(std::move(s));
    }
  }
  const std::shared_ptr<const grammar::CompiledGrammar> grammar = compile_grammar(spec);
  // Busy part-way: src's destructor aborts and counts the choices already submitted.
  for (size_t i = 0; i < src->group.size(); ++i) {
    Session& s = *src->group[i];
    Request r;
    r.grammar = grammar;
    r.grammar_after_token = spec.grammar_after_token;
    r.prompt = s.spec.prompt;
    r.images = s.spec.images;
    r.sampling = s.spec.sampling;
    const size_t choice = i % size_t(spec.n);  // of its prompt
    if (r.sampling.seed >= 0)
      r.sampling.seed = int64_t((uint64_t(r.sampling.seed) + choice) & uint64_t(INT64_MAX));
    r.return_hidden = s.spec.return_hidden;
    r.prompt_logprobs_from = engine_prompt_logprobs_from(s.spec);
    r.prompt_top_logprobs = s.spec.prompt_top_logprobs;
    r.after_prefill_of = choice > 0 ? src->group[i - choice]->rid : 0;
    s.rid = submit(std::move(r), [q = src->queue, w = src->wake](const TokenEvent& e) {
      if (q->push(e)) w->wake();
    });
    on_accepted(s.rid);
  }
  set_source(res, std::move(src), spec.stream);
}

namespace {

// The inputs of one /v1/embeddings request, each its own engine request; one JSON reply once all are done.
struct EmbeddingsReply : BatchedSource {
  EmbeddingsReply(ApiServer::Impl& srv, EmbedSpec sp) : BatchedSource(srv, "embedding"), spec(std::move(sp)) {
    vecs.resize(spec.inputs.size());
  }
  bool take(size_t i, const TokenEvent& e) override {
    vecs[i] = shape_embedding(e.embedding, spec.dimensions);
    return true;
  }
  std::string reply() override {
    int64_t tokens = 0;  // the engine's count, else the input's length
    for (const auto& in : spec.inputs) tokens += int64_t(in.size());
    return dump_json(
        embeddings_response(spec.model, vecs, spec.base64, prompt_tokens() > 0 ? prompt_tokens() : tokens));
  }
  EmbedSpec spec;
  std::vector<std::vector<float>> vecs;
};

}  // namespace

void ApiServer::Impl::handle_embeddings(const HttpRequest& req, HttpResponse& res) {
  const json body = parse_body(req.body);
  EmbedSpec spec = parse_embedding_request(body, codec, limits());
  if (!engine.is_embedding_model())
    throw bad_request(
        "this model does not produce embeddings: serve an embedding checkpoint (Qwen3-Embedding)", "model");
  auto s = std::make_shared<EmbeddingsReply>(*this, std::move(spec));
  // On a refusal mid-way, the destructor aborts and counts the inputs already submitted.
  for (const auto& input : s->spec.inputs) {
    Request r;
    r.prompt = input;
    r.embedding = true;
    r.sampling.max_new_tokens = 0;
    s->submit(std::move(r));
  }
  res.source = std::move(s);
}

}  // namespace kiln::server
