// Random attn_prep cases for the GPU tests and benchmarks: host inputs, the same buffers on the GPU,
// poisoning, and byte-for-byte comparison of every buffer the op may touch (outputs and inputs alike).
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/tensor.h"
#include "ops/attn_prep.h"

namespace kiln::test {

using ops::KvLayout;

struct CaseCfg {
  DType act = DType::bf16;
  int D = 128, Hq = 32, Hkv = 8, R = 128;
  int mrope = 0;  // 0 off, 1 sectioned, 2 interleaved
  bool pos64 = false;
  int64_t pos_pad = 0;  // extra elements between the 3 position rows, or token stride - 1 for plain positions
  bool q_contig = true;
  int64_t q_head_pad = 0;
  int64_t row_pad = 0;  // qkv row stride - width
  KvLayout layout = KvLayout::hnd;
  int page = 32;
  DType cache = DType::bf16;
  int64_t cache_pad = 0;  // extra elements per page (K and V pages as parts of a larger pool)
  int T = 8;
  int extra_pages = 2;
  double special = 0;  // fraction of inputs set to special values (0, -0, +-Inf, NaN, huge, tiny)
  double skip = 0.1;   // fraction of tokens with slot -1

  std::string describe() const {
    std::ostringstream os;
    os << "T=" << T << " act=" << dtype_name(act) << " D=" << D << " Hq/Hkv=" << Hq << "/" << Hkv
       << " R=" << R << " mrope=" << mrope << " pos" << (pos64 ? 64 : 32) << "+" << pos_pad
       << " q=" << (q_contig ? "contig" : "inplace") << "+" << q_head_pad << " rowpad=" << row_pad << " "
       << (layout == KvLayout::nhd ? "NHD" : "HND") << " page=" << page << " cache=" << dtype_name(cache)
       << "+" << cache_pad << " special=" << special;
    return os.str();
  }
};

// Every buffer of one case: host bytes, device copies, and views over either.
class Case {
 public:
  CaseCfg c;
  int64_t W = 0, row = 0, q_row = 0, q_head = 0, num_pages = 0, page_elems = 0, scale_page = 0, max_pos = 0;
  std::vector<uint8_t> qkv, q_out, qn, kn, pos, slots, kc, vc, ks, vs;
  std::vector<float> table;

  Case(const CaseCfg& cfg, std::mt19937_64& rng, int64_t table_rows = 4096) : c(cfg) {
    W = int64_t(c.Hq + 2 * c.Hkv) * c.D;
    row = W + c.row_pad;
    q_head = c.D + c.q_head_pad;
    q_row = c.Hq * q_head;
    num_pages = (c.T + c.page - 1) / c.page + c.extra_pages;
    page_elems = int64_t(c.page) * c.Hkv * c.D + c.cache_pad;
    scale_page = int64_t(c.page) * c.Hkv * (c.D / 64 > 0 ? c.D / 64 : 1) + 3;
    max_pos = table_rows;
    table = rope_table(c.R, max_pos);
    qkv.resize(size_t(c.T) * row * 2);
    q_out.resize(size_t(c.T) * q_row * 2);
    qn.resize(size_t(c.D) * 2);
    kn.resize(size_t(c.D) * 2);
    const int64_t npos = c.mrope ? 3 * (c.T + c.pos_pad) : int64_t(c.T) * (1 + c.pos_pad);
    pos.resize(size_t(npos) * (c.pos64 ? 8 : 4));
    slots.resize(size_t(c.T) * 8);
    const size_t esz = c.cache == DType::f8e4m3 ? 1 : 2;
    kc.resize(size_t(num_pages * page_elems) * esz);
    vc.resize(kc.size());
    if (c.cache == DType::f8e4m3) {
      ks.resize(size_t(num_pages * scale_page));
      vs.resize(ks.size());
    }
    randomize(rng);
  }

