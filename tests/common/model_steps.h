// Whole-model test helpers, for the CPU and the GPU tests: stepping a Qwen3Model (prefill, then one token a
// step), the GPU-vs-CPU comparison and the check against a Hugging Face fixture.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/test_support.h"
#include "kiln/dtype.h"
#include "kiln/tensor.h"
#include "model/qwen3.h"

namespace kiln::test {

// Edits each step's batch before the forward (e.g. BatchDesc::set_text_mrope for Qwen3-VL); may be empty.
using BatchEdit = std::function<void(BatchDesc&)>;

inline int32_t argmax(const std::vector<float>& v) {
  return int32_t(std::max_element(v.begin(), v.end()) - v.begin());
}

// Runs a greedy (or teacher-forced, when `forced` is non-empty) generation of `steps` tokens from prompt,
// one forward per step (the prompt as one prefill), returning each step's logits. The logits buffer is
// poisoned (NaN) before every forward; a logit left unwritten or non-finite is a test failure.
inline std::vector<std::vector<float>> model_steps(Qwen3Model& m, const std::vector<int32_t>& prompt,
                                                   int steps, const std::vector<int32_t>& forced,
                                                   DType cache_dtype, ops::KvLayout layout, int ps,
                                                   const BatchEdit& edit = {}) {
  const ModelConfig& c = m.config();
  const Device dev = m.device();
  const int pages = int((prompt.size() + size_t(steps) + size_t(ps) - 1) / size_t(ps)) + 1;
  KvCache cache(c, pages, ps, layout, cache_dtype, dev);
  Buffer dl(size_t(c.vocab_size) * 4, dev);
  const std::vector<float> poison(static_cast<size_t>(c.vocab_size), std::numeric_limits<float>::quiet_NaN());
  std::vector<int32_t> seq = prompt;
  std::vector<std::vector<float>> out;
  int32_t cached = 0;
  for (int step = 0; step < steps; ++step) {
    BatchDesc b;
    b.page_size = ps;
    const int32_t n = int32_t(seq.size()) - cached;
    for (int32_t i = 0; i < n; ++i) {
      const int32_t p = cached + i;
      b.tokens.push_back(seq[size_t(p)]);
      b.positions.push_back(p);
      b.slot_mapping.push_back(p);  // pages in order: slot == position
    }
    b.cu_q = {0, n};
    b.kv_lens = {cached + n};
    b.pages_stride = pages;
    for (int i = 0; i < pages; ++i) b.page_table.push_back(i);
    b.logit_rows = {n - 1};
    if (edit) edit(b);
    copy_bytes(dl.data(), dev, poison.data(), Device::cpu(), poison.size() * 4);
    m.forward(b, cache, Tensor(dl.data(), DType::f32, {1, c.vocab_size}, dev));
    std::vector<float> logits(static_cast<size_t>(c.vocab_size));
    copy_bytes(logits.data(), Device::cpu(), dl.data(), dev, logits.size() * 4);
    const auto bad = std::count_if(logits.begin(), logits.end(), [](float x) { return !std::isfinite(x); });
    if (bad)
      ADD_FAILURE() << bad << " of " << logits.size() << " logits unwritten or not finite at step " << step;
    cached += n;
    seq.push_back(forced.empty() ? argmax(logits) : forced[size_t(step)]);
    out.push_back(std::move(logits));
  }
  return out;
}

// Bounds of the whole-model comparisons. CPU and GPU differ in GEMM and attention summation order, so a
// bf16 rounding of an activation can land one ulp apart and the difference propagates; with logits of std
// ~6 one bf16 ulp of a logit is 0.03-0.25. The HF bounds are the CPU test's (tests/unit/test_model_hf.cpp):
// HF bf16 eager rounds attention scores and probabilities to bf16, kiln keeps them in fp32.
constexpr double kModelMaxGreedyDrift = 0.15;
constexpr double kModelMaxRowDrift = 0.5;

// The same model on the CPU and the GPU: for bf16 and fp8 caches, NHD and HND, the GPU teacher-forced on
// the CPU's greedy path of `steps` tokens; every log-prob within kModelMaxRowDrift, and the greedy token
// equal wherever the CPU's top-1/top-2 logit gap exceeds 0.1.
inline void expect_gpu_matches_cpu(Qwen3Model& cpu, Qwen3Model& gpu, const std::vector<int32_t>& prompt,
                                   int steps, const std::string& label, const BatchEdit& edit = {}) {
  using kiln::test_support::log_softmax;
  const int64_t vocab = cpu.config().vocab_size;
  for (DType dt : {DType::bf16, DType::f8e4m3}) {
    for (auto layout : {ops::KvLayout::nhd, ops::KvLayout::hnd}) {
      const auto ref = model_steps(cpu, prompt, steps, {}, dt, layout, 16, edit);
      std::vector<int32_t> forced;
      for (const auto& l : ref) forced.push_back(argmax(l));
      const auto got = model_steps(gpu, prompt, steps, forced, dt, layout, 32, edit);
      double worst = 0;
      int agree = 0;
      for (size_t s = 0; s < ref.size(); ++s) {
        const auto a = log_softmax(ref[s].data(), vocab), b = log_softmax(got[s].data(), vocab);
        for (size_t v = 0; v < a.size(); ++v) worst = std::max(worst, std::abs(a[v] - b[v]));
        const int32_t g = argmax(got[s]);
        agree += g == forced[s];
        // A different greedy token is a failure only when the CPU's choice was not a near tie.
        std::vector<float> sorted = ref[s];
        std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
        if (sorted[0] - sorted[1] > 0.1f) {
          EXPECT_EQ(g, forced[s]) << label << " step " << s;
        }
      }
      std::printf("cuda vs cpu, %s (%s, %s): max |logprob drift| %.4f, greedy agreement %d/%d\n",
                  label.c_str(), std::string(dtype_name(dt)).c_str(),
                  layout == ops::KvLayout::nhd ? "NHD" : "HND", worst, agree, steps);
      EXPECT_LE(worst, kModelMaxRowDrift) << label;
    }
  }
}

// A Hugging Face fixture (tests/fixtures/hf/<name>: hf_reference.json with full step_logprobs rows) loaded
// on `dev`, teacher-forced on HF's greedy path: greedy tokens equal, the greedy token's log-prob within
// kModelMaxGreedyDrift, every token HF gives a log-prob above -20 within kModelMaxRowDrift.
inline void check_hf_fixture_model(const std::string& dir, Device dev, const BatchEdit& edit = {}) {
  using kiln::test_support::log_softmax;
  std::ifstream f(dir + "/hf_reference.json");
  ASSERT_TRUE(f) << "missing fixture " << dir;
  const auto ref = nlohmann::json::parse(f);
  LoadOptions o;
  o.device = dev;
  auto model = Qwen3Model::load(dir, o);
  for (const auto& cs : ref["cases"]) {
    const auto prompt = cs["prompt_ids"].get<std::vector<int32_t>>();
    const auto want = cs["greedy_ids"].get<std::vector<int32_t>>();
    const auto steps = cs["step_logprobs"].get<std::vector<std::vector<double>>>();
    const auto logits =
        model_steps(*model, prompt, int(want.size()), want, DType::bf16, ops::KvLayout::hnd, 16, edit);
    std::vector<int32_t> got;
    double worst = 0, worst_greedy = 0;
    for (size_t s = 0; s < want.size(); ++s) {
      got.push_back(argmax(logits[s]));
      const auto lp = log_softmax(logits[s].data(), int64_t(logits[s].size()));
      for (size_t v = 0; v < lp.size(); ++v)
        if (steps[s][v] > -20) worst = std::max(worst, std::abs(lp[v] - steps[s][v]));
      worst_greedy = std::max(worst_greedy, std::abs(lp[size_t(want[s])] - steps[s][size_t(want[s])]));
    }
    EXPECT_EQ(got, want) << dir;
    EXPECT_LE(worst_greedy, kModelMaxGreedyDrift) << dir;
    EXPECT_LE(worst, kModelMaxRowDrift) << dir;
    std::printf("%s %s: greedy %s, max |logprob drift| greedy tokens %.4f, all tokens above -20 %.4f\n",
                dev.is_cuda() ? "cuda" : "cpu", dir.substr(dir.find_last_of('/') + 1).c_str(),
                got == want ? "equal" : "DIFFERENT", worst_greedy, worst);
  }
}

}  // namespace kiln::test
