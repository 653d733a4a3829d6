// TpCommand: what every tensor-parallel rank other than 0 must do next, as the engine thread's calls on
// rank 0 imply it (runtime/tp_runner.h). Within one process the ranks read it from memory; ranks that run on
// other nodes (or, in tests, ranks forced to) receive it from global rank 0 through Communicator::broadcast
// -- NCCL's own transport, nothing else -- as two messages: a fixed 16-byte header {magic, op, payload
// bytes}, then the payload (little-endian i32/i64 fields, then the batch's vectors, each length-prefixed).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/batch.h"
#include "runtime/model_runner.h"

namespace kiln {

struct TpCommand {
  enum class Op : int32_t {
    allocate_kv = 1,     // a = num_pages, b = page_size
    prepare_graphs = 2,  // graph
    forward = 3,         // batch; want_logits / want_hidden as the engine asked rank 0
    stop = 4,            // the ranks leave their loops
    move_kv = 5,         // move_from / move_to: every rank moves its own shard's slots
  };
  Op op = Op::stop;
  int32_t a = 0, b = 0;
  bool want_logits = false, want_hidden = false;
  ModelRunner::GraphPlan graph;
  BatchDesc batch;
  std::vector<int64_t> move_from, move_to;
};

constexpr size_t kTpHeaderBytes = 16;

// The payload of cmd, and the header announcing it.
std::string tp_encode(const TpCommand& cmd);
std::string tp_header(const TpCommand& cmd, size_t payload_bytes);
// The payload size a header announces (a clear error for a corrupt header).
size_t tp_payload_bytes(const void* header);
// Decodes a payload (errors name what is malformed; never reads past `bytes`).
TpCommand tp_decode(const void* header, const void* payload, size_t bytes);

}  // namespace kiln
