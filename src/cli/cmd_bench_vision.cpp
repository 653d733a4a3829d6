// `kiln bench vision [--device cuda|cpu] [--sizes 448x448,1024x1024,1920x1080] [--runs N] [--shape 4b|tiny]`
// Times the Qwen3-VL vision tower (random weights; --shape 4b: Qwen3-VL-4B-Instruct's vision_config) on one
// image per size (h x w pixels, resized as the processor would: each side to the nearest multiple of 32): the
// median of --runs encodes after one warm-up, each from host pixel rows to host embeddings (the runner's
// path), with the patch count, merged tokens and the GEMM FLOP rate it implies.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/flags.h"
#include "kiln/config.h"
#include "kiln/error.h"
#include "model/qwen3_vl_vision.h"

namespace {

kiln::ModelConfig vision_shape(const std::string& name) {
  kiln::ModelConfig c;
  c.architecture = "Qwen3VLForConditionalGeneration";
  c.arch = kiln::ModelArch::qwen3_vl_text;
  c.has_vision = true;
  kiln::VisionConfig& v = c.vision;
  if (name == "4b") {  // Qwen3-VL-4B-Instruct
    v.depth = 24, v.hidden_size = 1024, v.intermediate_size = 4096, v.num_heads = 16,
    v.out_hidden_size = 2560;
    v.deepstack_visual_indexes = {5, 11, 17};
  } else if (name == "tiny") {
    v.depth = 2, v.hidden_size = 64, v.intermediate_size = 128, v.num_heads = 4, v.out_hidden_size = 128;
    v.deepstack_visual_indexes = {0};
  } else {
    KILN_FAIL("--shape: expected 4b or tiny, got '", name, "'");
  }
  c.hidden_size = v.out_hidden_size;
  return c;
}

int64_t round32(int64_t x) {
  return std::max<int64_t>(32, int64_t(std::llround(double(x) / 32.0)) * 32);
}

int run_bench_vision(const kiln::cli::Args& args) {
  const kiln::cli::Flags flags(args, {"device", "sizes", "runs", "shape"}, {});
  const kiln::Device dev = kiln::parse_device(flags.str("device", "cuda"));
  KILN_CHECK(!dev.is_cuda() || kiln::cuda_available(), "--device cuda: no GPU is usable");
  const int runs = int(flags.i64("runs", 5));
  KILN_CHECK(runs >= 1, "--runs must be >= 1");
  const kiln::ModelConfig cfg = vision_shape(flags.str("shape", "4b"));
  const kiln::VisionConfig& v = cfg.vision;
  const kiln::Qwen3VLVision tower(cfg, nullptr, 1, dev);
  std::stringstream ss(flags.str("sizes", "448x448,1024x1024,1920x1080"));
  std::string item;
  std::printf("vision tower: depth %lld, width %lld, heads %lld, MLP %lld, out %lld, on %s\n",
              (long long)v.depth, (long long)v.hidden_size, (long long)v.num_heads,
              (long long)v.intermediate_size, (long long)v.out_hidden_size, kiln::device_name(dev).c_str());
  while (std::getline(ss, item, ',')) {
    const size_t x = item.find('x');
    KILN_CHECK(x != std::string::npos, "--sizes: expected HxW entries, got '", item, "'");
    const int64_t H = round32(std::stoll(item.substr(0, x))), W = round32(std::stoll(item.substr(x + 1)));
    kiln::vision::ImagePatches img;
    img.grid_t = 1;
    img.grid_h = int(H / v.patch_size);
    img.grid_w = int(W / v.patch_size);
    img.patch_dim = int(v.patch_dim());
    img.values.resize(size_t(img.patches()) * size_t(img.patch_dim));
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> d(-1.0f, 1.0f);
    for (float& f : img.values) f = d(rng);
    tower.encode({&img});  // warm-up (GEMM tactics, allocations)
    std::vector<double> ms;
    for (int r = 0; r < runs; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      const auto out = tower.encode({&img});  // ends with the copy of the outputs to the host
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    const double med = ms[ms.size() / 2];
    const double N = double(img.patches()), h = double(v.hidden_size), I = double(v.intermediate_size);
    const double m4 = h * 4, merged = N / 4, out = double(v.out_hidden_size);
    const double gemm = 2 * N * (double(v.patch_dim()) * h + v.depth * (4 * h * h + 2 * h * I)) +
                        2 * merged * (m4 * m4 + m4 * out) * double(1 + v.deepstack_visual_indexes.size());
    const double attn = 4.0 * N * N * h * double(v.depth);
    std::printf(
        "  %lldx%lld px -> %d x %d patches (%d tokens): median %.2f ms over %d runs (min %.2f); "
        "GEMM %.1f GFLOP + attention %.1f GFLOP = %.1f TFLOP/s\n",
        (long long)H, (long long)W, img.grid_h, img.grid_w, img.merged_tokens(int(v.spatial_merge_size)), med,
        runs, ms.front(), gemm / 1e9, attn / 1e9, (gemm + attn) / (med * 1e-3) / 1e12);
  }
  return 0;
}

}  // namespace

KILN_COMMAND("bench vision", "time the Qwen3-VL vision tower on images of given sizes (random weights)",
             run_bench_vision);
