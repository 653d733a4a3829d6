// VlImages: the Qwen3-VL runner's per-request image state. A request's images stay here (as the
// processor's patches) from admission until release_request; their encoder outputs exist only while a
// step's prefill rows cover their pad tokens: encoded on demand (every image a step needs, across all its
// requests, in one vision pass), dropped once the prefill has passed the image. A preempted request that
// recomputes its prompt, or a chunk boundary inside an image, simply re-encodes or reuses; pads served
// from the prefix cache are never encoded.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <unordered_map>
#include <vector>

#include "kiln/batch.h"
#include "model/qwen3.h"
#include "model/qwen3_vl_prompt.h"
#include "model/qwen3_vl_vision.h"

namespace kiln {

class VlImages {
 public:
  void attach(uint64_t request, VlPromptLayout layout, std::vector<vision::ImagePatches> images);
  void release(uint64_t request) { map_.erase(request); }
  bool empty() const { return map_.empty(); }
  // Images of `request` whose encoder output is held now (tests).
  int encoded_images(uint64_t request) const;
  int64_t images_encoded_total() const { return encoded_total_; }  // vision-tower image encodings so far

  // For one step (batch.seq_ids names the requests; positions already three equal rows): writes the M-RoPE
  // positions of the attached requests' rows, encodes the images whose pads the step computes, and fills
  // `visual` with those rows' embeddings and deepstack features (hidden = the decoder's width).
  // `abandoned(request)` (when set) is asked between the vision tower's blocks: once it holds for every
  // request whose image the pass encodes, the pass stops and VisionCancelled propagates (nothing encoded).
  void prepare(BatchDesc& batch, const Qwen3VLVision& vision, VisualInput& visual,
               const std::function<bool(uint64_t request)>& abandoned = {});
  // For a plain (not M-RoPE) step none of whose rows is an image pad (decode steps, text chunks): writes
  // the attached requests' text positions (equal on all three axes: p + the image offset) into the plain
  // positions and returns true; plain RoPE rotates them bitwise as M-RoPE rotates three equal rows, so
  // such a step needs no M-RoPE rows and a decode step can replay a CUDA graph. Otherwise returns false
  // and changes nothing. Idempotent.
  bool text_positions(BatchDesc& batch) const;
  bool plain_positions_suffice(const BatchDesc& batch) const;  // text_positions would return true
  // After the step ran: drops the encodings the prefill has passed.
  void step_done(const BatchDesc& batch);

 private:
  struct Entry {
    uint64_t request = 0;
    VlPromptLayout layout;
    std::vector<vision::ImagePatches> images;
    std::vector<std::optional<VisionOutput>> encoded;  // per image
    // The image whose pads include context position p and p's row in it, or -1.
    int image_at(int32_t p) const;
  };
  // Calls f(token row, text position) for each row of an attached request; false (stopping) at a row
  // that needs M-RoPE rows (an image pad), or when the batch has them already.
  template <typename F>
  bool each_text_row(const BatchDesc& batch, F&& f) const;

  std::unordered_map<uint64_t, Entry> map_;
  std::atomic<int64_t> encoded_total_{0};
};

}  // namespace kiln
