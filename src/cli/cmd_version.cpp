#include <cstdio>

#include "cli/command.h"
#include "kiln/tensor.h"

namespace {
int run_version(const kiln::cli::Args&) {
  std::printf("kiln 0.1.0 (cuda backend: %s, gpu visible: %s)\n",
#ifdef KILN_HAVE_CUDA
              "built",
#else
              "not built",
#endif
              kiln::cuda_available() ? "yes" : "no");
  return 0;
}
}  // namespace

KILN_COMMAND("version", "print the version and whether the CUDA backend is built", run_version);
