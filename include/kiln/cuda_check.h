// KILN_CUDA_CHECK(expr): a CUDA runtime call that must succeed; on failure a kiln::Error naming the call,
// the CUDA error string and the source location. Host code only; include where CUDA is built.
#pragma once

#include <cuda_runtime_api.h>

#include "kiln/error.h"

#define KILN_CUDA_CHECK(expr)                                                    \
  do {                                                                           \
    cudaError_t kiln_e_ = (expr);                                                \
    KILN_CHECK(kiln_e_ == cudaSuccess, #expr ": ", cudaGetErrorString(kiln_e_)); \
  } while (0)
