// Globals, member access, methods, tests and filters of the reference
// implementation, with its argument rules and its error messages.
#include <algorithm>
#include <cmath>
#include <ctime>

#include <fmt/format.h>

#include "interpreter.h"
#include "unicode.h"

namespace troupe::jinja::internal {
namespace {

[[noreturn]] void Fail(int line, const std::string& why) { throw TemplateError(line, why); }

bool IsInt(const Value& v) { return v.kind() == Value::Kind::kInt; }
const Value* Arg(const CallArgs& a, size_t i) {
  return i < a.positional.size() ? &a.positional[i] : nullptr;
}
// positional[i], else keyword `name`, else nullptr.
const Value* ArgOr(const CallArgs& a, size_t i, std::string_view name) {
  if (const Value* v = Arg(a, i)) return v;
  return a.Keyword(name);
}
bool BoolArg(const CallArgs& a, size_t i, std::string_view name, bool fallback, int line) {
  const Value* v = ArgOr(a, i, name);
  if (!v) return fallback;
  if (v->kind() != Value::Kind::kBool) Fail(line, fmt::format("{} must be a boolean", name));
  return v->boolean();
}
void NoKeywords(const CallArgs& a, std::string_view method, int line) {
  if (!a.keyword.empty())
    Fail(line, fmt::format("{}() does not take keyword arguments (got '{}')", method,
                           a.keyword.front().first));
}

// String.prototype.at(i) in UTF-16 units; refuses half a surrogate pair.
Value StringAt(const std::string& s, double index, int line) {
  int64_t len = Utf16Length(s);
  double i = index < 0 ? index + static_cast<double>(len) : index;
  if (i < 0 || i >= static_cast<double>(len)) return Value();
  int64_t want = static_cast<int64_t>(i), unit = 0;
  for (char32_t cp : DecodeUtf8(s)) {
    int64_t width = cp >= 0x10000 ? 2 : 1;
    if (want < unit + width) {
      if (width == 2)
        Fail(line, "indexing a string splits a character outside the Basic Multilingual Plane");
      std::string out;
      AppendUtf8(cp, &out);
      return Value::String(out);
    }
    unit += width;
  }
  return Value();
}

// The reference's getAttributeValue: "a.b.0" through objects and arrays.
Value AttributePath(const Value& item, const std::string& path) {
  Value v = item;
  size_t start = 0;
  for (;;) {
    size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (v.is_attribute_container()) {
      const Value* f = v.object().Find(part);
      v = f ? *f : Value();
    } else if (v.is_array()) {
      double idx;
      if (!JsParseInt(part, &idx) || idx < 0 || idx >= static_cast<double>(v.array().size()))
        return Value();
      v = v.array()[static_cast<size_t>(idx)];
    } else {
      return Value();
    }
    if (dot == std::string::npos) return v;
    start = dot + 1;
  }
}

std::string JoinPiece(const Value& v) {
  return v.is_null() || v.is_undefined() ? std::string() : v.ConcatText();
}

std::string Indent(const std::string& s, int64_t width, bool first, bool blank) {
  std::string pad(static_cast<size_t>(std::max<int64_t>(width, 0)), ' ');
  std::string out;
  size_t start = 0;
  for (int line = 0;; ++line) {
    size_t nl = s.find('\n', start);
    std::string piece = s.substr(start, nl == std::string::npos ? std::string::npos : nl - start);
    if (!((!first && line == 0) || (!blank && piece.empty()))) out += pad;
    out += piece;
    if (nl == std::string::npos) return out;
    out += '\n';
    start = nl + 1;
  }
}

std::string ReplaceAll(const std::string& s, const std::string& from, const std::string& to,
                       double count) {
  if (count == 0) return s;
  double remaining = count < 0 ? INFINITY : count;
  std::string out;
  if (from.empty()) {  // /(?=)/gu: before every code point and at the end
    for (size_t i = 0; i < s.size();) {
      if (remaining > 0) {
        out += to;
        --remaining;
      }
      size_t n = Utf8SeqLen(static_cast<unsigned char>(s[i]));
      out.append(s, i, n);
      i += n;
    }
    if (remaining > 0) out += to;
    return out;
  }
  size_t pos = 0;
  for (;;) {
    size_t hit = s.find(from, pos);
    if (hit == std::string::npos || remaining <= 0) break;
    out.append(s, pos, hit - pos);
    out += to;
    --remaining;
    pos = hit + from.size();
  }
  out.append(s, pos, std::string::npos);
  return out;
}

std::vector<std::string> SplitOn(const std::string& s, const std::string& sep) {
  std::vector<std::string> out;
  size_t pos = 0;
  for (;;) {
    size_t hit = s.find(sep, pos);
    if (hit == std::string::npos) break;
    out.push_back(s.substr(pos, hit - pos));
    pos = hit + sep.size();
  }
  out.push_back(s.substr(pos));
  return out;
}

Value StringList(std::vector<std::string> parts) {
  Array a;
  a.reserve(parts.size());
  for (auto& p : parts) a.push_back(Value::String(std::move(p)));
  return Value::MakeArray(std::move(a));
}

Value Pairs(const Object& o) {
  Array out;
  for (const auto& [k, v] : o.entries) out.push_back(Value::MakeArray({Value::String(k), v}));
  return Value::MakeArray(std::move(out));
}

// ---- methods: "x".upper(), d.items(), ...

Value CallStringMethod(const std::string& s, const std::string& name, const CallArgs& a, int line) {
  if (name == "upper") return Value::String(ToUpper(s));
  if (name == "lower") return Value::String(ToLower(s));
  // The reference ignores strip's argument: strip('\n') strips all whitespace.
  if (name == "strip") return Value::String(JsTrim(s, true, true));
  if (name == "lstrip") return Value::String(JsTrim(s, true, false));
  if (name == "rstrip") return Value::String(JsTrim(s, false, true));
  if (name == "title") return Value::String(TitleAscii(s));
  if (name == "capitalize") return Value::String(CapitalizeFirst(s));
  if (name == "startswith" || name == "endswith") {
    NoKeywords(a, name, line);
    const Value* p = Arg(a, 0);
    if (!p) Fail(line, fmt::format("{}() requires at least one argument", name));
    auto test = [&](const std::string& x) {
      if (x.size() > s.size()) return false;
      return name == "startswith" ? s.compare(0, x.size(), x) == 0
                                  : s.compare(s.size() - x.size(), x.size(), x) == 0;
    };
    if (p->is_string()) return Value::Bool(test(p->str()));
    if (p->is_array()) {
      for (const Value& x : p->array()) {
        if (!x.is_string()) Fail(line, fmt::format("{}() tuple elements must be strings", name));
        if (test(x.str())) return Value::Bool(true);
      }
      return Value::Bool(false);
    }
    Fail(line, fmt::format("{}() argument must be a string or tuple of strings", name));
  }
  if (name == "split") {
    NoKeywords(a, name, line);
    Value sep = Arg(a, 0) ? *Arg(a, 0) : Value::Null();
    if (!sep.is_string() && !sep.is_null()) Fail(line, "sep argument must be a string or null");
    Value maxsplit = Arg(a, 1) ? *Arg(a, 1) : Value::Int(-1);
    if (!IsInt(maxsplit)) Fail(line, "maxsplit argument must be a number");
    double m = maxsplit.number();
    if (sep.is_null()) return StringList(SplitWhitespace(s, static_cast<int64_t>(m)));
    if (sep.str().empty()) Fail(line, "empty separator");
    std::vector<std::string> parts = SplitOn(s, sep.str());
    auto len = static_cast<double>(parts.size());
    if (m != -1 && len > m) {
      // Array.prototype.splice(m): the tail from index m (negative: from the end).
      double start = m < 0 ? std::max(len + m, 0.0) : std::min(m, len);
      auto cut = static_cast<size_t>(start);
      std::string rest;
      for (size_t i = cut; i < parts.size(); ++i) rest += (i > cut ? sep.str() : "") + parts[i];
      parts.resize(cut);
      parts.push_back(rest);
    }
    return StringList(std::move(parts));
  }
  if (name == "replace") {
    if (a.positional.size() + a.keyword.size() < 2)
      Fail(line, "replace() requires at least two arguments");
    const Value* from = Arg(a, 0);
    const Value* to = Arg(a, 1);
    if (!from || !to || !from->is_string() || !to->is_string())
      Fail(line, "replace() arguments must be strings");
    Value count = Value::Null();
    if (const Value* c = Arg(a, 2)) {
      count = *c;
    } else if (const Value* k = a.Keyword("count")) {
      count = *k;
    }
    if (!IsInt(count) && !count.is_null()) Fail(line, "replace() count argument must be a number or null");
    return Value::String(
        ReplaceAll(s, from->str(), to->str(), count.is_null() ? -1 : count.number()));
  }
  Fail(line, fmt::format("unknown string method '{}'", name));
}

Value DictSort(const Object& o, const CallArgs& a, int line) {
  bool case_sensitive = BoolArg(a, 0, "case_sensitive", false, line);
  const Value* by_v = ArgOr(a, 1, "by");
  std::string by = "key";
  if (by_v) {
    if (!by_v->is_string()) Fail(line, "by must be a string");
    by = by_v->str();
  }
  if (by != "key" && by != "value") Fail(line, "by must be either 'key' or 'value'");
  bool reverse = BoolArg(a, 2, "reverse", false, line);
  std::vector<std::pair<std::string, Value>> items = o.entries;
  size_t idx = by == "key" ? 0 : 1;
  std::stable_sort(items.begin(), items.end(), [&](const auto& x, const auto& y) {
    Value xa = idx == 0 ? Value::String(x.first) : x.second;
    Value ya = idx == 0 ? Value::String(y.first) : y.second;
    int r = CompareForSort(xa, ya, case_sensitive, line);
    return reverse ? r > 0 : r < 0;
  });
  Object sorted;
  sorted.entries = std::move(items);
  return Pairs(sorted);
}

Value CallObjectMethod(const Value& obj, const std::string& name, const CallArgs& a, int line) {
  const Object& o = obj.object();
  if (name == "get") {
    const Value* key = Arg(a, 0);
    if (!key || !key->is_string())
      Fail(line, fmt::format("Object key must be a string: got {}",
                             key ? key->TypeName() : "UndefinedValue"));
    if (const Value* v = o.Find(key->str())) return *v;
    if (const Value* d = Arg(a, 1)) return *d;
    return Value::Null();
  }
  if (name == "items") return Pairs(o);
  if (name == "keys") {
    Array out;
    for (const auto& e : o.entries) out.push_back(Value::String(e.first));
    return Value::MakeArray(std::move(out));
  }
  if (name == "values") {
    Array out;
    for (const auto& e : o.entries) out.push_back(e.second);
    return Value::MakeArray(std::move(out));
  }
  if (name == "dictsort") return DictSort(o, a, line);
  Fail(line, fmt::format("unknown dict method '{}'", name));
}

class BoundMethod final : public Callable {
 public:
  BoundMethod(Value self, std::string name) : self_(std::move(self)), name_(std::move(name)) {}
  std::string Name() const override { return name_; }
  Value Call(Interpreter& in, CallArgs args, Scope&, int line) override {
    Value out = self_.is_string() ? CallStringMethod(self_.str(), name_, args, line)
                                  : CallObjectMethod(self_, name_, args, line);
    if (out.is_string()) in.CheckSize(out.str().size(), line);
    return out;
  }

