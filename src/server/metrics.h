// Prometheus text exposition (version 0.0.4) of the engine's stats and the server's own counters.
// Names: kiln_* ; counters end in _total; histograms carry _bucket{le=...}, _sum, _count.
//
// Accounting invariant the e2e load test checks, once the server is idle:
//   kiln_server_requests_accepted_total == sum over outcome of kiln_server_requests_finished_total
//   kiln_requests_submitted_total == sum over reason of kiln_requests_finished_total
//   kiln_kv_pages_used == 0 (and kiln_kv_pages_free == kiln_kv_pages_total after /flush_cache)
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "runtime/engine.h"

namespace kiln::server {

// Counted by the HTTP layer; every accepted request ends in exactly one outcome.
struct ServerCounters {
  std::atomic<int64_t> accepted{0};          // handed to the engine
  std::atomic<int64_t> completed{0};         // finished normally (stop or length)
  std::atomic<int64_t> errored{0};           // the engine reported an error
  std::atomic<int64_t> aborted{0};           // client went away, or the server shut down
  std::atomic<int64_t> rejected_invalid{0};  // 4xx before submission
  std::atomic<int64_t> rejected_busy{0};     // 503: queue full or draining
  std::atomic<int64_t> rejected_auth{0};     // 401
  std::atomic<int64_t> active{0};            // accepted and not yet ended
  // The transport's (server/http_transport.h).
  std::atomic<int64_t> rejected_timeout{0};      // 408: headers or body not received in time
  std::atomic<int64_t> connections_open{0};      // TCP connections being served now
  std::atomic<int64_t> connections_total{0};     // accepted since start (over the cap included)
  std::atomic<int64_t> connections_rejected{0};  // 503: over --max-connections
};

std::string render_metrics(const EngineStats& s, const ServerCounters& c, const std::string& model_name);

}  // namespace kiln::server