  // The host table for (R, rows), built once per process (building it is the slow part of a small case).
  static const std::vector<float>& rope_table(int R, int64_t rows) {
    static std::map<std::pair<int, int64_t>, std::vector<float>> cache;
    auto& v = cache[{R, rows}];
    if (v.empty()) {
      Buffer t = ops::build_rope_table(R, 1e6, rows, Device::cpu());
      v.assign(static_cast<const float*>(t.data()), static_cast<const float*>(t.data()) + rows * R);
    }
    return v;
  }

  // Fresh random inputs (qkv, weights, positions, slots); outputs poisoned.
  void randomize(std::mt19937_64& rng) {
    std::normal_distribution<float> nd(0.f, 1.f);
    std::uniform_real_distribution<float> ud(0.f, 1.f);
    const float scale = std::exp(ud(rng) * 6.f - 3.f);  // e^-3 .. e^3
    auto act = [&](float f) { return c.act == DType::bf16 ? f32_to_bf16(f).bits : f32_to_f16(f).bits; };
    const uint16_t specials_bf[] = {0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc0, 0xffc1, 0x7f7f, 0x0001, 0x8080};
    const uint16_t specials_h[] = {0x0000, 0x8000, 0x7c00, 0xfc00, 0x7e00, 0xfe01, 0x7bff, 0x0001, 0x8400};
    auto* q = reinterpret_cast<uint16_t*>(qkv.data());
    for (size_t i = 0; i < qkv.size() / 2; ++i) {
      if (c.special > 0 && ud(rng) < c.special) {
        q[i] = (c.act == DType::bf16 ? specials_bf : specials_h)[rng() % 9];
      } else {
        q[i] = act(nd(rng) * scale);
      }
    }
    for (auto* w : {&qn, &kn}) {
      auto* p = reinterpret_cast<uint16_t*>(w->data());
      for (int i = 0; i < c.D; ++i) p[i] = act(0.25f + 1.75f * ud(rng));
    }
    const int64_t npos = int64_t(pos.size()) / (c.pos64 ? 8 : 4);
    for (int64_t i = 0; i < npos; ++i) {
      const int64_t v = int64_t(rng() % uint64_t(max_pos));
      if (c.pos64) {
        std::memcpy(pos.data() + i * 8, &v, 8);
      } else {
        const int32_t v32 = int32_t(v);
        std::memcpy(pos.data() + i * 4, &v32, 4);
      }
    }
    std::vector<int64_t> perm(size_t(num_pages) * c.page);
    for (size_t i = 0; i < perm.size(); ++i) perm[i] = int64_t(i);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int t = 0; t < c.T; ++t) {
      int64_t s = perm[t];
      if (ud(rng) < c.skip) s = -1 - int64_t(rng() % 5);
      std::memcpy(slots.data() + t * 8, &s, 8);
    }
    poison();
  }

  void poison() {
    std::memset(q_out.data(), 0xa7, q_out.size());
    std::memset(kc.data(), 0xa5, kc.size());
    std::memset(vc.data(), 0x5b, vc.size());
    std::memset(ks.data(), 0x3c, ks.size());
    std::memset(vs.data(), 0xc3, vs.size());
  }