 private:
  Value self_;
  std::string name_;
};

bool IsStringMethod(const std::string& n) {
  static const char* kNames[] = {"upper", "lower", "strip", "title", "capitalize", "rstrip",
                                 "lstrip", "startswith", "endswith", "split", "replace"};
  for (const char* k : kNames)
    if (n == k) return true;
  return false;
}
bool IsObjectMethod(const std::string& n) {
  return n == "get" || n == "items" || n == "keys" || n == "values" || n == "dictsort";
}

// ---- globals

class GlobalFn final : public Callable {
 public:
  using Fn = Value (*)(Interpreter&, const CallArgs&, int);
  GlobalFn(std::string name, Fn fn) : name_(std::move(name)), fn_(fn) {}
  std::string Name() const override { return name_; }
  Value Call(Interpreter& in, CallArgs args, Scope&, int line) override { return fn_(in, args, line); }

 private:
  std::string name_;
  Fn fn_;
};

Value RaiseException(Interpreter&, const CallArgs& a, int line) {
  std::string msg = a.positional.empty() || a.positional[0].is_undefined()
                        ? std::string()
                        : a.positional[0].ConcatText();
  Fail(line, "raise_exception: " + msg);
}

Value Range(Interpreter& in, const CallArgs& a, int line) {
  if (!a.keyword.empty() || a.positional.empty() || a.positional.size() > 3)
    Fail(line, "range() takes 1 to 3 integer arguments");
  for (const Value& v : a.positional)
    if (!IsInt(v)) Fail(line, fmt::format("range() arguments must be integers, got {}", v.TypeName()));
  double start = 0, stop, step = 1;
  if (a.positional.size() == 1) {
    stop = a.positional[0].number();
  } else {
    start = a.positional[0].number();
    stop = a.positional[1].number();
    if (a.positional.size() == 3) step = a.positional[2].number();
  }
  if (step == 0) Fail(line, "range() step must not be zero");
  double count = std::ceil((stop - start) / step);
  if (count > static_cast<double>(in.options().max_steps))
    throw TemplateError::Limit(line, fmt::format("range() of {} items is over the evaluation budget",
                                                 count));
  Array out;
  for (double i = start; step > 0 ? i < stop : i > stop; i += step) {
    in.Step(line);
    out.push_back(Value::Int(i));
  }
  return Value::MakeArray(std::move(out));
}

Value StrftimeNow(Interpreter& in, const CallArgs& a, int line) {
  const Value* f = Arg(a, 0);
  if (!f || !f->is_string()) Fail(line, "strftime_now() needs a format string");
  time_t t = in.options().now_unix_seconds ? static_cast<time_t>(*in.options().now_unix_seconds)
                                           : time(nullptr);
  std::tm tm{};
  if (in.options().utc) {
    gmtime_r(&t, &tm);
  } else {
    localtime_r(&t, &tm);
  }
  static const char* kShort[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                 "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  static const char* kLong[] = {"January", "February", "March",     "April",   "May",      "June",
                                "July",    "August",   "September", "October", "November", "December"};
  const std::string& s = f->str();
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%' || i + 1 == s.size()) {
      out.push_back(s[i]);
      continue;
    }
    char d = s[++i];
    switch (d) {
      case 'Y': out += std::to_string(tm.tm_year + 1900); break;
      case 'm': out += fmt::format("{:02d}", tm.tm_mon + 1); break;
      case 'd': out += fmt::format("{:02d}", tm.tm_mday); break;
      case 'b': out += kShort[tm.tm_mon]; break;
      case 'B': out += kLong[tm.tm_mon]; break;
      case 'H': out += fmt::format("{:02d}", tm.tm_hour); break;
      case 'M': out += fmt::format("{:02d}", tm.tm_min); break;
      case '%': out += '%'; break;
      default:
        Fail(line, fmt::format("strftime_now(): directive %{} is not supported (supported: %Y %m "
                               "%d %b %B %H %M %%)",
                               d));
    }
  }
  return Value::String(out);
}

