#include "runtime/tp_command.h"

#include <cstring>

#include "kiln/error.h"

namespace kiln {
namespace {

constexpr uint32_t kMagic = 0x4b54506bu;  // "kPTK"
constexpr uint64_t kMaxPayload = uint64_t(1) << 32;

class Writer {
 public:
  template <typename T>
  void put(T v) {
    const size_t at = s_.size();
    s_.resize(at + sizeof(T));
    std::memcpy(s_.data() + at, &v, sizeof(T));
  }
  template <typename T>
  void put_vec(const std::vector<T>& v) {
    put<uint64_t>(v.size());
    const size_t at = s_.size();
    s_.resize(at + v.size() * sizeof(T));
    if (!v.empty()) std::memcpy(s_.data() + at, v.data(), v.size() * sizeof(T));
  }
  std::string take() { return std::move(s_); }

 private:
  std::string s_;
};

class Reader {
 public:
  Reader(const void* p, size_t n) : p_(static_cast<const char*>(p)), n_(n) {}
  template <typename T>
  T get() {
    KILN_CHECK(n_ - at_ >= sizeof(T), "tensor-parallel command: truncated at byte ", at_);
    T v;
    std::memcpy(&v, p_ + at_, sizeof(T));
    at_ += sizeof(T);
    return v;
  }
  template <typename T>
  std::vector<T> get_vec() {
    const uint64_t k = get<uint64_t>();
    KILN_CHECK(k <= (n_ - at_) / sizeof(T), "tensor-parallel command: a vector of ", k,
               " elements runs past the payload");
    std::vector<T> v(static_cast<size_t>(k));
    if (k) std::memcpy(v.data(), p_ + at_, size_t(k) * sizeof(T));
    at_ += size_t(k) * sizeof(T);
    return v;
  }
  bool done() const { return at_ == n_; }

 private:
  const char* p_;
  size_t n_, at_ = 0;
};

}  // namespace

std::string tp_encode(const TpCommand& c) {
  Writer w;
  w.put<int32_t>(c.a);
  w.put<int32_t>(c.b);
  const ModelRunner::GraphPlan& g = c.graph;
  w.put<uint8_t>(uint8_t(c.want_logits) | uint8_t(c.want_hidden) << 1 | uint8_t(g.pdl) << 2 |
                 uint8_t(c.batch.mrope) << 3);
  w.put_vec(g.buckets);
  w.put<int32_t>(g.max_pages_per_seq);
  w.put<int32_t>(g.max_seqs);
  w.put<int32_t>(g.pdl_min_batch);
  w.put<int64_t>(g.max_step_tokens);
  const BatchDesc& b = c.batch;
  w.put_vec(b.tokens);
  w.put_vec(b.positions);
  w.put_vec(b.slot_mapping);
  w.put_vec(b.cu_q);
  w.put_vec(b.kv_lens);
  w.put_vec(b.page_table);
  w.put<int32_t>(b.pages_stride);
  w.put<int32_t>(b.page_size);
  w.put_vec(b.logit_rows);
  w.put_vec(c.move_from);
  w.put_vec(c.move_to);
  return w.take();
}

std::string tp_header(const TpCommand& c, size_t payload_bytes) {
  std::string h(kTpHeaderBytes, '\0');
  const uint32_t magic = kMagic;
  const int32_t op = int32_t(c.op);
  const uint64_t n = payload_bytes;
  std::memcpy(h.data(), &magic, 4);
  std::memcpy(h.data() + 4, &op, 4);
  std::memcpy(h.data() + 8, &n, 8);
  return h;
}

size_t tp_payload_bytes(const void* header) {
  uint32_t magic;
  uint64_t n;
  std::memcpy(&magic, header, 4);
  std::memcpy(&n, static_cast<const char*>(header) + 8, 8);
  KILN_CHECK(magic == kMagic, "tensor-parallel command: bad header (ranks out of step?)");
  KILN_CHECK(n < kMaxPayload, "tensor-parallel command: payload of ", n, " bytes");
  return size_t(n);
}

TpCommand tp_decode(const void* header, const void* payload, size_t bytes) {
  KILN_CHECK_EQ(tp_payload_bytes(header), bytes, "tensor-parallel command: payload size");
  TpCommand c;
  int32_t op;
  std::memcpy(&op, static_cast<const char*>(header) + 4, 4);
  KILN_CHECK(op >= int32_t(TpCommand::Op::allocate_kv) && op <= int32_t(TpCommand::Op::move_kv),
             "tensor-parallel command: unknown op ", op);
  c.op = TpCommand::Op(op);
  Reader r(payload, bytes);
  c.a = r.get<int32_t>();
  c.b = r.get<int32_t>();
  const uint8_t flags = r.get<uint8_t>();
  c.want_logits = flags & 1;
  c.want_hidden = flags & 2;
  ModelRunner::GraphPlan& g = c.graph;
  g.pdl = flags & 4;
  c.batch.mrope = flags & 8;
  g.buckets = r.get_vec<int32_t>();
  g.max_pages_per_seq = r.get<int32_t>();
  g.max_seqs = r.get<int32_t>();
  g.pdl_min_batch = r.get<int32_t>();
  g.max_step_tokens = r.get<int64_t>();
  BatchDesc& b = c.batch;
  b.tokens = r.get_vec<int32_t>();
  b.positions = r.get_vec<int32_t>();
  b.slot_mapping = r.get_vec<int64_t>();
  b.cu_q = r.get_vec<int32_t>();
  b.kv_lens = r.get_vec<int32_t>();
  b.page_table = r.get_vec<int32_t>();
  b.pages_stride = r.get<int32_t>();
  b.page_size = r.get<int32_t>();
  b.logit_rows = r.get_vec<int32_t>();
  c.move_from = r.get_vec<int64_t>();
  c.move_to = r.get_vec<int64_t>();
  KILN_CHECK(r.done(), "tensor-parallel command: trailing bytes");
  return c;
}

}  // namespace kiln
