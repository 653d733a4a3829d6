#include "runtime/vl_images.h"

#include <algorithm>

#include "kiln/error.h"

namespace kiln {

void VlImages::attach(uint64_t request, VlPromptLayout layout, std::vector<vision::ImagePatches> images) {
  KILN_CHECK_EQ(layout.spans.size(), images.size(), "VlImages::attach: one span per image");
  Entry e;
  e.request = request;
  e.layout = std::move(layout);
  e.images = std::move(images);
  e.encoded.resize(e.images.size());
  map_[request] = std::move(e);
}

int VlImages::encoded_images(uint64_t request) const {
  const auto it = map_.find(request);
  if (it == map_.end()) return 0;
  return int(std::count_if(it->second.encoded.begin(), it->second.encoded.end(),
                           [](const auto& o) { return o.has_value(); }));
}

int VlImages::Entry::image_at(int32_t p) const {
  const auto& s = layout.spans;
  auto it = std::upper_bound(s.begin(), s.end(), p,
                             [](int32_t v, const VlPromptLayout::Span& sp) { return v < sp.first_pad; });
  if (it == s.begin()) return -1;
  --it;
  return p < it->first_pad + it->count ? int(it - s.begin()) : -1;
}

void VlImages::prepare(BatchDesc& b, const Qwen3VLVision& vision, VisualInput& visual,
                       const std::function<bool(uint64_t)>& abandoned) {
  visual = VisualInput{};
  if (map_.empty() || b.seq_ids.empty()) return;
  if (!b.mrope) b.set_text_mrope();
  const int32_t T = b.num_tokens();
  struct Row {
    int32_t t;
    Entry* e;
    int image;
    int32_t r;  // merged row within the image
  };
  std::vector<Row> rows;
  std::vector<std::pair<Entry*, int>> need;
  for (int32_t s = 0; s < b.num_seqs(); ++s) {
    const auto it = map_.find(b.seq_ids[size_t(s)]);
    if (it == map_.end()) continue;
    Entry& e = it->second;
    const int32_t q = b.q_len(s), start = b.kv_lens[size_t(s)] - q;
    for (int32_t i = 0; i < q; ++i) {
      const int32_t p = start + i, t = b.cu_q[size_t(s)] + i;
      for (int a = 0; a < 3; ++a) b.positions[size_t(a) * size_t(T) + size_t(t)] = e.layout.position(p, a);
      const int k = p < e.layout.prompt_len ? e.image_at(p) : -1;
      if (k < 0) continue;
      rows.push_back({t, &e, k, p - e.layout.spans[size_t(k)].first_pad});
      if (!e.encoded[size_t(k)] && std::find(need.begin(), need.end(), std::make_pair(&e, k)) == need.end())
        need.emplace_back(&e, k);
    }
  }
  if (!need.empty()) {
    std::vector<const vision::ImagePatches*> imgs;
    for (const auto& [e, k] : need) imgs.push_back(&e->images[size_t(k)]);
    std::function<bool()> stop;
    if (abandoned)
      stop = [&] {
        return std::all_of(need.begin(), need.end(),
                           [&](const auto& n) { return abandoned(n.first->request); });
      };
    std::vector<VisionOutput> out = vision.encode(imgs, stop);
    for (size_t i = 0; i < need.size(); ++i)
      need[i].first->encoded[size_t(need[i].second)] = std::move(out[i]);
    encoded_total_ += int64_t(need.size());
  }
  if (rows.empty()) return;
  const int64_t H = vision.config().out_hidden_size, n = int64_t(rows.size());
  const int32_t L = int32_t(vision.config().deepstack_visual_indexes.size());
  visual.deepstack_layers = L;
  visual.rows.reserve(size_t(n));
  visual.embeds.resize(size_t(n * H));
  visual.deepstack.resize(size_t(L) * size_t(n * H));
  for (int64_t i = 0; i < n; ++i) {
    const Row& r = rows[size_t(i)];
    const VisionOutput& o = *r.e->encoded[size_t(r.image)];
    visual.rows.push_back(r.t);
    std::copy_n(o.embeds.begin() + r.r * H, H, visual.embeds.begin() + i * H);
    for (int32_t l = 0; l < L; ++l)
      std::copy_n(o.deepstack[size_t(l)].begin() + r.r * H, H, visual.deepstack.begin() + (l * n + i) * H);
  }
}

template <typename F>
bool VlImages::each_text_row(const BatchDesc& b, F&& f) const {
  if (b.mrope) return false;
  if (map_.empty() || b.seq_ids.empty()) return true;
  for (int32_t s = 0; s < b.num_seqs(); ++s) {
    const auto it = map_.find(b.seq_ids[size_t(s)]);
    if (it == map_.end()) continue;
    const Entry& e = it->second;
    const int32_t q = b.q_len(s), start = b.kv_lens[size_t(s)] - q;
    for (int32_t i = 0; i < q; ++i) {
      const int32_t p = start + i, pos = e.layout.position(p, 0);
      if ((p < e.layout.prompt_len && e.image_at(p) >= 0) || e.layout.position(p, 1) != pos ||
          e.layout.position(p, 2) != pos)
        return false;
      f(b.cu_q[size_t(s)] + i, pos);
    }
  }
  return true;
}

bool VlImages::plain_positions_suffice(const BatchDesc& b) const {
  return each_text_row(b, [](int32_t, int32_t) {});
}

bool VlImages::text_positions(BatchDesc& b) const {
  // Checked first, written second: a step that needs M-RoPE rows is left as it came.
  if (!plain_positions_suffice(b)) return false;
  each_text_row(b, [&](int32_t t, int32_t pos) { b.positions[size_t(t)] = pos; });
  return true;
}

void VlImages::step_done(const BatchDesc& b) {
  for (int32_t s = 0; s < int32_t(b.seq_ids.size()); ++s) {
    const auto it = map_.find(b.seq_ids[size_t(s)]);
    if (it == map_.end()) continue;
    Entry& e = it->second;
    const int32_t computed = b.kv_lens[size_t(s)];
    for (size_t k = 0; k < e.encoded.size(); ++k)
      if (e.encoded[k] && e.layout.spans[k].first_pad + e.layout.spans[k].count <= computed)
        e.encoded[k].reset();
  }
}

}  // namespace kiln