Value Namespace(Interpreter&, const CallArgs& a, int line) {
  if (a.positional.size() > 1)
    Fail(line, fmt::format("namespace expected at most 1 argument, got {}", a.positional.size()));
  Object entries;
  if (!a.positional.empty()) {
    const Value& src = a.positional[0];
    if (src.is_object()) {
      for (const auto& [k, v] : src.object().entries) entries.Set(k, v);
    } else if (src.is_array()) {
      for (const Value& pair : src.array()) {
        if (!pair.is_array() || pair.array().size() != 2 || !pair.array()[0].is_string())
          Fail(line, "namespace expected an object or an iterable of [key, value] pairs");
        entries.Set(pair.array()[0].str(), pair.array()[1]);
      }
    } else {
      Fail(line, fmt::format("'{}' object is not iterable", src.TypeName()));
    }
  }
  for (const auto& [k, v] : a.keyword) entries.Set(k, v);
  return Value::MakeNamespace(std::move(entries));
}

// ---- filters

Value SortArray(const Array& items, bool reverse, bool case_sensitive, const Value& attribute,
                int line) {
  Array out = items;
  auto key = [&](const Value& v) {
    if (attribute.is_null()) return v;
    std::string path = attribute.is_string() ? attribute.str() : JsNumber(attribute.number());
    return AttributePath(v, path);
  };
  std::stable_sort(out.begin(), out.end(), [&](const Value& x, const Value& y) {
    int r = CompareForSort(key(x), key(y), case_sensitive, line);
    return reverse ? r > 0 : r < 0;
  });
  return Value::MakeArray(std::move(out));
}

