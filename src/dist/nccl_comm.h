// NcclComm: one GPU per rank over NCCL (communicator.h). all_reduce_sum is ncclAllReduce on the given stream
// (bf16 or f32, in place), so it can be captured into the decode CUDA graphs. Built where NCCL is found
// (nccl_available()); elsewhere the factories throw.
//   nccl_local_group(devices): one process, a thread per GPU (ncclCommInitAll: ranks are the list's order).
//   nccl_unique_id() on node 0 + exchange_blob (rendezvous.h) + nccl_comm(id, nranks, rank, device): several
//   nodes (or processes), the same code.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dist/communicator.h"

namespace kiln::dist {

bool nccl_available();
std::vector<std::unique_ptr<Communicator>> nccl_local_group(const std::vector<int>& devices);
std::string nccl_unique_id();
std::unique_ptr<Communicator> nccl_comm(const std::string& unique_id, int nranks, int rank, int device);

}  // namespace kiln::dist
