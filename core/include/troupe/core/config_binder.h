// Typed config binding: YAML <-> plain C++ structs, with every key documented.
//
// A config struct opts in by defining, in its namespace,
//
//   void Describe(troupe::config::Binder& b, TrainerConfig& c) {
//     b.Field("lr", &c.lr, "peak learning rate (AdamW); default 1e-3");
//     b.Section("schedule", &c.schedule, "learning-rate schedule");
//   }
//
// and the same function then reads YAML (type-checked, unknown keys rejected
// with the closest known key suggested), writes the resolved config back to
// YAML, and lists every key with its type, default and doc line (`troupe
// config-keys`). Errors name the file and the dotted key path. The binder is
// a value used from one thread; it holds no global state. No torch here.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "troupe/core/status.h"

namespace troupe::config {

// One documented key (for `troupe config-keys` and docs).
struct KeyDoc {
  std::string path;   // dotted path, e.g. "trainer.lr"
  std::string type;   // "int", "float", "string", "bool", "list<string>", ...
  std::string value;  // default (or current) value rendered as YAML
  std::string doc;    // the one-line comment
};

class Binder {
 public:
  enum class Mode { kRead, kWrite, kDoc };

  // Reading: `node` is the mapping for this level, `file` names the source in errors.
  static Binder Reader(const YAML::Node& node, std::string file, std::string path = "");
  // Writing: fills `out` (a mapping) with the struct's current values.
  static Binder Writer(YAML::Node* out, std::string path = "");
  // Documenting: appends one KeyDoc per field to `docs`.
  static Binder Documenter(std::vector<KeyDoc>* docs, std::string path = "");

  Mode mode() const { return mode_; }

  template <typename T>
  void Field(const char* key, T* value, const char* doc);

  // A nested struct with its own Describe(Binder&, S&).
  template <typename S>
  void Section(const char* key, S* value, const char* doc);

  // A list of nested structs, each with its own Describe(Binder&, S&).
  template <typename S>
  void List(const char* key, std::vector<S>* value, const char* doc);

  // Keys this level accepts but leaves to someone else (e.g. sections another
  // binary validates). They are not reported as unknown.
  void Delegate(const char* key, const char* doc);

  // Reading: whether this level's YAML has `key` (set, even to null).
  bool Has(const char* key) const {
    return mode_ == Mode::kRead && node_.IsMap() && node_[key].IsDefined();
  }
  // Marks `key` as known without binding it (handled by the caller).
  void Known(const char* key) { known_.insert(key); }

  // Records an error against a key of this level (used by validation hooks).
  void Error(const std::string& key, const std::string& message);

  // After describing all fields: reports unknown keys (reading) and returns
  // every error collected at this level and below, one per line, or ok.
  Status Finish();

  const std::vector<std::string>& errors() const { return *errors_; }

 private:
  Binder(Mode mode, std::string path);
  std::string Join(const char* key) const { return path_.empty() ? key : path_ + "." + key; }
  std::string Where(const char* key) const;

  template <typename T>
  bool Decode(const YAML::Node& n, T* out, std::string* err) const;
  template <typename T>
  static std::string TypeName();
  template <typename T>
  static YAML::Node Encode(const T& v);

