// Test-only server for e2e: the real HTTP server, SSE path and tokenizer (the checkpoint's), over the fake
// engine of tests/unit/test_server_fakes.h replying with scripted Qwen3 output, so a real client sees
// real <think> and <tool_call> tags. Invoked as `kiln_fake_serve serve --model DIR [--port P] ...` (the
// shape tests/e2e/lib.sh uses for kiln; other flags are ignored). Script: a prompt holding a
// <tool_response> gets the final answer; any other prompt gets reasoning and two tool calls.
// Measurement (scripts/http_cpu_per_token.sh): `--step-ms N` paces the fake engine (default 1), `--echo`
// replies with the prompt's tokens over and over instead (every token real text, as long as asked),
// `--stream-interval N` is kiln serve's.
#include <pthread.h>

#include <csignal>
#include <cstdio>
#include <string>
#include <thread>

#include "kiln/tokenizer.h"
#include "server/backend_engine.h"
#include "server/server.h"
#include "test_server_fakes.h"

int main(int argc, char** argv) {
  std::string model;
  int port = 0, step_ms = 1, stream_interval = 1;
  bool echo = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--echo") echo = true;
    if (i + 1 == argc) break;
    if (a == "--model") model = argv[i + 1];
    if (a == "--port") port = std::stoi(argv[i + 1]);
    if (a == "--step-ms") step_ms = std::stoi(argv[i + 1]);
    if (a == "--stream-interval") stream_interval = std::stoi(argv[i + 1]);
  }
  if (model.empty()) {
    std::fprintf(stderr, "usage: kiln_fake_serve serve --model DIR [--port P]\n");
    return 2;
  }
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  const kiln::Tokenizer tok = kiln::Tokenizer::load(model);
  kiln::server::TokenizerCodec codec(tok);
  kiln::server::fake::FakeEngine engine("", step_ms);
  engine.vocab = tok.vocab_size();
  engine.eos = *tok.token_id("<|im_end|>");
  engine.script = [&tok, echo](const kiln::Request& r) {
    if (echo) {
      std::vector<int32_t> ids;
      while (int(ids.size()) < r.sampling.max_new_tokens)
        ids.insert(ids.end(), r.prompt.begin(), r.prompt.end());
      return ids;
    }
    const std::string prompt = tok.decode(r.prompt);
    const bool answer = prompt.find("<tool_response>") != std::string::npos;
    const std::string reply =
        answer ? "<think>\nThe tool said 18°C.\n</think>\n\nIt is 18°C in Paris, and 12:00 (CET)."
               : "<think>\nI need the weather and the time, é中.\n</think>\n\nLet me check.\n<tool_call>\n"
                 "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"°C\"}}\n"
                 "</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\"}}\n"
                 "</tool_call>";
    return tok.encode(reply);
  };
  kiln::server::ServerOptions so;
  so.port = port;
  so.served_model_name = "demo";
  so.stream_interval = stream_interval;
  kiln::server::ApiServer server(engine, codec, so);
  const int bound = server.bind();
  std::thread http([&] { server.listen(); });
  std::printf("READY http://127.0.0.1:%d\n", bound);
  std::fflush(stdout);
  int sig = 0;
  sigwait(&sigs, &sig);
  server.begin_drain();
  server.wait_idle(std::chrono::seconds(10));
  server.abort_all();
  server.stop();
  http.join();
  const auto& c = server.counters();
  std::fprintf(stderr, "kiln serve: stopped. accepted %lld: completed %lld, error %lld, aborted %lld\n",
               (long long)c.accepted.load(), (long long)c.completed.load(), (long long)c.errored.load(),
               (long long)c.aborted.load());
  return 0;
}
