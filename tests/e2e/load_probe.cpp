// Test-only load driver for e2e (tests/e2e/test_scale.sh): against a running server on 127.0.0.1:PORT it
// holds N idle connections, runs S concurrent streaming /v1/completions (ignore_eos, exactly K tokens each)
// and W slow clients (trickling headers or body, one byte per 200 ms) at once, while a thread polls /health
// and /metrics on fresh connections every 20 ms. It passes (exit 0) when every stream got 200 with exactly K
// completion tokens and [DONE], every slow client got 408, every poll got 200 within --max-poll-ms, and every
// idle connection is still open at the end. One thread of clients on poll() (tests/unit/scale_client.h).
//   kiln_load_probe PORT [--idle N] [--streams S] [--slow W] [--tokens K] [--model NAME] [--max-poll-ms MS]
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "scale_client.h"

using namespace kiln::test::scale;
using nlohmann::json;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: kiln_load_probe PORT [--idle N] [--streams S] [--slow W] [--tokens K]\n");
    return 2;
  }
  const int port = std::atoi(argv[1]);
  int idle_n = 1000, streams_n = 300, slow_n = 200, tokens = 8;
  // A poll may exceed max_poll_ms only as a scheduling hiccup of a loaded machine (ctest runs tests in
  // parallel on 2 cores): at most 2 % of the polls, none past max_stall_ms. An HTTP layer blocked by the load
  // shows as many slow polls or a stall of the slow clients' 1 s deadline, and fails either way.
  double max_poll_ms = 50, max_stall_ms = 500;
  std::string model = "demo";
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--idle") idle_n = std::stoi(v);
    if (a == "--streams") streams_n = std::stoi(v);
    if (a == "--slow") slow_n = std::stoi(v);
    if (a == "--tokens") tokens = std::stoi(v);
    if (a == "--model") model = v;
    if (a == "--max-poll-ms") max_poll_ms = std::stod(v);
    if (a == "--max-stall-ms") max_stall_ms = std::stod(v);
  }
  const long fds = raise_fd_limit();
  if (fds < 2 * (idle_n + streams_n + slow_n) + 64) {
    std::fprintf(stderr, "load_probe: needs more file descriptors than %ld\n", fds);
    return 1;
  }
  int failures = 0;
  auto fail = [&](const std::string& what) {
    if (failures++ < 10) std::fprintf(stderr, "load_probe: FAIL %s\n", what.c_str());
  };

  std::vector<int> idle;
  for (int i = 0; i < idle_n; ++i) idle.push_back(dial(port));
  for (int fd : idle)
    if (fd < 0) fail("an idle connection was refused");

  std::atomic<bool> stop{false};
  std::atomic<int> polls{0}, bad_polls{0};
  std::atomic<double> worst{0};
  std::vector<double> lat;  // the prober's only
  int worst_poll = -1;      // the prober's only: which poll was the worst ...
  double worst_at = 0.0;    // ... and when it started (ms after the prober's start)
  std::thread prober([&] {
    raise_thread_priority();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; !stop; ++i) {
      int status = 0;
      const double at =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      const double ms = timed_get(port, i % 2 ? "/metrics" : "/health", &status);
      polls++;
      lat.push_back(ms);
      if (status != 200) bad_polls++;
      if (ms > worst) worst = ms, worst_poll = i, worst_at = at;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });

  lower_thread_priority();  // this thread drives the load: the prober comes first
  const std::string body = json({{"model", model},
                                 {"prompt", "Hello there"},
                                 {"max_tokens", tokens},
                                 {"ignore_eos", true},
                                 {"temperature", 0},
                                 {"stream", true},
                                 {"stream_options", {{"include_usage", true}}}})
                               .dump();
  std::vector<Conn> streams(static_cast<size_t>(streams_n)), slow(static_cast<size_t>(slow_n));
  std::vector<Conn*> all;
  for (auto& c : streams) {
    c.fd = dial(port);
    c.out = post_request("/v1/completions", body);
    all.push_back(&c);
  }
  for (size_t i = 0; i < slow.size(); ++i) {
    Conn& c = slow[i];
    c.fd = dial(port);
    c.trickle = std::chrono::milliseconds(200);
    const std::string req = post_request("/v1/completions", body, /*declare_full=*/false);
    const size_t head = req.find("\r\n\r\n") + 4;
    if (i % 2 && ::send(c.fd, req.data(), head, MSG_NOSIGNAL) == ssize_t(head))
      c.out = req.substr(head);  // headers at once, the body trickled
    else
      c.out = req;  // the headers trickled
    all.push_back(&c);
  }
  for (Conn* c : all)
    if (c->fd < 0) fail("a connection was refused");
  const auto t0 = Clock::now();
  if (!pump(all, t0 + std::chrono::seconds(240))) fail("some connections were still open after 240 s");
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  stop = true;
  prober.join();

  for (const auto& c : streams) {
    if (status_of(c.in) != 200) {
      fail("stream status " + std::to_string(status_of(c.in)) + ": " + c.in.substr(0, 120));
      continue;
    }
    const std::string sse = body_of(c.in);
    int got = -1;
    size_t pos = 0;
    bool done = false;
    while (pos < sse.size()) {
      const size_t end = sse.find("\n\n", pos);
      if (sse.compare(pos, 6, "data: ") != 0 || end == std::string::npos) break;
      const std::string p = sse.substr(pos + 6, end - pos - 6);
      pos = end + 2;
      if (p == "[DONE]") {
        done = true;
        continue;
      }
      const json j = json::parse(p, nullptr, false);
      if (j.is_object() && j.contains("usage") && j["usage"].is_object())
        got = j["usage"]["completion_tokens"];
    }
    if (!done || got != tokens)
      fail("stream ended without [DONE] or with " + std::to_string(got) + " tokens");
  }
  for (const auto& c : slow)
    if (status_of(c.in) != 408) fail("slow client status " + std::to_string(status_of(c.in)));
  int open = 0;
  for (int fd : idle) {
    char ch;
    if (fd >= 0 && ::recv(fd, &ch, 1, MSG_PEEK | MSG_DONTWAIT) < 0 && errno == EAGAIN) ++open;
    if (fd >= 0) ::close(fd);
  }
  if (open != idle_n) fail(std::to_string(idle_n - open) + " idle connections were closed");
  if (bad_polls > 0) fail(std::to_string(bad_polls.load()) + " polls did not get 200");
  std::sort(lat.begin(), lat.end());
  const auto pct = [&](double q) { return lat.empty() ? 0.0 : lat[size_t(q * double(lat.size() - 1))]; };
  const auto over = std::count_if(lat.begin(), lat.end(), [&](double v) { return v > max_poll_ms; });
  if (worst > max_stall_ms) fail("worst /health or /metrics latency " + std::to_string(worst.load()) + " ms");
  if (double(over) > 0.02 * double(lat.size()))
    fail(std::to_string(over) + " of " + std::to_string(lat.size()) + " polls over " +
         std::to_string(max_poll_ms) + " ms (more than 2 %)");
  std::printf(
      "load_probe: %d idle, %d streams x %d tokens, %d slow clients in %.1f s; %d polls: p50 %.2f ms, p99 "
      "%.2f ms, worst %.1f ms (poll %d, started %.0f ms in), %ld over %.0f ms; %s\n",
      idle_n, streams_n, tokens, slow_n, secs, polls.load(), pct(0.5), pct(0.99), worst.load(), worst_poll,
      worst_at, long(over), max_poll_ms, failures ? "FAIL" : "ok");
  return failures ? 1 : 0;
}
