#include "troupe/core/config_binder.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace troupe::config {

Binder::Binder(Mode mode, std::string path) : mode_(mode), path_(std::move(path)) {}

Binder Binder::Reader(const YAML::Node& node, std::string file, std::string path) {
  Binder b(Mode::kRead, std::move(path));
  b.node_ = node;
  b.file_ = std::move(file);
  return b;
}

Binder Binder::Writer(YAML::Node* out, std::string path) {
  Binder b(Mode::kWrite, std::move(path));
  b.out_ = out;
  return b;
}

Binder Binder::Documenter(std::vector<KeyDoc>* docs, std::string path) {
  Binder b(Mode::kDoc, std::move(path));
  b.docs_ = docs;
  return b;
}

std::string Binder::Where(const char* key) const {
  std::string where = file_.empty() ? "" : file_ + ": ";
  return where + "key '" + Join(key) + "'";
}

void Binder::Delegate(const char* key, const char* doc) {
  known_.insert(key);
  if (mode_ == Mode::kDoc) docs_->push_back({Join(key), "section", "", doc});
}

void Binder::Error(const std::string& key, const std::string& message) {
  errors_->push_back(Where(key.c_str()) + ": " + message);
}

Status Binder::Finish() {
  if (mode_ == Mode::kRead) {
    if (node_.IsDefined() && !node_.IsNull() && !node_.IsMap()) {
      errors_->push_back((file_.empty() ? "" : file_ + ": ") +
                         (path_.empty() ? std::string("the document") : "key '" + path_ + "'") +
                         " must be a mapping, got " + detail::Render(node_));
    } else if (node_.IsMap()) {
      for (const auto& kv : node_) {
        std::string k = kv.first.as<std::string>();
        if (known_.count(k)) continue;
        std::string msg = Where(k.c_str()) + ": unknown key";
        std::string guess = ClosestMatch(k, known_);
        if (!guess.empty()) msg += " (did you mean '" + Join(guess.c_str()) + "'?)";
        errors_->push_back(msg);
      }
    }
  }
  if (errors_->empty()) return Status::Ok();
  std::string all;
  for (const auto& e : *errors_) {
    if (!all.empty()) all += "\n";
    all += e;
  }
  return InvalidArgument("{}", all);
}

namespace detail {

std::string Render(const YAML::Node& n) {
  if (!n.IsDefined() || n.IsNull()) return "null";
  if (n.IsScalar()) return "'" + n.Scalar() + "'";
  if (n.IsSequence()) return "a list";
  if (n.IsMap()) return "a mapping";
  return "?";
}

static bool RequireScalar(const YAML::Node& n, std::string* err) {
  if (!n.IsScalar()) {
    *err = "expected a scalar, got " + Render(n);
    return false;
  }
  return true;
}

bool DecodeScalar(const YAML::Node& n, bool* out, std::string* err) {
  if (!RequireScalar(n, err)) return false;
  std::string s = n.Scalar();
  std::transform(s.begin(), s.end(), s.begin(), ::tolower);
  if (s == "true" || s == "yes" || s == "on") {
    *out = true;
    return true;
  }
  if (s == "false" || s == "no" || s == "off") {
    *out = false;
    return true;
  }
  *err = "expected true or false, got " + Render(n);
  return false;
}

bool DecodeScalar(const YAML::Node& n, int64_t* out, std::string* err) {
  if (!RequireScalar(n, err)) return false;
  const std::string& s = n.Scalar();
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || errno == ERANGE) {
    *err = "expected an integer, got " + Render(n);
    return false;
  }
  *out = v;
  return true;
}

bool DecodeScalar(const YAML::Node& n, uint64_t* out, std::string* err) {
  int64_t v = 0;
  if (!DecodeScalar(n, &v, err)) return false;
  if (v < 0) {
    *err = "expected a non-negative integer, got " + Render(n);
    return false;
  }
  *out = static_cast<uint64_t>(v);
  return true;
}

bool DecodeScalar(const YAML::Node& n, double* out, std::string* err) {
  if (!RequireScalar(n, err)) return false;
  const std::string& s = n.Scalar();
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(v)) {
    *err = "expected a finite number, got " + Render(n);
    return false;
  }
  *out = v;
  return true;
}

