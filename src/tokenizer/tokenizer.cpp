#include "kiln/tokenizer.h"

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "kiln/error.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

namespace kiln {
namespace {

using nlohmann::json;

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  KILN_CHECK(f.good(), "cannot open ", path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

bool file_exists(const std::string& path) {
  return std::ifstream(path).good();
}

// tokenizer.json's byte-level decoder: a token whose every char is a byte stand-in becomes those bytes;
// any other token (e.g. an added token with a space) keeps its own UTF-8 bytes.
std::string token_to_bytes(std::string_view token) {
  std::string out;
  size_t i = 0;
  while (i < token.size()) {
    const int b = tok::char_to_byte(tok::utf8_next(token, i));
    if (b < 0) return std::string(token);
    out.push_back(char(b));
  }
  return out;
}

void check_pre_tokenizer(const json& pt, std::unique_ptr<tok::SplitRegex>& split, bool& byte_level_seen) {
  const std::string type = pt.value("type", "");
  if (type == "Sequence") {
    for (const auto& p : pt.at("pretokenizers")) check_pre_tokenizer(p, split, byte_level_seen);
  } else if (type == "Split") {
    KILN_CHECK(!split, "tokenizer.json: more than one regex pre-tokenizer is not supported");
    const json& pat = pt.at("pattern");
    std::string regex;
    if (pat.contains("Regex")) {
      regex = pat.at("Regex").get<std::string>();
    } else {
      // A literal string pattern: escape it for the regex engine.
      for (char c : pat.at("String").get<std::string>()) {
        if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) regex += '\\';
        regex += c;
      }
    }
    split =
        std::make_unique<tok::SplitRegex>(regex, pt.value("behavior", "Isolated"), pt.value("invert", false));
  } else if (type == "ByteLevel") {
    KILN_CHECK(!pt.value("add_prefix_space", false),
               "tokenizer.json: ByteLevel add_prefix_space=true is not supported");
    if (pt.value("use_regex", true)) {
      KILN_CHECK(!split, "tokenizer.json: ByteLevel use_regex after a Split is not supported");
      // GPT-2's pattern, which the ByteLevel pre-tokenizer applies itself when use_regex is set.
      split = std::make_unique<tok::SplitRegex>(
          "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+", "Isolated",
          false);
    }
    byte_level_seen = true;
  } else {
    KILN_FAIL("tokenizer.json: pre-tokenizer type '", type, "' is not supported (byte-level BPE only)");
  }
}

std::string token_content(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content")) return v.at("content").get<std::string>();
  return "";
}

// Open-addressing map from a pre-token (a view into the text being encoded) to where its ids were first
// written in the output. Grows at half load; one per encode call.
class WordCache {
 public:
  struct Entry {
    const char* ptr = nullptr;
    uint32_t len = 0;  // 0: empty slot (pre-tokens of length 1 are never cached)
    uint32_t first = 0, count = 0;
    uint64_t hash = 0;
  };
  explicit WordCache(size_t expect) {
    size_t cap = 64;
    while (cap < std::min<size_t>(expect / 4, 1 << 16)) cap <<= 1;  // unique words are far fewer; grows
    slots_.assign(cap, Entry{});
  }
  // The entry for w: filled when w was inserted, else the empty slot where insert() will put it.
  Entry& find(std::string_view w) {
    hash_ = hash_bytes(w);
    const size_t mask = slots_.size() - 1;
    for (size_t h = hash_ & mask;; h = (h + 1) & mask) {
      Entry& e = slots_[h];
      if (e.len == 0) return e;
      if (e.hash == hash_ && e.len == w.size() && std::memcmp(e.ptr, w.data(), w.size()) == 0) return e;
    }
  }
  void insert(Entry& slot, std::string_view w, uint32_t first, uint32_t count) {
    slot = {w.data(), uint32_t(w.size()), first, count, hash_};
    if (++size_ * 2 > slots_.size()) grow();
  }

