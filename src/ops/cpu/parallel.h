// A small fixed thread pool for the CPU reference ops. parallel_for splits [0, n) into contiguous
// chunks of `grain` items; each chunk runs on exactly one thread. Ops only use it for work whose
// per-item result does not depend on the split (each output element is computed by one thread in a
// fixed order), so results are bitwise identical for any thread count.
#pragma once

#include <cstdint>
#include <functional>

namespace kiln::ops::cpu {

// Number of worker threads (KILN_NUM_THREADS, else std::thread::hardware_concurrency()).
int num_threads();

// Calls fn(begin, end) over disjoint chunks covering [0, n); blocks until all are done. Exceptions
// thrown by fn are rethrown on the caller's thread (the first one wins). Nested calls run inline.
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace kiln::ops::cpu
