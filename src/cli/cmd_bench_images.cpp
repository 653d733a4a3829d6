// kiln bench images: CPU time of Qwen3-VL image preprocessing (src/vision) with the checkpoint's
// preprocessor_config.json (default: Qwen3-VL-4B-Instruct's), for 448x448, 1024x1024 and 1920x1080 images.
//   kiln bench images [--preprocessor-config FILE] [--reps N] [--image FILE ...]
// Synthetic RGB images (a smooth gradient with noise) are preprocessed: resize + normalize + patchify, the
// content hash included. Each --image FILE (PNG, JPEG, WebP) is also timed from its bytes, decoding included.
// Prints the median and minimum of N repetitions (default 5) per image, with the grid and token count, and
// the resize step alone.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <random>

#include "cli/command.h"
#include "cli/flags.h"
#include "kiln/error.h"
#include "vision/processor.h"
#include "vision/qwen3_vl_assets.h"

namespace {

using Clock = std::chrono::steady_clock;

kiln::vision::RgbImage synthetic(int w, int h) {
  kiln::vision::RgbImage im{w, h, std::vector<uint8_t>(size_t(w) * h * 3)};
  std::mt19937 rng(7);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c)
        im.rgb[(size_t(y) * w + x) * 3 + c] =
            uint8_t((x * 255 / w + y * 255 / h * c + int(rng() % 24)) & 255);
  return im;
}

template <typename Fn>
void report(const char* what, int reps, Fn&& fn) {
  std::vector<double> ms;
  kiln::vision::ImagePatches p;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    p = fn();
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  std::printf("| %-28s | %4d x %-4d | %6d | %9.2f | %9.2f |\n", what, p.grid_w * 16, p.grid_h * 16,
              p.merged_tokens(2), ms[ms.size() / 2], ms.front());
}

int run_bench_images(const kiln::cli::Args& args) {
  const kiln::cli::Flags f(args, {"preprocessor-config", "reps", "image"});
  std::string config_text(kiln::vision::qwen3_vl_preprocessor_config_json());
  if (f.has("preprocessor-config")) {
    std::ifstream in(f.str("preprocessor-config"), std::ios::binary);
    KILN_CHECK(in.good(), "cannot read ", f.str("preprocessor-config"));
    config_text.assign(std::istreambuf_iterator<char>(in), {});
  }
  const kiln::vision::ProcessorConfig cfg = kiln::vision::parse_processor_config(config_text);
  const int reps = int(f.i64("reps", 5));
  KILN_CHECK(reps >= 1 && reps <= 1000, "--reps must be in [1, 1000]");
  std::printf("image preprocessing on the CPU (one thread), %s resize, min/max pixels %lld/%lld, %d reps\n\n",
              cfg.kernel == kiln::vision::ResampleKernel::pil ? "PIL" : "torchvision",
              (long long)cfg.min_pixels, (long long)cfg.max_pixels, reps);
  std::printf(
      "| input | resized (w x h) | tokens | median ms | min ms |\n| --- | --- | ---: | ---: | ---: |\n");
  for (auto [w, h] : {std::pair{448, 448}, {1024, 1024}, {1920, 1080}}) {
    const kiln::vision::RgbImage im = synthetic(w, h);
    const std::string name = "RGB " + std::to_string(w) + "x" + std::to_string(h);
    report(name.c_str(), reps, [&] { return kiln::vision::preprocess_image(im, cfg); });
    const std::string resize_name = "  of which resize";
    report(resize_name.c_str(), reps, [&] {
      const kiln::vision::RgbImage r = kiln::vision::resize_for_processor(im, cfg);
      kiln::vision::ImagePatches p;  // the grid only, for the table
      p.grid_t = 1, p.grid_h = r.height / cfg.patch_size, p.grid_w = r.width / cfg.patch_size;
      return p;
    });
  }
  for (const auto& path : f.positional()) KILN_FAIL("unexpected argument '", path, "' (use --image FILE)");
  if (f.has("image")) {
    const std::string path = f.str("image");
    std::ifstream in(path, std::ios::binary);
    KILN_CHECK(in.good(), "cannot read ", path);
    const std::vector<uint8_t> bytes{std::istreambuf_iterator<char>(in), {}};
    const std::string name = "file (decode too) " + path.substr(path.find_last_of('/') + 1);
    report(name.c_str(), reps, [&] { return kiln::vision::preprocess_image_bytes(bytes, cfg, {}); });
  }
  return 0;
}

}  // namespace

KILN_COMMAND("bench images", "CPU time of Qwen3-VL image preprocessing (448x448, 1024x1024, 1920x1080)",
             run_bench_images);
