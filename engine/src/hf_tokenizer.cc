#include "troupe/engine/hf_tokenizer.h"

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <simdjson.h>

#include "hf/bpe.h"
#include "hf/components.h"
#include "hf/json_fields.h"
#include "hf/splitter.h"
#include "hf/unicode.h"
#include "troupe/core/log.h"

namespace troupe::engine {
namespace {

Result<std::string> ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot read {}", path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return IoError("error reading {}", path.string());
  return ss.str();
}

// tokenizers.js's clean_up_tokenization: the spaces English detokenization removes.
std::string CleanUpSpaces(std::string text) {
  static const std::pair<const char*, const char*> kRules[] = {
      {" .", "."},     {" ?", "?"},   {" !", "!"},   {" ,", ","},     {" ' ", "'"},
      {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (const auto& [from, to] : kRules) {
    std::string_view f(from);
    std::string out;
    size_t prev = 0;
    for (size_t at = text.find(f); at != std::string::npos; at = text.find(f, prev)) {
      out.append(text, prev, at - prev);
      out += to;
      prev = at + f.size();
    }
    if (prev == 0) continue;
    out.append(text, prev, std::string::npos);
    text.swap(out);
  }
  return text;
}

// A special token named in tokenizer_config.json: "text" or {"content": "text", ...}.
Result<std::string> ConfigToken(const nlohmann::json& config, const char* key,
                                const std::string& where) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::string();
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  return InvalidArgument("{}: '{}' must be a token string or {{\"content\": ...}}, got {}", where,
                         key, it->dump());
}

// tokenizer.json read in two ways: model.vocab and model.merges (nearly all of the file)
// straight from simdjson's DOM into flat lists, everything else as small nlohmann
// objects. The string views point into `parser`, which must outlive them.
struct TokenizerFile {
  simdjson::dom::parser parser;
  nlohmann::json rest = nlohmann::json::object();  // top-level keys; "model" without the big two
  std::vector<hf::BpeModel::VocabEntry> vocab;
  std::vector<hf::BpeModel::MergeEntry> merges;
};

nlohmann::json ToNlohmann(simdjson::dom::element e) {
  return nlohmann::json::parse(simdjson::to_string(e));
}

Status ReadModel(simdjson::dom::object model, const std::string& where, TokenizerFile* f) {
  nlohmann::json options = nlohmann::json::object();
  bool have_vocab = false, have_merges = false;
  for (auto [key, value] : model) {
    if (key == "vocab") {
      simdjson::dom::object vocab;
      if (value.get_object().get(vocab))
        return InvalidArgument("{}: 'vocab' must be an object of token -> id", where);
      for (auto [token, id] : vocab) {
        int64_t v = 0;
        if (id.get_int64().get(v))
          return InvalidArgument("{}: vocab id of '{}' is {}, not an integer", where, token,
                                 simdjson::to_string(id));
        f->vocab.emplace_back(token, v);
      }
      have_vocab = true;
    } else if (key == "merges") {
      simdjson::dom::array merges;
      if (value.get_array().get(merges))
        return InvalidArgument("{}: 'merges' must be an array", where);
      for (simdjson::dom::element m : merges) {
        std::string_view a, b, both;
        simdjson::dom::array pair;
        bool ok = false;
        if (!m.get_string().get(both)) {  // "left right"
          size_t space = both.find(' ');
          ok = space != std::string_view::npos &&
               both.find(' ', space + 1) == std::string_view::npos;
          if (ok) a = both.substr(0, space), b = both.substr(space + 1);
        } else if (!m.get_array().get(pair) && pair.size() == 2) {  // ["left", "right"]
          ok = !pair.at(0).get_string().get(a) && !pair.at(1).get_string().get(b);
        }
        if (!ok)
          return InvalidArgument("{}: merges[{}] is {}, not \"left right\" or [left, right]", where,
                                 f->merges.size(), simdjson::to_string(m));
        f->merges.emplace_back(a, b);
      }
      have_merges = true;
    } else {
      options[std::string(key)] = ToNlohmann(value);
    }
  }
  if (!have_vocab) return InvalidArgument("{}: 'vocab' must be an object of token -> id", where);
  if (!have_merges) return InvalidArgument("{}: 'merges' must be an array", where);
  f->rest["model"] = std::move(options);
  return Status::Ok();
}

Status ReadTokenizerFile(std::string_view json, const std::string& origin, TokenizerFile* f) {
  simdjson::padded_string padded(json);
  simdjson::dom::element doc;
  simdjson::dom::object top;
  if (auto err = f->parser.parse(padded).get(doc))
    return Malformed("{}: not a JSON object ({})", origin, simdjson::error_message(err));
  if (doc.get_object().get(top)) return Malformed("{}: not a JSON object", origin);
  for (auto [key, value] : top) {
    simdjson::dom::object model;
    if (key == "model" && !value.get_object().get(model)) {
      std::string_view type;
      if (model["type"].get_string().get(type))
        return InvalidArgument("{} model: has no \"type\"", origin);
      if (type != "BPE")
        return InvalidArgument("{} model: type '{}' is not supported (BPE is)", origin, type);
      TROUPE_RETURN_IF_ERROR(ReadModel(model, origin + " model", f));
    } else {
      f->rest[std::string(key)] = ToNlohmann(value);
    }
  }
  return Status::Ok();
}

}  // namespace

struct HfTokenizer::Scratch {
  hf::StringPool pool;
  std::string valid;
  std::vector<std::string_view> sections, subsections, pieces, tmp;
};

HfTokenizer::HfTokenizer() = default;
HfTokenizer::~HfTokenizer() = default;

Result<std::unique_ptr<HfTokenizer>> HfTokenizer::Load(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path file(path);
  if (fs::is_directory(file, ec)) file /= "tokenizer.json";
  if (!fs::exists(file, ec))
    return NotFound("no tokenizer.json at {} (give a model folder or a tokenizer.json file)", path);
  TROUPE_ASSIGN_OR_RETURN(std::string json, ReadFile(file));
  std::string config;
  fs::path config_path = file.parent_path() / "tokenizer_config.json";
  if (fs::exists(config_path, ec)) {
    TROUPE_ASSIGN_OR_RETURN(config, ReadFile(config_path));
  }
  TROUPE_ASSIGN_OR_RETURN(auto tok, FromJson(json, config, file.string()));
  log::Get("engine").info("tokenizer {}: {} BPE, {} ids, bos {} eos {} pad {}", file.string(),
                          tok->byte_level() ? "byte-level" : "SentencePiece-style",
                          tok->vocab_size(), tok->bos_id(), tok->eos_id(), tok->pad_id());
  return tok;
}

Result<std::unique_ptr<HfTokenizer>> HfTokenizer::FromJson(std::string_view tokenizer_json,
                                                           std::string_view config_json,
                                                           const std::string& origin) {
  auto file = std::make_unique<TokenizerFile>();
  TROUPE_RETURN_IF_ERROR(ReadTokenizerFile(tokenizer_json, origin, file.get()));
  std::unique_ptr<HfTokenizer> tok(new HfTokenizer());
  tok->origin_ = origin;
  TROUPE_RETURN_IF_ERROR(
      tok->Init(file->rest, file->vocab, file->merges, std::string(config_json)));
  return tok;
}

bool HfTokenizer::byte_level() const {
  return model_->byte_level();
}

Status HfTokenizer::Init(const nlohmann::json& j,
                         const std::vector<std::pair<std::string_view, int64_t>>& vocab,
                         const std::vector<std::pair<std::string_view, std::string_view>>& merges,
                         const std::string& config_json) {
  const std::string& o = origin_;
  TROUPE_RETURN_IF_ERROR(
      hf::CheckKeys(j, o,
                    {"version", "truncation", "padding", "added_tokens", "normalizer",
                     "pre_tokenizer", "post_processor", "decoder", "model"}));
  for (const char* k : {"truncation", "padding"})
    if (j.contains(k) && !j[k].is_null())
      return InvalidArgument("{}: '{}' is set; Troupe does not {} (set it to null)", o, k,
                             std::string(k) == "padding" ? "pad" : "truncate");
  auto part = [&](const char* k) -> const nlohmann::json& {
    static const nlohmann::json kNull;
    auto it = j.find(k);
    return it == j.end() ? kNull : *it;
  };
  TROUPE_ASSIGN_OR_RETURN(normalizer_, hf::MakeNormalizer(part("normalizer"), o + " normalizer"));
  bool byte_level = false;
  TROUPE_ASSIGN_OR_RETURN(pre_tokenizer_, hf::MakePreTokenizer(part("pre_tokenizer"),
                                                               o + " pre_tokenizer", &byte_level));
  const nlohmann::json& model = part("model");
  TROUPE_ASSIGN_OR_RETURN(std::string type, hf::TypeOf(model, o + " model"));
  if (type != "BPE")
    return InvalidArgument("{} model: type '{}' is not supported (BPE is)", o, type);
  TROUPE_ASSIGN_OR_RETURN(model_,
                          hf::BpeModel::FromParts(model, vocab, merges, byte_level, o + " model"));
  pieces_ = model_->vocab_pieces();
  used_ = model_->vocab_has();

  if (!config_json.empty()) {
    config_ = nlohmann::json::parse(config_json, nullptr, false);
    if (config_.is_discarded() || !config_.is_object())
      return Malformed("{}: tokenizer_config.json is not a JSON object", o);
  }
  TROUPE_RETURN_IF_ERROR(InitAddedTokens(part("added_tokens")));
  absl::flat_hash_set<std::string> added_texts;
  for (const auto& a : added_) added_texts.insert(a.content);
  TROUPE_ASSIGN_OR_RETURN(decoder_, hf::MakeDecoder(part("decoder"), o + " decoder", added_texts));
  TROUPE_ASSIGN_OR_RETURN(hf::PostProcessor post,
                          hf::MakePostProcessor(part("post_processor"), o + " post_processor"));
  for (const auto& t : post.templates) {
    std::vector<int32_t> ids;
    for (const auto& item : t) {
      if (item.is_sequence) {
        ids.push_back(-1);
        continue;
      }
      TROUPE_ASSIGN_OR_RETURN(int32_t id, ResolveToken(item.special, o + " post_processor"));
      ids.push_back(id);
    }
    templates_.push_back(std::move(ids));
  }
  return InitConfig();
}

Status HfTokenizer::InitAddedTokens(const nlohmann::json& list) {
  const std::string where = origin_ + " added_tokens";
  if (list.is_null()) return Status::Ok();
  if (!list.is_array()) return InvalidArgument("{}: must be an array", where);
  std::vector<hf::Splitter::Entry> unnormalized, normalized;
  for (size_t i = 0; i < list.size(); ++i) {
    const auto& t = list[i];
    std::string at = fmt::format("{}[{}]", where, i);
    if (!t.is_object()) return InvalidArgument("{}: must be an object", at);
    TROUPE_RETURN_IF_ERROR(hf::CheckKeys(
        t, at, {"id", "content", "single_word", "lstrip", "rstrip", "normalized", "special"}));
    AddedToken a;
    TROUPE_ASSIGN_OR_RETURN(a.content, hf::StringField(t, "content", at));
    TROUPE_ASSIGN_OR_RETURN(int64_t id, hf::IntField(t, "id", at, -1));
    if (a.content.empty() || id < 0 || id >= (int64_t{1} << 30))
      return InvalidArgument("{}: needs a non-empty 'content' and an 'id' in [0, 2^30)", at);
    a.id = static_cast<int32_t>(id);
    TROUPE_ASSIGN_OR_RETURN(a.special, hf::BoolField(t, "special", at));
    TROUPE_ASSIGN_OR_RETURN(a.normalized, hf::BoolField(t, "normalized", at, !a.special));
    TROUPE_ASSIGN_OR_RETURN(a.lstrip, hf::BoolField(t, "lstrip", at));
    TROUPE_ASSIGN_OR_RETURN(a.rstrip, hf::BoolField(t, "rstrip", at));
    TROUPE_ASSIGN_OR_RETURN(a.single_word, hf::BoolField(t, "single_word", at));
    if (static_cast<size_t>(a.id) >= pieces_.size()) {
      pieces_.resize(static_cast<size_t>(a.id) + 1);
      used_.resize(static_cast<size_t>(a.id) + 1, false);
    }
    pieces_[static_cast<size_t>(a.id)] = a.content;
    used_[static_cast<size_t>(a.id)] = true;
    model_->AddToken(a.content, a.id, /*insert_if_missing=*/true);
    size_t index = added_.size();
    added_by_text_.emplace_back(a.content, index);
    if (a.normalized && normalizer_) {
      std::string norm;
      TROUPE_RETURN_IF_ERROR(normalizer_->Apply(a.content, &norm));
      model_->AddToken(norm, a.id, /*insert_if_missing=*/false);
      added_by_text_.emplace_back(norm, index);
      normalized.push_back({norm, a.single_word});
    } else {
      unnormalized.push_back({a.content, a.single_word});
    }
    added_.push_back(std::move(a));
  }
  // Later entries win for equal texts, as in the reference's Map.
  std::stable_sort(added_by_text_.begin(), added_by_text_.end(),
                   [](const auto& x, const auto& y) { return x.first < y.first; });
  std::vector<std::pair<std::string, size_t>> dedup;
  for (auto& e : added_by_text_) {
    if (!dedup.empty() && dedup.back().first == e.first)
      dedup.back() = std::move(e);
    else
      dedup.push_back(std::move(e));
  }
  added_by_text_.swap(dedup);
  split_unnormalized_ = std::make_unique<hf::Splitter>(unnormalized);
  split_normalized_ = std::make_unique<hf::Splitter>(normalized);
  return Status::Ok();
}

Status HfTokenizer::InitConfig() {
  const std::string where = origin_ + " tokenizer_config.json";
  for (const char* key :
       {"remove_space", "do_lowercase_and_remove_accent", "split_special_tokens"}) {
    TROUPE_ASSIGN_OR_RETURN(bool on, hf::BoolField(config_, key, where));
    if (on) return InvalidArgument("{}: '{}' true is not supported", where, key);
  }
  TROUPE_ASSIGN_OR_RETURN(clean_up_spaces_,
                          hf::BoolField(config_, "clean_up_tokenization_spaces", where, true));
  vocab_size_ = static_cast<int32_t>(pieces_.size());
  special_.assign(pieces_.size(), false);
  skip_.assign(pieces_.size(), false);
  absl::flat_hash_set<std::string> skip_texts;
  for (const auto& a : added_) {
    if (!a.special) continue;
    special_[static_cast<size_t>(a.id)] = true;
    skip_texts.insert(a.content);
  }
  auto extra = config_.find("additional_special_tokens");
  if (extra != config_.end() && extra->is_array()) {
    for (const auto& t : *extra) {
      if (t.is_string())
        skip_texts.insert(t.get<std::string>());
      else if (t.is_object() && t.contains("content") && t["content"].is_string())
        skip_texts.insert(t["content"].get<std::string>());
    }
  }
  for (size_t id = 0; id < pieces_.size(); ++id)
    skip_[id] = used_[id] && skip_texts.contains(pieces_[id]);

  auto named = [&](const char* key, int32_t* out) -> Status {
    TROUPE_ASSIGN_OR_RETURN(std::string text, ConfigToken(config_, key, where));
    if (text.empty()) return Status::Ok();
    TROUPE_ASSIGN_OR_RETURN(*out, ResolveToken(text, where + " " + key));
    return Status::Ok();
  };
  TROUPE_RETURN_IF_ERROR(named("bos_token", &bos_id_));
  TROUPE_RETURN_IF_ERROR(named("eos_token", &eos_id_));
  int32_t pad = -1;
  TROUPE_RETURN_IF_ERROR(named("pad_token", &pad));
  if (config_.empty() && !templates_.empty()) {  // a bare tokenizer.json: read the template
    const auto& t = templates_.front();
    if (t.size() > 1 && t.front() >= 0) bos_id_ = t.front();
    if (t.size() > 1 && t.back() >= 0) eos_id_ = t.back();
  }
  pad_id_ = pad >= 0 ? pad : eos_id_ >= 0 ? eos_id_ : 0;
  return Status::Ok();
}

Result<int32_t> HfTokenizer::ResolveToken(const std::string& text, const std::string& what) const {
  if (const AddedToken* a = FindAdded(text)) return a->id;
  int32_t id = model_->Lookup(text);
  if (id < 0) return InvalidArgument("{}: token '{}' is not in the vocabulary", what, text);
  return id;
}

const HfTokenizer::AddedToken* HfTokenizer::FindAdded(std::string_view text) const {
  auto it = std::lower_bound(added_by_text_.begin(), added_by_text_.end(), text,
                             [](const auto& e, std::string_view t) { return e.first < t; });
  if (it == added_by_text_.end() || it->first != text) return nullptr;
  return &added_[it->second];
}

void HfTokenizer::StripAround(std::vector<std::string_view>* sections) const {
  auto& s = *sections;
  for (size_t i = 0; i < s.size(); ++i) {
    const AddedToken* a = FindAdded(s[i]);
    if (!a) continue;
    if (a->lstrip && i > 0) s[i - 1] = hf::TrimJsEnd(s[i - 1]);
    if (a->rstrip && i + 1 < s.size()) s[i + 1] = hf::TrimJsStart(s[i + 1]);
  }
}

Status HfTokenizer::EncodeText(std::string_view text, std::vector<int32_t>* ids) const {
  thread_local Scratch scratch;
  Scratch& s = scratch;
  s.pool.Reset();
  if (s.valid.capacity() > (size_t{1} << 20)) std::string().swap(s.valid);
  if (!hf::IsValidUtf8(text)) {
    s.valid.clear();
    hf::AppendValidUtf8(text, &s.valid);
    text = s.valid;
  }
  s.sections.clear();
  split_unnormalized_->Split(text, &s.sections);
  StripAround(&s.sections);
  for (size_t i = 0; i < s.sections.size(); ++i) {
    std::string_view section = s.sections[i];
    if (section.empty()) continue;
    if (const AddedToken* a = FindAdded(section)) {
      ids->push_back(a->id);
      continue;
    }
    if (normalizer_) {
      std::string* norm = s.pool.Make();
      TROUPE_RETURN_IF_ERROR(normalizer_->Apply(section, norm));
      section = *norm;
      if (section.empty()) continue;
    }
    TROUPE_RETURN_IF_ERROR(EncodeSection(section, i, &s, ids));
  }
  return Status::Ok();
}

Status HfTokenizer::EncodeSection(std::string_view section, size_t section_index, Scratch* s,
                                  std::vector<int32_t>* ids) const {
  s->subsections.clear();
  split_normalized_->Split(section, &s->subsections);
  StripAround(&s->subsections);
  for (std::string_view sub : s->subsections) {
    if (sub.empty()) continue;
    if (const AddedToken* a = FindAdded(sub)) {
      ids->push_back(a->id);
      continue;
    }
    s->pieces.assign(1, sub);
    if (pre_tokenizer_)
      TROUPE_RETURN_IF_ERROR(pre_tokenizer_->Apply(&s->pieces, &s->tmp, &s->pool, section_index));
    size_t first = ids->size();
    for (std::string_view p : s->pieces) model_->Encode(p, ids);
    int32_t unk = model_->unk_id();
    if (model_->fuse_unk() && unk >= 0) {  // runs of UNK become one
      auto end = std::unique(ids->begin() + static_cast<std::ptrdiff_t>(first), ids->end(),
                             [unk](int32_t x, int32_t y) { return x == unk && y == unk; });
      ids->erase(end, ids->end());
    }
  }
  return Status::Ok();
}

Result<std::vector<int32_t>> HfTokenizer::Encode(std::string_view text, bool add_bos,
                                                 bool add_eos) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (add_bos && bos_id_ >= 0) ids.push_back(bos_id_);
  TROUPE_RETURN_IF_ERROR(EncodeText(text, &ids));
  if (add_eos) {
    if (eos_id_ < 0) return InvalidArgument("{}: the tokenizer names no eos_token", origin_);
    ids.push_back(eos_id_);
  }
  return ids;
}

