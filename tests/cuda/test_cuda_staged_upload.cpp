// StagedUploads on a GPU (kiln/staged_upload.h): a batch's bytes arrive in order on its stream; the host
// source may change right after copy() (the arena holds the bytes); the arena grows; a copy past the bound is
// a clear error and the next batch is whole; a batch on another stream waits for the earlier stream's work.
#include <cuda_runtime_api.h>

#include <numeric>
#include <vector>

#include "kiln/staged_upload.h"
#include "test_util_cuda.h"

namespace kiln {
namespace {

using test::to_host;

Buffer poisoned(size_t bytes) {
  Buffer b(bytes, Device::cuda());
  KILN_CUDA_CHECK(cudaMemset(b.data(), 0xff, bytes));
  KILN_CUDA_CHECK(cudaDeviceSynchronize());  // before copies on a non-blocking stream
  return b;
}

struct Stream {
  cudaStream_t s = nullptr;
  Stream() { KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~Stream() { cudaStreamDestroy(s); }
};

TEST(CudaStagedUploads, BatchesArriveAndTheSourceMayChangeAtOnce) {
  KILN_REQUIRE_GPU();
  Stream st;
  StagedUploads up(Device::cuda());
  std::vector<int32_t> a(1000), b(37);
  std::iota(b.begin(), b.end(), -100);
  const std::vector<int32_t> b0 = b;
  Buffer da = poisoned(a.size() * 4), db = poisoned(b.size() * 4);
  for (int round = 0; round < 3; ++round) {  // the arena is reused batch after batch
    std::iota(a.begin(), a.end(), 5 + 1000 * round);
    const std::vector<int32_t> a0 = a;
    KILN_CUDA_CHECK(cudaMemsetAsync(da.data(), 0xff, a.size() * 4, st.s));
    up.begin(StagedUploads::footprint(a.size() * 4) + StagedUploads::footprint(b.size() * 4), st.s);
    up.copy(da.data(), a.data(), a.size() * 4);
    up.copy(db.data(), b.data(), b.size() * 4);
    up.end();
    std::fill(a.begin(), a.end(), 0);  // the copies read the arena, not these vectors
    std::fill(b.begin(), b.end(), 0);
    KILN_CUDA_CHECK(cudaStreamSynchronize(st.s));
    EXPECT_EQ(to_host<int32_t>(da, a.size()), a0) << "round " << round;
    EXPECT_EQ(to_host<int32_t>(db, b.size()), b0) << "round " << round;
    b = b0;
  }
}

TEST(CudaStagedUploads, ArenaGrowsAndABoundOverrunIsAnError) {
  KILN_REQUIRE_GPU();
  Stream st;
  StagedUploads up(Device::cuda());
  std::vector<uint8_t> small(24, 3), big(1 << 20);
  for (size_t i = 0; i < big.size(); ++i) big[i] = uint8_t(i * 7 + 1);
  Buffer d = poisoned(big.size());
  up.begin(StagedUploads::footprint(small.size()), st.s);
  up.copy(d.data(), small.data(), small.size());
  EXPECT_THROW(up.copy(d.data(), small.data(), small.size()), Error);  // past the bound
  // The batch a failed copy left open: the next begin recovers, and the arena grows to 1 MiB.
  up.begin(StagedUploads::footprint(big.size()), st.s);
  up.copy(d.data(), big.data(), big.size());
  up.end();
  KILN_CUDA_CHECK(cudaStreamSynchronize(st.s));
  EXPECT_EQ(to_host<uint8_t>(d, big.size()), big);
}

TEST(CudaStagedUploads, AnotherStreamWaitsForTheEarlierStreamsWork) {
  KILN_REQUIRE_GPU();
  Stream s1, s2;
  StagedUploads up(Device::cuda());
  // On s1: the first batch, ~0.1 ms of other work, then a reader of the batch's destination. The second
  // batch, on s2, must not land before that reader (on its own, s2's copy would overtake s1's queue).
  const size_t delay_bytes = size_t(512) << 20;
  Buffer delay(delay_bytes, Device::cuda()), src = poisoned(16), dst = poisoned(16);
  const std::vector<uint8_t> first(16, 0x22), second(16, 0x33);
  up.begin(StagedUploads::footprint(16), s1.s);
  up.copy(src.data(), first.data(), 16);
  up.end();
  KILN_CUDA_CHECK(cudaMemsetAsync(delay.data(), 0, delay_bytes, s1.s));
  KILN_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), 16, cudaMemcpyDeviceToDevice, s1.s));
  up.begin(StagedUploads::footprint(16), s2.s);
  up.copy(src.data(), second.data(), 16);
  up.end();
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(to_host<uint8_t>(dst, 16), first);  // the reader saw the first batch
  EXPECT_EQ(to_host<uint8_t>(src, 16), second);
}

}  // namespace
}  // namespace kiln
