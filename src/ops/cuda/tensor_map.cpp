// cuTensorMapEncodeTiled through cudaGetDriverEntryPointByVersion (see tensor_map.h).
#include "ops/cuda/tensor_map.h"

#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include "kiln/cuda_check.h"
#include "kiln/error.h"

namespace kiln::cuda {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    KILN_CUDA_CHECK(
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q));
    KILN_CHECK(q == cudaDriverEntryPointSuccess && f,
               "cuTensorMapEncodeTiled is not available from the driver");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

}  // namespace

CUtensorMap encode_tiled_map(CUtensorMapDataType dtype, int rank, const void* base, const uint64_t* dims,
                             const uint64_t* strides_bytes, const uint32_t* box) {
  KILN_CHECK(rank >= 1 && rank <= 5, "tensor map: rank ", rank, " out of 1..5");
  CUtensorMap map;
  cuuint64_t d[5], s[4];
  cuuint32_t b[5], e[5];
  for (int i = 0; i < rank; ++i) d[i] = dims[i], b[i] = box[i], e[i] = 1;
  for (int i = 0; i + 1 < rank; ++i) s[i] = strides_bytes[i];
  const CUresult r = encode_fn()(&map, dtype, cuuint32_t(rank), const_cast<void*>(base), d, s, b, e,
                                 CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                 CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  KILN_CHECK(r == CUDA_SUCCESS, "cuTensorMapEncodeTiled failed (CUresult ", int(r), ")");
  return map;
}

}  // namespace kiln::cuda