 private:
  static uint64_t hash_bytes(std::string_view s) { return tok::hash_bytes(s); }
  void grow() {
    std::vector<Entry> old(slots_.size() * 2);
    old.swap(slots_);
    const size_t mask = slots_.size() - 1;
    for (const Entry& e : old) {
      if (e.len == 0) continue;
      size_t h = e.hash & mask;
      while (slots_[h].len != 0) h = (h + 1) & mask;
      slots_[h] = e;
    }
  }
  std::vector<Entry> slots_;
  size_t size_ = 0;
  uint64_t hash_ = 0;  // of the last find()
};

// Token ids past this are refused by name (real vocabularies hold ~256k): tables are sized by the largest id.
constexpr int64_t kMaxTokenIds = int64_t(1) << 24;

// An integer JSON value as an id, -1 when it does not fit int64.
int64_t token_id_of(const json& v) {
  return v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX) ? -1 : v.get<int64_t>();
}

// Collects model.vocab and model.merges from parser callbacks and tells the parser to drop them.
// Depths (nlohmann's callback convention): keys of the root object are at 1, of "model" at 2, vocab entries
// and merge elements at 3, the two strings of a merge pair at 4.
struct ModelTables {
  std::vector<std::pair<std::string, int32_t>> vocab;
  std::vector<std::pair<std::string, std::string>> merges;
  std::string error;
  std::string root_key, model_key, vocab_key;
  std::vector<std::string> pair;

  bool in(std::string_view what) const { return root_key == "model" && model_key == what; }
  bool take(int depth, json::parse_event_t ev, json& v) {
    using E = json::parse_event_t;
    if (ev == E::key) {
      if (depth == 1) root_key = v.get<std::string>();
      if (depth == 2 && root_key == "model") model_key = v.get<std::string>();
      if (depth == 3 && in("vocab")) {
        vocab_key = v.get<std::string>();
        return false;
      }
      return true;
    }
    if (ev == E::value && depth == 3 && in("vocab")) {
      if (!v.is_number_integer() && error.empty())
        error = "vocab id of '" + vocab_key + "' is not an integer";
      if (v.is_number_integer()) {
        const int64_t id = token_id_of(v);
        if (id < 0 || id >= kMaxTokenIds) {
          if (error.empty())
            error = "vocab id " + v.dump() + " of '" + vocab_key + "' is outside [0, " +
                    std::to_string(kMaxTokenIds) + ") (kiln's limit)";
        } else {
          vocab.emplace_back(vocab_key, int32_t(id));
        }
      }
      return false;
    }
    if (ev == E::value && depth == 4 && in("merges")) {
      if (v.is_string()) pair.push_back(v.get<std::string>());
      return false;
    }
    if (ev == E::array_end && depth == 3 && in("merges")) {  // a ["left", "right"] pair
      if (pair.size() == 2) {
        merges.emplace_back(std::move(pair[0]), std::move(pair[1]));
      } else if (error.empty()) {
        error = "merge " + std::to_string(merges.size()) + " is not a pair of strings";
      }
      pair.clear();
      return false;
    }
    if (ev == E::value && depth == 3 && in("merges")) {  // older format: "left right"
      const std::string m = v.is_string() ? v.get<std::string>() : std::string();
      const size_t sp = m.find(' ');
      if (sp == std::string::npos || sp == 0) {
        if (error.empty()) error = "malformed merge '" + m + "'";
      } else {
        merges.emplace_back(m.substr(0, sp), m.substr(sp + 1));
      }
      return false;
    }
    return true;
  }
};

}  // namespace

Tokenizer Tokenizer::load(const std::string& model_dir) {
  const std::string tj = model_dir + "/tokenizer.json", cj = model_dir + "/tokenizer_config.json";
  const std::string jinja = model_dir + "/chat_template.jinja", ctj = model_dir + "/chat_template.json";
  KILN_CHECK(file_exists(tj), "no tokenizer.json in '", model_dir, "'");
  return from_json(read_file(tj), file_exists(cj) ? read_file(cj) : std::string(),
                   file_exists(jinja) ? read_file(jinja) : std::string(),
                   file_exists(ctj) ? read_file(ctj) : std::string());
}