  // Views over the host buffers (base = nullptr) or over device buffers (Dev below).
  ops::AttnPrepArgs args(const std::vector<void*>& base, Device dev) const {
    auto B = [&](int i) { return base[i]; };
    ops::AttnPrepArgs a;
    a.qkv = Tensor::strided(B(0), c.act, {c.T, W}, {row, 1}, dev);
    if (c.q_contig) a.q_out = Tensor::strided(B(1), c.act, {c.T, c.Hq, c.D}, {q_row, q_head, 1}, dev);
    a.q_norm = Tensor(B(2), c.act, {c.D}, dev);
    a.k_norm = Tensor(B(3), c.act, {c.D}, dev);
    a.eps = 1e-6f;
    const DType pt = c.pos64 ? DType::i64 : DType::i32;
    if (c.mrope) {
      a.positions = Tensor::strided(B(4), pt, {3, c.T}, {c.T + c.pos_pad, 1}, dev);
      const int h = c.R / 2;
      const int s1 = h * 5 / 16, s2 = h * 5 / 16;  // {24, 20, 20} for R = 128
      a.mrope = ops::MRope{{h - s1 - s2, s1, s2}, true, c.mrope == 2};
    } else {
      a.positions = Tensor::strided(B(4), pt, {c.T}, {1 + c.pos_pad}, dev);
    }
    a.rope = ops::RopeTable{Tensor(B(5), DType::f32, {max_pos, c.R}, dev), c.R};
    a.slot_mapping = Tensor(B(6), DType::i64, {c.T}, dev);
    const bool nhd = c.layout == KvLayout::nhd;
    const int64_t P = num_pages, S = c.page, H = c.Hkv;
    auto cache4 = [&](void* p, DType t, int64_t last, int64_t page_stride) {
      return nhd ? Tensor::strided(p, t, {P, S, H, last}, {page_stride, H * last, last, 1}, dev)
                 : Tensor::strided(p, t, {P, H, S, last}, {page_stride, S * last, last, 1}, dev);
    };
    a.cache.k = cache4(B(7), c.cache, c.D, page_elems);
    a.cache.v = cache4(B(8), c.cache, c.D, page_elems);
    if (c.cache == DType::f8e4m3) {
      a.cache.k_scale = cache4(B(9), DType::u8, c.D / 64, scale_page);
      a.cache.v_scale = cache4(B(10), DType::u8, c.D / 64, scale_page);
    }
    a.cache.layout = c.layout;
    a.cache.page_size = c.page;
    a.num_q_heads = c.Hq;
    a.num_kv_heads = c.Hkv;
    a.head_dim = c.D;
    return a;
  }

  std::vector<std::vector<uint8_t>*> bufs() {
    return {&qkv, &q_out, &qn, &kn, &pos, &table_bytes_, &slots, &kc, &vc, &ks, &vs};
  }
  std::vector<void*> host_bases() {
    table_bytes_.resize(table.size() * 4);
    std::memcpy(table_bytes_.data(), table.data(), table_bytes_.size());
    std::vector<void*> b;
    for (auto* v : bufs()) b.push_back(v->empty() ? nullptr : v->data());
    return b;
  }

 private:
  std::vector<uint8_t> table_bytes_;
};

// The device side of a Case: one cudaMalloc per buffer, uploads and downloads of all of them.
struct DeviceCase {
  std::vector<Buffer> buf;
  std::vector<void*> base;
  explicit DeviceCase(Case& k) {
    k.host_bases();
    for (auto* v : k.bufs()) {
      buf.emplace_back(v->size() ? v->size() : 1, Device::cuda());
      base.push_back(v->empty() ? nullptr : buf.back().data());
    }
    upload(k);
  }
  void upload(Case& k) {
    auto b = k.bufs();
    for (size_t i = 0; i < b.size(); ++i)
      copy_bytes(buf[i].data(), Device::cuda(), b[i]->data(), Device::cpu(), b[i]->size());
  }
  // Every buffer into a copy of `like` (the reference result of a run).
  Case download(const Case& like) const {
    Case out = like;
    auto b = out.bufs();
    for (size_t i = 0; i < b.size(); ++i)
      copy_bytes(b[i]->data(), Device::cpu(), buf[i].data(), Device::cuda(), b[i]->size());
    return out;
  }
  // Returns the index of the first buffer that differs from `want` ("" when all equal), with the offset.
  std::string diff(Case& want) {
    static const char* names[] = {"qkv",   "q_out",   "q_norm",  "k_norm",  "positions", "rope",
                                  "slots", "k_cache", "v_cache", "k_scale", "v_scale"};
    auto b = want.bufs();
    for (size_t i = 0; i < b.size(); ++i) {
      std::vector<uint8_t> got(b[i]->size());
      copy_bytes(got.data(), Device::cpu(), buf[i].data(), Device::cuda(), got.size());
      for (size_t j = 0; j < got.size(); ++j) {
        if (got[j] != (*b[i])[j]) {
          std::ostringstream os;
          os << names[i] << " byte " << j << ": got 0x" << std::hex << int(got[j]) << " want 0x"
             << int((*b[i])[j]);
          return os.str();
        }
      }
    }
    return "";
  }
};

}  // namespace kiln::test
