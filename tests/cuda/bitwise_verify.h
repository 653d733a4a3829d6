// The bitwise verify path for a scope (test_cuda_verify_graph, test_cuda_eagle3): every verify row through
// the decode attention kernel and the plain step's GEMM tactics (off by default: they cost, docs/PERF.md
// "Speculative decoding"). KILN_VERIFY_TEST_OLD_PATH=1 gives the scope the verify path before them instead
// (the prefill kernel, each call's own M bucket): the tests using it must then fail (the fail-before check).
#pragma once

#include <cstdlib>
#include <string>

#include "ops/cuda/attention.h"
#include "ops/cuda/context.h"
#include "ops/cuda/gemm.h"

namespace kiln::test {

struct BitwiseVerify {
  const int rows_before = cuda::verify_decode_max_rows();
  const bool tactics_before = cuda::gemm_engine().verify_tactics();
  BitwiseVerify() {
    const char* old = std::getenv("KILN_VERIFY_TEST_OLD_PATH");
    const bool on = !(old && std::string(old) == "1");
    cuda::set_verify_decode_max_rows(on ? cuda::kMaxDecodeRowsPerSeq : 0);
    cuda::gemm_engine().set_verify_tactics(on);
  }
  ~BitwiseVerify() {
    cuda::set_verify_decode_max_rows(rows_before);
    cuda::gemm_engine().set_verify_tactics(tactics_before);
  }
  BitwiseVerify(const BitwiseVerify&) = delete;
  BitwiseVerify& operator=(const BitwiseVerify&) = delete;
};

}  // namespace kiln::test