Tokenizer Tokenizer::from_json(std::string_view tokenizer_json, std::string_view tokenizer_config_json,
                               std::string_view chat_template_jinja, std::string_view chat_template_json) {
  auto impl = std::make_shared<Impl>();
  // model.vocab (151k entries) and model.merges are streamed out of the parser instead of becoming a DOM of
  // std::map nodes: that DOM was most of the load time.
  ModelTables tables;
  json t;
  try {
    t = json::parse(tokenizer_json, [&tables](int depth, json::parse_event_t ev, json& v) {
      return tables.take(depth, ev, v);
    });
  } catch (const json::exception& e) {
    KILN_FAIL("tokenizer.json is not valid JSON: ", e.what());
  }
  KILN_CHECK(tables.error.empty(), "tokenizer.json: ", tables.error);
  try {
    const json& model = t.at("model");
    KILN_CHECK(model.value("type", "BPE") == "BPE", "tokenizer.json: model type '", model.value("type", ""),
               "' is not supported (BPE only)");
    KILN_CHECK(!model.value("byte_fallback", false), "tokenizer.json: BPE byte_fallback is not supported");
    KILN_CHECK(model.value("continuing_subword_prefix", json()).is_null() ||
                   model.at("continuing_subword_prefix").get<std::string>().empty(),
               "tokenizer.json: continuing_subword_prefix is not supported");
    KILN_CHECK(model.value("end_of_word_suffix", json()).is_null() ||
                   model.at("end_of_word_suffix").get<std::string>().empty(),
               "tokenizer.json: end_of_word_suffix is not supported");
    KILN_CHECK(model.value("dropout", json()).is_null(), "tokenizer.json: BPE dropout is not supported");
    KILN_CHECK(!tables.vocab.empty(), "tokenizer.json: model.vocab is missing or empty");
    const auto& vocab = tables.vocab;
    const auto& merges = tables.merges;
    impl->bpe = std::make_unique<tok::BpeModel>(vocab, merges);

    const json& norm = t.value("normalizer", json());
    if (!norm.is_null()) {
      KILN_CHECK(norm.value("type", "") == "NFC", "tokenizer.json: normalizer '", norm.value("type", ""),
                 "' is not supported (NFC or none)");
      impl->nfc = true;
    }
    bool byte_level = false;
    if (!t.value("pre_tokenizer", json()).is_null())
      check_pre_tokenizer(t.at("pre_tokenizer"), impl->split, byte_level);
    KILN_CHECK(byte_level, "tokenizer.json: a ByteLevel pre-tokenizer is required (byte-level BPE only)");
    const json& dec = t.value("decoder", json());
    KILN_CHECK(!dec.is_null() && dec.value("type", "") == "ByteLevel",
               "tokenizer.json: only the ByteLevel decoder is supported");

    // Added tokens: ids may extend the vocab or name existing model tokens.
    int64_t vocab_size = impl->bpe->vocab_size();
    std::vector<tok::AddedToken> raw, normalized;
    std::vector<std::string> raw_pat, norm_pat;
    for (const auto& a : t.value("added_tokens", json::array())) {
      tok::AddedToken at;
      at.content = a.at("content").get<std::string>();
      const json& id = a.at("id");
      if (!id.is_number_integer() || token_id_of(id) < 0 || token_id_of(id) >= kMaxTokenIds)
        KILN_FAIL("tokenizer.json: added token '", at.content, "' has id ", id.dump(), ", outside [0, ",
                  kMaxTokenIds, ") (kiln's limit)");
      at.id = int32_t(token_id_of(id));
      KILN_CHECK(tok::utf8_find_invalid(at.content) == std::string_view::npos, "added token ", at.id,
                 " is not UTF-8");
      at.special = a.value("special", false);
      at.lstrip = a.value("lstrip", false);
      at.rstrip = a.value("rstrip", false);
      at.single_word = a.value("single_word", false);
      at.normalized = a.value("normalized", !at.special);
      vocab_size = std::max<int64_t>(vocab_size, int64_t(at.id) + 1);
      impl->added.push_back(at);
      if (at.normalized) {
        std::string p;
        if (impl->nfc) {
          tok::nfc_append(at.content, p);
        } else {
          p = at.content;
        }
        normalized.push_back(at);
        norm_pat.push_back(p);
      } else {
        raw.push_back(at);
        raw_pat.push_back(at.content);
      }
    }
    impl->raw_added.build(raw, raw_pat);
    impl->normalized_added.build(normalized, norm_pat);
    impl->vocab_size = vocab_size;
    impl->post = tok::PostProcessor::parse(t.value("post_processor", json()), vocab_size);

    impl->id_bytes.assign(size_t(vocab_size), std::string());
    impl->id_kind.assign(size_t(vocab_size), 0);
    for (int32_t id = 0; id < impl->bpe->vocab_size(); ++id) {
      if (!impl->bpe->has_id(id)) continue;
      impl->id_bytes[size_t(id)] = token_to_bytes(impl->bpe->token(id));
      impl->id_kind[size_t(id)] = 1;
    }
    for (const auto& a : impl->added) {
      // A normalized added token decodes from its normalized content (observed in tokenizers 0.23: "A\u030aX"
      // decodes as "\u00c5X" through the byte-level decoder, i.e. to "\ufffdX").
      std::string content = a.content;
      if (a.normalized && impl->nfc) {
        content.clear();
        tok::nfc_append(a.content, content);
      }
      impl->id_bytes[size_t(a.id)] = token_to_bytes(content);
      impl->id_kind[size_t(a.id)] = a.special ? 3 : 2;
    }
  } catch (const json::exception& e) {
    KILN_FAIL("tokenizer.json: unexpected structure: ", e.what());
  }

  // tokenizer_config.json: eos token; the chat template from there or its own files.
  std::string eos;
  if (!tokenizer_config_json.empty()) {
    try {
      const json c = json::parse(tokenizer_config_json);
      eos = token_content(c.value("eos_token", json()));
    } catch (const json::exception& e) {
      KILN_FAIL("tokenizer_config.json is not valid: ", e.what());
    }
  }
  impl->chat = tok::ChatTemplate::load(tokenizer_config_json, chat_template_jinja, chat_template_json);
  Tokenizer tk(impl);
  for (const std::string& name : {eos, std::string("<|im_end|>"), std::string("<|endoftext|>")}) {
    if (name.empty()) continue;
    if (auto id = tk.token_id(name)) {
      bool dup = false;
      for (int32_t e : impl->eos_ids) dup = dup || e == *id;
      if (!dup) impl->eos_ids.push_back(*id);
    }
  }
  return tk;
}

