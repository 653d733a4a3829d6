// Engine::create: builds the model runner named by the options. The Qwen3 runner is wired in
// qwen3_runner.cpp once src/model provides Qwen3Model; until then this says so plainly.
#include "runtime/engine.h"
#include "runtime/model_runner.h"

namespace kiln {

std::unique_ptr<Engine> Engine::create(const EngineOptions& opts) {
  KILN_CHECK(!opts.model_dir.empty(), "no model directory given");
  KILN_FAIL("Engine::create: the Qwen3 model runner is not available in this build yet (model '",
            opts.model_dir, "'); construct Engine with a ModelRunner instead");
}

}  // namespace kiln
