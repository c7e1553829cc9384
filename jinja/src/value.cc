#include "value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>

#include <fmt/format.h>

#include "unicode.h"

namespace troupe::jinja::internal {
namespace {

constexpr int kMaxJsonDepth = 200;   // input nesting accepted from JSON
constexpr int kMaxPrintDepth = 512;  // nesting printed by ToJson

bool IsArrayIndexKey(const std::string& k, uint64_t* index) {
  if (k.empty() || k.size() > 10 || (k.size() > 1 && k[0] == '0')) return false;
  uint64_t v = 0;
  for (char c : k) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  if (v > 4294967294ULL) return false;
  *index = v;
  return true;
}

std::string FloatDisplay(double v) {
  if (v == 0 && std::signbit(v)) return "-0.0";
  if (std::isfinite(v) && std::fmod(v, 1.0) == 0) {
    if (std::fabs(v) >= 1e21) return JsNumber(v);
    return fmt::format("{:.1f}", v);  // Number.prototype.toFixed(1): exact digits
  }
  return JsNumber(v);
}

// The JavaScript type of a value's payload, for == and ===.
enum class JsType { kUndefined, kNull, kBoolean, kNumber, kString, kObject, kFunction };
JsType TypeOf(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return JsType::kUndefined;
    case Value::Kind::kNull: return JsType::kNull;
    case Value::Kind::kBool: return JsType::kBoolean;
    case Value::Kind::kInt:
    case Value::Kind::kFloat: return JsType::kNumber;
    case Value::Kind::kString: return JsType::kString;
    case Value::Kind::kFunction: return JsType::kFunction;
    default: return JsType::kObject;
  }
}

// JavaScript ToNumber of a string.
double StringToNumber(std::string_view s) {
  std::string t = JsTrim(s, true, true);
  if (t.empty()) return 0;
  if (t.size() > 2 && t[0] == '0' && (t[1] == 'x' || t[1] == 'X' || t[1] == 'o' || t[1] == 'O' ||
                                      t[1] == 'b' || t[1] == 'B')) {
    int base = (t[1] == 'x' || t[1] == 'X') ? 16 : (t[1] == 'o' || t[1] == 'O') ? 8 : 2;
    double v = 0;
    for (size_t i = 2; i < t.size(); ++i) {
      char c = t[i];
      int d = (c >= '0' && c <= '9') ? c - '0'
              : (c >= 'a' && c <= 'f') ? c - 'a' + 10
              : (c >= 'A' && c <= 'F') ? c - 'A' + 10
                                       : 99;
      if (d >= base) return NAN;
      v = v * base + d;
    }
    return v;
  }
  double v;
  if (!JsParseFloat(t, &v)) return NAN;
  // parseFloat accepts a prefix; ToNumber needs the whole string.
  size_t i = (t[0] == '+' || t[0] == '-') ? 1 : 0;
  if (t.compare(i, std::string::npos, "Infinity") == 0) return v;
  for (; i < t.size(); ++i) {
    char c = t[i];
    if (!((c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-'))
      return NAN;
  }
  char* end = nullptr;
  double w = std::strtod(t.c_str(), &end);
  return (end && *end == '\0') ? w : NAN;
}

// JavaScript ToPrimitive of an object payload (for == against a primitive).
std::string ObjectToPrimitive(const Value& v) {
  if (v.is_array()) return v.ConcatText();
  return "[object Map]";
}

}  // namespace

const Value* Object::Find(std::string_view key) const {
  for (const auto& [k, v] : entries)
    if (k == key) return &v;
  return nullptr;
}

void Object::Set(std::string key, Value value) {
  for (auto& [k, v] : entries) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  entries.emplace_back(std::move(key), std::move(value));
}

const Value* CallArgs::Keyword(std::string_view name) const {
  for (const auto& [k, v] : keyword)
    if (k == name) return &v;
  return nullptr;
}

Value Value::Bool(bool b) {
  Value v(Kind::kBool);
  v.b_ = b;
  return v;
}
Value Value::Int(double n) {
  Value v(Kind::kInt);
  v.num_ = n;
  return v;
}
Value Value::Float(double n) {
  Value v(Kind::kFloat);
  v.num_ = n;
  return v;
}
Value Value::String(std::string s) {
  Value v(Kind::kString);
  v.s_ = std::make_shared<std::string>(std::move(s));
  return v;
}
Value Value::MakeArray(Array items, bool tuple) {
  Value v(Kind::kArray);
  v.tuple_ = tuple;
  v.a_ = std::make_shared<Array>(std::move(items));
  return v;
}
Value Value::MakeObject(Object obj) {
  Value v(Kind::kObject);
  v.o_ = std::make_shared<Object>(std::move(obj));
  return v;
}
Value Value::MakeNamespace(Object obj) {
  Value v(Kind::kNamespace);
  v.o_ = std::make_shared<Object>(std::move(obj));
  return v;
}
Value Value::Function(std::shared_ptr<Callable> fn) {
  Value v(Kind::kFunction);
  v.fn_ = std::move(fn);
  return v;
}

Value Value::FromJson(const nlohmann::ordered_json& j, int depth) {
  using J = nlohmann::ordered_json::value_t;
  if (depth > kMaxJsonDepth)
    throw TemplateError(0, fmt::format("input nests deeper than {} levels", kMaxJsonDepth));
  switch (j.type()) {
    case J::null: return Null();
    case J::boolean: return Bool(j.get<bool>());
    case J::number_integer: return Int(static_cast<double>(j.get<int64_t>()));
    case J::number_unsigned: return Int(static_cast<double>(j.get<uint64_t>()));
    case J::number_float: {
      double d = j.get<double>();
      if (std::isfinite(d) && std::fmod(d, 1.0) == 0) return Int(d);
      return Float(d);
    }
    case J::string: {
      const auto& s = j.get_ref<const std::string&>();
      if (!IsValidUtf8(s)) throw TemplateError(0, "input text is not valid UTF-8");
      return String(s);
    }
    case J::array: {
      Array items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(FromJson(e, depth + 1));
      return MakeArray(std::move(items));
    }
    case J::object: {
      std::vector<std::pair<uint64_t, std::pair<std::string, Value>>> indexed;
      Object obj;
      for (auto it = j.begin(); it != j.end(); ++it) {
        if (!IsValidUtf8(it.key())) throw TemplateError(0, "input key is not valid UTF-8");
        uint64_t index;
        if (IsArrayIndexKey(it.key(), &index)) {
          indexed.push_back({index, {it.key(), FromJson(it.value(), depth + 1)}});
        } else {
          obj.entries.emplace_back(it.key(), FromJson(it.value(), depth + 1));
        }
      }
      if (!indexed.empty()) {
        std::stable_sort(indexed.begin(), indexed.end(),
                         [](const auto& a, const auto& b) { return a.first < b.first; });
        std::vector<std::pair<std::string, Value>> all;
        for (auto& e : indexed) all.push_back(std::move(e.second));
        for (auto& e : obj.entries) all.push_back(std::move(e));
        obj.entries = std::move(all);
      }
      return MakeObject(std::move(obj));
    }
    default:
      throw TemplateError(0, fmt::format("input has a JSON {} value", j.type_name()));
  }
}

const char* Value::TypeName() const {
  switch (kind_) {
    case Kind::kUndefined: return "UndefinedValue";
    case Kind::kNull: return "NullValue";
    case Kind::kBool: return "BooleanValue";
    case Kind::kInt: return "IntegerValue";
    case Kind::kFloat: return "FloatValue";
    case Kind::kString: return "StringValue";
    case Kind::kArray: return tuple_ ? "TupleValue" : "ArrayValue";
    case Kind::kObject: return "ObjectValue";
    case Kind::kNamespace: return "NamespaceValue";
    case Kind::kFunction: return "FunctionValue";
  }
  return "?";
}

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNull: return false;
    case Kind::kBool: return b_;
    case Kind::kInt:
    case Kind::kFloat: return num_ != 0 && !std::isnan(num_);
    case Kind::kString: return !s_->empty();
    case Kind::kArray: return !a_->empty();
    case Kind::kObject: return !o_->entries.empty();
    case Kind::kNamespace:
    case Kind::kFunction: return true;
  }
  return false;
}

std::string Value::Display() const {
  switch (kind_) {
    case Kind::kUndefined: return "undefined";
    case Kind::kNull: return "null";
    case Kind::kBool: return b_ ? "true" : "false";
    case Kind::kInt: return JsNumber(num_);
    case Kind::kFloat: return FloatDisplay(num_);
    case Kind::kString: return *s_;
    case Kind::kArray:
    case Kind::kObject:
    case Kind::kNamespace: {
      JsonOptions o;
      o.undefined_as_null = false;
      return ToJson(*this, o);
    }
    case Kind::kFunction: break;
  }
  throw TemplateError(0, fmt::format("cannot print the function '{}'", fn_->Name()));
}

std::string Value::ConcatText() const {
  switch (kind_) {
    case Kind::kInt:
    case Kind::kFloat: return JsNumber(num_);
    case Kind::kArray: {
      std::string out;
      for (size_t i = 0; i < a_->size(); ++i) {
        if (i) out.push_back(',');
        out += (*a_)[i].Display();
      }
      return out;
    }
    case Kind::kObject:
    case Kind::kNamespace: return "[object Map]";
    default: return Display();
  }
}

const void* Value::identity() const {
  if (a_) return a_.get();
  if (o_) return o_.get();
  if (fn_) return fn_.get();
  return nullptr;
}

std::string JsNumber(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  if (v == 0) return "0";
  if (v < 0) return "-" + JsNumber(-v);
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);
  std::string sci(buf, res.ptr);  // d[.ddd]e±XX, shortest round trip
  size_t e_pos = sci.find('e');
  std::string digits;
  for (size_t i = 0; i < e_pos; ++i)
    if (sci[i] != '.') digits.push_back(sci[i]);
  int exp10 = std::atoi(sci.c_str() + e_pos + 1);
  int k = static_cast<int>(digits.size());
  int n = exp10 + 1;  // the decimal point sits after n digits
  if (k <= n && n <= 21) return digits + std::string(static_cast<size_t>(n - k), '0');
  if (0 < n && n <= 21) return digits.substr(0, n) + "." + digits.substr(n);
  if (-6 < n && n <= 0) return "0." + std::string(static_cast<size_t>(-n), '0') + digits;
  std::string mant = k == 1 ? digits : digits.substr(0, 1) + "." + digits.substr(1);
  return mant + "e" + (n - 1 >= 0 ? "+" : "-") + std::to_string(std::abs(n - 1));
}