Value ParseNumber(const std::string& s, bool integer, const Value& fallback) {
  double v;
  bool ok = integer ? JsParseInt(s, &v) : JsParseFloat(s, &v);
  if (!ok) return fallback;
  return integer ? Value::Int(v) : Value::Float(v);
}

}  // namespace

Value GetMember(const Value& object, const Value& property, int line) {
  if (object.is_attribute_container()) {
    if (!property.is_string())
      Fail(line, fmt::format("Cannot access property with non-string: got {}", property.TypeName()));
    if (const Value* v = object.object().Find(property.str())) return *v;
    if (object.is_object() && IsObjectMethod(property.str()))
      return Value::Function(std::make_shared<BoundMethod>(object, property.str()));
    return Value();
  }
  if (object.is_array() || object.is_string()) {
    if (IsInt(property)) {
      if (object.is_string()) return StringAt(object.str(), property.number(), line);
      const Array& a = object.array();
      double i = property.number() < 0 ? property.number() + static_cast<double>(a.size())
                                       : property.number();
      if (i < 0 || i >= static_cast<double>(a.size())) return Value();
      return a[static_cast<size_t>(i)];
    }
    if (!property.is_string())
      Fail(line, fmt::format("Cannot access property with non-string/non-number: got {}",
                             property.TypeName()));
    const std::string& name = property.str();
    if (name == "length")
      return Value::Int(object.is_string() ? static_cast<double>(Utf16Length(object.str()))
                                           : static_cast<double>(object.array().size()));
    if (object.is_string() && IsStringMethod(name))
      return Value::Function(std::make_shared<BoundMethod>(object, name));
    return Value();
  }
  if (!property.is_string())
    Fail(line, fmt::format("Cannot access property with non-string: got {}", property.TypeName()));
  return Value();
}

