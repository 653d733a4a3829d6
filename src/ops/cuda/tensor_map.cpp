// cuTensorMapEncodeTiled through cudaGetDriverEntryPointByVersion (see tensor_map.h).
#include "ops/cuda/tensor_map.h"

#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include "kiln/error.h"

namespace kiln::cuda {
namespace {

// The driver's cuTensorMapEncodeTiled, or null when the driver does not export it.
PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) !=
            cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      return PFN_cuTensorMapEncodeTiled_v12000(nullptr);
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

}  // namespace

bool tensor_maps_available() {
  return encode_fn() != nullptr;
}

bool try_encode_tiled_map(CUtensorMap* map, CUtensorMapDataType dtype, int rank, const void* base,
                          const uint64_t* dims, const uint64_t* strides_bytes, const uint32_t* box,
                          CUtensorMapL2promotion promotion) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = encode_fn();
  if (!encode || rank < 1 || rank > 5) return false;
  cuuint64_t d[5], s[4];
  cuuint32_t b[5], e[5];
  for (int i = 0; i < rank; ++i) d[i] = dims[i], b[i] = box[i], e[i] = 1;
  for (int i = 0; i + 1 < rank; ++i) s[i] = strides_bytes[i];
  return encode(map, dtype, cuuint32_t(rank), const_cast<void*>(base), d, s, b, e,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, promotion,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

CUtensorMap encode_tiled_map(CUtensorMapDataType dtype, int rank, const void* base, const uint64_t* dims,
                             const uint64_t* strides_bytes, const uint32_t* box,
                             CUtensorMapL2promotion promotion) {
  KILN_CHECK(encode_fn() != nullptr, "cuTensorMapEncodeTiled is not available from the driver");
  CUtensorMap map;
  KILN_CHECK(try_encode_tiled_map(&map, dtype, rank, base, dims, strides_bytes, box, promotion),
             "cuTensorMapEncodeTiled refused a ", rank, "-D map");
  return map;
}

}  // namespace kiln::cuda