std::string ToJson(const Value& v, const JsonOptions& o, int depth) {
  if (depth > kMaxPrintDepth)
    throw TemplateError(0, fmt::format("value nests deeper than {} levels", kMaxPrintDepth));
  switch (v.kind()) {
    case Value::Kind::kUndefined: return o.undefined_as_null ? "null" : "undefined";
    case Value::Kind::kNull: return "null";
    case Value::Kind::kBool: return v.boolean() ? "true" : "false";
    case Value::Kind::kInt:
    case Value::Kind::kFloat: return std::isfinite(v.number()) ? JsNumber(v.number()) : "null";
    case Value::Kind::kString: return JsonQuote(v.str(), o.ensure_ascii);
    case Value::Kind::kFunction:
      throw TemplateError(0, "Cannot convert to JSON: FunctionValue");
    default: break;
  }
  // The reference's toJSON has no case for tuples: printing one fails there too.
  if (v.is_tuple()) throw TemplateError(0, "Cannot convert to JSON: TupleValue");
  std::string item_sep = o.custom_separators ? o.item_separator : o.indent > 0 ? "," : ", ";
  std::string key_sep = o.custom_separators ? o.key_separator : ": ";
  std::string pad = o.indent > 0 ? std::string(static_cast<size_t>(o.indent), ' ') : "";
  std::string base = "\n";
  for (int i = 0; i < depth; ++i) base += pad;
  std::string child = base + pad;
  std::vector<std::string> parts;
  if (v.is_array()) {
    for (const Value& e : v.array()) parts.push_back(ToJson(e, o, depth + 1));
    std::string out = "[";
    for (size_t i = 0; i < parts.size(); ++i) {
      if (i) out += item_sep;
      if (o.indent > 0) out += child;
      out += parts[i];
    }
    if (o.indent > 0 && !parts.empty()) out += base;
    return out + "]";
  }
  std::vector<const std::pair<std::string, Value>*> entries;
  for (const auto& e : v.object().entries) entries.push_back(&e);
  if (o.sort_keys)
    std::stable_sort(entries.begin(), entries.end(), [](const auto* a, const auto* b) {
      return LocaleCompare(a->first, b->first) < 0;
    });
  std::string out = "{";
  for (size_t i = 0; i < entries.size(); ++i) {
    if (i) out += item_sep;
    if (o.indent > 0) out += child;
    out += JsonQuote(entries[i]->first, o.ensure_ascii) + key_sep;
    out += ToJson(entries[i]->second, o, depth + 1);
  }
  if (o.indent > 0 && !entries.empty()) out += base;
  return out + "}";
}

