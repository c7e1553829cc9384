#include "interpreter.h"

#include <cmath>

#include <fmt/format.h>

#include "unicode.h"

namespace troupe::jinja::internal {
namespace {

constexpr int kMaxCallDepth = 100;

[[noreturn]] void Fail(int line, const std::string& why) { throw TemplateError(line, why); }

// A macro: its body renders in a scope whose parent is the caller's scope.
class MacroFn final : public Callable {
 public:
  explicit MacroFn(const Node& node) : node_(node) {}
  std::string Name() const override { return node_.str; }

  Value Call(Interpreter& in, CallArgs args, Scope& caller, int line) override {
    if (in.call_depth >= kMaxCallDepth)
      throw TemplateError::Limit(line, fmt::format("macro '{}': calls nest deeper than {}",
                                                   node_.str, kMaxCallDepth));
    Scope scope(&caller);
    Bind(in, args, scope, line);
    ++in.call_depth;
    int saved_loops = in.loop_depth;
    in.loop_depth = 0;
    std::string out = in.RenderBlock(node_.body, scope);
    in.loop_depth = saved_loops;
    --in.call_depth;
    return Value::String(std::move(out));
  }

 private:
  void Bind(Interpreter& in, CallArgs& args, Scope& scope, int line) {
    std::vector<const Node*> pending;
    for (size_t i = 0; i < node_.list.size(); ++i) {
      const Node& p = *node_.list[i];
      const std::string& name = p.str;
      Value v;
      bool have = i < args.positional.size();
      if (have) v = args.positional[i];
      for (auto it = args.keyword.begin(); !have && it != args.keyword.end(); ++it) {
        if (it->first == name) {
          v = it->second;
          args.keyword.erase(it);
          have = true;
          break;
        }
      }
      if (!have && p.kind == NodeKind::kKwarg) pending.push_back(&p);
      scope.Set(name, v);
    }
    if (node_.uses_kwargs) {
      Object kw;
      for (auto& [k, v] : args.keyword) kw.Set(k, v);
      scope.Set("kwargs", Value::MakeObject(std::move(kw)));
    } else if (!args.keyword.empty()) {
      Fail(line, fmt::format("macro '{}' takes no keyword argument '{}'", node_.str,
                             args.keyword.front().first));
    }
    size_t n = node_.list.size();
    if (node_.uses_varargs) {
      Array extra;
      for (size_t i = n; i < args.positional.size(); ++i) extra.push_back(args.positional[i]);
      scope.Set("varargs", Value::MakeArray(std::move(extra)));
    } else if (args.positional.size() > n) {
      Fail(line, fmt::format("macro '{}' takes not more than {} argument(s)", node_.str, n));
    }
    for (const Node* p : pending) scope.Set(p->str, in.Eval(*p->a, scope));
  }