void Tokenizer::Impl::encode_text(std::string_view text, std::vector<int32_t>& out) const {
  std::vector<std::pair<size_t, size_t>> pieces;
  if (split) {
    split->split(text, pieces);
  } else if (!text.empty()) {
    pieces.emplace_back(0, text.size());
  }
  // Repeated pre-tokens (words, spaces) are merged once per call; the cache is local, so no locking.
  WordCache cache(pieces.size());
  for (const auto& [b, e] : pieces) {
    const std::string_view w = text.substr(b, e - b);
    if (w.size() == 1) {
      out.push_back(bpe->byte_id(static_cast<uint8_t>(w[0])));
      continue;
    }
    WordCache::Entry& slot = cache.find(w);
    if (slot.len != 0) {
      const size_t at = out.size();
      out.resize(at + slot.count);
      std::copy_n(out.begin() + slot.first, slot.count, out.begin() + long(at));
      continue;
    }
    const size_t at = out.size();
    bpe->encode_word(w, out);
    cache.insert(slot, w, uint32_t(at), uint32_t(out.size() - at));
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  const size_t bad = tok::utf8_find_invalid(text);
  KILN_CHECK(bad == std::string_view::npos, "input is not valid UTF-8 (first bad byte at offset ", bad, ")");
  const Impl& m = *impl_;
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  std::vector<tok::AddedSplit> raw_splits, norm_splits;
  if (m.raw_added.empty()) {
    raw_splits.push_back({0, text.size(), -1});
  } else {
    m.raw_added.split(text, raw_splits);
  }
  std::string normalized;
  for (const auto& rs : raw_splits) {
    if (rs.id >= 0) {
      out.push_back(rs.id);
      continue;
    }
    std::string_view piece = text.substr(rs.begin, rs.end - rs.begin);
    if (m.nfc) {
      normalized.clear();
      tok::nfc_append(piece, normalized);
      piece = normalized;
    }
    if (m.normalized_added.empty()) {
      m.encode_text(piece, out);
      continue;
    }
    norm_splits.clear();
    m.normalized_added.split(piece, norm_splits);
    for (const auto& ns : norm_splits) {
      if (ns.id >= 0) {
        out.push_back(ns.id);
      } else {
        m.encode_text(piece.substr(ns.begin, ns.end - ns.begin), out);
      }
    }
  }
  return out;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  return impl_->post.apply(encode(text), nullptr, add_special_tokens);
}

std::vector<int32_t> Tokenizer::encode_pair(std::string_view a, std::string_view b,
                                            bool add_special_tokens) const {
  const std::vector<int32_t> second = encode(b);
  return impl_->post.apply(encode(a), &second, add_special_tokens);
}

bool Tokenizer::adds_special_tokens() const {
  return impl_->post.adds_tokens();
}

void Tokenizer::append_token_bytes(int32_t id, bool skip_special_tokens, std::string& out) const {
  const Impl& m = *impl_;
  KILN_CHECK(id >= 0 && id < m.vocab_size && m.id_kind[size_t(id)] != 0, "token id ", id,
             " is out of range (vocab size ", m.vocab_size, ")");
  if (skip_special_tokens && m.id_kind[size_t(id)] == 3) return;
  out += m.id_bytes[size_t(id)];
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::string bytes;
  for (int32_t id : ids) append_token_bytes(id, skip_special_tokens, bytes);
  std::string out;
  out.reserve(bytes.size());
  tok::utf8_lossy_append(bytes, out, /*final=*/true);
  return out;
}

int64_t Tokenizer::vocab_size() const {
  return impl_->vocab_size;
}

std::optional<int32_t> Tokenizer::token_id(std::string_view token) const {
  for (const auto& a : impl_->added)
    if (a.content == token) return a.id;
  const int32_t id = impl_->bpe->find(token);
  return id >= 0 ? std::optional<int32_t>(id) : std::nullopt;
}

std::string Tokenizer::id_to_token(int32_t id) const {
  const Impl& m = *impl_;
  KILN_CHECK(id >= 0 && id < m.vocab_size && m.id_kind[size_t(id)] != 0, "token id ", id, " is out of range");
  for (const auto& a : m.added)
    if (a.id == id) return a.content;
  return m.bpe->token(id);
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < impl_->vocab_size && impl_->id_kind[size_t(id)] == 3;
}

std::vector<int32_t> Tokenizer::eos_token_ids() const {
  return impl_->eos_ids;
}

std::string Tokenizer::render_chat(std::string_view request_json) const {
  return impl_->chat->render(request_json);
}

std::string Tokenizer::chat_template_info() const {
  return impl_->chat->describe();
}

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_(skip_special_tokens) {}

std::string StreamDecoder::push(int32_t id) {
  tokenizer_.append_token_bytes(id, skip_special_, pending_);
  std::string out;
  const size_t used = tok::utf8_lossy_append(pending_, out, /*final=*/false);
  pending_.erase(0, used);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out;
  tok::utf8_lossy_append(pending_, out, /*final=*/true);
  pending_.clear();
  return out;
}

}  // namespace kiln
