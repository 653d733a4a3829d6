// `kiln bench kernels [--filter NAME|=NAME] [--reps N]`: runs the registered kernel benchmarks (bench/) on the
// GPU and prints one table: time, bytes moved, GB/s and the fraction of this run's copy bandwidth.
#include <cstdio>

#include "cli/command.h"
#include "cli/flags.h"
#include "kiln/tensor.h"
#ifdef KILN_HAVE_CUDA
#include "bench/kernel_bench.h"
#endif

namespace {
int run_bench_kernels(const kiln::cli::Args& args) {
  const kiln::cli::Flags f(args, {"filter", "reps"}, {"list"});
#ifdef KILN_HAVE_CUDA
  if (f.flag("list")) {
    for (const auto& b : kiln::bench::benches()) std::printf("%-16s %s\n", b.name.c_str(), b.summary.c_str());
    return 0;
  }
  KILN_CHECK(kiln::cuda_available(), "kiln bench kernels needs a CUDA GPU; none is visible");
  const kiln::bench::Env env = kiln::bench::make_env(int(f.i64("reps", 100)));
  const auto rows = kiln::bench::run_benches(env, f.str("filter"));
  KILN_CHECK(!rows.empty(), "no kernel benchmark matches --filter '", f.str("filter"), "'");
  kiln::bench::print_rows(env, rows);
  return 0;
#else
  KILN_FAIL("kiln was built without CUDA: no kernel benchmarks");
#endif
}
}  // namespace

KILN_COMMAND("bench kernels", "run the kernel benchmarks (cold L2, medians) and print one table",
             run_bench_kernels);
