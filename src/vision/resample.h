// Antialiased bicubic resize of 8-bit RGB images as the two transformers image-processor backends do it.
// Both are PIL's separable two-pass algorithm (horizontal pass into an 8-bit buffer, then vertical; a pass is
// skipped when that size does not change; Keys cubic a = -0.5, support 2 x the downscale factor, weights
// normalized per output pixel in double), rounded to integers in one of two ways:
//  - torchvision: torch's uint8 antialias kernel (aten UpSampleKernel, AVX2 and generic alike): int16 weights
//    whose precision is the largest p <= 22 with round(max_weight * 2^(p+1)) < 2^15, one p per axis.
//  - pil: Pillow's ImagingResample: int32 weights with 22 fractional bits.
// Every output sample is (sum(w_i * x_i) + 2^(p-1)) >> p clamped to [0, 255].
#pragma once

#include <cstdint>
#include <vector>

namespace kiln::vision {

enum class ResampleKernel { torchvision, pil };

// rgb: [in_h, in_w, 3]; returns [out_h, out_w, 3]. Sizes >= 1 (kiln::Error otherwise).
std::vector<uint8_t> resize_bicubic_rgb(const std::vector<uint8_t>& rgb, int in_w, int in_h, int out_w,
                                        int out_h, ResampleKernel kernel);

}  // namespace kiln::vision
