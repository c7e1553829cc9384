// Runtime values of the template interpreter (private to troupe::jinja).
//
// Values follow the reference implementation's (JavaScript) model: numbers are
// doubles tagged integer or float, arrays and objects are shared by reference
// (so `a == b` on two containers compares identity, as JavaScript does),
// objects keep insertion order, `undefined` and `none` are distinct. Text is
// UTF-8. Conversions to text and JSON reproduce what the reference prints.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace troupe::jinja::internal {

// An error while lexing, parsing or rendering; `line` is the template line
// (1-based; 0 when unknown). Thrown inside the interpreter, turned into a
// Status at the public boundary (template.cc).
class TemplateError : public std::runtime_error {
 public:
  TemplateError(int line, std::string message)
      : std::runtime_error(std::move(message)), line_(line) {}
  int line() const { return line_; }
  void set_line(int line) { line_ = line; }
  // A limit (output size, evaluation budget, recursion) rather than bad input.
  bool limit() const { return limit_; }
  static TemplateError Limit(int line, std::string message) {
    TemplateError e(line, std::move(message));
    e.limit_ = true;
    return e;
  }

 private:
  int line_;
  bool limit_ = false;
};

class Value;
class Callable;
using Array = std::vector<Value>;

// Insertion-ordered string-keyed map.
struct Object {
  std::vector<std::pair<std::string, Value>> entries;
  const Value* Find(std::string_view key) const;
  void Set(std::string key, Value value);
};

class Value {
 public:
  enum class Kind : uint8_t {
    kUndefined,
    kNull,
    kBool,
    kInt,    // a double holding an integral value (JavaScript IntegerValue)
    kFloat,  // a double (FloatValue)
    kString,
    kArray,      // also tuples (is_tuple())
    kObject,     // a mapping
    kNamespace,  // namespace(): attribute assignment, no mapping behaviour
    kFunction,   // macros, globals, bound methods
  };

  Value() = default;  // undefined
  static Value Null() { return Value(Kind::kNull); }
  static Value Bool(bool b);
  static Value Int(double v);
  static Value Float(double v);
  static Value String(std::string s);
  static Value MakeArray(Array items, bool tuple = false);
  static Value MakeObject(Object obj);
  static Value MakeNamespace(Object obj);
  static Value Function(std::shared_ptr<Callable> fn);
  // JSON in: integral numbers become integers (JSON.parse + Number.isInteger),
  // object keys are ordered as JavaScript orders them (array-index keys first,
  // ascending). Throws TemplateError on invalid UTF-8 or nesting over 200.
  static Value FromJson(const nlohmann::ordered_json& j, int depth = 0);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_null() const { return kind_ == Kind::kNull; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_array() const { return kind_ == Kind::kArray; }
  bool is_tuple() const { return kind_ == Kind::kArray && tuple_; }
  bool is_object() const { return kind_ == Kind::kObject; }
  bool is_namespace() const { return kind_ == Kind::kNamespace; }
  // Objects and namespaces: what attribute lookup reads.
  bool is_attribute_container() const { return is_object() || is_namespace(); }
  bool is_function() const { return kind_ == Kind::kFunction; }

  bool boolean() const { return b_; }
  double number() const { return num_; }
  const std::string& str() const { return *s_; }
  const Array& array() const { return *a_; }
  Array& mutable_array() const { return *a_; }
  const Object& object() const { return *o_; }
  Object& mutable_object() const { return *o_; }
  const std::shared_ptr<Callable>& function() const { return fn_; }

  // The reference's type names ("StringValue", ...), for error messages.
  const char* TypeName() const;
  // Python-style truthiness as the reference computes it.
  bool Truthy() const;
  // What {{ value }} prints (RuntimeValue.toString()); none/undefined print
  // nothing and are skipped by the caller.
  std::string Display() const;
  // What `~` and string `+` use (JavaScript's value.toString()).
  std::string ConcatText() const;
  // Identity of a shared container (for JavaScript == on objects).
  const void* identity() const;

 private:
  explicit Value(Kind k) : kind_(k) {}
  Kind kind_ = Kind::kUndefined;
  bool tuple_ = false;
  bool b_ = false;
  double num_ = 0;
  std::shared_ptr<std::string> s_;
  std::shared_ptr<Array> a_;
  std::shared_ptr<Object> o_;
  std::shared_ptr<Callable> fn_;
};

// A callable value (macro, global function, bound method).
class Interpreter;
class Scope;
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
  const Value* Keyword(std::string_view name) const;
};
class Callable {
 public:
  virtual ~Callable() = default;
  // `scope` is the caller's scope (macros see the caller's variables, as in the reference).
  virtual Value Call(Interpreter& interp, CallArgs args, Scope& scope, int line) = 0;
  virtual std::string Name() const = 0;
};

// JavaScript Number.prototype.toString (shortest round trip, JS exponent rules).
std::string JsNumber(double v);

// JSON text of a value as the reference's toJSON writes it.
struct JsonOptions {
  int indent = 0;  // 0: no newlines (the reference treats indent=0 as none)
  bool ensure_ascii = false;
  bool sort_keys = false;
  bool custom_separators = false;
  std::string item_separator, key_separator;  // when custom_separators
  bool undefined_as_null = true;  // false: "undefined" (how {{ list }} prints)
};
std::string ToJson(const Value& v, const JsonOptions& options, int depth = 0);

// JavaScript `a == b` on the values' payloads (loose equality).
bool LooseEquals(const Value& a, const Value& b);
// JavaScript `a === b` on the payloads (strict: `in`, equalto).
bool StrictEquals(const Value& a, const Value& b);
// Sort order of the reference's sort/dictsort: numbers (and booleans) with
// numbers, strings with strings (case-insensitive unless case_sensitive);
// anything else throws TemplateError.
int CompareForSort(const Value& a, const Value& b, bool case_sensitive, int line);

// JavaScript parseInt(s, 10) / parseFloat(s); false when the result is NaN.
bool JsParseInt(std::string_view s, double* out);
bool JsParseFloat(std::string_view s, double* out);

}  // namespace troupe::jinja::internal
