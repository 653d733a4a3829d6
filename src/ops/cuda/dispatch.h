// For the op dispatchers (src/ops/*.cpp): KILN_CUDA_OP(call) runs kiln::ops::cuda::call in a CUDA build
// and is a clear error in a CPU-only build. Plain C++: no CUDA headers.
#pragma once

#include "kiln/error.h"

#ifdef KILN_HAVE_CUDA
#include "ops/cuda/ops_cuda.h"
#define KILN_CUDA_OP(call) ::kiln::ops::cuda::call
#else
#define KILN_CUDA_OP(call) KILN_FAIL("kiln was built without CUDA: ", #call, " has no CUDA kernel here")
#endif