bool StrictEquals(const Value& a, const Value& b) {
  JsType ta = TypeOf(a), tb = TypeOf(b);
  if (ta != tb) return false;
  switch (ta) {
    case JsType::kUndefined:
    case JsType::kNull: return true;
    case JsType::kBoolean: return a.boolean() == b.boolean();
    case JsType::kNumber: return a.number() == b.number();
    case JsType::kString: return a.str() == b.str();
    default: return a.identity() == b.identity();
  }
}

bool LooseEquals(const Value& a, const Value& b) {
  JsType ta = TypeOf(a), tb = TypeOf(b);
  if (ta == tb) return StrictEquals(a, b);
  auto nullish = [](JsType t) { return t == JsType::kNull || t == JsType::kUndefined; };
  if (nullish(ta) || nullish(tb)) return nullish(ta) && nullish(tb);
  if (ta == JsType::kFunction || tb == JsType::kFunction) return false;
  if (ta == JsType::kBoolean) return LooseEquals(Value::Int(a.boolean() ? 1 : 0), b);
  if (tb == JsType::kBoolean) return LooseEquals(a, Value::Int(b.boolean() ? 1 : 0));
  if (ta == JsType::kNumber && tb == JsType::kString) return a.number() == StringToNumber(b.str());
  if (ta == JsType::kString && tb == JsType::kNumber) return StringToNumber(a.str()) == b.number();
  if (ta == JsType::kObject) return LooseEquals(Value::String(ObjectToPrimitive(a)), b);
  if (tb == JsType::kObject) return LooseEquals(a, Value::String(ObjectToPrimitive(b)));
  return false;
}