Result<std::vector<int32_t>> HfTokenizer::EncodeWithSpecialTokens(std::string_view text) const {
  TROUPE_ASSIGN_OR_RETURN(std::vector<int32_t> ids, Encode(text));
  for (const auto& t : templates_) {
    std::vector<int32_t> out;
    out.reserve(ids.size() + t.size());
    for (int32_t id : t) {
      if (id >= 0)
        out.push_back(id);
      else
        out.insert(out.end(), ids.begin(), ids.end());
    }
    ids.swap(out);
  }
  return ids;
}

Result<std::string> HfTokenizer::Decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    int32_t id = ids[i];
    if (id < 0 || id >= vocab_size_ || !used_[static_cast<size_t>(id)])
      return InvalidArgument("token id {} at position {} is not in the vocabulary of {} ({} ids)",
                             id, i, origin_, vocab_size_);
    if (skip_special && skip_[static_cast<size_t>(id)]) continue;
    tokens.push_back(pieces_[static_cast<size_t>(id)]);
  }
  std::string text;
  if (decoder_) {
    decoder_->Apply(&tokens);
    for (const auto& t : tokens) text += t;
  } else {
    for (size_t i = 0; i < tokens.size(); ++i) text += (i ? " " : "") + tokens[i];
  }
  return clean_up_spaces_ ? CleanUpSpaces(std::move(text)) : text;
}