bool RunTest(const std::string& name, const Value& v, const Value* arg, int line) {
  using K = Value::Kind;
  if (name == "boolean") return v.kind() == K::kBool;
  if (name == "callable") return v.is_function();
  if (name == "odd" || name == "even") {
    if (!IsInt(v)) Fail(line, fmt::format("cannot {} on {}", name, v.TypeName()));
    bool odd = std::fmod(v.number(), 2) != 0;
    return name == "odd" ? odd : !odd;
  }
  if (name == "false") return v.kind() == K::kBool && !v.boolean();
  if (name == "true") return v.kind() == K::kBool && v.boolean();
  if (name == "none") return v.is_null();
  if (name == "string") return v.is_string();
  if (name == "number") return v.is_number();
  if (name == "integer") return IsInt(v);
  if (name == "iterable") return (v.is_array() && !v.is_tuple()) || v.is_string();
  if (name == "mapping") return v.is_object();
  if (name == "sequence") return v.is_array() || v.is_object() || v.is_string();
  if (name == "lower" || name == "upper") {
    if (!v.is_string()) return false;
    return v.str() == (name == "lower" ? ToLower(v.str()) : ToUpper(v.str()));
  }
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "equalto" || name == "eq") {
    if (!arg) Fail(line, fmt::format("test '{}' needs a value to compare with", name));
    return StrictEquals(v, *arg);
  }
  Fail(line, fmt::format("Unknown test: {}", name));
}

