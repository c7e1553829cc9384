// Syntax tree of a template (private to troupe::jinja).
//
// One node type for statements and expressions, as in the reference
// implementation (an expression at block level is an output: {{ expr }}).
// Every node records the template line it starts on.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "lexer.h"

namespace troupe::jinja::internal {

enum class NodeKind {
  // statements
  kText,         // str: literal text
  kComment,      // {# ... #}: prints nothing
  kIf,           // a: test, body, alt (an elif is a nested kIf in alt)
  kFor,          // a: target (kIdent or kTuple), b: iterable, c: filter (for ... if c), body, alt
  kSet,          // a: target, b: value (or null: block set, body)
  kMacro,        // str: name, list: parameters (kIdent or kKwarg), body
  kFilterBlock,  // str: filter name, list: args, flag: has args, body
  kBreak,
  kContinue,
  // expressions
  kInt,      // num
  kFloat,    // num
  kString,   // str
  kIdent,    // str
  kArray,    // list
  kTuple,    // list
  kObject,   // list: key, value, key, value, ...
  kMember,   // a: object, b: property (kSlice for slices), flag: computed ([...])
  kSlice,    // a, b, c: start, stop, step (each may be null)
  kCall,     // a: callee, list: arguments (kKwarg for name=value)
  kKwarg,    // str: name, a: value
  kFilter,   // a: operand, str: filter name, list: args, flag: called with (...)
  kTest,     // a: operand, str: test name, flag: negated (is not)
  kUnary,    // str: not, -, +; a: operand
  kBinary,   // str: operator; a, b
  kTernary,  // a: condition, b: if true, c: if false
  kSelect,   // a: value, b: condition (value if condition, no else)
};

struct Node;
using NodePtr = std::unique_ptr<Node>;
using NodeList = std::vector<NodePtr>;

struct Node {
  NodeKind kind;
  int line = 0;
  std::string str;
  double num = 0;
  bool flag = false;
  NodePtr a, b, c;
  NodeList list, body, alt;
  // kMacro: whether the body reads `varargs` / `kwargs`.
  bool uses_varargs = false, uses_kwargs = false;

  Node(NodeKind k, int l) : kind(k), line(l) {}
};

// Parses tokens into the top-level statement list. Throws TemplateError
// naming the line and the construct on a syntax error or an unsupported
// statement.
NodeList Parse(const std::vector<Token>& tokens);

}  // namespace troupe::jinja::internal