Result<std::string> HfTokenizer::IdToPiece(int32_t id) const {
  if (id < 0 || id >= vocab_size_ || !used_[static_cast<size_t>(id)])
    return InvalidArgument("token id {} is not in the vocabulary of {} ({} ids)", id, origin_,
                           vocab_size_);
  return pieces_[static_cast<size_t>(id)];
}

int32_t HfTokenizer::TokenToId(std::string_view piece) const {
  const AddedToken* a = FindAdded(piece);  // also finds normalized forms: those are not pieces
  if (a && a->content == piece) return a->id;
  return model_->Lookup(piece);
}

bool HfTokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && id < vocab_size_ && special_[static_cast<size_t>(id)];
}

Result<std::vector<std::vector<int32_t>>> HfTokenizer::EncodeBatch(
    const std::vector<std::string>& texts, int threads, bool add_special_tokens) const {
  std::vector<std::vector<int32_t>> out(texts.size());
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  threads = static_cast<int>(
      std::min<size_t>(static_cast<size_t>(threads), std::max<size_t>(1, texts.size())));
  std::atomic<size_t> next{0};
  std::vector<Status> errors(static_cast<size_t>(threads));
  auto work = [&](size_t w) {
    for (size_t i = next++; i < texts.size(); i = next++) {
      auto r = add_special_tokens ? EncodeWithSpecialTokens(texts[i]) : Encode(texts[i]);
      if (!r.ok()) {
        errors[w] = r.status().WithContext(fmt::format("text {}", i));
        next = texts.size();
        return;
      }
      out[i] = std::move(r).value();
    }
  };
  std::vector<std::thread> pool;
  for (int w = 1; w < threads; ++w) pool.emplace_back(work, static_cast<size_t>(w));
  work(0);
  for (auto& t : pool) t.join();
  for (const auto& e : errors)
    if (!e.ok()) return e;
  return out;
}

}  // namespace troupe::engine
