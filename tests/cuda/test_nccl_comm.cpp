// NcclComm on the one GPU a test machine has (src/dist/nccl_comm.h): a one-rank group's all-reduce and
// broadcast leave the data as it is, eagerly and inside a captured, replayed CUDA graph (the way the sharded
// decode will run them); several ranks need several GPUs (the multi-GPU issue).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <vector>

#include "dist/nccl_comm.h"
#include "test_util_cuda.h"

namespace kiln {
namespace {

TEST(NcclComm, OneRankAllReduceAndBroadcastEagerAndInAGraph) {
  KILN_REQUIRE_GPU();
  if (!dist::nccl_available()) GTEST_SKIP() << "this build has no NCCL";
  auto comms = dist::nccl_local_group({0});
  ASSERT_EQ(comms.size(), 1u);
  EXPECT_EQ(comms[0]->size(), 1);
  EXPECT_EQ(comms[0]->rank(), 0);
  std::vector<bf16_t> h(4096);
  for (size_t i = 0; i < h.size(); ++i) h[i] = f32_to_bf16(float(i % 97) - 48.0f);
  Buffer d = test::to_device(h);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  comms[0]->all_reduce_sum(d.data(), h.size(), dist::ReduceType::bf16, s);
  comms[0]->broadcast(d.data(), h.size() * 2, 0, s);
  cudaGraph_t g;
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  comms[0]->all_reduce_sum(d.data(), h.size(), dist::ReduceType::bf16, s);
  ASSERT_EQ(cudaStreamEndCapture(s, &g), cudaSuccess);
  cudaGraphExec_t ge;
  ASSERT_EQ(cudaGraphInstantiate(&ge, g, 0), cudaSuccess);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(cudaGraphLaunch(ge, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  std::vector<bf16_t> back(h.size());
  copy_bytes(back.data(), Device::cpu(), d.data(), Device::cuda(), back.size() * 2);
  for (size_t i = 0; i < h.size(); ++i) ASSERT_EQ(back[i].bits, h[i].bits) << i;
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  cudaStreamDestroy(s);
}

}  // namespace
}  // namespace kiln
