// Rotary scaling as Hugging Face configs spell it (rope_parameters / rope_scaling), resolved at parse time
// so that the table builder (ops/rope_table.h) needs nothing else from config.json.
#pragma once

#include <cstdint>

namespace kiln {

enum class RopeScalingKind : uint8_t {
  none,     // "default" (and "mrope", whose rotation is the default one)
  linear,   // inv_freq / factor
  dynamic,  // dynamic NTK: equal to none up to max_position_embeddings, kiln's context limit
  yarn,     // frequency interpolation by band, cos/sin scaled by attention_factor
};

struct RopeScaling {
  RopeScalingKind kind = RopeScalingKind::none;
  double factor = 1.0;
  // YaRN: the pre-extension context (original_max_position_embeddings, else max_position_embeddings),
  // the ramp's rotation bounds, whether the ramp's ends are rounded to whole dimensions, and the factor
  // applied to cos and sin (attention_factor, or derived from factor / mscale / mscale_all_dim).
  int64_t original_max_position = 0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  bool truncate = true;
  double attention_factor = 1.0;
};

}  // namespace kiln
