// Tensor-parallel flags shared by `kiln serve`, `kiln generate` and `kiln bench model` (SGLang's names):
//   --tp N                     ranks over all nodes (default 1: no tensor parallelism)
//   --nnodes N --node-rank R   nodes of the group and this one's index (default 1 and 0)
//   --dist-init-addr HOST:PORT node 0's TCP rendezvous for the NCCL unique id (needed with --nnodes > 1)
//   --enable-expert-parallel   MoE models: whole experts per rank instead of each expert's intermediate split
//                              (vLLM's flag; dist/shard_plan.h)
#pragma once

#include <set>
#include <string>

#include "cli/flags.h"
#include "kiln/error.h"
#include "runtime/engine.h"

namespace kiln::cli {

inline const std::set<std::string> kTpFlags = {"tp", "nnodes", "node-rank", "dist-init-addr"};
inline const std::set<std::string> kTpBoolFlags = {"enable-expert-parallel"};

inline void read_tp_flags(const Flags& f, EngineOptions& eo) {
  const int64_t tp = f.i64("tp", 1), nnodes = f.i64("nnodes", 1), node_rank = f.i64("node-rank", 0);
  KILN_CHECK(tp >= 1 && tp <= 64, "--tp must be in [1, 64], got ", tp);
  KILN_CHECK(nnodes >= 1 && nnodes <= tp, "--nnodes must be in [1, --tp], got ", nnodes);
  KILN_CHECK(tp % nnodes == 0, "--tp ", tp, " must be a multiple of --nnodes ", nnodes);
  KILN_CHECK(node_rank >= 0 && node_rank < nnodes, "--node-rank must be in [0, --nnodes), got ", node_rank);
  eo.tp = int(tp);
  eo.nnodes = int(nnodes);
  eo.node_rank = int(node_rank);
  eo.dist_init_addr = f.str("dist-init-addr", "");
  KILN_CHECK(nnodes == 1 || !eo.dist_init_addr.empty(), "--nnodes ", nnodes,
             " needs --dist-init-addr HOST:PORT (node 0's address)");
  eo.expert_parallel = f.flag("enable-expert-parallel");
  KILN_CHECK(!eo.expert_parallel || tp > 1,
             "--enable-expert-parallel places experts on the --tp ranks: needs "
             "--tp 2 or more");
}

}  // namespace kiln::cli
