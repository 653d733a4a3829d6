#include "dist/nccl_comm.h"

#include "kiln/error.h"

#ifdef KILN_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <cstring>
#endif

namespace kiln::dist {

#ifdef KILN_HAVE_NCCL
namespace {

#define KILN_NCCL_CHECK(expr)                                                              \
  do {                                                                                     \
    const ncclResult_t rc_ = (expr);                                                       \
    KILN_CHECK(rc_ == ncclSuccess, "NCCL: ", #expr, " failed: ", ncclGetErrorString(rc_)); \
  } while (0)

class NcclComm final : public Communicator {
 public:
  NcclComm(ncclComm_t c, int rank, int size, int device) : c_(c), rank_(rank), size_(size), device_(device) {}
  ~NcclComm() override {
    if (!aborted_.load()) ncclCommDestroy(c_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_reduce_sum(void* data, size_t count, ReduceType type, void* stream) override {
    if (aborted_.load()) KILN_FAIL("tensor-parallel group aborted by another rank");
    KILN_CHECK(cudaSetDevice(device_) == cudaSuccess, "NCCL all-reduce: cudaSetDevice(", device_, ")");
    KILN_NCCL_CHECK(ncclAllReduce(data, data, count, type == ReduceType::f32 ? ncclFloat32 : ncclBfloat16,
                                  ncclSum, c_, static_cast<cudaStream_t>(stream)));
  }
  void broadcast(void* data, size_t bytes, int root, void* stream) override {
    KILN_CHECK(root >= 0 && root < size_, "broadcast root ", root, " out of range (", size_, " ranks)");
    if (aborted_.load()) KILN_FAIL("tensor-parallel group aborted by another rank");
    KILN_CHECK(cudaSetDevice(device_) == cudaSuccess, "NCCL broadcast: cudaSetDevice(", device_, ")");
    KILN_NCCL_CHECK(ncclBroadcast(data, data, bytes, ncclUint8, root, c_, static_cast<cudaStream_t>(stream)));
  }
  void all_gather(const void* send, void* recv, size_t bytes, void* stream) override {
    if (aborted_.load()) KILN_FAIL("tensor-parallel group aborted by another rank");
    KILN_CHECK(cudaSetDevice(device_) == cudaSuccess, "NCCL all-gather: cudaSetDevice(", device_, ")");
    KILN_NCCL_CHECK(ncclAllGather(send, recv, bytes, ncclUint8, c_, static_cast<cudaStream_t>(stream)));
  }
  // ncclCommAbort ends the operations in flight (kernels waiting for a peer return), from any thread.
  void abort() override {
    if (!aborted_.exchange(true)) ncclCommAbort(c_);
  }
  std::string async_error() override {
    if (aborted_.load()) return {};
    ncclResult_t r = ncclSuccess;
    if (ncclCommGetAsyncError(c_, &r) != ncclSuccess) return "ncclCommGetAsyncError failed";
    return r == ncclSuccess || r == ncclInProgress ? std::string() : std::string(ncclGetErrorString(r));
  }

 private:
  ncclComm_t c_;
  int rank_, size_, device_;
  std::atomic<bool> aborted_{false};
};

}  // namespace

bool nccl_available() {
  return true;
}

std::vector<std::unique_ptr<Communicator>> nccl_local_group(const std::vector<int>& devices) {
  KILN_CHECK(!devices.empty(), "NCCL group: no devices");
  std::vector<ncclComm_t> comms(devices.size());
  KILN_NCCL_CHECK(ncclCommInitAll(comms.data(), int(devices.size()), devices.data()));
  std::vector<std::unique_ptr<Communicator>> out;
  for (size_t r = 0; r < devices.size(); ++r)
    out.push_back(std::make_unique<NcclComm>(comms[r], int(r), int(devices.size()), devices[r]));
  return out;
}

std::string nccl_unique_id() {
  ncclUniqueId id;
  KILN_NCCL_CHECK(ncclGetUniqueId(&id));
  return std::string(id.internal, sizeof id.internal);
}

std::unique_ptr<Communicator> nccl_comm(const std::string& unique_id, int nranks, int rank, int device) {
  ncclUniqueId id;
  KILN_CHECK(unique_id.size() == sizeof id.internal, "NCCL unique id: ", unique_id.size(),
             " bytes, expected ", sizeof id.internal);
  std::memcpy(id.internal, unique_id.data(), sizeof id.internal);
  KILN_CHECK(cudaSetDevice(device) == cudaSuccess, "NCCL init: cudaSetDevice(", device, ")");
  ncclComm_t c;
  KILN_NCCL_CHECK(ncclCommInitRank(&c, nranks, id, rank));
  return std::make_unique<NcclComm>(c, rank, nranks, device);
}

#else  // no NCCL in this build

bool nccl_available() {
  return false;
}
std::vector<std::unique_ptr<Communicator>> nccl_local_group(const std::vector<int>&) {
  KILN_FAIL("this build has no NCCL (tensor parallelism on GPUs needs it)");
}
std::string nccl_unique_id() {
  KILN_FAIL("this build has no NCCL");
}
std::unique_ptr<Communicator> nccl_comm(const std::string&, int, int, int) {
  KILN_FAIL("this build has no NCCL");
}

#endif

}  // namespace kiln::dist