  Mode mode_;
  std::string path_;
  std::string file_;
  YAML::Node node_;
  YAML::Node* out_ = nullptr;
  std::vector<KeyDoc>* docs_ = nullptr;
  std::set<std::string> known_;
  std::shared_ptr<std::vector<std::string>> errors_ = std::make_shared<std::vector<std::string>>();
};

// An enum bound as its name: reading parses it (an unknown name is an error against `key`),
// writing and documenting render it.
template <typename E>
void EnumField(Binder& b, const char* key, E* value, const char* doc,
               std::function<std::string(E)> name,
               std::function<Result<E>(std::string_view)> parse) {
  std::string text = name(*value);
  b.Field(key, &text, doc);
  if (b.mode() == Binder::Mode::kRead) {
    auto r = parse(text);
    if (r.ok())
      *value = *r;
    else
      b.Error(key, r.status().message());
  }
}

// Reads `node` into `cfg` via Describe(); returns all errors (file and key named).
template <typename S>
Status Read(const YAML::Node& node, const std::string& file, S* cfg, const std::string& path = "") {
  Binder b = Binder::Reader(node, file, path);
  Describe(b, *cfg);
  return b.Finish();
}

// The struct's values as a YAML mapping.
template <typename S>
YAML::Node Write(const S& cfg) {
  YAML::Node out(YAML::NodeType::Map);
  Binder b = Binder::Writer(&out);
  Describe(b, const_cast<S&>(cfg));
  b.Finish().IgnoreError();
  return out;
}

// Every key of the struct (defaults as currently set in `cfg`).
template <typename S>
std::vector<KeyDoc> Document(const S& cfg, const std::string& path = "") {
  std::vector<KeyDoc> docs;
  Binder b = Binder::Documenter(&docs, path);
  Describe(b, const_cast<S&>(cfg));
  b.Finish().IgnoreError();
  return docs;
}

// Applies `key.path=value` overrides (value parsed as YAML) to `root`.
// Errors name the override; creates intermediate mappings as needed.
Status ApplyOverride(YAML::Node* root, const std::string& assignment);

// Loads a YAML file; errors name the file and the line of a syntax error.
Result<YAML::Node> LoadYamlFile(const std::string& path);

// Closest candidate by edit distance (for "did you mean"), empty if none is close.
std::string ClosestMatch(const std::string& key, const std::set<std::string>& candidates);

// ----------------------------------------------------------- implementation

template <typename T>
struct IsVector : std::false_type {};
template <typename T>
struct IsVector<std::vector<T>> : std::true_type {};
template <typename T>
struct IsOptional : std::false_type {};
template <typename T>
struct IsOptional<std::optional<T>> : std::true_type {};
template <typename T>
struct IsStringMap : std::false_type {};
template <>
struct IsStringMap<std::map<std::string, std::string>> : std::true_type {};

template <typename T>
std::string Binder::TypeName() {
  if constexpr (std::is_same_v<T, bool>)
    return "bool";
  else if constexpr (std::is_integral_v<T> && std::is_unsigned_v<T>)
    return "uint";
  else if constexpr (std::is_integral_v<T>)
    return "int";
  else if constexpr (std::is_floating_point_v<T>)
    return "float";
  else if constexpr (std::is_same_v<T, std::string>)
    return "string";
  else if constexpr (IsOptional<T>::value)
    return TypeName<typename T::value_type>() + "?";
  else if constexpr (IsVector<T>::value)
    return "list<" + TypeName<typename T::value_type>() + ">";
  else if constexpr (IsStringMap<T>::value)
    return "map<string,string>";
  else
    return "?";
}

template <typename T>
YAML::Node Binder::Encode(const T& v) {
  if constexpr (IsOptional<T>::value) {
    return v ? Encode(*v) : YAML::Node(YAML::NodeType::Null);
  } else if constexpr (IsVector<T>::value) {
    YAML::Node n(YAML::NodeType::Sequence);
    for (const auto& e : v) n.push_back(Encode(e));
    return n;
  } else if constexpr (IsStringMap<T>::value) {
    YAML::Node n(YAML::NodeType::Map);
    for (const auto& [k, e] : v) n[k] = e;
    return n;
  } else {
    return YAML::Node(v);
  }
}

namespace detail {
bool DecodeScalar(const YAML::Node& n, bool* out, std::string* err);
bool DecodeScalar(const YAML::Node& n, int64_t* out, std::string* err);
bool DecodeScalar(const YAML::Node& n, uint64_t* out, std::string* err);
bool DecodeScalar(const YAML::Node& n, double* out, std::string* err);
bool DecodeScalar(const YAML::Node& n, std::string* out, std::string* err);
std::string Render(const YAML::Node& n);
}  // namespace detail

template <typename T>
bool Binder::Decode(const YAML::Node& n, T* out, std::string* err) const {
  if constexpr (IsOptional<T>::value) {
    if (n.IsNull()) {
      out->reset();
      return true;
    }
    typename T::value_type v{};
    if (!Decode(n, &v, err)) return false;
    *out = v;
    return true;
  } else if constexpr (IsVector<T>::value) {
    if (!n.IsSequence()) {
      *err = "expected a list, got " + detail::Render(n);
      return false;
    }
    T v;
    for (size_t i = 0; i < n.size(); ++i) {
      typename T::value_type e{};
      std::string e_err;
      if (!Decode(n[i], &e, &e_err)) {
        *err = "item " + std::to_string(i) + ": " + e_err;
        return false;
      }
      v.push_back(std::move(e));
    }
    *out = std::move(v);
    return true;
  } else if constexpr (IsStringMap<T>::value) {
    if (!n.IsMap()) {
      *err = "expected a mapping, got " + detail::Render(n);
      return false;
    }
    T v;
    for (const auto& kv : n) {
      std::string s;
      if (!detail::DecodeScalar(kv.second, &s, err)) return false;
      v[kv.first.as<std::string>()] = s;
    }
    *out = std::move(v);
    return true;
  } else if constexpr (std::is_same_v<T, bool> || std::is_same_v<T, std::string>) {
    return detail::DecodeScalar(n, out, err);
  } else if constexpr (std::is_floating_point_v<T>) {
    double d = 0;
    if (!detail::DecodeScalar(n, &d, err)) return false;
    *out = static_cast<T>(d);
    return true;
  } else if constexpr (std::is_integral_v<T> && std::is_unsigned_v<T>) {
    uint64_t u = 0;
    if (!detail::DecodeScalar(n, &u, err)) return false;
    if (u > static_cast<uint64_t>(std::numeric_limits<T>::max())) {
      *err = "value " + std::to_string(u) + " is out of range (max " +
             std::to_string(std::numeric_limits<T>::max()) + ")";
      return false;
    }
    *out = static_cast<T>(u);
    return true;
  } else if constexpr (std::is_integral_v<T>) {
    int64_t i = 0;
    if (!detail::DecodeScalar(n, &i, err)) return false;
    if (i > static_cast<int64_t>(std::numeric_limits<T>::max()) ||
        i < static_cast<int64_t>(std::numeric_limits<T>::min())) {
      *err = "value " + std::to_string(i) + " is out of range";
      return false;
    }
    *out = static_cast<T>(i);
    return true;
  } else {
    static_assert(sizeof(T) == 0, "unsupported config field type");
  }
}

template <typename T>
void Binder::Field(const char* key, T* value, const char* doc) {
  known_.insert(key);
  switch (mode_) {
    case Mode::kRead: {
      if (!node_.IsMap()) return;
      YAML::Node n = node_[key];
      if (!n.IsDefined()) return;  // keep the default
      std::string err;
      if (!Decode(n, value, &err)) errors_->push_back(Where(key) + ": " + err);
      return;
    }
    case Mode::kWrite:
      (*out_)[key] = Encode(*value);
      return;
    case Mode::kDoc: {
      YAML::Emitter e;
      e << YAML::Flow << Encode(*value);
      docs_->push_back({Join(key), TypeName<T>(), e.c_str(), doc});
      return;
    }
  }
}

template <typename S>
void Binder::Section(const char* key, S* value, const char* doc) {
  known_.insert(key);
  switch (mode_) {
    case Mode::kRead: {
      if (!node_.IsMap()) return;
      YAML::Node n = node_[key];
      if (!n.IsDefined() || n.IsNull()) return;
      if (!n.IsMap()) {
        errors_->push_back(Where(key) + ": expected a mapping (section), got " + detail::Render(n));
        return;
      }
      Binder child = Binder::Reader(n, file_, Join(key));
      child.errors_ = errors_;
      Describe(child, *value);
      child.Finish().IgnoreError();
      return;
    }
    case Mode::kWrite: {
      YAML::Node sub(YAML::NodeType::Map);
      Binder child = Binder::Writer(&sub, Join(key));
      Describe(child, *value);
      (*out_)[key] = sub;
      return;
    }
    case Mode::kDoc: {
      docs_->push_back({Join(key), "section", "", doc});
      Binder child = Binder::Documenter(docs_, Join(key));
      Describe(child, *value);
      return;
    }
  }
}

template <typename S>
void Binder::List(const char* key, std::vector<S>* value, const char* doc) {
  known_.insert(key);
  switch (mode_) {
    case Mode::kRead: {
      if (!node_.IsMap()) return;
      YAML::Node n = node_[key];
      if (!n.IsDefined() || n.IsNull()) return;
      if (!n.IsSequence()) {
        errors_->push_back(Where(key) + ": expected a list, got " + detail::Render(n));
        return;
      }
      std::vector<S> items(n.size());
      for (size_t i = 0; i < n.size(); ++i) {
        if (!n[i].IsMap()) {
          errors_->push_back(Where(key) + "[" + std::to_string(i) + "]: expected a mapping, got " +
                             detail::Render(n[i]));
          continue;
        }
        Binder child = Binder::Reader(n[i], file_, Join(key) + "[" + std::to_string(i) + "]");
        child.errors_ = errors_;
        Describe(child, items[i]);
        child.Finish().IgnoreError();
      }
      *value = std::move(items);
      return;
    }
    case Mode::kWrite: {
      YAML::Node seq(YAML::NodeType::Sequence);
      for (auto& item : *value) {
        YAML::Node sub(YAML::NodeType::Map);
        Binder child = Binder::Writer(&sub, Join(key));
        Describe(child, item);
        seq.push_back(sub);
      }
      (*out_)[key] = seq;
      return;
    }
    case Mode::kDoc: {
      docs_->push_back({Join(key), "list", "[]", doc});
      S item{};
      Binder child = Binder::Documenter(docs_, Join(key) + "[]");
      Describe(child, item);
      return;
    }
  }
}

}  // namespace troupe::config
