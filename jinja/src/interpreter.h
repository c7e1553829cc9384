// Evaluates a parsed template (private to troupe::jinja).
//
// One Interpreter per render: it owns the evaluation budget, the loop/break
// state and the call depth; scopes live on the C++ stack. Semantics follow
// the reference implementation statement by statement (see template.h).
#pragma once

#include <string>
#include <unordered_map>

#include "ast.h"
#include "troupe/jinja/template.h"
#include "value.h"

namespace troupe::jinja::internal {

struct Program {
  std::string name;
  NodeList body;
};

class Scope {
 public:
  explicit Scope(Scope* parent = nullptr) : parent_(parent) {}
  // The variable, searching enclosing scopes; undefined when absent.
  Value Lookup(const std::string& name) const;
  void Set(const std::string& name, Value value) { vars_[name] = std::move(value); }
  bool HasOwn(const std::string& name) const { return vars_.count(name) > 0; }

 private:
  std::unordered_map<std::string, Value> vars_;
  Scope* parent_;
};

class Interpreter {
 public:
  explicit Interpreter(const RenderOptions& options);

  // Declares the reference's globals (true/false/none, namespace, range,
  // raise_exception, strftime_now) in `globals`.
  void AddGlobals(Scope* globals);
  // Renders a statement list; throws TemplateError.
  std::string RenderTop(const NodeList& body, Scope& scope);

  // Used by callables.
  std::string RenderBlock(const NodeList& list, Scope& scope);
  Value Eval(const Node& n, Scope& scope);
  void CheckSize(size_t bytes, int line) const;
  // Counts one evaluation step; throws a limit error past RenderOptions::max_steps.
  void Step(int line);
  const RenderOptions& options() const { return options_; }

  enum class Flow { kNormal, kBreak, kContinue };
  Flow flow = Flow::kNormal;
  int loop_depth = 0;
  int call_depth = 0;

 private:
  Value EvalInner(const Node& n, Scope& scope);
  Value EvalFor(const Node& n, Scope& scope);
  Value EvalSet(const Node& n, Scope& scope);
  Value EvalMember(const Node& n, Scope& scope);
  Value EvalSlice(const Value& object, const Node& slice, Scope& scope);
  Value EvalCall(const Node& n, Scope& scope);
  Value EvalBinary(const Node& n, Scope& scope);
  Value EvalUnary(const Node& n, Scope& scope);
  CallArgs EvalArgs(const NodeList& args, Scope& scope);
  Value ApplyFilter(const Value& operand, const Node& filter, Scope& scope);
  Value FilterNoArgs(const Value& operand, const std::string& name, int line);
  Value FilterWithArgs(const Value& operand, const Node& filter, Scope& scope);
  void Bind(const Node& target, const Value& item, Scope& scope, int line);

  RenderOptions options_;
  int64_t steps_ = 0;
};

// Member access as the reference does it (attributes, indices, methods).
Value GetMember(const Value& object, const Value& property, int line);
// Runs the test `name` on `operand` (`arg`: the second operand of equalto).
bool RunTest(const std::string& name, const Value& operand, const Value* arg, int line);

}  // namespace troupe::jinja::internal
