#include <cstdio>

#include "cli/command.h"
#include "cli/flags.h"
#include "kiln/error.h"
#include "kiln/tensor.h"

namespace {
int run_version(const kiln::cli::Args& args) {
  const kiln::cli::Flags f(args, {});  // no flags: only --help
  KILN_CHECK(f.positional().empty(), "unexpected argument '", f.positional().empty() ? "" : f.positional()[0],
             "'");
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