  const Node& node_;
};

bool IsIntValue(const Value& v) { return v.kind() == Value::Kind::kInt; }

// The reference's slice() on indices [0, n).
std::vector<int64_t> SliceIndices(int64_t n, const Value& start_v, const Value& stop_v,
                                  const Value& step_v) {
  double step = step_v.is_undefined() ? 1 : step_v.number();
  int dir = step > 0 ? 1 : step < 0 ? -1 : 0;
  double start, stop;
  if (dir >= 0) {
    start = start_v.is_undefined() ? 0 : start_v.number();
    start = start < 0 ? std::max<double>(n + start, 0) : std::min<double>(start, n);
    stop = stop_v.is_undefined() ? n : stop_v.number();
    stop = stop < 0 ? std::max<double>(n + stop, 0) : std::min<double>(stop, n);
  } else {
    start = start_v.is_undefined() ? n - 1 : start_v.number();
    start = start < 0 ? std::max<double>(n + start, -1) : std::min<double>(start, n - 1);
    stop = stop_v.is_undefined() ? -1 : stop_v.number();
    stop = stop < -1 ? std::max<double>(n + stop, -1) : std::min<double>(stop, n - 1);
  }
  std::vector<int64_t> out;
  if (dir == 0) return out;
  for (double i = start; dir * i < dir * stop; i += step) out.push_back(static_cast<int64_t>(i));
  return out;
}

}  // namespace

Value Scope::Lookup(const std::string& name) const {
  for (const Scope* s = this; s; s = s->parent_) {
    auto it = s->vars_.find(name);
    if (it != s->vars_.end()) return it->second;
  }
  return Value();
}

Interpreter::Interpreter(const RenderOptions& options) : options_(options) {}

void Interpreter::CheckSize(size_t bytes, int line) const {
  if (bytes > options_.max_output_bytes)
    throw TemplateError::Limit(line, fmt::format("text grows past the limit of {} bytes",
                                                 options_.max_output_bytes));
}

std::string Interpreter::RenderTop(const NodeList& body, Scope& scope) {
  std::string out = RenderBlock(body, scope);
  return out;
}

std::string Interpreter::RenderBlock(const NodeList& list, Scope& scope) {
  std::string out;
  for (const auto& s : list) {
    Value v = Eval(*s, scope);
    // A break/continue drops what this block rendered so far (as the reference does).
    if (flow != Flow::kNormal) return std::string();
    if (v.is_null() || v.is_undefined()) continue;
    try {
      out += v.Display();
    } catch (TemplateError& e) {
      if (e.line() == 0) e.set_line(s->line);
      throw;
    }
    CheckSize(out.size(), s->line);
  }
  return out;
}

void Interpreter::Step(int line) {
  if (++steps_ > options_.max_steps)
    throw TemplateError::Limit(line, fmt::format("rendering took more than {} evaluation steps",
                                                 options_.max_steps));
}

Value Interpreter::Eval(const Node& n, Scope& scope) {
  Step(n.line);
  try {
    return EvalInner(n, scope);
  } catch (TemplateError& e) {
    if (e.line() == 0) e.set_line(n.line);
    throw;
  }
}

Value Interpreter::EvalInner(const Node& n, Scope& scope) {
  switch (n.kind) {
    case NodeKind::kText: return Value::String(n.str);
    case NodeKind::kComment: return Value::Null();
    case NodeKind::kIf: {
      bool test = Eval(*n.a, scope).Truthy();
      return Value::String(RenderBlock(test ? n.body : n.alt, scope));
    }
    case NodeKind::kFor: return EvalFor(n, scope);
    case NodeKind::kSet: return EvalSet(n, scope);
    case NodeKind::kMacro:
      scope.Set(n.str, Value::Function(std::make_shared<MacroFn>(n)));
      return Value::Null();
    case NodeKind::kFilterBlock: {
      std::string body = RenderBlock(n.body, scope);
      if (flow != Flow::kNormal) return Value::Null();
      return ApplyFilter(Value::String(std::move(body)), n, scope);
    }
    case NodeKind::kBreak:
    case NodeKind::kContinue:
      if (loop_depth == 0)
        Fail(n.line, fmt::format("'{}' outside a for loop",
                                 n.kind == NodeKind::kBreak ? "break" : "continue"));
      flow = n.kind == NodeKind::kBreak ? Flow::kBreak : Flow::kContinue;
      return Value::Null();
    case NodeKind::kInt: return Value::Int(n.num);
    case NodeKind::kFloat: return Value::Float(n.num);
    case NodeKind::kString: return Value::String(n.str);
    case NodeKind::kIdent: return scope.Lookup(n.str);
    case NodeKind::kArray:
    case NodeKind::kTuple: {
      Array items;
      for (const auto& e : n.list) items.push_back(Eval(*e, scope));
      return Value::MakeArray(std::move(items), n.kind == NodeKind::kTuple);
    }
    case NodeKind::kObject: {
      Object obj;
      for (size_t i = 0; i + 1 < n.list.size(); i += 2) {
        Value k = Eval(*n.list[i], scope);
        if (!k.is_string())
          Fail(n.list[i]->line, fmt::format("Object keys must be strings: got {}", k.TypeName()));
        obj.Set(k.str(), Eval(*n.list[i + 1], scope));
      }
      return Value::MakeObject(std::move(obj));
    }
    case NodeKind::kMember: return EvalMember(n, scope);
    case NodeKind::kCall: return EvalCall(n, scope);
    case NodeKind::kFilter: return ApplyFilter(Eval(*n.a, scope), n, scope);
    case NodeKind::kTest: {
      Value operand = Eval(*n.a, scope);
      bool r = RunTest(n.str, operand, nullptr, n.line);
      return Value::Bool(n.flag ? !r : r);
    }
    case NodeKind::kUnary: return EvalUnary(n, scope);
    case NodeKind::kBinary: return EvalBinary(n, scope);
    case NodeKind::kTernary:
      return Eval(*n.a, scope).Truthy() ? Eval(*n.b, scope) : Eval(*n.c, scope);
    case NodeKind::kSelect:
      return Eval(*n.b, scope).Truthy() ? Eval(*n.a, scope) : Value();
    case NodeKind::kKwarg: Fail(n.line, "a keyword argument outside a call");
    case NodeKind::kSlice: Fail(n.line, "a slice outside a subscript");
  }
  Fail(n.line, "unknown node");
}

void Interpreter::Bind(const Node& target, const Value& item, Scope& scope, int line) {
  if (target.kind == NodeKind::kIdent) {
    scope.Set(target.str, item);
    return;
  }
  if (!item.is_array() || item.is_tuple())
    Fail(line, fmt::format("Cannot unpack non-iterable type: {}", item.TypeName()));
  const Array& parts = item.array();
  if (parts.size() != target.list.size())
    Fail(line, fmt::format("Too {} items to unpack",
                           target.list.size() > parts.size() ? "few" : "many"));
  for (size_t j = 0; j < parts.size(); ++j) {
    if (target.list[j]->kind != NodeKind::kIdent)
      Fail(line, "Cannot unpack into something that is not a name");
    scope.Set(target.list[j]->str, parts[j]);
  }
}

Value Interpreter::EvalFor(const Node& n, Scope& outer) {
  Scope scope(&outer);
  Value iterable = Eval(*n.b, scope);
  Array all;
  if (iterable.is_array()) {
    all = iterable.array();
  } else if (iterable.is_object()) {
    for (const auto& [k, v] : iterable.object().entries) all.push_back(Value::String(k));
  } else {
    Fail(n.line, fmt::format("Expected iterable or object type in for loop: got {}",
                             iterable.TypeName()));
  }
  Array items;
  for (const Value& item : all) {
    Step(n.line);
    if (n.c) {
      Scope test_scope(&scope);
      Bind(*n.a, item, test_scope, n.line);
      if (!Eval(*n.c, test_scope).Truthy()) continue;
    }
    items.push_back(item);
  }
  std::string out;
  bool no_iteration = true;
  ++loop_depth;
  const auto len = static_cast<double>(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    Step(n.line);
    const auto d = static_cast<double>(i);
    Object loop;
    loop.entries = {{"index", Value::Int(d + 1)},
                    {"index0", Value::Int(d)},
                    {"revindex", Value::Int(len - d)},
                    {"revindex0", Value::Int(len - d - 1)},
                    {"first", Value::Bool(i == 0)},
                    {"last", Value::Bool(i + 1 == items.size())},
                    {"length", Value::Int(len)},
                    {"previtem", i > 0 ? items[i - 1] : Value()},
                    {"nextitem", i + 1 < items.size() ? items[i + 1] : Value()}};
    scope.Set("loop", Value::MakeObject(std::move(loop)));
    Bind(*n.a, items[i], scope, n.line);
    std::string body = RenderBlock(n.body, scope);
    if (flow == Flow::kContinue) {
      flow = Flow::kNormal;
      continue;
    }
    if (flow == Flow::kBreak) {
      flow = Flow::kNormal;
      break;
    }
    out += body;
    CheckSize(out.size(), n.line);
    no_iteration = false;
  }
  --loop_depth;
  if (no_iteration) out += RenderBlock(n.alt, scope);
  return Value::String(std::move(out));
}

Value Interpreter::EvalSet(const Node& n, Scope& scope) {
  Value rhs = n.b ? Eval(*n.b, scope) : Value::String(RenderBlock(n.body, scope));
  const Node& target = *n.a;
  if (target.kind == NodeKind::kIdent) {
    scope.Set(target.str, std::move(rhs));
  } else if (target.kind == NodeKind::kTuple) {
    if (!rhs.is_array())
      Fail(n.line, fmt::format("Cannot unpack non-iterable type in set: {}", rhs.TypeName()));
    if (rhs.array().size() != target.list.size())
      Fail(n.line, fmt::format("Too {} items to unpack in set",
                               target.list.size() > rhs.array().size() ? "few" : "many"));
    for (size_t i = 0; i < target.list.size(); ++i) {
      if (target.list[i]->kind != NodeKind::kIdent)
        Fail(n.line, "Cannot unpack to something that is not a name in set");
      scope.Set(target.list[i]->str, rhs.array()[i]);
    }
  } else {
    Value object = Eval(*target.a, scope);
    if (!object.is_namespace()) Fail(n.line, "cannot assign attribute on non-namespace object");
    if (target.flag || target.b->kind != NodeKind::kIdent)
      Fail(n.line, "Cannot assign to member with non-identifier property");
    object.mutable_object().Set(target.b->str, std::move(rhs));
  }
  return Value::Null();
}

Value Interpreter::EvalMember(const Node& n, Scope& scope) {
  Value object = Eval(*n.a, scope);
  Value property;
  if (n.flag) {
    if (n.b->kind == NodeKind::kSlice) return EvalSlice(object, *n.b, scope);
    property = Eval(*n.b, scope);
  } else if (n.b->kind == NodeKind::kInt) {
    property = Value::Int(n.b->num);
  } else {
    property = Value::String(n.b->str);
  }
  return GetMember(object, property, n.line);
}

Value Interpreter::EvalSlice(const Value& object, const Node& s, Scope& scope) {
  if (!object.is_array() && !object.is_string())
    Fail(s.line, "Slice object must be an array or string");
  Value parts[3];
  const Node* nodes[3] = {s.a.get(), s.b.get(), s.c.get()};
  const char* names[3] = {"start", "stop", "step"};
  for (int i = 0; i < 3; ++i) {
    if (nodes[i]) parts[i] = Eval(*nodes[i], scope);
    if (!IsIntValue(parts[i]) && !parts[i].is_undefined())
      Fail(s.line, fmt::format("Slice {} must be numeric or undefined", names[i]));
  }
  if (object.is_array()) {
    const Array& a = object.array();
    Array out;
    for (int64_t i : SliceIndices(static_cast<int64_t>(a.size()), parts[0], parts[1], parts[2]))
      out.push_back(a[static_cast<size_t>(i)]);
    return Value::MakeArray(std::move(out));
  }
  std::u32string cps = DecodeUtf8(object.str());
  std::u32string out;
  for (int64_t i : SliceIndices(static_cast<int64_t>(cps.size()), parts[0], parts[1], parts[2]))
    out.push_back(cps[static_cast<size_t>(i)]);
  return Value::String(EncodeUtf8(out));
}

CallArgs Interpreter::EvalArgs(const NodeList& args, Scope& scope) {
  CallArgs out;
  for (const auto& a : args)
    if (a->kind != NodeKind::kKwarg) out.positional.push_back(Eval(*a, scope));
  for (const auto& a : args) {
    if (a->kind != NodeKind::kKwarg) continue;
    if (out.Keyword(a->str))
      Fail(a->line, fmt::format("Got multiple values for keyword argument '{}'", a->str));
    out.keyword.emplace_back(a->str, Eval(*a->a, scope));
  }
  return out;
}

Value Interpreter::EvalCall(const Node& n, Scope& scope) {
  CallArgs args = EvalArgs(n.list, scope);
  Value fn = Eval(*n.a, scope);
  if (!fn.is_function()) {
    std::string what = n.a->kind == NodeKind::kIdent ? fmt::format(" '{}'", n.a->str)
                       : n.a->kind == NodeKind::kMember && !n.a->flag
                           ? fmt::format(" '.{}'", n.a->b->str)
                           : "";
    Fail(n.line, fmt::format("Cannot call something that is not a function{}: got {}", what,
                             fn.TypeName()));
  }
  return fn.function()->Call(*this, std::move(args), scope, n.line);
}

Value Interpreter::EvalUnary(const Node& n, Scope& scope) {
  Value v = Eval(*n.a, scope);
  if (n.str == "not") return Value::Bool(!v.Truthy());
  double sign = n.str == "-" ? -1 : 1;
  if (v.kind() == Value::Kind::kBool) return Value::Int(sign * (v.boolean() ? 1 : 0));
  if (v.kind() == Value::Kind::kInt) return Value::Int(sign * v.number());
  if (v.kind() == Value::Kind::kFloat) return Value::Float(sign * v.number());
  Fail(n.line, fmt::format("Unknown operator \"{}\" for {}", n.str, v.TypeName()));
}

Value Interpreter::EvalBinary(const Node& n, Scope& scope) {
  const std::string& op = n.str;
  Value left = Eval(*n.a, scope);
  if (op == "and") return left.Truthy() ? Eval(*n.b, scope) : left;
  if (op == "or") return left.Truthy() ? left : Eval(*n.b, scope);
  Value right = Eval(*n.b, scope);
  if (op == "==") return Value::Bool(LooseEquals(left, right));
  if (op == "!=") return Value::Bool(!LooseEquals(left, right));
  bool membership = op == "in" || op == "not in";
  if (left.is_undefined() || right.is_undefined()) {
    if (right.is_undefined() && membership) return Value::Bool(op == "not in");
    Fail(n.line, fmt::format("Cannot perform operation {} on undefined values", op));
  }
  if (left.is_null() || right.is_null()) Fail(n.line, "Cannot perform operation on null values");
  auto concat = [&](const Value& a, const Value& b) {
    std::string s = a.ConcatText() + b.ConcatText();
    CheckSize(s.size(), n.line);
    return Value::String(std::move(s));
  };
  if (op == "~") return concat(left, right);
  auto numeric_like = [](const Value& v) { return v.is_number() || v.kind() == Value::Kind::kBool; };
  if (op == "**" && numeric_like(left) && numeric_like(right)) {
    double a = left.is_number() ? left.number() : left.boolean();
    double b = right.is_number() ? right.number() : right.boolean();
    if (a == 0 && b < 0) Fail(n.line, "0.0 cannot be raised to a negative power");
    double r = std::pow(a, b);
    if (!std::isfinite(r)) Fail(n.line, "Exponentiation result is not a finite real number");
    bool is_float = left.kind() == Value::Kind::kFloat || right.kind() == Value::Kind::kFloat || b < 0;
    return is_float ? Value::Float(r) : Value::Int(r);
  }
  if (left.is_number() && right.is_number()) {
    double a = left.number(), b = right.number();
    bool is_float = left.kind() == Value::Kind::kFloat || right.kind() == Value::Kind::kFloat;
    auto num = [&](double r) { return is_float ? Value::Float(r) : Value::Int(r); };
    if (op == "+") return num(a + b);
    if (op == "-") return num(a - b);
    if (op == "*") return num(a * b);
    if (op == "/") return Value::Float(a / b);
    if (op == "//") return num(std::floor(a / b));
    if (op == "%") return num(std::fmod(a, b));
    if (op == "<") return Value::Bool(a < b);
    if (op == ">") return Value::Bool(a > b);
    if (op == ">=") return Value::Bool(a >= b);
    if (op == "<=") return Value::Bool(a <= b);
  } else if (left.is_array() && right.is_array()) {
    if (op == "+") {
      Array out = left.array();
      out.insert(out.end(), right.array().begin(), right.array().end());
      return Value::MakeArray(std::move(out));
    }
  } else if (right.is_array() && membership) {
    bool found = false;
    for (const Value& x : right.array()) found = found || StrictEquals(x, left);
    return Value::Bool(op == "in" ? found : !found);
  }
  if ((left.is_string() || right.is_string()) && op == "+") return concat(left, right);
  if (left.is_string() && right.is_string() && membership) {
    bool found = right.str().find(left.str()) != std::string::npos;
    return Value::Bool(op == "in" ? found : !found);
  }
  if (left.is_string() && right.is_object() && membership) {
    bool found = right.object().Find(left.str()) != nullptr;
    return Value::Bool(op == "in" ? found : !found);
  }
  Fail(n.line, fmt::format("Unknown operator \"{}\" between {} and {}", op, left.TypeName(),
                           right.TypeName()));
}

}  // namespace troupe::jinja::internal