void Interpreter::AddGlobals(Scope* g) {
  g->Set("false", Value::Bool(false));
  g->Set("true", Value::Bool(true));
  g->Set("none", Value::Null());
  g->Set("False", Value::Bool(false));
  g->Set("True", Value::Bool(true));
  g->Set("None", Value::Null());
  g->Set("raise_exception", Value::Function(std::make_shared<GlobalFn>("raise_exception", RaiseException)));
  g->Set("range", Value::Function(std::make_shared<GlobalFn>("range", Range)));
  g->Set("strftime_now", Value::Function(std::make_shared<GlobalFn>("strftime_now", StrftimeNow)));
  g->Set("namespace", Value::Function(std::make_shared<GlobalFn>("namespace", Namespace)));
}

Value Interpreter::ApplyFilter(const Value& operand, const Node& f, Scope& scope) {
  Value out = f.flag ? FilterWithArgs(operand, f, scope) : FilterNoArgs(operand, f.str, f.line);
  if (out.is_string()) CheckSize(out.str().size(), f.line);
  return out;
}

Value Interpreter::FilterNoArgs(const Value& v, const std::string& name, int line) {
  if (name == "safe") return v;
  if (name == "tojson") return Value::String(ToJson(v, JsonOptions{}));
  if (v.is_array()) {
    const Array& a = v.array();
    if (name == "list") return v;
    if (name == "first" || name == "last") {
      if (a.empty()) Fail(line, fmt::format("{} of an empty list", name));
      return name == "first" ? a.front() : a.back();
    }
    if (name == "length") return Value::Int(static_cast<double>(a.size()));
    if (name == "reverse") return Value::MakeArray(Array(a.rbegin(), a.rend()));
    if (name == "sort") return SortArray(a, false, false, Value::Null(), line);
    if (name == "join") {
      std::string out;
      for (const Value& x : a) out += JoinPiece(x);
      return Value::String(out);
    }
    if (name == "string") {
      JsonOptions o;
      o.undefined_as_null = false;
      return Value::String(ToJson(v, o));
    }
    if (name == "unique") {
      Array out;
      for (const Value& x : a) {
        bool seen = false;
        for (const Value& y : out) {
          Step(line);
          seen = seen || StrictEquals(x, y);
        }
        if (!seen) out.push_back(x);
      }
      return Value::MakeArray(std::move(out));
    }
    Fail(line, fmt::format("Unknown ArrayValue filter: {}", name));
  }
  if (v.is_string()) {
    const std::string& s = v.str();
    if (name == "length") return Value::Int(static_cast<double>(Utf16Length(s)));
    if (name == "upper") return Value::String(ToUpper(s));
    if (name == "lower") return Value::String(ToLower(s));
    if (name == "title") return Value::String(TitleAscii(s));
    if (name == "capitalize") return Value::String(CapitalizeFirst(s));
    if (name == "trim") return Value::String(JsTrim(s, true, true));
    if (name == "indent") return Value::String(Indent(s, 4, false, false));
    if (name == "join" || name == "string") return v;
    if (name == "int") return ParseNumber(s, true, Value::Int(0));
    if (name == "float") return ParseNumber(s, false, Value::Float(0));
    Fail(line, fmt::format("Unknown StringValue filter: {}", name));
  }
  if (v.is_number()) {
    if (name == "abs") return v.kind() == Value::Kind::kInt ? Value::Int(std::fabs(v.number()))
                                                            : Value::Float(std::fabs(v.number()));
    if (name == "int") return Value::Int(std::floor(v.number()));
    if (name == "float") return Value::Float(v.number());
    if (name == "string") return Value::String(v.Display());
    Fail(line, fmt::format("Unknown NumericValue filter: {}", name));
  }
  if (v.is_object()) {
    if (name == "items") return Pairs(v.object());
    if (name == "length") return Value::Int(static_cast<double>(v.object().entries.size()));
    if (IsObjectMethod(name)) return CallObjectMethod(v, name, CallArgs{}, line);
    Fail(line, fmt::format("Unknown ObjectValue filter: {}", name));
  }
  if (v.kind() == Value::Kind::kBool) {
    if (name == "bool") return v;
    if (name == "int") return Value::Int(v.boolean() ? 1 : 0);
    if (name == "float") return Value::Float(v.boolean() ? 1 : 0);
    if (name == "string") return Value::String(v.boolean() ? "true" : "false");
    Fail(line, fmt::format("Unknown BooleanValue filter: {}", name));
  }
  Fail(line, fmt::format("Cannot apply filter \"{}\" to type: {}", name, v.TypeName()));
}