bool DecodeScalar(const YAML::Node& n, std::string* out, std::string* err) {
  if (!RequireScalar(n, err)) return false;
  *out = n.Scalar();
  return true;
}

}  // namespace detail

Status ApplyOverride(YAML::Node* root, const std::string& assignment) {
  auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0) {
    return InvalidArgument("--set '{}': expected key.path=value", assignment);
  }
  std::string key = assignment.substr(0, eq);
  std::string value = assignment.substr(eq + 1);
  std::vector<std::string> parts;
  std::stringstream ss(key);
  for (std::string p; std::getline(ss, p, '.');) {
    if (p.empty())
      return InvalidArgument("--set '{}': empty component in key '{}'", assignment, key);
    parts.push_back(p);
  }
  YAML::Node parsed;
  try {
    parsed = YAML::Load(value);
  } catch (const YAML::Exception& e) {
    return InvalidArgument("--set '{}': value is not valid YAML: {}", assignment, e.msg);
  }
  if (!root->IsDefined() || root->IsNull()) *root = YAML::Node(YAML::NodeType::Map);
  // Walk with owned copies (yaml-cpp nodes are reference-like handles).
  std::vector<YAML::Node> chain{*root};
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    YAML::Node cur = chain.back();  // always a mapping (checked below)
    YAML::Node next = cur[parts[i]];
    if (!next.IsDefined() || next.IsNull()) {
      cur[parts[i]] = YAML::Node(YAML::NodeType::Map);
      next = cur[parts[i]];
    }
    if (!next.IsMap()) {
      return InvalidArgument("--set '{}': '{}' is a value, not a section", assignment, parts[i]);
    }
    chain.push_back(next);
  }
  chain.back()[parts.back()] = parsed;
  return Status::Ok();
}

// A job config is a page of YAML; anything this big is the wrong file.
constexpr uintmax_t kMaxConfigBytes = 4 << 20;

Result<YAML::Node> LoadYamlFile(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st)) return NotFound("config file '{}' does not exist", path);
  if (fs::is_directory(st))
    return InvalidArgument("config '{}' is a folder, not a YAML file", path);
  if (!fs::is_regular_file(st)) return InvalidArgument("config '{}' is not a regular file", path);
  const uintmax_t size = fs::file_size(path, ec);
  if (!ec && size > kMaxConfigBytes)
    return InvalidArgument("config file '{}' is {} bytes; a job config is at most {}", path, size,
                           kMaxConfigBytes);
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("config file '{}' cannot be opened: {}", path, std::strerror(errno));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return IoError("config file '{}' cannot be read: {}", path, std::strerror(errno));
  if (text.find('\0') != std::string::npos)
    return InvalidArgument("config file '{}' is binary (it holds NUL bytes), not YAML", path);
  try {
    YAML::Node n = YAML::Load(text);
    // An empty file (or only comments) would start a job with every default:
    // almost certainly the wrong file.
    if (n.IsNull())
      return InvalidArgument("config file '{}' is empty: it sets no keys (at least `name:`)", path);
    if (!n.IsMap())
      return InvalidArgument("config file '{}' is not a YAML mapping of keys (it holds a {})", path,
                             n.IsSequence() ? "list" : "single value");
    return n;
  } catch (const YAML::ParserException& e) {
    return InvalidArgument("{}: line {}, column {}: {}", path, e.mark.line + 1, e.mark.column + 1,
                           e.msg);
  } catch (const std::exception& e) {
    return InvalidArgument("{}: {}", path, e.what());
  }
}

std::string ClosestMatch(const std::string& key, const std::set<std::string>& candidates) {
  std::string best;
  size_t best_d = std::string::npos;
  for (const auto& c : candidates) {
    std::vector<size_t> prev(c.size() + 1), cur(c.size() + 1);
    for (size_t j = 0; j <= c.size(); ++j) prev[j] = j;
    for (size_t i = 1; i <= key.size(); ++i) {
      cur[0] = i;
      for (size_t j = 1; j <= c.size(); ++j) {
        size_t sub = prev[j - 1] + (key[i - 1] == c[j - 1] ? 0 : 1);
        cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
      }
      std::swap(prev, cur);
    }
    size_t d = prev[c.size()];
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  size_t limit = std::max<size_t>(2, key.size() / 3);
  return best_d <= limit ? best : "";
}

}  // namespace troupe::config
