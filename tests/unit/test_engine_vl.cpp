// Qwen3-VL images through the runtime engine on the CPU (tiny random-weight model, vl_test_util.h): a
// chunked prefill that splits an image gives the tokens of an unsplit one; a repeated image hits the prefix
// cache (and is not encoded again) while a different image with the same tokens does not; requests batched
// together, and preempted ones, give what each gives alone; bad image inputs are rejected at submit; an
// abort or an abortive shutdown during a vision pass stops it between the tower's blocks.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>

#include "engine_test_util.h"
#include "kiln/error.h"
#include "model/qwen3.h"
#include "runtime/qwen3_runner.h"
#include "runtime/vl_images.h"
#include "vl_test_util.h"

namespace kiln {
namespace {

using test::greedy;
using test::Sink;

struct VlEngine {
  std::unique_ptr<Engine> engine;
  Qwen3Runner* runner = nullptr;  // owned by the engine; read only while it is idle
};

template <typename Runner = Qwen3Runner>
VlEngine make_engine(const EngineOptions& opts, const ModelConfig& cfg = test::tiny_vl_config()) {
  LoadOptions lo;
  lo.device = Device::cpu();
  lo.load_format = LoadFormat::random;
  lo.seed = 7;
  auto runner =
      std::make_unique<Runner>(Qwen3Model::create(cfg, nullptr, lo), ops::KvLayout::nhd, DType::bf16);
  VlEngine v;
  v.runner = runner.get();
  v.engine = std::make_unique<Engine>(std::move(runner), opts);
  return v;
}

Request image_request(const std::vector<vision::ImagePatches>& imgs, int text_before, int salt, int n) {
  Request r = greedy(test::vl_prompt(imgs, text_before, salt), n);
  r.images = imgs;
  r.sampling.return_logprob = true;
  return r;
}

// Runs the requests concurrently; returns each one's tokens and its final event.
std::vector<std::pair<std::vector<int32_t>, TokenEvent>> run_all(Engine& e,
                                                                 const std::vector<Request>& reqs) {
  Sink sink;
  std::vector<RequestId> ids;
  for (const Request& r : reqs) ids.push_back(e.submit(r, sink.cb()));
  sink.wait_finished(int(reqs.size()));
  sink.expect_one_finish_each();
  std::vector<std::pair<std::vector<int32_t>, TokenEvent>> out;
  for (RequestId id : ids) {
    out.emplace_back(sink.tokens(id), sink.last(id));
    EXPECT_EQ(out.back().second.finish_reason, "length") << out.back().second.error;
  }
  return out;
}

const std::vector<vision::ImagePatches> kA = {test::test_image(8, 12, 1)};  // 24 pads
const std::vector<vision::ImagePatches> kB = {test::test_image(8, 12, 2)};

TEST(EngineVl, ChunkedPrefillSplittingAnImageEqualsWhole) {
  const Request r = image_request({kA[0], test::test_image(4, 6, 3)}, 6, 1, 8);
  VlEngine whole = make_engine(test::small_opts(4096, 4, 4096));
  const auto ref = run_all(*whole.engine, {r});
  ASSERT_EQ(ref[0].first.size(), 8u);
  for (int chunk : {5, 13}) {  // boundaries inside both images
    VlEngine split = make_engine(test::small_opts(4096, 4, chunk));
    const auto got = run_all(*split.engine, {r});
    EXPECT_EQ(got[0].first, ref[0].first) << "chunk " << chunk;
    EXPECT_EQ(got[0].second.logprobs, ref[0].second.logprobs) << "chunk " << chunk;
    test::expect_pool_clean(*split.engine);
  }
}

// Steps with no image-pad row (decode, text chunks) run plain RoPE at p + the image offset (so a decode
// step can replay a CUDA graph): bitwise what three equal M-RoPE rows give, for image and text requests
// batched together; a wrong or missing offset would change every decode logprob.
TEST(EngineVl, PlainDecodePositionsEqualMropeRowsBitwise) {
  std::vector<Request> reqs = {
      image_request(kA, 3, 1, 12),
      image_request({test::test_image(4, 4, 9), test::test_image(2, 6, 8)}, 2, 3, 12)};
  Request text = greedy(test::prompt_of(20, 4), 12);
  text.sampling.return_logprob = true;
  reqs.push_back(text);
  for (int chunk : {4096, 7}) {
    VlEngine plain = make_engine(test::small_opts(4096, 4, chunk));
    VlEngine mrope = make_engine<test::MropeEveryStepRunner>(test::small_opts(4096, 4, chunk));
    const auto got = run_all(*plain.engine, reqs), want = run_all(*mrope.engine, reqs);
    for (size_t i = 0; i < reqs.size(); ++i) {
      EXPECT_EQ(got[i].first, want[i].first) << "request " << i << ", chunk " << chunk;
      EXPECT_EQ(got[i].second.logprobs, want[i].second.logprobs) << "request " << i << ", chunk " << chunk;
    }
  }
}

TEST(EngineVl, TextPositionsCarryTheImageOffsetAndRefuseImageRows) {
  const ModelConfig cfg = test::tiny_vl_config();
  const std::vector<int32_t> prompt = test::vl_prompt(kA, 3, 1);
  const VlPromptLayout layout = layout_vl_prompt(cfg, prompt, kA);
  ASSERT_LT(layout.delta, 0) << "a 4 x 6 merged grid spans fewer positions than its 24 pads";
  VlImages images;
  images.attach(5, layout, kA);
  const int32_t P = int32_t(prompt.size());
  auto step = [&](std::vector<int32_t> kv_lens, std::vector<int32_t> q_lens) {
    BatchDesc b;
    b.page_size = 16;
    b.pages_stride = 8;
    b.cu_q = {0};
    for (size_t s = 0; s < kv_lens.size(); ++s) {
      b.seq_ids.push_back(s == 0 ? 5 : 9);  // 9: a request without images
      b.kv_lens.push_back(kv_lens[s]);
      b.cu_q.push_back(b.cu_q.back() + q_lens[s]);
      for (int32_t i = 0; i < q_lens[s]; ++i) {
        b.tokens.push_back(1);
        b.positions.push_back(kv_lens[s] - q_lens[s] + i);
        b.slot_mapping.push_back(0);
      }
      b.page_table.insert(b.page_table.end(), 8, 0);
    }
    return b;
  };
  BatchDesc decode = step({P + 4, 30}, {1, 1});
  EXPECT_TRUE(images.plain_positions_suffice(decode));
  ASSERT_TRUE(images.text_positions(decode));
  EXPECT_FALSE(decode.mrope);
  EXPECT_EQ(decode.positions, (std::vector<int32_t>{P + 3 + layout.delta, 29}));
  ASSERT_TRUE(images.text_positions(decode)) << "idempotent";
  EXPECT_EQ(decode.positions, (std::vector<int32_t>{P + 3 + layout.delta, 29}));
  BatchDesc text_chunk = step({3}, {3});  // the text before the image: positions 0, 1, 2 on every axis
  ASSERT_TRUE(images.text_positions(text_chunk));
  EXPECT_EQ(text_chunk.positions, (std::vector<int32_t>{0, 1, 2}));
  BatchDesc pad_row = step({P + 4, 3 + 1 + 5}, {1, 1});
  pad_row.seq_ids = {9, 5};  // request 5's row is its fifth image pad
  const BatchDesc before = pad_row;
  EXPECT_FALSE(images.plain_positions_suffice(pad_row));
  EXPECT_FALSE(images.text_positions(pad_row));
  EXPECT_EQ(pad_row.positions, before.positions) << "left as it came";
  BatchDesc already = step({P + 4}, {1});
  already.set_text_mrope();
  EXPECT_FALSE(images.text_positions(already));
}

TEST(EngineVl, TheImageChangesTheOutput) {
  VlEngine e = make_engine(test::small_opts(4096));
  const auto a = run_all(*e.engine, {image_request(kA, 6, 1, 6)});
  const auto b = run_all(*e.engine, {image_request(kB, 6, 1, 6)});
  EXPECT_NE(a[0].second.logprobs, b[0].second.logprobs);
}

TEST(EngineVl, RepeatedImageHitsThePrefixCacheDifferentImageDoesNot) {
  const Request ra = image_request(kA, 9, 2, 6), rb = image_request(kB, 9, 2, 6);
  ASSERT_EQ(ra.prompt, rb.prompt) << "same tokens, different pixels";
  VlEngine fresh_b = make_engine(test::small_opts(4096));
  const auto b_alone = run_all(*fresh_b.engine, {rb});

  VlEngine e = make_engine(test::small_opts(4096));
  const auto first = run_all(*e.engine, {ra});
  EXPECT_EQ(first[0].second.cached_tokens, 0);
  EXPECT_EQ(e.runner->images().images_encoded_total(), 1);
  const auto again = run_all(*e.engine, {ra});
  // Everything but the last prompt token's page comes from the cache, past the whole image.
  const int pad_end = 9 + 1 + 24;
  EXPECT_GE(again[0].second.cached_tokens, pad_end);
  EXPECT_EQ(e.runner->images().images_encoded_total(), 1) << "a fully cached image is not encoded again";
  EXPECT_EQ(again[0].first, first[0].first);
  EXPECT_EQ(again[0].second.logprobs, first[0].second.logprobs);
  const auto other = run_all(*e.engine, {rb});
  EXPECT_LE(other[0].second.cached_tokens, 9) << "a different image shares no page past its <|vision_start|>";
  EXPECT_EQ(e.runner->images().images_encoded_total(), 2);
  EXPECT_EQ(other[0].first, b_alone[0].first);
  EXPECT_EQ(other[0].second.logprobs, b_alone[0].second.logprobs);
  test::expect_pool_clean(*e.engine);
}

TEST(EngineVl, BatchedAndPreemptedRequestsEqualEachAlone) {
  std::vector<Request> reqs = {
      image_request(kA, 3, 1, 10), image_request(kB, 5, 2, 10),
      image_request({test::test_image(4, 4, 9), test::test_image(2, 6, 8)}, 2, 3, 10)};
  Request text = greedy(test::prompt_of(20, 4), 10);
  text.sampling.return_logprob = true;
  reqs.push_back(text);
  std::vector<std::vector<float>> alone;
  for (const Request& r : reqs) {
    VlEngine e = make_engine(test::small_opts(4096, 4, 4096));
    alone.push_back(run_all(*e.engine, {r})[0].second.logprobs);
  }
  VlEngine together = make_engine(test::small_opts(4096, 4, 16));
  const auto got = run_all(*together.engine, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(got[i].second.logprobs, alone[i]) << "request " << i;
  // A pool of 72 tokens without an admission reserve: running requests outgrow it, the newest are
  // preempted and recompute their prompts (images included) later.
  EngineOptions tight_opts = test::small_opts(72, 4, 16);
  tight_opts.admission_reserve = 0.0;
  VlEngine tight = make_engine(tight_opts);
  const auto pre = run_all(*tight.engine, reqs);
  EXPECT_GT(tight.engine->stats().preemptions, 0);
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(pre[i].second.logprobs, alone[i]) << "request " << i;
  test::expect_pool_clean(*tight.engine);
}

TEST(EngineVl, BadImageInputsAreRejectedAtSubmit) {
  VlEngine e = make_engine(test::small_opts(4096));
  Sink sink;
  Request r = image_request(kA, 4, 1, 4);
  r.prompt.pop_back();  // keep the pads intact: drop trailing text
  Request short_pads = r;
  short_pads.prompt.erase(short_pads.prompt.begin() + 6);
  EXPECT_THROW(e.engine->submit(short_pads, sink.cb()), Error);
  Request no_image = r;
  no_image.images.clear();
  EXPECT_THROW(e.engine->submit(no_image, sink.cb()), Error);
  EXPECT_EQ(e.engine->stats().requests_submitted, 0);
  // A text-only model given an image.
  nlohmann::json j = test::tiny_vl_config_json()["text_config"];
  j["architectures"] = {"Qwen3ForCausalLM"};
  j["tie_word_embeddings"] = true;
  VlEngine text = make_engine(test::small_opts(4096), parse_model_config(j.dump(), "text config"));
  try {
    text.engine->submit(r, sink.cb());
    ADD_FAILURE() << "a text-only model accepted an image";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("text-only"), std::string::npos) << err.what();
  }
  // The engine still serves.
  const auto ok = run_all(*e.engine, {image_request(kA, 4, 1, 3)});
  EXPECT_EQ(ok[0].first.size(), 3u);
}

// At the vision tower's first check (or check number abort_at: later ones come from the attention's worker
// threads, ops::varlen_attention's `stop`), aborts the request asked about (or shuts the engine down,
// abortively) through the engine, then answers with the engine's own check: an abort that arrives while
// the pass runs, deterministically. Counts the checks.
class AbortInVisionRunner : public Qwen3Runner {
 public:
  using Qwen3Runner::Qwen3Runner;
  std::atomic<Engine*> engine{nullptr};
  std::atomic<bool> shutdown_instead{false};
  std::atomic<int> checks{0}, abort_at{0};  // abort at check number abort_at (0: the first)
  void set_abandoned_check(std::function<bool(uint64_t)> abandoned) override {
    Qwen3Runner::set_abandoned_check([this, abandoned](uint64_t id) {
      if (checks++ == abort_at) {
        if (shutdown_instead)
          engine.load()->shutdown(false);  // from the engine thread: does not join itself
        else
          engine.load()->abort(id);
      }
      return abandoned(id);
    });
  }
};

TEST(EngineVl, AbortDuringTheVisionPassStopsItAtTheNextBlock) {
  Request text = greedy(test::prompt_of(20, 4), 6);
  text.sampling.return_logprob = true;
  VlEngine alone = make_engine(test::small_opts(4096, 4, 4096));
  const auto want = run_all(*alone.engine, {text});

  VlEngine v = make_engine<AbortInVisionRunner>(test::small_opts(4096, 4, 4096));
  auto& runner = static_cast<AbortInVisionRunner&>(*v.runner);
  runner.engine = v.engine.get();
  Sink sink;
  const RequestId img = v.engine->submit(image_request(kA, 3, 1, 6), sink.cb());
  const RequestId txt = v.engine->submit(text, sink.cb());
  sink.wait_finished(2);
  sink.expect_one_finish_each();
  EXPECT_EQ(sink.last(img).finish_reason, "abort");
  EXPECT_TRUE(sink.tokens(img).empty());
  EXPECT_EQ(runner.checks.load(), 1) << "the pass stopped before its first block";
  EXPECT_EQ(runner.images().images_encoded_total(), 0);
  const EngineStats s = v.engine->stats();
  EXPECT_EQ(s.steps_cancelled, 1);
  EXPECT_EQ(s.finished_abort, 1);
  // A request planned into the cancelled step is planned again: it gives what it gives alone.
  EXPECT_EQ(sink.last(txt).finish_reason, "length");
  EXPECT_EQ(sink.tokens(txt), want[0].first);
  EXPECT_EQ(sink.last(txt).logprobs, want[0].second.logprobs);
  test::expect_pool_clean(*v.engine);
  // The engine still encodes images.
  const auto ok = run_all(*v.engine, {image_request(kA, 3, 1, 2)});
  EXPECT_EQ(ok[0].first.size(), 2u);
  EXPECT_EQ(runner.images().images_encoded_total(), 1);
}

TEST(EngineVl, AbortInsideTheVisionAttentionStopsThePass) {
  VlEngine v = make_engine<AbortInVisionRunner>(test::small_opts(4096, 4, 4096));
  auto& runner = static_cast<AbortInVisionRunner&>(*v.runner);
  runner.engine = v.engine.get();
  runner.abort_at =
      1;  // the first check inside block 0's attention (96 patches x 2 heads: polls at 0, 64, 128)
  Sink sink;
  const RequestId img = v.engine->submit(image_request(kA, 3, 1, 6), sink.cb());
  sink.wait_finished(1);
  EXPECT_EQ(sink.last(img).finish_reason, "abort");
  EXPECT_LE(runner.checks.load(), 5) << "block 0's attention stopped, or the check right after it";
  EXPECT_EQ(runner.images().images_encoded_total(), 0);
  EXPECT_EQ(v.engine->stats().steps_cancelled, 1);
  test::expect_pool_clean(*v.engine);
}

TEST(EngineVl, AbortiveShutdownDuringTheVisionPassEndsItAborted) {
  VlEngine v = make_engine<AbortInVisionRunner>(test::small_opts(4096, 4, 4096));
  auto& runner = static_cast<AbortInVisionRunner&>(*v.runner);
  runner.engine = v.engine.get();
  runner.shutdown_instead = true;
  Sink sink;
  const RequestId img = v.engine->submit(image_request(kA, 3, 1, 6), sink.cb());
  sink.wait_finished(1);
  v.engine->shutdown(false);  // joins the engine thread
  EXPECT_EQ(sink.last(img).finish_reason, "abort");
  EXPECT_EQ(runner.checks.load(), 1);
  EXPECT_EQ(runner.images().images_encoded_total(), 0);
  const EngineStats s = v.engine->stats();
  EXPECT_EQ(s.steps_cancelled, 1);
  EXPECT_EQ(s.kv_pages_used, 0);
}

}  // namespace
}  // namespace kiln
