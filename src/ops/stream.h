// The CUDA stream the ops enqueue on in this thread, as an opaque handle for code that must stay free of
// CUDA headers (the model passes it to ops that take a stream argument, e.g. AttnPrepArgs::stream).
// nullptr is the legacy default stream; a CPU-only build always answers nullptr. Set it with
// kiln::cuda::StreamScope (ops/cuda/context.h).
#pragma once

namespace kiln::ops {

#ifdef KILN_HAVE_CUDA
void* current_stream();
#else
inline void* current_stream() {
  return nullptr;
}
#endif

}  // namespace kiln::ops
