// POST /v1/responses (server/responses_api.h) as a ResponseSource fed by the engine's events, and
// GET /v1/responses/{id} from the store.
#include <ctime>

#include "server/api_error.h"
#include "server/responses.h"
#include "server/responses_api.h"
#include "server/server_impl.h"

namespace kiln::server {

using nlohmann::json;

namespace {

// One /v1/responses request in flight. Touched only by its connection's I/O thread, except `queue` and
// `wake`, which the engine thread reaches through its callback.
struct ResponsesSource : ResponseSource {
  ResponsesSource(ApiServer::Impl& srv, ResponsesSpec sp, std::string resp_id)
      : server(srv),
        spec(std::move(sp)),
        id(std::move(resp_id)),
        tracker(srv.codec, spec.gen),
        parser(spec.gen.parse),
        builder(id, spec.gen.stream) {}
  ~ResponsesSource() override { finish(false); }

  void attach(std::function<void()> fn) override { wake->arm(std::move(fn)); }
  bool pull(Frame& frame, HttpResponse& res) override;
  void finish(bool complete) override;

  ApiServer::Impl& server;
  ResponsesSpec spec;
  std::string id;
  int64_t created = int64_t(std::time(nullptr));
  OutputTracker tracker;
  OutputParser parser;
  ResponseOutputBuilder builder;
  std::shared_ptr<EventQueue> queue;
  std::shared_ptr<WakeRelay> wake = std::make_shared<WakeRelay>();
  std::vector<TokenEvent> events;
  RequestId rid = 0;
  bool started = false;
  bool abort_sent = false;
  bool ended = false;
};

bool ResponsesSource::pull(Frame& frame, HttpResponse& res) {
  std::string& out = frame.bytes;
  if (!started) {
    started = true;
    const json r = response_object(id, created, spec, json::array(), nullptr);
    builder.event(out, "response.created", {{"response", r}});
    builder.event(out, "response.in_progress", {{"response", r}});
  }
  queue->take(events);
  for (const auto& e : events) {
    if (e.id != rid || tracker.finished()) continue;
    const Delta d = tracker.consume(e);
    if (tracker.stopped_by_string() && !abort_sent) {
      abort_sent = true;
      server.engine.abort(rid);
    }
    builder.feed(parser.feed(d.text), out);
  }
  if (!tracker.finished()) return false;
  builder.feed(parser.finish(), out);
  builder.close(out);
  const json r = response_object(id, created, spec, builder.items(), &tracker);
  if (spec.store && tracker.finish_reason() != "error") {
    json conversation = spec.conversation;
    conversation.push_back(builder.assistant_message());
    server.response_store->put(id, {r, std::move(conversation)});
  }
  if (spec.gen.stream) {
    const std::string status = r["status"];
    builder.event(out,
                  status == "completed" ? "response.completed"
                  : status == "failed"  ? "response.failed"
                                        : "response.incomplete",
                  {{"response", r}});
  } else if (tracker.finish_reason() == "error") {
    server.send_error(res, 500, error_body(500, "generation failed: " + tracker.error()));
    out = std::move(res.body);
    res.body.clear();
  } else {
    out = dump_json(r);
  }
  return true;
}

void ResponsesSource::finish(bool) {
  if (ended) return;
  ended = true;
  wake->disarm();
  if (rid == 0) return;
  if (!tracker.finished()) server.engine.abort(rid);
  const std::string& fr = tracker.finish_reason();
  server.on_ended(rid, !tracker.finished()              ? Outcome::aborted
                       : fr == "stop" || fr == "length" ? Outcome::completed
                       : fr == "error"                  ? Outcome::error
                                                        : Outcome::aborted);
}

}  // namespace

void ApiServer::Impl::handle_responses(const HttpRequest& req, HttpResponse& res) {
  const json body = parse_body(req.body);
  ResponsesSpec spec = parse_responses_request(body, *response_store, codec, limits());
  if (spec.gen.grammar)
    spec.gen.grammar = with_body_order(std::move(*spec.gen.grammar), req.body, BodyShape::responses);
  if (engine.is_embedding_model())
    throw bad_request("this model is an embedding model: use /v1/embeddings", "model");
  const std::string id = make_id("resp_");
  spec.gen.parse.id_prefix = "call_" + id.substr(5) + "_";
  auto src = std::make_shared<ResponsesSource>(*this, std::move(spec), id);
  src->queue = std::make_shared<EventQueue>(src->spec.gen.stream ? opts.stream_interval : 0);
  Request r;
  r.grammar = compile_grammar(src->spec.gen);
  r.grammar_after_token = src->spec.gen.grammar_after_token;
  r.prompt = src->spec.gen.prompt;
  r.images = src->spec.gen.images;
  r.sampling = src->spec.gen.sampling;
  src->rid = submit(std::move(r), [q = src->queue, w = src->wake](const TokenEvent& e) {
    if (q->push(e)) w->wake();
  });
  on_accepted(src->rid);
  const bool stream = src->spec.gen.stream;
  set_source(res, std::move(src), stream);
}

void ApiServer::Impl::get_stored_response(const std::string& id, HttpResponse& res) {
  if (auto r = response_store->get(id)) {
    res.body = dump_json(r->response);
    return;
  }
  send_error(res, 404,
             error_body(404,
                        "Response with id '" + id + "' not found (kept in memory: the last " +
                            std::to_string(response_store->capacity()) + " stored)",
                        "response_id"));
}

}  // namespace kiln::server