int CompareForSort(const Value& a, const Value& b, bool case_sensitive, int line) {
  auto fail = [&](const std::string& why) -> int { throw TemplateError(line, why); };
  if (a.is_null() && b.is_null()) return 0;
  if (a.is_null() || b.is_null())
    return fail(fmt::format("Cannot compare {} with {}", a.TypeName(), b.TypeName()));
  if (a.is_undefined() && b.is_undefined()) return 0;
  if (a.is_undefined() || b.is_undefined())
    return fail(fmt::format("Cannot compare {} with {}", a.TypeName(), b.TypeName()));
  auto numeric = [](const Value& v) { return v.is_number() || v.kind() == Value::Kind::kBool; };
  if (numeric(a) && numeric(b)) {
    double x = a.is_number() ? a.number() : a.boolean();
    double y = b.is_number() ? b.number() : b.boolean();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (std::string_view(a.TypeName()) != b.TypeName())
    return fail(fmt::format("Cannot compare different types: {} and {}", a.TypeName(),
                            b.TypeName()));
  if (!a.is_string()) return fail(fmt::format("Cannot compare type: {}", a.TypeName()));
  if (case_sensitive) return CompareUtf16(a.str(), b.str());
  return CompareUtf16(ToLower(a.str()), ToLower(b.str()));
}

bool JsParseInt(std::string_view s, double* out) {
  std::string t = JsTrim(s, true, false);
  size_t i = 0;
  bool neg = false;
  if (i < t.size() && (t[i] == '+' || t[i] == '-')) neg = t[i++] == '-';
  size_t start = i;
  while (i < t.size() && t[i] >= '0' && t[i] <= '9') ++i;
  if (i == start) return false;
  double v = std::strtod(t.substr(start, i - start).c_str(), nullptr);
  *out = neg ? -v : v;
  return true;
}

bool JsParseFloat(std::string_view s, double* out) {
  std::string t = JsTrim(s, true, false);
  size_t i = 0;
  if (i < t.size() && (t[i] == '+' || t[i] == '-')) ++i;
  if (t.compare(i, 8, "Infinity") == 0) {
    *out = t[0] == '-' ? -INFINITY : INFINITY;
    return true;
  }
  size_t digits = 0;
  while (i < t.size() && t[i] >= '0' && t[i] <= '9') ++i, ++digits;
  if (i < t.size() && t[i] == '.') {
    ++i;
    while (i < t.size() && t[i] >= '0' && t[i] <= '9') ++i, ++digits;
  }
  if (digits == 0) return false;
  if (i < t.size() && (t[i] == 'e' || t[i] == 'E')) {
    size_t j = i + 1;
    if (j < t.size() && (t[j] == '+' || t[j] == '-')) ++j;
    size_t exp_start = j;
    while (j < t.size() && t[j] >= '0' && t[j] <= '9') ++j;
    if (j > exp_start) i = j;
  }
  *out = std::strtod(t.substr(0, i).c_str(), nullptr);
  return true;
}

}  // namespace troupe::jinja::internal
