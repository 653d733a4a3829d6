// Tensor maps for the bulk tensor copy engine (TMA, sm_90): the driver's cuTensorMapEncodeTiled, reached
// through the runtime's entry-point query so nothing links against libcuda directly.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace kiln::cuda {

// Whether the driver exports cuTensorMapEncodeTiled at all.
bool tensor_maps_available();
// A tiled map over `rank` dimensions (dims[0] contiguous; strides_bytes[i] is the stride of dimension i + 1),
// boxes of box[] elements, 128-byte swizzle, zero fill outside the tensor, the L2 fetch granularity
// `promotion`. try_: false when the driver lacks the entry point or refuses the request (the caller falls
// back); encode_tiled_map throws instead.
bool try_encode_tiled_map(CUtensorMap* map, CUtensorMapDataType dtype, int rank, const void* base,
                          const uint64_t* dims, const uint64_t* strides_bytes, const uint32_t* box,
                          CUtensorMapL2promotion promotion = CU_TENSOR_MAP_L2_PROMOTION_L2_256B);
CUtensorMap encode_tiled_map(CUtensorMapDataType dtype, int rank, const void* base, const uint64_t* dims,
                             const uint64_t* strides_bytes, const uint32_t* box,
                             CUtensorMapL2promotion promotion = CU_TENSOR_MAP_L2_PROMOTION_L2_256B);

}  // namespace kiln::cuda