Value Interpreter::FilterWithArgs(const Value& v, const Node& f, Scope& scope) {
  const std::string& name = f.str;
  const int line = f.line;
  if (name == "selectattr" || name == "rejectattr") {
    if (!v.is_array()) Fail(line, fmt::format("Cannot apply filter \"{}\" to type: {}", name, v.TypeName()));
    for (const Value& x : v.array())
      if (!x.is_attribute_container())
        Fail(line, fmt::format("`{}` can only be applied to array of objects", name));
    for (const auto& a : f.list)
      if (a->kind != NodeKind::kString) Fail(line, fmt::format("arguments of `{}` must be strings", name));
    if (f.list.empty()) Fail(line, fmt::format("`{}` needs an attribute name", name));
    const std::string& attr = f.list[0]->str;
    Value compare = f.list.size() > 2 ? Value::String(f.list[2]->str) : Value();
    bool select = name == "selectattr";
    Array out;
    for (const Value& item : v.array()) {
      const Value* a = item.object().Find(attr);
      bool r = false;
      if (a) r = f.list.size() > 1 ? RunTest(f.list[1]->str, *a, f.list.size() > 2 ? &compare : nullptr, line)
                                   : a->Truthy();
      if (r == select) out.push_back(item);
    }
    return Value::MakeArray(std::move(out));
  }
  CallArgs a = EvalArgs(f.list, scope);
  if (name == "tojson") {
    JsonOptions o;
    if (const Value* indent = a.Keyword("indent")) {
      if (!IsInt(*indent) && !indent->is_null()) Fail(line, "If set, indent must be a number");
      if (IsInt(*indent) && (indent->number() < 0 || indent->number() > 1024))
        Fail(line, "tojson: indent must be between 0 and 1024");
      o.indent = indent->is_null() ? 0 : static_cast<int>(indent->number());
    }
    if (const Value* e = a.Keyword("ensure_ascii")) {
      if (e->kind() != Value::Kind::kBool) Fail(line, "If set, ensure_ascii must be a boolean");
      o.ensure_ascii = e->boolean();
    }
    if (const Value* s = a.Keyword("sort_keys")) {
      if (s->kind() != Value::Kind::kBool) Fail(line, "If set, sort_keys must be a boolean");
      o.sort_keys = s->boolean();
    }
    if (const Value* sep = a.Keyword("separators")) {
      if (sep->is_array()) {
        if (sep->array().size() != 2 || !sep->array()[0].is_string() || !sep->array()[1].is_string())
          Fail(line, "separators must be a tuple of two strings");
        o.custom_separators = true;
        o.item_separator = sep->array()[0].str();
        o.key_separator = sep->array()[1].str();
      } else if (!sep->is_null()) {
        Fail(line, "If set, separators must be a tuple of two strings");
      }
    }
    return Value::String(ToJson(v, o));
  }
  if (name == "join") {
    std::vector<std::string> pieces;
    if (v.is_string()) {
      for (char32_t cp : DecodeUtf8(v.str())) {
        std::string c;
        AppendUtf8(cp, &c);
        pieces.push_back(c);
      }
    } else if (v.is_array()) {
      for (const Value& x : v.array()) pieces.push_back(JoinPiece(x));
    } else {
      Fail(line, fmt::format("Cannot apply filter \"join\" to type: {}", v.TypeName()));
    }
    const Value* sep = ArgOr(a, 0, "separator");
    if (sep && !sep->is_string()) Fail(line, "separator must be a string");
    std::string out;
    for (size_t i = 0; i < pieces.size(); ++i) {
      if (i && sep) out += sep->str();
      out += pieces[i];
      CheckSize(out.size(), line);
    }
    return Value::String(out);
  }
  if (name == "int" || name == "float") {
    bool integer = name == "int";
    const Value* d = ArgOr(a, 0, "default");
    Value fallback = d ? *d : integer ? Value::Int(0) : Value::Float(0);
    if (v.is_string()) return ParseNumber(v.str(), integer, fallback);
    if (v.is_number()) return v;
    if (v.kind() == Value::Kind::kBool)
      return integer ? Value::Int(v.boolean()) : Value::Float(v.boolean());
    Fail(line, fmt::format("Cannot apply filter \"{}\" to type: {}", name, v.TypeName()));
  }
  if (name == "default") {
    Value fallback = Arg(a, 0) ? *Arg(a, 0) : Value::String("");
    bool boolean = BoolArg(a, 1, "boolean", false, line);
    if (v.is_undefined() || (boolean && !v.Truthy())) return fallback;
    return v;
  }
  if (v.is_array()) {
    if (name == "sort") {
      bool reverse = BoolArg(a, 0, "reverse", false, line);
      bool case_sensitive = BoolArg(a, 1, "case_sensitive", false, line);
      const Value* attr = ArgOr(a, 2, "attribute");
      Value attribute = attr ? *attr : Value::Null();
      if (!attribute.is_string() && !IsInt(attribute) && !attribute.is_null())
        Fail(line, "attribute must be a string, integer, or null");
      return SortArray(v.array(), reverse, case_sensitive, attribute, line);
    }
    if (name == "map") {
      const Value* attr = a.Keyword("attribute");
      if (!attr) Fail(line, "`map` expressions without `attribute` set are not currently supported.");
      if (!attr->is_string()) Fail(line, "attribute must be a string");
      const Value* def = a.Keyword("default");
      Array out;
      for (const Value& item : v.array()) {
        if (!item.is_attribute_container()) Fail(line, "items in map must be an object");
        Value x = AttributePath(item, attr->str());
        out.push_back(x.is_undefined() && def ? *def : x);
      }
      return Value::MakeArray(std::move(out));
    }
    Fail(line, fmt::format("Unknown ArrayValue filter: {}", name));
  }
  if (v.is_string()) {
    if (name == "indent") {
      const Value* width = ArgOr(a, 0, "width");
      if (width && !IsInt(*width)) Fail(line, "width must be a number");
      const Value* first = ArgOr(a, 1, "first");
      const Value* blank = ArgOr(a, 2, "blank");
      int64_t w = width ? static_cast<int64_t>(std::clamp(width->number(), 0.0, 1e6)) : 4;
      return Value::String(Indent(v.str(), w, first && first->Truthy(), blank && blank->Truthy()));
    }
    if (name == "replace") return CallStringMethod(v.str(), "replace", a, line);
    Fail(line, fmt::format("Unknown StringValue filter: {}", name));
  }
  if (v.is_object()) {
    if (IsObjectMethod(name)) return CallObjectMethod(v, name, a, line);
    Fail(line, fmt::format("Unknown ObjectValue filter: {}", name));
  }
  Fail(line, fmt::format("Cannot apply filter \"{}\" to type: {}", name, v.TypeName()));
}

}  // namespace troupe::jinja::internal
