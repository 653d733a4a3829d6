// Fuzzes the config.json parser: any text either yields a ModelConfig that satisfies the invariants the model
// code relies on (positive sizes, heads divisible, rotary dim even and within head_dim, M-RoPE section
// summing to rotary_dim / 2), or is a kiln::Error.
#include <cstdint>
#include <string>

#include "kiln/config.h"
#include "kiln/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kiln::ModelConfig c;
  try {
    c = kiln::parse_model_config(std::string(reinterpret_cast<const char*>(data), size), "fuzz/config.json");
  } catch (const kiln::Error&) {
    return 0;
  }
  if (c.vocab_size <= 0 || c.hidden_size <= 0 || c.intermediate_size <= 0 || c.num_layers <= 0)
    __builtin_trap();
  if (c.num_heads <= 0 || c.num_kv_heads <= 0 || c.head_dim <= 0 || c.num_heads % c.num_kv_heads != 0)
    __builtin_trap();
  const int64_t rot = c.rotary_dim();
  if (rot <= 0 || rot % 2 != 0 || rot > c.head_dim) __builtin_trap();
  if (!c.mrope_section.empty()) {
    int64_t sum = 0;
    for (int s : c.mrope_section) sum += s;
    if (sum != rot / 2) __builtin_trap();
  }
  for (int64_t id : c.eos_token_ids)
    if (id < 0 || id >= c.vocab_size) __builtin_trap();
  if (!(c.rms_norm_eps > 0) || !(c.rope_theta > 0)) __builtin_trap();
  return 0;
}
